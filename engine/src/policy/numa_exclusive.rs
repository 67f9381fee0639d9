//! `numa-policy: exclusive` (like Katalyst's `numa_exclusive`): a whole NUMA node to one
//! container. The node must be free of every other container (no request charged to it or
//! below, no exclusive CPU taken in it, no numa-aware grant spanning it) and hold the
//! container's size (and memory limit, with memory binding). The container gets every usable
//! CPU of the node as exclusive CPUs, so the engine's usual machinery keeps the node to it:
//! shared containers spanning the node (a socket's, the machine's, BestEffort) lose its CPUs
//! while it runs, and no later placement can use them. Its request is charged as the whole
//! node ([`Grant::charged_request`]).

use super::{pool_choice, Choice, Settings};
use crate::grant::Grant;
use crate::request::ContainerRequest;
use crate::state::StateView;
use crate::topology::{Level, Pool};
use crate::types::Reason;

/// The whole-node choice for `req`, or `None` when no NUMA node can be given to it. `prefer`
/// is its grant before a resize: that node again when it still holds the container.
pub fn choose(
    e: &StateView<'_>,
    req: &ContainerRequest,
    set: &Settings,
    prefer: Option<&Grant>,
) -> Option<Choice> {
    let topo = e.topology();
    let fits = |p: &Pool| is_numa_pool(p) && free(e, p) && holds(e, req, set, p);
    let pool = prefer
        .map(|g| &topo.pools[g.pool])
        .filter(|p| fits(p))
        .or_else(|| {
            topo.pools
                .iter()
                .filter(|p| fits(p))
                .max_by_key(|p| (device_local(req, p), std::cmp::Reverse(p.id)))
        })?;
    let cpus = e.shared_cpus(&pool.cpus);
    // The machine always keeps a shared CPU (as for any exclusive grant).
    if e.shared_cpus(&topo.online).difference(&cpus).is_empty() {
        return None;
    }
    Some(pool_choice(
        e,
        req,
        set,
        pool.id,
        cpus,
        Reason::ExclusiveNuma,
    ))
}

/// A pool that is one NUMA node: the node's own pool, or a socket or die of one node.
fn is_numa_pool(p: &Pool) -> bool {
    p.numa_nodes.len() == 1 && p.level <= Level::Numa
}

/// Nothing else on the node: no request or container charged to it or below, no CPU of it
/// taken, no numa-aware grant spanning it.
fn free(e: &StateView<'_>, p: &Pool) -> bool {
    let load = e.pool_load(p.id);
    let usable = p.cpus.intersection(e.usable());
    let nodes_idle = e
        .topology()
        .nodes
        .iter()
        .zip(e.node_load())
        .filter(|(n, _)| p.numa_nodes.contains(n.id as usize))
        .all(|(_, l)| l.request_milli == 0 && l.shared == 0);
    load.request_milli == 0
        && load.containers == 0
        && load.taken_cpus == 0
        && !usable.is_empty()
        && e.shared_cpus(&p.cpus) == usable
        && nodes_idle
}

/// The node holds the container's size, and its memory limit when memory is bound.
fn holds(e: &StateView<'_>, req: &ContainerRequest, set: &Settings, p: &Pool) -> bool {
    let cap = e.capacity_milli(p.id);
    let mem_ok = match (set.memory, req.memory_limit_bytes) {
        (true, Some(m)) => p.memory_bytes == 0 || p.memory_bytes >= m,
        _ => true,
    };
    cap >= req.size_milli() && mem_ok
}

fn device_local(req: &ContainerRequest, p: &Pool) -> bool {
    req.device_nodes
        .iter()
        .any(|n| p.numa_nodes.contains(*n as usize))
}
