use super::proto::*;
use super::*;

fn dev(resource: &str, ids: &[&str], nodes: &[i64]) -> ContainerDevices {
    ContainerDevices {
        resource_name: resource.into(),
        device_ids: ids.iter().map(|s| s.to_string()).collect(),
        topology: (!nodes.is_empty()).then(|| TopologyInfo {
            nodes: nodes.iter().map(|&id| NumaNode { id }).collect(),
        }),
    }
}

fn pod() -> PodResources {
    PodResources {
        name: "p".into(),
        namespace: "ns".into(),
        containers: vec![
            ContainerResources {
                name: "side".into(),
                devices: vec![dev("example.com/nic", &["nic-0"], &[0])],
                dynamic_resources: Vec::new(),
            },
            ContainerResources {
                name: "app".into(),
                devices: vec![
                    dev("example.com/accel", &["accel-2", "accel-3"], &[1]),
                    dev("example.com/other", &["x"], &[]),
                    // A negative id from outside is no node.
                    dev("example.com/odd", &["y"], &[-1, 3]),
                ],
                dynamic_resources: Vec::new(),
            },
        ],
    }
}

#[test]
fn devices_of_the_named_container_only_one_per_id() {
    let d = container_devices(&pod(), "app", &Default::default());
    let ids: Vec<&str> = d.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["accel-2", "accel-3", "x", "y"]);
    assert_eq!(d[0].numa_nodes, [1]);
    assert!(d[2].numa_nodes.is_empty());
    assert_eq!(d[3].numa_nodes, [3]);
    assert!(container_devices(&pod(), "missing", &Default::default()).is_empty());
}

#[test]
fn the_event_phrase_names_each_device_and_its_node() {
    let d = container_devices(&pod(), "app", &Default::default());
    assert_eq!(
        describe(&d[1..3]),
        "example.com/accel accel-3 (NUMA 1), example.com/other x (no NUMA node)"
    );
}

/// The hand-written messages decode what the kubelet's generated code encodes: the bytes
/// below are a `GetPodResourcesResponse` encoded field by field from the API's numbers.
#[test]
fn decodes_the_wire_format_of_the_api() {
    use prost::Message;
    let bytes = GetPodResourcesResponse {
        pod_resources: Some(pod()),
    }
    .encode_to_vec();
    // pod_resources (1) -> containers (3) -> devices (2) -> topology (3) -> nodes (1) -> ID (1)
    let back = GetPodResourcesResponse::decode(bytes.as_slice()).expect("decode");
    assert_eq!(back.pod_resources, Some(pod()));
    // A NUMANode{ID: 1}: field 1, varint, value 1.
    assert_eq!(NumaNode { id: 1 }.encode_to_vec(), [0x08, 0x01]);
    // ContainerDevices.resource_name is field 1 (length-delimited): tag 0x0a.
    assert_eq!(dev("r", &[], &[]).encode_to_vec(), [0x0a, 0x01, b'r']);
}

#[test]
fn zone_devices_count_allocatable_and_allocated_per_node() {
    let allocatable = vec![
        dev("example.com/accel", &["accel-2", "accel-3"], &[1]),
        dev("example.com/nic", &["nic-0"], &[0]),
        dev("example.com/wide", &["w"], &[0, 1]),
        dev("example.com/loose", &["l"], &[]),
    ];
    let z = count_zone_devices(&allocatable, &[pod()]);
    let row = |node: u32, r: &str| {
        z.iter()
            .find(|d| d.node == node && d.resource == r)
            .map(|d| (d.allocatable, d.allocated))
    };
    assert_eq!(row(1, "example.com/accel"), Some((2, 2)));
    assert_eq!(row(0, "example.com/nic"), Some((1, 1)));
    assert_eq!(row(0, "example.com/wide"), Some((1, 0)));
    assert_eq!(row(1, "example.com/wide"), Some((1, 0)));
    assert_eq!(z.len(), 4, "{z:?}");
}

/// A DRA claim's devices come after the device-plugin ones, each with the NUMA node its
/// ResourceSlice names (none where no slice of this node names it).
#[test]
fn claimed_dra_devices_take_their_numa_node_from_the_slices() {
    use super::dra::{DraDevice, DraTopology, SliceDevices};
    let mut p = pod();
    p.containers[1].dynamic_resources = vec![DynamicResource {
        claim_name: "accel".into(),
        claim_namespace: "ns".into(),
        claim_resources: vec![
            ClaimResource {
                driver_name: "accel.example.com".into(),
                pool_name: "node-a".into(),
                device_name: "accel-1".into(),
            },
            ClaimResource {
                driver_name: "accel.example.com".into(),
                pool_name: "node-a".into(),
                device_name: "unpublished".into(),
            },
        ],
    }];
    let dra = DraTopology::default();
    let accel = DraDevice {
        driver: "accel.example.com".into(),
        pool: "node-a".into(),
        device: "accel-1".into(),
    };
    dra.put(
        "slice",
        SliceDevices {
            generation: 1,
            devices: vec![(accel, Some(2))],
        },
    );
    let d = container_devices(&p, "app", &dra);
    let tail: Vec<String> = d[4..].iter().map(|d| d.to_string()).collect();
    assert_eq!(
        tail,
        [
            "accel.example.com node-a/accel-1 (NUMA 2)",
            "accel.example.com node-a/unpublished (no NUMA node)"
        ]
    );
    // As the kubelet sends it: field 5 of ContainerResources.
    let bytes = prost::Message::encode_to_vec(&p);
    let back: PodResources = prost::Message::decode(bytes.as_slice()).expect("decode");
    assert_eq!(back, p);
}
