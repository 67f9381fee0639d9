//! What a round saw, for metrics and logs: each NUMA node's measured usage of its shared grants
//! and its shared CPUs, and the imbalance the rebalancer compares with its threshold.

use super::nodes::Nodes;
use super::{BalanceBy, UsageSample};
use crate::engine::Engine;

/// One NUMA node with shared CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeUsage {
    /// The NUMA node's id.
    pub node: u32,
    /// Milli-CPUs its shared grants used (a grant over several nodes in proportion to its
    /// CPUs on each).
    pub usage_milli: u64,
    /// Its usable CPUs not held exclusively.
    pub shared_cpus: usize,
}

/// Each node's usage and the imbalance (max/mean, by `by`; `None` with fewer than two nodes
/// with shared CPUs or no usage at all).
#[derive(Debug, Clone, PartialEq)]
pub struct UsageReport {
    pub nodes: Vec<NodeUsage>,
    pub imbalance: Option<f64>,
}

/// The figures of `usage` on `engine`'s grants, as a round measures them.
pub fn report(engine: &Engine, usage: &[UsageSample], by: BalanceBy) -> UsageReport {
    let view = engine.view();
    let topo = view.topology();
    let measured = Nodes::measure(&view, usage, by);
    let nodes = topo
        .nodes
        .iter()
        .enumerate()
        .filter(|(p, _)| measured.pool[*p].is_some())
        .map(|(p, n)| NodeUsage {
            node: n.id,
            usage_milli: measured.usage[p],
            shared_cpus: view.shared_cpus(&n.cpus).len(),
        })
        .collect();
    UsageReport {
        nodes,
        imbalance: measured.imbalance(),
    }
}
