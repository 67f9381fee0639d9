//! One placement decision on the largest fixture (4 sockets, 8 NUMA nodes, 384 CPUs) with
//! 1,000 containers already placed. `cargo bench -p node-agent --bench placement`.
//!
//! - `decide/*`: the policy's choice alone (what the container start path waits for before
//!   the state is updated).
//! - `create_remove/*`: a full create (decision + commit + grant record) and the remove that
//!   puts the state back, so every iteration sees the same 1,000-container state.
//! - `claim_release/*`: the engine's share of a DRA prepare (a claim of 4 CPUs of one NUMA
//!   node booked, shared containers moved off them) and of the unprepare that gives them back.

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use tap_engine::testdata::{fixture_topology, Probe};
use tap_engine::{Engine, PolicyKind};

fn loaded(policy: PolicyKind) -> Engine {
    let topo = fixture_topology("synthetic-4s-8numa-smt-384t").expect("fixture topology");
    let e = tap_engine::testdata::bench_engine(topo, policy, 1000);
    assert_eq!(e.len(), 1000);
    e
}

fn bench(c: &mut Criterion) {
    let burstable = Probe::Burstable.request();
    let guaranteed = Probe::Guaranteed.request();
    for (name, policy) in [
        ("topology-aware", PolicyKind::TopologyAware),
        ("numa-aware", PolicyKind::NumaAware),
    ] {
        let mut e = loaded(policy);
        c.bench_function(&format!("decide/{name}/burstable-4-8"), |b| {
            b.iter(|| black_box(e.decide(black_box(&burstable))))
        });
        c.bench_function(&format!("create_remove/{name}/burstable-4-8"), |b| {
            b.iter(|| {
                black_box(e.create(black_box(&burstable)));
                black_box(e.remove("new"));
            })
        });
        let ask = claim_ask(&e);
        c.bench_function(&format!("claim_release/{name}/dra-4-cpus"), |b| {
            b.iter(|| {
                black_box(e.claim(black_box(&ask)).expect("claim"));
                black_box(e.release_claim("uid-bench"));
            })
        });
        if policy == PolicyKind::TopologyAware {
            c.bench_function(&format!("decide/{name}/guaranteed-4-exclusive"), |b| {
                b.iter(|| black_box(e.decide(black_box(&guaranteed))))
            });
            c.bench_function(
                &format!("create_remove/{name}/guaranteed-4-exclusive"),
                |b| {
                    b.iter(|| {
                        black_box(e.create(black_box(&guaranteed)));
                        black_box(e.remove("new-g"));
                    })
                },
            );
        }
    }
}

/// A DRA claim of 4 CPUs of NUMA node 3.
fn claim_ask(e: &Engine) -> tap_engine::claim::ClaimAsk {
    use tap_engine::claim::{ClaimAsk, ClaimKey, PartAsk};
    let device = tap_engine::dra::pool_of(e.topology(), "numa3")
        .expect("NUMA node 3")
        .id;
    ClaimAsk {
        uid: "uid-bench".into(),
        key: ClaimKey {
            namespace: "default".into(),
            name: "bench".into(),
        },
        parts: vec![PartAsk {
            request: "cpus".into(),
            device,
            cpus: 4,
            memory_bytes: 256 << 20,
        }],
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
