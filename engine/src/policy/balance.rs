//! The balance term of `topology-aware`'s ranking: how loaded a pool's CPUs would
//! be with the container, by requests and by limits, each relative to the machine's average,
//! the worse of the two. Lower is better. A pool of one NUMA node stands for its node (the
//! widest pool over that node), so the term orders nodes, not the pools within a node.
//!
//! The load on a pool's CPUs is what runs there, not only what is charged to the pool: its own
//! requests (and those below it), the exclusive CPUs inside it held by grants charged above it,
//! and a share of the shared grants charged to each ancestor (a socket, the machine) in
//! proportion to the pool's part of that ancestor's shared CPUs, which is where those grants'
//! cpusets put them. Loads are `u64` figures from outside; the ratios are computed in `f64`
//! (no overflow, and a division costs what a multiplication does on the decision path) and
//! the term is their saturating conversion to an integer.

use crate::state::StateView;
use crate::topology::{Pool, PoolId, Topology};
use std::cell::Cell;

/// Requested and limit milli-CPUs on a set of CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Load {
    request: f64,
    limit: f64,
}

/// Scale of the term (one million = the machine's average load per CPU).
const SCALE: f64 = 1_000_000.0;

/// The weight of the request ratio against the limit ratio. Fitted on tap-sim's seeds 1-40
/// (docs/measurements/sim.md) before the exclusive picker kept shared requests whole: at 1.0 the
/// worst imbalance by request was 1.155 (seeds 1-10), at 1.03 1.134, at 1.05 1.155. With that
/// picker, seeds 1-10 worst by request / by limit: 1.118 / 1.189 at 1.03, 1.117 / 1.183 at
/// 1.15, 1.120 / 1.273 at 1.4, 1.120 / 1.316 at 3: the weight hardly moves the request
/// imbalance (the choice of node is not what keeps it up) and costs the limits above 1.15.
const REQUEST_WEIGHT: f64 = 1.03;

/// CPUs of pool `id` left to shared grants, in milli-CPUs.
#[inline]
fn shared_milli(e: &StateView<'_>, id: PoolId) -> f64 {
    let taken = f64::from(e.pool_load(id).taken_cpus) * 1000.0;
    (e.capacity_milli(id) as f64 - taken).max(0.0)
}

/// Requests and limits of the shared grants charged to pool `a` itself (not below it): its
/// load minus its children's, minus the exclusive grants charged to it (a whole CPU each).
fn own_shared(e: &StateView<'_>, a: &Pool) -> Load {
    let l = e.pool_load(a.id);
    let (mut request, mut limit) = (l.request_milli as f64, l.limit_milli as f64);
    let mut exclusive = f64::from(l.exclusive_cpus);
    for c in &a.children {
        let cl = e.pool_load(*c);
        request -= cl.request_milli as f64;
        limit -= cl.limit_milli as f64;
        exclusive -= f64::from(cl.exclusive_cpus);
    }
    let exclusive = exclusive.max(0.0) * 1000.0;
    Load {
        request: (request - exclusive).max(0.0),
        limit: (limit - exclusive).max(0.0),
    }
}

/// Works out balance terms for one container in one decision, keeping what the pools share:
/// the machine's averages, and the load per shared CPU of the shared grants charged to an
/// ancestor (the machine, and the last other ancestor met: the NUMA pools of a socket follow
/// each other in the pool list). A division costs tens of cycles of latency: one per pool.
#[derive(Debug)]
pub(crate) struct Balancer {
    request: f64,
    size: f64,
    /// Machine CPUs over its requests (times [`REQUEST_WEIGHT`]), and over its limits (an
    /// empty machine counts as 1).
    per_request: f64,
    per_limit: f64,
    root: Cell<Option<Load>>,
    last: Cell<Option<(PoolId, Load)>>,
}

impl Balancer {
    pub(crate) fn new(e: &StateView<'_>, request: u64, size: u64) -> Balancer {
        let machine = e.pool_load(0);
        let cap = (e.capacity_milli(0) as f64).max(1.0);
        Balancer {
            request: request as f64,
            size: size as f64,
            per_request: REQUEST_WEIGHT * cap / (machine.request_milli as f64).max(1.0),
            per_limit: cap / (machine.limit_milli as f64).max(1.0),
            root: Cell::new(None),
            last: Cell::new(None),
        }
    }

    /// The shared grants charged to ancestor `a` itself, per shared CPU of `a`.
    fn density(&self, e: &StateView<'_>, a: &Pool) -> Load {
        let work = || {
            let own = own_shared(e, a);
            let shared = shared_milli(e, a.id).max(1.0);
            Load {
                request: own.request / shared,
                limit: own.limit / shared,
            }
        };
        if a.id == 0 {
            let d = self.root.get().unwrap_or_else(work);
            self.root.set(Some(d));
            return d;
        }
        match self.last.get() {
            Some((id, d)) if id == a.id => d,
            _ => {
                let d = work();
                self.last.set(Some((a.id, d)));
                d
            }
        }
    }

    /// The load on the CPUs of pool `p` (see the module docs).
    fn effective(&self, e: &StateView<'_>, p: &Pool) -> Load {
        let l = e.pool_load(p.id);
        let hidden = (f64::from(l.taken_cpus) - f64::from(l.exclusive_cpus)).max(0.0) * 1000.0;
        let mut load = Load {
            request: l.request_milli as f64 + hidden,
            limit: l.limit_milli as f64 + hidden,
        };
        let mine = shared_milli(e, p.id);
        let topo = e.topology();
        let mut up = p.parent;
        while let Some(a) = up {
            let pool = &topo.pools[a];
            let d = self.density(e, pool);
            load.request += d.request * mine;
            load.limit += d.limit * mine;
            up = pool.parent;
        }
        load
    }

    /// The balance term of pool `p` (the widest of its kind: [`widest_alike`]): the larger of
    /// its CPUs' request and limit load with the container, each per CPU and relative to the
    /// machine's average; negated, so that larger is better.
    pub(crate) fn key(&self, e: &StateView<'_>, p: &Pool) -> i64 {
        let load = self.effective(e, p);
        let by_request = (load.request + self.request) * self.per_request;
        let by_limit = (load.limit + self.size) * self.per_limit;
        let cap = (e.capacity_milli(p.id) as f64).max(1.0);
        // `as` saturates (and maps NaN to 0): no input makes this wrap.
        -(by_request.max(by_limit) * SCALE / cap) as i64
    }
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
