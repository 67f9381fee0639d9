//! Moving a shared container to another pool (usage-aware rebalancing, [`crate::rebalance`]):
//! its grant is re-charged to the target exactly as if it had been removed and created there.

use super::{CpusetUpdate, Engine};
use crate::fit::{fits, Pending, Shift};
use crate::grant::Grant;
use crate::nodeset::NodeSet;
use crate::request::PolicyKind;
use crate::topology::PoolId;
use crate::types::Site;
use std::sync::Arc;

/// Why [`Engine::relocate`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelocateError {
    #[error("container {0} has no grant")]
    UnknownContainer(String),
    #[error("container {0} holds exclusive CPUs: only shared containers move")]
    Exclusive(String),
    #[error("container {0} runs on the reserved CPUs: only containers on the pools move")]
    Reserved(String),
    #[error("container {0} runs on the CPUs of a DRA claim: only containers on the pools move")]
    Claimed(String),
    #[error("pool {0} does not exist")]
    NoSuchPool(PoolId),
    #[error("container {id} does not fit pool {pool} (request, memory, or size)")]
    DoesNotFit { id: String, pool: PoolId },
}

impl Engine {
    /// Moves the shared grant of `id` to pool `to` (for a `numa-aware` grant: to the NUMA
    /// nodes of `to`): request, limit and memory charged there instead, the grant's span,
    /// nodes, memory nodes and cpuset those of the target, its record following. Returns the
    /// cpuset update of the container (a shared grant takes no CPU from its neighbours, so
    /// theirs do not change). Refused, with the state unchanged, for an unknown container, an
    /// exclusive or reserved grant, or a target that does not exist or does not fit.
    pub fn relocate(&mut self, id: &str, to: PoolId) -> Result<Vec<CpusetUpdate>, RelocateError> {
        let g = self
            .grants
            .get(id)
            .ok_or_else(|| RelocateError::UnknownContainer(id.to_string()))?;
        if g.is_exclusive() {
            return Err(RelocateError::Exclusive(id.to_string()));
        }
        match g.site {
            Site::Pools => {}
            Site::Reserved => return Err(RelocateError::Reserved(id.to_string())),
            Site::Claim => return Err(RelocateError::Claimed(id.to_string())),
        }
        if to >= self.topo.pools.len() {
            return Err(RelocateError::NoSuchPool(to));
        }
        let mut pending = Pending::new(&self.topo);
        pending.shift(&self.topo, g, g.pool, &g.nodes, Shift::Take);
        if !fits(&self.view(), &pending, g, to) {
            return Err(RelocateError::DoesNotFit {
                id: id.to_string(),
                pool: to,
            });
        }
        let moved = self.moved(g, to);
        let usage = self.usage_hint.as_ref().and_then(|h| h.usage_of(id));
        self.release(id);
        self.charge(&moved);
        self.hint_moved(id, &moved, usage);
        let (cpus, mems) = (moved.cpus, moved.mems);
        self.put(Arc::from(id), moved);
        Ok(vec![CpusetUpdate {
            container_id: Arc::from(id),
            cpus,
            mems,
        }])
    }

    /// Grant `g` as it is on pool `to`: the shape its policy gives a grant there.
    fn moved(&self, g: &Grant, to: PoolId) -> Grant {
        let p = &self.topo.pools[to];
        let (pool, nodes, span, dram) = match g.policy {
            PolicyKind::TopologyAware => (to, p.numa_nodes, p.cpus, p.mems),
            PolicyKind::NumaAware => {
                let span = p.numa_nodes.iter().fold(Default::default(), |s, n| {
                    self.topo
                        .node(n as u32)
                        .map_or(s, |node| node.cpus.union(&s))
                });
                let pool = self.topo.deepest_pool_containing(&span);
                (
                    pool,
                    p.numa_nodes,
                    span,
                    self.topo.mems_for_nodes(&p.numa_nodes),
                )
            }
        };
        let mems = g.mems.map(|old| self.mems_moved(g, &old, &nodes, dram));
        let mut out = Grant {
            pool,
            nodes,
            span,
            mems,
            ..g.clone()
        };
        out.cpus = out.visible(&self.topo, &self.shared_cpus(&span));
        out
    }

    /// `cpuset.mems` on the new nodes: their DRAM, and the memory-only nodes of each kind the
    /// old set held beyond its DRAM, the nearest to the new nodes.
    fn mems_moved(&self, g: &Grant, old: &NodeSet, nodes: &NodeSet, dram: NodeSet) -> NodeSet {
        let old_dram = match g.policy {
            PolicyKind::TopologyAware => self.topo.pools[g.pool].mems,
            PolicyKind::NumaAware => self.topo.mems_for_nodes(&g.nodes),
        };
        let mut out = dram;
        for id in old.iter().filter(|n| !old_dram.contains(*n)) {
            if let Some(kind) = self.topo.node(id as u32).map(|n| n.kind) {
                out = out.union(&self.topo.tier_nodes(nodes, kind));
            }
        }
        out
    }
}
