//! Engine unit tests that need crate-private fixtures.

use super::{Engine, EngineConfig};
use crate::request::ContainerRequest;
use crate::topology::fixtures::{engine_on, machine, placed, with_policy};

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
    let cfg = EngineConfig {
        cluster_affinity: true,
        ..EngineConfig::default()
    };
    let mut e = engine_on(&machine(1, 1, 1, 2, 4), cfg);
    for id in ["a", "b"] {
        let p = placed(e.create(&req(id, 500, 1000)));
        assert_eq!(p.cpus.len(), 4, "{id} on a cluster");
    }
    // A Guaranteed 4-CPU container fits neither cluster (3.5 CPUs free each); the socket
    // can give 4 CPUs only by leaving each cluster one.
    let g = placed(e.create(&req("g", 4000, 4000)));
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
    let mut e = engine_on(&machine(2, 1, 2, 2, 2), EngineConfig::default());
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
                let p = placed(e.create(&req(id, milli, milli)));
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

/// Every pool's and node's load, charged again from the grants with the arithmetic the engine
/// keeps incrementally: pools (request, limit, memory, exclusive CPUs, containers, shared
/// containers) and nodes (request, limit, shared numa-aware grants).
type Loads = (Vec<[u64; 6]>, Vec<[u64; 3]>);

fn recharged(e: &Engine) -> Loads {
    let mut pools = vec![[0u64; 6]; e.topo.pools.len()];
    let mut nodes = vec![[0u64; 3]; e.topo.nodes.len()];
    for (_, g) in e.grants().filter(|(_, g)| !g.off_pools()) {
        let shared = u64::from(!g.is_exclusive());
        for (i, a) in e.topo.ancestors(g.pool).enumerate() {
            let first = u64::from(i == 0);
            let add = [
                g.charged_request(),
                g.limit_milli.unwrap_or(0),
                g.memory_bytes,
                g.exclusive.len() as u64,
                first,
                first * shared,
            ];
            pools[a].iter_mut().zip(add).for_each(|(v, d)| *v += d);
        }
        let n = g.nodes.len() as u64;
        for (i, id) in g.nodes.iter().enumerate() {
            let pos = e.topo.nodes.iter().position(|x| x.id as usize == id);
            let share = |v: u64| v / n + if i == 0 { v % n } else { 0 };
            let numa = u64::from(g.policy == crate::request::PolicyKind::NumaAware);
            let add = [
                share(g.charged_request()),
                share(g.limit_milli.unwrap_or(0)),
                shared * numa,
            ];
            nodes[pos.unwrap()]
                .iter_mut()
                .zip(add)
                .for_each(|(v, d)| *v += d);
        }
    }
    (pools, nodes)
}

fn charged(e: &Engine) -> Loads {
    let pools = e.pool_load.iter().map(|l| {
        let counts = [l.exclusive_cpus, l.containers, l.shared_containers];
        let [x, c, s] = counts.map(u64::from);
        [l.request_milli, l.limit_milli, l.memory_bytes, x, c, s]
    });
    let nodes = e.node_load.iter();
    let nodes = nodes.map(|l| [l.request_milli, l.limit_milli, u64::from(l.shared)]);
    (pools.collect(), nodes.collect())
}

#[test]
fn loads_kept_per_charge_equal_a_recharge_from_the_grants() {
    // 2 sockets x 2 NUMA nodes of 4 CPUs: numa-aware grants on one node, on two (an odd
    // request: the first node takes the remainder), on all four, and a topology-aware
    // exclusive one, created and removed in turn.
    use crate::request::{PolicyKind, Qos};
    let mut e = engine_on(&machine(2, 1, 2, 2, 2), with_policy(PolicyKind::NumaAware));
    let mut exclusive = req("x", 2000, 2000);
    exclusive.qos = Some(Qos::Guaranteed);
    exclusive.overrides.policy = Some(PolicyKind::TopologyAware);
    let steps = [
        ("a", Some(req("a", 1500, 2000))),
        ("b", Some(req("b", 4333, 6001))),
        ("x", Some(exclusive)),
        ("d", Some(req("d", 7001, 13003))),
        ("b", None),
        ("e", Some(req("e", 999, 5001))),
        ("x", None),
        ("a", None),
    ];
    for (id, step) in steps {
        match step {
            Some(r) => assert_eq!(placed(e.create(&r)).exclusive, id == "x", "{id}"),
            None => drop(e.remove(id)),
        }
        assert_eq!(charged(&e), recharged(&e), "after {id}");
    }
    let nodes = |id: &str| e.grant(id).map(|g| g.nodes.len());
    assert_eq!((nodes("d"), nodes("e")), (Some(4), Some(2)));
}
