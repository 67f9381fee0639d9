//! The types the engine and the policies share: configuration, decisions and their reasons,
//! outcomes, and the per-pool / per-node load figures. Imports neither the engine nor the
//! policies, so both can depend on it.

use crate::cpu_model::{ClusterAffinityRule, ClustersOff, CpuModel};
use crate::cpuset::CpuSet;
use crate::nodeset::NodeSet;
use crate::request::{ContainerRequest, CoreGrain, PolicyKind};
use crate::topology::{Level, MemoryKind, PoolId};
pub use crate::updates::CpusetUpdate;
use crate::updates::CpusetUpdates;
use std::fmt;

crate::names! {
    /// Which device affinity outranks free CPU capacity when the two disagree.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub enum ResourcePriority: "resource priority", Exact {
        #[default]
        CpuFirst = "cpu-first",
        GpuFirst = "gpu-first",
    }
}

crate::names! {
    /// Whether topology-aware places containers on cache (L3) pools, where a last-level cache is
    /// smaller than its NUMA node.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub enum CacheAffinity: "cache affinity", Ignored {
        /// Cache pools are candidates like the others (the default).
        #[default]
        On = "on" | "true",
        /// Cache pools only for a Pod that asks for `level: cache`.
        Off = "off" | "false",
    }
}

crate::names! {
    /// Whether the node agent moves shared containers between NUMA nodes by their measured CPU
    /// use ([`crate::rebalance`]): the engine only carries the setting, the agent's loop reads it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub enum Rebalance: "rebalance mode", Ignored {
        /// Containers stay where they were placed (the default).
        #[default]
        Off = "none" | "off" | "false",
        /// Shared containers move off a NUMA node whose usage per shared CPU stays above the
        /// others' ([`crate::rebalance::RebalanceConfig`]).
        Usage = "usage" | "on" | "true",
    }
}

crate::names! {
    /// Whether a Pod's `reserved-cpus: "true"` annotation is honoured outside the namespaces of
    /// [`ReservedAccess::namespaces`].
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub enum ReservedAnnotation: "reserved-cpus annotation rule", Ignored {
        /// Only Pods in the listed namespaces use the reserved CPUs (the default); the annotation
        /// elsewhere is not honoured (reported).
        #[default]
        Ignored = "ignored",
        /// A Pod in any namespace that asks by annotation uses the reserved CPUs.
        Honoured = "honoured" | "honored",
    }
}

/// Who may use the reserved CPUs (system daemons): the containers of Pods in `namespaces`,
/// and, when [`ReservedAnnotation::Honoured`], any Pod that asks by annotation. Everyone else
/// stays off them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReservedAccess {
    /// Namespaces whose containers are placed on the reserved CPUs (unless a Pod says
    /// `reserved-cpus: "false"`).
    pub namespaces: Vec<String>,
    pub annotation: ReservedAnnotation,
}

impl ReservedAccess {
    /// Whether Pods of `namespace` are placed on the reserved CPUs without asking.
    pub fn lists(&self, namespace: &str) -> bool {
        self.namespaces.iter().any(|n| n == namespace)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    pub policy: PolicyKind,
    /// Set `cpuset.mems` to the chosen CPUs' NUMA nodes and account memory limits per pool.
    pub memory_topology: bool,
    /// Let topology-aware place containers on cluster pools.
    pub cluster_affinity: bool,
    /// Where cluster affinity may be used: [`EngineConfig::in_force`] applies it.
    pub cluster_rule: ClusterAffinityRule,
    /// CPUs kept out of every pool (system daemons); only the containers
    /// [`EngineConfig::reserved_for`] lets in are placed on them.
    pub reserved: CpuSet,
    /// Which containers are placed on the reserved CPUs instead of the pools.
    pub reserved_for: ReservedAccess,
    pub priority: ResourcePriority,
    /// Exclusive CPUs for Guaranteed integer-CPU containers (topology-aware).
    pub exclusive_cpus: bool,
    /// Whether Pod annotations may override the policy, level and memory binding.
    pub annotations_allowed: bool,
    /// Place BestEffort containers like the others (one pool or NUMA node, charged nothing)
    /// instead of on the machine's shared CPUs (the default, as the reference and the kubelet).
    pub confine_best_effort: bool,
    /// How exclusive CPUs are taken from cores (whole cores by default).
    pub exclusive_cores: CoreGrain,
    /// Let topology-aware place containers on cache (L3) pools.
    pub cache_affinity: CacheAffinity,
    /// Usage-aware rebalancing of shared containers (off by default).
    pub rebalance: Rebalance,
    /// The CPU group each DRA device is ([`crate::dra`]), where a policy sets it; `None`: the
    /// agent's own setting.
    pub dra_level: Option<Level>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            policy: PolicyKind::TopologyAware,
            memory_topology: false,
            cluster_affinity: false,
            cluster_rule: ClusterAffinityRule::Any,
            reserved: CpuSet::new(),
            reserved_for: ReservedAccess::default(),
            priority: ResourcePriority::CpuFirst,
            exclusive_cpus: true,
            annotations_allowed: true,
            confine_best_effort: false,
            exclusive_cores: CoreGrain::WholeCores,
            cache_affinity: CacheAffinity::On,
            rebalance: Rebalance::Off,
            dra_level: None,
        }
    }
}

impl EngineConfig {
    /// The configuration in force on a machine with CPU `cpu`: cluster affinity turned off
    /// where [`EngineConfig::cluster_rule`] does not allow it, and why. The one place the rule
    /// applies: the engine takes every configuration through it, whether it came from flags or
    /// from a NodeTopology policy.
    pub fn in_force(mut self, cpu: &CpuModel) -> (EngineConfig, Option<ClustersOff>) {
        let off = if self.cluster_affinity {
            self.cluster_rule.check(cpu).err()
        } else {
            None
        };
        if off.is_some() {
            self.cluster_affinity = false;
        }
        (self, off)
    }
}

/// Why a container was left alone (no adjustment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// The skip label/annotation or `policy: none`.
    OptedOut,
    /// The container is already placed (a repeated create event).
    AlreadyPlaced,
    /// Nothing usable to place on (every CPU reserved or isolated).
    NoCapacity,
    /// `numa-policy: strict` and no single NUMA node holds the container.
    NoSingleNumaNode,
    /// `numa-policy: exclusive` and no NUMA node is free of other containers (or holds it).
    NoFreeNumaNode,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SkipReason::OptedOut => "opted out by label or annotation",
            SkipReason::AlreadyPlaced => "already placed",
            SkipReason::NoCapacity => "no shared CPUs left to place on",
            SkipReason::NoSingleNumaNode => {
                "numa-policy strict: no single NUMA node holds the container"
            }
            SkipReason::NoFreeNumaNode => {
                "numa-policy exclusive: no NUMA node is free of other containers and holds this one"
            }
        })
    }
}

/// A per-Pod control that the placement could not honour: the container is placed anyway (as
/// it would be without the control), and the agent says so (a Warning Event, a metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unhonoured {
    /// Exclusive CPUs in whole cores: no pool has this many CPUs in whole free cores (or the
    /// count is not made of whole cores); the container shares CPUs instead.
    WholeCores { cpus: usize },
    /// `sibling-pair`: no core has two free hyperthreads; the container shares CPUs instead.
    SiblingPair,
    /// `sibling-pair` on a container that is not Guaranteed with exactly 2 CPUs: ignored.
    SiblingPairSize,
    /// `memory-type`: the machine has no memory of this kind; DRAM only.
    MemoryType(MemoryKind),
    /// `level`: no pool of this level fits (or the machine has none); the root instead.
    Level(Level),
    /// `memory-type` with memory binding turned off for the container (`memory-binding:
    /// false`): no `cpuset.mems` is set.
    MemoryTypeUnbound,
    /// `reserved-cpus: "true"`: not allowed, or no reserved CPUs; placed on the pools.
    ReservedCpus(ReservedRefusal),
}

/// Why a Pod's ask for the reserved CPUs was not honoured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReservedRefusal {
    /// The Pod's namespace is not listed and the policy does not honour the annotation.
    NotAllowed,
    /// The node has no reserved CPUs.
    NoneReserved,
}

impl Unhonoured {
    /// The control, as the `tap_errors_total` metric's `kind` label names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Unhonoured::WholeCores { .. } => "whole_cores",
            Unhonoured::SiblingPair | Unhonoured::SiblingPairSize => "sibling_pair",
            Unhonoured::MemoryType(_) | Unhonoured::MemoryTypeUnbound => "memory_type",
            Unhonoured::Level(_) => "level",
            Unhonoured::ReservedCpus(_) => "reserved_cpus",
        }
    }
}

impl fmt::Display for Unhonoured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unhonoured::WholeCores { cpus } => write!(
                f,
                "exclusive-cores whole: no pool has {cpus} CPUs in whole free cores; \
                 shared CPUs instead (exclusive-cores: threads allows split cores)"
            ),
            Unhonoured::SiblingPair => f.write_str(
                "exclusive-cores sibling-pair: no core has two free hyperthreads; shared CPUs instead",
            ),
            Unhonoured::SiblingPairSize => f.write_str(
                "exclusive-cores sibling-pair needs a Guaranteed container of exactly 2 CPUs; ignored",
            ),
            Unhonoured::MemoryType(k) => {
                write!(f, "memory-type {k}: this machine has no {k} memory; DRAM only")
            }
            Unhonoured::Level(l) => write!(
                f,
                "level {l}: no {l} pool fits (full, or this machine has none); the whole machine instead"
            ),
            Unhonoured::MemoryTypeUnbound => f.write_str(
                "memory-type: memory binding is off for this container (memory-binding: false); mems not set",
            ),
            Unhonoured::ReservedCpus(ReservedRefusal::NotAllowed) => f.write_str(
                "reserved-cpus: this Pod's namespace may not use the reserved CPUs and the policy \
                 does not honour the annotation; placed on the pools",
            ),
            Unhonoured::ReservedCpus(ReservedRefusal::NoneReserved) => f.write_str(
                "reserved-cpus: this node has no reserved CPUs; placed on the pools",
            ),
        }
    }
}

/// Why a placement went where it did (for logs and events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// topology-aware: the container fits this level.
    Fits(Level),
    /// topology-aware: exclusive CPUs taken from a pool at this level.
    Exclusive(Level),
    /// topology-aware: nothing fits below the root; the root is the last resort.
    Fallback,
    /// numa-aware: this many NUMA nodes hold the container's size.
    NumaNodes(usize),
    /// A `kube-system` Pod: the whole machine.
    KubeSystem,
    /// A BestEffort container: the machine's shared CPUs (not confined).
    BestEffort,
    /// A forced level (annotation) that had no pool that fits: the root instead.
    ForcedLevelUnavailable(Level),
    /// `numa-policy: exclusive`: a whole NUMA node, free of other containers.
    ExclusiveNuma,
    /// A system daemon (its namespace listed, or asked by annotation): the reserved CPUs.
    Reserved,
    /// The container uses DRA claims of this node's CPUs: their CPUs.
    Claimed,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Fits(l) => write!(f, "fits one {l}"),
            Reason::Exclusive(l) => write!(f, "exclusive CPUs in one {l}"),
            Reason::Fallback => f.write_str("fits no single pool below the root; using the root"),
            Reason::NumaNodes(1) => f.write_str("fits one NUMA node"),
            Reason::NumaNodes(n) => write!(f, "spans the {n} nearest NUMA nodes"),
            Reason::KubeSystem => f.write_str("kube-system Pod: all shared CPUs"),
            Reason::BestEffort => f.write_str("BestEffort: all shared CPUs"),
            Reason::ForcedLevelUnavailable(l) => {
                write!(f, "no {l} pool fits the requested level; using the root")
            }
            Reason::ExclusiveNuma => f.write_str("numa-policy exclusive: a whole NUMA node"),
            Reason::Reserved => f.write_str("system daemon: the reserved CPUs"),
            Reason::Claimed => f.write_str("DRA claim: the claim's CPUs"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub cpus: CpuSet,
    pub mems: Option<NodeSet>,
    pub pool: PoolId,
    pub exclusive: bool,
    pub reason: Reason,
    /// Cpuset changes of other containers this decision causes.
    pub updates: CpusetUpdates,
    /// A per-Pod control this placement could not honour.
    pub unhonoured: Option<Unhonoured>,
}

// Returned by value on the container start path: boxing the placement would allocate.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Placed(Placement),
    Skipped(SkipReason),
}

/// Load on one pool: requests charged to it and everything below it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolLoad {
    pub request_milli: u64,
    pub limit_milli: u64,
    pub memory_bytes: u64,
    /// Containers charged to this pool itself (not its children).
    pub containers: u32,
    /// Shared (non-exclusive) containers charged to this pool itself.
    pub shared_containers: u32,
    /// Exclusive CPUs of the grants charged to this pool and everything below it.
    pub exclusive_cpus: u32,
    /// Exclusive CPUs inside this pool, whoever holds them (kept up to date when CPUs are
    /// taken or returned, so decisions read it without set arithmetic).
    pub taken_cpus: u32,
}

/// Per-pool figures for status reporting.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PoolStatus {
    pub name: String,
    pub level: Level,
    pub cpus: String,
    pub capacity_milli: u64,
    pub request_milli: u64,
    pub limit_milli: u64,
    pub exclusive_cpus: String,
    pub shared_cpus: String,
    /// CPUs of the pool booked by DRA claims.
    pub claimed_cpus: String,
    pub containers: u32,
}

/// Per-NUMA node load (requests split evenly over the nodes a grant spans).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeLoad {
    pub request_milli: u64,
    pub limit_milli: u64,
    /// Shared numa-aware grants spanning this node (topology-aware spans are pools, guarded
    /// by the pool's own count).
    pub shared: u32,
}

/// Outcome of a restore: what was adopted and how.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Grants adopted exactly from their grant record.
    pub from_record: usize,
    /// Grants inferred from the container's cpuset (no record, or a record that did not fit).
    pub inferred: usize,
    /// Containers left unmanaged (no cpuset, opted out).
    pub unmanaged: usize,
    /// Containers whose cpuset must change to match the restored state.
    pub updates: Vec<CpusetUpdate>,
}

/// An existing container reported by the runtime at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Existing {
    pub request: ContainerRequest,
    pub cpus: Option<CpuSet>,
    pub mems: Option<NodeSet>,
    pub record: Option<String>,
}

/// A policy's decision, before it is committed to the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The kind of grant: a pool's span (`TopologyAware`) or a union of NUMA nodes
    /// (`NumaAware`). The engine reads it for records, restore and node accounting.
    pub policy: PolicyKind,
    pub pool: PoolId,
    pub nodes: NodeSet,
    pub span: CpuSet,
    pub exclusive: CpuSet,
    pub mems: Option<NodeSet>,
    pub charge_memory: bool,
    pub reason: Reason,
    /// A per-Pod control this choice could not honour.
    pub unhonoured: Option<Unhonoured>,
    /// Where the CPUs come from: the pools, the reserved CPUs or the request's DRA claims
    /// (`span`, charged nowhere).
    pub site: Site,
}

/// Where a grant's CPUs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Site {
    /// The pools: shared CPUs of the span, or exclusive ones (every grant but the below).
    #[default]
    Pools,
    /// The reserved CPUs (its span), shared by the system daemons placed there; charged to
    /// no pool or NUMA node, never changed by exclusive grants.
    Reserved,
    /// The CPUs of the container's DRA claims (its span; [`crate::claim`]): charged nowhere,
    /// out of the usable set while the claims are booked.
    Claim,
}

/// The maps on the placement path hash container ids with foldhash's fixed-seed hasher: a
/// few instructions per id instead of SipHash's dozens, and the same order on every run (the
/// engine is deterministic). Ids come from the runtime, not from users, so a hasher resistant
/// to chosen keys buys nothing here.
pub type IdHasher = foldhash::fast::FixedState;
