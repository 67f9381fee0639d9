//! CPU time of one process, all its threads (also those that already ended), to the
//! nanosecond: the process is moved into a cgroup of its own and the cgroup's CPU counter is
//! read (cgroup v2 `cpu.stat` `usage_usec`, or v1 `cpuacct.usage`). Where no cgroup can be
//! made, `/proc/<pid>/stat` (10 ms ticks, live threads only) is read instead.
//!
//! Each reading also carries the kernel's user/system split: v2 `cpu.stat` `user_usec` and
//! `system_usec`, v1 `cpuacct.stat` `user` and `system` (USER_HZ ticks, sampled at the
//! scheduler tick), `/proc/<pid>/stat` utime and stime. [`Reading::since`] scales the split of
//! an interval to its precise total, so user + system is the counter's figure.

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

/// One reading of a meter: the total, and user and system in the source's own unit (v2 µs,
/// v1 and /proc ticks), which only [`Reading::since`] turns into time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    pub total: Duration,
    user: u64,
    system: u64,
}

/// The CPU used between two readings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Used {
    /// User + system, the counter's figure.
    pub total: Duration,
    /// `total` split in the ratio of the kernel's user and system counts over the interval
    /// (both zero where the kernel counted none).
    pub user: Duration,
    pub system: Duration,
    /// How many 10 ms ticks the split rests on (v1 and /proc, whose split is sampled at the
    /// scheduler tick); `None` where the kernel gave microseconds (v2).
    pub ticks: Option<u64>,
}

/// The sum of two intervals (of several runs).
impl std::ops::Add for Used {
    type Output = Used;
    fn add(self, o: Used) -> Used {
        Used {
            total: self.total + o.total,
            user: self.user + o.user,
            system: self.system + o.system,
            ticks: match (self.ticks, o.ticks) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            },
        }
    }
}

impl Reading {
    /// What was used since `earlier`.
    pub fn since(&self, earlier: &Reading, ticks: bool) -> Used {
        let total = self.total.saturating_sub(earlier.total);
        let u = self.user.saturating_sub(earlier.user);
        let s = self.system.saturating_sub(earlier.system);
        // Nothing counted: no split (both zero).
        let (user, system) = if u + s == 0 {
            (Duration::ZERO, Duration::ZERO)
        } else {
            let user = total.mul_f64(u as f64 / (u + s) as f64);
            (user, total.saturating_sub(user))
        };
        Used {
            total,
            user,
            system,
            ticks: ticks.then_some(u + s),
        }
    }
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

    /// CPU time used so far (user + system), and its split.
    pub fn read(&self) -> Reading {
        match &self.source {
            Source::V2(dir) => {
                let s = node_agent::usage::cpu_stat::read(dir).unwrap_or_default();
                Reading {
                    total: Duration::from_micros(s.usage_usec),
                    user: s.user_usec,
                    system: s.system_usec,
                }
            }
            Source::V1(dir) => {
                let text = std::fs::read_to_string(dir.join("cpuacct.stat")).unwrap_or_default();
                Reading {
                    total: std::fs::read_to_string(dir.join("cpuacct.usage"))
                        .ok()
                        .and_then(|s| s.trim().parse().ok())
                        .map_or(Duration::ZERO, Duration::from_nanos),
                    user: keyed(&text, "user"),
                    system: keyed(&text, "system"),
                }
            }
            Source::ProcStat(pid) => proc_stat(*pid),
        }
    }

    /// What was used since `earlier` (a reading of this meter).
    pub fn since(&self, earlier: &Reading) -> Used {
        self.read()
            .since(earlier, !matches!(self.source, Source::V2(_)))
    }
}

/// The value of `key` in cgroup v1's `cpuacct.stat` (`key value` lines); 0 if absent.
fn keyed(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
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
    proc_stat(pid).total
}

/// utime and stime of `/proc/<pid>/stat` (ticks), and their sum as time.
fn proc_stat(pid: u32) -> Reading {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Reading::default();
    };
    // The fields after the command name (which may hold spaces) start at state (field 3);
    // utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let mut it = rest
        .split_whitespace()
        .skip(11)
        .map(|v| v.parse::<u64>().unwrap_or(0));
    let (user, system) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    Reading {
        total: Duration::from_millis((user + system).saturating_mul(1000 / CLK_TCK)),
        user,
        system,
    }
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

    #[test]
    fn the_split_is_scaled_to_the_precise_total() {
        let at = |ms: u64, user, system| Reading {
            total: Duration::from_millis(ms),
            user,
            system,
        };
        // 300 ms used, 3 user ticks and 1 system tick counted: 225 ms user, 75 ms system.
        let used = at(1300, 13, 5).since(&at(1000, 10, 4), true);
        assert_eq!(used.total, Duration::from_millis(300));
        assert_eq!(used.user, Duration::from_millis(225));
        assert_eq!(used.system, Duration::from_millis(75));
        assert_eq!(used.ticks, Some(4));
        // No tick counted: nothing to split by.
        let none = at(1001, 10, 4).since(&at(1000, 10, 4), false);
        assert_eq!((none.user, none.system), (Duration::ZERO, Duration::ZERO));
        assert_eq!(none.ticks, None);
        assert_eq!((used + none).ticks, Some(4));
        assert_eq!(keyed("user 12\nsystem 3\n", "system"), 3);
        assert_eq!(keyed("usage_usec 9\nuser_usec 7\n", "user_usec"), 7);
        assert_eq!(keyed("usage_usec 9\n", "user_usec"), 0);
    }
}
