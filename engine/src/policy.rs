//! The two placement policies, as pure functions of the engine state and one request.
//!
//! - `numa-aware`: the smallest set of NUMA nodes (nearest by distance) that holds the
//!   container's size (limit, or request without a limit); among equal choices the one with
//!   the most free request capacity. Capacity is accounted by requests; CPUs are shared.
//! - `topology-aware`: the pool tree (machine > socket > die > NUMA > cluster). Among pools whose
//!   free request capacity (and that of every ancestor below the root) covers the request, the
//!   best by: holds the limit too; device affinity first with `gpu-first`; deeper; device
//!   affinity with `cpu-first`; more free capacity after the limit; fewer containers; pack
//!   siblings (the fuller parent first); lower id. The root is the last resort. Guaranteed
//!   integer-CPU containers get exclusive CPUs (whole cores first, packed into the fullest
//!   cluster) taken out of the shared pool.

use crate::cpuset::{CpuSet, NodeSet};
use crate::engine::{Engine, Reason, ResourcePriority};
use crate::grant::Grant;
use crate::request::{ContainerRequest, PolicyKind};
use crate::topology::{Level, Pool, PoolId};

/// A policy's decision, before it is committed to the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub policy: PolicyKind,
    pub pool: PoolId,
    pub nodes: NodeSet,
    pub span: CpuSet,
    pub exclusive: CpuSet,
    pub mems: Option<NodeSet>,
    pub charge_memory: bool,
    pub reason: Reason,
}

/// Settings for one request: the engine's configuration with the Pod's overrides applied.
#[derive(Debug, Clone, Copy)]
struct Effective {
    policy: PolicyKind,
    memory: bool,
    level: Option<Level>,
    clusters: bool,
    exclusive: bool,
}

fn effective(e: &Engine, req: &ContainerRequest) -> Effective {
    let cfg = e.config();
    let o = if cfg.annotations_allowed {
        req.overrides.clone()
    } else {
        Default::default()
    };
    Effective {
        policy: o.policy.unwrap_or(cfg.policy),
        memory: o.memory_binding.unwrap_or(cfg.memory_topology),
        level: o.level,
        clusters: cfg.cluster_affinity || o.level == Some(Level::Cluster),
        exclusive: cfg.exclusive_cpus && o.exclusive.unwrap_or(true),
    }
}

pub fn choose(e: &Engine, req: &ContainerRequest) -> Option<Choice> {
    let eff = effective(e, req);
    if e.usable().is_empty() {
        return None;
    }
    if req.namespace == "kube-system" {
        return Some(pool_choice(
            e,
            req,
            eff,
            0,
            CpuSet::new(),
            Reason::KubeSystem,
        ));
    }
    match eff.policy {
        PolicyKind::NumaAware => numa_aware(e, req, eff, None),
        PolicyKind::TopologyAware => topology_aware(e, req, eff, None),
    }
}

/// Like [`choose`], but keeps the container where it was (`old`) when that still fits.
pub fn choose_preferring(e: &Engine, req: &ContainerRequest, old: &Grant) -> Option<Choice> {
    let eff = effective(e, req);
    if e.usable().is_empty() {
        return None;
    }
    if req.namespace == "kube-system" {
        return choose(e, req);
    }
    match eff.policy {
        PolicyKind::NumaAware if old.policy == PolicyKind::NumaAware => {
            numa_aware(e, req, eff, Some(old.nodes))
        }
        PolicyKind::TopologyAware if old.policy == PolicyKind::TopologyAware => {
            topology_aware(e, req, eff, Some(old.pool))
        }
        _ => choose(e, req),
    }
}

fn pool_choice(
    e: &Engine,
    req: &ContainerRequest,
    eff: Effective,
    pool: PoolId,
    exclusive: CpuSet,
    reason: Reason,
) -> Choice {
    let topo = e.topology();
    let p = &topo.pools[pool];
    let mems = eff.memory.then(|| {
        if exclusive.is_empty() {
            p.mems
        } else {
            topo.mems_for_nodes(&topo.nodes_of(&exclusive))
        }
    });
    Choice {
        policy: PolicyKind::TopologyAware,
        pool,
        nodes: p.numa_nodes,
        span: p.cpus,
        exclusive,
        mems,
        charge_memory: eff.memory && req.memory_limit_bytes.is_some(),
        reason,
    }
}

fn free_milli(e: &Engine, id: PoolId) -> i64 {
    e.capacity_milli(id) as i64 - e.pool_load(id).request_milli as i64
}

fn matches_level(p: &Pool, level: Level) -> bool {
    p.level == level || (level == Level::Numa && p.numa_nodes.len() == 1 && p.level < Level::Numa)
}

/// Whether `pool` and every ancestor below the root have room for the request.
fn fits(e: &Engine, pool: PoolId, req_milli: u64, mem: Option<u64>) -> bool {
    let topo = e.topology();
    for a in topo.ancestors(pool) {
        if a == 0 && pool != 0 {
            break; // the root only bounds itself
        }
        if free_milli(e, a) < req_milli as i64 {
            return false;
        }
        if let Some(m) = mem {
            let free_mem = topo.pools[a].memory_bytes as i64 - e.pool_load(a).memory_bytes as i64;
            if topo.pools[a].memory_bytes > 0 && free_mem < m as i64 {
                return false;
            }
        }
    }
    true
}

/// Ranking key of a fitting pool; larger is better.
type Key = (bool, bool, u32, bool, i64, i64, i64, i64);

fn rank(e: &Engine, p: &Pool, limit: u64, device_nodes: &NodeSet, prio: ResourcePriority) -> Key {
    let free = free_milli(e, p.id);
    let device = !device_nodes.is_empty() && p.numa_nodes.intersects(device_nodes);
    let (dev_first, dev_late) = match prio {
        ResourcePriority::GpuFirst => (device, false),
        ResourcePriority::CpuFirst => (false, device),
    };
    let parent_free = p.parent.map(|q| free_milli(e, q)).unwrap_or(0);
    (
        dev_first,
        free >= limit as i64,
        p.depth,
        dev_late,
        free - limit as i64,
        -(e.pool_load(p.id).containers as i64),
        -parent_free,
        -(p.id as i64),
    )
}

fn topology_aware(
    e: &Engine,
    req: &ContainerRequest,
    eff: Effective,
    prefer: Option<PoolId>,
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
    let mut device_nodes = NodeSet::new();
    for n in &req.device_nodes {
        device_nodes.insert(*n as usize);
    }
    let prio = e.config().priority;

    let candidate = |p: &Pool| -> bool {
        if p.level == Level::Cluster && !eff.clusters {
            return false;
        }
        if let Some(l) = eff.level {
            if !matches_level(p, l) {
                return false;
            }
        }
        if e.shared_cpus(&p.cpus).is_empty() {
            return false;
        }
        fits(e, p.id, req_milli, mem)
    };

    // A resize keeps the container where it was when that still fits.
    if let Some(old) = prefer {
        let p = &topo.pools[old];
        if candidate(p) {
            if let Some(n) = excl_n {
                if let Some(ex) = pick_exclusive(e, old, n) {
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

    if let Some(n) = excl_n {
        let mut ranked: Vec<(Key, PoolId)> = Vec::with_capacity(topo.pools.len());
        ranked.extend(
            topo.pools
                .iter()
                .filter(|p| candidate(p))
                .map(|p| (rank(e, p, limit, &device_nodes, prio), p.id)),
        );
        ranked.sort_unstable_by_key(|r| std::cmp::Reverse(r.0));
        for (_, id) in ranked {
            if let Some(ex) = pick_exclusive(e, id, n) {
                let level = topo.pools[id].level;
                return Some(pool_choice(e, req, eff, id, ex, Reason::Exclusive(level)));
            }
        }
        // No pool can give whole CPUs: fall through to a shared placement.
    }

    let mut best: Option<(Key, PoolId)> = None;
    for p in &topo.pools {
        if !candidate(p) {
            continue;
        }
        let k = rank(e, p, limit, &device_nodes, prio);
        if best.as_ref().is_none_or(|(bk, _)| k > *bk) {
            best = Some((k, p.id));
        }
    }
    let (pool, reason) = match best {
        Some((_, id)) => (id, Reason::Fits(topo.pools[id].level)),
        None => match eff.level {
            Some(l) => (0, Reason::ForcedLevelUnavailable(l)),
            None => (0, Reason::Fallback),
        },
    };
    if e.shared_cpus(&topo.pools[pool].cpus).is_empty() {
        return None;
    }
    Some(pool_choice(e, req, eff, pool, CpuSet::new(), reason))
}

/// Takes `n` exclusive CPUs from pool `id`: whole free cores first, packed into the cluster (or
/// NUMA node) with the fewest free CPUs; a remainder smaller than a core comes from an already
/// split core first. `None` when the pool cannot give `n` CPUs without leaving a pool that has
/// shared containers with no CPU.
fn pick_exclusive(e: &Engine, id: PoolId, n: usize) -> Option<CpuSet> {
    let topo = e.topology();
    let pool = &topo.pools[id];
    let avail = e.shared_cpus(&pool.cpus);
    if n == 0 || avail.len() < n {
        return None;
    }
    // Free CPUs per packing group: the core's cluster, else its NUMA node. Counted once per
    // group (clusters and nodes that meet the pool), looked up per core.
    let mut group_free: Vec<u16> = Vec::with_capacity(topo.clusters.len() + topo.nodes.len());
    group_free.extend(topo.clusters.iter().map(|g| {
        if g.intersects(&pool.cpus) {
            g.intersection(&avail).len() as u16
        } else {
            0
        }
    }));
    group_free.extend(
        topo.nodes
            .iter()
            .map(|n| n.cpus.intersection(&avail).len() as u16),
    );
    let n_clusters = topo.clusters.len();
    let group_of = |core: &CpuSet| -> usize {
        let Some(cpu) = core.first() else { return 0 };
        match topo.cluster_of_cpu(cpu) {
            Some(cl) if topo.clusters[cl].len() > core.len() => group_free[cl] as usize,
            _ => topo
                .node_index_of_cpu(cpu)
                .map(|i| group_free[n_clusters + i] as usize)
                .unwrap_or(0),
        }
    };
    // (whole core free, free CPUs in its group, first cpu) for every core with a free CPU.
    let mut cores: Vec<(bool, usize, usize, CpuSet)> = Vec::with_capacity(topo.cores.len());
    cores.extend(topo.cores.iter().filter(|c| c.intersects(&avail)).map(|c| {
        let free = c.intersection(&avail);
        (free == *c, group_of(c), c.first().unwrap_or(0), free)
    }));
    // Pools and NUMA nodes with shared containers must keep a CPU (topology-aware spans are
    // pools, numa-aware spans are unions of nodes): CPUs whose taking would leave one with none
    // are passed over, so packing into the fullest cluster cannot starve it and fail the whole
    // pool while other cores are free. Whenever the plain packed pick keeps every such set a
    // CPU, this picks exactly the same CPUs.
    let mut guarded: Vec<CpuSet> = Vec::with_capacity(topo.pools.len() + topo.nodes.len());
    guarded.extend(
        topo.pools
            .iter()
            .filter(|p| e.pool_load(p.id).shared_containers > 0 && p.cpus.intersects(&avail))
            .map(|p| e.shared_cpus(&p.cpus)),
    );
    guarded.extend(
        topo.nodes
            .iter()
            .zip(e.node_load())
            .filter(|(n, l)| l.shared > 0 && n.cpus.intersects(&avail))
            .map(|(n, _)| e.shared_cpus(&n.cpus)),
    );
    let keeps = |set: &CpuSet| guarded.iter().all(|g| !g.difference(set).is_empty());
    let mut picked = CpuSet::new();
    // Whole cores, packed.
    cores.sort_unstable_by_key(|(whole, gfree, first, _)| (!*whole, *gfree, *first));
    for (whole, _, _, free) in &cores {
        let need = n - picked.len();
        if need == 0 {
            break;
        }
        if *whole && free.len() <= need {
            let next = picked.union(free);
            if keeps(&next) {
                picked = next;
            }
        }
    }
    // Remainder: split cores first, then whole ones.
    if picked.len() < n {
        cores.sort_unstable_by_key(|(whole, gfree, first, _)| (*whole, *gfree, *first));
        for (_, _, _, free) in &cores {
            for cpu in free.difference(&picked).iter() {
                if picked.len() == n {
                    break;
                }
                let mut next = picked;
                next.insert(cpu);
                if keeps(&next) {
                    picked = next;
                }
            }
        }
    }
    if picked.len() != n {
        return None;
    }
    Some(picked)
}

/// Ranking key of a multi-node set: has room for the request, free capacity, lower start id.
type SetKey = (bool, i64, std::cmp::Reverse<u32>);

fn numa_aware(
    e: &Engine,
    req: &ContainerRequest,
    eff: Effective,
    prefer: Option<NodeSet>,
) -> Option<Choice> {
    let topo = e.topology();
    let usable = e.usable();
    let loads = e.node_load();
    // (node id, capacity, free, limit load) for nodes with usable CPUs.
    let mut nodes: Vec<(u32, i64, i64, u64)> = Vec::with_capacity(topo.nodes.len());
    nodes.extend(topo.nodes.iter().zip(loads.iter()).filter_map(|(n, l)| {
        let cap = n.cpus.intersection(usable).len() as i64 * 1000;
        (cap > 0).then_some((n.id, cap, cap - l.request_milli as i64, l.limit_milli))
    }));
    if nodes.is_empty() {
        return None;
    }
    let size = req.size_milli() as i64;
    let req_milli = req.cpu_request_milli as i64;

    let choice_for = |set: NodeSet| -> Choice {
        let mut span = CpuSet::new();
        for id in set.iter() {
            if let Some(n) = topo.node(id as u32) {
                span = span.union(&n.cpus);
            }
        }
        let pool = topo.deepest_pool_containing(&span);
        Choice {
            policy: PolicyKind::NumaAware,
            pool,
            nodes: set,
            span,
            exclusive: CpuSet::new(),
            mems: eff.memory.then(|| topo.mems_for_nodes(&set)),
            charge_memory: eff.memory && req.memory_limit_bytes.is_some(),
            reason: Reason::NumaNodes(set.len()),
        }
    };

    if let Some(old) = prefer {
        let (cap, free) = nodes
            .iter()
            .filter(|n| old.contains(n.0 as usize))
            .fold((0, 0), |(c, f), n| (c + n.1, f + n.2));
        if cap >= size && free >= req_milli {
            return Some(choice_for(old));
        }
    }

    // One node: the most free capacity among nodes that hold the size; nodes that also have
    // room for the request beat nodes that would be overcommitted.
    let single = nodes.iter().filter(|n| n.1 >= size).max_by_key(|n| {
        (
            n.2 >= req_milli,
            n.2,
            std::cmp::Reverse(n.3),
            std::cmp::Reverse(n.0),
        )
    });
    if let Some(n) = single {
        let mut set = NodeSet::new();
        set.insert(n.0 as usize);
        return Some(choice_for(set));
    }
    // Several nodes: for k = 2.., the k nearest nodes from each start node; the smallest k
    // whose capacity holds the size, then the most free capacity.
    for k in 2..=nodes.len() {
        let mut best: Option<(SetKey, NodeSet)> = None;
        for start in &nodes {
            let Some(sn) = topo.node(start.0) else {
                continue;
            };
            let mut by_dist: Vec<&(u32, i64, i64, u64)> = nodes.iter().collect();
            by_dist.sort_by_key(|n| (sn.distance_to(n.0), n.0 != start.0, n.0));
            let set_nodes = &by_dist[..k];
            let cap: i64 = set_nodes.iter().map(|n| n.1).sum();
            if cap < size {
                continue;
            }
            let free: i64 = set_nodes.iter().map(|n| n.2).sum();
            let mut set = NodeSet::new();
            for n in set_nodes {
                set.insert(n.0 as usize);
            }
            let key = (free >= req_milli, free, std::cmp::Reverse(start.0));
            if best.as_ref().is_none_or(|(bk, _)| key > *bk) {
                best = Some((key, set));
            }
        }
        if let Some((_, set)) = best {
            return Some(choice_for(set));
        }
    }
    // Larger than the machine: all nodes.
    let mut all = NodeSet::new();
    for n in &nodes {
        all.insert(n.0 as usize);
    }
    Some(choice_for(all))
}

#[cfg(test)]
mod tests {
    use crate::engine::{Engine, EngineConfig, Outcome};
    use crate::request::ContainerRequest;
    use crate::topology::{fixtures::machine, Topology};
    use std::sync::Arc;

    fn req(id: &str, request: u64, limit: u64) -> ContainerRequest {
        ContainerRequest {
            id: id.into(),
            cpu_request_milli: request,
            cpu_limit_milli: Some(limit),
            ..Default::default()
        }
    }

    #[test]
    fn exclusive_cpus_pass_over_cores_that_would_starve_a_shared_cluster() {
        // One socket, one NUMA node, clusters 0-3 and 4-7 (single-thread cores).
        let topo = Arc::new(Topology::build(&machine(1, 1, 1, 2, 4)).unwrap());
        let cfg = EngineConfig {
            cluster_affinity: true,
            ..EngineConfig::default()
        };
        let mut e = Engine::new(topo, cfg);
        for id in ["a", "b"] {
            match e.create(&req(id, 500, 1000)) {
                Outcome::Placed(p) => assert_eq!(p.cpus.len(), 4, "{id} on a cluster"),
                other => panic!("{other:?}"),
            }
        }
        // A Guaranteed 4-CPU container fits neither cluster (3.5 CPUs free each); the socket
        // can give 4 CPUs only by leaving each cluster one.
        let Outcome::Placed(g) = e.create(&req("g", 4000, 4000)) else {
            panic!("not placed");
        };
        assert!(g.exclusive, "{g:?}");
        assert_eq!(g.cpus.len(), 4);
        for id in ["a", "b"] {
            assert!(!e.grant(id).unwrap().cpus.is_empty(), "{id} kept no CPU");
        }
    }
}
