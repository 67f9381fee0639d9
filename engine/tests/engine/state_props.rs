//! Property test: random create / update / remove sequences on random fixture topologies and
//! configurations. After every step no exclusive CPU is held twice, no shared container runs on
//! an exclusive CPU, the accounted load equals what was admitted, and the runtime's view (the
//! cpusets the runtime was told, updates applied) matches the engine. At the end a fresh engine
//! restored from the runtime's view equals the live one (restart recovery).

use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use tap_engine::{
    ContainerRequest, CpuSet, Engine, EngineConfig, Existing, NodeSet, Outcome, PolicyKind, Qos,
    ResourcePriority, Topology,
};

const FIXTURES: [&str; 7] = [
    "synthetic-2s-4numa-96c-gpu",
    "synthetic-2s-2numa-smt-96t",
    "synthetic-1s-2numa-per-die-offline",
    "2socket-snc2-4numa-2pmem-112cpu-smt2",
    "synthetic-2s-2numa-64t-8ccx",
    "2socket-snc2-4numa-80cpu-smt2",
    "hybrid-1socket-1numa-16cpu-4p8e",
];

fn topologies() -> &'static Vec<Arc<Topology>> {
    static T: OnceLock<Vec<Arc<Topology>>> = OnceLock::new();
    T.get_or_init(|| {
        FIXTURES
            .iter()
            .map(|n| {
                let raw = tap_engine::testdata::discover_fixture(n).unwrap();
                Arc::new(Topology::build(&raw).unwrap())
            })
            .collect()
    })
}

#[derive(Debug, Clone)]
enum Op {
    Create {
        slot: u8,
        qos: u8,
        req: u16,
        extra: u16,
        mem_gib: u8,
    },
    Update {
        slot: u8,
        req: u16,
        extra: u16,
    },
    Remove {
        slot: u8,
    },
    /// Usage-aware rebalancing's move: to pool `pool` (modulo the pool count).
    Relocate {
        slot: u8,
        pool: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u8..24, 0u8..3, 0u16..12_000, 0u16..8_000, 0u8..64)
            .prop_map(|(slot, qos, req, extra, mem_gib)| Op::Create { slot, qos, req, extra, mem_gib }),
        2 => (0u8..24, 0u16..12_000, 0u16..8_000).prop_map(|(slot, req, extra)| Op::Update { slot, req, extra }),
        3 => (0u8..24).prop_map(|slot| Op::Remove { slot }),
        2 => (0u8..24, any::<u8>()).prop_map(|(slot, pool)| Op::Relocate { slot, pool }),
    ]
}

fn config() -> impl Strategy<Value = EngineConfig> {
    (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(numa, mem, clusters, excl, gpu, confine, whole, caches)| EngineConfig {
                policy: if numa {
                    PolicyKind::NumaAware
                } else {
                    PolicyKind::TopologyAware
                },
                memory_topology: mem,
                cluster_affinity: clusters,
                cluster_rule: Default::default(),
                exclusive_cpus: excl,
                priority: if gpu {
                    ResourcePriority::GpuFirst
                } else {
                    ResourcePriority::CpuFirst
                },
                reserved: CpuSet::parse("1").unwrap(),
                // Every seventh container is a system daemon, on the reserved CPU.
                reserved_for: tap_engine::ReservedAccess {
                    namespaces: vec!["kube-system".into()],
                    annotation: tap_engine::ReservedAnnotation::Ignored,
                },
                annotations_allowed: true,
                confine_best_effort: confine,
                cache_affinity: if caches {
                    tap_engine::CacheAffinity::On
                } else {
                    tap_engine::CacheAffinity::Off
                },
                rebalance: tap_engine::Rebalance::Off,
                dra_level: None,
                exclusive_cores: if whole {
                    tap_engine::CoreGrain::WholeCores
                } else {
                    tap_engine::CoreGrain::Threads
                },
            },
        )
}

/// What the runtime knows of a container: its request and the cpuset it was last told.
#[derive(Debug, Clone)]
struct Seen {
    req: ContainerRequest,
    cpus: CpuSet,
    mems: Option<NodeSet>,
}

fn request(slot: u8, qos: u8, req: u16, extra: u16, mem_gib: u8) -> ContainerRequest {
    // Guaranteed: whole CPUs, request = limit. Burstable: request + extra. BestEffort: none.
    let (qos, request, limit) = match qos {
        0 => {
            let n = 1 + u64::from(req) % 6;
            (Qos::Guaranteed, n * 1000, Some(n * 1000))
        }
        1 => (
            Qos::Burstable,
            u64::from(req),
            (extra > 0).then(|| u64::from(req) + u64::from(extra)),
        ),
        _ => (Qos::BestEffort, 0, None),
    };
    ContainerRequest {
        id: format!("c{slot}"),
        namespace: if slot.is_multiple_of(7) {
            "kube-system"
        } else {
            "default"
        }
        .into(),
        container_name: "app".into(),
        qos: Some(qos),
        cpu_request_milli: request,
        cpu_limit_milli: limit,
        memory_limit_bytes: (mem_gib > 0).then(|| u64::from(mem_gib) << 30),
        // Some containers use the GPU of a fixture that has one.
        device_nodes: if slot.is_multiple_of(5) {
            vec![1]
        } else {
            Vec::new()
        },
        ..Default::default()
    }
}

fn check_invariants(e: &Engine, seen: &BTreeMap<String, Seen>) -> Result<(), TestCaseError> {
    let mut exclusive = CpuSet::new();
    let mut admitted = 0u64;
    for (id, g) in e.grants() {
        if g.is_exclusive() {
            prop_assert!(
                !g.exclusive.intersects(&exclusive),
                "exclusive CPU given twice: {}",
                id
            );
            exclusive = exclusive.union(&g.exclusive);
        }
        let s = seen.get(id).expect("grant without a runtime container");
        let daemon = s.req.namespace == "kube-system";
        prop_assert_eq!(g.is_reserved(), daemon, "{} on the wrong CPUs", id);
        if daemon {
            prop_assert_eq!(
                g.cpus.to_string(),
                "1",
                "daemon {} not on the reserved CPU",
                id
            );
            prop_assert_eq!(s.cpus, g.cpus, "runtime view of {} differs", id);
            continue;
        }
        admitted += g.request_milli;
        prop_assert!(
            g.cpus.is_subset(e.usable()),
            "{} got unusable CPUs {}",
            id,
            g.cpus
        );
        prop_assert!(!g.cpus.is_empty(), "{} has an empty cpuset", id);
        prop_assert_eq!(s.cpus, g.cpus, "runtime view of {} differs", id);
    }
    prop_assert_eq!(&exclusive, e.taken());
    for (id, g) in e.grants() {
        if !g.is_exclusive() && !g.is_reserved() {
            prop_assert!(
                !g.cpus.intersects(&exclusive),
                "shared {} on exclusive CPUs",
                id
            );
            // Every shared grant follows its span's shared CPUs (unless none are left, when it
            // keeps what it had): the refresh after exclusive CPUs change reached it.
            let want = e.shared_cpus(&g.span);
            if !want.is_empty() {
                prop_assert_eq!(g.cpus, want, "shared {} not on its span's shared CPUs", id);
            }
        }
    }
    prop_assert_eq!(
        e.pool_load(0).request_milli,
        admitted,
        "accounted != admitted"
    );
    let node_sum: u64 = e.node_load().iter().map(|l| l.request_milli).sum();
    prop_assert_eq!(node_sum, admitted, "per-node load != admitted");
    Ok(())
}

fn apply(seen: &mut BTreeMap<String, Seen>, ups: &tap_engine::CpusetUpdates) {
    for u in ups {
        if let Some(s) = seen.get_mut(u.container_id) {
            s.cpus = *u.cpus;
            s.mems = u.mems.copied();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn state_stays_consistent_and_restores_exactly(
        fixture in 0..FIXTURES.len(),
        cfg in config(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let topo = topologies()[fixture].clone();
        let mut e = Engine::new(topo.clone(), cfg.clone());
        let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Create { slot, qos, req, extra, mem_gib } => {
                    let r = request(slot, qos, req, extra, mem_gib);
                    if seen.contains_key(&r.id) {
                        continue;
                    }
                    if let Outcome::Placed(p) = e.create(&r) {
                        apply(&mut seen, &p.updates);
                        seen.insert(r.id.clone(), Seen { req: r, cpus: p.cpus, mems: p.mems });
                    }
                }
                Op::Update { slot, req, extra } => {
                    let id = format!("c{slot}");
                    let Some(old) = seen.get(&id).cloned() else { continue };
                    let mut r = old.req.clone();
                    if r.qos == Some(Qos::Burstable) {
                        r.cpu_request_milli = u64::from(req);
                        r.cpu_limit_milli = (extra > 0).then(|| u64::from(req) + u64::from(extra));
                    }
                    match e.update(&r) {
                        Outcome::Placed(p) => {
                            apply(&mut seen, &p.updates);
                            seen.insert(id, Seen { req: r, cpus: p.cpus, mems: p.mems });
                        }
                        Outcome::Skipped(_) => { seen.remove(&id); }
                    }
                }
                Op::Remove { slot } => {
                    let id = format!("c{slot}");
                    let ups = e.remove(&id);
                    seen.remove(&id);
                    apply(&mut seen, &ups);
                }
                Op::Relocate { slot, pool } => {
                    let id = format!("c{slot}");
                    let to = usize::from(pool) % topo.pools.len();
                    let before = e.clone();
                    match e.relocate(&id, to) {
                        Ok(ups) => {
                            prop_assert!(ups.iter().all(|u| *u.container_id == *id), "{:?}", ups);
                            // numa-aware moves to the nodes of `to` (its grant's pool is theirs).
                            let g = e.grant(&id).expect("moved grant");
                            let want = if g.policy == PolicyKind::TopologyAware { to } else { g.pool };
                            prop_assert_eq!(g.pool, want);
                            prop_assert_eq!(g.nodes, topo.pools[to].numa_nodes);
                            apply(&mut seen, &ups.into_iter().collect());
                        }
                        Err(_) => prop_assert_eq!(&e, &before, "a refused move changed the state"),
                    }
                }
            }
            check_invariants(&e, &seen)?;
        }

        // Restart: a fresh engine restored from what the runtime reports equals the live one.
        let existing: Vec<Existing> = seen
            .values()
            .map(|s| Existing {
                request: s.req.clone(),
                cpus: Some(s.cpus),
                mems: s.mems,
                record: e.record(&s.req.id),
            })
            .collect();
        let mut restored = Engine::new(topo.clone(), cfg.clone());
        let report = restored.restore(&existing);
        prop_assert_eq!(report.from_record, existing.len());
        prop_assert!(report.updates.is_empty(), "restore wants to move containers: {:?}", report.updates);
        prop_assert_eq!(&restored, &e);

        // Without records (the reference's recovery): still safe and fully accounted.
        let bare: Vec<Existing> = existing.iter().cloned().map(|mut x| { x.record = None; x }).collect();
        let mut inferred = Engine::new(topo, cfg);
        let report = inferred.restore(&bare);
        prop_assert_eq!(report.inferred, bare.len());
        let mut after = seen.clone();
        apply(&mut after, &report.updates.into_iter().collect());
        check_invariants(&inferred, &after)?;
    }
}
