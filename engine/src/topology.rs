//! The hardware topology model and the pool tree the policies place containers on.
//!
//! Discovery (see [`crate::sysfs`]) produces a [`RawTopology`]: flat facts per CPU and per NUMA
//! node. [`Topology::build`] turns it into a tree of pools:
//! machine > socket > die > NUMA node > cache (L3) > cluster, with cores and threads below as
//! CPU sets.
//! A level whose CPUs equal its parent's collapses into the parent (a one-die socket has no die
//! pool, a one-NUMA die no NUMA pool), and the machine root exists only with several sockets,
//! as in the reference implementation. Cache (L3) groups and clusters are kept only where they
//! are strictly smaller than their NUMA node (a cluster: than its cache group) and hold more
//! than one core.

mod build;
mod memory;
use crate::cpu_model::CpuModel;
use crate::cpuset::CpuSet;
use crate::nodeset::NodeSet;
pub use crate::pci::PciDevice;
pub use crate::raw::{RawCpu, RawNode, RawTopology};
pub use memory::MemoryKind;
use serde::Serialize;

crate::names! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
    #[serde(rename_all = "lowercase")]
    pub enum Level: "level", Ignored {
        Machine = "machine" | "root",
        Socket = "socket" | "package",
        Die = "die",
        Numa = "numa" | "node" | "numa-node",
        /// CPUs sharing a last-level (L3) cache, where that is smaller than their NUMA node (AMD
        /// CCX/CCD, some Arm clusters).
        Cache = "cache" | "llc" | "l3",
        Cluster = "cluster",
    }
}

pub type PoolId = usize;

/// A node of the pool tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pool {
    pub id: PoolId,
    /// Stable name, `<level><index>` (`socket1`, `numa3`, `cluster17`, `machine`): used in logs,
    /// metrics, NodeTopology status and grant records, so it must not depend on build order.
    pub name: String,
    pub level: Level,
    pub parent: Option<PoolId>,
    pub children: Vec<PoolId>,
    pub depth: u32,
    pub cpus: CpuSet,
    /// NUMA nodes whose CPUs are in this pool.
    pub numa_nodes: NodeSet,
    /// Memory nodes for `cpuset.mems`: the DRAM of `numa_nodes` (memory-only nodes are added
    /// per container, by `memory-type`: [`Topology::tier_nodes`]).
    pub mems: NodeSet,
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NumaNode {
    pub id: u32,
    pub cpus: CpuSet,
    pub memory_bytes: u64,
    /// DRAM for nodes with CPUs; memory-only nodes are PMEM/CXL or HBM (see [`MemoryKind`]).
    pub kind: MemoryKind,
    /// (node id, distance) for every node, own node included.
    pub distances: Vec<(u32, u32)>,
}

impl NumaNode {
    pub fn distance_to(&self, other: u32) -> u32 {
        self.distances
            .iter()
            .find(|(id, _)| *id == other)
            .map(|(_, d)| *d)
            .unwrap_or(if other == self.id { 10 } else { 20 })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("no online CPUs")]
    NoCpus,
    #[error("CPU {cpu} is listed twice")]
    DuplicateCpu { cpu: usize },
}

/// The discovered machine and its pool tree. Immutable once built; shared by reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub online: CpuSet,
    pub isolated: CpuSet,
    pub nodes: Vec<NumaNode>,
    pub devices: Vec<PciDevice>,
    /// Pools; index = [`PoolId`]. Pool 0 is the root, parents come before children.
    pub pools: Vec<Pool>,
    /// Thread-sibling groups, one per core, ascending by first CPU.
    pub cores: Vec<CpuSet>,
    /// Cluster CPU groups (empty without cluster information).
    pub clusters: Vec<CpuSet>,
    /// Last-level (L3) cache CPU groups (empty without cache information).
    pub caches: Vec<CpuSet>,
    pub sockets: usize,
    pub dies: usize,
    /// The CPU model, as discovery's caller identified it.
    pub cpu: CpuModel,
    /// NUMA node id of every online CPU (`u32::MAX` for none).
    cpu_node: Vec<u32>,
    /// Core index (into `cores`) of every online CPU.
    cpu_core: Vec<u32>,
    /// Cluster index (into `clusters`) of every online CPU (`u32::MAX` for none).
    cpu_cluster: Vec<u32>,
    /// CPUs of each core (index into `cores`): counted once, read on the decision path.
    core_size: Vec<u32>,
    /// The greatest common divisor of the core sizes (1 without cores): whole cores add up
    /// only to its multiples.
    core_size_gcd: u32,
    /// CPUs of each cluster (index into `clusters`).
    cluster_size: Vec<u32>,
}

impl Topology {
    pub fn build(raw: &RawTopology) -> Result<Topology, TopologyError> {
        build::build(raw)
    }

    pub fn root(&self) -> &Pool {
        &self.pools[0]
    }

    pub fn pool(&self, id: PoolId) -> &Pool {
        &self.pools[id]
    }

    pub fn pool_by_name(&self, name: &str) -> Option<&Pool> {
        self.pools.iter().find(|p| p.name == name)
    }

    /// The pool and its ancestors, the pool first.
    pub fn ancestors(&self, id: PoolId) -> impl Iterator<Item = PoolId> + '_ {
        let mut cur = Some(id);
        std::iter::from_fn(move || {
            let out = cur?;
            cur = self.pools[out].parent;
            Some(out)
        })
    }

    pub fn node(&self, id: u32) -> Option<&NumaNode> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The position in [`Topology::nodes`] of NUMA node `id`.
    pub fn node_position(&self, id: usize) -> Option<usize> {
        self.nodes.iter().position(|n| n.id as usize == id)
    }

    pub fn node_of_cpu(&self, cpu: usize) -> Option<u32> {
        per_cpu(&self.cpu_node, cpu)
    }

    pub fn core_of_cpu(&self, cpu: usize) -> Option<usize> {
        per_cpu(&self.cpu_core, cpu).map(|c| c as usize)
    }

    /// The number of CPUs of core `i` (0 for no such core).
    #[inline]
    pub fn core_size(&self, i: usize) -> usize {
        self.core_size.get(i).map_or(0, |n| *n as usize)
    }

    /// The greatest common divisor of the core sizes, at least 1: any number of whole cores
    /// holds a multiple of it.
    #[inline]
    pub fn core_size_gcd(&self) -> usize {
        self.core_size_gcd.max(1) as usize
    }

    /// The number of CPUs of cluster `i` (0 for no such cluster).
    #[inline]
    pub fn cluster_size(&self, i: usize) -> usize {
        self.cluster_size.get(i).map_or(0, |n| *n as usize)
    }

    pub fn cluster_of_cpu(&self, cpu: usize) -> Option<usize> {
        per_cpu(&self.cpu_cluster, cpu).map(|c| c as usize)
    }

    /// Position in `nodes` of the NUMA node of `cpu`.
    pub fn node_index_of_cpu(&self, cpu: usize) -> Option<usize> {
        let id = self.node_of_cpu(cpu)?;
        self.nodes.iter().position(|n| n.id == id)
    }

    /// The deepest pool whose CPUs contain `cpus` (the root when nothing deeper does).
    pub fn deepest_pool_containing(&self, cpus: &CpuSet) -> PoolId {
        let mut best = 0;
        loop {
            let next = self.pools[best]
                .children
                .iter()
                .copied()
                .find(|c| cpus.is_subset(&self.pools[*c].cpus));
            match next {
                Some(c) => best = c,
                None => return best,
            }
        }
    }

    /// NUMA nodes holding CPUs.
    pub fn cpu_nodes(&self) -> impl Iterator<Item = &NumaNode> {
        self.nodes.iter().filter(|n| !n.cpus.is_empty())
    }

    /// One CPU per core of `cpus`: the lowest-numbered CPU of each core that `cpus` holds
    /// (what a container hiding hyperthreads sees). Allocates nothing.
    pub fn one_thread_per_core(&self, cpus: &CpuSet) -> CpuSet {
        let mut seen = CpuSet::new();
        let mut out = CpuSet::new();
        for cpu in cpus.iter() {
            match self.core_of_cpu(cpu) {
                Some(core) if seen.contains(core) => {}
                Some(core) => {
                    seen.insert(core);
                    out.insert(cpu);
                }
                None => {
                    out.insert(cpu);
                }
            }
        }
        out
    }

    /// The largest number of hyperthreads of any core (1 without SMT).
    pub fn threads_per_core(&self) -> usize {
        self.cores.iter().map(|c| c.len()).max().unwrap_or(1)
    }

    /// NUMA nodes of the CPUs in `cpus`.
    pub fn nodes_of(&self, cpus: &CpuSet) -> NodeSet {
        let mut out = NodeSet::new();
        for cpu in cpus.iter() {
            if let Some(n) = self.node_of_cpu(cpu) {
                out.insert(n as usize);
            }
        }
        out
    }

    /// A multi-line, human-readable rendering of the pool tree.
    /// The pools depth first from the root, children in order (the tree as printed).
    pub fn walk(&self) -> Vec<&Pool> {
        let mut out = Vec::with_capacity(self.pools.len());
        let mut stack = vec![0];
        while let Some(id) = stack.pop() {
            let Some(p) = self.pools.get(id) else {
                continue;
            };
            out.push(p);
            stack.extend(p.children.iter().rev());
        }
        out
    }

    pub fn describe(&self) -> String {
        let mut out = String::new();
        for p in self.walk() {
            out.push_str(&p.describe());
            out.push('\n');
        }
        out
    }
}

impl Pool {
    /// The pool's line in [`Topology::describe`], indented by its depth.
    pub fn describe(&self) -> String {
        format!(
            "{}{} [{}] cpus {} ({}) mems {} mem {}",
            "  ".repeat(self.depth as usize),
            self.name,
            self.level,
            self.cpus,
            self.cpus.len(),
            self.mems,
            memory_text(self.memory_bytes)
        )
    }
}

/// A pool's memory for people: whole GiB from 10 GiB up, MiB below (a small node or a test
/// guest's 512 MiB node would read "0 GiB").
pub fn memory_text(bytes: u64) -> String {
    if bytes >= 10 << 30 {
        format!("{} GiB", bytes >> 30)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

fn attach_memory(pools: &mut [Pool], nodes: &[NumaNode]) {
    for p in pools.iter_mut() {
        let mut numa = NodeSet::new();
        for n in nodes {
            if !n.cpus.is_empty() && n.cpus.intersects(&p.cpus) {
                numa.insert(n.id as usize);
            }
        }
        p.numa_nodes = numa;
        let mems = numa;
        p.mems = mems;
        p.memory_bytes = nodes
            .iter()
            .filter(|n| mems.contains(n.id as usize))
            .map(|n| n.memory_bytes)
            .sum();
    }
}

struct TreeBuilder {
    pools: Vec<Pool>,
}

impl TreeBuilder {
    fn push(&mut self, level: Level, index: usize, parent: Option<PoolId>, cpus: CpuSet) -> PoolId {
        let id = self.pools.len();
        let depth = parent.map(|p| self.pools[p].depth + 1).unwrap_or(0);
        let name = if level == Level::Machine {
            "machine".to_string()
        } else {
            format!("{}{}", level.as_str(), index)
        };
        self.pools.push(Pool {
            id,
            name,
            level,
            parent,
            children: Vec::new(),
            depth,
            cpus,
            numa_nodes: NodeSet::new(),
            mems: NodeSet::new(),
            memory_bytes: 0,
        });
        if let Some(p) = parent {
            self.pools[p].children.push(id);
        }
        id
    }

    /// Adds a pool under `parent`, unless it would have the same CPUs as its parent, in which
    /// case the parent stands for it.
    fn push_or_collapse(
        &mut self,
        level: Level,
        index: usize,
        parent: Option<PoolId>,
        cpus: CpuSet,
    ) -> PoolId {
        match parent {
            Some(p) if self.pools[p].cpus == cpus => p,
            None if self.pools[0].cpus == cpus => 0,
            _ => self.push(level, index, parent.or(Some(0)), cpus),
        }
    }

    /// Among `candidates` and their descendants, the deepest pool that contains `cpus`.
    fn deepest_containing(&self, candidates: &[PoolId], cpus: &CpuSet) -> Option<PoolId> {
        let mut best: Option<PoolId> = None;
        for &c in candidates {
            if cpus.is_subset(&self.pools[c].cpus) {
                let better = match best {
                    None => true,
                    Some(b) => self.pools[c].depth > self.pools[b].depth,
                };
                if better {
                    best = Some(c);
                }
            }
        }
        best
    }
}

/// The entry of `cpu` in a per-CPU table (`u32::MAX` for none).
#[inline]
fn per_cpu(table: &[u32], cpu: usize) -> Option<u32> {
    table.get(cpu).copied().filter(|v| *v != u32::MAX)
}

#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    use crate::testdata::{ClusterIds, Shape};

    /// A hand-made machine: `sockets` x `dies` x `numa_per_die` x `clusters_per_numa` x
    /// `cores_per_cluster` cores, one thread each, CPU ids linear, 64 GiB per node.
    pub fn machine(
        sockets: u32,
        dies: u32,
        numa_per_die: u32,
        clusters_per_numa: u32,
        cores_per_cluster: u32,
    ) -> RawTopology {
        Shape {
            sockets,
            dies,
            numa_per_die,
            clusters_per_numa,
            cores_per_cluster,
            cluster_ids: ClusterIds::Reported,
            memory_bytes: 64 << 30,
        }
        .raw()
    }

    /// An engine on `raw` with `cfg`.
    pub fn engine_on(raw: &RawTopology, cfg: crate::EngineConfig) -> crate::Engine {
        crate::Engine::new(std::sync::Arc::new(Topology::build(raw).unwrap()), cfg)
    }

    /// The default configuration with `policy`.
    pub fn with_policy(policy: crate::PolicyKind) -> crate::EngineConfig {
        crate::EngineConfig {
            policy,
            ..crate::EngineConfig::default()
        }
    }

    /// The placement of an outcome that must be one.
    pub fn placed(o: crate::Outcome) -> crate::Placement {
        match o {
            crate::Outcome::Placed(p) => p,
            crate::Outcome::Skipped(s) => panic!("expected a placement, got skipped: {s}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::machine;
    use super::*;

    #[test]
    fn kunpeng_920_shape_builds_the_expected_tree() {
        // 2 sockets x 2 dies x 1 NUMA x 6 clusters x 4 cores = 96 CPUs.
        let t = Topology::build(&machine(2, 2, 1, 6, 4)).unwrap();
        let names: Vec<&str> = t.pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names[0], "machine");
        assert_eq!(
            t.pools.iter().filter(|p| p.level == Level::Socket).count(),
            2
        );
        // One NUMA node per die: no die pools, the NUMA pools stand for the dies.
        assert_eq!(t.pools.iter().filter(|p| p.level == Level::Die).count(), 0);
        assert_eq!(t.pools.iter().filter(|p| p.level == Level::Numa).count(), 4);
        assert_eq!(
            t.pools.iter().filter(|p| p.level == Level::Cluster).count(),
            24
        );
        assert_eq!(t.root().cpus.len(), 96);
        assert_eq!(
            t.deepest_pool_containing(&CpuSet::parse("0-3").unwrap()),
            t.pool_by_name("cluster0").unwrap().id
        );
        assert_eq!(
            t.pool(t.deepest_pool_containing(&CpuSet::parse("0-23").unwrap()))
                .cpus
                .to_string(),
            "0-23"
        );
        assert_eq!(t.node_of_cpu(30), Some(1));
    }

    #[test]
    fn single_socket_single_node_has_one_pool_without_clusters() {
        let t = Topology::build(&machine(1, 1, 1, 1, 8)).unwrap();
        assert_eq!(t.pools.len(), 1);
        assert_eq!(t.root().level, Level::Socket);
    }

    #[test]
    fn two_numa_nodes_per_die_get_die_pools() {
        // 1 socket x 2 dies x 2 NUMA nodes each: socket > die > numa > cluster.
        let t = Topology::build(&machine(1, 2, 2, 2, 4)).unwrap();
        assert_eq!(t.root().level, Level::Socket);
        assert_eq!(t.root().children.len(), 2);
        for d in &t.root().children {
            assert_eq!(t.pool(*d).level, Level::Die);
            assert_eq!(t.pool(*d).children.len(), 2);
            for n in &t.pool(*d).children {
                assert_eq!(t.pool(*n).level, Level::Numa);
                assert_eq!(t.pool(*n).children.len(), 2);
            }
        }
    }

    #[test]
    fn two_numa_nodes_in_a_one_die_socket_hang_from_the_socket() {
        let t = Topology::build(&machine(1, 1, 2, 2, 4)).unwrap();
        assert_eq!(t.root().cpus.len(), 16);
        assert_eq!(t.root().children.len(), 2);
        for c in &t.root().children {
            assert_eq!(t.pool(*c).level, Level::Numa);
            assert_eq!(t.pool(*c).children.len(), 2);
        }
    }

    #[test]
    fn empty_topology_is_an_error() {
        assert_eq!(
            Topology::build(&RawTopology::default()),
            Err(TopologyError::NoCpus)
        );
    }
}

#[cfg(test)]
mod memory_text_tests {
    use super::memory_text;

    #[test]
    fn small_pools_read_in_mib_large_ones_in_gib() {
        assert_eq!(memory_text(503 << 20), "503 MiB");
        assert_eq!(memory_text((9 << 30) + (512 << 20)), "9728 MiB");
        assert_eq!(memory_text(128 << 30), "128 GiB");
        assert_eq!(memory_text(0), "0 MiB");
    }
}
