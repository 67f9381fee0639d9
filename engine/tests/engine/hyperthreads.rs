//! Hyperthread controls: exclusive CPUs in whole cores by default (the
//! kubelet's `full-pcpus-only`), `exclusive-cores: threads` to opt out, `sibling-pair` for a
//! 2-CPU container, and `hide-hyperthreads` (one thread per core in the container's cpuset).
//! Fixture: 2 sockets x 24 cores x 2 threads, siblings n and n+48.

use crate::common::{engine, placed, request};
use tap_engine::request::Hyperthreads;
use tap_engine::{ContainerRequest, CoreGrain, CpuSet, Engine, EngineConfig, Topology, Unhonoured};

const SMT: &str = "synthetic-2s-2numa-smt-96t";

/// A Guaranteed container of `cpus` whole CPUs.
fn guaranteed(id: &str, cpus: u64) -> ContainerRequest {
    request(id, cpus * 1000, Some(cpus * 1000))
}

/// [`guaranteed`], asking for `grain` by annotation.
fn guaranteed_by(id: &str, cpus: u64, grain: CoreGrain) -> ContainerRequest {
    let mut r = guaranteed(id, cpus);
    r.overrides.exclusive_cores = Some(grain);
    r
}

/// Whether `cpus` is a union of whole cores of the topology.
fn whole_cores(e: &Engine, cpus: &CpuSet) -> bool {
    e.topology()
        .cores
        .iter()
        .filter(|c| c.intersects(cpus))
        .all(|c| c.is_subset(cpus))
}

#[test]
fn exclusive_grants_take_whole_cores_by_default() {
    let mut e = engine(SMT, EngineConfig::default());
    // A split core first: a 1-CPU container with the opt-out takes one thread.
    let one = guaranteed_by("one", 1, CoreGrain::Threads);
    let p = placed(e.create(&one));
    assert!(p.exclusive && p.cpus.len() == 1, "{p:?}");
    // 4 CPUs by default: two whole cores, never the split core's free sibling.
    let p = placed(e.create(&guaranteed("four", 4)));
    assert!(p.exclusive, "{p:?}");
    assert_eq!(p.cpus.len(), 4);
    assert!(whole_cores(&e, &p.cpus), "not whole cores: {}", p.cpus);
    assert_eq!(p.unhonoured, None);
    // 3 CPUs is no whole number of 2-thread cores: shared CPUs, and it says why.
    let p = placed(e.create(&guaranteed("three", 3)));
    assert!(!p.exclusive, "{p:?}");
    assert_eq!(p.unhonoured, Some(Unhonoured::WholeCores { cpus: 3 }));
    // The opt-out (annotation): 3 exclusive CPUs, the remainder from a split core.
    let three = guaranteed_by("three-threads", 3, CoreGrain::Threads);
    let p = placed(e.create(&three));
    assert!(p.exclusive && p.cpus.len() == 3, "{p:?}");
    assert!(!whole_cores(&e, &p.cpus), "{}", p.cpus);
    assert_eq!(p.unhonoured, None);
    // The opt-out (configuration, the `--exclusive-cores=threads` flag).
    let cfg = EngineConfig {
        exclusive_cores: CoreGrain::Threads,
        ..Default::default()
    };
    let mut e = engine(SMT, cfg);
    let p = placed(e.create(&guaranteed("three", 3)));
    assert!(p.exclusive && p.cpus.len() == 3, "{p:?}");
}

#[test]
fn a_sibling_pair_is_one_core_or_shared_with_a_reason() {
    let mut e = engine(SMT, EngineConfig::default());
    let pair = guaranteed_by("pair", 2, CoreGrain::SiblingPair);
    let p = placed(e.create(&pair));
    assert!(p.exclusive, "{p:?}");
    let core = e.topology().core_of_cpu(p.cpus.first().unwrap());
    assert!(
        p.cpus.iter().all(|c| e.topology().core_of_cpu(c) == core),
        "one core's siblings: {}",
        p.cpus
    );
    assert_eq!(p.cpus.len(), 2);
    // Not 2 CPUs: ignored (whole cores as by default), and said.
    let four = guaranteed_by("four", 4, CoreGrain::SiblingPair);
    let p = placed(e.create(&four));
    assert_eq!(p.unhonoured, Some(Unhonoured::SiblingPairSize));
    assert!(p.exclusive && whole_cores(&e, &p.cpus), "{p:?}");
    // Without SMT no core has two threads: shared CPUs, and said.
    let mut e = engine("synthetic-2s-4numa-96c-gpu", EngineConfig::default());
    let p = placed(e.create(&pair));
    assert!(!p.exclusive, "{p:?}");
    assert_eq!(p.unhonoured, Some(Unhonoured::SiblingPair));
}

#[test]
fn hidden_hyperthreads_show_one_thread_per_core_and_follow_updates() {
    let mut e = engine(SMT, EngineConfig::default());
    let hide = |mut r: ContainerRequest| {
        r.overrides.hide_hyperthreads = Some(true);
        r
    };
    // Exclusive: 4 CPUs held (two whole cores), the container sees one thread of each.
    let p = placed(e.create(&hide(guaranteed("g", 4))));
    let g = e.grant("g").unwrap();
    assert_eq!(g.exclusive.len(), 4);
    assert_eq!(g.threads, Hyperthreads::Hidden);
    assert_eq!(p.cpus.len(), 2, "{p:?}");
    assert!(p.cpus.is_subset(&g.exclusive));
    assert_eq!(e.topology().one_thread_per_core(&g.exclusive), p.cpus);
    // Shared, on a one-pool machine (10 cores x 2 threads): a Burstable 4/8 sees each free
    // core once, minus the exclusive cores; a plain neighbour sees every thread.
    let mut e = engine("desktop-1socket-1numa-20cpu-smt2", EngineConfig::default());
    placed(e.create(&hide(guaranteed("g", 4))));
    let mut b = guaranteed("b", 4);
    b.cpu_limit_milli = Some(8000);
    let hidden = placed(e.create(&hide(b.clone())));
    b.id = "plain".into();
    let plain = placed(e.create(&b));
    assert_eq!(hidden.pool, plain.pool);
    let pool_cpus = e.topology().pools[plain.pool].cpus;
    assert_eq!(plain.cpus, pool_cpus.difference(e.taken()));
    assert_eq!(hidden.cpus, e.topology().one_thread_per_core(&plain.cpus));
    assert!(hidden.cpus.len() * 2 <= plain.cpus.len() + 1, "{hidden:?}");
    // An exclusive grant taken next to it updates the hidden container with one thread per
    // core of what is left.
    let p = placed(e.create(&guaranteed("g2", 2)));
    let up = p
        .updates
        .iter()
        .find(|u| u.container_id == "b")
        .expect("the hidden container is updated");
    assert!(!up.cpus.intersects(&p.cpus));
    assert_eq!(
        *up.cpus,
        e.topology()
            .one_thread_per_core(&pool_cpus.difference(e.taken()))
    );
    assert_eq!(e.grant("b").unwrap().cpus, *up.cpus);
}

/// A restarted agent reads a hidden-hyperthread grant back from its record: the live cpuset
/// (one thread per core) agrees with the record's exclusive cores.
#[test]
fn hidden_hyperthreads_restore_from_the_record() {
    let mut e = engine(SMT, EngineConfig::default());
    let mut r = guaranteed("g", 4);
    r.overrides.hide_hyperthreads = Some(true);
    let p = placed(e.create(&r));
    let record = e.record("g");
    let mut fresh = engine(SMT, EngineConfig::default());
    let report = fresh.restore(&[tap_engine::Existing {
        request: r,
        cpus: Some(p.cpus),
        mems: None,
        record,
    }]);
    assert_eq!(report.from_record, 1, "{report:?}");
    assert!(report.updates.is_empty(), "{report:?}");
    let g = fresh.grant("g").unwrap();
    assert_eq!(g.exclusive, e.grant("g").unwrap().exclusive);
    assert_eq!(g.cpus, p.cpus);
}

/// Whole cores add up only to multiples of the cores' common size: 2 where every core has two
/// threads, 1 on a hybrid CPU (2-thread P-cores, 1-thread E-cores) and without SMT. The
/// topology-aware policy skips its pool search for a count that is not such a multiple.
#[test]
fn core_sizes_have_a_common_divisor_the_policy_can_skip_on() {
    let gcd = |name: &str| {
        Topology::build(&tap_engine::testdata::discover_fixture(name).unwrap())
            .unwrap()
            .core_size_gcd()
    };
    assert_eq!(gcd(SMT), 2);
    assert_eq!(gcd("hybrid-1socket-1numa-16cpu-4p8e"), 1);
    assert_eq!(gcd("synthetic-2s-4numa-96c-gpu"), 1);
}
