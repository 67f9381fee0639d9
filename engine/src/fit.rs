//! Whether a shared grant fits a target pool, the way the policies judge it: its request
//! within the free request capacity of the pool and every ancestor below the root (and the
//! memory it charges within theirs), its size (limit, or request) within the target's shared
//! CPUs. `numa-aware` grants are judged on their NUMA nodes' capacity instead, as that policy
//! does. [`Pending`] holds the changes of moves planned but not yet made (and the grant's own
//! charge, taken out before it is judged).

use crate::grant::Grant;
use crate::nodeset::NodeSet;
use crate::policy::topology_aware::free_milli;
use crate::request::PolicyKind;
use crate::state::StateView;
use crate::topology::{PoolId, Topology};

/// Request and memory charged (positive) or freed (negative) by moves not yet made, per pool
/// (index = pool id) and per NUMA node (index = position in the topology's node list).
#[derive(Debug, Clone, Default)]
pub(crate) struct Pending {
    request: Vec<i128>,
    memory: Vec<i128>,
    node_request: Vec<i128>,
}

/// Charge (`Add`) or take back (`Take`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shift {
    Add,
    Take,
}

impl Pending {
    pub fn new(topo: &Topology) -> Pending {
        Pending {
            request: vec![0; topo.pools.len()],
            memory: vec![0; topo.pools.len()],
            node_request: vec![0; topo.nodes.len()],
        }
    }

    /// Charges `g`'s request and memory to `pool` and its ancestors and to `nodes` (split
    /// evenly), or takes them back.
    pub fn shift(&mut self, topo: &Topology, g: &Grant, pool: PoolId, nodes: &NodeSet, s: Shift) {
        let sign: i128 = match s {
            Shift::Add => 1,
            Shift::Take => -1,
        };
        let req = i128::from(g.charged_request());
        for a in topo.ancestors(pool) {
            if let Some(v) = self.request.get_mut(a) {
                *v += sign * req;
            }
            if let Some(v) = self.memory.get_mut(a) {
                *v += sign * i128::from(g.memory_bytes);
            }
        }
        let n = i128::try_from(nodes.len()).unwrap_or(1).max(1);
        for id in nodes.iter() {
            if let Some(pos) = topo.nodes.iter().position(|x| x.id as usize == id) {
                self.node_request[pos] += sign * req / n;
            }
        }
    }
}

/// Whether shared grant `g` (its own charge already taken out through `pending`) fits on
/// pool `to`.
pub(crate) fn fits(view: &StateView<'_>, pending: &Pending, g: &Grant, to: PoolId) -> bool {
    let topo = view.topology();
    if to >= topo.pools.len() || !view.pool_has_shared_cpus(to) {
        return false;
    }
    match g.policy {
        PolicyKind::TopologyAware => fits_pool(view, pending, g, to),
        PolicyKind::NumaAware => fits_nodes(view, pending, g, &topo.pools[to].numa_nodes),
    }
}

fn fits_pool(view: &StateView<'_>, pending: &Pending, g: &Grant, to: PoolId) -> bool {
    let topo = view.topology();
    let req = i128::from(g.request_milli);
    for a in topo.ancestors(to) {
        if a == 0 && to != 0 {
            break; // the root only bounds itself
        }
        let extra = pending.request.get(a).copied().unwrap_or(0);
        if free_milli(view, a) - extra < req {
            return false;
        }
        let cap = topo.pools[a].memory_bytes;
        if g.memory_bytes > 0 && cap > 0 {
            let used = i128::from(view.pool_load(a).memory_bytes)
                + pending.memory.get(a).copied().unwrap_or(0);
            if i128::from(cap) - used < i128::from(g.memory_bytes) {
                return false;
            }
        }
    }
    let shared = view.shared_cpus(&topo.pools[to].cpus).len();
    size(g) <= i128::try_from(shared).unwrap_or(i128::MAX) * 1000
}

fn fits_nodes(view: &StateView<'_>, pending: &Pending, g: &Grant, nodes: &NodeSet) -> bool {
    let topo = view.topology();
    let (mut cap, mut free) = (0i128, 0i128);
    for (pos, n) in topo.nodes.iter().enumerate() {
        if !nodes.contains(n.id as usize) {
            continue;
        }
        let c = i128::from(view.node_capacity_milli(pos));
        let load = view.node_load().get(pos).map_or(0, |l| l.request_milli);
        cap += c;
        free += c - i128::from(load) - pending.node_request.get(pos).copied().unwrap_or(0);
    }
    cap > 0 && free >= i128::from(g.request_milli) && size(g) <= cap
}

/// A grant's size: its limit, or its request without one.
fn size(g: &Grant) -> i128 {
    i128::from(g.limit_milli.unwrap_or(g.request_milli))
}
