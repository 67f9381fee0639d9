//! `numa-policy: exclusive`: a whole NUMA node to one container, no other
//! container on it while it runs; no free node, no placement (the container starts unpinned).
//! Fixture: 2 sockets x 2 NUMA nodes of 24 CPUs (0-23, 24-47, 48-71, 72-95).

use crate::common::{self, placed, request, GPU96};
use tap_engine::request::NumaPolicy;
use tap_engine::{ContainerRequest, CpuSet, Engine, EngineConfig, Outcome, Reason, SkipReason};

fn engine() -> Engine {
    common::engine(GPU96, EngineConfig::default())
}

fn c(id: &str, req: u64, lim: Option<u64>) -> ContainerRequest {
    request(id, req * 1000, lim.map(|l| l * 1000))
}

fn exclusive(mut r: ContainerRequest) -> ContainerRequest {
    r.overrides.numa_policy = Some(NumaPolicy::Exclusive);
    r
}

fn node_cpus(e: &Engine, node: u32) -> CpuSet {
    e.topology().node(node).unwrap().cpus
}

#[test]
fn a_whole_node_to_itself_and_no_one_else_on_it() {
    let mut e = engine();
    let be = placed(e.create(&c("be", 0, None)));
    assert_eq!(be.cpus.len(), 96);
    let p = placed(e.create(&exclusive(c("x", 4, Some(8)))));
    assert_eq!(p.reason, Reason::ExclusiveNuma);
    let nodes = e.topology().nodes_of(&p.cpus);
    assert_eq!(nodes.len(), 1);
    let node = nodes.iter().next().unwrap() as u32;
    assert_eq!(p.cpus, node_cpus(&e, node), "every CPU of the node");
    // The node is charged whole (24 CPUs), whatever the container asked.
    assert_eq!(e.pool_load(p.pool).request_milli, 24_000);
    // The BestEffort container loses the node's CPUs.
    let up = p.updates.iter().find(|u| u.container_id == "be").unwrap();
    assert!(
        !up.cpus.intersects(&p.cpus) && up.cpus.len() == 72,
        "{up:?}"
    );
    // Later containers never land on it: three 4/8 on the three other nodes.
    for i in 0..3 {
        let b = placed(e.create(&c(&format!("b{i}"), 4, Some(8))));
        assert!(!b.cpus.intersects(&p.cpus), "{b:?}");
    }
    // No node is free now: a second exclusive container is refused, nothing held.
    let before = e.clone();
    match e.create(&exclusive(c("y", 2, Some(2)))) {
        Outcome::Skipped(SkipReason::NoFreeNumaNode) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(e == before);
    // A resize keeps the node; a no-op update changes nothing.
    let r = placed(e.update(&exclusive(c("x", 4, Some(8)))));
    assert_eq!(r.cpus, p.cpus);
    assert!(r.updates.is_empty(), "{r:?}");
    let r = placed(e.update(&exclusive(c("x", 8, Some(16)))));
    assert_eq!(r.cpus, p.cpus);
    // Removed: the node's CPUs go back to the BestEffort container.
    let ups = e.remove("x");
    let up = ups.iter().find(|u| u.container_id == "be").unwrap();
    assert!(p.cpus.is_subset(up.cpus), "{up:?}");
    assert_eq!(e.pool_load(p.pool).request_milli, 0);
}

#[test]
fn too_big_for_a_node_or_a_busy_machine_is_refused() {
    let mut e = engine();
    // Larger than a node (24 CPUs).
    match e.create(&exclusive(c("big", 25, Some(30)))) {
        Outcome::Skipped(SkipReason::NoFreeNumaNode) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
    // One container on every node: none is free.
    for i in 0..4 {
        placed(e.create(&c(&format!("b{i}"), 1, Some(2))));
    }
    assert!(matches!(
        e.create(&exclusive(c("x", 1, Some(2)))),
        Outcome::Skipped(SkipReason::NoFreeNumaNode)
    ));
}
