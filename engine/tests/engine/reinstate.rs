//! Undoing a decision exactly (an update the runtime refused): the engine gets back the state
//! it had before, other containers' cpusets included.

use crate::common::{self, request, GPU96};
use tap_engine::{ContainerRequest, Engine, EngineConfig, Outcome, Qos};

fn engine() -> Engine {
    common::engine(GPU96, EngineConfig::default())
}

fn guaranteed(id: &str, cpus: u64) -> ContainerRequest {
    ContainerRequest {
        qos: Some(Qos::Guaranteed),
        ..request(id, cpus * 1000, Some(cpus * 1000))
    }
}

fn burstable(id: &str, req: u64, lim: u64) -> ContainerRequest {
    ContainerRequest {
        qos: Some(Qos::Burstable),
        ..request(id, req * 1000, Some(lim * 1000))
    }
}

#[test]
fn a_refused_resize_of_an_exclusive_container_is_undone_exactly() {
    let mut e = engine();
    for i in 0..4 {
        assert!(matches!(
            e.create(&burstable(&format!("s{i}"), 2, 4)),
            Outcome::Placed(_)
        ));
    }
    assert!(matches!(e.create(&guaranteed("g", 4)), Outcome::Placed(_)));
    let before = e.clone();
    let old = e.grant("g").cloned();
    // Resize to 8 exclusive CPUs: shared containers lose CPUs in the engine's state.
    let Outcome::Placed(p) = e.update(&guaranteed("g", 8)) else {
        panic!("resize not placed")
    };
    assert_eq!(p.cpus.len(), 8);
    assert_ne!(e, before);
    // The runtime refused the resize: back to exactly the state before it.
    e.reinstate("g", old);
    assert_eq!(e, before);
}

#[test]
fn a_refused_resize_of_a_shared_container_is_undone_exactly() {
    let mut e = engine();
    assert!(matches!(
        e.create(&burstable("a", 4, 8)),
        Outcome::Placed(_)
    ));
    assert!(matches!(e.create(&guaranteed("g", 2)), Outcome::Placed(_)));
    let before = e.clone();
    let old = e.grant("a").cloned();
    assert!(matches!(
        e.update(&burstable("a", 30, 40)),
        Outcome::Placed(_)
    ));
    assert_ne!(e, before);
    assert!(e.reinstate("a", old).is_empty());
    assert_eq!(e, before);
}

#[test]
fn reinstating_nothing_drops_the_grant_and_taken_cpus_are_not_given_twice() {
    let mut e = engine();
    assert!(matches!(e.create(&guaranteed("g", 4)), Outcome::Placed(_)));
    let old = e.grant("g").cloned().expect("granted");
    e.reinstate("g", None);
    assert!(e.grant("g").is_none());
    assert!(e.taken().is_empty());
    // Its CPUs went to another container meanwhile: the old grant comes back shared.
    assert!(matches!(e.create(&guaranteed("h", 4)), Outcome::Placed(_)));
    let ups = e.reinstate("g", Some(old.clone()));
    let g = e.grant("g").expect("reinstated");
    assert!(!g.is_exclusive());
    assert!(!g.cpus.intersects(e.taken()));
    assert_eq!(ups.len(), 1, "g's own cpuset changes: {ups:?}");
    assert_eq!(&*ups[0].container_id, "g");
}
