//! The arm64 guest's checks: QEMU's `virt` machine shaped like a small Kunpeng (2 sockets of 2
//! clusters of 2 cores, a NUMA node per socket), the agent with cluster affinity on
//! (`--cluster-affinity-rule=any`: QEMU's CPU is no Kunpeng).

use super::*;

/// The agent's flags in this guest besides the common ones.
const CLUSTER_FLAGS: &[&str] = &["--topology-cluster-affinity", "--cluster-affinity-rule=any"];
/// The flags of the agent the rebalancing scenario restarts.
const REBALANCE_FLAGS: &[&str] = &[
    "--topology-cluster-affinity",
    "--cluster-affinity-rule=any",
    "--rebalance=usage",
    "--rebalance-interval=1s",
];

/// Which of the arm64 guest's scenarios run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenarios {
    /// A Burstable Pod on one cluster, and an exclusive grant next to shared containers (CI's).
    Placement,
    /// Those, then memory over both nodes, an agent restart, and rebalancing.
    All,
}

impl Scenarios {
    /// `placement` or `all`.
    pub fn parse(name: &str) -> Option<Scenarios> {
        match name {
            "placement" => Some(Scenarios::Placement),
            "all" => Some(Scenarios::All),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Scenarios::Placement => "placement",
            Scenarios::All => "all",
        }
    }
}

/// The arm64 guest's scenarios, in order; each one's wall time in the guest is reported.
pub(super) async fn checks(scenarios: Scenarios, report: &mut Value) -> Result<()> {
    let nodes = GuestNodes::read()?;
    let clusters = clusters()?;
    report["scenarios"] = json!(scenarios.name());
    report["nodes"] = nodes.report();
    report["clusters"] = json!(clusters.iter().map(list).collect::<Vec<_>>());
    ensure!(
        nodes.cpus.len() == 2 && clusters.len() == 4,
        "the guest is not 2 NUMA nodes of 2 clusters: nodes {:?}, clusters {clusters:?}",
        nodes.cpus
    );
    let mut rig = Rig::start(CLUSTER_FLAGS, report).await?;
    let out = steps(scenarios, &mut rig, &nodes, &clusters, report).await;
    rig.finish(out)
}

async fn steps(
    scenarios: Scenarios,
    rig: &mut Rig,
    nodes: &GuestNodes,
    clusters: &[BTreeSet<usize>],
    report: &mut Value,
) -> Result<()> {
    let t = Instant::now();
    pod_on_one_cluster(&mut rig.cri, nodes, clusters, report).await?;
    note_seconds(report, "cluster", t);
    let t = Instant::now();
    // A BestEffort container on the shared CPUs as well: the grant must be taken from it.
    let shared = ContainerSpec::sleeper("shared");
    run(&mut rig.cri, "shared", CgroupQos::BestEffort, &shared).await?;
    exclusive_next_to_shared(&mut rig.cri, 2, report).await?;
    note_seconds(report, "exclusive", t);
    if scenarios == Scenarios::Placement {
        return Ok(());
    }
    let t = Instant::now();
    memory_over_nodes(&mut rig.cri, nodes, 300, report).await?;
    note_seconds(report, "bigmem", t);
    let t = Instant::now();
    restart_keeps_books(rig, report).await?;
    note_seconds(report, "restart", t);
    let t = Instant::now();
    rig.cri.remove_all_pods().await?;
    rig.restart_agent(REBALANCE_FLAGS)?;
    rebalance_moves_pages(&mut rig.cri, nodes, report).await?;
    note_seconds(report, "rebalance", t);
    Ok(())
}

/// The live kernel's clusters: each CPU's `topology/cluster_cpus_list`, once each.
fn clusters() -> Result<Vec<BTreeSet<usize>>> {
    let mut out: Vec<BTreeSet<usize>> = Vec::new();
    for e in std::fs::read_dir("/sys/devices/system/cpu")? {
        let path = e?.path().join("topology/cluster_cpus_list");
        if !path.exists() {
            continue;
        }
        let set = parse_list(&std::fs::read_to_string(&path)?)?;
        if !out.contains(&set) {
            out.push(set);
        }
    }
    out.sort();
    Ok(out)
}

/// A Burstable 1/2 Pod (1 CPU requested, 2 limit, 256 MiB) lands on one cluster: its cgroup's
/// `cpuset.cpus` is a `cluster_cpus_list` of the live kernel, its `cpuset.mems` the cluster's
/// NUMA node, and the 64 MiB it touched are there.
async fn pod_on_one_cluster(
    cri: &mut Cri,
    nodes: &GuestNodes,
    clusters: &[BTreeSet<usize>],
    report: &mut Value,
) -> Result<()> {
    let (_, at) = guide_shaped_pod(cri, "cluster", report).await?;
    ensure!(
        clusters.contains(&at.cpus),
        "cpuset {:?} is no cluster's CPUs {clusters:?}",
        at.cpus
    );
    let node = nodes
        .holding(&at.cpus)
        .with_context(|| format!("cluster {:?} within no NUMA node", at.cpus))?;
    memory_on_node(&at.mems, &at.pages, node)
}

/// An agent restart (killed, started again on the same containerd): it rebuilds its books from
/// the runtime and changes nothing. Its pools' capacity and usage (metrics) are what they were
/// before, and so is every container's cgroup `cpuset.cpus` and `cpuset.mems` once a new
/// container has been started (containerd 1.7 takes an update the agent has not written to the
/// cgroup itself with its next NRI request).
async fn restart_keeps_books(rig: &mut Rig, report: &mut Value) -> Result<()> {
    let books = rig.agent.books()?;
    let cgroups = cgroup_cpusets_and_mems(&mut rig.cri).await?;
    rig.restart_agent(CLUSTER_FLAGS)?;
    let books_after = rig.agent.books()?;
    let probe = ContainerSpec::sleeper("probe");
    run(&mut rig.cri, "probe", CgroupQos::BestEffort, &probe).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut cgroups_after = cgroup_cpusets_and_mems(&mut rig.cri).await?;
    cgroups_after.retain(|id, _| cgroups.contains_key(id));
    let log = rig.agent.log();
    let restored = log
        .lines()
        .rfind(|l| l.contains("state restored from the runtime"))
        .unwrap_or_default();
    report["restart"] = json!({
        "restored": crate::util::strip_ansi(restored),
        "books": books_after,
        "cgroups": cgroups_after.values().collect::<Vec<_>>(),
    });
    ensure!(
        books_after == books,
        "the books changed over the restart:\n{books:#?}\n->\n{books_after:#?}"
    );
    ensure!(
        cgroups_after == cgroups,
        "cgroups changed over the restart:\n{cgroups:#?}\n->\n{cgroups_after:#?}"
    );
    Ok(())
}

/// Every running container's cgroup `cpuset.cpus` and `cpuset.mems`, by container id.
async fn cgroup_cpusets_and_mems(cri: &mut Cri) -> Result<BTreeMap<String, (String, String)>> {
    let mut out = BTreeMap::new();
    for id in cri.list_running().await? {
        let pid = cri.pid(&id).await?;
        let cpus = cgroup_cpuset(pid)?.trim().to_string();
        let mems = cgroup_mems(pid)?.trim().to_string();
        out.insert(id, (cpus, mems));
    }
    ensure!(!out.is_empty(), "no container running");
    Ok(out)
}
