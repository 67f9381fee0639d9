use super::*;
use crate::agent::tests::{agent, burstable};
use tap_engine::rebalance::RebalanceConfig;

/// Usage of every placed container: `hot` ones burn 8 CPUs, the others 0.1.
fn usage(ids: &[String], hot: &[&str]) -> Vec<UsageSample> {
    ids.iter()
        .map(|id| UsageSample {
            id: id.clone(),
            usage_milli: if hot.contains(&id.as_str()) {
                8000
            } else {
                100
            },
        })
        .collect()
}

/// Hot containers crowded on one NUMA node: after the window the rebalancer moves one (not the
/// opted-out one) to another node, the engine holds the new placement, and the Event says so.
#[test]
fn a_crowded_node_sheds_a_hot_container_after_the_window() {
    let a = agent("synthetic-2s-4numa-96c-gpu");
    let mut rx = a.notes().attach().expect("notes");
    let mut ids = Vec::new();
    for i in 0..8 {
        let c = burstable(&format!("c{i}"), 1, 2);
        a.create(&c);
        ids.push(c.id.clone());
    }
    let _ = std::iter::from_fn(|| rx.try_recv().ok()).count();
    let node_of = |id: &str| a.snapshot().grant(id).map(|g| g.nodes.to_string());
    // The containers sharing the first one's node get hot.
    let first = node_of("c0").expect("c0 placed");
    let hot: Vec<&str> = ids
        .iter()
        .map(String::as_str)
        .filter(|id| node_of(id).as_deref() == Some(first.as_str()))
        .collect();
    assert!(hot.len() >= 2, "two containers on node {first}: {hot:?}");
    let opted: HashSet<String> = [hot[0].to_string()].into();
    let mut r = Rebalancer::new(RebalanceConfig::default());
    let sample = usage(&ids, &hot);
    assert!(
        a.rebalance_round(&mut r, &sample, 1, &opted).is_empty(),
        "round 1 of 3"
    );
    assert!(
        a.rebalance_round(&mut r, &sample, 2, &opted).is_empty(),
        "round 2 of 3"
    );
    let moved = a.rebalance_round(&mut r, &sample, 3, &opted);
    assert!(!moved.is_empty(), "round 3 acts");
    assert!(
        moved.iter().all(|m| m.id != hot[0]),
        "the opted-out container moved"
    );
    // A hot container left the crowded node (a cold one may take its place: the round's
    // second move evens out what is left).
    let shed = moved
        .iter()
        .find(|m| hot.contains(&m.id.as_str()))
        .expect("a hot container moved");
    assert_ne!(
        node_of(&shed.id).as_deref(),
        Some(first.as_str()),
        "{shed:?}"
    );
    for m in &moved {
        a.note_rebalanced(&burstable(&m.id, 1, 2), m);
    }
    let n = rx.try_recv().expect("a note");
    assert_eq!(n.reason(), "TopologyRebalanced");
    assert!(n.message.starts_with("moved from numa"), "{n:?}");
}

#[test]
fn the_annotation_and_the_skip_label_opt_out() {
    let mut c = burstable("x", 1, 2);
    assert!(!opts_out(&c));
    c.pod
        .annotations
        .insert(REBALANCE_KEY.into(), "false".into());
    assert!(opts_out(&c));
    c.pod
        .annotations
        .insert(REBALANCE_KEY.into(), "true".into());
    assert!(!opts_out(&c));
    c.pod.labels.insert(SKIP_KEY.into(), "true".into());
    assert!(opts_out(&c));
}

/// With the agent's settings (`usage_aware`) a round leaves the engine a usage hint, so the
/// next create goes to the least busy node; turning rebalancing off clears it.
#[test]
fn a_round_leaves_a_usage_hint_and_turning_off_clears_it() {
    let a = agent("synthetic-2s-4numa-96c-gpu");
    let mut ids = Vec::new();
    for i in 0..8 {
        let c = burstable(&format!("c{i}"), 1, 2);
        a.create(&c);
        ids.push(c.id.clone());
    }
    let mut r = Rebalancer::new(RebalanceConfig::usage_aware());
    a.rebalance_round(&mut r, &usage(&ids, &[]), 1, &HashSet::new());
    assert!(a.snapshot().usage_hint().is_some(), "placement by usage");
    a.clear_usage_hint();
    assert!(a.snapshot().usage_hint().is_none(), "placement by requests");
    let mut by_requests = Rebalancer::new(RebalanceConfig::default());
    a.rebalance_round(&mut by_requests, &usage(&ids, &[]), 2, &HashSet::new());
    assert!(
        a.snapshot().usage_hint().is_none(),
        "the default places by requests"
    );
}
