//! Memory tiers: memory-only NUMA nodes (PMEM, CXL, HBM) never enter a
//! container's `cpuset.mems` by default; `memory-type` adds the nearest ones of each kind.
//! Fixture: a real 2-socket SNC-2 server, CPU nodes 0-3 (0 and 2 on package 0), PMEM nodes 4
//! (nearest node 0, distance 17) and 5 (nearest node 2), both 28 away from nodes 1 and 3.

use std::sync::Arc;
use tap_engine::request::MemoryTypes;
use tap_engine::{
    ContainerRequest, Engine, EngineConfig, MemoryKind, NodeSet, Outcome, Placement, PolicyKind,
    Topology, Unhonoured,
};

const PMEM: &str = "2socket-snc2-4numa-2pmem-112cpu-smt2";

fn engine(name: &str, cfg: EngineConfig) -> Engine {
    let topo =
        Arc::new(Topology::build(&tap_engine::testdata::discover_fixture(name).unwrap()).unwrap());
    Engine::new(topo, cfg)
}

fn burstable(id: &str, types: Option<&str>) -> ContainerRequest {
    let mut r = ContainerRequest {
        id: id.into(),
        pod_name: format!("pod-{id}"),
        namespace: "default".into(),
        container_name: "app".into(),
        cpu_request_milli: 2000,
        cpu_limit_milli: Some(4000),
        ..Default::default()
    };
    r.overrides.memory_types = types.map(|t| MemoryTypes::parse(t).unwrap());
    r
}

fn placed(o: Outcome) -> Placement {
    match o {
        Outcome::Placed(p) => p,
        Outcome::Skipped(s) => panic!("expected a placement, got skipped: {s}"),
    }
}

#[test]
fn the_fixture_has_two_pmem_nodes() {
    let e = engine(PMEM, EngineConfig::default());
    let kinds: Vec<(u32, MemoryKind)> = e.topology().nodes.iter().map(|n| (n.id, n.kind)).collect();
    use MemoryKind::*;
    assert_eq!(
        kinds,
        vec![
            (0, Dram),
            (1, Dram),
            (2, Dram),
            (3, Dram),
            (4, Pmem),
            (5, Pmem)
        ]
    );
}

#[test]
fn memory_only_nodes_enter_mems_only_by_memory_type_nearest_first() {
    for policy in [PolicyKind::TopologyAware, PolicyKind::NumaAware] {
        let cfg = EngineConfig {
            policy,
            memory_topology: true,
            ..Default::default()
        };
        let mut e = engine(PMEM, cfg);
        // Four plain containers, one per node: DRAM only.
        for i in 0..4 {
            let p = placed(e.create(&burstable(&format!("plain{i}"), None)));
            let mems = p.mems.unwrap();
            assert_eq!(mems.len(), 1, "{policy:?}: {mems}");
            assert!(mems.iter().all(|n| n < 4), "{policy:?}: {mems}");
            assert_eq!(p.unhonoured, None);
        }
        // `pmem` (and its alias `cxl`, and with `dram`): the CPU node plus its nearest PMEM.
        for (i, t) in ["pmem", "dram,cxl"].iter().enumerate() {
            let p = placed(e.create(&burstable(&format!("tier{i}"), Some(t))));
            let cpu_nodes = e.topology().nodes_of(&p.cpus);
            assert_eq!(cpu_nodes.len(), 1, "{policy:?}");
            let node = cpu_nodes.iter().next().unwrap();
            let near = match node {
                2 => 5,
                _ => 4, // node 0's own; nodes 1 and 3 are 28 from both, the lower id wins
            };
            let mut want = NodeSet::new();
            want.insert(node);
            want.insert(near);
            assert_eq!(p.mems, Some(want), "{policy:?} {t}: node {node}");
            assert_eq!(p.unhonoured, None);
        }
        // `hbm`: there is none here; DRAM only, and said.
        let p = placed(e.create(&burstable("hbm", Some("hbm"))));
        assert_eq!(p.mems.unwrap().len(), 1);
        assert_eq!(p.unhonoured, Some(Unhonoured::MemoryType(MemoryKind::Hbm)));
    }
}

#[test]
fn memory_type_binds_memory_unless_binding_is_turned_off() {
    // Memory topology off: a memory type still binds this container's memory.
    let mut e = engine(PMEM, EngineConfig::default());
    let p = placed(e.create(&burstable("a", Some("pmem"))));
    let mems = p.mems.expect("bound by memory-type");
    assert!(mems.iter().any(|n| n >= 4) && mems.len() == 2, "{mems}");
    assert!(placed(e.create(&burstable("b", None))).mems.is_none());
    // memory-binding: false wins; said.
    let mut r = burstable("c", Some("pmem"));
    r.overrides.memory_binding = Some(false);
    let p = placed(e.create(&r));
    assert_eq!(p.mems, None);
    assert_eq!(p.unhonoured, Some(Unhonoured::MemoryTypeUnbound));
    // Bad values do not parse (the agent warns and ignores them).
    assert_eq!(MemoryTypes::parse("optane"), None);
    assert_eq!(MemoryTypes::parse(""), None);
}
