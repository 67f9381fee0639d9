//! [`Topology::build`] in named steps: the online CPUs, the NUMA nodes, cores and clusters,
//! then the pool tree (machine > socket > die > NUMA node > cluster).

use super::{
    attach_memory, CpuSet, Level, MemoryKind, NumaNode, PoolId, RawTopology, Topology,
    TopologyError, TreeBuilder,
};
use std::collections::BTreeMap;

pub(super) fn build(raw: &RawTopology) -> Result<Topology, TopologyError> {
    let online = online_cpus(raw)?;
    let max_cpu = raw.cpus.iter().map(|c| c.id).max().unwrap_or(0);
    let (nodes, cpu_node) = numa_nodes(raw, &online, max_cpu);
    let cores = groups(raw, |c| Some((c.package, c.die, c.core)));
    let clusters = groups(raw, |c| c.cluster.map(|cl| (c.package, c.die, cl)));
    let caches = groups(raw, |c| c.llc.map(|l| (c.package, l)));
    let cpu_core = index_of(&cores, max_cpu);
    let cpu_cluster = index_of(&clusters, max_cpu);
    let (core_size, cluster_size) = (sizes(&cores), sizes(&clusters));
    let core_size_gcd = core_size.iter().fold(0, |g, &n| gcd(g, n));
    let mut sockets: BTreeMap<u32, CpuSet> = BTreeMap::new();
    let mut dies: BTreeMap<(u32, u32), CpuSet> = BTreeMap::new();
    for c in &raw.cpus {
        sockets.entry(c.package).or_default().insert(c.id);
        dies.entry((c.package, c.die)).or_default().insert(c.id);
    }
    let socket_sets: Vec<CpuSet> = sockets.values().copied().collect();
    let die_sets: Vec<CpuSet> = dies.values().copied().collect();
    let shapes = Shapes {
        sockets: &socket_sets,
        dies: &die_sets,
        nodes: &nodes,
        cores: &cores,
        caches: &caches,
        clusters: &clusters,
    };
    let mut pools = pool_tree(online, &shapes);
    attach_memory(&mut pools, &nodes);
    Ok(Topology {
        online,
        isolated: raw.isolated.intersection(&online),
        nodes,
        devices: raw.devices.clone(),
        pools,
        cores,
        clusters,
        caches,
        sockets: sockets.len(),
        dies: dies.len(),
        cpu: raw.cpu.clone(),
        cpu_node,
        core_size,
        core_size_gcd,
        cluster_size,
        cpu_core,
        cpu_cluster,
    })
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The number of CPUs of each group.
fn sizes(groups: &[CpuSet]) -> Vec<u32> {
    groups
        .iter()
        .map(|g| u32::try_from(g.len()).unwrap_or(u32::MAX))
        .collect()
}

/// The online CPUs; each CPU may appear once.
fn online_cpus(raw: &RawTopology) -> Result<CpuSet, TopologyError> {
    if raw.cpus.is_empty() {
        return Err(TopologyError::NoCpus);
    }
    let mut online = CpuSet::new();
    for c in &raw.cpus {
        if online.contains(c.id) {
            return Err(TopologyError::DuplicateCpu { cpu: c.id });
        }
        online.insert(c.id);
    }
    Ok(online)
}

/// NUMA nodes sorted by id with their online CPUs, and each CPU's node. A CPU without a node
/// goes to node 0 (made up when there is none: a kernel without NUMA). Offline CPUs in a node's
/// cpulist are normal (the kernel keeps them there): the model keeps only online ones.
fn numa_nodes(raw: &RawTopology, online: &CpuSet, max_cpu: usize) -> (Vec<NumaNode>, Vec<u32>) {
    let mut raw_nodes = raw.nodes.clone();
    raw_nodes.sort_by_key(|n| n.id);
    let node_ids: Vec<u32> = raw_nodes.iter().map(|n| n.id).collect();
    // The fastest DRAM, by the HMAT's read bandwidth where it is given.
    let dram_bandwidth = raw_nodes
        .iter()
        .filter(|n| !n.cpus.is_empty())
        .filter_map(|n| n.read_bandwidth)
        .max();
    let dram = DramFigures {
        bandwidth: dram_bandwidth,
        tiers: dram_tiers(&raw_nodes),
    };
    let mut nodes: Vec<NumaNode> = raw_nodes
        .iter()
        .map(|n| NumaNode {
            id: n.id,
            cpus: n.cpus.intersection(online),
            memory_bytes: n.memory_bytes,
            kind: memory_kind(n, &dram),
            distances: node_ids
                .iter()
                .copied()
                .zip(n.distances.iter().copied())
                .collect(),
        })
        .collect();
    let mut cpu_node = vec![u32::MAX; max_cpu + 1];
    for n in &nodes {
        for cpu in n.cpus.iter() {
            cpu_node[cpu] = n.id;
        }
    }
    for c in &raw.cpus {
        if let Some(id) = c.numa {
            if cpu_node[c.id] == u32::MAX {
                cpu_node[c.id] = id;
                if let Some(n) = nodes.iter_mut().find(|n| n.id == id) {
                    n.cpus.insert(c.id);
                }
            }
        }
    }
    if nodes.is_empty() || raw.cpus.iter().any(|c| cpu_node[c.id] == u32::MAX) {
        if !nodes.iter().any(|n| n.id == 0) {
            nodes.insert(
                0,
                NumaNode {
                    id: 0,
                    cpus: CpuSet::new(),
                    memory_bytes: 0,
                    kind: MemoryKind::Dram,
                    distances: vec![(0, 10)],
                },
            );
        }
        for c in &raw.cpus {
            if cpu_node[c.id] == u32::MAX {
                cpu_node[c.id] = 0;
                if let Some(n) = nodes.iter_mut().find(|n| n.id == 0) {
                    n.cpus.insert(c.id);
                }
            }
        }
    }
    (nodes, cpu_node)
}

/// What the DRAM of the nodes with CPUs is like, for telling memory-only nodes apart.
struct DramFigures {
    /// The fastest DRAM's read bandwidth, by the HMAT, where it is given.
    bandwidth: Option<u64>,
    /// The fastest and the slowest memory tier of the nodes with CPUs, where the kernel has
    /// memory tiers.
    tiers: Option<(u32, u32)>,
}

/// The range of memory tiers the nodes with CPUs are in (one tier on every known machine).
fn dram_tiers(nodes: &[super::RawNode]) -> Option<(u32, u32)> {
    let mut tiers = nodes
        .iter()
        .filter(|n| !n.cpus.is_empty())
        .filter_map(|n| n.memory_tier);
    let first = tiers.next()?;
    Some(tiers.fold((first, first), |(lo, hi), t| (lo.min(t), hi.max(t))))
}

/// What a node's memory is (see [`MemoryKind`]): a node with CPUs (in sysfs, online or not) is
/// DRAM. A memory-only node is, by the kernel's memory tiers where it and the DRAM have one, HBM
/// in a faster tier than the DRAM's, PMEM/CXL in a slower one; otherwise (no tiers, or the
/// DRAM's own tier) HBM when the HMAT gives it more bandwidth than the fastest DRAM, else
/// PMEM/CXL.
fn memory_kind(n: &super::RawNode, dram: &DramFigures) -> MemoryKind {
    if !n.cpus.is_empty() {
        return MemoryKind::Dram;
    }
    match (n.memory_tier, dram.tiers) {
        (Some(own), Some((fastest, _))) if own < fastest => return MemoryKind::Hbm,
        (Some(own), Some((_, slowest))) if own > slowest => return MemoryKind::Pmem,
        _ => {}
    }
    match (n.read_bandwidth, dram.bandwidth) {
        (Some(own), Some(dram)) if own > dram => MemoryKind::Hbm,
        _ => MemoryKind::Pmem,
    }
}

/// CPUs grouped by a key (cores, clusters), ordered by their first CPU.
fn groups<K: Ord>(raw: &RawTopology, key: impl Fn(&super::RawCpu) -> Option<K>) -> Vec<CpuSet> {
    let mut by_key: BTreeMap<K, CpuSet> = BTreeMap::new();
    for c in &raw.cpus {
        if let Some(k) = key(c) {
            by_key.entry(k).or_default().insert(c.id);
        }
    }
    let mut sets: Vec<CpuSet> = by_key.into_values().collect();
    sets.sort_by_key(|s| s.first());
    sets
}

/// For each CPU id, the index of the group holding it (`u32::MAX` for none).
fn index_of(groups: &[CpuSet], max_cpu: usize) -> Vec<u32> {
    let mut out = vec![u32::MAX; max_cpu + 1];
    for (i, g) in groups.iter().enumerate() {
        for cpu in g.iter() {
            out[cpu] = i as u32;
        }
    }
    out
}

/// The CPU groups the pool tree is made of.
struct Shapes<'a> {
    sockets: &'a [CpuSet],
    dies: &'a [CpuSet],
    nodes: &'a [NumaNode],
    cores: &'a [CpuSet],
    caches: &'a [CpuSet],
    clusters: &'a [CpuSet],
}

/// The pool tree. The machine is a real pool only with several sockets; with one socket the
/// socket is the root (named after its level), as in the reference. A die is a pool only where
/// it holds several NUMA nodes and is smaller than its socket; a cache (L3) group and a cluster
/// only where they have several cores inside one NUMA pool (a cluster inside its cache group).
/// A level equal to its parent collapses into it.
fn pool_tree(online: CpuSet, shapes: &Shapes<'_>) -> Vec<super::Pool> {
    let Shapes {
        sockets,
        dies,
        nodes,
        cores,
        caches,
        clusters,
    } = *shapes;
    let mut b = TreeBuilder { pools: Vec::new() };
    let several = sockets.len() > 1;
    let root = b.push(
        if several {
            Level::Machine
        } else {
            Level::Socket
        },
        0,
        None,
        online,
    );
    let socket_pools: Vec<PoolId> = if several {
        sockets
            .iter()
            .enumerate()
            .map(|(i, s)| b.push(Level::Socket, i, Some(root), *s))
            .collect()
    } else {
        vec![root]
    };
    // Dies are numbered machine-wide in (package, die) order.
    let mut die_pools: Vec<PoolId> = Vec::new();
    for (i, set) in dies.iter().enumerate() {
        let nodes_inside = nodes
            .iter()
            .filter(|n| !n.cpus.is_empty() && n.cpus.is_subset(set))
            .count();
        if nodes_inside < 2 {
            continue;
        }
        if let Some(parent) = b.deepest_containing(&socket_pools, set) {
            if b.pools[parent].cpus != *set {
                die_pools.push(b.push(Level::Die, i, Some(parent), *set));
            }
        }
    }
    let mut numa_pools: Vec<PoolId> = Vec::new();
    for n in nodes.iter().filter(|n| !n.cpus.is_empty()) {
        let parent = b
            .deepest_containing(&die_pools, &n.cpus)
            .or_else(|| b.deepest_containing(&socket_pools, &n.cpus));
        numa_pools.push(b.push_or_collapse(Level::Numa, n.id as usize, parent, n.cpus));
    }
    let mut parents = numa_pools.clone();
    for (level, groups) in [(Level::Cache, caches), (Level::Cluster, clusters)] {
        let mut added = Vec::new();
        for (i, set) in groups.iter().enumerate() {
            let n_cores = cores.iter().filter(|c| c.is_subset(set)).count();
            if n_cores < 2 {
                continue;
            }
            if let Some(parent) = b.deepest_containing(&parents, set) {
                if b.pools[parent].cpus != *set {
                    added.push(b.push(level, i, Some(parent), *set));
                }
            }
        }
        parents.extend(added);
    }
    b.pools
}
