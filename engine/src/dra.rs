//! The devices this node offers through DRA: one per CPU group of the pool tree at the chosen
//! level (NUMA node by default; socket, die, cluster or cache), each with consumable capacity
//! in CPUs and memory and the attributes a claim selects or aligns on. Pure: the caller turns
//! them into a ResourceSlice. The capacities are what the node offers, not what is free: the
//! scheduler subtracts the claims it allocated itself, so a device does not change when a
//! claim or a container comes or goes (the slice is written once per topology or policy).

use crate::request::CoreGrain;
use crate::topology::{Level, Pool, Topology};
use crate::CpuSet;

/// The attribute DRA drivers publish a device's NUMA node under.
pub const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";

/// A device attribute's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttrValue {
    Int(i64),
    Bool(bool),
    Text(String),
}

/// One device: a CPU group and what it offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// `numa<id>` for a NUMA node, else the pool's name (`socket1`, `cluster3`): a DNS
    /// label, as device names must be.
    pub name: String,
    pub level: Level,
    /// CPUs a claim may be given (online, not reserved, not isolated).
    pub cpus: usize,
    /// The step a claim's CPUs come in: a whole core where exclusive CPUs are whole cores.
    pub cpu_step: usize,
    /// Memory of the group's NUMA nodes, bytes.
    pub memory_bytes: u64,
    /// Attribute name (qualified ones carry their domain) and value, sorted by name.
    pub attributes: Vec<(String, AttrValue)>,
}

/// The devices for `topo` with `allocatable` CPUs, one per pool at `level` (at NUMA level
/// where the topology has no pool of `level`); groups without an allocatable CPU are left out.
pub fn devices(
    topo: &Topology,
    allocatable: &CpuSet,
    level: Level,
    grain: CoreGrain,
) -> Vec<DeviceSpec> {
    let has_level = topo.pools.iter().any(|p| p.level == level);
    let level = if has_level { level } else { Level::Numa };
    let step = match grain {
        CoreGrain::WholeCores => topo.core_size_gcd().max(1),
        CoreGrain::SiblingPair => 2,
        CoreGrain::Threads => 1,
    };
    groups(topo, level)
        .into_iter()
        .filter_map(|(name, p)| {
            let cpus = p.cpus.intersection(allocatable).len();
            (cpus > 0).then(|| DeviceSpec {
                attributes: attributes(topo, p, level),
                name,
                level,
                cpus,
                cpu_step: step,
                memory_bytes: p.memory_bytes,
            })
        })
        .collect()
}

/// The CPU groups at `level` by device name: each NUMA node with CPUs as `numa<id>` (its pool
/// may be a socket's where the socket is one node), else the pools of the level.
fn groups(topo: &Topology, level: Level) -> Vec<(String, &Pool)> {
    if level == Level::Numa {
        return topo
            .cpu_nodes()
            .map(|n| {
                (
                    format!("numa{}", n.id),
                    topo.pool(topo.deepest_pool_containing(&n.cpus)),
                )
            })
            .collect();
    }
    topo.pools
        .iter()
        .filter(|p| p.level == level)
        .map(|p| (p.name.clone(), p))
        .collect()
}

/// The attributes of pool `p`'s device: the standard NUMA node (where the group is in one),
/// the index of each level it is in (`socket`, `die`, `numaNode`, `cache`, `cluster`),
/// `smt`, `threadsPerCore`, `cpuModel` and, on Arm, the MIDR part number.
fn attributes(topo: &Topology, p: &Pool, level: Level) -> Vec<(String, AttrValue)> {
    let mut out = vec![
        ("level".to_string(), AttrValue::Text(level.to_string())),
        ("cpuModel".to_string(), AttrValue::Text(topo.cpu.name())),
        (
            "threadsPerCore".to_string(),
            AttrValue::Int(i64::try_from(topo.threads_per_core()).unwrap_or(i64::MAX)),
        ),
        (
            "smt".to_string(),
            AttrValue::Bool(topo.threads_per_core() > 1),
        ),
    ];
    if let Some(part) = topo.cpu.part_hex() {
        out.push(("midrPart".to_string(), AttrValue::Text(part)));
    }
    if p.numa_nodes.len() == 1 {
        if let Some(node) = p.numa_nodes.iter().next() {
            let node = i64::try_from(node).unwrap_or(i64::MAX);
            out.push((NUMA_NODE.to_string(), AttrValue::Int(node)));
            out.push(("numaNode".to_string(), AttrValue::Int(node)));
        }
    }
    for id in std::iter::once(p.id).chain(topo.ancestors(p.id)) {
        let pool = topo.pool(id);
        let key = match pool.level {
            Level::Socket => "socket",
            Level::Die => "die",
            Level::Cache => "cache",
            Level::Cluster => "cluster",
            Level::Numa | Level::Machine => continue,
        };
        if let Some(index) = index_of(&pool.name) {
            out.push((key.to_string(), AttrValue::Int(index)));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.dedup_by(|a, b| a.0 == b.0);
    out
}

/// The index in a pool's name (`socket1` -> 1).
fn index_of(name: &str) -> Option<i64> {
    let digits = name.trim_start_matches(|c: char| !c.is_ascii_digit());
    digits.parse().ok()
}

/// The pool of the CPU group a device of this node names (`numa1`, `socket0`, `cluster7`), at
/// whatever level it was published.
pub fn pool_of<'t>(topo: &'t Topology, device: &str) -> Option<&'t Pool> {
    if let Some(id) = device
        .strip_prefix("numa")
        .and_then(|n| n.parse::<u32>().ok())
    {
        let node = topo.node(id).filter(|n| !n.cpus.is_empty())?;
        return Some(topo.pool(topo.deepest_pool_containing(&node.cpus)));
    }
    topo.pool_by_name(device)
}

/// The name pool `pool` is published under: `numa<id>` for a NUMA node's pool (a socket's
/// where the socket is one node), else the pool's name.
pub fn device_name(topo: &Topology, pool: crate::topology::PoolId) -> String {
    let p = topo.pool(pool);
    match topo.cpu_nodes().find(|n| n.cpus == p.cpus) {
        Some(n) => format!("numa{}", n.id),
        None => p.name.clone(),
    }
}

#[cfg(test)]
mod tests;
