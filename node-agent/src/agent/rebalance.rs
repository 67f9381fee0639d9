//! One round of usage-aware rebalancing on the agent's engine: the engine's
//! [`Rebalancer`] plans with the measured usage, the moves are applied under the engine's lock
//! ([`Engine::relocate`](tap_engine::Engine::relocate)), and the caller marks the moved
//! containers for the convergence loop, which writes their new cpusets like any other change.
//!
//! Who opts out is decided before the engine is locked (the ledger's book is never locked
//! inside the engine's lock).

use super::{Agent, ContainerInfo};
use crate::hook::Hook;
use std::collections::HashSet;
use tap_engine::rebalance::{
    report, BalanceBy, Move, MoveReason, Rebalancer, UsageReport, UsageSample,
};
use tap_engine::request::{KEY_PREFIX, SKIP_KEY};

/// The annotation that keeps a Pod's containers where they were placed (`"false"`).
pub const REBALANCE_KEY: &str = "tap.kunpeng.huawei.com/rebalance";

/// Whether the rebalancer must leave `c` alone: `rebalance: "false"`, or the skip label.
pub fn opts_out(c: &ContainerInfo) -> bool {
    debug_assert!(REBALANCE_KEY.starts_with(KEY_PREFIX));
    let pod = &c.pod;
    pod.annotations
        .get(REBALANCE_KEY)
        .is_some_and(|v| v.trim() == "false")
        || pod.labels.contains_key(SKIP_KEY)
        || pod.annotations.contains_key(SKIP_KEY)
}

/// One round's measurements, each container's by its key.
#[derive(Debug, Default)]
pub struct Measured {
    /// CPU time used, milli-CPUs.
    pub usage: Vec<UsageSample>,
    /// Time waiting for a CPU (PSI `some`), milli-CPUs.
    pub stall: Vec<UsageSample>,
    /// The two together: what the rebalancer balances.
    pub demand: Vec<UsageSample>,
    /// Containers the rebalancer must leave alone ([`opts_out`]).
    pub opted_out: HashSet<String>,
}

/// [`Agent::usage_reports`].
#[derive(Debug)]
pub struct RoundReports {
    pub usage: UsageReport,
    pub stall: UsageReport,
    pub demand: UsageReport,
}

impl Agent {
    /// Plans one round and applies its moves; a move the engine refuses is logged and left
    /// out. Returns the moves made (their containers' cpusets changed in the engine).
    pub fn rebalance_round(
        &self,
        rebalancer: &mut Rebalancer,
        usage: &[UsageSample],
        tick: u64,
        opted_out: &HashSet<String>,
    ) -> Vec<Move> {
        let mut e = self.lock();
        let plan = rebalancer.plan(&e, usage, tick, &|id| opted_out.contains(id));
        let moves = plan
            .into_iter()
            .filter(|m| match e.relocate(&m.id, m.to) {
                Ok(_) => true,
                Err(err) => {
                    tracing::warn!(container = %m.id, "rebalance: move refused: {err}");
                    false
                }
            })
            .collect();
        // New shared containers go where the measured usage is lowest until the next round
        // (with PlaceBy::Usage; none with PlaceBy::Requests).
        let hint = rebalancer.hint(&e, usage);
        e.set_usage_hint(hint);
        moves
    }

    /// Placement by requests again (rebalancing turned off).
    pub fn clear_usage_hint(&self) {
        self.lock().set_usage_hint(None);
    }

    /// What a round measured, per NUMA node: CPU use, time waiting for a CPU, and demand (the
    /// two together, per shared CPU: what the rebalancer compares), for the metrics.
    pub fn usage_reports(&self, m: &Measured) -> RoundReports {
        let e = self.lock();
        RoundReports {
            usage: report(&e, &m.usage, BalanceBy::Usage),
            stall: report(&e, &m.stall, BalanceBy::Usage),
            demand: report(&e, &m.demand, BalanceBy::UsagePerSharedCpu),
        }
    }

    /// Notes a move for the Pod's `TopologyRebalanced` Event and logs it.
    pub fn note_rebalanced(&self, c: &ContainerInfo, m: &Move) {
        let name = |id: usize| self.topo.pools.get(id).map_or("?", |p| p.name.as_str());
        let (from, to) = (name(m.from), name(m.to));
        let MoveReason::UsageImbalance {
            before,
            after,
            usage_milli,
        } = m.why;
        let msg = format!(
            "moved from {from} to {to}: NUMA usage imbalance {before:.2} -> {after:.2} (this container {:.2} CPUs)",
            usage_milli as f64 / 1000.0
        );
        tracing::info!(container = %c.id, pod = %c.pod.name, namespace = %c.pod.namespace, "rebalanced: {msg}");
        self.note(Hook::Rebalance, c, crate::notes::Kind::Rebalanced, msg);
    }
}

#[cfg(test)]
mod tests;
