//! The cache level: pools of CPUs that share a last-level (L3) cache where
//! that is smaller than a NUMA node, between the NUMA node and the core. Fixture: 2 sockets
//! (one NUMA node each) of 4 CCX-like L3 groups of 4 cores x 2 threads (siblings n and n+32).

use crate::common::{placed, pool_cpus, request, topo};
use tap_engine::{
    CacheAffinity, ContainerRequest, Engine, EngineConfig, Level, Reason, Unhonoured,
};

const CCX: &str = "synthetic-2s-2numa-64t-8ccx";

fn c(id: &str, req: u64, lim: u64) -> ContainerRequest {
    request(id, req * 1000, Some(lim * 1000))
}

#[test]
fn l3_groups_smaller_than_a_numa_node_become_cache_pools() {
    let t = topo(CCX);
    assert_eq!(t.caches.len(), 8);
    let caches = pool_cpus(&t, Level::Cache);
    assert_eq!(caches.len(), 8);
    assert_eq!(caches[0], "0-3,32-35");
    for p in t.pools.iter().filter(|p| p.level == Level::Cache) {
        let parent = &t.pools[p.parent.unwrap()];
        assert_eq!(parent.level, Level::Socket, "under its (one-node) socket");
        assert_eq!(parent.numa_nodes.len(), 1);
    }
    // The fixture's clusters equal its L3 groups: no cluster pool repeats a cache pool.
    assert_eq!(
        t.pools.iter().filter(|p| p.level == Level::Cluster).count(),
        0
    );
    // Real dumps with L3 per socket (4 sockets, one node each; 2 sockets of 2 SNC nodes): no
    // cache pools, the L3 is not smaller than a NUMA node.
    for name in [
        "4socket-4numa-144cpu-smt2",
        "2socket-snc2-4numa-2pmem-112cpu-smt2",
    ] {
        let t = topo(name);
        assert!(!t.caches.is_empty(), "{name}");
        assert!(!t.pools.iter().any(|p| p.level == Level::Cache), "{name}");
    }
}

#[test]
fn topology_aware_places_between_numa_node_and_core() {
    let mut e = Engine::new(topo(CCX), EngineConfig::default());
    // 4/8 containers: one L3 group each, spread over the groups.
    let mut pools = Vec::new();
    for i in 0..4 {
        let p = placed(e.create(&c(&format!("b{i}"), 4, 8)));
        assert_eq!(e.topology().pools[p.pool].level, Level::Cache, "{p:?}");
        assert_eq!(p.cpus.len(), 8);
        pools.push(p.pool);
    }
    pools.sort_unstable();
    pools.dedup();
    assert_eq!(pools.len(), 4, "four groups: {pools:?}");
    // Larger than an L3 group: the NUMA node (socket).
    let p = placed(e.create(&c("big", 10, 12)));
    assert_eq!(p.reason, Reason::Fits(Level::Socket));
    // Exclusive CPUs from an L3 group: whole cores of one group.
    let mut g = c("g", 4, 4);
    g.qos = None;
    let p = placed(e.create(&g));
    assert!(p.exclusive);
    assert!(
        e.topology().caches.iter().any(|l| p.cpus.is_subset(l)),
        "{p:?}"
    );
}

#[test]
fn cache_affinity_off_and_the_level_annotation() {
    let cfg = EngineConfig {
        cache_affinity: CacheAffinity::Off,
        ..Default::default()
    };
    let mut e = Engine::new(topo(CCX), cfg);
    let p = placed(e.create(&c("a", 4, 8)));
    assert_eq!(p.reason, Reason::Fits(Level::Socket), "off: the node");
    // `level: cache` asks for it anyway.
    let mut r = c("b", 4, 8);
    r.overrides.level = Some(Level::Cache);
    let p = placed(e.create(&r));
    assert_eq!(p.reason, Reason::Fits(Level::Cache));
    assert_eq!(p.unhonoured, None);
    // Where the L3 is a socket's (4 sockets, one node each), the socket is the cache pool.
    let mut e = Engine::new(topo("4socket-4numa-144cpu-smt2"), EngineConfig::default());
    let p = placed(e.create(&r));
    assert_eq!(p.cpus.len(), 36, "{p:?}");
    assert_eq!(p.unhonoured, None);
    // Without cache information: the root, and said.
    let mut e = Engine::new(topo("synthetic-2s-4numa-96c-gpu"), EngineConfig::default());
    let p = placed(e.create(&r));
    assert_eq!(p.reason, Reason::ForcedLevelUnavailable(Level::Cache));
    assert_eq!(p.unhonoured, Some(Unhonoured::Level(Level::Cache)));
}
