//! Which TopologyPolicy applies to which Node: pure, no I/O.
//!
//! Precedence among the policies whose selector matches a node: higher `priority`, then the
//! older (creation time), then the smaller name. A policy with an invalid selector matches
//! nothing (its status says why). Two matching policies with the same priority are a conflict:
//! both get `Conflict=True`, and precedence still picks one, deterministically.

use crate::selector::Selector;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use tap_api::TopologyPolicySpec;

/// What the resolver needs of a TopologyPolicy.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyInput {
    pub name: String,
    pub uid: Option<String>,
    pub generation: i64,
    /// Creation time as seconds since the epoch (missing = newest).
    pub created: Option<i64>,
    pub spec: TopologyPolicySpec,
}

/// What the resolver needs of a Node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeInput {
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
}

/// The policies compiled and ranked, with an index from label pairs to the policies that
/// require them, so a node is checked only against policies it can match.
#[derive(Debug, Clone)]
pub struct Resolver {
    /// The inputs, sorted by precedence (index = rank; 0 wins).
    pub policies: Vec<PolicyInput>,
    selectors: Vec<Option<Selector>>,
    /// Why a policy's selector is invalid, by rank.
    pub invalid: Vec<Option<String>>,
    index: HashMap<(String, String), Vec<usize>>,
    /// Ranks that must be checked against every node.
    unindexed: Vec<usize>,
}

/// Per-policy outcome of a full pass, by rank.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyStats {
    /// Nodes this policy won.
    pub matched: u32,
    /// Nodes it matches where a policy of higher precedence won.
    pub overridden: u32,
    /// Policies of the same priority that match some of the same nodes, with the node count.
    pub conflicts: BTreeMap<String, u32>,
}

/// The result of resolving every node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FullPass {
    /// The winning policy's rank, per node (same order as the nodes given).
    pub assignments: Vec<Option<usize>>,
    /// By rank.
    pub stats: Vec<PolicyStats>,
}

fn precedence(a: &PolicyInput, b: &PolicyInput) -> std::cmp::Ordering {
    b.spec
        .priority
        .cmp(&a.spec.priority)
        .then_with(|| {
            a.created
                .unwrap_or(i64::MAX)
                .cmp(&b.created.unwrap_or(i64::MAX))
        })
        .then_with(|| a.name.cmp(&b.name))
}

impl Resolver {
    pub fn new(mut policies: Vec<PolicyInput>) -> Resolver {
        policies.sort_by(precedence);
        let mut selectors = Vec::with_capacity(policies.len());
        let mut invalid = Vec::with_capacity(policies.len());
        let mut index: HashMap<(String, String), Vec<usize>> = HashMap::new();
        let mut unindexed = Vec::new();
        for (rank, p) in policies.iter().enumerate() {
            match Selector::compile(&p.spec.node_selector) {
                Ok(s) => {
                    match s.index_keys() {
                        Some(keys) => {
                            for k in keys {
                                let bucket = index.entry(k).or_default();
                                if bucket.last() != Some(&rank) {
                                    bucket.push(rank);
                                }
                            }
                        }
                        None => unindexed.push(rank),
                    }
                    selectors.push(Some(s));
                    invalid.push(None);
                }
                Err(e) => {
                    selectors.push(None);
                    invalid.push(Some(e.to_string()));
                }
            }
        }
        Resolver {
            policies,
            selectors,
            invalid,
            index,
            unindexed,
        }
    }

    pub fn rank_of(&self, name: &str) -> Option<usize> {
        self.policies.iter().position(|p| p.name == name)
    }

    /// Ranks of every policy matching `labels`, ascending (the first wins).
    pub fn matching(&self, labels: &BTreeMap<String, String>) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::new();
        let consider = |rank: usize, out: &mut Vec<usize>| {
            if let Some(Some(sel)) = self.selectors.get(rank) {
                if sel.matches(labels) {
                    out.push(rank);
                }
            }
        };
        for &r in &self.unindexed {
            consider(r, &mut out);
        }
        if !self.index.is_empty() {
            for (k, v) in labels {
                // One allocation per label is the price of a HashMap<(String, String)> key; a
                // full pass over 5,000 nodes stays far below the budget (see the benchmark).
                if let Some(bucket) = self.index.get(&(k.clone(), v.clone())) {
                    for &r in bucket {
                        consider(r, &mut out);
                    }
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The policy that applies to a node with these labels.
    pub fn winner(&self, labels: &BTreeMap<String, String>) -> Option<&PolicyInput> {
        self.matching(labels).first().map(|&r| &self.policies[r])
    }

    /// Resolves every node and counts per policy.
    pub fn full_pass(&self, nodes: &[NodeInput]) -> FullPass {
        let mut stats = vec![PolicyStats::default(); self.policies.len()];
        let mut assignments = Vec::with_capacity(nodes.len());
        for n in nodes {
            let m = self.matching(&n.labels);
            let Some(&win) = m.first() else {
                assignments.push(None);
                continue;
            };
            assignments.push(Some(win));
            stats[win].matched += 1;
            for &r in &m[1..] {
                stats[r].overridden += 1;
            }
            // Same-priority overlaps (m is sorted by rank, so equal priorities are adjacent).
            for (i, &a) in m.iter().enumerate() {
                for &b in &m[i + 1..] {
                    if self.policies[a].spec.priority != self.policies[b].spec.priority {
                        break;
                    }
                    let (na, nb) = (&self.policies[a].name, &self.policies[b].name);
                    *stats[a].conflicts.entry(nb.clone()).or_default() += 1;
                    *stats[b].conflicts.entry(na.clone()).or_default() += 1;
                }
            }
        }
        FullPass { assignments, stats }
    }
}

/// Names of the policies in a conflict set, for messages.
pub fn conflict_names(c: &BTreeMap<String, u32>) -> BTreeSet<&str> {
    c.keys().map(|s| s.as_str()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
    use tap_api::{PolicyName, PolicySettings};

    pub fn policy(name: &str, prio: i32, created: i64, sel: &[(&str, &str)]) -> PolicyInput {
        PolicyInput {
            name: name.into(),
            uid: Some(format!("uid-{name}")),
            generation: 1,
            created: Some(created),
            spec: TopologyPolicySpec {
                node_selector: LabelSelector {
                    match_labels: (!sel.is_empty()).then(|| {
                        sel.iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect()
                    }),
                    match_expressions: None,
                },
                settings: PolicySettings {
                    policy: PolicyName::NumaAware,
                    ..PolicySettings::default()
                },
                priority: prio,
            },
        }
    }

    fn node(name: &str, labels: &[(&str, &str)]) -> NodeInput {
        NodeInput {
            name: name.into(),
            uid: format!("uid-{name}"),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn highest_priority_then_oldest_then_name_wins() {
        let r = Resolver::new(vec![
            policy("all", 0, 10, &[]),
            policy("arm", 10, 20, &[("arch", "arm64")]),
            policy("arm-old", 10, 5, &[("arch", "arm64")]),
            policy("gpu", 50, 30, &[("gpu", "yes")]),
        ]);
        let w =
            |labels: &[(&str, &str)]| r.winner(&node("n", labels).labels).map(|p| p.name.clone());
        assert_eq!(w(&[]).as_deref(), Some("all"));
        assert_eq!(w(&[("arch", "arm64")]).as_deref(), Some("arm-old"));
        assert_eq!(
            w(&[("arch", "arm64"), ("gpu", "yes")]).as_deref(),
            Some("gpu")
        );
        // Same priority and age: the name decides.
        let r = Resolver::new(vec![policy("b", 1, 1, &[]), policy("a", 1, 1, &[])]);
        assert_eq!(r.winner(&BTreeMap::new()).unwrap().name, "a");
    }

    #[test]
    fn no_match_means_no_policy() {
        let r = Resolver::new(vec![policy("arm", 0, 1, &[("arch", "arm64")])]);
        assert!(r.winner(&node("n", &[("arch", "amd64")]).labels).is_none());
        assert!(Resolver::new(vec![]).winner(&BTreeMap::new()).is_none());
    }

    #[test]
    fn invalid_selector_matches_nothing_and_is_reported() {
        let mut p = policy("bad", 100, 1, &[]);
        p.spec.node_selector.match_expressions = Some(vec![LabelSelectorRequirement {
            key: "a".into(),
            operator: "Near".into(),
            values: None,
        }]);
        let r = Resolver::new(vec![p, policy("ok", 0, 1, &[])]);
        assert_eq!(r.winner(&BTreeMap::new()).unwrap().name, "ok");
        let bad = r.rank_of("bad").unwrap();
        assert!(r.invalid[bad].as_deref().unwrap().contains("Near"));
    }

    #[test]
    fn full_pass_counts_matches_overrides_and_conflicts() {
        let r = Resolver::new(vec![
            policy("all", 0, 1, &[]),
            policy("arm", 10, 2, &[("arch", "arm64")]),
            policy("rack1", 10, 3, &[("rack", "1")]),
        ]);
        let nodes = vec![
            node("a", &[("arch", "arm64"), ("rack", "1")]),
            node("b", &[("arch", "arm64")]),
            node("c", &[("rack", "2")]),
        ];
        let fp = r.full_pass(&nodes);
        let name = |o: Option<usize>| o.map(|i| r.policies[i].name.as_str());
        assert_eq!(name(fp.assignments[0]), Some("arm"));
        assert_eq!(name(fp.assignments[1]), Some("arm"));
        assert_eq!(name(fp.assignments[2]), Some("all"));
        let st = |n: &str| &fp.stats[r.rank_of(n).unwrap()];
        assert_eq!(st("arm").matched, 2);
        assert_eq!(st("all").matched, 1);
        assert_eq!(st("all").overridden, 2);
        assert_eq!(st("rack1").matched, 0);
        assert_eq!(st("rack1").overridden, 1);
        assert_eq!(st("arm").conflicts.get("rack1"), Some(&1));
        assert_eq!(st("rack1").conflicts.get("arm"), Some(&1));
        assert!(st("all").conflicts.is_empty());
    }

    #[test]
    fn indexed_and_unindexed_policies_agree_with_brute_force() {
        // Selectors of every shape, compared with a plain scan over all policies.
        let mut ps = vec![
            policy("empty", 0, 1, &[]),
            policy("eq", 3, 2, &[("a", "1")]),
            policy("eq2", 3, 1, &[("a", "1"), ("b", "2")]),
        ];
        let mut p = policy("in", 5, 3, &[]);
        p.spec.node_selector.match_expressions = Some(vec![LabelSelectorRequirement {
            key: "b".into(),
            operator: "In".into(),
            values: Some(vec!["2".into(), "3".into()]),
        }]);
        ps.push(p);
        let mut p = policy("notin", 7, 3, &[]);
        p.spec.node_selector.match_expressions = Some(vec![LabelSelectorRequirement {
            key: "a".into(),
            operator: "NotIn".into(),
            values: Some(vec!["1".into()]),
        }]);
        ps.push(p);
        let r = Resolver::new(ps.clone());
        for a in ["", "1", "2"] {
            for b in ["", "2", "3"] {
                let mut labels = BTreeMap::new();
                if !a.is_empty() {
                    labels.insert("a".to_string(), a.to_string());
                }
                if !b.is_empty() {
                    labels.insert("b".to_string(), b.to_string());
                }
                let brute: Vec<usize> = r
                    .policies
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| {
                        Selector::compile(&p.spec.node_selector)
                            .unwrap()
                            .matches(&labels)
                    })
                    .map(|(i, _)| i)
                    .collect();
                assert_eq!(r.matching(&labels), brute, "labels {labels:?}");
            }
        }
    }
}
