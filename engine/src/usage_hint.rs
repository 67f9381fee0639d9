//! The usage hint: the measured usage of the shared grants on each NUMA node (measured by
//! [`UsageHint::measure`] in [`crate::rebalance`]), which the caller hands the engine
//! ([`Engine::set_usage_hint`](crate::Engine::set_usage_hint)) so that new shared containers go, among the places that fit them, to the node least busy per shared
//! CPU rather than by requests alone. Between two measurements the engine keeps it roughly
//! current: a container placed adds its request (its usage is not known yet), a container
//! removed takes back its last measured usage (or that estimate), a container moved carries
//! it to its new node. Without a hint (the default) no placement changes.

use crate::grant::Grant;
use crate::nodeset::NodeSet;
use crate::topology::Topology;
use crate::types::Site;
use std::collections::HashMap;

/// Measured usage per NUMA node, and of each container it came from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UsageHint {
    /// Milli-CPUs used by shared grants per NUMA node (index = position in the topology's
    /// node list).
    node: Vec<u64>,
    /// Each counted container's usage, taken back when it leaves or moves.
    of: HashMap<String, u64>,
}

/// Add a grant's usage to its nodes, or take it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sign {
    Add,
    Take,
}

impl UsageHint {
    /// A hint of `node` (milli-CPUs per NUMA node, by position in the topology's node list)
    /// and `of` (each counted container's usage).
    pub(crate) fn new(node: Vec<u64>, of: HashMap<String, u64>) -> UsageHint {
        UsageHint { node, of }
    }

    /// Milli-CPUs used per NUMA node (position in the topology's node list).
    pub fn node_usage_milli(&self) -> &[u64] {
        &self.node
    }

    /// Usage per shared CPU of the NUMA nodes `nodes` together, in milli-CPUs per CPU
    /// (`shared_cpus`: their shared CPUs). A node set without shared CPUs counts as full.
    pub fn pressure(&self, topo: &Topology, nodes: &NodeSet, shared_cpus: usize) -> u64 {
        let used: u64 = nodes
            .iter()
            .filter_map(|id| topo.node_position(id))
            .map(|p| self.node.get(p).copied().unwrap_or(0))
            .fold(0, u64::saturating_add);
        match u64::try_from(shared_cpus) {
            Ok(n) if n > 0 => used / n,
            _ => u64::MAX,
        }
    }

    /// A new shared grant: counted with `estimate` (its request) until measured.
    pub(crate) fn placed(&mut self, topo: &Topology, id: &str, g: &Grant, estimate: u64) {
        if !counted(g) {
            return;
        }
        self.of.insert(id.to_string(), estimate);
        self.shift(topo, g, estimate, Sign::Add);
    }

    /// The usage counted for container `id`.
    pub fn usage_of(&self, id: &str) -> Option<u64> {
        self.of.get(id).copied()
    }

    /// A grant gone: its usage taken back from its nodes.
    pub(crate) fn removed(&mut self, topo: &Topology, id: &str, g: &Grant) {
        if let Some(usage) = self.of.remove(id) {
            self.shift(topo, g, usage, Sign::Take);
        }
    }

    /// Spreads `usage` evenly over the grant's nodes.
    fn shift(&mut self, topo: &Topology, g: &Grant, usage: u64, sign: Sign) {
        let n = u64::try_from(g.nodes.len()).unwrap_or(1).max(1);
        for pos in g.nodes.iter().filter_map(|id| topo.node_position(id)) {
            if self.node.len() <= pos {
                self.node.resize(pos + 1, 0);
            }
            let v = &mut self.node[pos];
            *v = match sign {
                Sign::Add => v.saturating_add(usage / n),
                Sign::Take => v.saturating_sub(usage / n),
            };
        }
    }
}

/// Whether a grant's usage counts: shared, on the pools.
pub(crate) fn counted(g: &Grant) -> bool {
    !g.is_exclusive() && g.site == Site::Pools
}
