//! What the agent's benches share: `n` Burstable containers committed in a ledger on the
//! 384-thread fixture, and their cgroup directories in a tree shaped like the systemd driver's.

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion};
use node_agent::agent::{Agent, ContainerInfo, PodInfo};
use node_agent::ledger::Ledger;
use node_agent::metrics::Metrics;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tap_engine::{Engine, EngineConfig, Topology};

pub fn id(i: usize) -> String {
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

/// A ledger holding containers `0..n`, each created and committed.
pub fn ledger(n: usize, rt: &tokio::runtime::Runtime) -> Ledger {
    let raw =
        tap_engine::testdata::discover_fixture("synthetic-4s-8numa-smt-384t").expect("fixture");
    let topo = Arc::new(Topology::build(&raw).expect("topo"));
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

pub fn cgroup_dir(root: &Path, i: usize) -> PathBuf {
    root.join(format!(
        "kubepods.slice/kubepods-burstable.slice/pod{i}.slice/cri-containerd-{}.scope",
        id(i)
    ))
}

/// A folder for a bench's cgroup tree: on tmpfs where `/dev/shm` is one.
pub fn scratch(tag: &str) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    base.join(format!("tap-bench-{tag}-{}", std::process::id()))
}

/// A group of these benches, each input measured for 5 s.
pub fn group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.measurement_time(Duration::from_secs(5));
    g
}
