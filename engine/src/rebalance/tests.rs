//! Unit tests of the rebalancer's plan and of `Engine::relocate`.

use super::*;
use crate::request::ContainerRequest;
use crate::topology::fixtures::{engine_on, machine, placed};
use crate::types::{EngineConfig, Existing};

/// One socket, 4 NUMA nodes of 4 single-thread CPUs; `n` Burstable containers `c0..` of
/// request 500m and limit 1, placed round robin: `ci` on node `i % 4`.
pub(super) fn engine(n: usize) -> Engine {
    let mut e = engine_on(&machine(1, 1, 4, 1, 4), EngineConfig::default());
    for i in 0..n {
        placed(e.create(&burstable(&format!("c{i}"), 500, 1000)));
        assert_eq!(node(&e, &format!("c{i}")), i % 4, "c{i}");
    }
    e
}

pub(super) fn burstable(id: &str, request: u64, limit: u64) -> ContainerRequest {
    ContainerRequest {
        id: id.into(),
        cpu_request_milli: request,
        cpu_limit_milli: Some(limit),
        ..Default::default()
    }
}

pub(super) fn node(e: &Engine, id: &str) -> usize {
    let g = e.grant(id).unwrap();
    assert_eq!(g.nodes.len(), 1, "{id} on one node");
    g.nodes.iter().next().unwrap()
}

pub(super) fn sample(id: &str, usage_milli: u64) -> UsageSample {
    UsageSample {
        id: id.into(),
        usage_milli,
    }
}

/// 12 containers: c0, c4 and c8 (node 0) burn 1.5 CPUs each, the others 100m.
pub(super) fn hot_node0() -> Vec<UsageSample> {
    (0..12)
        .map(|i| sample(&format!("c{i}"), if i % 4 == 0 { 1500 } else { 100 }))
        .collect()
}

pub(super) fn never(_: &str) -> bool {
    false
}

pub(super) fn numa_pool(e: &Engine, node: usize) -> PoolId {
    numa_pools(e.topology())[node].unwrap()
}

pub(super) fn cfg(max_moves: usize) -> RebalanceConfig {
    RebalanceConfig {
        max_moves,
        ..RebalanceConfig::default()
    }
}

#[test]
fn acts_only_after_the_window_and_every_round_while_above() {
    let e = engine(12);
    let mut r = Rebalancer::new(cfg(1));
    let u = hot_node0();
    assert!(r.plan(&e, &u, 1, &never).is_empty());
    assert!(r.plan(&e, &u, 2, &never).is_empty());
    assert_eq!(r.rounds_above(), 2);
    let m = r.plan(&e, &u, 3, &never);
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(r.rounds_above(), 3);
    assert_eq!(
        r.plan(&e, &u, 4, &never).len(),
        1,
        "still above: acts again"
    );
    // A balanced round in between starts the window again.
    let balanced: Vec<UsageSample> = (0..12).map(|i| sample(&format!("c{i}"), 200)).collect();
    assert!(r.plan(&e, &balanced, 5, &never).is_empty());
    assert_eq!(r.rounds_above(), 0);
}

#[test]
fn no_move_when_balanced() {
    let e = engine(12);
    let mut r = Rebalancer::new(cfg(2));
    let u: Vec<UsageSample> = (0..12).map(|i| sample(&format!("c{i}"), 300)).collect();
    for t in 0..10 {
        assert!(r.plan(&e, &u, t, &never).is_empty());
    }
}

#[test]
fn picks_the_best_moves_recomputing_after_each_and_stops_when_none_lowers_it() {
    let e = engine(12);
    // node usage 4500, 300, 300, 300: mean 1350, imbalance 3.33.
    let mut r = Rebalancer::new(cfg(5));
    let u = hot_node0();
    r.plan(&e, &u, 1, &never);
    r.plan(&e, &u, 2, &never);
    let m = r.plan(&e, &u, 3, &never);
    // A hot one to node 1 (4500 -> 3000 / 1800), another to node 2 (1500 / 1800 / 1800);
    // then no single move lowers the maximum (two nodes at 1800).
    assert_eq!(m.len(), 2, "{m:?}");
    assert_eq!((m[0].id.as_str(), m[1].id.as_str()), ("c0", "c4"));
    assert_eq!((m[0].to, m[1].to), (numa_pool(&e, 1), numa_pool(&e, 2)));
    assert_eq!(m[0].from, numa_pool(&e, 0));
    let MoveReason::UsageImbalance { before, after, .. } = m[0].why;
    assert!((before - 4500.0 / 1350.0).abs() < 1e-9 && (after - 3000.0 / 1350.0).abs() < 1e-9);
    let MoveReason::UsageImbalance {
        before: b2,
        after: a2,
        usage_milli,
    } = m[1].why;
    assert_eq!((b2, usage_milli), (after, 1500));
    assert!((a2 - 1800.0 / 1350.0).abs() < 1e-9);
}

#[test]
fn respects_max_moves() {
    let e = engine(12);
    let mut r = Rebalancer::new(cfg(1));
    let u = hot_node0();
    let moves: Vec<_> = (1..=3).flat_map(|t| r.plan(&e, &u, t, &never)).collect();
    assert_eq!(moves.len(), 1);
    assert_eq!(r.plan(&e, &u, 4, &never).len(), 1);
}

#[test]
fn respects_the_cooldown_and_forgets_removed_containers() {
    let mut e = engine(12);
    let mut r = Rebalancer::new(cfg(1));
    let u = hot_node0();
    // The moves are not applied: the same picture every round.
    let mut ids = Vec::new();
    for t in 1..=70 {
        ids.extend(r.plan(&e, &u, t, &never).into_iter().map(|m| (t, m.id)));
    }
    let want: Vec<(u64, String)> = [(3, "c0"), (4, "c4"), (5, "c8"), (63, "c0")]
        .iter()
        .map(|(t, id)| (*t, id.to_string()))
        .collect();
    assert_eq!(ids[..4], want[..]);
    assert_eq!(r.moved_at.len(), 3);
    e.remove("c4");
    r.plan(&e, &u, 71, &never);
    assert!(
        !r.moved_at.contains_key("c4"),
        "removed containers are forgotten"
    );
}

#[test]
fn never_moves_opted_out_containers() {
    let e = engine(12);
    let mut r = Rebalancer::new(cfg(2));
    let u = hot_node0();
    let out = |id: &str| id == "c0" || id == "c4";
    let moves: Vec<_> = (1..=3).flat_map(|t| r.plan(&e, &u, t, &out)).collect();
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!(moves[0].id, "c8");
}

#[test]
fn never_moves_exclusive_grants_nor_counts_their_usage() {
    let mut e = engine(8);
    let p = placed(e.create(&burstable("g", 2000, 2000)));
    assert!(p.exclusive);
    let mut u: Vec<UsageSample> = (0..8).map(|i| sample(&format!("c{i}"), 200)).collect();
    u.push(sample("g", 2000));
    // By usage: balanced, g's usage not counted.
    let by_usage = RebalanceConfig {
        by: BalanceBy::Usage,
        ..cfg(2)
    };
    let mut r = Rebalancer::new(by_usage);
    for t in 0..10 {
        assert!(r.plan(&e, &u, t, &never).is_empty());
    }
    // By usage per shared CPU, g's node (2 shared CPUs left) is the busiest: its shared
    // containers move, never g.
    let mut r = Rebalancer::new(cfg(2));
    let moves: Vec<Move> = (0..10).flat_map(|t| r.plan(&e, &u, t, &never)).collect();
    assert!(!moves.is_empty());
    let g_node = numa_pool(&e, node(&e, "g"));
    assert!(
        moves.iter().all(|m| m.id != "g" && m.from == g_node),
        "{moves:?}"
    );
    let to = numa_pool(&e, (node(&e, "g") + 1) % 4);
    assert_eq!(
        e.relocate("g", to),
        Err(RelocateError::Exclusive("g".into()))
    );
}

#[test]
fn no_move_when_nothing_fits() {
    let mut e = engine(1);
    for (i, id) in ["f1", "f2", "f3"].iter().enumerate() {
        placed(e.create(&burstable(id, 3900, 4000)));
        assert_eq!(node(&e, id), i + 1);
    }
    let mut r = Rebalancer::new(cfg(2));
    let u = vec![sample("c0", 3000), sample("f1", 0), sample("f2", 0)];
    for t in 0..10 {
        assert!(r.plan(&e, &u, t, &never).is_empty());
    }
    let to = numa_pool(&e, 1);
    let before = e.clone();
    let err = e.relocate("c0", to);
    assert_eq!(
        err,
        Err(RelocateError::DoesNotFit {
            id: "c0".into(),
            pool: to
        })
    );
    assert_eq!(e, before, "a refused move changes nothing");
}

#[test]
fn relocate_charges_the_target_as_a_restore_from_records_would() {
    let mut e = engine(6);
    let start = e.clone();
    let to = numa_pool(&e, 3);
    let ups = e.relocate("c1", to).unwrap();
    assert_eq!(ups.len(), 1);
    assert_eq!(&*ups[0].container_id, "c1");
    assert_eq!(ups[0].cpus, e.topology().pools[to].cpus);
    assert_eq!(node(&e, "c1"), 3);
    assert!(e
        .record("c1")
        .unwrap()
        .contains(&format!("pool={}", e.topology().pools[to].name)));
    assert_eq!(e.pool_load(to).request_milli, 1000);
    assert_eq!(e.pool_load(numa_pool(&e, 1)).request_milli, 500);
    // The same state as a fresh engine adopting every grant from its record.
    let existing: Vec<Existing> = (0..6)
        .map(|i| {
            let id = format!("c{i}");
            Existing {
                request: burstable(&id, 500, 1000),
                cpus: Some(e.grant(&id).unwrap().cpus),
                mems: None,
                record: e.record(&id),
            }
        })
        .collect();
    let mut restored = Engine::new(e.topology().clone(), EngineConfig::default());
    let report = restored.restore(&existing);
    assert_eq!(report.from_record, 6);
    assert_eq!(restored, e);
    // And back: exactly where it started.
    e.relocate("c1", numa_pool(&e, 1)).unwrap();
    assert_eq!(e, start);
}

#[test]
fn relocate_refuses_unknown_containers_and_pools() {
    let mut e = engine(2);
    assert_eq!(
        e.relocate("nope", 1),
        Err(RelocateError::UnknownContainer("nope".into()))
    );
    assert_eq!(e.relocate("c0", 999), Err(RelocateError::NoSuchPool(999)));
}

#[test]
fn a_grant_over_several_nodes_counts_in_proportion_to_its_cpus_there() {
    let mut e = engine(0);
    let g = placed(e.create(&burstable("g", 2000, 2000)));
    assert!(g.exclusive);
    let g_node = node(&e, "g");
    // 5 CPUs fit no node of 4: the grant spans them all, 14 shared CPUs (2 are g's).
    let w = placed(e.create(&burstable("w", 5000, 6000)));
    assert_eq!(w.cpus.len(), 14);
    let u = [sample("w", 14_000)];
    let raw = nodes::Nodes::measure(&e.view(), &u, BalanceBy::Usage);
    let want: Vec<u64> = (0..4)
        .map(|n| if n == g_node { 2000 } else { 4000 })
        .collect();
    assert_eq!(raw.usage, want);
    // Per shared CPU every node carries the same: balanced.
    let per_cpu = nodes::Nodes::measure(&e.view(), &u, BalanceBy::UsagePerSharedCpu);
    assert_eq!(per_cpu.imbalance(), Some(1.0));
    // And it is never a candidate: it spans several nodes.
    let mut r = Rebalancer::new(RebalanceConfig {
        by: BalanceBy::Usage,
        window: 1,
        ..cfg(2)
    });
    assert!(r.plan(&e, &u, 1, &never).is_empty());
}

#[test]
fn the_report_shows_each_nodes_usage_and_the_imbalance() {
    let e = engine(12);
    let r = report(&e, &hot_node0(), BalanceBy::UsagePerSharedCpu);
    let usage: Vec<(u32, u64, usize)> = r
        .nodes
        .iter()
        .map(|n| (n.node, n.usage_milli, n.shared_cpus))
        .collect();
    assert_eq!(usage, [(0, 4500, 4), (1, 300, 4), (2, 300, 4), (3, 300, 4)]);
    // max 4500 over a mean of 1350.
    let imb = r.imbalance.expect("imbalance");
    assert!((imb - 4500.0 / 1350.0).abs() < 1e-9, "{imb}");
    let idle = report(&e, &[], BalanceBy::Usage);
    assert_eq!(idle.imbalance, None, "no usage, no imbalance");
    assert!(idle.nodes.iter().all(|n| n.usage_milli == 0));
}

/// The agent's first real run (two spinning containers on one of two nodes, idle ones on
/// both): one move evens the nodes; the round must not go on to trim 1.01 to 1.00 by moving
/// an idle container.
#[test]
fn stops_once_under_the_threshold() {
    let mut e = engine_on(&machine(1, 1, 2, 1, 4), EngineConfig::default());
    for i in 0..4 {
        placed(e.create(&burstable(&format!("c{i}"), 500, 1000)));
    }
    // c0 and c2 on node 0 spin; c1 and c3 (node 1) almost idle.
    let u: Vec<UsageSample> = (0..4)
        .map(|i| sample(&format!("c{i}"), if i % 2 == 0 { 1000 } else { 10 }))
        .collect();
    let mut r = Rebalancer::new(RebalanceConfig {
        window: 1,
        ..cfg(2)
    });
    let m = r.plan(&e, &u, 1, &never);
    assert_eq!(m.len(), 1, "one move evens the nodes: {m:?}");
    assert!(m[0].id == "c0" || m[0].id == "c2", "{m:?}");
}
