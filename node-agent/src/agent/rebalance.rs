//! One round of usage-aware rebalancing on the agent's engine (issue 22): the engine's
//! [`Rebalancer`] plans with the measured usage, the moves are applied under the engine's lock
//! ([`Engine::relocate`](tap_engine::Engine::relocate)), and the caller marks the moved
//! containers for the convergence loop, which writes their new cpusets like any other change.
//!
//! Who opts out is decided before the engine is locked (the ledger's book is never locked
//! inside the engine's lock).

use super::{Agent, ContainerInfo};
use std::collections::HashSet;
use tap_engine::rebalance::{Move, MoveReason, Rebalancer, UsageSample};
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
        plan.into_iter()
            .filter(|m| match e.relocate(&m.id, m.to) {
                Ok(_) => true,
                Err(err) => {
                    tracing::warn!(container = %m.id, "rebalance: move refused: {err}");
                    false
                }
            })
            .collect()
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
        self.note("rebalance", c, crate::notes::Kind::Rebalanced, msg);
    }
}

#[cfg(test)]
mod tests;
