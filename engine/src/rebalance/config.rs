//! The rebalancer's settings: when to act, how much, what is balanced, and how new shared
//! containers are placed meanwhile.

/// When and how much to rebalance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RebalanceConfig {
    /// Usage imbalance (max/mean over NUMA nodes) above which to act.
    pub threshold: f64,
    /// Consecutive rounds above the threshold before acting.
    pub window: u32,
    /// Moves per round at most.
    pub max_moves: usize,
    /// Ticks before the same container may move again.
    pub cooldown: u64,
    /// What is balanced across the NUMA nodes.
    pub by: BalanceBy,
    /// How new shared containers are placed meanwhile (see [`Rebalancer::hint`](super::Rebalancer::hint)).
    pub place: PlaceBy,
    /// When a container may move again before its cooldown is over.
    pub cooldown_waiver: CooldownWaiver,
}

/// When a container may move again before its cooldown is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CooldownWaiver {
    /// Never.
    #[default]
    Never,
    /// Off a node whose measured usage exceeds its shared CPUs (its containers wait for CPU:
    /// exclusive grants took CPUs from under them since they moved there).
    OffOversubscribed,
}

/// How the engine places new shared containers while the rebalancer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlaceBy {
    /// By requests, as without the rebalancer ([`Rebalancer::hint`](super::Rebalancer::hint) gives no hint).
    #[default]
    Requests,
    /// Among the places that fit by requests, the NUMA node with the least measured usage
    /// per shared CPU first ([`Rebalancer::hint`](super::Rebalancer::hint) gives the engine a [`UsageHint`](super::UsageHint)).
    Usage,
}

/// What the rebalancer balances across NUMA nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BalanceBy {
    /// Each node's usage, as measured.
    Usage,
    /// Each node's usage per shared CPU (usable CPUs not held exclusively): a node whose
    /// shared CPUs are fewer (exclusive grants took them) holds less usage at the same
    /// pressure. The default: balancing raw usage would move load onto such a node.
    #[default]
    UsagePerSharedCpu,
}

impl Default for RebalanceConfig {
    fn default() -> Self {
        RebalanceConfig {
            threshold: 1.15,
            window: 3,
            max_moves: 2,
            cooldown: 60,
            by: BalanceBy::default(),
            place: PlaceBy::default(),
            cooldown_waiver: CooldownWaiver::default(),
        }
    }
}

impl RebalanceConfig {
    /// The settings with which `tap-sim --rebalance` meets (or comes nearest to) the rebalancing
    /// goal on the largest fixture (docs/measurements/sim.md): new shared containers placed by measured
    /// usage, acting on the first round above 1.10, a 20-tick cooldown waived off an
    /// oversubscribed node, at most 2 moves a round. The default stays as it was (no usage
    /// placement, threshold 1.15, 3 rounds, 60 ticks). The node agent's `--rebalance=usage`
    /// runs with these.
    pub fn usage_aware() -> RebalanceConfig {
        RebalanceConfig {
            threshold: 1.10,
            window: 1,
            cooldown: 20,
            place: PlaceBy::Usage,
            cooldown_waiver: CooldownWaiver::OffOversubscribed,
            ..RebalanceConfig::default()
        }
    }
}
