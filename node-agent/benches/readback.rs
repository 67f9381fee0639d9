//! What the cgroup read-back costs the agent per pass ([`Ledger::read_back_once`], every 5 s in
//! every mode): reading each settled container's `cpuset.cpus` and `cpuset.mems` and taking the
//! readings into the books.
//!
//! `n` Burstable containers on the 384-thread fixture, their cgroups in a cgroup v2 tree shaped
//! like the systemd driver's under a temporary folder (tmpfs where `/dev/shm` is one), each
//! holding what the books say (a pass finds nothing to correct, the steady state).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use node_agent::agent::{Agent, ContainerInfo, PodInfo};
use node_agent::cgroupfs::Cgroupfs;
use node_agent::ledger::Ledger;
use node_agent::metrics::Metrics;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tap_engine::sysfs::discover_dir;
use tap_engine::{Engine, EngineConfig, Topology};

fn id(i: usize) -> String {
    format!("{i:064x}")
}

fn container(i: usize) -> ContainerInfo {
    ContainerInfo {
        id: id(i),
        name: "app".into(),
        pod: PodInfo {
            uid: format!("uid-{i}"),
            name: format!("pod-{i}"),
            namespace: "default".into(),
            ..Default::default()
        },
        cpu_shares: Some(256),
        cpu_quota: Some(400_000),
        cpu_period: Some(100_000),
        ..Default::default()
    }
}

fn ledger(n: usize, rt: &tokio::runtime::Runtime) -> Ledger {
    let root = tap_engine::testdata::fixture_dir("synthetic-4s-8numa-smt-384t");
    let topo = Arc::new(Topology::build(&discover_dir(&root).expect("fixture")).expect("topo"));
    let agent = Agent::new(
        Engine::new(topo, EngineConfig::default()),
        Arc::new(Metrics::new()),
        None,
        "bench",
    );
    let l = Ledger::new(Arc::new(agent), None);
    rt.block_on(async {
        for i in 0..n {
            let t = l.begin_create(container(i)).await;
            l.commit_create(t, Some(id(i)));
        }
    });
    l
}

fn cgroup_dir(root: &Path, i: usize) -> PathBuf {
    root.join(format!(
        "kubepods.slice/kubepods-burstable.slice/pod{i}.slice/cri-containerd-{}.scope",
        id(i)
    ))
}

fn passes(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let mut g = c.benchmark_group("readback_pass");
    g.measurement_time(Duration::from_secs(5));
    for n in [100usize, 1000] {
        let root = base.join(format!("tap-bench-readback-{}-{n}", std::process::id()));
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
