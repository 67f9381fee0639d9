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
//! Pure: built from an engine snapshot; [`super`] writes it (server-side apply).

use serde_json::{json, Value};
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
pub fn resource_topology(engine: &Engine, node: &str, adv: &Advertised) -> Value {
    let topo = engine.topology();
    let usable = engine.usable();
    let loads = engine.node_load();
    let zones: Vec<Value> = topo
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
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": KIND,
        "metadata": {
            "name": node,
            "labels": {"app.kubernetes.io/managed-by": "kunpeng-tap"},
        },
        "attributes": [
            {"name": "topologyManagerPolicy", "value": adv.policy},
            {"name": "topologyManagerScope", "value": "container"},
        ],
        "zones": zones,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tap_engine::{ContainerRequest, EngineConfig, Outcome, Qos, Topology};

    fn engine(memory_topology: bool) -> Engine {
        let root = tap_engine::testdata::fixture_dir("synthetic-2s-4numa-96c-gpu");
        let raw = tap_engine::sysfs::discover_dir(&root).expect("fixture");
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

    fn zone<'a>(obj: &'a Value, name: &str) -> &'a Value {
        obj["zones"]
            .as_array()
            .and_then(|z| z.iter().find(|z| z["name"] == name))
            .unwrap_or_else(|| panic!("no zone {name} in {obj}"))
    }

    fn resource<'a>(zone: &'a Value, name: &str) -> &'a Value {
        zone["resources"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["name"] == name))
            .unwrap_or_else(|| panic!("no resource {name} in {zone}"))
    }

    #[test]
    fn zones_follow_the_allocations() {
        let mut e = engine(true);
        let adv = Advertised {
            policy: "single-numa-node".into(),
        };
        let before = resource_topology(&e, "n1", &adv);
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
        let after = resource_topology(&e, "n1", &adv);
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
        assert_eq!(resource_topology(&e, "n1", &adv), before);
    }

    #[test]
    fn quantities_are_kubernetes_quantities() {
        assert_eq!(cpu_quantity(0), "0");
        assert_eq!(cpu_quantity(48_000), "48");
        assert_eq!(cpu_quantity(45_500), "45500m");
    }
}
