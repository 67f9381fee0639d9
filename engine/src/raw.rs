//! What discovery reads off a machine, before any model is built from it: flat facts per CPU,
//! per NUMA node and per accelerator ([`RawTopology`]). [`crate::topology::Topology::build`]
//! turns them into the pool tree.

use crate::cpu_model::CpuModel;
use crate::cpuset::CpuSet;
use crate::pci::PciDevice;

/// One online CPU as discovery saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawCpu {
    pub id: usize,
    pub package: u32,
    pub die: u32,
    /// Identity of the CPU's cluster: CPUs with equal values share a cluster.
    /// `None` where the kernel reports no clusters.
    pub cluster: Option<u64>,
    /// Identity of the CPU's core: CPUs with equal values are hyperthreads of one core.
    pub core: u64,
    pub numa: Option<u32>,
    /// Identity of the CPU's last-level (L3) cache: CPUs with equal values share it. `None`
    /// without cache information.
    pub llc: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawNode {
    pub id: u32,
    pub cpus: CpuSet,
    pub memory_bytes: u64,
    /// Distances to every node, as `node<id>/distance` lists them (same order as node ids in
    /// `RawTopology::nodes` sorted ascending).
    pub distances: Vec<u32>,
    /// Read bandwidth from the node's nearest initiators in MB/s, where the firmware's HMAT
    /// tells it (`node<id>/access0/initiators/read_bandwidth`): tells HBM from PMEM/CXL.
    pub read_bandwidth: Option<u64>,
    /// The kernel's memory tier of the node (`N` of the `memory_tierN` whose `nodelist` lists
    /// it, under `devices/virtual/memory_tiering`; a lower tier is faster memory), where the
    /// kernel has them: tells PMEM/CXL from HBM ahead of the HMAT.
    pub memory_tier: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawTopology {
    pub cpus: Vec<RawCpu>,
    pub nodes: Vec<RawNode>,
    pub devices: Vec<PciDevice>,
    /// CPUs the kernel isolates (`isolcpus`): never put in a shared pool.
    pub isolated: CpuSet,
    /// The CPU model ([`crate::cpu_model::identify`]; unknown unless the caller sets it).
    pub cpu: CpuModel,
}
