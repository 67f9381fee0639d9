//! A fixed placement workload for counting instructions: the criterion bench's state (the
//! largest fixture, the first 1,000 containers of `testdata::bench_request` placed) and then N
//! repetitions of one operation.
//! hack/bench-ir.sh runs it under valgrind (cachegrind) and compares the instructions per
//! operation with the baseline in engine/benches/ir-baseline.txt: a count that does not move
//! with the machine's load, so a regression on the container start path shows on a shared
//! 2-core CI machine as well as on a quiet one.
//!
//! `placement_workload FIXTURE POLICY OPERATION N` (FIXTURE: a sysfs dump file or folder)
//!   POLICY: topology-aware | numa-aware
//!   OPERATION: setup (nothing after the setup) | decide-burstable | create-remove-burstable |
//!              decide-guaranteed | create-remove-guaranteed

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use tap_engine::sysfs::discover_dir;
use tap_engine::testdata::Probe;
use tap_engine::{PolicyKind, Topology};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [fixture, policy, operation, n] = args.as_slice() else {
        eprintln!("usage: placement_workload FIXTURE POLICY OPERATION N");
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
    let mut e = tap_engine::testdata::bench_engine(topo, policy, 1000);
    let burstable = Probe::Burstable.request();
    let guaranteed = Probe::Guaranteed.request();
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
