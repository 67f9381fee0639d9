//! Five behaviours of the reference implementation, on machines shaped like its test
//! data: placement matches the reference where it is right (memory that fits, BestEffort
//! unconfined, the root as a last resort, spreading by limits, exclusive CPUs spread like
//! shared ones), with memory topology on and off, and numbers from outside never wrap.

use crate::common::placed;
use std::sync::Arc;
use tap_engine::testdata::Shape;
use tap_engine::{
    ContainerRequest, CpuSet, Engine, EngineConfig, Existing, Level, NodeSet, Placement,
    PolicyKind, Qos, Reason, Topology,
};

const GIB: u64 = 1 << 30;

/// Both policies, each without and with memory topology.
const EVERY_CONFIG: [(PolicyKind, bool); 4] = [
    (PolicyKind::TopologyAware, false),
    (PolicyKind::TopologyAware, true),
    (PolicyKind::NumaAware, false),
    (PolicyKind::NumaAware, true),
];

/// `sockets` x `numa` NUMA nodes per socket x `cpus` single-thread cores per node, `mem_gib` of
/// memory per node, CPU ids linear; distances 10 local, 12 same socket, 20 remote.
fn shape(sockets: u32, numa: u32, cpus: u32, mem_gib: u64) -> Arc<Topology> {
    let raw = Shape::plain(sockets, numa, cpus, mem_gib * GIB).raw();
    Arc::new(Topology::build(&raw).expect("topology"))
}

/// 1 socket, 2 NUMA nodes of 48 CPUs and 32 GiB.
fn two_numa() -> Arc<Topology> {
    shape(1, 2, 48, 32)
}

/// 2 sockets x 2 NUMA nodes x 24 CPUs (32 GiB each).
fn two_by_two() -> Arc<Topology> {
    shape(2, 2, 24, 32)
}

fn cfg(policy: PolicyKind, memory: bool) -> EngineConfig {
    EngineConfig {
        policy,
        memory_topology: memory,
        ..Default::default()
    }
}

/// Request / limit in milli-CPU (`None` = no limit), memory limit in GiB (0 = none).
fn req(id: &str, request: u64, limit: Option<u64>, mem_gib: u64) -> ContainerRequest {
    ContainerRequest {
        id: id.into(),
        namespace: "default".into(),
        container_name: "app".into(),
        cpu_request_milli: request,
        cpu_limit_milli: limit,
        memory_limit_bytes: (mem_gib > 0).then_some(mem_gib * GIB),
        ..Default::default()
    }
}

fn guaranteed(id: &str, cpus: u64, mem_gib: u64) -> ContainerRequest {
    let mut r = req(id, cpus * 1000, Some(cpus * 1000), mem_gib);
    r.qos = Some(Qos::Guaranteed);
    r
}

fn nodes(e: &Engine, p: &Placement) -> String {
    e.topology().nodes_of(&p.cpus).to_string()
}

fn set(s: &str) -> NodeSet {
    NodeSet::parse(s).expect("set")
}

/// A fresh engine restored from the live one's records must equal it.
fn assert_restores(e: &Engine, reqs: &[ContainerRequest]) {
    let existing: Vec<Existing> = reqs
        .iter()
        .filter_map(|r| {
            let g = e.grant(&r.id)?;
            Some(Existing {
                request: r.clone(),
                cpus: Some(g.cpus),
                mems: g.mems,
                record: e.record(&r.id),
            })
        })
        .collect();
    let mut restored = Engine::new(e.topology().clone(), e.config().clone());
    let report = restored.restore(&existing);
    assert_eq!(report.from_record, existing.len());
    assert!(report.updates.is_empty(), "{:?}", report.updates);
    assert_eq!(&restored, e);
}

// ---- 1. memory that fits ----

#[test]
fn memory_larger_than_a_node_is_bound_to_nodes_that_hold_it() {
    // Guaranteed 1 CPU with a 64 GiB limit on two 32 GiB nodes: the exclusive CPU comes from
    // the pool that holds the memory, and cpuset.mems spans both nodes.
    let mut e = Engine::new(two_numa(), cfg(PolicyKind::TopologyAware, true));
    let g = guaranteed("g", 1, 64);
    let p = placed(e.create(&g));
    assert!(p.exclusive);
    assert_eq!(p.cpus.len(), 1);
    assert_eq!(p.mems, Some(set("0-1")));
    // Burstable: the pool of both nodes, its CPUs and memory.
    let b = req("b", 1000, Some(2000), 40);
    let pb = placed(e.create(&b));
    assert_eq!(pb.mems, Some(set("0-1")));
    assert_eq!(nodes(&e, &pb), "0-1");
    // mems that differ from the CPUs' nodes survive a restart through the grant record.
    assert!(e.record("g").unwrap().contains("mems=0-1"));
    assert_restores(&e, &[g, b]);

    // numa-aware: the nearest nodes that hold the memory, CPUs and mems alike.
    let mut e = Engine::new(two_numa(), cfg(PolicyKind::NumaAware, true));
    let p = placed(e.create(&guaranteed("g", 1, 64)));
    assert_eq!(p.reason, Reason::NumaNodes(2));
    assert_eq!(p.mems, Some(set("0-1")));
    assert_eq!(p.cpus.len(), 96);
}

#[test]
fn memory_limits_without_memory_topology_do_not_move_containers() {
    for policy in [PolicyKind::TopologyAware, PolicyKind::NumaAware] {
        let mut e = Engine::new(two_numa(), cfg(policy, false));
        let p = placed(e.create(&guaranteed("g", 1, 64)));
        assert_eq!(p.mems, None, "{policy}");
        assert_eq!(e.topology().nodes_of(&p.cpus).len(), 1, "{policy}");
        let p = placed(e.create(&req("b", 1000, Some(2000), 64)));
        assert_eq!(p.mems, None, "{policy}");
        assert_eq!(p.cpus.len(), 48, "{policy}: one node");
    }
}

#[test]
fn memory_that_fits_one_node_stays_on_the_cpus_nodes() {
    // Exclusive CPUs taken from the whole machine (forced level) with 16 GiB: mems = the
    // CPUs' node, not the pool's two.
    let mut e = Engine::new(two_numa(), cfg(PolicyKind::TopologyAware, true));
    let mut g = guaranteed("g", 2, 16);
    g.overrides.level = Some(Level::Socket);
    let p = placed(e.create(&g));
    assert!(p.exclusive);
    assert_eq!(p.mems, Some(e.topology().nodes_of(&p.cpus)));
    assert_eq!(p.mems.unwrap().len(), 1);
    // A mix on 2 sockets x 2 nodes: whenever the memory fits one node, mems never name a
    // node the container's CPUs are not on.
    for policy in [PolicyKind::TopologyAware, PolicyKind::NumaAware] {
        let mut e = Engine::new(two_by_two(), cfg(policy, true));
        for i in 0..24u64 {
            let r = if i % 3 == 0 {
                guaranteed(&format!("g{i}"), 1 + i % 4, 1 + i % 16)
            } else {
                req(
                    &format!("b{i}"),
                    500 + 300 * i,
                    Some(1000 + 900 * i),
                    1 + i % 16,
                )
            };
            let p = placed(e.create(&r));
            let mems = p.mems.expect("mems with memory topology");
            assert!(
                mems.is_subset(&e.topology().nodes_of(&p.cpus)),
                "{policy} {}: mems {mems} outside the CPUs' nodes ({})",
                r.id,
                p.cpus
            );
        }
    }
}

// ---- 2. BestEffort unconfined ----

#[test]
fn best_effort_runs_on_the_machines_shared_cpus() {
    for (policy, memory) in EVERY_CONFIG {
        let mut e = Engine::new(two_by_two(), cfg(policy, memory));
        let be = req("be", 0, None, 0);
        assert_eq!(be.qos(), Qos::BestEffort);
        let p = placed(e.create(&be));
        assert_eq!(p.reason, Reason::BestEffort);
        assert_eq!(p.cpus.len(), 96, "{policy}: no NUMA affinity");
        assert_eq!(p.mems, memory.then(|| set("0-3")));
        // Exclusive CPUs come and go: the BestEffort cpuset follows.
        let g = guaranteed("g", 4, 0);
        let pg = placed(e.create(&g));
        if policy == PolicyKind::TopologyAware {
            assert!(pg.exclusive);
            let up = pg.updates.iter().find(|u| u.container_id == "be");
            let up = up.expect("BestEffort updated when exclusive CPUs are taken");
            assert_eq!(up.cpus.len(), 92);
            assert!(!up.cpus.intersects(&pg.cpus));
            assert_restores(&e, &[be.clone(), g.clone()]);
            let ups = e.remove("g");
            assert!(ups
                .iter()
                .any(|u| u.container_id == "be" && u.cpus.len() == 96));
        }
    }
}

#[test]
fn best_effort_can_still_be_confined_by_flag_or_annotation() {
    let confined = EngineConfig {
        confine_best_effort: true,
        ..Default::default()
    };
    let mut e = Engine::new(two_by_two(), confined);
    let p = placed(e.create(&req("be", 0, None, 0)));
    assert_eq!(p.cpus.len(), 24);
    assert_eq!(e.topology().pools[p.pool].level, Level::Numa);
    let mut e = Engine::new(two_by_two(), EngineConfig::default());
    let mut be = req("be", 0, None, 0);
    be.overrides.confine_best_effort = Some(true);
    assert_eq!(placed(e.create(&be)).cpus.len(), 24);
    // Reserved CPUs stay out of the shared CPUs too.
    let reserved = CpuSet::parse("0-1").unwrap();
    let mut e = Engine::new(
        two_by_two(),
        EngineConfig {
            reserved,
            ..Default::default()
        },
    );
    let p = placed(e.create(&req("be", 0, None, 0)));
    assert_eq!(p.cpus.len(), 94);
    assert!(!p.cpus.intersects(&reserved));
}

// ---- 3. spreading by limits ----

#[test]
fn burstable_containers_spread_by_granted_limits() {
    for policy in [PolicyKind::TopologyAware, PolicyKind::NumaAware] {
        for memory in [false, true] {
            let mut e = Engine::new(two_numa(), cfg(policy, memory));
            let a = placed(e.create(&req("a", 10_000, Some(40_000), 4)));
            let b = placed(e.create(&req("b", 10_000, Some(30_000), 4)));
            assert_eq!(nodes(&e, &a), "0", "{policy}");
            assert_eq!(nodes(&e, &b), "1", "{policy}");
            // Requests tie (38 CPUs free on each); node 1 has more room after the limits.
            let c = placed(e.create(&req("c", 10_000, Some(20_000), 4)));
            assert_eq!(nodes(&e, &c), "1", "{policy} memory {memory}");
        }
    }
}

// ---- 4. the root is the last resort ----

#[test]
fn the_root_is_the_last_resort() {
    for memory in [false, true] {
        // The issue's machine: 2 sockets x 2 NUMA nodes x 96 CPUs. 100/200: no node holds the
        // request, a socket does (not the limit); the root holds the limit but is not used.
        let mut e = Engine::new(shape(2, 2, 96, 32), cfg(PolicyKind::TopologyAware, memory));
        let p = placed(e.create(&req("a", 100_000, Some(200_000), 0)));
        assert_eq!(e.topology().pools[p.pool].level, Level::Socket);
        let p = placed(e.create(&req("b", 50_000, Some(100_000), 0)));
        assert_eq!(e.topology().pools[p.pool].level, Level::Socket);

        // The same on 2 x 2 x 24: 25/50 and 12.5/25 on a socket; 50/60 fits nothing below.
        let mut e = Engine::new(two_by_two(), cfg(PolicyKind::TopologyAware, memory));
        let p = placed(e.create(&req("a", 25_000, Some(50_000), 1)));
        assert_eq!(e.topology().pools[p.pool].level, Level::Socket);
        assert_eq!(p.reason, Reason::Fits(Level::Socket));
        let p = placed(e.create(&req("b", 12_500, Some(25_000), 1)));
        assert_eq!(e.topology().pools[p.pool].level, Level::Socket);
        let p = placed(e.create(&req("c", 50_000, Some(60_000), 1)));
        assert_eq!(p.pool, 0);
    }
}

// ---- 5. exclusive CPUs spread like shared ones ----

#[test]
fn exclusive_cpus_go_where_the_room_is() {
    for memory in [false, true] {
        let mut e = Engine::new(two_by_two(), cfg(PolicyKind::TopologyAware, memory));
        let big = placed(e.create(&guaranteed("big", 40, 8)));
        assert!(big.exclusive);
        assert_eq!(big.cpus, CpuSet::parse("0-39").unwrap());
        // Node 1 has 8 CPUs left; socket 1 is idle.
        let p = placed(e.create(&guaranteed("g", 4, 8)));
        assert!(p.exclusive);
        let n = e.topology().nodes_of(&p.cpus);
        assert!(n == set("2") || n == set("3"), "{}: {}", p.cpus, n);
        // A shared container also stays off the nearly full node.
        let s = placed(e.create(&req("s", 4000, Some(8000), 1)));
        assert!(!e.topology().nodes_of(&s.cpus).contains(1), "{}", s.cpus);
    }
}

// ---- numbers from outside ----

#[test]
fn huge_requests_go_to_the_root_and_never_wrap() {
    let max = u64::MAX;
    for (policy, memory) in EVERY_CONFIG {
        let mut e = Engine::new(two_by_two(), cfg(policy, memory));
        let mut reqs = vec![
            req("r", max, None, 0),
            req("l", max, Some(max), 0),
            req(
                "g",
                18_446_744_073_709_551_000,
                Some(18_446_744_073_709_551_000),
                0,
            ),
        ];
        let mut m = req("m", 1000, Some(2000), 0);
        m.memory_limit_bytes = Some(max);
        reqs.push(m);
        for r in &reqs {
            let p = placed(e.create(r));
            assert!(!p.exclusive, "{policy} {}", r.id);
            if r.id != "m" || memory {
                assert_eq!(p.pool, 0, "{policy} {}: larger than the machine", r.id);
                assert_eq!(p.cpus.len(), 96, "{policy} {}", r.id);
            }
        }
        // Saturated, not wrapped; the root only bounds itself, so a small container still
        // finds a pool below it.
        assert_eq!(e.pool_load(0).request_milli, max);
        let p = placed(e.create(&req("small", 100, Some(200), 0)));
        assert!(!p.cpus.is_empty());
        for r in &reqs {
            e.remove(&r.id);
        }
        e.remove("small");
        assert_eq!(e.pool_load(0).request_milli, 0);
        assert_eq!(e.pool_load(0).memory_bytes, 0);
        assert!(e.node_load().iter().all(|l| l.request_milli == 0));
        // topology-aware: a small request with a huge limit fits below the root.
        let p = placed(e.create(&req("x", 1000, Some(max), 0)));
        assert_eq!(p.pool != 0, policy == PolicyKind::TopologyAware, "{policy}");
    }
}
