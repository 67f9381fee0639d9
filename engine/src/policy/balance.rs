//! The balance term of `topology-aware`'s ranking (issue 25): how loaded a pool's CPUs would
//! be with the container, by requests and by limits, each relative to the machine's average,
//! the worse of the two. Lower is better. A pool of one NUMA node stands for its node (the
//! widest pool over that node), so the term orders nodes, not the pools within a node.
//!
//! The load on a pool's CPUs is what runs there, not only what is charged to the pool: its own
//! requests (and those below it), the exclusive CPUs inside it held by grants charged above it,
//! and a share of the shared grants charged to each ancestor (a socket, the machine) in
//! proportion to the pool's part of that ancestor's shared CPUs, which is where those grants'
//! cpusets put them. Loads are `u64` figures from outside: the arithmetic is `i128`, saturating.

use crate::state::StateView;
use crate::topology::{Pool, PoolId, Topology};

/// Requested and limit milli-CPUs on a set of CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Load {
    request: i128,
    limit: i128,
}

/// Scale of the ratios (one million = the machine's average load per CPU).
const SCALE: i128 = 1_000_000;

/// CPUs of pool `id` left to shared grants, in milli-CPUs.
fn shared_milli(e: &StateView<'_>, id: PoolId) -> i128 {
    let taken = i128::from(e.pool_load(id).taken_cpus).saturating_mul(1000);
    (i128::from(e.capacity_milli(id)) - taken).max(0)
}

/// Requests and limits of the shared grants charged to pool `a` itself (not below it): its
/// load minus its children's, minus the exclusive grants charged to it (a whole CPU each).
fn own_shared(e: &StateView<'_>, a: &Pool) -> Load {
    let l = e.pool_load(a.id);
    let (mut request, mut limit) = (i128::from(l.request_milli), i128::from(l.limit_milli));
    let mut exclusive = i128::from(l.exclusive_cpus);
    for c in &a.children {
        let cl = e.pool_load(*c);
        request -= i128::from(cl.request_milli);
        limit -= i128::from(cl.limit_milli);
        exclusive -= i128::from(cl.exclusive_cpus);
    }
    let exclusive = exclusive.max(0).saturating_mul(1000);
    Load {
        request: (request - exclusive).max(0),
        limit: (limit - exclusive).max(0),
    }
}

/// The load on the CPUs of pool `p` (see the module docs).
fn effective(e: &StateView<'_>, p: &Pool) -> Load {
    let l = e.pool_load(p.id);
    let hidden = (i128::from(l.taken_cpus) - i128::from(l.exclusive_cpus)).max(0) * 1000;
    let mut load = Load {
        request: i128::from(l.request_milli).saturating_add(hidden),
        limit: i128::from(l.limit_milli).saturating_add(hidden),
    };
    let mine = shared_milli(e, p.id);
    let topo = e.topology();
    let mut up = p.parent;
    while let Some(a) = up {
        let pool = &topo.pools[a];
        let own = own_shared(e, pool);
        let shared = shared_milli(e, a).max(1);
        load.request = load
            .request
            .saturating_add(own.request.saturating_mul(mine) / shared);
        load.limit = load
            .limit
            .saturating_add(own.limit.saturating_mul(mine) / shared);
        up = pool.parent;
    }
    load
}

/// The widest pool over the same NUMA nodes as `p` (`p`'s NUMA node for a cache or cluster
/// pool): pools of one node compare by their node's load, and within it by the rest of the
/// ranking.
pub(crate) fn widest_alike<'t>(topo: &'t Topology, p: &'t Pool) -> &'t Pool {
    let mut wide = p;
    while let Some(up) = wide.parent.map(|a| &topo.pools[a]) {
        if up.numa_nodes != p.numa_nodes {
            break;
        }
        wide = up;
    }
    wide
}

/// `value` per CPU of `cap`, relative to `mean` per CPU of the machine (`SCALE` = average).
fn relative(value: i128, cap: i128, mean: i128) -> i128 {
    value.saturating_mul(SCALE) / cap.max(1) * SCALE / mean.max(1)
}

/// The balance term of pool `p` (the widest of its kind: [`widest_alike`]) for a container of `request` and `size` (limit, or request
/// without one) milli-CPUs: the larger of its CPUs' request and limit load with the container,
/// each per CPU and relative to the machine's average; negated, so that larger is better.
pub(crate) fn balance_key(e: &StateView<'_>, p: &Pool, request: u64, size: u64) -> i128 {
    let cap = i128::from(e.capacity_milli(p.id));
    let load = effective(e, p);
    let machine = e.pool_load(0);
    let machine_cap = i128::from(e.capacity_milli(0)).max(1);
    let mean = |total: u64| i128::from(total).saturating_mul(SCALE) / machine_cap;
    let by_request = relative(
        load.request.saturating_add(i128::from(request)),
        cap,
        mean(machine.request_milli),
    );
    let by_limit = relative(
        load.limit.saturating_add(i128::from(size)),
        cap,
        mean(machine.limit_milli),
    );
    -by_request.max(by_limit)
}
