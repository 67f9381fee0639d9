//! Engine unit tests that need crate-private fixtures.

use super::{Engine, EngineConfig, Outcome};
use crate::request::ContainerRequest;
use crate::topology::{fixtures::machine, Topology};
use std::sync::Arc;

fn req(id: &str, request: u64, limit: u64) -> ContainerRequest {
    ContainerRequest {
        id: id.into(),
        cpu_request_milli: request,
        cpu_limit_milli: Some(limit),
        ..Default::default()
    }
}

#[test]
fn exclusive_cpus_pass_over_cores_that_would_starve_a_shared_cluster() {
    // One socket, one NUMA node, clusters 0-3 and 4-7 (single-thread cores).
    let topo = Arc::new(Topology::build(&machine(1, 1, 1, 2, 4)).unwrap());
    let cfg = EngineConfig {
        cluster_affinity: true,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(topo, cfg);
    for id in ["a", "b"] {
        match e.create(&req(id, 500, 1000)) {
            Outcome::Placed(p) => assert_eq!(p.cpus.len(), 4, "{id} on a cluster"),
            other => panic!("{other:?}"),
        }
    }
    // A Guaranteed 4-CPU container fits neither cluster (3.5 CPUs free each); the socket
    // can give 4 CPUs only by leaving each cluster one.
    let Outcome::Placed(g) = e.create(&req("g", 4000, 4000)) else {
        panic!("not placed");
    };
    assert!(g.exclusive, "{g:?}");
    assert_eq!(g.cpus.len(), 4);
    for id in ["a", "b"] {
        assert!(!e.grant(id).unwrap().cpus.is_empty(), "{id} kept no CPU");
    }
}
