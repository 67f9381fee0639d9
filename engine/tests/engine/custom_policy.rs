//! The policy plug-in point: a third policy, written here against the public API only, placed
//! through the normal `Engine::create`. "First-fit NUMA node": the lowest NUMA node whose free
//! request capacity holds the request, else the root. It keeps state of its own: the NUMA
//! pools in order (built once from the topology) and a count of its decisions.

use crate::common::{self, placed, GPU96};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tap_engine::grant::Grant;
use tap_engine::policy::{pool_choice, Choice, Policy, Settings};
use tap_engine::{
    ContainerRequest, CpuSet, Engine, EngineConfig, Level, PolicyKind, PoolId, Reason, StateView,
    Topology,
};

#[derive(Debug)]
struct FirstFitNuma {
    /// NUMA-level pools, lowest node first.
    numa_pools: Vec<PoolId>,
    decisions: AtomicUsize,
}

impl FirstFitNuma {
    fn new(topo: &Topology) -> FirstFitNuma {
        FirstFitNuma {
            numa_pools: topo
                .pools
                .iter()
                .filter(|p| p.level == Level::Numa)
                .map(|p| p.id)
                .collect(),
            decisions: AtomicUsize::new(0),
        }
    }

    fn free_milli(view: &StateView<'_>, id: PoolId) -> u64 {
        view.capacity_milli(id)
            .saturating_sub(view.pool_load(id).request_milli)
    }
}

impl Policy for FirstFitNuma {
    // Pool-shaped grants: it takes the topology-aware slot.
    fn kind(&self) -> PolicyKind {
        PolicyKind::TopologyAware
    }

    fn name(&self) -> &str {
        "first-fit-numa"
    }

    fn choose(
        &self,
        view: &StateView<'_>,
        req: &ContainerRequest,
        settings: &Settings,
        _prefer: Option<&Grant>,
    ) -> Option<Choice> {
        self.decisions.fetch_add(1, Ordering::Relaxed);
        let topo = view.topology();
        let fit = self.numa_pools.iter().copied().find(|&id| {
            !view.shared_cpus(&topo.pools[id].cpus).is_empty()
                && Self::free_milli(view, id) >= req.cpu_request_milli
        });
        let (pool, reason) = match fit {
            Some(id) => (id, Reason::Fits(Level::Numa)),
            None => (0, Reason::Fallback),
        };
        Some(pool_choice(
            view,
            req,
            settings,
            pool,
            CpuSet::new(),
            reason,
        ))
    }
}

fn topo() -> Arc<Topology> {
    common::topo(GPU96)
}

fn c(id: &str, req_milli: u64) -> ContainerRequest {
    ContainerRequest {
        id: id.into(),
        namespace: "default".into(),
        cpu_request_milli: req_milli,
        cpu_limit_milli: Some(req_milli * 2),
        ..Default::default()
    }
}

#[test]
fn a_registered_policy_places_through_create() {
    let topo = topo();
    let policy = FirstFitNuma::new(&topo);
    let numa = policy.numa_pools.clone();
    assert!(numa.len() >= 2, "fixture has several NUMA nodes");
    let node_milli = topo.pools[numa[0]].cpus.len() as u64 * 1000;
    let mut e = Engine::new(topo.clone(), EngineConfig::default()).with_policy(policy);
    assert_eq!(e.policy(PolicyKind::TopologyAware).name(), "first-fit-numa");
    assert_eq!(e.policy(PolicyKind::NumaAware).name(), "numa-aware");

    // The built-in topology-aware spreads two containers over two NUMA nodes...
    let mut builtin = Engine::new(topo.clone(), EngineConfig::default());
    let (ba, bb) = (builtin.create(&c("a", 2000)), builtin.create(&c("b", 2000)));
    assert_ne!(placed(ba).pool, placed(bb).pool);
    // ...first fit puts both on the first node.
    let a = placed(e.create(&c("a", 2000)));
    let b = placed(e.create(&c("b", 2000)));
    assert_eq!((a.pool, b.pool), (numa[0], numa[0]));
    assert_eq!(a.reason, Reason::Fits(Level::Numa));
    assert_eq!(a.cpus, topo.pools[numa[0]].cpus);

    // The first node full: the next one.
    let big = placed(e.create(&c("big", node_milli - 4000)));
    assert_eq!(big.pool, numa[0]);
    let d = placed(e.create(&c("d", 1000)));
    assert_eq!(d.pool, numa[1]);

    // Resizes, removals and records go through the engine as for any policy.
    e.remove("big");
    let d2 = placed(e.update(&c("d", 1500)));
    assert_eq!(d2.pool, numa[0]);
    assert!(e.record("d").is_some_and(|r| r.contains("topology-aware")));
}

#[test]
fn the_other_policy_and_the_dispatch_stay_built_in() {
    let topo = topo();
    let cfg = EngineConfig::default();
    let mut e = Engine::new(topo.clone(), cfg).with_policy(FirstFitNuma::new(&topo));

    // kube-system is decided before any policy: the whole machine.
    let mut sys = c("sys", 100);
    sys.namespace = "kube-system".into();
    assert_eq!(placed(e.create(&sys)).reason, Reason::KubeSystem);

    // An annotation asking for numa-aware reaches the built-in numa-aware policy.
    let mut n = c("n", 1000);
    n.overrides.policy = Some(PolicyKind::NumaAware);
    assert_eq!(placed(e.create(&n)).reason, Reason::NumaNodes(1));

    // A dry-run decision is the custom policy's too.
    let choice = e.decide(&c("x", 1000)).unwrap();
    assert_eq!(choice.reason, Reason::Fits(Level::Numa));
}
