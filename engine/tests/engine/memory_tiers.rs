//! Memory tiers: memory-only NUMA nodes (PMEM, CXL, HBM) never enter a
//! container's `cpuset.mems` by default; `memory-type` adds the nearest ones of each kind.
//! Fixture: a real 2-socket SNC-2 server, CPU nodes 0-3 (0 and 2 on package 0), PMEM nodes 4
//! (nearest node 0, distance 17) and 5 (nearest node 2), both 28 away from nodes 1 and 3.

use crate::common::{engine, placed, request};
use std::sync::Arc;
use tap_engine::request::MemoryTypes;
use tap_engine::{
    ContainerRequest, Engine, EngineConfig, MemoryKind, NodeSet, PolicyKind, Topology, Unhonoured,
};

const PMEM: &str = "2socket-snc2-4numa-2pmem-112cpu-smt2";

fn burstable(id: &str, types: Option<&str>) -> ContainerRequest {
    let mut r = request(id, 2000, Some(4000));
    r.overrides.memory_types = types.map(|t| MemoryTypes::parse(t).unwrap());
    r
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

/// A container adopted without a grant record (started behind the agent's back, or its record
/// lost) runs with the kernel's default `cpuset.mems`, every memory node, memory-only ones
/// included. The agent writes no memory-only node it did not ask for: with memory binding off
/// it writes no `cpuset.mems` at all (a move to another node included); with binding on, the
/// memory-only nodes leave its mems.
#[test]
fn an_adopted_container_gets_no_memory_only_node_it_did_not_ask_for() {
    use tap_engine::Existing;
    for memory_topology in [false, true] {
        let cfg = EngineConfig {
            memory_topology,
            ..Default::default()
        };
        let mut e = engine(PMEM, cfg);
        let node0 = e.topology().node(0).unwrap().cpus;
        let live = NodeSet::parse("0-5").unwrap();
        e.restore(&[Existing {
            request: burstable("x", None),
            cpus: Some(node0),
            mems: Some(live),
            record: None,
        }]);
        let mems = e.grant("x").expect("adopted").mems;
        let dram_only = |m: &Option<NodeSet>| match (memory_topology, m) {
            (false, None) => true,
            (true, Some(m)) => m.iter().all(|n| n < 4),
            _ => false,
        };
        assert!(dram_only(&mems), "binding {memory_topology}: {mems:?}");
        // The rebalancer moves it to node 2's pool.
        let to = e
            .topology()
            .pools
            .iter()
            .find(|p| p.numa_nodes == NodeSet::from_ids([2]))
            .map(|p| p.id)
            .unwrap();
        let ups = e.relocate("x", to).expect("moved");
        assert_eq!(ups.len(), 1);
        assert!(
            dram_only(&ups[0].mems),
            "binding {memory_topology}: {ups:?}"
        );
    }
}

/// The kernel's memory tiers (`devices/virtual/memory_tiering/memory_tier<N>/nodelist`, a
/// lower N faster) tell a memory-only node's kind: slower than the CPU nodes' DRAM tier is
/// PMEM/CXL, faster is HBM. Fixture: CPU nodes 0-1 (tier 4), CXL node 2 (tier 22, nearest
/// node 0), HBM node 3 (tier 2, nearest node 1), no HMAT data.
#[test]
fn memory_tiers_tell_pmem_from_hbm() {
    use MemoryKind::*;
    let kinds =
        |e: &Engine| -> Vec<MemoryKind> { e.topology().nodes.iter().map(|n| n.kind).collect() };
    let cfg = EngineConfig {
        memory_topology: true,
        ..Default::default()
    };
    let mut e = engine(TIERS, cfg.clone());
    assert_eq!(kinds(&e), vec![Dram, Dram, Pmem, Hbm]);
    // Memory-only nodes stay out by default; each kind is there to ask for.
    let p = placed(e.create(&burstable("plain", None)));
    assert!(p.mems.unwrap().iter().all(|n| n < 2), "DRAM only");
    let p = placed(e.create(&burstable("hbm", Some("hbm"))));
    assert!(p.mems.unwrap().contains(3), "the HBM node");
    assert_eq!(p.unhonoured, None);
    let p = placed(e.create(&burstable("cxl", Some("cxl"))));
    assert!(p.mems.unwrap().contains(2), "the CXL node");

    // Without the tiers: as before (no HMAT data: both PMEM/CXL).
    let untiered = without(TIERS, "devices/virtual/memory_tiering/");
    let raw = tap_engine::sysfs::discover(&untiered, &Default::default()).unwrap();
    let e = Engine::new(Arc::new(Topology::build(&raw).unwrap()), cfg.clone());
    assert_eq!(kinds(&e), vec![Dram, Dram, Pmem, Pmem]);

    // The tiers come before the HMAT: node 2 with more HMAT bandwidth than DRAM is still CXL
    // by its tier; without the tiers the HMAT makes it HBM.
    let bw = |s: tap_engine::sysfs::MapSource| {
        let n = |id: u32| format!("devices/system/node/node{id}/access0/initiators/read_bandwidth");
        s.with(&n(0), "100000\n")
            .with(&n(1), "100000\n")
            .with(&n(2), "200000\n")
    };
    let tiered = bw(tap_engine::testdata::fixture(TIERS).unwrap());
    let raw = tap_engine::sysfs::discover(&tiered, &Default::default()).unwrap();
    let e = Engine::new(Arc::new(Topology::build(&raw).unwrap()), cfg.clone());
    assert_eq!(kinds(&e), vec![Dram, Dram, Pmem, Hbm]);
    let raw = tap_engine::sysfs::discover(&bw(untiered), &Default::default()).unwrap();
    let e = Engine::new(Arc::new(Topology::build(&raw).unwrap()), cfg);
    assert_eq!(kinds(&e), vec![Dram, Dram, Hbm, Pmem]);
}

const TIERS: &str = "synthetic-1s-2numa-8c-cxl-hbm-tiers";

/// Fixture `name` without the entries under `prefix`.
fn without(name: &str, prefix: &str) -> tap_engine::sysfs::MapSource {
    let text = std::fs::read_to_string(tap_engine::testdata::fixture_file(name)).unwrap();
    let mut kept = String::new();
    let mut skipping = false;
    for line in text.lines() {
        if let Some(path) = line.strip_prefix("file ") {
            skipping = path.starts_with(prefix);
        }
        if !skipping {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    tap_engine::sysfs::MapSource::from_dump(&kept).unwrap()
}
