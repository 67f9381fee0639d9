//! Which of the node's pinned containers sits on which NUMA node, for the `numaplacement`
//! attributes of the NodeResourceTopology ([`super::numaplacement`]).
//!
//! The scheduler plugin decodes them against the containers *it* counts as pinned on the node:
//! of the pods its cache holds (its informer's: [`PodFacts::seen`]), the sidecar init
//! containers and containers that request an extended resource the object's zones carry, or,
//! in a Guaranteed pod, whole CPUs, memory or hugepages ([`super::node_pods::ContainerFacts`]).
//! The count must be its own or it decodes nothing, so the set is taken from the API server's
//! pods, as the pod fingerprint is, and each container is looked up in the agent's books.
//!
//! A container's node is the one NUMA node of its exclusive resources as the plugin's
//! preemption hands them back: in a Guaranteed pod, its CPUs' nodes, its memory nodes (when
//! the agent binds memory) and its devices' nodes; in another pod only its devices count (the
//! plugin hands back nothing else), so it is its devices' node wherever its CPUs are.
//! The format has one node per container and neither "several" nor "unknown": when one
//! container's resources span several nodes ([`Affinity::Spread`], e.g. a Guaranteed
//! container wider than a node) or the agent has no grant or device for it
//! ([`Affinity::Unknown`]: skipped, not yet created, created before the agent), the object
//! carries no placement at all ([`Unplaced`]): the plugin then simulates no eviction on this
//! node, where any node it named would hand the resources back to a zone that may not hold
//! them.

use super::node_pods::PodFacts;
use super::numaplacement::{self, Payload};
use crate::agent::ContainerInfo;
use std::collections::{BTreeSet, HashMap};
use tap_engine::{Engine, NodeSet};

/// Where a pinned container's exclusive resources are, as far as the agent's books say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Affinity {
    /// All on one NUMA node.
    Node(u32),
    /// On several nodes: the format cannot say it.
    Spread(NodeSet),
    /// The agent holds no grant (or, outside a Guaranteed pod, no device) for it.
    Unknown,
}

/// Why the object carries no placement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unplaced {
    #[error("the node's pods are not listed yet")]
    PodsUnknown,
    #[error("container {0}: its exclusive resources span NUMA nodes {1}")]
    Spread(String, NodeSet),
    #[error("container {0}: the agent holds no placement of it")]
    Unknown(String),
    #[error(transparent)]
    Encode(#[from] numaplacement::EncodeError),
}

/// The NUMA nodes holding a booked container's exclusive resources.
fn exclusive_nodes(
    engine: &Engine,
    guaranteed: bool,
    info: &ContainerInfo,
    resources: &BTreeSet<String>,
) -> NodeSet {
    let devices = NodeSet::from_ids(
        info.kubelet_devices
            .iter()
            .filter(|d| resources.contains(&d.resource))
            .flat_map(|d| d.numa_nodes.iter().map(|n| *n as usize)),
    );
    if !guaranteed {
        return devices;
    }
    let Some(g) = engine.grant(&info.id) else {
        return NodeSet::new();
    };
    let mut nodes = engine.topology().nodes_of(&g.cpus).union(&devices);
    if let Some(m) = g.mems {
        nodes = nodes.union(&m);
    }
    nodes
}

/// A pinned container's node from the entries the agent books under its name (a restarted
/// container may have two).
pub fn affinity(
    engine: &Engine,
    guaranteed: bool,
    booked: &[&ContainerInfo],
    resources: &BTreeSet<String>,
) -> Affinity {
    let nodes = booked.iter().fold(NodeSet::new(), |acc, info| {
        acc.union(&exclusive_nodes(engine, guaranteed, info, resources))
    });
    match (nodes.single(), nodes.is_empty()) {
        (Some(n), _) => Affinity::Node(u32::try_from(n).unwrap_or(u32::MAX)),
        (None, true) => Affinity::Unknown,
        (None, false) => Affinity::Spread(nodes),
    }
}

/// The placement of every container the plugin counts as pinned on the node: `pods` the
/// pods its cache holds, `booked` the agent's containers, `resources` the names the zones
/// carry.
pub fn payload(
    engine: &Engine,
    pods: Option<&[PodFacts]>,
    booked: &[ContainerInfo],
    resources: &BTreeSet<String>,
) -> Result<Payload, Unplaced> {
    let pods = pods.ok_or(Unplaced::PodsUnknown)?;
    let mut by_name: HashMap<(&str, &str, &str), Vec<&ContainerInfo>> = HashMap::new();
    for info in booked {
        let key = (
            info.pod.namespace.as_str(),
            info.pod.name.as_str(),
            info.name.as_str(),
        );
        by_name.entry(key).or_default().push(info);
    }
    let mut placed = Vec::new();
    for pod in pods {
        for c in pod.containers.iter().filter(|c| c.pinned(resources)) {
            let key = (pod.namespace.as_str(), pod.name.as_str(), c.name.as_str());
            let entries = by_name.get(&key).map_or(&[][..], Vec::as_slice);
            let name = || format!("{}/{}/{}", pod.namespace, pod.name, c.name);
            match affinity(engine, pod.guaranteed, entries, resources) {
                Affinity::Node(n) => {
                    placed.push((numaplacement::container_hash(key.0, key.1, key.2), n))
                }
                Affinity::Spread(nodes) => return Err(Unplaced::Spread(name(), nodes)),
                Affinity::Unknown => return Err(Unplaced::Unknown(name())),
            }
        }
    }
    let nodes = engine
        .topology()
        .nodes
        .iter()
        .map(|n| n.id.saturating_add(1))
        .max()
        .unwrap_or(0);
    Ok(numaplacement::encode(nodes, placed)?)
}

#[cfg(test)]
mod tests {
    use super::super::node_pods::{ContainerFacts, Phase};
    use super::super::nrt::tests::advertised;
    use super::super::nrt::{resource_topology, Extras};
    use super::super::numaplacement::tests::decode;
    use super::super::numaplacement::{METADATA_ATTRIBUTE, VECTOR_ATTRIBUTE};
    use super::*;
    use crate::agent::PodInfo;
    use crate::pod_resources::{KubeletDevice, ZoneDevices};
    use serde_json::Value;
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use tap_engine::{ContainerRequest, EngineConfig, Outcome, Qos, Topology};

    fn engine() -> Engine {
        let raw =
            tap_engine::testdata::discover_fixture("synthetic-2s-4numa-96c-gpu").expect("fixture");
        let topo = Arc::new(Topology::build(&raw).expect("topology"));
        Engine::new(topo, EngineConfig::default())
    }

    /// Places `pod/name` as the engine would: Guaranteed with `cpus` whole CPUs, or Burstable.
    fn place(e: &mut Engine, pod: &str, name: &str, qos: Qos, cpus: u64) -> ContainerInfo {
        let id = format!("{pod}-{name}");
        let req = ContainerRequest {
            id: id.clone(),
            namespace: "ns".into(),
            pod_name: pod.into(),
            container_name: name.into(),
            qos: Some(qos),
            cpu_request_milli: cpus * 1000,
            cpu_limit_milli: (qos == Qos::Guaranteed).then_some(cpus * 1000),
            ..Default::default()
        };
        assert!(matches!(e.create(&req), Outcome::Placed(_)), "{id} placed");
        ContainerInfo {
            id,
            name: name.into(),
            pod: PodInfo {
                name: pod.into(),
                namespace: "ns".into(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn facts(pod: &str, guaranteed: bool, containers: &[(&str, bool, &[&str])]) -> PodFacts {
        PodFacts {
            namespace: "ns".into(),
            name: pod.into(),
            phase: Phase::Running,
            exclusive: true,
            guaranteed,
            containers: containers
                .iter()
                .map(|(name, native, ext)| ContainerFacts {
                    name: name.to_string(),
                    native_exclusive: *native,
                    extended: ext.iter().map(|s| s.to_string()).collect(),
                })
                .collect(),
        }
    }

    fn accel_on(node: u32) -> ZoneDevices {
        ZoneDevices {
            node,
            resource: "example.com/accel".into(),
            allocatable: 2,
            allocated: 1,
        }
    }

    /// The published metadata and vectors of an object, `None` without a placement.
    fn published(obj: &Value) -> Option<(String, BTreeMap<u32, String>)> {
        let meta = obj["attributes"]
            .as_array()?
            .iter()
            .find(|a| a["name"] == METADATA_ATTRIBUTE)?["value"]
            .as_str()?
            .to_string();
        let mut vectors = BTreeMap::new();
        for z in obj["zones"].as_array()? {
            let id: u32 = z["name"].as_str()?.strip_prefix("node-")?.parse().ok()?;
            for a in z["attributes"].as_array().into_iter().flatten() {
                if a["name"] == VECTOR_ATTRIBUTE {
                    vectors.insert(id, a["value"].as_str()?.to_string());
                }
            }
        }
        Some((meta, vectors))
    }

    /// Guaranteed containers on their CPUs' node, a Burstable device container on its device's
    /// node, the other containers and pods left out; what is published decodes back.
    #[test]
    fn pinned_containers_are_published_on_their_nodes() {
        let mut e = engine();
        let mut booked = Vec::new();
        for (i, pod) in ["g1", "g2", "g3", "g4", "g5"].iter().enumerate() {
            booked.push(place(&mut e, pod, "app", Qos::Guaranteed, 2 + i as u64));
        }
        let mut dev = place(&mut e, "b1", "dev", Qos::Burstable, 1);
        dev.kubelet_devices = vec![KubeletDevice {
            resource: "example.com/accel".into(),
            id: "a0".into(),
            numa_nodes: vec![2],
            claim: None,
        }];
        booked.push(dev);
        booked.push(place(&mut e, "b2", "plain", Qos::Burstable, 1));
        let mut pods: Vec<PodFacts> = ["g1", "g2", "g3", "g4", "g5"]
            .iter()
            .map(|p| facts(p, true, &[("app", true, &[])]))
            .collect();
        // The device container is pinned by its device; its neighbour and b2 are not.
        pods.push(facts(
            "b1",
            false,
            &[("dev", false, &["example.com/accel"]), ("side", false, &[])],
        ));
        pods.push(facts(
            "b2",
            false,
            &[("plain", false, &["example.com/other"])],
        ));
        let extras = Extras {
            seen_pods: Some(pods),
            booked: booked.clone(),
            devices: vec![accel_on(2)],
            ..Default::default()
        };
        let obj = resource_topology(&e, "n1", &advertised(), &extras);
        let (meta, vectors) = published(&obj).expect("a placement");
        let mut ids: Vec<(&str, &str, &str)> = ["g1", "g2", "g3", "g4", "g5"]
            .iter()
            .map(|p| ("ns", *p, "app"))
            .collect();
        ids.push(("ns", "b1", "dev"));
        let got = decode(&meta, &vectors, &ids).expect("decodes");
        assert!(meta.contains("::cc=6::nn=4::"), "{meta}");
        for info in &booked[..5] {
            let g = e.grant(&info.id).expect("grant");
            let node = e.topology().nodes_of(&g.cpus).single().expect("one node") as u32;
            let key = ("ns".to_string(), info.pod.name.clone(), "app".to_string());
            assert_eq!(got.get(&key), Some(&node), "{key:?}");
        }
        let key = ("ns".to_string(), "b1".to_string(), "dev".to_string());
        assert_eq!(got.get(&key), Some(&2));
        // With the container set the plugin would count, and only with it.
        assert!(decode(&meta, &vectors, &ids[..5]).is_none());
    }

    /// A Guaranteed container wider than a node, or a pinned container the agent does not
    /// hold, leaves the object without a placement (and no vector on any zone).
    #[test]
    fn spread_or_unknown_containers_publish_no_placement() {
        let mut e = engine();
        let wide = place(&mut e, "wide", "app", Qos::Guaranteed, 30);
        let pods = vec![facts("wide", true, &[("app", true, &[])])];
        let extras = Extras {
            seen_pods: Some(pods.clone()),
            booked: vec![wide.clone()],
            ..Default::default()
        };
        let g = e.grant(&wide.id).expect("grant");
        assert!(e.topology().nodes_of(&g.cpus).len() > 1, "spread");
        assert!(matches!(
            payload(&e, Some(&pods), &extras.booked, &BTreeSet::new()),
            Err(Unplaced::Spread(..))
        ));
        let obj = resource_topology(&e, "n1", &advertised(), &extras);
        assert_eq!(published(&obj), None);
        assert!(!obj.to_string().contains(VECTOR_ATTRIBUTE));
        // Not in the books at all.
        let unknown = Extras {
            seen_pods: Some(pods.clone()),
            ..Default::default()
        };
        assert!(matches!(
            payload(&e, Some(&pods), &[], &BTreeSet::new()),
            Err(Unplaced::Unknown(n)) if n == "ns/wide/app"
        ));
        assert_eq!(
            published(&resource_topology(&e, "n1", &advertised(), &unknown)),
            None
        );
        // The pods not listed yet: nothing either.
        let none = Extras {
            booked: vec![wide],
            ..Default::default()
        };
        assert_eq!(
            published(&resource_topology(&e, "n1", &advertised(), &none)),
            None
        );
    }

    /// No pinned container: the metadata says none, no zone has a vector.
    #[test]
    fn no_pinned_container_is_an_empty_placement() {
        let e = engine();
        let extras = Extras {
            seen_pods: Some(vec![facts("b", false, &[("c", false, &[])])]),
            ..Default::default()
        };
        let obj = resource_topology(&e, "n1", &advertised(), &extras);
        let (meta, vectors) = published(&obj).expect("a placement");
        assert_eq!(meta, "npv0v001::ve=leb89::cc=0::nn=4::bn=0");
        assert!(vectors.is_empty());
    }
}
