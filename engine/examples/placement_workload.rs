//! A fixed placement workload for counting instructions: the criterion bench's state (the
//! largest fixture, 1,000 containers placed) and then N repetitions of one operation.
//! hack/bench-ir.sh runs it under valgrind (cachegrind) and compares the instructions per
//! operation with the baseline in engine/benches/ir-baseline.txt: a count that does not move
//! with the machine's load, so a regression on the container start path shows on a shared
//! 2-core CI machine as well as on a quiet one.
//!
//! `placement_workload FIXTURE_DIR POLICY OPERATION N`
//!   POLICY: topology-aware | numa-aware
//!   OPERATION: setup (nothing after the setup) | decide-burstable | create-remove-burstable |
//!              decide-guaranteed | create-remove-guaranteed

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use tap_engine::sysfs::discover_dir;
use tap_engine::{ContainerRequest, Engine, EngineConfig, PolicyKind, Qos, Topology};

/// The bench's mix: 70% Burstable (100m-500m request, 2x limit), 20% BestEffort, 10%
/// Guaranteed 1-2 CPUs.
fn request(i: usize) -> ContainerRequest {
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

fn new_request(id: &str, qos: Qos, request: u64, limit: u64) -> ContainerRequest {
    ContainerRequest {
        id: id.into(),
        namespace: "default".into(),
        qos: Some(qos),
        cpu_request_milli: request,
        cpu_limit_milli: Some(limit),
        ..Default::default()
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [fixture, policy, operation, n] = args.as_slice() else {
        eprintln!("usage: placement_workload FIXTURE_DIR POLICY OPERATION N");
        std::process::exit(2);
    };
    let raw = discover_dir(Path::new(fixture)).expect("reading the fixture");
    let topo = Arc::new(Topology::build(&raw).expect("building the topology"));
    let policy = match policy.as_str() {
        "topology-aware" => PolicyKind::TopologyAware,
        "numa-aware" => PolicyKind::NumaAware,
        other => panic!("unknown policy {other}"),
    };
    let n: usize = n.parse().expect("N: a count");
    let mut e = Engine::new(
        topo,
        EngineConfig {
            policy,
            ..Default::default()
        },
    );
    for i in 0..1000 {
        let _ = e.create(&request(i));
    }
    let burstable = new_request("new", Qos::Burstable, 4000, 8000);
    let guaranteed = new_request("new-g", Qos::Guaranteed, 4000, 4000);
    let (req, remove) = match operation.as_str() {
        "setup" => return,
        "decide-burstable" => (&burstable, false),
        "create-remove-burstable" => (&burstable, true),
        "decide-guaranteed" => (&guaranteed, false),
        "create-remove-guaranteed" => (&guaranteed, true),
        other => panic!("unknown operation {other}"),
    };
    for _ in 0..n {
        if remove {
            black_box(e.create(black_box(req)));
            black_box(e.remove(&req.id));
        } else {
            black_box(e.decide(black_box(req)));
        }
    }
}
