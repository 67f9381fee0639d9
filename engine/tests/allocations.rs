//! A placement decision must not copy the tree or the state: count heap allocations made by
//! one decision on the largest fixture with 1,000 containers placed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use tap_engine::testdata::{fixture_topology, Probe};
use tap_engine::{ContainerRequest, Engine, EngineConfig, PolicyKind};

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations<T>(f: impl FnOnce() -> T) -> usize {
    let before = ALLOCS.load(Ordering::SeqCst);
    std::hint::black_box(f());
    ALLOCS.load(Ordering::SeqCst) - before
}

#[test]
fn decisions_allocate_almost_nothing() {
    let topo = fixture_topology("synthetic-4s-8numa-smt-384t").expect("fixture topology");
    for policy in [PolicyKind::TopologyAware, PolicyKind::NumaAware] {
        let mut e = Engine::new(
            topo.clone(),
            EngineConfig {
                policy,
                ..Default::default()
            },
        );
        for i in 0..1000u64 {
            let r = ContainerRequest {
                id: format!("c{i}"),
                namespace: "default".into(),
                cpu_request_milli: 100 + i % 300,
                cpu_limit_milli: Some(600),
                ..Default::default()
            };
            let _ = e.create(&r);
        }
        let burstable = Probe::Burstable.request();
        let n = allocations(|| e.decide(&burstable));
        // topology-aware: none; numa-aware: one small vector of per-node figures.
        assert!(n <= 1, "{policy}: a shared decision made {n} allocations");
        let g = Probe::Guaranteed.request();
        let n = allocations(|| e.decide(&g));
        // Exclusive: a ranked candidate list and a core list, whatever the number of containers.
        assert!(
            n <= 4,
            "{policy}: an exclusive decision made {n} allocations"
        );
    }
}
