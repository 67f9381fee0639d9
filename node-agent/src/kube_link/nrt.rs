//! The node's `NodeResourceTopology` (`topology.node.k8s.io/v1alpha2`, the object the
//! scheduler-plugins `NodeResourceTopologyMatch` plugin reads): one zone per NUMA node, named
//! `node-<id>`, type `Node`, with its distances as costs and `cpu` / `memory` resources:
//!
//! - `capacity`: the node's CPUs / memory;
//! - `allocatable`: CPUs any container may use (reserved and isolated CPUs out) / memory;
//! - `available`: allocatable minus the CPU requests the engine charged to the node (exclusive
//!   CPUs included) / minus the memory limits charged to its NUMA pool (memory topology on;
//!   without it the engine does not place memory and reports it all available).
//!
//! Besides: the extended resources the kubelet's device plugins advertise with NUMA topology
//! (`nvidia.com/gpu`, ...: allocatable and available counts from the pod-resources API), the
//! node's hugepages (`hugepages-2Mi`, `hugepages-1Gi`: the pool from sysfs, available the pool
//! less what booked containers hold by their limits, within the free pages), the pod
//! set's fingerprint ([`super::fingerprint`]), the NUMA placement of the pinned containers
//! ([`super::placement`]) and attributes saying what the agent enforces.
//!
//! Pure: built from an engine snapshot and [`Extras`]; [`super`] writes it (server-side apply).

use super::{fingerprint, numaplacement, placement};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use tap_engine::topology::Level;
use tap_engine::Engine;

pub const GROUP: &str = "topology.node.k8s.io";
pub const VERSION: &str = "v1alpha2";
pub const KIND: &str = "NodeResourceTopology";
pub const PLURAL: &str = "noderesourcetopologies";

/// What the object advertises besides the zones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advertised {
    /// `topologyManagerPolicy` (e.g. `single-numa-node`).
    pub policy: String,
    /// Where the hugepages of the NUMA nodes are read (`--sysfs-root`).
    pub sysfs_root: std::path::PathBuf,
    /// Which pods the fingerprint covers (its method attribute).
    pub method: super::node_pods::FingerprintMethod,
    /// Which pods the scheduler's cache sees.
    pub informer: super::node_pods::PodInformer,
    /// Whether the object carries a pod fingerprint.
    pub fingerprint: Fingerprint,
}

/// Whether the NodeResourceTopology carries a pod fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fingerprint {
    /// The agent books the runtime's containers: the zones account for the node's pods.
    Published,
    /// No runtime (`kunpeng-tap-kube-link`, simulated nodes): the zones account for no pod,
    /// so no fingerprint may say they do.
    Omitted,
}

/// What the object shows besides the engine's state, read at the edges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extras {
    /// The pods the scheduler plugin counts on this node ([`super::node_pods`]; `None`:
    /// unknown yet, no fingerprint).
    pub pods: Option<Vec<(String, String)>>,
    /// Device-plugin resources per NUMA node.
    pub devices: Vec<crate::pod_resources::ZoneDevices>,
    /// Hugepages per NUMA node and size.
    pub hugepages: Vec<Hugepages>,
    /// The pods the scheduler plugin's cache holds on this node, for the NUMA placement of
    /// their pinned containers (`None`: unknown yet, or no runtime: no placement published).
    pub seen_pods: Option<Vec<super::node_pods::PodFacts>>,
    /// The placement inputs of the containers the agent books.
    pub booked: Vec<crate::agent::ContainerInfo>,
}

/// The hugepages of one size on one NUMA node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hugepages {
    pub node: u32,
    pub size_kb: u64,
    pub total: u64,
    pub free: u64,
}

impl Hugepages {
    /// The resource name the kubelet uses (`hugepages-2Mi`, `hugepages-1Gi`).
    pub fn resource(&self) -> String {
        let kb = self.size_kb;
        if kb >= 1 << 20 && kb.is_multiple_of(1 << 20) {
            format!("hugepages-{}Gi", kb >> 20)
        } else if kb >= 1 << 10 && kb.is_multiple_of(1 << 10) {
            format!("hugepages-{}Mi", kb >> 10)
        } else {
            format!("hugepages-{kb}Ki")
        }
    }

    fn bytes(&self, pages: u64) -> String {
        pages
            .saturating_mul(self.size_kb)
            .saturating_mul(1024)
            .to_string()
    }
}

/// A CPU quantity in milli-CPUs as Kubernetes writes it: whole CPUs without a suffix.
fn cpu_quantity(milli: u64) -> String {
    if milli.is_multiple_of(1000) {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

/// The NodeResourceTopology object of `node` for this engine state.
pub fn resource_topology(engine: &Engine, node: &str, adv: &Advertised, extras: &Extras) -> Value {
    let topo = engine.topology();
    let usable = engine.usable();
    let loads = engine.node_load();
    let held = super::hugepages::held(engine, &extras.booked);
    let mut zones: Vec<Value> = topo
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mut resources = Vec::new();
            if !n.cpus.is_empty() {
                let allocatable = n.cpus.intersection(usable).len() as u64;
                let requested = loads.get(i).map_or(0, |l| l.request_milli);
                let available = allocatable.saturating_mul(1000).saturating_sub(requested);
                resources.push(json!({
                    "name": "cpu",
                    "capacity": cpu_quantity((n.cpus.len() as u64).saturating_mul(1000)),
                    "allocatable": cpu_quantity(allocatable.saturating_mul(1000)),
                    "available": cpu_quantity(available),
                }));
            }
            if n.memory_bytes > 0 {
                let charged = topo
                    .pools
                    .iter()
                    .find(|p| {
                        p.level == Level::Numa
                            && p.numa_nodes.len() == 1
                            && p.numa_nodes.contains(n.id as usize)
                    })
                    .map_or(0, |p| engine.pool_load(p.id).memory_bytes);
                resources.push(json!({
                    "name": "memory",
                    "capacity": n.memory_bytes.to_string(),
                    "allocatable": n.memory_bytes.to_string(),
                    "available": n.memory_bytes.saturating_sub(charged).to_string(),
                }));
            }
            resources.extend(zone_extras(n.id, extras, &held));
            let costs: Vec<Value> = n
                .distances
                .iter()
                .map(|(to, d)| json!({"name": format!("node-{to}"), "value": d}))
                .collect();
            json!({
                "name": format!("node-{}", n.id),
                "type": "Node",
                "costs": costs,
                "resources": resources,
            })
        })
        .collect();
    let mut attributes = attributes(engine, adv, extras);
    if let Ok(p) = placement(engine, extras, &zones) {
        add_placement(&p, &mut attributes, &mut zones);
    }
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": KIND,
        "metadata": {
            "name": node,
            "labels": {"app.kubernetes.io/managed-by": "kunpeng-tap"},
        },
        "attributes": attributes,
        "zones": zones,
    })
}

/// Writes a placement into the object's attributes and its zones'.
fn add_placement(p: &numaplacement::Payload, attributes: &mut Vec<Value>, zones: &mut [Value]) {
    attributes.push(json!({"name": numaplacement::METADATA_ATTRIBUTE, "value": p.metadata()}));
    for zone in zones {
        let id = zone["name"]
            .as_str()
            .and_then(|n| n.strip_prefix("node-"))
            .and_then(|n| n.parse::<u32>().ok());
        if let Some(v) = id.and_then(|id| p.vectors.get(&id)) {
            zone["attributes"] = json!([{"name": numaplacement::VECTOR_ATTRIBUTE, "value": v}]);
        }
    }
}

/// The NUMA placement of the node's pinned containers, judged against the resource names the
/// `zones` carry (the plugin's own test for devices).
pub fn placement(
    engine: &Engine,
    extras: &Extras,
    zones: &[Value],
) -> Result<numaplacement::Payload, placement::Unplaced> {
    let resources: BTreeSet<String> = zones
        .iter()
        .filter_map(|z| z["resources"].as_array())
        .flatten()
        .filter_map(|r| r["name"].as_str().map(str::to_string))
        .collect();
    placement::payload(
        engine,
        extras.seen_pods.as_deref(),
        &extras.booked,
        &resources,
    )
}

/// Device-plugin resources and hugepages of NUMA node `id`; `held`: the hugepages the booked
/// containers hold there ([`super::hugepages::available`]).
fn zone_extras(id: u32, extras: &Extras, held: &super::hugepages::Held) -> Vec<Value> {
    let devices = extras.devices.iter().filter(|d| d.node == id).map(|d| {
        json!({
            "name": d.resource,
            "capacity": d.allocatable.to_string(),
            "allocatable": d.allocatable.to_string(),
            "available": d.allocatable.saturating_sub(d.allocated).to_string(),
        })
    });
    let pages = extras
        .hugepages
        .iter()
        .filter(|h| h.node == id && h.total > 0)
        .map(|h| {
            let held = held.get(&(h.node, h.size_kb)).copied().unwrap_or(0);
            json!({
                "name": h.resource(),
                "capacity": h.bytes(h.total),
                "allocatable": h.bytes(h.total),
                "available": h.bytes(super::hugepages::available(h.total, h.free, held)),
            })
        });
    devices.chain(pages).collect()
}

/// The topology manager's attributes the scheduler plugin reads, the pod fingerprint, and what
/// the agent enforces (`tap.kunpeng.huawei.com/*`).
fn attributes(engine: &Engine, adv: &Advertised, extras: &Extras) -> Vec<Value> {
    let cfg = engine.config();
    let exclusive = if cfg.exclusive_cpus {
        cfg.exclusive_cores.as_str()
    } else {
        "off"
    };
    let mut out = vec![
        json!({"name": "topologyManagerPolicy", "value": adv.policy}),
        json!({"name": "topologyManagerScope", "value": "container"}),
    ];
    if let Some(pods) = &extras.pods {
        let sign = fingerprint::sign(pods.iter().map(|(ns, n)| (ns.as_str(), n.as_str())));
        out.push(json!({"name": fingerprint::ATTRIBUTE, "value": sign}));
        out.push(json!({"name": fingerprint::METHOD_ATTRIBUTE, "value": adv.method.as_str()}));
    }
    for (name, value) in [
        ("policy", cfg.policy.as_str().to_string()),
        ("memory-binding", cfg.memory_topology.to_string()),
        ("exclusive-cpus", exclusive.to_string()),
        ("reserved-cpus", cfg.reserved.to_string()),
    ] {
        out.push(json!({"name": format!("tap.kunpeng.huawei.com/{name}"), "value": value}));
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;
    use tap_engine::{ContainerRequest, EngineConfig, Outcome, Qos, Topology};

    fn engine(memory_topology: bool) -> Engine {
        let raw =
            tap_engine::testdata::discover_fixture("synthetic-2s-4numa-96c-gpu").expect("fixture");
        let topo = Arc::new(Topology::build(&raw).expect("topology"));
        Engine::new(
            topo,
            EngineConfig {
                memory_topology,
                reserved: tap_engine::CpuSet::parse("0").expect("cpus"),
                ..Default::default()
            },
        )
    }

    /// The entry of `obj[list]` whose `name` is `name`.
    fn named<'a>(obj: &'a Value, list: &str, name: &str) -> &'a Value {
        obj[list]
            .as_array()
            .and_then(|l| l.iter().find(|e| e["name"] == name))
            .unwrap_or_else(|| panic!("no {name} in the {list} of {obj}"))
    }

    fn zone<'a>(obj: &'a Value, name: &str) -> &'a Value {
        named(obj, "zones", name)
    }

    /// What the tests' objects advertise: `single-numa-node`, the default pod set and method,
    /// a fingerprint.
    pub(crate) fn advertised() -> Advertised {
        Advertised {
            policy: "single-numa-node".into(),
            sysfs_root: std::path::PathBuf::new(),
            method: Default::default(),
            informer: Default::default(),
            fingerprint: Fingerprint::Published,
        }
    }

    fn resource<'a>(zone: &'a Value, name: &str) -> &'a Value {
        named(zone, "resources", name)
    }

    #[test]
    fn zones_follow_the_allocations() {
        let mut e = engine(true);
        let adv = advertised();
        let before = resource_topology(&e, "n1", &adv, &Extras::default());
        let zones = before["zones"].as_array().expect("zones");
        assert_eq!(zones.len(), e.topology().nodes.len());
        // CPU 0 is reserved: node 0 has one CPU fewer allocatable than its capacity.
        let n0 = e.topology().nodes[0].cpus.len();
        let cpu0 = resource(zone(&before, "node-0"), "cpu");
        assert_eq!(cpu0["capacity"], n0.to_string());
        assert_eq!(cpu0["allocatable"], (n0 - 1).to_string());
        assert_eq!(cpu0["available"], (n0 - 1).to_string());
        assert_eq!(before["attributes"][0]["value"], "single-numa-node");

        let req = ContainerRequest {
            id: "a".into(),
            namespace: "default".into(),
            qos: Some(Qos::Burstable),
            cpu_request_milli: 2500,
            cpu_limit_milli: Some(4000),
            memory_limit_bytes: Some(1 << 30),
            ..Default::default()
        };
        let Outcome::Placed(p) = e.create(&req) else {
            panic!("not placed")
        };
        let node = e
            .topology()
            .nodes_of(&p.cpus)
            .iter()
            .next()
            .expect("a node");
        let after = resource_topology(&e, "n1", &adv, &Extras::default());
        let z = zone(&after, &format!("node-{node}"));
        let cpu = resource(z, "cpu");
        let alloc: u64 = cpu["allocatable"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("int");
        assert_eq!(cpu["available"], format!("{}m", alloc * 1000 - 2500));
        let mem = resource(z, "memory");
        let cap: u64 = mem["capacity"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("int");
        assert_eq!(mem["available"], (cap - (1 << 30)).to_string());
        // Removing the container gives it all back.
        let _ = e.remove("a");
        assert_eq!(
            resource_topology(&e, "n1", &adv, &Extras::default()),
            before
        );
    }

    fn attribute<'a>(obj: &'a Value, name: &str) -> &'a Value {
        &named(obj, "attributes", name)["value"]
    }

    /// Devices, hugepages, the pod fingerprint and what the agent enforces are published.
    #[test]
    fn extras_reach_the_zones_and_attributes() {
        let e = engine(true);
        let adv = advertised();
        let extras = Extras {
            pods: Some(vec![
                ("default".into(), "a".into()),
                ("kube-system".into(), "b".into()),
            ]),
            devices: vec![crate::pod_resources::ZoneDevices {
                node: 2,
                resource: "example.com/accel".into(),
                allocatable: 4,
                allocated: 1,
            }],
            hugepages: vec![Hugepages {
                node: 1,
                size_kb: 2048,
                total: 512,
                free: 500,
            }],
            ..Default::default()
        };
        let obj = resource_topology(&e, "n1", &adv, &extras);
        let accel = resource(zone(&obj, "node-2"), "example.com/accel");
        assert_eq!(
            (&accel["allocatable"], &accel["available"]),
            (&json!("4"), &json!("3"))
        );
        let pages = resource(zone(&obj, "node-1"), "hugepages-2Mi");
        assert_eq!(pages["capacity"], (512u64 << 21).to_string());
        assert_eq!(pages["available"], (500u64 << 21).to_string());
        let sign = fingerprint::sign([("kube-system", "b"), ("default", "a")]);
        assert_eq!(attribute(&obj, "nodeTopologyPodsFingerprint"), &json!(sign));
        assert_eq!(attribute(&obj, "nodeTopologyPodsFingerprintMethod"), "all");
        let excl = Advertised {
            method: super::super::node_pods::FingerprintMethod::WithExclusiveResources,
            ..adv.clone()
        };
        let obj_excl = resource_topology(&e, "n1", &excl, &extras);
        assert_eq!(
            attribute(&obj_excl, "nodeTopologyPodsFingerprintMethod"),
            "with-exclusive-resources"
        );
        for (name, value) in [
            ("policy", "topology-aware"),
            ("memory-binding", "true"),
            ("exclusive-cpus", "whole"),
            ("reserved-cpus", "0"),
        ] {
            let name = format!("tap.kunpeng.huawei.com/{name}");
            assert_eq!(attribute(&obj, &name), value, "{name}");
        }
        // Without a pod list (no runtime mode): no fingerprint rather than a wrong one.
        let none = resource_topology(&e, "n1", &adv, &Extras::default());
        let names: Vec<&Value> = none["attributes"]
            .as_array()
            .expect("a")
            .iter()
            .map(|a| &a["name"])
            .collect();
        assert!(
            !names.contains(&&json!("nodeTopologyPodsFingerprint")),
            "{names:?}"
        );
    }

    /// Hugepages the booked containers hold by their limits are not promised, on each node
    /// their pages may come from: a container on one node, one on two nodes whose limit is
    /// larger than either node's pool.
    #[test]
    fn hugepages_held_by_booked_containers_are_not_available() {
        let mut e = engine(true);
        let adv = advertised();
        let mut booked = Vec::new();
        for (id, cpus, limits) in [
            ("one", 4000, vec![(2048, 100u64 << 21)]),
            ("two", 30_000, vec![(1 << 20, 3u64 << 30)]),
        ] {
            let req = ContainerRequest {
                id: id.into(),
                namespace: "default".into(),
                qos: Some(Qos::Guaranteed),
                cpu_request_milli: cpus,
                cpu_limit_milli: Some(cpus),
                memory_limit_bytes: Some(1 << 30),
                ..Default::default()
            };
            assert!(matches!(e.create(&req), Outcome::Placed(_)), "{id}");
            booked.push(crate::agent::ContainerInfo {
                id: id.into(),
                hugepage_limits: limits
                    .into_iter()
                    .map(|(size_kb, bytes)| crate::agent::HugepageLimit { size_kb, bytes })
                    .collect(),
                ..Default::default()
            });
        }
        let nodes = |id: &str| {
            let g = e.grant(id).expect("grant");
            g.mems.unwrap_or_else(|| e.topology().nodes_of(&g.cpus))
        };
        let one = nodes("one").single().expect("one node") as u32;
        let two = nodes("two");
        assert_eq!(two.len(), 2, "two nodes: {two}");
        let pages = |node, size_kb, total, free| Hugepages {
            node,
            size_kb,
            total,
            free,
        };
        let mut hugepages: Vec<Hugepages> = (0..4).map(|n| pages(n, 2048, 512, 500)).collect();
        hugepages.extend((0..4).map(|n| pages(n, 1 << 20, 2, 2)));
        let extras = Extras {
            hugepages,
            booked,
            ..Default::default()
        };
        let obj = resource_topology(&e, "n1", &adv, &extras);
        for n in 0..4u32 {
            let z = zone(&obj, &format!("node-{n}"));
            let small = resource(z, "hugepages-2Mi");
            let big = resource(z, "hugepages-1Gi");
            assert_eq!(small["capacity"], (512u64 << 21).to_string());
            assert_eq!(small["allocatable"], (512u64 << 21).to_string());
            // 512 pages less the 100 held, within the 500 free; elsewhere the free ones.
            let want_small: u64 = if n == one { 412 } else { 500 };
            assert_eq!(
                small["available"],
                (want_small << 21).to_string(),
                "node {n}"
            );
            // Three 1Gi pages held where the pool has two: none left on both its nodes.
            let want_big: u64 = if two.contains(n as usize) { 0 } else { 2 };
            assert_eq!(big["available"], (want_big << 30).to_string(), "node {n}");
            assert_eq!(big["capacity"], (2u64 << 30).to_string());
        }
    }

    #[test]
    fn quantities_are_kubernetes_quantities() {
        assert_eq!(cpu_quantity(0), "0");
        assert_eq!(cpu_quantity(48_000), "48");
        assert_eq!(cpu_quantity(45_500), "45500m");
    }
}
