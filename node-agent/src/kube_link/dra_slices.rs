//! This node's ResourceSlices (DRA), read for the NUMA node of each device other drivers
//! publish (`resource.kubernetes.io/numaNode`): a container holding a claim on such a device
//! is placed on its node, as one holding a device-plugin device is.

use crate::pod_resources::dra::{
    numa_node_of, DraDevice, DraTopology, SliceDevices, NUMA_NODE_ATTRIBUTE,
};
use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use std::collections::HashMap;
use std::sync::Arc;

/// The devices of one slice and their NUMA nodes.
pub fn slice_devices(slice: &ResourceSlice) -> SliceDevices {
    let spec = &slice.spec;
    let devices = spec.devices.iter().flatten().map(|d| {
        let numa = d
            .attributes
            .as_ref()
            .and_then(|a| a.get(NUMA_NODE_ATTRIBUTE))
            .and_then(|v| numa_node_of(v.int));
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
    let api: Api<ResourceSlice> = Api::all(client);
    let wc = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = std::pin::pin!(watcher(api, wc).default_backoff());
    let mut listing: HashMap<String, SliceDevices> = HashMap::new();
    let mut warned = false;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(s)) => {
                listing.insert(s.name_any(), slice_devices(&s));
            }
            Ok(watcher::Event::InitDone) => {
                dra.replace(std::mem::take(&mut listing));
                warned = false;
                tracing::debug!(node = %node, devices = dra.len(), "ResourceSlices read");
            }
            Ok(watcher::Event::Apply(s)) => dra.put(&s.name_any(), slice_devices(&s)),
            Ok(watcher::Event::Delete(s)) => dra.remove(&s.name_any()),
            Err(e) if !warned => {
                warned = true;
                tracing::warn!(node = %node, "ResourceSlice watch (DRA devices' NUMA nodes): {e}");
            }
            Err(e) => tracing::debug!(node = %node, "ResourceSlice watch: {e}"),
        }
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
                    {"name": "accel-3"}
                ]
            }
        }))
        .expect("a slice");
        let got = slice_devices(&slice);
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
                ("accel-3", None)
            ]
        );
        assert!(got
            .devices
            .iter()
            .all(|(d, _)| d.driver == "example.com" && d.pool == "node-a"));
    }
}
