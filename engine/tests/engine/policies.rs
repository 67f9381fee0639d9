//! Policy behaviour on fixture topologies: the reference implementation's own expectations,
//! and what we do beyond it (exclusive CPUs, memory binding, clusters, overrides, resize).

use crate::common::{engine, placed, request, topo};
use std::sync::Arc;
use tap_engine::request::Overrides;
use tap_engine::{
    ContainerRequest, CpuSet, Engine, EngineConfig, Level, Outcome, Placement, PolicyKind, Qos,
    Reason, SkipReason, Topology,
};

const KP920: &str = "synthetic-2s-4numa-96c-gpu";

fn numa_cfg() -> EngineConfig {
    EngineConfig {
        policy: PolicyKind::NumaAware,
        ..Default::default()
    }
}

/// A container with request/limit in CPUs (limit 0 = none).
fn c(id: &str, req: f64, lim: f64) -> ContainerRequest {
    request(
        id,
        (req * 1000.0) as u64,
        (lim > 0.0).then_some((lim * 1000.0) as u64),
    )
}

fn level_of(e: &Engine, p: &Placement) -> Level {
    e.topology().pools[p.pool].level
}

#[test]
fn reference_expectations_topology_aware() {
    // 2 sockets, 4 NUMA nodes, 96 CPUs: 4/8 lands on one NUMA node, four of them on four
    // different nodes; 25/35 on a socket; 50/60 on the root.
    let mut e = engine(KP920, EngineConfig::default());
    let mut nodes = Vec::new();
    for i in 0..4 {
        let p = placed(e.create(&c(&format!("a{i}"), 4.0, 8.0)));
        assert_eq!(level_of(&e, &p), Level::Numa);
        assert_eq!(p.cpus.len(), 24);
        nodes.push(p.cpus.to_string());
    }
    nodes.sort();
    nodes.dedup();
    assert_eq!(
        nodes.len(),
        4,
        "four containers on four NUMA nodes: {nodes:?}"
    );
    let p = placed(e.create(&c("b", 25.0, 35.0)));
    assert_eq!(level_of(&e, &p), Level::Socket);
    assert_eq!(p.cpus.len(), 48);
    let p = placed(e.create(&c("r", 50.0, 60.0)));
    assert_eq!(level_of(&e, &p), Level::Machine);
    assert_eq!(p.cpus.len(), 96);
}

#[test]
fn numa_aware_one_node_most_free_then_nearest_nodes() {
    let mut e = engine(KP920, numa_cfg());
    let mut seen = Vec::new();
    for i in 0..4 {
        let p = placed(e.create(&c(&format!("a{i}"), 4.0, 8.0)));
        assert_eq!(p.reason, Reason::NumaNodes(1));
        seen.push(p.cpus.to_string());
    }
    seen.sort();
    assert_eq!(seen, vec!["0-23", "24-47", "48-71", "72-95"]);
    // A limit of 30 CPUs needs two nodes: the nearest pair (same socket, distance 12).
    let p = placed(e.create(&c("big", 10.0, 30.0)));
    assert_eq!(p.reason, Reason::NumaNodes(2));
    let s = p.cpus.to_string();
    assert!(s == "0-47" || s == "48-95", "{s}");
    // BestEffort is not confined: the machine's shared CPUs (confined: one node).
    let p = placed(e.create(&c("be", 0.0, 0.0)));
    assert_eq!(p.reason, Reason::BestEffort);
    assert_eq!(p.cpus.len(), 96);
    let mut be = c("be2", 0.0, 0.0);
    be.overrides.confine_best_effort = Some(true);
    assert_eq!(placed(e.create(&be)).cpus.len(), 24);
}

#[test]
fn numa_aware_uses_real_node_cpu_lists_not_ranges() {
    // Sub-NUMA clustering with scattered CPU lists: the container gets the node's exact list.
    let t = topo("2socket-snc2-4numa-80cpu-smt2");
    let mut e = Engine::new(t.clone(), numa_cfg());
    let p = placed(e.create(&c("a", 2.0, 4.0)));
    let node = t
        .nodes
        .iter()
        .find(|n| n.cpus == p.cpus)
        .expect("a whole node");
    assert_eq!(node.cpus.len(), 20);
    assert!(
        node.cpus.to_string().contains(','),
        "scattered list expected"
    );
}

#[test]
fn exclusive_cpus_for_guaranteed_integer_containers() {
    // SMT fixture: siblings n and n+48.
    let mut e = engine("synthetic-2s-2numa-smt-96t", EngineConfig::default());
    let shared = placed(e.create(&c("shared", 2.0, 4.0)));
    assert_eq!(shared.cpus.len(), 48);
    let mut g = c("g", 4.0, 4.0);
    g.qos = Some(Qos::Guaranteed);
    let p = placed(e.create(&g));
    assert!(p.exclusive);
    assert_eq!(p.cpus.len(), 4);
    // Whole cores: every CPU's sibling is in the set.
    for cpu in p.cpus.iter() {
        let sib = if cpu < 48 { cpu + 48 } else { cpu - 48 };
        assert!(p.cpus.contains(sib), "{} splits a core", p.cpus);
    }
    // The shared container in the same node loses those CPUs.
    if shared.cpus.is_superset_of(&p.cpus) {
        assert_eq!(p.updates.len(), 1);
        let up = p.updates.iter().next().expect("one update");
        assert_eq!(up.container_id, "shared");
        assert!(!up.cpus.intersects(&p.cpus));
    }
    // A second Guaranteed container never gets the same CPUs.
    let mut g2 = c("g2", 4.0, 4.0);
    g2.qos = Some(Qos::Guaranteed);
    let p2 = placed(e.create(&g2));
    assert!(!p2.cpus.intersects(&p.cpus));
    // Release gives them back to the shared container.
    let ups = e.remove("g");
    assert!(ups.iter().all(|u| u.cpus.intersects(&p.cpus)));
    assert!(!e.taken().intersects(&p.cpus));
    // Opting out of exclusivity by annotation gives a shared placement.
    let mut g3 = c("g3", 2.0, 2.0);
    g3.qos = Some(Qos::Guaranteed);
    g3.overrides.exclusive = Some(false);
    assert!(!placed(e.create(&g3)).exclusive);
}

trait Superset {
    fn is_superset_of(&self, o: &CpuSet) -> bool;
}
impl Superset for CpuSet {
    fn is_superset_of(&self, o: &CpuSet) -> bool {
        o.is_subset(self)
    }
}

#[test]
fn exclusive_never_empties_a_pool_with_shared_containers() {
    // One 8-CPU node: a shared container there keeps at least one CPU.
    let mut e = engine("desktop-1socket-1numa-20cpu-smt2", EngineConfig::default());
    placed(e.create(&c("s", 1.0, 2.0)));
    let mut g = c("g", 20.0, 20.0);
    g.qos = Some(Qos::Guaranteed);
    let p = placed(e.create(&g));
    assert!(
        !p.exclusive,
        "all 20 CPUs exclusive would leave the shared container nothing"
    );
    let mut g = c("g2", 19.0, 19.0);
    g.qos = Some(Qos::Guaranteed);
    // 19 of 20 fit in request capacity? 1 + 20 + 19 > 20: no pool fits; falls back to root.
    let p = placed(e.create(&g));
    assert!(!p.exclusive);
}

#[test]
fn memory_binding_leaves_memory_only_nodes_out_by_default() {
    let mut e = engine(
        "2socket-snc2-4numa-2pmem-112cpu-smt2",
        EngineConfig {
            memory_topology: true,
            ..Default::default()
        },
    );
    let p = placed(e.create(&c("a", 2.0, 4.0)));
    let mems = p.mems.expect("mems with memory topology").to_string();
    assert!(["0", "1", "2", "3"].contains(&mems.as_str()), "{mems}");
    // Isolated CPUs (4-7,60-63) are never handed out.
    assert!(!p.cpus.intersects(&CpuSet::parse("4-7,60-63").unwrap()));
    // Without memory topology: no mems.
    let mut e = engine(KP920, EngineConfig::default());
    assert!(placed(e.create(&c("a", 2.0, 4.0))).mems.is_none());
}

#[test]
fn memory_limits_are_accounted_with_memory_topology() {
    let mut e = engine(
        KP920,
        EngineConfig {
            memory_topology: true,
            ..Default::default()
        },
    );
    // Each NUMA node has 128 GiB: a 100 GiB container fills one; the next goes elsewhere.
    let mut a = c("a", 1.0, 2.0);
    a.memory_limit_bytes = Some(100 << 30);
    let mut b = c("b", 1.0, 2.0);
    b.memory_limit_bytes = Some(100 << 30);
    let pa = placed(e.create(&a));
    let pb = placed(e.create(&b));
    assert_eq!(level_of(&e, &pa), Level::Numa);
    assert_ne!(pa.mems, pb.mems);
}

#[test]
fn cluster_affinity_places_small_containers_on_clusters() {
    let mut e = engine(
        KP920,
        EngineConfig {
            cluster_affinity: true,
            ..Default::default()
        },
    );
    let p = placed(e.create(&c("a", 1.0, 2.0)));
    assert_eq!(level_of(&e, &p), Level::Cluster);
    assert_eq!(p.cpus.len(), 4);
    // Bigger than a cluster's limit: NUMA.
    let p = placed(e.create(&c("b", 2.0, 8.0)));
    assert_eq!(level_of(&e, &p), Level::Numa);
    // Without the flag no cluster pools are used.
    let mut e = engine(KP920, EngineConfig::default());
    assert_eq!(
        level_of(&e.clone(), &placed(e.create(&c("a", 1.0, 2.0)))),
        Level::Numa
    );
}

#[test]
fn annotations_override_policy_level_and_memory() {
    let mut e = engine(KP920, EngineConfig::default());
    let mut a = c("a", 1.0, 2.0);
    a.overrides = Overrides {
        level: Some(Level::Socket),
        memory_binding: Some(true),
        ..Default::default()
    };
    let p = placed(e.create(&a));
    assert_eq!(level_of(&e, &p), Level::Socket);
    assert_eq!(p.mems.unwrap().len(), 2);
    let mut b = c("b", 30.0, 30.0);
    b.overrides.policy = Some(PolicyKind::NumaAware);
    let p = placed(e.create(&b));
    assert_eq!(p.reason, Reason::NumaNodes(2));
    let mut s = c("s", 1.0, 1.0);
    s.overrides.skip = true;
    assert_eq!(e.create(&s), Outcome::Skipped(SkipReason::OptedOut));
    // Overrides are ignored when the policy does not allow annotations.
    let mut e = engine(
        KP920,
        EngineConfig {
            annotations_allowed: false,
            ..Default::default()
        },
    );
    let p = placed(e.create(&a));
    assert_eq!(level_of(&e, &p), Level::Numa);
    assert!(!placed(e.create(&s)).cpus.is_empty());
}

#[test]
fn reserved_cpus_are_never_handed_out() {
    let reserved = CpuSet::parse("0-1,48-49").unwrap();
    let mut e = engine(
        KP920,
        EngineConfig {
            reserved,
            ..Default::default()
        },
    );
    for i in 0..8 {
        let p = placed(e.create(&c(&format!("a{i}"), 2.0, 4.0)));
        assert!(!p.cpus.intersects(&reserved), "{}", p.cpus);
    }
    let mut g = c("g", 8.0, 8.0);
    g.qos = Some(Qos::Guaranteed);
    assert!(!placed(e.create(&g)).cpus.intersects(&reserved));
}

#[test]
fn kube_system_pods_get_all_shared_cpus() {
    let mut e = engine(KP920, EngineConfig::default());
    let mut k = c("coredns", 0.1, 0.0);
    k.namespace = "kube-system".into();
    let p = placed(e.create(&k));
    assert_eq!(p.reason, Reason::KubeSystem);
    assert_eq!(p.cpus.len(), 96);
}

#[test]
fn resize_keeps_the_pool_when_it_still_fits_and_moves_when_not() {
    let mut e = engine(KP920, EngineConfig::default());
    let p = placed(e.create(&c("a", 4.0, 8.0)));
    let p2 = placed(e.update(&c("a", 6.0, 10.0)));
    assert_eq!(p2.pool, p.pool);
    let p3 = placed(e.update(&c("a", 30.0, 40.0)));
    assert_eq!(level_of(&e, &p3), Level::Socket);
    assert_eq!(e.pool_load(0).request_milli, 30_000);
    e.remove("a");
    e.remove("a");
    assert_eq!(e.pool_load(0).request_milli, 0);
    assert!(e.is_empty());
}

#[test]
fn gpu_container_goes_to_the_gpu_node() {
    let mut e = engine("synthetic-4s-8numa-smt-384t", EngineConfig::default());
    let mut g = c("gpu", 4.0, 8.0);
    g.device_nodes = vec![5];
    let p = placed(e.create(&g));
    assert_eq!(e.topology().nodes_of(&p.cpus).to_string(), "5");
}

/// numa-aware prefers the node of the container's devices (a device plugin's NUMA node or a
/// GPU's) over the node with the most free capacity, while that node has room for it; a full
/// device node is passed over under `cpu-first` and kept under `gpu-first`.
#[test]
fn numa_aware_prefers_the_device_node() {
    let mut e = engine(KP920, numa_cfg());
    // Node 0 gets busier than the others: without devices a container goes elsewhere.
    placed(e.create(&c("busy", 8.0, 0.0)));
    let p = placed(e.create(&c("plain", 1.0, 2.0)));
    assert_ne!(e.topology().nodes_of(&p.cpus).to_string(), "0");
    let mut d = c("dev", 1.0, 2.0);
    d.device_nodes = vec![0];
    let p = placed(e.create(&d));
    assert_eq!(e.topology().nodes_of(&p.cpus).to_string(), "0");
    // Node 0 overcommitted by requests: cpu-first leaves it, gpu-first stays.
    let mut fill = c("fill", 14.5, 0.0);
    fill.device_nodes = vec![0];
    let p = placed(e.create(&fill));
    assert_eq!(e.topology().nodes_of(&p.cpus).to_string(), "0");
    let mut late = c("late", 1.0, 2.0);
    late.device_nodes = vec![0];
    let p = placed(e.create(&late));
    assert_ne!(e.topology().nodes_of(&p.cpus).to_string(), "0");
    let mut e = engine(
        KP920,
        EngineConfig {
            priority: tap_engine::ResourcePriority::GpuFirst,
            ..numa_cfg()
        },
    );
    let p = placed(e.create(&c("busy", 24.0, 0.0)));
    assert_eq!(e.topology().nodes_of(&p.cpus).to_string(), "0");
    let p = placed(e.create(&late));
    assert_eq!(e.topology().nodes_of(&p.cpus).to_string(), "0");
}

#[test]
fn full_machine_falls_back_to_the_root() {
    let mut e = engine(KP920, EngineConfig::default());
    for i in 0..4 {
        let p = placed(e.create(&c(&format!("f{i}"), 24.0, 0.0)));
        assert_eq!(level_of(&e, &p), Level::Numa);
    }
    let p = placed(e.create(&c("late", 1.0, 2.0)));
    assert_eq!(p.reason, Reason::Fallback);
    assert_eq!(p.pool, 0);
}

/// Exclusive grants never take the machine's last shared CPU, even with no shared container
/// yet: a container placed later, or one left unadjusted (which runs on every CPU), never ends
/// up on a CPU that is someone's exclusively (found by the churn test on a 2-CPU host).
#[test]
fn exclusive_grants_always_leave_the_machine_a_shared_cpu() {
    let mut e = engine("desktop-1socket-1numa-20cpu-smt2", EngineConfig::default());
    let mut exclusive = 0;
    for i in 0..20 {
        let mut g = c(&format!("g{i}"), 2.0, 2.0);
        g.qos = Some(Qos::Guaranteed);
        if let Outcome::Placed(p) = e.create(&g) {
            if p.exclusive {
                exclusive += p.cpus.len();
            }
        }
        assert!(
            !e.shared_cpus(&e.topology().online).is_empty(),
            "after g{i} the machine has no shared CPU: taken {}",
            e.taken()
        );
    }
    assert_eq!(exclusive, 18, "all but one core's CPUs went exclusive");
    let later = e.create(&c("late", 0.5, 1.0));
    assert!(matches!(later, Outcome::Placed(_)), "{later:?}");
}

/// `numa-policy: strict`: one NUMA node or no placement at all (the container is left on all
/// CPUs, the engine holds nothing for it); `preferred` and no annotation widen as before. A
/// resize is never refused (it keeps the container where it fits).
#[test]
fn a_strict_numa_policy_gets_one_node_or_nothing() {
    use tap_engine::request::NumaPolicy;
    for policy in [PolicyKind::TopologyAware, PolicyKind::NumaAware] {
        let cfg = EngineConfig {
            policy,
            ..Default::default()
        };
        let mut e = engine(KP920, cfg);
        let strict = |mut r: ContainerRequest| {
            r.overrides.numa_policy = Some(NumaPolicy::Strict);
            r
        };
        // 4/8 fits one node (24 CPUs): placed as usual.
        let p = placed(e.create(&strict(c("small", 4.0, 8.0))));
        assert_eq!(e.topology().nodes_of(&p.cpus).len(), 1, "{policy:?}");
        // 25/35 needs more than a node: refused, nothing held.
        let before = e.clone();
        match e.create(&strict(c("big", 25.0, 35.0))) {
            Outcome::Skipped(SkipReason::NoSingleNumaNode) => {}
            other => panic!("{policy:?}: expected a refusal, got {other:?}"),
        }
        assert!(e == before, "{policy:?}: a refusal holds nothing");
        assert!(e.grant("big").is_none());
        // preferred (and no annotation): widened as before.
        let mut pref = c("pref", 25.0, 35.0);
        pref.overrides.numa_policy = Some(NumaPolicy::Preferred);
        let p = placed(e.create(&pref));
        assert!(e.topology().nodes_of(&p.cpus).len() > 1, "{policy:?}");
        // A strict container resized beyond a node keeps a placement.
        let grown = strict(c("small", 25.0, 35.0));
        assert!(matches!(e.update(&grown), Outcome::Placed(_)), "{policy:?}");
    }
}

/// `numa-policy: strict` is judged by the request, as the kubelet's Topology Manager judges
/// `single-numa-node`: a 12/30 container (its limit wider than a 24-CPU node) gets one node's
/// CPUs, under either policy; only a request that no node holds (25/30) is refused.
#[test]
fn a_strict_numa_policy_is_judged_by_the_request_not_the_limit() {
    use tap_engine::request::NumaPolicy;
    let strict = |mut r: ContainerRequest| {
        r.overrides.numa_policy = Some(NumaPolicy::Strict);
        r
    };
    for policy in [PolicyKind::TopologyAware, PolicyKind::NumaAware] {
        let cfg = EngineConfig {
            policy,
            ..Default::default()
        };
        let mut e = engine(KP920, cfg);
        let p = placed(e.create(&strict(c("wide", 12.0, 30.0))));
        let nodes = e.topology().nodes_of(&p.cpus);
        assert_eq!(nodes.len(), 1, "{policy:?}: {}", p.cpus);
        let node = nodes
            .iter()
            .next()
            .and_then(|n| e.topology().node(n as u32));
        assert_eq!(Some(&p.cpus), node.map(|n| &n.cpus), "{policy:?}");
        let g = e.grant("wide").unwrap();
        assert_eq!(g.nodes.len(), 1, "{policy:?}: the grant's nodes");
        assert_eq!(g.limit_milli, Some(30_000), "{policy:?}: the limit is kept");
        // A request wider than every node: refused as before, nothing held.
        let before = e.clone();
        match e.create(&strict(c("big", 25.0, 30.0))) {
            Outcome::Skipped(SkipReason::NoSingleNumaNode) => {}
            other => panic!("{policy:?}: expected a refusal, got {other:?}"),
        }
        assert!(e == before, "{policy:?}: a refusal holds nothing");
        // Without the annotation the same 12/30 still widens past one node.
        let p = placed(e.create(&c("free", 12.0, 30.0)));
        assert!(e.topology().nodes_of(&p.cpus).len() > 1, "{policy:?}");
    }
}

/// `kunpeng-950-only` (the reference's rule): cluster pools only on CPU part 0xd06. The same
/// configuration asks for clusters on both Kunpeng fixtures; the 920 places on a NUMA node and
/// says why, the 950 on a cluster.
#[test]
fn kunpeng_950_only_uses_clusters_on_part_0xd06_alone() {
    use tap_engine::cpu_model::identify;
    use tap_engine::sysfs::DirSource;
    use tap_engine::testdata::{discover_fixture, fixture, proc_fixture_dir};
    use tap_engine::ClusterAffinityRule;
    let identified = |name: &str| {
        let mut raw = discover_fixture(name).unwrap();
        let (sys, proc) = (
            fixture(name).unwrap(),
            DirSource::new(proc_fixture_dir(name)),
        );
        raw.cpu = identify(&sys, &proc, 0).model;
        Arc::new(Topology::build(&raw).unwrap())
    };
    let cfg = |rule| EngineConfig {
        cluster_affinity: true,
        cluster_rule: rule,
        ..Default::default()
    };
    let kp920 = identified("synthetic-2s-4numa-96c-kunpeng920");
    let kp950 = identified("synthetic-1s-2numa-96c-kunpeng950");

    let mut e = Engine::new(kp920.clone(), cfg(ClusterAffinityRule::Kunpeng950Only));
    assert!(!e.config().cluster_affinity);
    let off = e.clusters_off().expect("why clusters are off").to_string();
    assert!(off.contains("this CPU is HiSilicon Kunpeng 920"), "{off}");
    let p = placed(e.create(&c("a", 1.0, 2.0)));
    assert_eq!(level_of(&e, &p), Level::Numa);

    let mut e = Engine::new(kp950, cfg(ClusterAffinityRule::Kunpeng950Only));
    assert!(e.config().cluster_affinity && e.clusters_off().is_none());
    let p = placed(e.create(&c("a", 1.0, 2.0)));
    assert_eq!(level_of(&e, &p), Level::Cluster);

    // `any` (the default) keeps today's behaviour: clusters on the 920 too.
    let mut e = Engine::new(kp920.clone(), cfg(ClusterAffinityRule::Any));
    let p = placed(e.create(&c("a", 1.0, 2.0)));
    assert_eq!(level_of(&e, &p), Level::Cluster);

    // A configuration set later (a NodeTopology policy) goes through the same rule.
    let mut e = Engine::new(kp920, EngineConfig::default());
    assert!(e.clusters_off().is_none());
    e.set_config(cfg(ClusterAffinityRule::Kunpeng950Only));
    assert!(!e.config().cluster_affinity && e.clusters_off().is_some());
    e.set_config(EngineConfig::default());
    assert!(e.clusters_off().is_none());
}

#[test]
fn exclusive_grants_leave_shared_requests_their_cpus() {
    // 4 NUMA nodes of 24 CPUs. A shared container requests 20 CPUs of node 0; a Guaranteed
    // container of 50 fits only the machine pool. Packing alone would take 23 of node 0's
    // CPUs (the first ones, all clusters equally free) and leave the shared container one
    // CPU for its 20 requested; the grant takes 4 there at most.
    let mut e = engine(KP920, EngineConfig::default());
    let s = placed(e.create(&c("s", 20.0, 22.0)));
    assert_eq!(level_of(&e, &s), Level::Numa);
    assert_eq!(s.cpus.len(), 24);
    let mut g = c("g", 50.0, 50.0);
    g.qos = Some(Qos::Guaranteed);
    let p = placed(e.create(&g));
    assert!(p.exclusive);
    assert_eq!(level_of(&e, &p), Level::Machine);
    assert_eq!(p.cpus.len(), 50);
    let up = p.updates.iter().find(|u| u.container_id == "s");
    let left = up.map_or(s.cpus, |u| *u.cpus);
    assert!(
        left.len() >= 20,
        "the shared container keeps the CPUs it requested: {left} ({} CPUs)",
        left.len()
    );
    assert!(!left.intersects(&p.cpus));
}
