//! kunpeng-tap's placement engine.
//!
//! - [`cpuset`], [`nodeset`]: CPU and NUMA node sets in the kernel's list syntax.
//! - [`cpu_model`]: which CPU this is (MIDR_EL1, `/proc/cpuinfo`), and the cluster affinity
//!   rule that depends on it.
//! - [`source`]: where sysfs files come from (a directory, or a dump file in memory).
//! - [`pci`]: PCI devices and what each is to placement (GPU, NPU, console display).
//! - [`raw`]: what discovery reads off a machine, before a model is built from it.
//! - [`topology`]: the machine model and its pool tree.
//! - [`devices`]: which PCI devices are GPUs or NPUs, and which one a container's device
//!   environment names.
//! - [`sysfs`]: discovery of the model from a sysfs tree (behind a small file trait).
//! - [`request`]: what is known about a container (QoS, CPU, memory, annotations).
//! - [`types`]: what the engine and the policies share (configuration, decisions, loads).
//! - [`state`]: the read-only view of the allocation state that policies decide from.
//! - [`policy`]: the [`Policy`] trait, `topology-aware` and `numa-aware`, and how to plug in
//!   another one.
//! - [`cpu_picker`]: the shared exclusive-CPU picker.
//! - [`claim`]: CPUs and memory claimed through DRA, picked like exclusive CPUs.
//! - [`dra`]: the devices this node offers DRA (a group of CPUs and its memory each).
//! - [`engine`]: the allocation state and its operations (create, update, remove, restore).
//! - [`rebalance`]: usage-aware rebalancing: which shared containers to move between NUMA
//!   nodes when their measured use is unbalanced ([`Engine::relocate`] moves one).
//! - [`usage_hint`]: measured usage per NUMA node that new shared containers may be placed by.
//! - [`grant`]: one container's allocation and its record for restart recovery.
//! - [`names`]: one name table per setting enum (parse, display, the "use a or b" message).
//! - [`testdata`]: where the sysfs fixtures are (tests, benches).

pub mod claim;
pub mod cpu_model;
pub mod cpu_picker;
pub mod cpuset;
pub mod devices;
pub mod dra;
pub mod engine;
pub(crate) mod fit;
pub mod grant;
pub(crate) mod grants;
pub mod names;
pub mod nodeset;
pub mod pci;
pub mod policy;
pub mod raw;
pub mod rebalance;
pub mod request;
pub mod source;
pub mod state;
pub mod sysfs;
pub mod testdata;
pub mod topology;
pub mod types;
pub mod updates;
pub mod usage_hint;

pub use cpu_model::{ClusterAffinityRule, CpuModel};
pub use cpuset::CpuSet;
pub use engine::Engine;
pub use nodeset::NodeSet;
pub use policy::{Choice, Policy, Settings};
pub use rebalance::{
    BalanceBy, CooldownWaiver, Move, MoveReason, PlaceBy, RebalanceConfig, Rebalancer,
    RelocateError, UsageHint, UsageSample,
};
pub use request::{ContainerRequest, CoreGrain, Overrides, PolicyKind, Qos};
pub use state::StateView;
pub use topology::{Level, MemoryKind, Pool, PoolId, RawTopology, Topology};
pub use types::{
    CacheAffinity, EngineConfig, Existing, Outcome, Placement, Reason, Rebalance, ReservedAccess,
    ReservedAnnotation, ReservedRefusal, ResourcePriority, RestoreReport, Site, SkipReason,
    Unhonoured,
};
pub use updates::{CpusetUpdate, CpusetUpdates, UpdateRef};
