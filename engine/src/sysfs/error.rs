//! What discovery reports: errors that stop it, and warnings about things it works around.
//!
//! Every variant names the sysfs file (or directory) it is about, and the CPUs where CPUs are
//! involved, so that an operator can look at the same file on the machine.

use crate::cpuset::{CpuSet, MAX_IDS};
use crate::nodeset::NodeSet;
use crate::nodeset::MAX_NODES;
use std::io;

// CPU and node sets are boxed: a set is 128 bytes, which would make every `Result` carrying
// this error that large.

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error(
        "{path} has no online CPU and no cpuN directory: not a sysfs tree (check --sysfs-root)"
    )]
    NoCpus { path: String },
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("malformed {path}: {what} (content {content:?})")]
    Malformed {
        path: String,
        what: String,
        content: String,
    },
    /// Two NUMA nodes claim the same CPUs.
    #[error("CPUs {cpus} are in both {first} and {second}: a CPU belongs to one NUMA node")]
    OverlappingNodes {
        first: String,
        second: String,
        cpus: Box<CpuSet>,
    },
    /// The `online` list names CPUs the kernel has no directory for.
    #[error("{path} names CPUs {cpus} but {dir} has no cpuN directory for them")]
    OnlineCpuWithoutDir {
        path: String,
        dir: String,
        cpus: Box<CpuSet>,
    },
    /// NUMA node directories exist but some online CPUs are in none of their CPU lists (a node
    /// directory is missing or a list is cut short).
    #[error(
        "CPUs {cpus} are online but in no NUMA node's cpulist under {dir} (nodes {nodes} exist)"
    )]
    CpusInNoNode {
        dir: String,
        cpus: Box<CpuSet>,
        nodes: Box<NodeSet>,
    },
    /// A `cpuN` directory, or a CPU list or mask, naming a CPU that does not fit a CPU set.
    #[error("{path}: CPU id {value} is not below the supported maximum {MAX_IDS}")]
    CpuIdOutOfRange { path: String, value: String },
    /// A `nodeN` directory whose N does not fit a node set.
    #[error("{path}: NUMA node id {value} is not below the supported maximum {MAX_NODES}")]
    NodeIdOutOfRange { path: String, value: String },
    /// Two directories that parse to the same node id (`node1` and `node01`).
    #[error("{first} and {second} are both NUMA node {id}")]
    DuplicateNode {
        first: String,
        second: String,
        id: u32,
    },
    /// A CPU's `thread_siblings_list` or `cluster_cpus_list` that does not include the CPU.
    #[error("{path} lists CPUs {list}, which do not include CPU {cpu} itself")]
    ListOmitsItsCpu {
        path: String,
        cpu: usize,
        list: Box<CpuSet>,
    },
    /// A package, die, cluster or core id outside what the model can hold.
    #[error("{path}: {what} {value} of CPU {cpu} is outside 0..{limit} (-1 means unknown)")]
    TopologyIdOutOfRange {
        path: String,
        cpu: usize,
        what: &'static str,
        value: String,
        limit: u64,
    },
    /// A node's MemTotal whose byte count does not fit 64 bits.
    #[error("{path}: MemTotal {kib} kB is more bytes than 64 bits hold")]
    MemTotalOverflow { path: String, kib: String },
    /// Node memory sizes whose sum is more than the model holds: pool memory is also compared
    /// as signed 64-bit byte counts, so the limit is `i64::MAX` bytes (8 EiB).
    #[error(
        "MemTotal of NUMA nodes {nodes} adds up to more than {} bytes, more than the model holds \
         (see their meminfo files)",
        i64::MAX
    )]
    MemoryTotalOverflow { nodes: Box<NodeSet> },
}

/// Something odd that discovery worked around; the agent logs these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryWarning {
    /// `distance` of node a says d(a,b) but node b's says a different d(b,a).
    #[error(
        "NUMA distances are asymmetric: {a_path} gives {a_to_b} to node {b} but {b_path} gives \
         {b_to_a} to node {a}; each node uses its own row"
    )]
    AsymmetricDistance {
        a: u32,
        b: u32,
        a_path: String,
        b_path: String,
        a_to_b: u32,
        b_to_a: u32,
    },
    /// A `distance` row with fewer (or more) entries than there are nodes.
    #[error(
        "{path} lists {got} distances for {expected} NUMA nodes; a missing distance counts as 10 \
         to the node itself and 20 to others, extra ones are ignored"
    )]
    DistanceRowLength {
        path: String,
        node: u32,
        got: usize,
        expected: usize,
    },
    /// A PCI device's `numa_node` that names no node discovery found (or is not a number).
    #[error("{path} names NUMA node {value:?}, which does not exist; the device is treated as having no node")]
    DeviceNodeUnknown { path: String, value: String },
    /// A memory tier's `nodelist` that is not a node list.
    #[error("{path} is not a node list ({value:?}); its nodes get no memory tier")]
    MemoryTierUnreadable { path: String, value: String },
}
