//! What the cgroup read-back costs the agent per pass ([`Ledger::read_back_once`], every 5 s in
//! every mode): reading each settled container's `cpuset.cpus` and `cpuset.mems` and taking the
//! readings into the books.
//!
//! `n` Burstable containers on the 384-thread fixture, their cgroups in a cgroup v2 tree shaped
//! like the systemd driver's under a temporary folder (tmpfs where `/dev/shm` is one), each
//! holding what the books say (a pass finds nothing to correct, the steady state).

mod support;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use node_agent::cgroupfs::Cgroupfs;
use std::sync::Arc;
use support::{cgroup_dir, group, id, ledger, scratch};

fn passes(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut g = group(c, "readback_pass");
    for n in [100usize, 1000] {
        let root = scratch(&format!("readback-{n}"));
        std::fs::create_dir_all(&root).expect("mkdir");
        std::fs::write(root.join("cgroup.controllers"), "cpuset cpu\n").expect("controllers");
        let l = ledger(n, &rt);
        for i in 0..n {
            let dir = cgroup_dir(&root, i);
            std::fs::create_dir_all(&dir).expect("mkdir");
            let (cpus, _) = l.agent().current(&id(i)).expect("granted");
            std::fs::write(dir.join("cpuset.cpus"), format!("{cpus}\n")).expect("cpus");
            std::fs::write(dir.join("cpuset.mems"), "0-7\n").expect("mems");
        }
        let fs = Arc::new(Cgroupfs::detect(&root).expect("cgroupfs"));
        // The first pass walks the tree; the timed ones find every container known.
        let first = rt.block_on(l.read_back_once(&fs));
        assert_eq!(first.same, n as u64, "{first:?}");
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| std::hint::black_box(rt.block_on(l.read_back_once(&fs))))
        });
        let _ = std::fs::remove_dir_all(&root);
    }
    g.finish();
}

criterion_group!(benches, passes);
criterion_main!(benches);
