//! Tests of the usage replay: the rebalancer moves only the moved, and placement by usage.

use super::*;
use crate::gen::{generate, GenParams};

fn machine() -> Machine {
    Machine::fixture("synthetic-2s-4numa-96c-gpu")
}

/// 400 generated Pods of `seed` at 2x overcommit on `m`, its GPUs asked for.
fn trace(m: &Machine, seed: u64) -> Trace {
    let mut p = GenParams::new(seed, m.cpus() as u64, m.memory_bytes(), 2.0);
    p.pods = 400;
    p.gpus = m.gpus.len() as u32;
    generate(&p)
}

#[test]
fn the_rebalancer_moves_only_the_moved_and_lowers_the_imbalance() {
    let m = machine();
    let t = trace(&m, 3);
    let pairs = compare(
        &m,
        &t,
        UsageModel::new(3),
        (10.0, Measure::Demand),
        RebalanceConfig::default(),
    );
    assert_eq!(pairs.len(), 2);
    for pair in &pairs {
        let (a, b) = (&pair.without, &pair.with);
        assert_eq!(a.moves + a.moved_containers, 0, "{}", pair.label);
        assert!(b.moves > 0, "{}: no moves", pair.label);
        assert_eq!((b.neighbour_updates, b.refused_moves), (0, 0));
        assert_eq!(a.rounds.len(), b.rounds.len());
        let (before, after) = (
            a.mean(Figure::UsagePerSharedCpu),
            b.mean(Figure::UsagePerSharedCpu),
        );
        assert!(after < before, "{}: {before} -> {after}", pair.label);
        assert!(a.p95(Figure::Usage) >= a.mean(Figure::Usage) * 0.99);
    }
}

/// Placement by usage takes effect only with the rebalancer (it hands the hint), and moves
/// stay clean. Whether it lowers the imbalance depends on the machine and the load: on this
/// small fixture it does not for topology-aware (1.100 by requests, 1.115 by usage, seed 5),
/// on the largest one it does (docs/measurements/sim.md), so that is not asserted here.
#[test]
fn placing_by_usage_changes_placements_only_with_the_rebalancer() {
    let m = machine();
    let t = trace(&m, 5);
    let run = |cfg| compare(&m, &t, UsageModel::new(5), (10.0, Measure::Demand), cfg);
    let usage = RebalanceConfig::usage_aware();
    let requests = RebalanceConfig {
        place: tap_engine::PlaceBy::Requests,
        ..usage
    };
    for (a, b) in run(requests).iter().zip(run(usage).iter()) {
        assert_eq!(
            a.without, b.without,
            "{}: a hint without rebalancer",
            a.label
        );
        assert_ne!(
            a.with.rounds, b.with.rounds,
            "{}: the hint changed nothing",
            a.label
        );
        assert_eq!((b.with.neighbour_updates, b.with.refused_moves), (0, 0));
        assert!(b.with.moves > 0, "{}", a.label);
    }
}
