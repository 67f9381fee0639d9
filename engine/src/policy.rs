//! The two placement policies, as pure functions of the engine state and one request.
//!
//! - `numa-aware`: the smallest set of NUMA nodes (nearest by distance) that holds the
//!   container's size (limit, or request without a limit); among equal choices the one with
//!   the most free request capacity. Capacity is accounted by requests; CPUs are shared.
//! - `topology-aware`: the pool tree (machine > socket > die > NUMA > cluster). Among pools whose
//!   free request capacity (and that of every ancestor below the root) covers the request, the
//!   best by: below the root (the root is the last resort); device affinity first with
//!   `gpu-first`; holds the limit too; deeper; device affinity with `cpu-first`; more free
//!   capacity after the limit; more room after the limits already granted; fewer containers;
//!   pack siblings (the fuller parent first); lower id. Guaranteed integer-CPU containers get
//!   exclusive CPUs from the best pool that can give them (whole cores first, packed into the
//!   fullest cluster) taken out of the shared pool. Free capacity counts exclusive CPUs taken
//!   from a pool by a grant charged above it.
//! - BestEffort containers (unless confined by the configuration or an annotation) get the
//!   machine's shared CPUs: all usable CPUs minus exclusive ones.
//! - With memory binding, `cpuset.mems` always covers memory that holds the container's memory
//!   limit: the pool's (or the NUMA nodes') memory, and for exclusive CPUs their own nodes only
//!   when those hold it.
//!
//! Requests, limits and memory come from outside: all capacity arithmetic is done in `i128`
//! (or saturating), so a request of `u64::MAX` never wraps into "fits".

use crate::cpuset::{CpuSet, NodeSet};
use crate::engine::{Engine, Reason, ResourcePriority};
use crate::grant::Grant;
use crate::request::{ContainerRequest, PolicyKind, Qos};
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
    confine_best_effort: bool,
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
        confine_best_effort: o.confine_best_effort.unwrap_or(cfg.confine_best_effort),
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
    if req.qos() == Qos::BestEffort && !eff.confine_best_effort {
        return Some(pool_choice(
            e,
            req,
            eff,
            0,
            CpuSet::new(),
            Reason::BestEffort,
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
    if req.namespace == "kube-system" || (req.qos() == Qos::BestEffort && !eff.confine_best_effort)
    {
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
            return p.mems;
        }
        // Exclusive CPUs: their own nodes when those hold the memory limit, else the pool's
        // nodes (the pool passed the memory check, and the CPUs are inside it).
        let cpu_nodes = topo.nodes_of(&exclusive);
        match req.memory_limit_bytes {
            Some(m) if !nodes_hold_memory(e, &cpu_nodes, m) => p.mems,
            _ => topo.mems_for_nodes(&cpu_nodes),
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

/// Free request capacity of a pool in milli-CPUs: its usable CPUs, minus the requests charged
/// to it and below, minus exclusive CPUs inside it held by grants charged above it. Wide
/// arithmetic: loads and requests are `u64` figures from outside.
fn free_milli(e: &Engine, id: PoolId) -> i128 {
    let load = e.pool_load(id);
    let hidden = (i128::from(load.taken_cpus) - i128::from(load.exclusive_cpus)).max(0) * 1000;
    i128::from(e.capacity_milli(id)) - i128::from(load.request_milli) - hidden
}

/// Room left by the CPU limits already granted on a pool (and below), in milli-CPUs.
fn limit_room(e: &Engine, id: PoolId) -> i128 {
    i128::from(e.capacity_milli(id)) - i128::from(e.pool_load(id).limit_milli)
}

/// Whether the memory of `nodes` (their single-node pools, with attached memory-only nodes)
/// has `need` bytes free. A node of unknown size (0) does not constrain.
fn nodes_hold_memory(e: &Engine, nodes: &NodeSet, need: u64) -> bool {
    let topo = e.topology();
    let mut free: u64 = 0;
    for p in &topo.pools {
        // The shallowest pool of one node: the node's own pool (or a one-node socket or die).
        let single =
            p.numa_nodes.len() == 1 && p.parent.is_none_or(|q| topo.pools[q].numa_nodes.len() > 1);
        if !single || !p.numa_nodes.is_subset(nodes) {
            continue;
        }
        if p.memory_bytes == 0 {
            return true;
        }
        free = free.saturating_add(
            p.memory_bytes
                .saturating_sub(e.pool_load(p.id).memory_bytes),
        );
    }
    free >= need
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

/// Ranking key of a fitting pool; larger is better.
type Key = (bool, bool, bool, u32, bool, i128, i128, i64, i128, i64);

fn rank(e: &Engine, p: &Pool, limit: u64, device_nodes: &NodeSet, prio: ResourcePriority) -> Key {
    let free = free_milli(e, p.id);
    let limit = i128::from(limit);
    let device = !device_nodes.is_empty() && p.numa_nodes.intersects(device_nodes);
    let (dev_first, dev_late) = match prio {
        ResourcePriority::GpuFirst => (device, false),
        ResourcePriority::CpuFirst => (false, device),
    };
    let parent_free = p.parent.map(|q| free_milli(e, q)).unwrap_or(0);
    (
        p.id != 0,
        dev_first,
        free >= limit,
        p.depth,
        dev_late,
        free - limit,
        limit_room(e, p.id) - limit,
        -i64::from(e.pool_load(p.id).containers),
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
type SetKey = (bool, i128, std::cmp::Reverse<u32>);

/// One NUMA node as numa-aware sees it.
#[derive(Clone, Copy)]
struct NodeFig {
    id: u32,
    /// Usable CPUs, milli-CPU.
    cap: i128,
    /// Capacity minus the requests charged to the node.
    free: i128,
    /// Capacity minus the limits charged to the node.
    limit_room: i128,
    /// Memory of the node and its attached memory-only nodes (`u64::MAX` when unknown or not
    /// needed).
    mem: u64,
}

fn numa_aware(
    e: &Engine,
    req: &ContainerRequest,
    eff: Effective,
    prefer: Option<NodeSet>,
) -> Option<Choice> {
    let topo = e.topology();
    let usable = e.usable();
    let loads = e.node_load();
    // With memory binding the nodes must hold the memory limit too.
    let mem_need = if eff.memory {
        req.memory_limit_bytes.unwrap_or(0)
    } else {
        0
    };
    let mut nodes: Vec<NodeFig> = Vec::with_capacity(topo.nodes.len());
    nodes.extend(topo.nodes.iter().zip(loads.iter()).filter_map(|(n, l)| {
        let cap = n.cpus.intersection(usable).len() as i128 * 1000;
        let mem = if mem_need == 0 {
            0
        } else {
            let mut single = NodeSet::new();
            single.insert(n.id as usize);
            topo.mems_for_nodes(&single)
                .iter()
                .filter_map(|m| topo.node(m as u32))
                .fold(0u64, |acc, m| acc.saturating_add(m.memory_bytes))
        };
        (cap > 0).then_some(NodeFig {
            id: n.id,
            cap,
            free: cap - i128::from(l.request_milli),
            limit_room: cap - i128::from(l.limit_milli),
            mem: if mem == 0 { u64::MAX } else { mem },
        })
    }));
    if nodes.is_empty() {
        return None;
    }
    let size = i128::from(req.size_milli());
    let req_milli = i128::from(req.cpu_request_milli);

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
        let (cap, free, mem) = nodes
            .iter()
            .filter(|n| old.contains(n.id as usize))
            .fold((0, 0, 0u64), |(c, f, m), n| {
                (c + n.cap, f + n.free, m.saturating_add(n.mem))
            });
        if cap >= size && free >= req_milli && mem >= mem_need {
            return Some(choice_for(old));
        }
    }

    // One node: the most free capacity among nodes that hold the size (and memory); nodes that
    // also have room for the request beat nodes that would be overcommitted; then the most
    // room after the limits already granted.
    let single = nodes
        .iter()
        .filter(|n| n.cap >= size && n.mem >= mem_need)
        .max_by_key(|n| {
            (
                n.free >= req_milli,
                n.free,
                n.limit_room,
                std::cmp::Reverse(n.id),
            )
        });
    if let Some(n) = single {
        let mut set = NodeSet::new();
        set.insert(n.id as usize);
        return Some(choice_for(set));
    }
    // Several nodes: for k = 2.., the k nearest nodes from each start node; the smallest k
    // whose capacity (and memory) holds the size, then the most free capacity.
    let mut by_dist: Vec<NodeFig> = Vec::with_capacity(nodes.len());
    for k in 2..=nodes.len() {
        let mut best: Option<(SetKey, NodeSet)> = None;
        for start in &nodes {
            let Some(sn) = topo.node(start.id) else {
                continue;
            };
            by_dist.clear();
            by_dist.extend_from_slice(&nodes);
            by_dist.sort_by_key(|n| (sn.distance_to(n.id), n.id != start.id, n.id));
            let set_nodes = &by_dist[..k];
            let cap: i128 = set_nodes.iter().map(|n| n.cap).sum();
            let mem = set_nodes
                .iter()
                .fold(0u64, |acc, n| acc.saturating_add(n.mem));
            if cap < size || mem < mem_need {
                continue;
            }
            let free: i128 = set_nodes.iter().map(|n| n.free).sum();
            let mut set = NodeSet::new();
            for n in set_nodes {
                set.insert(n.id as usize);
            }
            let key = (free >= req_milli, free, std::cmp::Reverse(start.id));
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
        all.insert(n.id as usize);
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
