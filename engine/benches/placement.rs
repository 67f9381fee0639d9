//! One placement decision on the largest fixture (4 sockets, 8 NUMA nodes, 384 CPUs) with
//! 1,000 containers already placed. `cargo bench -p node-agent --bench placement`.
//!
//! - `decide/*`: the policy's choice alone (what the container start path waits for before
//!   the state is updated).
//! - `create_remove/*`: a full create (decision + commit + grant record) and the remove that
//!   puts the state back, so every iteration sees the same 1,000-container state.

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::sync::Arc;
use tap_engine::sysfs::discover_dir;
use tap_engine::{ContainerRequest, Engine, EngineConfig, PolicyKind, Qos, Topology};

fn topo() -> Arc<Topology> {
    let root = tap_engine::testdata::fixture_dir("synthetic-4s-8numa-smt-384t");
    Arc::new(Topology::build(&discover_dir(&root).expect("fixture")).expect("topology"))
}

fn request(i: usize) -> ContainerRequest {
    // A mix: 70% Burstable (100m-500m request, 2x limit), 20% BestEffort, 10% Guaranteed 1-2 CPUs.
    let (qos, req, lim) = match i % 10 {
        0 => (Qos::Guaranteed, 1000 + 1000 * (i as u64 / 10 % 2), None),
        1 | 2 => (Qos::BestEffort, 0, None),
        _ => {
            let r = 100 + (i as u64 * 37) % 400;
            (Qos::Burstable, r, Some(2 * r))
        }
    };
    ContainerRequest {
        id: format!("c{i:04}"),
        namespace: "default".into(),
        container_name: "app".into(),
        qos: Some(qos),
        cpu_request_milli: req,
        cpu_limit_milli: if qos == Qos::Guaranteed {
            Some(req)
        } else {
            lim
        },
        ..Default::default()
    }
}

fn loaded(policy: PolicyKind) -> Engine {
    let mut e = Engine::new(
        topo(),
        EngineConfig {
            policy,
            ..Default::default()
        },
    );
    for i in 0..1000 {
        let _ = e.create(&request(i));
    }
    assert_eq!(e.len(), 1000);
    e
}

fn bench(c: &mut Criterion) {
    let burstable = ContainerRequest {
        id: "new".into(),
        namespace: "default".into(),
        cpu_request_milli: 4000,
        cpu_limit_milli: Some(8000),
        ..Default::default()
    };
    let guaranteed = ContainerRequest {
        id: "new-g".into(),
        namespace: "default".into(),
        qos: Some(Qos::Guaranteed),
        cpu_request_milli: 4000,
        cpu_limit_milli: Some(4000),
        ..Default::default()
    };
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

criterion_group!(benches, bench);
criterion_main!(benches);
