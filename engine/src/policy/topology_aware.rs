//! `topology-aware`: the pool tree (machine > socket > die > NUMA > cache > cluster). Among pools whose
//! free request capacity (and that of every ancestor below the root) covers the request, the
//! best by: below the root (the root is the last resort); device affinity first with
//! `gpu-first`; with a usage hint from the rebalancer ([`crate::rebalance::UsageHint`]), a pool
//! of one NUMA node whose measured usage per shared CPU is lower (after taking the exclusive
//! CPUs asked for), pools over several nodes last (without a hint this term is the same for
//! every pool); locality and balance: pools of one NUMA node first, pools over
//! several last, except for a lump that no node holds (its size two thirds of a node or more:
//! spread over several nodes where the load is lowest), then device affinity
//! with `cpu-first`, then the load on the node's CPUs with the container, by requests and by
//! limits relative to the machine's average, the worse of the two, lower first
//! (`policy/balance.rs`); holds the limit too; deeper; device affinity with `cpu-first`; more
//! free capacity after the limit; more room after the limits already granted; fewer
//! containers; pack siblings (the fuller parent first); lower id. Guaranteed integer-CPU containers get
//! exclusive CPUs from the best pool that can give them (see [`pick_exclusive`]) taken out of
//! the shared pool. Free capacity counts exclusive CPUs taken from a pool by a grant charged
//! above it. Under `numa-policy: strict` only pools of one NUMA node that hold the request (its
//! limit may be wider) are tried first.

use super::balance::{widest_alike, Balancer};
use super::{pool_choice, Choice, Policy, Settings};
use crate::cpu_picker::pick_exclusive;
use crate::cpuset::CpuSet;
use crate::grant::Grant;
use crate::nodeset::NodeSet;
use crate::request::{ContainerRequest, CoreGrain, NumaPolicy, PolicyKind};
use crate::state::StateView;
use crate::topology::{Level, Pool, PoolId};
use crate::types::{Reason, ResourcePriority, Unhonoured};
use std::cell::Cell;

/// The built-in `topology-aware` policy (no state of its own).
#[derive(Debug, Clone, Copy, Default)]
pub struct TopologyAware;

impl Policy for TopologyAware {
    fn kind(&self) -> PolicyKind {
        PolicyKind::TopologyAware
    }

    fn name(&self) -> &str {
        PolicyKind::TopologyAware.as_str()
    }

    fn choose(
        &self,
        view: &StateView<'_>,
        req: &ContainerRequest,
        settings: &Settings,
        prefer: Option<&Grant>,
    ) -> Option<Choice> {
        let prefer = prefer.map(|g| g.pool);
        if settings.numa == NumaPolicy::Strict {
            // Judged by the request, as the kubelet judges `single-numa-node`: a pool of one
            // NUMA node that holds the request, whatever the limit. None: the usual choice (a
            // create is then refused by the engine, a resize keeps its nearest fit).
            let one_node = |p: &Pool| Span::of(&p.numa_nodes) == Span::OneNode;
            if let Some(c) = place(view, req, settings, prefer, Reach::OneNode, one_node) {
                return Some(c);
            }
        }
        // The pool filter is a closure so that this, the common case, pays nothing for it.
        place(view, req, settings, prefer, Reach::AnyPool, |_| true)
    }
}

/// Which pools a decision may take (`place` is also given the matching pool filter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// Any pool; the root as the last resort.
    AnyPool,
    /// Pools of one NUMA node only, and no fallback: nothing when none holds the request (or,
    /// for exclusive CPUs, gives them).
    OneNode,
}

/// Free request capacity of a pool in milli-CPUs: its usable CPUs, minus the requests charged
/// to it and below, minus exclusive CPUs inside it held by grants charged above it. Wide
/// arithmetic: loads and requests are `u64` figures from outside.
pub(crate) fn free_milli(e: &StateView<'_>, id: PoolId) -> i128 {
    let load = e.pool_load(id);
    let hidden = (i128::from(load.taken_cpus) - i128::from(load.exclusive_cpus)).max(0) * 1000;
    i128::from(e.capacity_milli(id)) - i128::from(load.request_milli) - hidden
}

/// Room left by the CPU limits already granted on a pool (and below), in milli-CPUs.
fn limit_room(e: &StateView<'_>, id: PoolId) -> i128 {
    i128::from(e.capacity_milli(id)) - i128::from(e.pool_load(id).limit_milli)
}

/// Whether `p` is a pool of `level`, or stands for one: a NUMA node collapsed into its socket
/// or die, an L3 group equal to its NUMA pool (or socket) where the cache is not smaller.
fn matches_level(topo: &crate::topology::Topology, p: &Pool, level: Level) -> bool {
    p.level == level
        || (level == Level::Numa && p.numa_nodes.len() == 1 && p.level < Level::Numa)
        || (level == Level::Cache && p.level <= Level::Numa && topo.caches.contains(&p.cpus))
}

/// Whether `pool` and every ancestor below the root have room for the request.
fn fits(e: &StateView<'_>, pool: PoolId, req_milli: u64, mem: Option<u64>) -> bool {
    let topo = e.topology();
    for a in topo.ancestors(pool) {
        if a == 0 && pool != 0 {
            break; // the root only bounds itself
        }
        if free_milli(e, a) < i128::from(req_milli) {
            return false;
        }
        if let Some(m) = mem {
            let cap = topo.pools[a].memory_bytes;
            if cap > 0 && cap.saturating_sub(e.pool_load(a).memory_bytes) < m {
                return false;
            }
        }
    }
    true
}

/// How a fitting pool ranks: compared field by field in this order, larger is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct PoolRank {
    /// Not the root: the machine's root pool is the last resort.
    below_root: bool,
    /// On a NUMA node of the container's devices, with `gpu-first`.
    device_first: bool,
    /// The rebalancer's usage term (0 without a usage hint).
    usage: i64,
    /// How close to one NUMA node the pool keeps the container.
    locality: Locality,
    /// On a NUMA node of the container's devices, with `cpu-first`: after locality, before
    /// balance.
    device_late: bool,
    /// The balance term of the pool's NUMA nodes.
    balance: i64,
    /// Room for the container's CPU limit.
    holds_limit: bool,
    /// Deeper (smaller) pools first.
    depth: u32,
    /// Request room left after the limit.
    room_after_limit: i128,
    /// Limit room left after the limit.
    limit_room_after: i128,
    /// Fewer containers (negated count).
    fewer_containers: i64,
    /// A busier parent (negated free room), packing siblings.
    busier_parent: i128,
    /// The lower pool id (negated).
    lower_id: i64,
}

fn rank(
    e: &StateView<'_>,
    memo: &Memo,
    p: &Pool,
    limit: u64,
    device_nodes: &NodeSet,
    prio: ResourcePriority,
    by: Rank,
) -> PoolRank {
    let free = free_milli(e, p.id);
    let (locality, balance) = locality(e, memo, p, free >= i128::from(limit));
    let limit = i128::from(limit);
    let device = !device_nodes.is_empty() && p.numa_nodes.intersects(device_nodes);
    let (device_first, device_late) = match prio {
        ResourcePriority::GpuFirst => (device, false),
        ResourcePriority::CpuFirst => (false, device),
    };
    let parent_free = p.parent.map(|q| free_milli(e, q)).unwrap_or(0);
    PoolRank {
        below_root: p.id != 0,
        device_first,
        usage: by.usage_key(e, p),
        locality,
        device_late,
        balance,
        holds_limit: free >= limit,
        depth: p.depth,
        room_after_limit: free - limit,
        limit_room_after: limit_room(e, p.id) - limit,
        fewer_containers: -i64::from(e.pool_load(p.id).containers),
        busier_parent: -parent_free,
        lower_id: -(p.id as i64),
    }
}

/// The locality and balance terms of pool `p` (balance 0 where it does not count: a pool
/// ranked last).
fn locality(e: &StateView<'_>, memo: &Memo, p: &Pool, holds_limit: bool) -> (Locality, i64) {
    if p.id == 0 {
        return (Locality::Last, 0); // the root ranks last anyway
    }
    match Locality::of(Span::of(&p.numa_nodes), memo.lump, holds_limit) {
        Locality::Last => (Locality::Last, 0),
        at => {
            let wide = widest_alike(e.topology(), p);
            (at, memo.get(wide.id, |b| b.key(e, wide)))
        }
    }
}

/// The balance term of the last pool worked out in one decision, by the widest pool over the
/// same nodes ([`widest_alike`]): the cache and cluster pools of a node follow each other in
/// the pool list and share their node's term, worked out once per node. One memo serves one
/// container (its request and size do not change between calls).
#[derive(Debug)]
struct Memo {
    last: Cell<Option<(PoolId, i64)>>,
    balancer: Balancer,
    /// Whether the container is a lump on every NUMA node.
    lump: Lump,
}

impl Memo {
    #[inline]
    fn get(&self, wide: PoolId, work: impl FnOnce(&Balancer) -> i64) -> i64 {
        match self.last.get() {
            Some((id, v)) if id == wide => v,
            _ => {
                let v = work(&self.balancer);
                self.last.set(Some((wide, v)));
                v
            }
        }
    }
}

/// Whether a pool is over one NUMA node or several.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Span {
    OneNode,
    Several,
}

impl Span {
    /// Without counting the set's bits (a 1,024-bit popcount on every pool of every decision).
    #[inline]
    fn of(nodes: &NodeSet) -> Span {
        let mut ids = nodes.iter();
        match (ids.next(), ids.next()) {
            (Some(_), None) => Span::OneNode,
            _ => Span::Several,
        }
    }
}

/// Where a pool ranks for locality, before balance: pools of one NUMA node first, by their
/// node's load; pools over several nodes last, except for a lump (see [`Lump`]) that no single
/// node holds: that one goes where the load is lowest, one node or several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Locality {
    Last,
    ByBalance,
    First,
}

impl Locality {
    #[inline]
    fn of(span: Span, lump: Lump, holds_limit: bool) -> Locality {
        match (span, lump) {
            (Span::OneNode, Lump::Yes) if !holds_limit => Locality::ByBalance,
            (Span::OneNode, _) => Locality::First,
            (Span::Several, Lump::Yes) => Locality::ByBalance,
            (Span::Several, Lump::No) => Locality::Last,
        }
    }
}

/// Whether a container is a lump on one NUMA node: its size (limit, or request without one) at
/// least two thirds of the largest node's CPUs (usable). On one node such a container alone makes that node the
/// fullest by limits for its life; spread over a pool of several nodes it weighs on each by its
/// share. A node that holds its limit still comes first (a container the size of an empty node
/// goes there). Measured on tap-sim's seeds 1-40 (docs/measurements/sim.md): worst imbalance by
/// limit 1.21-1.23 without, 1.17-1.18 with, 99.2% or more within one NUMA node where one fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lump {
    Yes,
    No,
}

impl Lump {
    /// Whether `size` milli-CPUs is a lump on the largest NUMA node (then on every one).
    fn of(e: &StateView<'_>, size: u64) -> Lump {
        let nodes = e.topology().nodes.len();
        let largest = (0..nodes).map(|i| e.node_capacity_milli(i)).max();
        match largest {
            Some(node) if u128::from(size) * 3 >= u128::from(node) * 2 => Lump::Yes,
            _ => Lump::No,
        }
    }
}

/// What a ranking is for, as far as the measured usage of a pool's NUMA nodes goes (when the
/// engine has a usage hint; without one the usage term is 0 for every pool).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rank {
    /// A shared grant: the lower the usage per shared CPU of the pool's nodes the better.
    Shared,
    /// `n` exclusive CPUs: the lower the usage per shared CPU left after taking them.
    Exclusive(usize),
}

impl Rank {
    /// The ranking term of measured usage (larger is better).
    #[inline]
    fn usage_key(self, e: &StateView<'_>, p: &Pool) -> i64 {
        if !e.has_usage_hint() {
            return 0;
        }
        let fewer = match self {
            Rank::Shared => 0,
            Rank::Exclusive(n) => n,
        };
        match e.usage_pressure(&p.numa_nodes, fewer) {
            None => 0,
            // Every single-node pool before a pool over several nodes: locality first.
            Some(_) if p.numa_nodes.len() != 1 => i64::MIN,
            Some(u) => -i64::try_from(u).unwrap_or(i64::MAX),
        }
    }
}

fn place(
    e: &StateView<'_>,
    req: &ContainerRequest,
    eff: &Settings,
    prefer: Option<PoolId>,
    reach: Reach,
    within_reach: impl Fn(&Pool) -> bool,
) -> Option<Choice> {
    let topo = e.topology();
    let req_milli = req.cpu_request_milli;
    let limit = req.size_milli();
    let mem = if eff.memory {
        req.memory_limit_bytes
    } else {
        None
    };
    let excl_n = if eff.exclusive {
        req.exclusive_cpus()
    } else {
        None
    };
    let (grain, mut unhonoured) = core_grain(eff.cores, excl_n);
    let mut device_nodes = NodeSet::new();
    for n in &req.device_nodes {
        device_nodes.insert(*n as usize);
    }
    let prio = e.config().priority;

    let candidate = |p: &Pool| -> bool {
        if p.level == Level::Cluster && !eff.clusters {
            return false;
        }
        if p.level == Level::Cache && !eff.caches {
            return false;
        }
        if let Some(l) = eff.level {
            if !matches_level(topo, p, l) {
                return false;
            }
        }
        if !within_reach(p) {
            return false;
        }
        if !e.pool_has_shared_cpus(p.id) {
            return false;
        }
        fits(e, p.id, req_milli, mem)
    };

    // A resize keeps the container where it was when that still fits.
    if let Some(old) = prefer {
        let p = &topo.pools[old];
        if candidate(p) {
            if let Some(n) = excl_n {
                if let Some(ex) = pick_exclusive(e, old, n, grain) {
                    return Some(pool_choice(
                        e,
                        req,
                        eff,
                        old,
                        ex,
                        Reason::Exclusive(p.level),
                    ));
                }
            } else {
                return Some(pool_choice(
                    e,
                    req,
                    eff,
                    old,
                    CpuSet::new(),
                    Reason::Fits(p.level),
                ));
            }
        }
    }

    let memo = Memo {
        last: Cell::new(None),
        balancer: Balancer::new(e, req_milli, limit),
        lump: Lump::of(e, limit),
    };
    if let Some(n) = excl_n {
        // Whole cores add up only to multiples of the cores' common size (2 where every core
        // has two threads): another count fits no pool, so none is tried (each try would walk
        // the pool's cores for nothing).
        let possible = grain != CoreGrain::WholeCores || n % topo.core_size_gcd() == 0;
        let mut ranked: Vec<(PoolRank, PoolId)> = Vec::with_capacity(topo.pools.len());
        ranked.extend(
            topo.pools
                .iter()
                .filter(|p| possible && candidate(p))
                .map(|p| {
                    (
                        rank(e, &memo, p, limit, &device_nodes, prio, Rank::Exclusive(n)),
                        p.id,
                    )
                }),
        );
        let give = |id: PoolId| pick_exclusive(e, id, n, grain).map(|ex| (id, ex));
        if let Some((id, ex)) = best_first(&mut ranked, give) {
            let level = topo.pools[id].level;
            let mut c = pool_choice(e, req, eff, id, ex, Reason::Exclusive(level));
            c.unhonoured = unhonoured.or(c.unhonoured);
            return Some(c);
        }
        if reach == Reach::OneNode {
            return None;
        }
        // No pool can give the CPUs: fall through to a shared placement, and say why where a
        // core grain stood in the way.
        unhonoured = match grain {
            CoreGrain::WholeCores => Some(Unhonoured::WholeCores { cpus: n }),
            CoreGrain::SiblingPair => Some(Unhonoured::SiblingPair),
            CoreGrain::Threads => unhonoured,
        };
    }

    let mut best: Option<(PoolRank, PoolId)> = None;
    for p in &topo.pools {
        if !candidate(p) {
            continue;
        }
        let k = rank(e, &memo, p, limit, &device_nodes, prio, Rank::Shared);
        if best.as_ref().is_none_or(|(bk, _)| k > *bk) {
            best = Some((k, p.id));
        }
    }
    let (pool, reason) = match best {
        Some((_, id)) => (id, Reason::Fits(topo.pools[id].level)),
        None if reach == Reach::OneNode => return None,
        None => match eff.level {
            Some(l) => {
                unhonoured = unhonoured.or(Some(Unhonoured::Level(l)));
                (0, Reason::ForcedLevelUnavailable(l))
            }
            None => (0, Reason::Fallback),
        },
    };
    if !e.pool_has_shared_cpus(pool) {
        return None;
    }
    let mut c = pool_choice(e, req, eff, pool, CpuSet::new(), reason);
    c.unhonoured = unhonoured.or(c.unhonoured);
    Some(c)
}

/// The first pool in ranking order that `give` answers for. The best pool nearly always
/// does: it is found in one pass, and the others are sorted only when it does not.
fn best_first<T>(
    ranked: &mut [(PoolRank, PoolId)],
    mut give: impl FnMut(PoolId) -> Option<T>,
) -> Option<T> {
    let best = (0..ranked.len()).max_by_key(|&i| ranked[i].0)?;
    ranked.swap(0, best);
    if let Some(t) = give(ranked[0].1) {
        return Some(t);
    }
    let rest = &mut ranked[1..];
    rest.sort_unstable_by_key(|r| std::cmp::Reverse(r.0));
    rest.iter().find_map(|r| give(r.1))
}

/// The core grain exclusive CPUs are taken with: `sibling-pair` only for exactly 2 CPUs (else
/// whole cores, and that it was not honoured).
fn core_grain(asked: CoreGrain, excl_n: Option<usize>) -> (CoreGrain, Option<Unhonoured>) {
    match (asked, excl_n) {
        (CoreGrain::SiblingPair, Some(2)) => (CoreGrain::SiblingPair, None),
        (CoreGrain::SiblingPair, _) => (CoreGrain::WholeCores, Some(Unhonoured::SiblingPairSize)),
        (g, _) => (g, None),
    }
}
