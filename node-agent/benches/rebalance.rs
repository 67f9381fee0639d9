//! What a rebalancing round costs the agent, per container: reading each
//! container's `cpu.stat` and `cpu.pressure`, turning them into usage, the per-node reports
//! for the metrics, and the engine's plan with the moves it applies.
//!
//! `n` Burstable containers on the 384-thread fixture, their cgroups in a tree shaped like the
//! systemd driver's under a temporary folder (tmpfs where `/dev/shm` is one). Between rounds
//! (not timed) every container's counters advance, a quarter of them by four CPUs' worth and
//! the rest by a tenth of a CPU, so the nodes are unbalanced and rounds plan and move.

mod support;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use node_agent::usage::rebalance_loop::{LoopOptions, Round};
use std::path::Path;
use std::time::{Duration, Instant};
use support::{cgroup_dir, group, ledger, scratch};
use tap_engine::rebalance::RebalanceConfig;

/// Advances every container's counters by one 10-s round.
fn advance(root: &Path, n: usize, round: u64) {
    for i in 0..n {
        let per_round: u64 = if i % 4 == 0 { 40_000_000 } else { 1_000_000 };
        let used = per_round.saturating_mul(round);
        let dir = cgroup_dir(root, i);
        std::fs::write(
            dir.join("cpu.stat"),
            format!("usage_usec {used}\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n"),
        )
        .expect("cpu.stat");
        std::fs::write(
            dir.join("cpu.pressure"),
            format!("some avg10=0.00 avg60=0.00 avg300=0.00 total={}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", used / 10),
        )
        .expect("cpu.pressure");
    }
}

fn rounds(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut g = group(c, "rebalance_round");
    for n in [100usize, 500] {
        let root = scratch(&format!("rebalance-{n}"));
        for i in 0..n {
            std::fs::create_dir_all(cgroup_dir(&root, i)).expect("mkdir");
        }
        let l = ledger(n, &rt);
        let opts = LoopOptions {
            interval: Duration::from_secs(10),
            cgroup_root: root.clone(),
            config: RebalanceConfig::default(),
        };
        let mut round = Round::new(&opts);
        let mut tick = 0u64;
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let mut took = Duration::ZERO;
                for _ in 0..iters {
                    tick += 1;
                    advance(&root, n, tick);
                    let t0 = Instant::now();
                    std::hint::black_box(round.run(&l));
                    took += t0.elapsed();
                }
                took
            })
        });
        let _ = std::fs::remove_dir_all(&root);
    }
    g.finish();
}

criterion_group!(benches, rounds);
criterion_main!(benches);
