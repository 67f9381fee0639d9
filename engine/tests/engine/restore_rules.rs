//! Restore into a running engine and restore's checks: an
//! exclusive container adopted later shrinks the shared ones around it, the live cpuset wins
//! over an older record, and records are checked against the skip label and usable CPUs.

use crate::common::{self, placed, GPU96};
use tap_engine::{ContainerRequest, CpuSet, Engine, EngineConfig, Existing, Qos};

fn engine(cfg: EngineConfig) -> Engine {
    common::engine(GPU96, cfg)
}

fn request(id: &str, qos: Qos, req: u64, lim: u64) -> ContainerRequest {
    ContainerRequest {
        qos: Some(qos),
        ..common::request(id, req * 1000, Some(lim * 1000))
    }
}

/// What a runtime would report for a container placed by `e`.
fn listed(e: &Engine, req: ContainerRequest) -> Existing {
    let g = e.grant(&req.id).expect("granted");
    Existing {
        cpus: Some(g.cpus),
        mems: g.mems,
        record: e.record(&req.id),
        request: req,
    }
}

fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

/// Finding 2: stop an exclusive container behind the agent's back (its grant is released and
/// the shared container widens), start it again: the running agent adopts it as exclusive and
/// must shrink the shared container back, or both run on the same CPUs.
#[test]
fn adopting_an_exclusive_container_shrinks_the_shared_ones_around_it() {
    let mut first = engine(EngineConfig::default());
    let shared = request("s", Qos::Burstable, 2, 4);
    let s = placed(first.create(&shared));
    // The exclusive container lands on the shared one's node when the others are full.
    for i in 1..4 {
        let _ = placed(first.create(&request(&format!("f{i}"), Qos::Burstable, 20, 24)));
    }
    let g = placed(first.create(&request("g", Qos::Guaranteed, 4, 4)));
    assert!(
        g.exclusive && g.cpus.is_subset(&s.cpus),
        "{} / {}",
        s.cpus,
        g.cpus
    );
    let g_listed = listed(&first, request("g", Qos::Guaranteed, 4, 4));
    // Stopped: released; the shared container gets the CPUs back.
    let back = first.remove("g");
    assert_eq!(back.len(), 1);
    assert_eq!(first.grant("s").unwrap().cpus, s.cpus);
    // Started again behind the agent's back: adopted with its record.
    let report = first.restore(&[g_listed]);
    assert_eq!(report.from_record, 1);
    assert_eq!(first.grant("g").unwrap().exclusive, g.cpus);
    let shrunk = first.grant("s").unwrap().cpus;
    assert!(!shrunk.intersects(&g.cpus), "shared s still on {shrunk}");
    let to_s: Vec<_> = report
        .updates
        .iter()
        .filter(|u| &*u.container_id == "s")
        .collect();
    assert_eq!(to_s.len(), 1, "{:?}", report.updates);
    assert_eq!(to_s[0].cpus, shrunk);
}

/// Finding 6: a Guaranteed container resized in place from 2 to 4 CPUs carries its
/// create-time record (2 CPUs); the live cpuset (4 CPUs) wins at a restart.
#[test]
fn the_live_cpuset_wins_over_an_older_record() {
    let mut before = engine(EngineConfig::default());
    let two = request("g", Qos::Guaranteed, 2, 2);
    let _ = placed(before.create(&two));
    let record = before.record("g");
    let four = placed(before.update(&request("g", Qos::Guaranteed, 4, 4)));
    assert_eq!(four.cpus.len(), 4);
    let mut after = engine(EngineConfig::default());
    let report = after.restore(&[Existing {
        request: request("g", Qos::Guaranteed, 4, 4),
        cpus: Some(four.cpus),
        mems: None,
        record,
    }]);
    assert_eq!(report.inferred, 1, "{report:?}");
    assert_eq!(after.grant("g").unwrap().exclusive, four.cpus);
    assert!(report.updates.is_empty(), "{:?}", report.updates);
    // A shared record whose pool does not hold the live cpuset is stale too.
    let mut e = engine(EngineConfig::default());
    let s = placed(e.create(&request("s", Qos::Burstable, 2, 4)));
    let mut moved = listed(&e, request("s", Qos::Burstable, 2, 4));
    let elsewhere = if s.cpus.contains(0) {
        set("24-47")
    } else {
        set("0-23")
    };
    moved.cpus = Some(elsewhere);
    let mut fresh = engine(EngineConfig::default());
    let report = fresh.restore(&[moved]);
    assert_eq!(report.inferred, 1);
    assert_eq!(fresh.grant("s").unwrap().span, elsewhere);
}

/// Finding 8: restore honours the skip label, and a record naming CPUs that are now reserved
/// is not adopted as exclusive.
#[test]
fn restore_honours_the_skip_label_and_reserved_cpus() {
    let mut e = engine(EngineConfig::default());
    let mut opted = request("o", Qos::Burstable, 2, 4);
    let _ = placed(e.create(&opted));
    let mut o = listed(&e, opted.clone());
    opted.overrides.skip = true;
    o.request = opted;
    let g = placed(e.create(&request("g", Qos::Guaranteed, 2, 2)));
    let g_listed = listed(&e, request("g", Qos::Guaranteed, 2, 2));
    // Restarted with the exclusive CPUs reserved for the system.
    let cfg = EngineConfig {
        reserved: g.cpus,
        ..EngineConfig::default()
    };
    let mut after = engine(cfg);
    let report = after.restore(&[o, g_listed]);
    assert!(after.grant("o").is_none(), "opted out: unmanaged");
    assert_eq!(report.unmanaged, 1, "{report:?}");
    let got = after.grant("g").expect("still managed");
    assert!(!got.is_exclusive(), "reserved CPUs are never exclusive");
    assert!(!got.cpus.intersects(&g.cpus), "nor used: {}", got.cpus);
    assert!(after.taken().is_empty());
    assert!(report.updates.iter().any(|u| &*u.container_id == "g"));
}
