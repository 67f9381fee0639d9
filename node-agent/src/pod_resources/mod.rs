//! Device hints from the kubelet's pod-resources API
//! (`/var/lib/kubelet/pod-resources/kubelet.sock`): the devices a device plugin allocated to a
//! container (GPUs, NPUs, NICs, any resource whose devices carry NUMA topology) and their NUMA
//! nodes, read when the container is created. The PCI-class path (`NVIDIA_VISIBLE_DEVICES`,
//! ...) stays for hosts without a kubelet; both feed the same device hint of the request.
//!
//! The lookup is on the start path: it runs under a short timeout and fails open (no hint,
//! the error logged and counted); a host without the socket costs one `stat`.

pub mod client;
pub mod dra;
pub mod proto;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// One device the kubelet allocated to a container, with the NUMA nodes its plugin reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeletDevice {
    /// The extended resource (`nvidia.com/gpu`, `example.com/accel`).
    pub resource: String,
    /// The plugin's device id.
    pub id: String,
    /// NUMA nodes of the device (empty: the plugin reported none).
    pub numa_nodes: Vec<u32>,
    /// The DRA claim the device was allocated through (`None`: a device plugin's device).
    pub claim: Option<tap_engine::claim::ClaimKey>,
}

impl fmt::Display for KubeletDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.resource, self.id)?;
        match self.numa_nodes.as_slice() {
            [] => write!(f, " (no NUMA node)"),
            nodes => {
                let list: Vec<String> = nodes.iter().map(u32::to_string).collect();
                write!(f, " (NUMA {})", list.join(","))
            }
        }
    }
}

/// Which container to look up.
#[derive(Debug, Clone, Copy)]
pub struct ContainerRef<'a> {
    pub namespace: &'a str,
    pub pod: &'a str,
    pub container: &'a str,
}

#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    /// No kubelet serves pod resources on this host (not an error to count).
    #[error("no pod-resources socket at {0}")]
    NoSocket(PathBuf),
    #[error("pod-resources {method}: {status}")]
    Call {
        method: &'static str,
        status: Box<tonic::Status>,
    },
    #[error("pod-resources: no answer within {0:?}")]
    Timeout(Duration),
    #[error("the kubelet's pod resources do not list pod {0}")]
    PodNotListed(String),
}

impl PodResourcesError {
    /// Whether the failure is worth a warning and a count (a host without the socket is not).
    pub fn is_failure(&self) -> bool {
        !matches!(self, PodResourcesError::NoSocket(_))
    }
}

/// Where the devices of a container come from (the kubelet; a fixed table in tests).
#[async_trait::async_trait]
pub trait DeviceSource: Send + Sync {
    async fn devices(&self, c: ContainerRef<'_>) -> Result<Vec<KubeletDevice>, PodResourcesError>;

    /// The node's device-plugin resources per NUMA node (the NodeResourceTopology's zones).
    async fn zone_devices(&self) -> Result<Vec<ZoneDevices>, PodResourcesError> {
        Ok(Vec::new())
    }
}

/// The devices of one extended resource on one NUMA node, as the kubelet counts them.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ZoneDevices {
    pub node: u32,
    pub resource: String,
    pub allocatable: u64,
    pub allocated: u64,
}

/// Counts the allocatable devices per (NUMA node, resource), and of those the ones allocated to
/// some container of `pods`. A device on several nodes counts on each; one without topology on
/// none.
pub fn count_zone_devices(
    allocatable: &[proto::ContainerDevices],
    pods: &[proto::PodResources],
) -> Vec<ZoneDevices> {
    use std::collections::{BTreeMap, HashSet};
    let allocated: HashSet<(&str, &str)> = pods
        .iter()
        .flat_map(|p| p.containers.iter())
        .flat_map(|c| c.devices.iter())
        .flat_map(|d| {
            d.device_ids
                .iter()
                .map(move |id| (d.resource_name.as_str(), id.as_str()))
        })
        .collect();
    let mut counts: BTreeMap<(u32, &str), (u64, u64)> = BTreeMap::new();
    for d in allocatable {
        let nodes = d.topology.iter().flat_map(|t| t.nodes.iter());
        for node in nodes.filter_map(|n| u32::try_from(n.id).ok()) {
            for id in &d.device_ids {
                let e = counts.entry((node, d.resource_name.as_str())).or_default();
                e.0 = e.0.saturating_add(1);
                if allocated.contains(&(d.resource_name.as_str(), id.as_str())) {
                    e.1 = e.1.saturating_add(1);
                }
            }
        }
    }
    counts
        .into_iter()
        .map(|((node, resource), (allocatable, allocated))| ZoneDevices {
            node,
            resource: resource.to_string(),
            allocatable,
            allocated,
        })
        .collect()
}

/// The devices of one container of a pod's resources, one entry per device id: device-plugin
/// devices with the NUMA nodes their plugin reported, then DRA devices (resource: the driver,
/// id: `<pool>/<device>`) with the NUMA node their ResourceSlice names in `dra`.
pub fn container_devices(
    pod: &proto::PodResources,
    container: &str,
    dra: &dra::DraTopology,
) -> Vec<KubeletDevice> {
    let Some(c) = pod.containers.iter().find(|c| c.name == container) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for d in &c.devices {
        let nodes: Vec<u32> = d
            .topology
            .iter()
            .flat_map(|t| t.nodes.iter())
            .filter_map(|n| u32::try_from(n.id).ok())
            .collect();
        for id in &d.device_ids {
            out.push(KubeletDevice {
                resource: d.resource_name.clone(),
                id: id.clone(),
                numa_nodes: nodes.clone(),
                claim: None,
            });
        }
    }
    let claimed = c.dynamic_resources.iter().flat_map(|r| {
        let key = tap_engine::claim::ClaimKey {
            namespace: r.claim_namespace.clone(),
            name: r.claim_name.clone(),
        };
        r.claim_resources.iter().map(move |res| (key.clone(), res))
    });
    out.extend(claimed.map(|(claim, r)| {
        let d = dra::DraDevice {
            driver: r.driver_name.clone(),
            pool: r.pool_name.clone(),
            device: r.device_name.clone(),
        };
        KubeletDevice {
            numa_nodes: dra.numa_node(&d).into_iter().collect(),
            id: format!("{}/{}", d.pool, d.device),
            resource: d.driver,
            claim: Some(claim),
        }
    }));
    out
}

/// The devices as one phrase for a Pod Event: `example.com/accel accel-1 (NUMA 1)`, ...
pub fn describe(devices: &[KubeletDevice]) -> String {
    let parts: Vec<String> = devices.iter().map(KubeletDevice::to_string).collect();
    parts.join(", ")
}

#[cfg(test)]
mod tests;
