//! Unit tests of the usage hint: how the engine keeps it, how the policies place by it, and the
//! cooldown waiver.

use super::tests::{burstable, engine, hot_node0, never, node, numa_pool, sample};
use super::*;
use crate::nodeset::NodeSet;
use crate::request::{ContainerRequest, PolicyKind};
use crate::topology::fixtures::{engine_on, machine, placed, with_policy};

/// c0..c3 on nodes 0..3; node 2 the least busy, node 0 the busiest.
fn usage4() -> Vec<UsageSample> {
    [1500, 900, 50, 400]
        .iter()
        .enumerate()
        .map(|(i, u)| sample(&format!("c{i}"), *u))
        .collect()
}

fn with_hint(mut e: Engine, u: &[UsageSample]) -> Engine {
    let hint = UsageHint::measure(&e.view(), u);
    e.set_usage_hint(Some(hint));
    e
}

fn place(e: &mut Engine, r: &ContainerRequest) -> usize {
    placed(e.create(r));
    node(e, &r.id)
}

#[test]
fn without_a_hint_placements_are_by_requests() {
    let mut plain = engine(4);
    let mut cleared = with_hint(engine(4), &usage4());
    cleared.set_usage_hint(None);
    for i in 4..12 {
        let r = burstable(&format!("c{i}"), 300, 1000);
        assert_eq!(place(&mut plain, &r), place(&mut cleared, &r), "c{i}");
    }
    assert_eq!(plain, cleared);
}

#[test]
fn topology_aware_puts_a_new_shared_container_on_the_least_busy_node() {
    let r = burstable("c4", 500, 1000);
    assert_eq!(place(&mut engine(4), &r), 0, "by requests: round robin");
    let mut e = with_hint(engine(4), &usage4());
    assert_eq!(place(&mut e, &r), 2);
    // Counted with its request: node 2 at 550 now, node 3 (400) is the least busy.
    assert_eq!(e.usage_hint().unwrap().node_usage_milli()[2], 550);
    assert_eq!(place(&mut e, &burstable("c5", 500, 1000)), 3);
}

#[test]
fn numa_aware_puts_a_new_shared_container_on_the_least_busy_node() {
    let mut e = engine_on(&machine(1, 1, 4, 1, 4), with_policy(PolicyKind::NumaAware));
    for i in 0..4 {
        place(&mut e, &burstable(&format!("c{i}"), 500, 1000));
    }
    let r = burstable("c4", 500, 1000);
    let by_requests = place(&mut e.clone(), &r);
    let mut hinted = with_hint(e, &usage4());
    assert_eq!(place(&mut hinted, &r), 2);
    assert_ne!(by_requests, 2, "the hint made the difference");
}

#[test]
fn exclusive_cpus_are_taken_where_the_shared_ones_stay_least_busy() {
    let g = ContainerRequest {
        id: "g".into(),
        cpu_request_milli: 2000,
        cpu_limit_milli: Some(2000),
        ..Default::default()
    };
    let mut plain = engine(4);
    let p = placed(plain.create(&g));
    let busy = plain.topology().nodes_of(&p.cpus);
    assert_eq!(busy.len(), 1);
    let busy = busy.iter().next().unwrap();
    // The node that would give the CPUs is made the busiest: they come from the idlest.
    let u: Vec<UsageSample> = (0..4)
        .map(|i| {
            sample(
                &format!("c{i}"),
                if i == busy { 1800 } else { 100 * i as u64 },
            )
        })
        .collect();
    let mut e = with_hint(engine(4), &u);
    let p = placed(e.create(&g));
    assert!(p.exclusive);
    let idlest = if busy == 0 { 1 } else { 0 };
    assert_eq!(e.topology().nodes_of(&p.cpus), NodeSet::from_ids([idlest]));
}

#[test]
fn the_hint_follows_removals_and_moves() {
    let mut e = with_hint(engine(4), &usage4());
    let of = |e: &Engine| e.usage_hint().unwrap().node_usage_milli().to_vec();
    assert_eq!(of(&e), vec![1500, 900, 50, 400]);
    e.remove("c1");
    assert_eq!(of(&e), vec![1500, 0, 50, 400]);
    e.relocate("c0", numa_pool(&e, 2)).unwrap();
    assert_eq!(of(&e), vec![0, 0, 1550, 400]);
    assert_eq!(e.usage_hint().unwrap().usage_of("c0"), Some(1500));
}

#[test]
fn a_node_without_shared_cpus_counts_as_full() {
    let e = engine(1);
    let h = UsageHint::measure(&e.view(), &[sample("c0", 100)]);
    assert_eq!(
        h.pressure(e.topology(), &NodeSet::from_ids([0]), 0),
        u64::MAX
    );
    assert_eq!(h.pressure(e.topology(), &NodeSet::from_ids([0]), 4), 25);
}

#[test]
fn the_rebalancer_hands_a_hint_only_when_placing_by_usage() {
    let e = engine(4);
    let u = usage4();
    assert_eq!(
        Rebalancer::new(RebalanceConfig::default()).hint(&e, &u),
        None
    );
    let r = Rebalancer::new(RebalanceConfig::usage_aware());
    assert_eq!(
        r.hint(&e, &u).unwrap().node_usage_milli(),
        [1500, 900, 50, 400]
    );
}

#[test]
fn the_cooldown_is_waived_off_an_oversubscribed_node_only_with_the_waiver() {
    // Node 0 burns 4.5 CPUs on 4; the moves are not applied, so it stays so.
    let e = engine(12);
    let moved = |waiver| {
        let mut r = Rebalancer::new(RebalanceConfig {
            max_moves: 1,
            cooldown_waiver: waiver,
            ..RebalanceConfig::default()
        });
        let u = hot_node0();
        (1..=6)
            .flat_map(|t| r.plan(&e, &u, t, &never))
            .map(|m| m.id)
            .collect::<Vec<_>>()
    };
    assert_eq!(moved(CooldownWaiver::Never), ["c0", "c4", "c8"]);
    assert_eq!(
        moved(CooldownWaiver::OffOversubscribed),
        ["c0", "c0", "c0", "c0"]
    );
    // Not oversubscribed (1.2 CPUs on node 0's 4): the cooldown holds even with the waiver.
    let mut r = Rebalancer::new(RebalanceConfig {
        max_moves: 1,
        cooldown_waiver: CooldownWaiver::OffOversubscribed,
        ..RebalanceConfig::default()
    });
    let u: Vec<UsageSample> = (0..12)
        .map(|i| sample(&format!("c{i}"), if i % 4 == 0 { 400 } else { 50 }))
        .collect();
    let ids: Vec<String> = (1..=6)
        .flat_map(|t| r.plan(&e, &u, t, &never))
        .map(|m| m.id)
        .collect();
    assert_eq!(ids, ["c0", "c4", "c8"]);
}
