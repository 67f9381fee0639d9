//! `cpu.stat` and `cpu.pressure` (PSI) of a cgroup v2 directory.

use std::path::Path;

/// The counters of `cpu.stat` the agent reads (all cumulative since the cgroup was made).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuStat {
    /// CPU time used, µs.
    pub usage_usec: u64,
    /// Of it, in user and in kernel mode, µs.
    pub user_usec: u64,
    pub system_usec: u64,
    /// Periods in which the cgroup hit its quota.
    pub nr_throttled: u64,
    /// Time the cgroup was throttled, µs.
    pub throttled_usec: u64,
    /// Time some of its tasks waited for a CPU (`cpu.pressure`, `some ... total=`), µs;
    /// `None` where the kernel has no PSI (or it is off: `psi=0`).
    pub stall_usec: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum CpuStatError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}: no usage_usec")]
    NoUsage(String),
}

/// Parses `cpu.stat`'s `key value` lines; unknown keys and malformed lines are skipped.
pub fn parse(text: &str) -> Option<CpuStat> {
    let mut stat = CpuStat::default();
    let mut usage = false;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(k), Some(v)) = (it.next(), it.next()) else {
            continue;
        };
        let Ok(v) = v.parse::<u64>() else {
            continue;
        };
        match k {
            "usage_usec" => {
                stat.usage_usec = v;
                usage = true;
            }
            "user_usec" => stat.user_usec = v,
            "system_usec" => stat.system_usec = v,
            "nr_throttled" => stat.nr_throttled = v,
            "throttled_usec" => stat.throttled_usec = v,
            _ => {}
        }
    }
    usage.then_some(stat)
}

/// Reads `<dir>/cpu.stat`.
pub fn read(dir: &Path) -> Result<CpuStat, CpuStatError> {
    let path = dir.join("cpu.stat");
    let text = std::fs::read_to_string(&path).map_err(|source| CpuStatError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let mut stat = parse(&text).ok_or_else(|| CpuStatError::NoUsage(path.display().to_string()))?;
    stat.stall_usec = std::fs::read_to_string(dir.join("cpu.pressure"))
        .ok()
        .as_deref()
        .and_then(parse_pressure);
    Ok(stat)
}

/// The `total=` of the `some` line of a PSI file (`some avg10=0.00 avg60=0.00 avg300=0.00
/// total=12345`), µs.
pub fn parse_pressure(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel 6.x `cpu.stat` (with the burst and nice fields newer kernels add).
    const STAT: &str = "usage_usec 123456789\nuser_usec 100000000\nsystem_usec 23456789\n\
        core_sched.force_idle_usec 0\nnice_usec 0\nnr_periods 5000\nnr_throttled 42\n\
        throttled_usec 987654\nnr_bursts 0\nburst_usec 0\n";

    #[test]
    fn reads_the_counters_it_needs() {
        let s = parse(STAT).expect("stat");
        assert_eq!(s.usage_usec, 123_456_789);
        assert_eq!((s.user_usec, s.system_usec), (100_000_000, 23_456_789));
        assert_eq!(s.nr_throttled, 42);
        assert_eq!(s.throttled_usec, 987_654);
    }

    #[test]
    fn reads_the_time_some_tasks_waited() {
        let psi = "some avg10=1.50 avg60=0.80 avg300=0.20 total=4242\n\
            full avg10=0.00 avg60=0.00 avg300=0.00 total=17\n";
        assert_eq!(parse_pressure(psi), Some(4242));
        assert_eq!(parse_pressure("full avg10=0.00 total=17\n"), None);
        assert_eq!(parse_pressure("some avg10=0.00 total=x\n"), None);
        assert_eq!(parse_pressure(""), None);
    }

    #[test]
    fn without_usage_there_is_no_stat() {
        assert_eq!(parse(""), None);
        assert_eq!(parse("usage_usec x\nnr_throttled 1\n"), None);
        // A controller without quota has no throttling lines: zeros.
        assert_eq!(parse("usage_usec 5\n").map(|s| s.nr_throttled), Some(0));
    }
}
