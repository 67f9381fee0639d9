//! Usage over an interval from two `cpu.stat` readings.

use super::cpu_stat::CpuStat;
use std::collections::HashMap;
use std::time::Duration;

/// One container's use over the last interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// CPU used, milli-CPUs (1000 = one CPU busy the whole interval).
    pub milli: u64,
    /// Periods throttled during the interval.
    pub throttled_periods: u64,
}

/// The last reading of each container, and the clock it was taken at (monotonic, as a
/// duration since any fixed start: the caller's).
#[derive(Debug, Default)]
pub struct Sampler {
    last: HashMap<String, (Duration, CpuStat)>,
}

impl Sampler {
    /// Records `stat` of `id` taken at `at`; returns the use since its previous reading (none
    /// for a first reading, a clock that did not advance, or counters that went back: a new
    /// cgroup under the same id).
    pub fn observe(&mut self, id: &str, at: Duration, stat: CpuStat) -> Option<Usage> {
        let prev = self.last.insert(id.to_string(), (at, stat));
        let (t0, s0) = prev?;
        let wall_us = u64::try_from(at.checked_sub(t0)?.as_micros()).ok()?;
        if wall_us == 0 {
            return None;
        }
        let used = stat.usage_usec.checked_sub(s0.usage_usec)?;
        let milli = used.saturating_mul(1000) / wall_us;
        Some(Usage {
            milli,
            throttled_periods: stat.nr_throttled.saturating_sub(s0.nr_throttled),
        })
    }

    /// Forgets the containers not in `live` (removed since).
    pub fn retain(&mut self, live: &dyn Fn(&str) -> bool) {
        self.last.retain(|id, _| live(id));
    }

    pub fn len(&self) -> usize {
        self.last.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(usage_usec: u64, nr_throttled: u64) -> CpuStat {
        CpuStat {
            usage_usec,
            nr_throttled,
            throttled_usec: 0,
        }
    }

    #[test]
    fn usage_is_cpu_time_over_wall_time() {
        let mut s = Sampler::default();
        let t = Duration::from_secs;
        assert_eq!(s.observe("a", t(10), stat(1_000_000, 0)), None);
        // 2.5 s of CPU in 5 s: half a CPU.
        let u = s.observe("a", t(15), stat(3_500_000, 3)).expect("usage");
        assert_eq!(
            u,
            Usage {
                milli: 500,
                throttled_periods: 3
            }
        );
        // Four CPUs busy.
        let u = s.observe("a", t(16), stat(7_500_000, 3)).expect("usage");
        assert_eq!(u.milli, 4000);
    }

    #[test]
    fn a_reset_counter_or_a_stopped_clock_gives_nothing() {
        let mut s = Sampler::default();
        let t = Duration::from_secs;
        s.observe("a", t(10), stat(9_000_000, 0));
        assert_eq!(
            s.observe("a", t(12), stat(100, 0)),
            None,
            "counter went back"
        );
        assert_eq!(s.observe("a", t(12), stat(200, 0)), None, "no time passed");
        assert!(s.observe("a", t(13), stat(1_000_200, 0)).is_some());
        s.retain(&|id| id != "a");
        assert!(s.is_empty());
    }
}
