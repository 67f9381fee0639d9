use crate::claim::{ClaimAsk, ClaimError, ClaimKey, PartAsk};
use crate::request::ContainerRequest;
use crate::topology::fixtures::{engine_on, machine, placed};
use crate::types::{Existing, Outcome, Reason};
use crate::{CpuSet, Engine, EngineConfig};
use std::sync::Arc;

/// Two NUMA nodes (0-7, 8-15) of two clusters of four single-thread cores; memory bound.
fn engine() -> Engine {
    let cfg = EngineConfig {
        memory_topology: true,
        ..EngineConfig::default()
    };
    engine_on(&machine(1, 1, 2, 2, 4), cfg)
}

fn key(name: &str) -> ClaimKey {
    ClaimKey {
        namespace: "ns".into(),
        name: name.into(),
    }
}

fn ask(uid: &str, parts: &[(&str, usize)], e: &Engine) -> ClaimAsk {
    let parts = parts
        .iter()
        .map(|(device, cpus)| PartAsk {
            request: "cpus".into(),
            device: e.topology().pool_by_name(device).unwrap().id,
            cpus: *cpus,
            memory_bytes: 256 << 20,
        })
        .collect();
    ClaimAsk {
        uid: uid.into(),
        key: key(uid),
        parts,
    }
}

fn shared(id: &str, milli: u64) -> ContainerRequest {
    ContainerRequest {
        id: id.into(),
        cpu_request_milli: milli,
        cpu_limit_milli: Some(milli * 2),
        ..Default::default()
    }
}

fn user(id: &str, claims: &[&str]) -> ContainerRequest {
    ContainerRequest {
        claims: claims.iter().map(|c| key(c)).collect(),
        ..shared(id, 100)
    }
}

fn cpus(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

#[test]
fn a_claim_takes_cpus_of_its_node_and_shared_containers_move_off_them() {
    let mut e = engine();
    let s = placed(e.create(&shared("s", 1000)));
    let node = e.topology().node_of_cpu(s.cpus.first().unwrap()).unwrap();
    let (g, ups) = e
        .claim(&ask("c1", &[(&format!("numa{node}"), 4)], &e))
        .unwrap();
    assert_eq!(g.cpus.len(), 4);
    assert_eq!(e.topology().nodes_of(&g.cpus).len(), 1);
    assert!(g.cpus.is_subset(&e.topology().node(node).unwrap().cpus));
    assert_eq!(g.mems.to_string(), node.to_string());
    assert_eq!(g.memory_bytes(), 256 << 20);
    assert!(
        !e.usable().intersects(&g.cpus),
        "claimed CPUs leave the usable set"
    );
    let moved: Vec<_> = ups.into_iter().collect();
    assert_eq!(moved.len(), 1, "the shared container moves off the claim");
    assert!(!moved[0].cpus.intersects(&g.cpus));
    // Neither a new shared container nor an exclusive one gets them.
    for (id, milli, limit) in [("t", 4000, 8000), ("x", 2000, 2000)] {
        let r = ContainerRequest {
            cpu_limit_milli: Some(limit),
            ..shared(id, milli)
        };
        let p = placed(e.create(&r));
        assert!(!p.cpus.intersects(&g.cpus), "{id}: {}", p.cpus);
    }
}

#[test]
fn a_container_of_the_claim_runs_on_its_cpus_and_is_restored_there() {
    let mut e = engine();
    let (g, _) = e.claim(&ask("c1", &[("numa1", 4)], &e)).unwrap();
    let p = placed(e.create(&user("u", &["c1"])));
    assert_eq!(
        (p.cpus, p.mems, p.reason),
        (g.cpus, Some(g.mems), Reason::Claimed)
    );
    assert!(!p.exclusive && p.updates.is_empty());
    let record = e.record("u").unwrap();
    assert!(record.ends_with(";on=claim:c1"), "{record}");
    // A container of the Pod that does not use the claim is placed as any other.
    let o = placed(e.create(&user("o", &["another"])));
    assert!(!o.cpus.intersects(&g.cpus));
    // A resize keeps the claim's CPUs.
    let Outcome::Placed(r) = e.update(&ContainerRequest {
        cpu_request_milli: 3000,
        ..user("u", &["c1"])
    }) else {
        panic!("not placed");
    };
    assert_eq!(r.cpus, g.cpus);

    // A restarted agent: the claims from their checkpoint, then the containers.
    let mut fresh = engine();
    let (_, refused) = fresh.restore_claims(e.claims().cloned().collect());
    assert!(refused.is_empty(), "{refused:?}");
    fresh.restore(&[Existing {
        request: user("u", &[]),
        cpus: Some(g.cpus),
        mems: Some(g.mems),
        record: Some(record.clone()),
    }]);
    assert_eq!(fresh.grant("u"), e.grant("u"));
    assert_eq!(fresh.record("u").as_deref(), Some(record.as_str()));
    assert_eq!(fresh.claimed(), e.claimed());
}

#[test]
fn a_repeated_claim_is_the_same_and_a_changed_one_a_conflict() {
    let mut e = engine();
    let (first, _) = e.claim(&ask("c1", &[("numa0", 2)], &e)).unwrap();
    let (again, ups) = e.claim(&ask("c1", &[("numa0", 2)], &e)).unwrap();
    assert_eq!((first.cpus, ups.len()), (again.cpus, 0));
    let before = e.clone();
    let err = e.claim(&ask("c1", &[("numa0", 3)], &e)).unwrap_err();
    assert!(matches!(err, ClaimError::Conflict { .. }), "{err}");
    assert_eq!(e, before, "nothing changed");
}

#[test]
fn a_claim_that_cannot_be_held_books_nothing_and_says_why() {
    let mut e = engine();
    let before = e.clone();
    let err = e.claim(&ask("big", &[("numa0", 9)], &e)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "device numa0: 9 CPUs asked, 0 or more than the group's 8 usable CPUs"
    );
    let err = e.claim(&ask("zero", &[("numa0", 0)], &e)).unwrap_err();
    assert!(matches!(err, ClaimError::BadSize { asked: 0, .. }));
    // The first device fits, the second does not once the first is booked: neither is.
    let _ = e.claim(&ask("c1", &[("numa1", 7)], &e)).unwrap();
    let booked = e.clone();
    let err = e
        .claim(&ask("two", &[("numa0", 4), ("numa1", 4)], &e))
        .unwrap_err();
    assert!(matches!(err, ClaimError::NoRoom { .. }), "{err}");
    assert_eq!(e, booked, "all devices or none");
    let _ = before;
    let empty = ClaimAsk {
        parts: Vec::new(),
        ..ask("none", &[], &e)
    };
    assert_eq!(e.claim(&empty).unwrap_err(), ClaimError::NoDevice);
}

#[test]
fn releasing_a_claim_gives_its_cpus_back_to_the_shared_containers() {
    let mut e = engine();
    let (g, _) = e.claim(&ask("c1", &[("numa0", 4)], &e)).unwrap();
    let s = placed(e.create(&shared("s", 1000)));
    let ups = e.release_claim("c1");
    assert!(e.claim_of("c1").is_none());
    assert!(g.cpus.is_subset(e.usable()));
    if e.topology().nodes_of(&s.cpus).contains(0) {
        let up = ups.into_iter().find(|u| &*u.container_id == "s").unwrap();
        assert!(g.cpus.is_subset(&up.cpus), "{}", up.cpus);
    }
    assert!(e.release_claim("c1").is_empty(), "idempotent");
}

#[test]
fn a_restored_claim_whose_cpus_are_taken_is_refused() {
    let mut e = engine();
    let (g, _) = e.claim(&ask("c1", &[("numa0", 2)], &e)).unwrap();
    let mut fresh = Engine::new(
        Arc::clone(e.topology()),
        EngineConfig {
            reserved: cpus(&g.cpus.to_string()),
            ..EngineConfig::default()
        },
    );
    let (_, refused) = fresh.restore_claims(vec![g.clone()]);
    assert_eq!(refused.len(), 1);
    assert!(fresh.claim_of("c1").is_none());
}
