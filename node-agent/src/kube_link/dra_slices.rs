//! This node's ResourceSlices (DRA), read for the NUMA node of each device other drivers
//! publish (`resource.kubernetes.io/numaNode`): a container holding a claim on such a device
//! is placed on its node, as one holding a device-plugin device is.

use super::node_watch::{self, NodeCopy};
use crate::pod_resources::dra::{
    numa_node_of, DraDevice, DraTopology, PcieRoots, SliceDevices, NUMA_NODE_ATTRIBUTE,
    PCIE_ROOT_ATTRIBUTE,
};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::ResourceExt;
use std::collections::HashMap;
use std::sync::Arc;

/// The devices of one slice and their NUMA nodes: the `numaNode` attribute, else the NUMA node
/// of the device's `pcieRoot` on this machine.
pub fn slice_devices(slice: &ResourceSlice, roots: &PcieRoots) -> SliceDevices {
    let spec = &slice.spec;
    let devices = spec.devices.iter().flatten().map(|d| {
        let attr = |name: &str| d.attributes.as_ref().and_then(|a| a.get(name));
        let numa = attr(NUMA_NODE_ATTRIBUTE)
            .and_then(|v| numa_node_of(v.int))
            .or_else(|| {
                attr(PCIE_ROOT_ATTRIBUTE)
                    .and_then(|v| v.string.as_deref())
                    .and_then(|r| roots.numa_node(r))
            });
        let dev = DraDevice {
            driver: spec.driver.clone(),
            pool: spec.pool.name.clone(),
            device: d.name.clone(),
        };
        (dev, numa)
    });
    SliceDevices {
        generation: spec.pool.generation,
        devices: devices.collect(),
    }
}

/// Keeps `dra` equal to the ResourceSlices of `node` until the stream ends. A cluster without
/// `resource.k8s.io/v1` (before Kubernetes 1.34) gives one warning, then quiet retries.
pub async fn watch(client: kube::Client, node: String, dra: Arc<DraTopology>) {
    let roots = dra.pcie_roots();
    node_watch::keep(client, &node, &Slices { dra, roots }).await
}

/// The devices of the node's ResourceSlices, by slice name.
struct Slices {
    dra: Arc<DraTopology>,
    roots: PcieRoots,
}

impl NodeCopy for Slices {
    type Object = ResourceSlice;
    type Kept = SliceDevices;
    const WATCH: &'static str = "ResourceSlice watch";
    const SERVES: &'static str = "DRA devices' NUMA nodes";
    const READ: &'static str = "ResourceSlices read";

    fn key(slice: &ResourceSlice) -> String {
        slice.name_any()
    }

    fn kept(&self, slice: &ResourceSlice) -> SliceDevices {
        slice_devices(slice, &self.roots)
    }

    fn replace(&self, listing: HashMap<String, SliceDevices>) {
        self.dra.replace(listing);
    }

    fn put(&self, key: String, kept: SliceDevices) {
        self.dra.put(&key, kept);
    }

    fn remove(&self, key: &str) {
        self.dra.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_gives_each_device_its_numa_node_attribute() {
        let slice: ResourceSlice = serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "node-a-example.com-x"},
            "spec": {
                "driver": "example.com",
                "nodeName": "node-a",
                "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "accel-0", "attributes": {
                        "resource.kubernetes.io/numaNode": {"int": 1},
                        "model": {"string": "x"}}},
                    {"name": "accel-1", "attributes": {
                        "resource.kubernetes.io/numaNode": {"string": "1"}}},
                    {"name": "accel-2", "attributes": {
                        "resource.kubernetes.io/numaNode": {"int": -3}}},
                    {"name": "accel-3"},
                    {"name": "nic-0", "attributes": {
                        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:3a"}}},
                    {"name": "nic-1", "attributes": {
                        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:99"}}},
                    {"name": "nic-2", "attributes": {
                        "resource.kubernetes.io/numaNode": {"int": 0},
                        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:3a"}}}
                ]
            }
        }))
        .expect("a slice");
        // This machine: root pci0000:3a on NUMA node 2 (its first function says so; a bridge
        // without a node and a non-function entry are passed over).
        let sys = tap_engine::source::MapSource::default()
            .with("devices/pci0000:3a/power/control", "auto\n")
            .with("devices/pci0000:3a/0000:3a:00.0/numa_node", "-1\n")
            .with("devices/pci0000:3a/0000:3a:02.0/numa_node", "2\n")
            .with("devices/pci0000:00/0000:00:00.0/numa_node", "0\n")
            .with("devices/system/node/node0/cpulist", "0-3\n");
        let roots = PcieRoots::read(&sys);
        assert_eq!(
            (roots.numa_node("pci0000:3a"), roots.numa_node("pci0000:00")),
            (Some(2), Some(0))
        );
        let got = slice_devices(&slice, &roots);
        let nodes: Vec<(&str, Option<u32>)> = got
            .devices
            .iter()
            .map(|(d, n)| (d.device.as_str(), *n))
            .collect();
        assert_eq!(
            nodes,
            [
                ("accel-0", Some(1)),
                ("accel-1", None),
                ("accel-2", None),
                ("accel-3", None),
                ("nic-0", Some(2)),
                ("nic-1", None),
                ("nic-2", Some(0))
            ]
        );
        assert!(got
            .devices
            .iter()
            .all(|(d, _)| d.driver == "example.com" && d.pool == "node-a"));
    }
}
