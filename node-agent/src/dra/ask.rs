//! A ResourceClaim as the API server holds it, turned into what the engine books: the results
//! of its allocation that name this driver and this node's pool, each with the CPUs and memory
//! it consumes. Pure: the driver reads the claim, this checks it.

use super::{PrepareError, DRIVER};
use crate::kube_link::node_pods::quantity_milli;
use crate::kubelet_plugin::ClaimRef;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tap_engine::claim::{ClaimAsk, ClaimKey, PartAsk};
use tap_engine::Topology;

/// The capacity names of this driver's devices.
pub const CPU: &str = "cpu";
pub const MEMORY: &str = "memory";

/// What `claim` asks of this node (`pool` is the node's name): one part per allocation result
/// of this driver. The claim must be the one the kubelet names (same uid), allocated, and name
/// only CPU groups this node has; a result of this driver in another pool is refused (the
/// scheduler allocated it another node's device).
pub fn ask_of(
    claim: &ResourceClaim,
    want: &ClaimRef,
    pool: &str,
    topo: &Topology,
) -> Result<ClaimAsk, PrepareError> {
    let key = ClaimKey {
        namespace: want.namespace.clone(),
        name: want.name.clone(),
    };
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    if uid != want.uid {
        return Err(PrepareError::Stale {
            key,
            want: want.uid.clone(),
            have: uid.to_string(),
        });
    }
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .ok_or_else(|| PrepareError::NotAllocated { key: key.clone() })?;
    let mut parts = Vec::new();
    for r in results.iter().filter(|r| r.driver == DRIVER) {
        parts.push(part_of(r, pool, topo)?);
    }
    if parts.is_empty() {
        return Err(PrepareError::NoDeviceOfOurs { key });
    }
    Ok(ClaimAsk {
        uid: want.uid.clone(),
        key,
        parts,
    })
}

/// One result's share: its consumed `cpu` (whole CPUs, rounded up) and `memory` (bytes), or
/// the whole group when the scheduler consumed no capacity (a device allocated whole).
fn part_of(
    r: &DeviceRequestAllocationResult,
    pool: &str,
    topo: &Topology,
) -> Result<PartAsk, PrepareError> {
    let foreign = || PrepareError::DeviceNotOurs {
        pool: r.pool.clone(),
        device: r.device.clone(),
    };
    if r.pool != pool {
        return Err(foreign());
    }
    let group = tap_engine::dra::pool_of(topo, &r.device).ok_or_else(foreign)?;
    let consumed = |name: &str| -> Result<Option<u128>, PrepareError> {
        let Some(q) = r.consumed_capacity.as_ref().and_then(|c| c.get(name)) else {
            return Ok(None);
        };
        quantity_milli(&q.0)
            .map(Some)
            .ok_or_else(|| PrepareError::BadCapacity {
                device: r.device.clone(),
                name: name.to_string(),
                value: q.0.clone(),
            })
    };
    let cpus = match consumed(CPU)? {
        Some(milli) => usize::try_from(milli.div_ceil(1000)).unwrap_or(usize::MAX),
        None => group.cpus.len(),
    };
    let memory_bytes = match consumed(MEMORY)? {
        Some(milli) => u64::try_from(milli.div_ceil(1000)).unwrap_or(u64::MAX),
        None => group.memory_bytes,
    };
    Ok(PartAsk {
        request: r.request.clone(),
        device: group.id,
        cpus,
        memory_bytes,
    })
}

/// A claim as the scheduler leaves it: `want`'s name and uid, one result of this driver on
/// `device` of `pool` for request `cpus`, consuming `consumed` (capacity name, quantity). What
/// [`ask_of`] reads; for tests and benches.
pub fn allocated(
    want: &ClaimRef,
    pool: &str,
    device: &str,
    consumed: &[(&str, &str)],
) -> ResourceClaim {
    let mut rc = ResourceClaim::default();
    rc.metadata.namespace = Some(want.namespace.clone());
    rc.metadata.name = Some(want.name.clone());
    rc.metadata.uid = Some(want.uid.clone());
    let consumed = consumed
        .iter()
        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
        .collect();
    let result = DeviceRequestAllocationResult {
        driver: DRIVER.into(),
        pool: pool.into(),
        device: device.into(),
        request: "cpus".into(),
        consumed_capacity: Some(consumed),
        ..Default::default()
    };
    rc.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(vec![result]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    rc
}

#[cfg(test)]
mod tests;
