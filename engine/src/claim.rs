//! CPUs and memory claimed through DRA (Dynamic Resource Allocation): the kube-scheduler
//! allocates a claim a share of one of the node's devices (a NUMA node, socket, die, cluster
//! or cache group: [`crate::dra`]); the engine picks that many CPUs of the group for the claim
//! alone, as it picks exclusive CPUs, and every container that uses the claim runs on them.
//! Claimed CPUs leave the usable set: shared containers move off them at once, and no other
//! grant takes them until the claim is released.

use crate::cpuset::CpuSet;
use crate::nodeset::NodeSet;
use crate::topology::PoolId;

/// A claim as the API server names it; the key containers use to find their claim.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimKey {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for ClaimKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What one allocated device of a claim asks for: `cpus` CPUs and `memory_bytes` of memory
/// of the group `device` (a pool of the topology).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartAsk {
    /// The claim's request the device was allocated for.
    pub request: String,
    pub device: PoolId,
    pub cpus: usize,
    pub memory_bytes: u64,
}

/// A claim to book: its identity and each allocated device's share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimAsk {
    pub uid: String,
    pub key: ClaimKey,
    pub parts: Vec<PartAsk>,
}

/// One allocated device's CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimPart {
    pub request: String,
    pub device: PoolId,
    pub cpus: CpuSet,
    pub memory_bytes: u64,
}

/// A booked claim: the CPUs picked for each of its devices, and the memory nodes its
/// containers are bound to (the DRAM of the CPUs' NUMA nodes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimGrant {
    pub uid: String,
    pub key: ClaimKey,
    pub parts: Vec<ClaimPart>,
    pub cpus: CpuSet,
    pub mems: NodeSet,
}

impl ClaimGrant {
    /// The memory claimed over all devices, bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.parts
            .iter()
            .fold(0u64, |sum, p| sum.saturating_add(p.memory_bytes))
    }
}

/// Why a claim cannot be booked. Nothing is booked then (all devices or none).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    #[error("the claim has no device of this node's driver")]
    NoDevice,
    #[error("device {device}: no such CPU group on this node")]
    NoSuchDevice { device: String },
    #[error(
        "device {device}: {asked} CPUs asked, 0 or more than the group's {usable} usable CPUs"
    )]
    BadSize {
        device: String,
        asked: usize,
        usable: usize,
    },
    #[error(
        "device {device}: {asked} CPUs cannot be taken as {grain} from its {free} free CPUs \
         (exclusive containers, other claims, or shared containers that need a CPU hold the rest)"
    )]
    NoRoom {
        device: String,
        asked: usize,
        free: usize,
        grain: &'static str,
    },
    #[error("claim {key} (uid {uid}) is already booked with other CPUs than asked now")]
    Conflict { key: ClaimKey, uid: String },
    #[error("claim {key}: CPUs {cpus} are not usable or are held by another grant or claim")]
    Taken {
        key: ClaimKey,
        /// In the kernel's list syntax.
        cpus: String,
    },
}
