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

/// Every pool's count of exclusive CPUs and its has-a-shared-CPU flag, counted from scratch.
fn recounted(e: &Engine) -> Vec<(u32, bool)> {
    e.topo
        .pools
        .iter()
        .map(|p| {
            let taken = p.cpus.intersection(&e.taken).len() as u32;
            let shared = !p
                .cpus
                .intersection(&e.usable)
                .difference(&e.taken)
                .is_empty();
            (taken, shared)
        })
        .collect()
}

fn kept(e: &Engine) -> Vec<(u32, bool)> {
    e.pool_load
        .iter()
        .zip(&e.has_shared)
        .map(|(l, s)| (l.taken_cpus, *s))
        .collect()
}

#[test]
fn pool_figures_follow_exclusive_grants_pool_by_pool() {
    // 2 sockets x 2 NUMA nodes x 2 clusters x 2 cores: exclusive grants of 1 and 2 CPUs
    // land in different pools; only the pools they touch are counted again, and every
    // pool's figures still equal a full recount after each step.
    let topo = Arc::new(Topology::build(&machine(2, 1, 2, 2, 2)).unwrap());
    let mut e = Engine::new(topo, EngineConfig::default());
    let steps: [(&str, Option<u64>); 8] = [
        ("s1", None),
        ("g1", Some(1000)),
        ("g2", Some(2000)),
        ("g3", Some(2000)),
        ("g4", Some(1000)),
        ("-g2", None),
        ("g5", Some(2000)),
        ("-g1", None),
    ];
    for (id, cpus) in steps {
        match (id.strip_prefix('-'), cpus) {
            (Some(gone), _) => {
                e.remove(gone);
            }
            (None, Some(milli)) => {
                let Outcome::Placed(p) = e.create(&req(id, milli, milli)) else {
                    panic!("{id} not placed");
                };
                assert!(p.exclusive, "{id}: {p:?}");
            }
            (None, None) => {
                e.create(&req(id, 500, 1000));
            }
        }
        assert_eq!(kept(&e), recounted(&e), "after {id}");
    }
    assert!(e.pool_load.iter().any(|l| l.taken_cpus > 0));
}
