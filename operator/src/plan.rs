//! Observed state -> desired objects. Pure functions; the controllers only fetch and write.

use crate::resolve::{conflict_names, PolicyInput, PolicyStats};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use std::collections::HashMap;
use tap_api::{
    NodeTopology, NodeTopologySpec, PolicySource, TopologyPolicyStatus, CONDITION_CONFLICT,
    CONDITION_READY,
};

/// The field manager the operator applies with.
pub const FIELD_MANAGER: &str = "kunpeng-tap-operator";

/// The NodeTopology the operator wants for a node (spec and owner reference only: server-side
/// apply leaves the agent's status alone).
pub fn desired_node_topology(
    node_name: &str,
    node_uid: &str,
    winner: Option<&PolicyInput>,
) -> NodeTopology {
    let spec = NodeTopologySpec {
        node_name: node_name.to_string(),
        policy: winner.map(|p| p.spec.settings.clone()),
        source: winner.map(|p| PolicySource {
            name: p.name.clone(),
            uid: p.uid.clone(),
            generation: p.generation,
        }),
    };
    NodeTopology {
        metadata: ObjectMeta {
            name: Some(node_name.to_string()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node_name.to_string(),
                uid: node_uid.to_string(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    FIELD_MANAGER.to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        spec,
        status: None,
    }
}

/// Whether the existing object differs from the desired one in what the operator owns.
pub fn needs_apply(existing: Option<&NodeTopology>, desired: &NodeTopology) -> bool {
    let Some(e) = existing else { return true };
    if e.spec != desired.spec {
        return true;
    }
    let owned = |nt: &NodeTopology| -> Vec<(String, String)> {
        nt.metadata
            .owner_references
            .iter()
            .flatten()
            .filter(|o| o.kind == "Node")
            .map(|o| (o.name.clone(), o.uid.clone()))
            .collect()
    };
    if owned(e) != owned(desired) {
        return true;
    }
    let label = |nt: &NodeTopology| {
        nt.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/managed-by").cloned())
    };
    label(e) != label(desired)
}

/// An event to publish about an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventSpec {
    pub warning: bool,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
}

/// The event for a node whose assignment changes (none when it does not).
pub fn assignment_event(
    existing: Option<&NodeTopology>,
    desired: &NodeTopology,
) -> Option<EventSpec> {
    let old = existing.and_then(|e| e.spec.source.as_ref().map(|s| s.name.as_str()));
    let new = desired.spec.source.as_ref().map(|s| s.name.as_str());
    let node = &desired.spec.node_name;
    let kind = desired
        .spec
        .policy
        .as_ref()
        .map(|p| p.policy.as_str())
        .unwrap_or("");
    match (old, new) {
        (None, None) => None,
        (a, b) if a == b => {
            if existing.map(|e| &e.spec.policy) != Some(&desired.spec.policy) {
                Some(EventSpec {
                    warning: false,
                    reason: "PolicyUpdated",
                    action: "Apply",
                    note: format!(
                        "node {node}: TopologyPolicy {} changed ({kind})",
                        b.unwrap_or("-")
                    ),
                })
            } else {
                None
            }
        }
        (_, Some(b)) => Some(EventSpec {
            warning: false,
            reason: "PolicyAssigned",
            action: "Apply",
            note: match old {
                Some(a) => format!("node {node}: TopologyPolicy {b} ({kind}) replaces {a}"),
                None => format!("node {node}: TopologyPolicy {b} ({kind}) assigned"),
            },
        }),
        (Some(a), None) => Some(EventSpec {
            warning: false,
            reason: "PolicyRemoved",
            action: "Apply",
            note: format!(
                "node {node}: no TopologyPolicy matches any more (was {a}); the agent uses its flags"
            ),
        }),
    }
}

fn condition(
    old: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: i64,
    now: &Time,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_string();
    // Keep the transition time while the status holds.
    let since = old
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.to_string(),
        status,
        reason: reason.to_string(),
        message,
        observed_generation: Some(generation),
        last_transition_time: since,
    }
}

/// A TopologyPolicy's status from the full pass.
pub fn policy_status(
    p: &PolicyInput,
    stats: &PolicyStats,
    invalid: Option<&str>,
    old: Option<&TopologyPolicyStatus>,
    now: &Time,
) -> TopologyPolicyStatus {
    let old_conds: &[Condition] = old.map(|o| o.conditions.as_slice()).unwrap_or(&[]);
    let g = p.generation;
    let ready = match invalid {
        Some(why) => condition(
            old_conds,
            CONDITION_READY,
            false,
            "InvalidSelector",
            format!("nodeSelector is invalid: {why}"),
            g,
            now,
        ),
        None => condition(
            old_conds,
            CONDITION_READY,
            true,
            "Resolved",
            format!(
                "applied to {} node(s); overridden by higher precedence on {}",
                stats.matched, stats.overridden
            ),
            g,
            now,
        ),
    };
    let conflict = if stats.conflicts.is_empty() {
        condition(
            old_conds,
            CONDITION_CONFLICT,
            false,
            "NoOverlap",
            "no policy of the same priority selects the same nodes".into(),
            g,
            now,
        )
    } else {
        let nodes: u32 = stats.conflicts.values().copied().max().unwrap_or(0);
        let names: Vec<&str> = conflict_names(&stats.conflicts).into_iter().collect();
        condition(
            old_conds,
            CONDITION_CONFLICT,
            true,
            "SamePriorityOverlap",
            format!(
                "selects the same nodes as {} at priority {} (up to {nodes} node(s)); the older policy, then the name, decides",
                names.join(", "),
                p.spec.priority
            ),
            g,
            now,
        )
    };
    TopologyPolicyStatus {
        matched_nodes: stats.matched as i32,
        overridden_nodes: stats.overridden as i32,
        conditions: vec![ready, conflict],
        observed_generation: Some(g),
    }
}

/// Whether two statuses differ in anything but condition times.
pub fn status_differs(old: Option<&TopologyPolicyStatus>, new: &TopologyPolicyStatus) -> bool {
    let Some(old) = old else { return true };
    let strip = |s: &TopologyPolicyStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = Time(jiff::Timestamp::UNIX_EPOCH);
        }
        s
    };
    strip(old) != strip(new)
}

/// The event when a policy's Conflict condition turns true.
pub fn conflict_event(
    old: Option<&TopologyPolicyStatus>,
    new: &TopologyPolicyStatus,
) -> Option<EventSpec> {
    let is_true = |s: Option<&TopologyPolicyStatus>| {
        s.and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION_CONFLICT))
            .map(|c| (c.status == "True", c.message.clone()))
    };
    match (is_true(old), is_true(Some(new))) {
        (Some((false, _)) | None, Some((true, msg))) => Some(EventSpec {
            warning: true,
            reason: "Conflict",
            action: "Resolve",
            note: msg,
        }),
        _ => None,
    }
}

/// NodeTopology objects to delete: their Node is gone, or the Node of that name is a new one
/// (different uid) and the object is not yet re-owned. Returns `(name, uid)` for a
/// precondition on the delete.
pub fn orphans<'a>(
    node_topologies: impl IntoIterator<Item = &'a NodeTopology>,
    nodes: &HashMap<String, String>,
) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for nt in node_topologies {
        let Some(name) = nt.metadata.name.as_deref() else {
            continue;
        };
        if !nodes.contains_key(name) {
            out.push((name.to_string(), nt.metadata.uid.clone()));
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::Resolver;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use std::collections::BTreeMap;
    use tap_api::{PolicyName, PolicySettings, TopologyPolicySpec};

    fn policy(name: &str, prio: i32) -> PolicyInput {
        PolicyInput {
            name: name.into(),
            uid: Some(format!("uid-{name}")),
            generation: 3,
            created: Some(1),
            spec: TopologyPolicySpec {
                node_selector: LabelSelector::default(),
                settings: PolicySettings {
                    cluster_affinity: false,
                    ..tap_api::fixtures::settings_all_set()
                },
                priority: prio,
            },
        }
    }

    fn now() -> Time {
        Time(jiff::Timestamp::from_second(1_000_000).unwrap())
    }

    #[test]
    fn desired_object_carries_policy_source_and_owner() {
        let p = policy("p1", 0);
        let nt = desired_node_topology("n1", "node-uid", Some(&p));
        assert_eq!(nt.metadata.name.as_deref(), Some("n1"));
        let o = &nt.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (o.kind.as_str(), o.uid.as_str(), o.controller),
            ("Node", "node-uid", Some(true))
        );
        let s = nt.spec.policy.as_ref().unwrap();
        assert_eq!(s.policy, PolicyName::NumaAware);
        assert!(s.memory_topology && !s.annotations_allowed);
        assert_eq!(s.reserved_cpus, "0-1");
        // Who may use the reserved CPUs travels with them, per node group.
        assert_eq!(s.reserved_cpus_for.namespaces, ["kube-system"]);
        assert_eq!(
            s.reserved_cpus_for.annotation,
            tap_api::ReservedAnnotation::Honoured
        );
        assert_eq!(s.rebalance, tap_api::RebalanceMode::Usage);
        let src = nt.spec.source.as_ref().unwrap();
        assert_eq!((src.name.as_str(), src.generation), ("p1", 3));
        // No policy: no assignment.
        let none = desired_node_topology("n1", "node-uid", None);
        assert!(none.spec.policy.is_none() && none.spec.source.is_none());
        // Serialized for server-side apply: the unassigned spec has no policy fields at all.
        let v = serde_json::to_value(&none).unwrap();
        assert!(v["spec"].get("policy").is_none());
        assert!(v.get("status").is_none() || v["status"].is_null());
    }

    #[test]
    fn apply_only_when_something_owned_changed() {
        let p = policy("p1", 0);
        let d = desired_node_topology("n1", "u", Some(&p));
        assert!(needs_apply(None, &d));
        let mut existing = d.clone();
        existing.status = Some(Default::default());
        existing.metadata.resource_version = Some("42".into());
        assert!(!needs_apply(Some(&existing), &d));
        let d2 = desired_node_topology("n1", "u2", Some(&p));
        assert!(needs_apply(Some(&existing), &d2), "node re-created");
        let mut p2 = p.clone();
        p2.generation = 4;
        let d3 = desired_node_topology("n1", "u", Some(&p2));
        assert!(needs_apply(Some(&existing), &d3), "policy edited");
    }

    #[test]
    fn events_describe_assignment_changes() {
        let a = policy("a", 0);
        let b = policy("b", 1);
        let da = desired_node_topology("n", "u", Some(&a));
        let db = desired_node_topology("n", "u", Some(&b));
        let dn = desired_node_topology("n", "u", None);
        assert_eq!(
            assignment_event(None, &da).unwrap().reason,
            "PolicyAssigned"
        );
        let e = assignment_event(Some(&da), &db).unwrap();
        assert!(e.note.contains("b (numa-aware) replaces a"), "{}", e.note);
        assert_eq!(
            assignment_event(Some(&db), &dn).unwrap().reason,
            "PolicyRemoved"
        );
        assert_eq!(assignment_event(Some(&da), &da), None);
        assert_eq!(assignment_event(None, &dn), None);
        let mut a2 = a.clone();
        a2.spec.settings.policy = PolicyName::TopologyAware;
        let da2 = desired_node_topology("n", "u", Some(&a2));
        assert_eq!(
            assignment_event(Some(&da), &da2).unwrap().reason,
            "PolicyUpdated"
        );
    }

    #[test]
    fn status_reports_matches_and_conflicts_and_keeps_transition_times() {
        let r = Resolver::new(vec![policy("a", 5), policy("b", 5), policy("c", 1)]);
        let nodes = vec![crate::resolve::NodeInput {
            name: "n".into(),
            uid: "u".into(),
            labels: BTreeMap::new(),
        }];
        let fp = r.full_pass(&nodes);
        let ra = r.rank_of("a").unwrap();
        let st = policy_status(&r.policies[ra], &fp.stats[ra], None, None, &now());
        assert_eq!(st.matched_nodes, 1);
        assert_eq!(st.observed_generation, Some(3));
        let conflict = st
            .conditions
            .iter()
            .find(|c| c.type_ == "Conflict")
            .unwrap();
        assert_eq!(conflict.status, "True");
        assert!(conflict.message.contains('b'), "{}", conflict.message);
        assert!(conflict_event(None, &st).is_some());
        let rc = r.rank_of("c").unwrap();
        let sc = policy_status(&r.policies[rc], &fp.stats[rc], None, None, &now());
        assert_eq!((sc.matched_nodes, sc.overridden_nodes), (0, 1));
        assert_eq!(
            sc.conditions
                .iter()
                .find(|c| c.type_ == "Conflict")
                .unwrap()
                .status,
            "False"
        );
        // Recomputed later with the same facts: no change, same transition time.
        let later = Time(jiff::Timestamp::from_second(2_000_000).unwrap());
        let again = policy_status(&r.policies[ra], &fp.stats[ra], None, Some(&st), &later);
        assert!(!status_differs(Some(&st), &again));
        assert_eq!(
            again.conditions[0].last_transition_time,
            st.conditions[0].last_transition_time
        );
        assert!(conflict_event(Some(&st), &again).is_none());
        // Invalid selector.
        let bad = policy_status(
            &r.policies[ra],
            &fp.stats[ra],
            Some("bad op"),
            Some(&st),
            &later,
        );
        assert!(status_differs(Some(&st), &bad));
        let ready = bad.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidSelector")
        );
        assert_eq!(ready.last_transition_time, later);
    }

    #[test]
    fn orphans_are_node_topologies_without_a_node() {
        let nt = |n: &str| desired_node_topology(n, "u", None);
        let all = [nt("a"), nt("b"), nt("c")];
        let nodes: HashMap<String, String> = [("a".to_string(), "u".to_string())].into();
        let o = orphans(all.iter(), &nodes);
        assert_eq!(
            o.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["b", "c"]
        );
    }
}
