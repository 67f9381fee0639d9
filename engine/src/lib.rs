//! kunpeng-tap's placement engine.
//!
//! - [`cpuset`]: CPU / NUMA node sets in the kernel's list syntax.
//! - [`topology`]: the machine model and its pool tree.
//! - [`sysfs`]: discovery of the model from a sysfs tree (behind a small file trait).
//! - [`request`]: what is known about a container (QoS, CPU, memory, annotations).
//! - [`policy`]: `numa-aware` and `topology-aware`.
//! - [`engine`]: the allocation state and its operations (create, update, remove, restore).
//! - [`grant`]: one container's allocation and its record for restart recovery.
//! - [`testdata`]: where the sysfs fixtures are (tests, benches).

pub mod cpuset;
pub mod engine;
pub mod grant;
pub mod policy;
pub mod request;
pub mod sysfs;
pub mod testdata;
pub mod topology;

pub use cpuset::{CpuSet, NodeSet};
pub use engine::{
    CpusetUpdate, Engine, EngineConfig, Existing, Outcome, Placement, Reason, ResourcePriority,
    RestoreReport, SkipReason,
};
pub use request::{ContainerRequest, Overrides, PolicyKind, Qos};
pub use topology::{Level, Pool, PoolId, RawTopology, Topology};
