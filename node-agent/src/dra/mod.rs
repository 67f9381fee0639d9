//! kunpeng-tap as a DRA driver for CPUs and memory (`dra.tap.kunpeng.io`): it publishes one
//! device per CPU group of the node ([`tap_engine::dra`]) in a ResourceSlice, so the
//! kube-scheduler can allocate a claim a NUMA-aligned share of CPUs and memory next to the
//! devices of other drivers (`matchAttribute: resource.kubernetes.io/numaNode`); the kubelet
//! asks it to prepare the claim, and the engine books that many CPUs of the group
//! ([`tap_engine::claim`]). Containers that use the claim get those CPUs and the group's
//! memory nodes when they are created; shared containers keep topology-aware placement on the
//! rest.
//!
//! - [`ask`]: a ResourceClaim read from the API server, checked and turned into a booking.
//! - [`cdi`]: what a container learns of its claim (a CDI device per claim).
//! - [`checkpoint`]: the booked claims on disk, read back before the containers at start.
//! - [`slice`]: the node's ResourceSlice, written only when it changes.
//! - [`driver`]: the kubelet's prepare and unprepare calls.
//! - [`source`]: where prepare reads a claim (the API server).
//! - [`run`]: the claims read back at start, the kubelet plugin and the publisher.

pub mod ask;
pub mod cdi;
pub mod checkpoint;
pub mod driver;
pub mod run;
pub mod slice;
pub mod source;

use tap_engine::claim::{ClaimError, ClaimKey};

/// The driver's name: the project's API group under `dra.`.
pub const DRIVER: &str = "dra.tap.kunpeng.io";

/// Why a claim was not prepared. The kubelet gets the message and retries; nothing is booked.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(
        "claim {key}: the API server has uid {have}, the kubelet asked for {want} (a stale claim)"
    )]
    Stale {
        key: ClaimKey,
        want: String,
        have: String,
    },
    #[error("claim {key} is not allocated")]
    NotAllocated { key: ClaimKey },
    #[error("claim {key} has no device of driver {DRIVER}")]
    NoDeviceOfOurs { key: ClaimKey },
    #[error("device {device} of pool {pool} is not a CPU group of this node")]
    DeviceNotOurs { pool: String, device: String },
    #[error("device {device}: consumed {name} {value:?} is not a quantity")]
    BadCapacity {
        device: String,
        name: String,
        value: String,
    },
    #[error("reading the claim from the API server: {0}")]
    Api(#[source] kube::Error),
    #[error("the API server is not configured (no kube link): claims cannot be read")]
    NoApiServer,
    #[error(transparent)]
    Engine(#[from] ClaimError),
    #[error("the placement engine failed (a panic, logged)")]
    EngineFailed,
    #[error("saving the claims checkpoint: {0}")]
    Checkpoint(#[source] crate::ledger::state_file::StateFileError),
    #[error(transparent)]
    Cdi(#[from] cdi::CdiError),
}
