//! Usage traces: what each container burns over time, for usage-aware rebalancing.
//!
//! A container's life is cut into phases of `phase_s` seconds (the first one shortened by an
//! offset drawn per container, so phases do not all change at once). In each phase it burns a
//! level drawn from a generator seeded by (seed, container, phase): the same container has the
//! same usage at the same time whatever the policy, and with or without the rebalancer.
//!
//! - Guaranteed: 30-100% of its limit.
//! - Burstable: usually 10-100% of its request; in a hot phase (`hot_share` of the phases)
//!   2-4 times its request, within its limit: a container requesting 1 CPU that burns several.
//! - BestEffort: 0-500m.
//!
//! That is demand: what a container is measured to use is also bounded by its cpuset and by
//! the other containers on the same CPUs (see [`crate::rebalance`]).

use crate::gen::Rng;
use tap_engine::Qos;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UsageModel {
    pub seed: u64,
    /// Length of a usage phase in seconds.
    pub phase_s: f64,
    /// Share of Burstable phases that are hot.
    pub hot_share: f64,
}

impl UsageModel {
    pub fn new(seed: u64) -> UsageModel {
        UsageModel {
            seed,
            phase_s: 300.0,
            hot_share: 0.15,
        }
    }

    /// Milli-CPUs container number `key` (its place in the trace) burns `age_s` seconds after
    /// it started.
    pub fn usage_milli(
        &self,
        key: u64,
        qos: Qos,
        request: u64,
        limit: Option<u64>,
        age_s: f64,
    ) -> u64 {
        let mut first = Rng::new(self.seed ^ key.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let offset = first.f64() * self.phase_s;
        let phase = ((age_s.max(0.0) + offset) / self.phase_s) as u64;
        let mut rng = Rng::new(first.next_u64() ^ phase.wrapping_mul(0xD1B5_4A32_D192_ED03));
        let between = |rng: &mut Rng, lo: f64, hi: f64, of: u64| {
            ((lo + (hi - lo) * rng.f64()) * of as f64).round() as u64
        };
        match qos {
            Qos::Guaranteed => between(&mut rng, 0.3, 1.0, limit.unwrap_or(request)),
            Qos::BestEffort => between(&mut rng, 0.0, 1.0, 500),
            Qos::Burstable if rng.f64() < self.hot_share => {
                let hot = request.saturating_add(between(&mut rng, 1.0, 3.0, 1000));
                hot.min(limit.unwrap_or(u64::MAX)).max(request)
            }
            Qos::Burstable => between(&mut rng, 0.1, 1.0, request),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_a_function_of_seed_container_and_phase() {
        let m = UsageModel::new(7);
        let a = m.usage_milli(3, Qos::Burstable, 1000, Some(4000), 10.0);
        assert_eq!(a, m.usage_milli(3, Qos::Burstable, 1000, Some(4000), 10.0));
        // Within bounds, and hot phases burn more than the request.
        let mut hot = 0;
        for key in 0..2000 {
            let u = m.usage_milli(key, Qos::Burstable, 1000, Some(4000), 100.0);
            assert!((100..=4000).contains(&u), "{u}");
            hot += usize::from(u > 1000);
        }
        assert!((200..400).contains(&hot), "{hot} hot of 2000");
        let g = m.usage_milli(1, Qos::Guaranteed, 2000, Some(2000), 5.0);
        assert!((600..=2000).contains(&g));
        // Phases change the level.
        let levels: std::collections::BTreeSet<u64> = (0..20)
            .map(|p| m.usage_milli(1, Qos::Burstable, 1000, Some(4000), p as f64 * 300.0))
            .collect();
        assert!(levels.len() > 10);
    }
}
