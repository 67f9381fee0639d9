//! The node's ResourceSlice of this driver: one device per CPU group, each with consumable
//! capacity `cpu` (in steps of a whole core where exclusive CPUs are whole cores) and `memory`
//! (in MiB), shared by many claims (`allowMultipleAllocations`). It is written when what it
//! says changes (the topology, the device level, the reserved CPUs) and when it is missing
//! (the kubelet removes a driver's slices when the driver goes away), never per container or
//! claim: each pass reads it and compares a fingerprint of the devices kept in an annotation,
//! so an API server that rewrites quantities in its own form does not cause a write.

use super::ask::{CPU, MEMORY};
use super::DRIVER;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ObjectMeta, PostParams};
use std::collections::BTreeMap;
use tap_engine::dra::{AttrValue, DeviceSpec};

/// The annotation holding the fingerprint of the devices the agent wrote.
pub const FINGERPRINT: &str = "tap.kunpeng.io/devices-fingerprint";

/// Memory is offered in steps of this many bytes.
const MEMORY_STEP: u64 = 1 << 20;

/// The slice's name for `node`.
pub fn name(node: &str) -> String {
    format!("{node}-{DRIVER}")
}

/// The slice for `node` offering `devices`, in pool generation `generation`.
pub fn build(node: &str, devices: &[DeviceSpec], generation: i64) -> ResourceSlice {
    let mut annotations = BTreeMap::new();
    annotations.insert(FINGERPRINT.to_string(), fingerprint(devices));
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name(node)),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.to_string(),
            node_name: Some(node.to_string()),
            pool: ResourcePool {
                name: node.to_string(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(devices.iter().map(device).collect()),
            ..Default::default()
        },
    }
}

fn device(d: &DeviceSpec) -> Device {
    let step = Quantity(d.cpu_step.to_string());
    let cpu = DeviceCapacity {
        value: Quantity(d.cpus.to_string()),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(step.clone()),
            valid_range: Some(CapacityRequestPolicyRange {
                min: step.clone(),
                step: Some(step),
                max: None,
            }),
            valid_values: None,
        }),
    };
    let memory = DeviceCapacity {
        value: Quantity(d.memory_bytes.to_string()),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(Quantity("0".into())),
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity("0".into()),
                step: Some(Quantity(MEMORY_STEP.to_string())),
                max: None,
            }),
            valid_values: None,
        }),
    };
    Device {
        name: d.name.clone(),
        attributes: Some(
            d.attributes
                .iter()
                .map(|(k, v)| (k.clone(), attribute(v)))
                .collect(),
        ),
        capacity: Some(BTreeMap::from([
            (CPU.to_string(), cpu),
            (MEMORY.to_string(), memory),
        ])),
        allow_multiple_allocations: Some(true),
        ..Default::default()
    }
}

fn attribute(v: &AttrValue) -> DeviceAttribute {
    match v {
        AttrValue::Int(i) => DeviceAttribute {
            int: Some(*i),
            ..Default::default()
        },
        AttrValue::Bool(b) => DeviceAttribute {
            bool: Some(*b),
            ..Default::default()
        },
        AttrValue::Text(s) => DeviceAttribute {
            string: Some(s.clone()),
            ..Default::default()
        },
    }
}

/// The slice `node` publishes, as YAML (what `kubectl get resourceslice -o yaml` shows of
/// it, but for the fields the API server adds): for `--explain`.
pub fn yaml(node: &str, devices: &[DeviceSpec]) -> String {
    let mut slice = build(node, devices, 1);
    slice.metadata.annotations = None;
    let mut v = serde_json::to_value(&slice).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("apiVersion".into(), "resource.k8s.io/v1".into());
        o.insert("kind".into(), "ResourceSlice".into());
    }
    serde_yaml::to_string(&v).unwrap_or_default()
}

/// A stable fingerprint of what the devices say (xxhash64 of their description).
pub fn fingerprint(devices: &[DeviceSpec]) -> String {
    let text = format!("{devices:?}");
    format!("{:016x}", twox_hash::XxHash64::oneshot(0, text.as_bytes()))
}

/// What a publishing pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// The slice says what it should: nothing written.
    Unchanged,
    Created,
    Replaced,
}

/// Makes the node's slice offer `devices`: reads it, and writes it only when it is missing or
/// its fingerprint differs (a replacement bumps the pool's generation).
pub async fn publish(
    api: &Api<ResourceSlice>,
    node: &str,
    devices: &[DeviceSpec],
) -> Result<Published, kube::Error> {
    let want = fingerprint(devices);
    match api.get_opt(&name(node)).await? {
        None => {
            api.create(&PostParams::default(), &build(node, devices, 1))
                .await?;
            Ok(Published::Created)
        }
        Some(have) => {
            let same = have
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(FINGERPRINT))
                == Some(&want);
            if same && have.spec.driver == DRIVER && have.spec.node_name.as_deref() == Some(node) {
                return Ok(Published::Unchanged);
            }
            let generation = have.spec.pool.generation.saturating_add(1);
            let mut next = build(node, devices, generation);
            next.metadata.resource_version = have.metadata.resource_version.clone();
            api.replace(&name(node), &PostParams::default(), &next)
                .await?;
            Ok(Published::Replaced)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tap_engine::request::CoreGrain;
    use tap_engine::topology::Level;
    use tap_engine::Topology;

    #[test]
    fn the_slice_offers_each_numa_node_with_cpu_and_memory_capacity() {
        let raw = tap_engine::testdata::discover_fixture("synthetic-2s-2numa-smt-96t").unwrap();
        let topo = Topology::build(&raw).unwrap();
        let devs =
            tap_engine::dra::devices(&topo, &topo.online, Level::Numa, CoreGrain::WholeCores);
        let s = build("node-a", &devs, 3);
        assert_eq!(
            s.metadata.name.as_deref(),
            Some("node-a-dra.tap.kunpeng.io")
        );
        assert_eq!(
            (s.spec.pool.name.as_str(), s.spec.pool.generation),
            ("node-a", 3)
        );
        let json = serde_json::to_value(&s).unwrap();
        let d0 = &json["spec"]["devices"][0];
        assert_eq!(d0["name"], "numa0");
        assert_eq!(d0["allowMultipleAllocations"], true);
        assert_eq!(
            d0["attributes"]["resource.kubernetes.io/numaNode"]["int"],
            0
        );
        assert_eq!(d0["attributes"]["smt"]["bool"], true);
        assert_eq!(d0["capacity"]["cpu"]["value"], "48");
        assert_eq!(
            d0["capacity"]["cpu"]["requestPolicy"]["validRange"]["step"],
            "2"
        );
        assert_eq!(
            d0["capacity"]["memory"]["requestPolicy"]["validRange"]["step"],
            "1048576"
        );
        let same = fingerprint(&devs);
        let fewer = tap_engine::dra::devices(
            &topo,
            &topo
                .online
                .difference(&tap_engine::CpuSet::parse("0-1").unwrap()),
            Level::Numa,
            CoreGrain::WholeCores,
        );
        assert_eq!(same, fingerprint(&devs.clone()));
        assert_ne!(same, fingerprint(&fewer), "reserved CPUs change the slice");
    }
}
