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
    /// Time some of its tasks waited for a CPU, milli-CPUs (PSI `some`; 0 without PSI).
    pub stall_milli: u64,
}

impl Usage {
    /// What the container would have used: CPU time plus time waiting for a CPU (what the
    /// rebalancer balances: on a crowded node, usage alone hides the excess).
    pub fn demand_milli(&self) -> u64 {
        self.milli.saturating_add(self.stall_milli)
    }
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
        let stalled = match (stat.stall_usec, s0.stall_usec) {
            (Some(now), Some(then)) => now.saturating_sub(then),
            _ => 0,
        };
        Some(Usage {
            milli,
            throttled_periods: stat.nr_throttled.saturating_sub(s0.nr_throttled),
            stall_milli: stalled.saturating_mul(1000) / wall_us,
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
            ..CpuStat::default()
        }
    }

    #[test]
    fn demand_adds_the_time_waiting_for_a_cpu() {
        let mut s = Sampler::default();
        let t = Duration::from_secs;
        let psi = |usage_usec, stall| CpuStat {
            usage_usec,
            stall_usec: Some(stall),
            ..CpuStat::default()
        };
        assert_eq!(s.observe("a", t(0), psi(0, 0)), None);
        let u = s
            .observe("a", t(10), psi(10_000_000, 5_000_000))
            .expect("usage");
        assert_eq!(
            (u.milli, u.stall_milli, u.demand_milli()),
            (1000, 500, 1500)
        );
        // PSI gone (or not there before): usage alone.
        let u = s.observe("a", t(20), stat(20_000_000, 0)).expect("usage");
        assert_eq!((u.milli, u.stall_milli), (1000, 0));
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
                throttled_periods: 3,
                stall_milli: 0
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
