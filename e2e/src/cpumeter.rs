//! CPU time of one process, all its threads (also those that already ended), to the
//! nanosecond: the process is moved into a cgroup of its own and the cgroup's CPU counter is
//! read (cgroup v2 `cpu.stat` `usage_usec`, or v1 `cpuacct.usage`). Where no cgroup can be
//! made, `/proc/<pid>/stat` (10 ms ticks, live threads only) is read instead.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where a meter reads its figure.
enum Source {
    V2(PathBuf),
    V1(PathBuf),
    ProcStat(u32),
}

pub struct CpuMeter {
    source: Source,
    pid: u32,
}

impl CpuMeter {
    /// Measures `pid` from now on; `name` names the cgroup (made under the root; on drop the
    /// process goes back to the root group and the cgroup is removed).
    pub fn for_pid(pid: u32, name: &str) -> CpuMeter {
        let source = cgroup(pid, name).unwrap_or(Source::ProcStat(pid));
        CpuMeter { source, pid }
    }

    /// Whether the figure has nanosecond precision (a cgroup) or 10 ms ticks.
    pub fn precise(&self) -> bool {
        !matches!(self.source, Source::ProcStat(_))
    }

    /// CPU time used so far (user + system).
    pub fn used(&self) -> Duration {
        match &self.source {
            Source::V2(dir) => node_agent::usage::cpu_stat::read(dir)
                .map_or(Duration::ZERO, |s| Duration::from_micros(s.usage_usec)),
            Source::V1(dir) => std::fs::read_to_string(dir.join("cpuacct.usage"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .map_or(Duration::ZERO, Duration::from_nanos),
            Source::ProcStat(pid) => proc_stat_cpu(*pid),
        }
    }
}

impl Drop for CpuMeter {
    fn drop(&mut self) {
        if let Source::V2(dir) | Source::V1(dir) = &self.source {
            // Hand a still running process back to the parent group, then remove ours.
            if let Some(parent) = dir.parent() {
                let _ = std::fs::write(parent.join("cgroup.procs"), self.pid.to_string());
            }
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn cgroup(pid: u32, name: &str) -> Option<Source> {
    let root = Path::new("/sys/fs/cgroup");
    let (dir, source): (PathBuf, fn(PathBuf) -> Source) =
        if root.join("cgroup.controllers").exists() {
            (root.join(name), Source::V2)
        } else if root.join("cpuacct/cpuacct.usage").exists() {
            (root.join("cpuacct").join(name), Source::V1)
        } else {
            return None;
        };
    std::fs::create_dir_all(&dir).ok()?;
    if std::fs::write(dir.join("cgroup.procs"), pid.to_string()).is_err() {
        let _ = std::fs::remove_dir(&dir);
        return None;
    }
    Some(source(dir))
}

/// User + system CPU time of a process's live threads (`/proc/<pid>/stat`, 10 ms ticks).
pub fn proc_stat_cpu(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // The fields after the command name (which may hold spaces) start at state (field 3);
    // utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks.saturating_mul(1000 / CLK_TCK))
}

/// `getconf CLK_TCK` on Linux.
const CLK_TCK: u64 = 100;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_has_used_some_cpu() {
        let me = std::process::id();
        // Burn a little CPU so that at least one tick is counted.
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(proc_stat_cpu(me) > Duration::ZERO);
    }
}
