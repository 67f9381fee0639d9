//! Usage-aware rebalancing against a real containerd 1.7 with runc, in NRI mode and
//! as the CRI proxy: busy-loop containers placed on one NUMA node are spread by the agent's
//! rebalancer, as their cgroups show.
//!
//! The agent decides on a 2-NUMA fixture folded onto this host (NUMA node k -> host CPU k mod
//! n), so two containers on one fixture node share one host CPU. Four Burstable containers
//! (500m request, 1 CPU limit) are placed by request, two per node; each waits for a file in
//! its own bind-mounted folder and then spins. The two of one node are started: that node
//! burns a CPU, the other nothing. After two 1-s rounds (the first reading, then a round above the threshold) one of them
//! moves to the other node: its cgroup's `cpuset.cpus` becomes the other host CPU, and the
//! nodes are even, so nothing moves back. Each node's demand in the metrics (use plus the time
//! waiting for a CPU, from `cpu.pressure`) is then about one CPU.

use anyhow::{bail, ensure, Context, Result};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tap_e2e::containerd::{
    cgroup_cpuset, timed_with_containerd, AgentMode as Mode, CgroupQos, ContainerSpec, Containerd,
    ContainerdOptions, Cri, PodSpec,
};
use tap_e2e::docker::TapAgent;
use tap_e2e::text::{grant_nodes, metric_sum, series_value};
use tap_e2e::util::{self};

const GRANT_KEY: &str = "tap.kunpeng.huawei.com/grant";
/// Two NUMA nodes (one per socket).
const FIXTURE: &str = "synthetic-2s-2numa-smt-96t";
/// Waits for `/ctl/go`, then spins.
const SPIN: &str = "while [ ! -e /ctl/go ]; do sleep 0.2; done; while :; do :; done";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn nri_rebalancer_spreads_busy_containers() -> Result<()> {
    run("nri_rebalancer_spreads_busy_containers", Mode::Nri).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn cri_proxy_rebalancer_spreads_busy_containers() -> Result<()> {
    run(
        "cri_proxy_rebalancer_spreads_busy_containers",
        Mode::CriProxy,
    )
    .await
}

async fn run(test: &str, mode: Mode) -> Result<()> {
    util::require_e2e_tier();
    let opts = ContainerdOptions::for_agent(mode);
    timed_with_containerd(test, "tap-rebal", opts, async |ctd, dir| {
        scenario(ctd, dir, mode).await
    })
    .await
}

/// One test container.
struct Spinner {
    id: String,
    ctl: PathBuf,
    node: usize,
}

async fn scenario(ctd: &mut Containerd, dir: &Path, mode: Mode) -> Result<()> {
    let (agent, mut cri) = start(ctd, dir, mode).await?;
    let mut all = Vec::new();
    for i in 0..4 {
        all.push(spinner(&mut cri, dir, i).await?);
    }
    let (hot, from) = crowded_pair(&all)?;
    let to = 1 - from;
    for s in &hot {
        std::fs::write(s.ctl.join("go"), b"")?;
    }
    eprintln!(
        "spinning {} and {} on node {from}",
        &hot[0].id[..12],
        &hot[1].id[..12]
    );
    util::wait_until(
        "the agent to log a move",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || Ok(agent.log_text().contains("rebalanced:")),
    )?;
    if matches!(mode, Mode::Nri) {
        // The agent writes the move into the container's cgroup at once
        // (--nri-cgroup-writes=auto). A probe Pod still starts here, as when a move had to ride
        // on containerd's next request: without it, one run in two here saw a second, small
        // move right after the first (an idle container stalled behind the moved spinner).
        let sb = cri
            .run_pod(&PodSpec::new("probe", CgroupQos::BestEffort))
            .await?;
        cri.run_container(&sb, &ContainerSpec::sleeper("probe"))
            .await?;
    }
    let moved = wait_moved(&mut cri, &hot, from, to).await?;
    check_settled(&agent, &mut cri, &hot, moved, from, to).await?;
    cri.remove_all_pods().await?;
    Ok(())
}

/// The agent with rebalancing on, 1-s rounds, and a CRI client through the way `mode` takes.
async fn start(ctd: &Containerd, dir: &Path, mode: Mode) -> Result<(TapAgent, Cri)> {
    let proxy = dir.join("cri-proxy.sock");
    let mut args = ctd.agent_args(mode, &proxy, Some(FIXTURE), &dir.join("state"));
    args.extend(
        [
            "--resource-policy=topology-aware",
            "--rebalance=usage",
            "--rebalance-interval=1s",
        ]
        .map(String::from),
    );
    let agent = TapAgent::start(&args, &dir.join("agent.log"))?;
    let cri = match mode {
        Mode::CriProxy => Cri::connect(&proxy).await?,
        Mode::Nri => ctd.cri().await?,
    };
    Ok((agent, cri))
}

/// A Burstable container (500m, limit 1 CPU) waiting for `<dir>/ctl<i>/go`, and its node.
async fn spinner(cri: &mut Cri, dir: &Path, i: usize) -> Result<Spinner> {
    let ctl = dir.join(format!("ctl{i}"));
    std::fs::create_dir_all(&ctl)?;
    let sb = cri
        .run_pod(&PodSpec::new(&format!("spin-{i}"), CgroupQos::Burstable))
        .await?;
    let spec = ContainerSpec {
        command: ["/bin/sh", "-c", SPIN].map(String::from).to_vec(),
        mounts: vec![(ctl.display().to_string(), "/ctl".into())],
        ..ContainerSpec::cpus("app", 500, Some(1000))
    };
    let id = cri.run_container(&sb, &spec).await?;
    let node = grant_node(cri, &id).await?;
    let cpus = cgroup_cpuset(cri.pid(&id).await?)?;
    ensure!(
        util::parse_list(&cpus)? == host_cpu_of(node),
        "spin-{i} on node {node} runs on {cpus}"
    );
    Ok(Spinner { id, ctl, node })
}

/// The NUMA node of the container's grant record: an annotation of the OCI spec (NRI) or of
/// the CRI container (the proxy).
async fn grant_node(cri: &mut Cri, id: &str) -> Result<usize> {
    let (st, _) = cri.container_status(id).await?;
    let rec = match st.annotations.get(GRANT_KEY) {
        Some(r) => r.clone(),
        None => cri
            .spec_annotations(id)
            .await?
            .remove(GRANT_KEY)
            .context("no grant record")?,
    };
    let nodes = grant_nodes(&rec)?;
    ensure!(nodes.len() == 1, "{id} on nodes {nodes:?}");
    nodes.into_iter().next().context("no node")
}

/// Two containers on one node (four over two nodes: there is one) and that node.
fn crowded_pair(all: &[Spinner]) -> Result<([&Spinner; 2], usize)> {
    for node in 0..2 {
        let on: Vec<&Spinner> = all.iter().filter(|s| s.node == node).collect();
        if let [a, b, ..] = on[..] {
            return Ok(([a, b], node));
        }
    }
    bail!("no two containers share a node")
}

/// The host CPUs a fixture node's cpuset folds to.
fn host_cpu_of(node: usize) -> BTreeSet<usize> {
    let host = util::host_cpus();
    BTreeSet::from([host[node % host.len()]])
}

/// Waits until one of `hot` runs on `to`'s CPU (the other still on `from`'s); returns its index.
async fn wait_moved(cri: &mut Cri, hot: &[&Spinner; 2], from: usize, to: usize) -> Result<usize> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut now = Vec::new();
        for s in hot {
            now.push(util::parse_list(&cgroup_cpuset(cri.pid(&s.id).await?)?)?);
        }
        let on_to: Vec<usize> = (0..2).filter(|i| now[*i] == host_cpu_of(to)).collect();
        if let [moved] = on_to[..] {
            ensure!(
                now[1 - moved] == host_cpu_of(from),
                "the other stays: {now:?}"
            );
            eprintln!(
                "moved {} to node {to}: cpuset {:?}",
                &hot[moved].id[..12],
                now[moved]
            );
            return Ok(moved);
        }
        ensure!(on_to.len() < 2, "both moved: {now:?}");
        if Instant::now() > deadline {
            bail!("no container's cgroup moved to node {to} in 30 s: {now:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// After the move: one move counted, each node's usage near one CPU, and five more rounds
/// move nothing (the nodes are even).
async fn check_settled(
    agent: &TapAgent,
    cri: &mut Cri,
    hot: &[&Spinner; 2],
    moved: usize,
    from: usize,
    to: usize,
) -> Result<()> {
    let moves = |m: &str| metric_sum(m, "tap_rebalance_moves_total");
    ensure!(moves(&agent.metrics()?) == 1.0, "one move");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let m = agent.metrics()?;
    for l in m
        .lines()
        .filter(|l| l.starts_with("tap_numa_") || l.starts_with("tap_rebalance_"))
    {
        eprintln!("{l}");
    }
    ensure!(moves(&m) == 1.0, "a move after the nodes were even:\n{m}");
    // Each node's demand (use plus waiting, which the other processes of this 2-CPU host
    // cause too) is one spinner's: about a CPU.
    for node in [from, to] {
        let series = |name: &str| {
            series_value(&m, &format!("{name}{{numa=\"{node}\"}}"))
                .with_context(|| format!("no {name} of node {node}:\n{m}"))
        };
        let (used, stalled) = (
            series("tap_numa_usage_cpus")?,
            series("tap_numa_cpu_stall_cpus")?,
        );
        // Without PSI (a kernel booted with psi=0) only the use is seen, whatever the rest of
        // the host takes of the CPU.
        let low = if stalled > 0.0 { 0.7 } else { 0.3 };
        let demand = used + stalled;
        ensure!(
            (low..=1.5).contains(&demand),
            "node {node} demands {demand} CPUs ({used} used, {stalled} waiting)"
        );
    }
    let cpus = cgroup_cpuset(cri.pid(&hot[moved].id).await?)?;
    ensure!(
        util::parse_list(&cpus)? == host_cpu_of(to),
        "moved back: {cpus}"
    );
    Ok(())
}
