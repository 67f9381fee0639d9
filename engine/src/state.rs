//! A read-only view of the engine's allocation state: what a policy may read to decide (the
//! topology, the configuration, the usable and taken CPUs, the load on every pool and NUMA
//! node, the grants) and nothing it could change. Built by [`crate::Engine::view`]; a handful
//! of references, so making one costs nothing and never allocates.

use crate::cpuset::CpuSet;
use crate::grant::Grant;
use crate::grants::Grants;
use crate::nodeset::NodeSet;
use crate::topology::{PoolId, Topology};
use crate::types::{EngineConfig, NodeLoad, PoolLoad};
use crate::usage_hint::UsageHint;

// The two CPU sets are copied in (small, fixed-size): the hot checks then read them one
// pointer away, as they did from the engine itself.
#[derive(Debug, Clone, Copy)]
pub struct StateView<'a> {
    topo: &'a Topology,
    cfg: &'a EngineConfig,
    usable: CpuSet,
    capacity: &'a [u64],
    node_capacity: &'a [u64],
    has_shared: &'a [bool],
    taken: CpuSet,
    grants: &'a Grants,
    pool_load: &'a [PoolLoad],
    node_load: &'a [NodeLoad],
    usage_hint: Option<&'a UsageHint>,
}

/// The engine's fields a view borrows (named, so they cannot be passed in the wrong order).
pub(crate) struct Parts<'a> {
    pub topo: &'a Topology,
    pub cfg: &'a EngineConfig,
    pub usable: &'a CpuSet,
    /// Each pool's request capacity in milli-CPUs (index = pool id).
    pub capacity: &'a [u64],
    /// Each NUMA node's request capacity in milli-CPUs (index = position in the node list).
    pub node_capacity: &'a [u64],
    /// Whether each pool has a CPU left for shared containers (index = pool id).
    pub has_shared: &'a [bool],
    pub taken: &'a CpuSet,
    pub grants: &'a Grants,
    pub pool_load: &'a [PoolLoad],
    pub node_load: &'a [NodeLoad],
    /// Measured usage per NUMA node, when the caller handed one.
    pub usage_hint: Option<&'a UsageHint>,
}

impl<'a> StateView<'a> {
    pub(crate) fn new(p: Parts<'a>) -> StateView<'a> {
        StateView {
            topo: p.topo,
            cfg: p.cfg,
            usable: *p.usable,
            capacity: p.capacity,
            node_capacity: p.node_capacity,
            has_shared: p.has_shared,
            taken: *p.taken,
            grants: p.grants,
            pool_load: p.pool_load,
            node_load: p.node_load,
            usage_hint: p.usage_hint,
        }
    }

    pub fn topology(&self) -> &'a Topology {
        self.topo
    }

    pub fn config(&self) -> &'a EngineConfig {
        self.cfg
    }

    /// CPUs any grant may use: online minus reserved and isolated.
    pub fn usable(&self) -> &CpuSet {
        &self.usable
    }

    /// Exclusive CPUs handed out.
    pub fn taken(&self) -> &CpuSet {
        &self.taken
    }

    pub fn grant(&self, id: &str) -> Option<&'a Grant> {
        self.grants.get(id)
    }

    pub fn grants(&self) -> impl Iterator<Item = (&'a str, &'a Grant)> {
        self.grants.iter().map(|(id, g)| (&**id, g))
    }

    #[inline]
    pub fn pool_load(&self, id: PoolId) -> &'a PoolLoad {
        &self.pool_load[id]
    }

    pub fn node_load(&self) -> &'a [NodeLoad] {
        self.node_load
    }

    /// CPUs a shared grant within `span` may use now.
    #[inline]
    pub fn shared_cpus(&self, span: &CpuSet) -> CpuSet {
        span.intersection(&self.usable).difference(&self.taken)
    }

    /// Whether pool `id` has a CPU left for shared containers: `shared_cpus` of its CPUs is
    /// not empty (kept by the engine, so asking costs nothing).
    #[inline]
    pub fn pool_has_shared_cpus(&self, id: PoolId) -> bool {
        self.has_shared.get(id).copied().unwrap_or(false)
    }

    /// Request capacity of a pool in milli-CPUs (its usable CPUs).
    #[inline]
    pub fn capacity_milli(&self, id: PoolId) -> u64 {
        self.capacity.get(id).copied().unwrap_or(0)
    }

    /// Request capacity in milli-CPUs of the NUMA node at `pos` in the topology's node list
    /// (its usable CPUs).
    #[inline]
    pub fn node_capacity_milli(&self, pos: usize) -> u64 {
        self.node_capacity.get(pos).copied().unwrap_or(0)
    }

    /// Measured usage per shared CPU of the NUMA nodes `nodes` together (milli-CPUs per CPU),
    /// `fewer` of their shared CPUs taken first (exclusive CPUs about to be), when the caller
    /// handed the engine a [`UsageHint`]; `None` without one.
    #[inline]
    pub fn usage_pressure(&self, nodes: &NodeSet, fewer: usize) -> Option<u64> {
        let hint = self.usage_hint?;
        Some(self.pressure(hint, nodes, fewer))
    }

    /// Whether the caller handed the engine a [`UsageHint`].
    #[inline]
    pub fn has_usage_hint(&self) -> bool {
        self.usage_hint.is_some()
    }

    fn pressure(&self, hint: &UsageHint, nodes: &NodeSet, fewer: usize) -> u64 {
        let mut cpus = CpuSet::new();
        for id in nodes.iter() {
            if let Some(n) = u32::try_from(id).ok().and_then(|id| self.topo.node(id)) {
                cpus = cpus.union(&n.cpus);
            }
        }
        let shared = self.shared_cpus(&cpus).len().saturating_sub(fewer);
        hint.pressure(self.topo, nodes, shared)
    }
}
