//! The pure resolve step at scale: 5,000 nodes x 100 policies, one full pass (every node's
//! winning policy plus per-policy counts and conflicts). Target: under 50 ms.

use criterion::{criterion_group, criterion_main, Criterion};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use std::collections::BTreeMap;
use tap_api::{PolicyName, PolicySettings, TopologyPolicySpec};
use tap_operator::resolve::{NodeInput, PolicyInput, Resolver};

fn nodes(n: usize) -> Vec<NodeInput> {
    (0..n)
        .map(|i| {
            let mut labels = BTreeMap::new();
            labels.insert("kubernetes.io/hostname".into(), format!("node-{i}"));
            labels.insert("kubernetes.io/os".into(), "linux".into());
            labels.insert(
                "kubernetes.io/arch".into(),
                if i % 3 == 0 { "amd64" } else { "arm64" }.into(),
            );
            labels.insert(
                "topology.kubernetes.io/zone".into(),
                format!("zone-{}", i % 4),
            );
            labels.insert("rack".into(), format!("rack-{}", i % 50));
            labels.insert("pool".into(), format!("pool-{}", i % 20));
            labels.insert(
                "node.kubernetes.io/instance-type".into(),
                format!("t{}", i % 7),
            );
            if i % 10 == 0 {
                labels.insert("gpu".into(), "true".into());
            }
            NodeInput {
                name: format!("node-{i}"),
                uid: format!("uid-{i}"),
                labels,
            }
        })
        .collect()
}

fn policies(n: usize) -> Vec<PolicyInput> {
    (0..n)
        .map(|i| {
            let mut sel = LabelSelector::default();
            match i % 5 {
                // Equality on a rack.
                0 => {
                    sel.match_labels =
                        Some([("rack".to_string(), format!("rack-{}", i % 50))].into())
                }
                // A pool and an architecture.
                1 => {
                    sel.match_labels = Some(
                        [
                            ("pool".to_string(), format!("pool-{}", i % 20)),
                            ("kubernetes.io/arch".to_string(), "arm64".to_string()),
                        ]
                        .into(),
                    )
                }
                // Zones by In.
                2 => {
                    sel.match_expressions = Some(vec![LabelSelectorRequirement {
                        key: "topology.kubernetes.io/zone".into(),
                        operator: "In".into(),
                        values: Some(vec![
                            format!("zone-{}", i % 4),
                            format!("zone-{}", (i + 1) % 4),
                        ]),
                    }])
                }
                // Exists / NotIn (unindexed: checked against every node).
                3 => {
                    sel.match_expressions = Some(vec![
                        LabelSelectorRequirement {
                            key: "gpu".into(),
                            operator: "Exists".into(),
                            values: None,
                        },
                        LabelSelectorRequirement {
                            key: "rack".into(),
                            operator: "NotIn".into(),
                            values: Some(vec![format!("rack-{}", i % 50)]),
                        },
                    ])
                }
                // Instance type.
                _ => {
                    sel.match_labels = Some(
                        [(
                            "node.kubernetes.io/instance-type".to_string(),
                            format!("t{}", i % 7),
                        )]
                        .into(),
                    )
                }
            }
            PolicyInput {
                name: format!("policy-{i}"),
                uid: Some(format!("uid-{i}")),
                generation: 1,
                created: Some(i as i64 % 17),
                spec: TopologyPolicySpec {
                    node_selector: sel,
                    settings: PolicySettings {
                        policy: if i % 2 == 0 {
                            PolicyName::NumaAware
                        } else {
                            PolicyName::TopologyAware
                        },
                        ..PolicySettings::default()
                    },
                    priority: (i % 10) as i32,
                },
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let ns = nodes(5000);
    let ps = policies(100);
    let mut g = c.benchmark_group("resolve");
    g.sample_size(20);
    g.bench_function("full_pass_5000_nodes_100_policies", |b| {
        b.iter(|| {
            let r = Resolver::new(ps.clone());
            let fp = r.full_pass(&ns);
            assert_eq!(fp.assignments.len(), 5000);
            fp
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
