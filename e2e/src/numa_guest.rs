//! What the NUMA guests check inside themselves (docs/design/numa-vm.md), on the guest's own
//! kernel: containerd with NRI and runc, the agent in NRI mode on the guest's live `/sys`, and
//! where the containers' cgroups and pages are (`cpuset.cpus`, `cpuset.mems`, `numa_maps`).
//!
//! The x86 guest runs it from the `in_guest` test of e2e/tests/numa_vm.rs (the host's own test
//! binary); the arm64 guest from `arm64_in_guest`, the same test binary built for aarch64
//! (`hack/build-arm64.sh --guest`). Both write what they saw to `TAP_GUEST_REPORT`, a JSON file
//! in the exchange folder the host reads.

use crate::containerd::{
    cgroup_cpuset, cgroup_mems, CgroupQos, ContainerSpec, Containerd, ContainerdOptions, Cri,
    PodSpec,
};
use crate::util::parse_list;
use crate::vm;
use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod arm64;
mod x86;

pub use arm64::Scenarios;

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;
/// Where the memory toucher is mounted in containers.
const TOUCH_IN_CTR: &str = "/tap/tap-touch";

/// Which guest's checks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checks {
    /// 8 vCPUs in 2 sockets of 2 NUMA nodes (`vm::Shape::x86_two_sockets_four_nodes`).
    X86,
    /// 2 sockets of 2 clusters of 2 cores, a NUMA node per socket
    /// (`vm::Shape::arm64_two_sockets_four_clusters`), these scenarios of it.
    Arm64(Scenarios),
}

/// Runs `checks` in the guest (env `TAP_IN_GUEST=1`) and writes the report to
/// `TAP_GUEST_REPORT`, whatever the outcome; fails when a check failed.
pub fn main_in_guest(checks: Checks) -> Result<()> {
    ensure!(
        std::env::var("TAP_IN_GUEST").as_deref() == Ok("1"),
        "runs only inside a NUMA guest (the numa_vm tests boot one)"
    );
    let report_path = PathBuf::from(std::env::var("TAP_GUEST_REPORT")?);
    let mut report = json!({});
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(async {
        match checks {
            Checks::X86 => x86::checks(&mut report).await,
            Checks::Arm64(s) => arm64::checks(s, &mut report).await,
        }
    });
    if let Err(e) = &result {
        report["error"] = json!(format!("{e:#}"));
    }
    std::fs::write(&report_path, serde_json::to_string_pretty(&report)?)?;
    result
}

/// Records a check's wall time in the guest under `report["seconds"][name]`.
fn note_seconds(report: &mut Value, name: &str, started: Instant) {
    report["seconds"][name] = json!((started.elapsed().as_secs_f64() * 10.0).round() / 10.0);
}

/// The guest kernel's NUMA nodes: CPUs and memory.
struct GuestNodes {
    cpus: BTreeMap<usize, BTreeSet<usize>>,
    mem_kib: BTreeMap<usize, u64>,
}

impl GuestNodes {
    fn read() -> Result<GuestNodes> {
        let mut cpus = BTreeMap::new();
        let mut mem_kib = BTreeMap::new();
        for e in std::fs::read_dir("/sys/devices/system/node")? {
            let e = e?;
            let name = e.file_name().to_string_lossy().to_string();
            let Some(n) = name
                .strip_prefix("node")
                .and_then(|n| n.parse::<usize>().ok())
            else {
                continue;
            };
            cpus.insert(
                n,
                parse_list(&std::fs::read_to_string(e.path().join("cpulist"))?)?,
            );
            let meminfo = std::fs::read_to_string(e.path().join("meminfo"))?;
            let total = meminfo
                .lines()
                .find(|l| l.contains("MemTotal:"))
                .and_then(|l| l.split_whitespace().rev().nth(1))
                .and_then(|v| v.parse().ok())
                .context("node MemTotal")?;
            mem_kib.insert(n, total);
        }
        Ok(GuestNodes { cpus, mem_kib })
    }

    /// The node whose CPUs are exactly `set`.
    fn exactly(&self, set: &BTreeSet<usize>) -> Option<usize> {
        self.cpus.iter().find(|(_, c)| *c == set).map(|(n, _)| *n)
    }

    /// The node whose CPUs hold all of `set` (a whole node, or a pool within one).
    fn holding(&self, set: &BTreeSet<usize>) -> Option<usize> {
        if set.is_empty() {
            return None;
        }
        self.cpus
            .iter()
            .find(|(_, c)| set.is_subset(c))
            .map(|(n, _)| *n)
    }

    /// Each node's CPUs, for the report.
    fn report(&self) -> Value {
        json!(self
            .cpus
            .iter()
            .map(|(n, c)| (n.to_string(), list(c)))
            .collect::<BTreeMap<_, _>>())
    }
}

fn list(s: &BTreeSet<usize>) -> String {
    s.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn agent_bin() -> Result<PathBuf> {
    Ok(PathBuf::from(
        std::env::var("TAP_AGENT_BIN").context("TAP_AGENT_BIN")?,
    ))
}

/// The agent in NRI mode on the guest's containerd.
struct GuestAgent {
    child: Option<Child>,
    log: PathBuf,
    /// Its metrics port on the guest's loopback.
    metrics: u16,
}

impl GuestAgent {
    fn start(ctd: &Containerd, extra: &[&str]) -> Result<GuestAgent> {
        let log = ctd.dir().join("agent.log");
        let metrics = crate::util::free_port()?;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let restored = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("state restored from the runtime")
            .count();
        let child = Command::new(agent_bin()?)
            .args(ctd.nri_agent_args(None, &ctd.dir().join("agent-state")))
            .arg("--resource-policy=topology-aware")
            .arg("--enable-memory-topology=true")
            .arg(format!("--metrics-bind-address=127.0.0.1:{metrics}"))
            .args(extra)
            .env_remove("TAP_LOG")
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .context("starting kunpeng-tap")?;
        let mut a = GuestAgent {
            child: Some(child),
            log,
            metrics,
        };
        a.wait_restored(restored)?;
        Ok(a)
    }

    /// Waits (up to 3 minutes: TCG) until the log says "state restored" more than `before`
    /// times; fails when the agent exits first.
    fn wait_restored(&mut self, before: usize) -> Result<()> {
        let path = self.log.clone();
        let log = || std::fs::read_to_string(&path).unwrap_or_default();
        let restored = || log().matches("state restored from the runtime").count() > before;
        let child = self.child.as_mut().context("the agent is not running")?;
        crate::util::wait_child_ready(
            child,
            "the agent (restoring its state)",
            crate::util::Patience {
                timeout: Duration::from_secs(180),
                poll: Duration::from_millis(200),
            },
            restored,
            log,
        )
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The agent's books as its metrics show them: every pool's
    /// `tap_topology_node_{capacity,usage}_cpus` line (zone, level, CPUs), sorted.
    fn books(&self) -> Result<Vec<String>> {
        let body = crate::util::http_get(self.metrics, "/metrics")?;
        let mut lines: Vec<String> = body
            .lines()
            .filter(|l| l.starts_with("tap_topology_node_"))
            .map(str::to_string)
            .collect();
        ensure!(!lines.is_empty(), "no pool usage in /metrics:\n{body}");
        lines.sort();
        Ok(lines)
    }

    fn stop(&mut self) {
        crate::util::stop_child(&mut self.child);
    }
}

impl Drop for GuestAgent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The guest's containerd, the agent on it and a CRI client.
struct Rig {
    ctd: Containerd,
    agent: GuestAgent,
    cri: Cri,
}

impl Rig {
    /// containerd with NRI (TCG is an order of magnitude slower than the host: NRI requests
    /// get 10 s), then the agent with `flags` besides the common ones.
    async fn start(flags: &[&str], report: &mut Value) -> Result<Rig> {
        let opts = ContainerdOptions {
            nri_request_timeout: Duration::from_secs(10),
            ..ContainerdOptions::default()
        };
        let started = Instant::now();
        let ctd = Containerd::start(opts)?;
        note_seconds(report, "containerd_start", started);
        let started = Instant::now();
        let agent = GuestAgent::start(&ctd, flags)?;
        note_seconds(report, "agent_start", started);
        let cri = ctd.cri().await?;
        Ok(Rig { ctd, agent, cri })
    }

    /// Stops the agent and starts it again with `flags` on the same state.
    fn restart_agent(&mut self, flags: &[&str]) -> Result<()> {
        self.agent.stop();
        self.agent = GuestAgent::start(&self.ctd, flags)?;
        Ok(())
    }

    /// `out` as it is; when it failed, the agent's and containerd's logs are printed first.
    fn finish(mut self, out: Result<()>) -> Result<()> {
        if out.is_err() {
            println!("--- agent log\n{}", self.agent.log());
            println!("--- containerd log (tail)\n{}", self.ctd.log_tail(40));
        }
        self.agent.stop();
        out
    }
}

/// A running container of the tier and its process.
struct Placed {
    id: String,
    pid: u32,
}

/// A busybox container that runs the toucher on `mib` MiB.
fn toucher(
    name: &str,
    req_milli: u64,
    limit_milli: u64,
    mem_limit: u64,
    mib: u64,
) -> Result<ContainerSpec> {
    let bin = std::env::var("TAP_TOUCH_BIN").context("TAP_TOUCH_BIN")?;
    let dir = Path::new(&bin).parent().context("toucher dir")?;
    let mut c = ContainerSpec::cpus(name, req_milli, Some(limit_milli));
    c.memory_limit_bytes = Some(i64::try_from(mem_limit)?);
    c.command = vec![TOUCH_IN_CTR.into(), mib.to_string()];
    c.mounts = vec![(dir.display().to_string(), "/tap".into())];
    Ok(c)
}

async fn run(cri: &mut Cri, pod: &str, qos: CgroupQos, c: &ContainerSpec) -> Result<Placed> {
    let sb = cri.run_pod(&PodSpec::new(pod, qos)).await?;
    let id = cri.run_container(&sb, c).await?;
    let pid = cri.pid(&id).await?;
    Ok(Placed { id, pid })
}

/// Where a container's CPUs, memory nodes and pages are (its cgroup and `numa_maps`).
struct Whereabouts {
    cpus: BTreeSet<usize>,
    mems: BTreeSet<usize>,
    pages: BTreeMap<u32, u64>,
}

/// Runs the guide's Pod shape (Burstable, 1 CPU requested, 2 limit, 256 MiB, 64 MiB touched)
/// as Pod `pod` and reports where it is under `report[pod]`.
async fn guide_shaped_pod(
    cri: &mut Cri,
    pod: &str,
    report: &mut Value,
) -> Result<(Placed, Whereabouts)> {
    let c = toucher("app", 1000, 2000, 256 * MIB, 64)?;
    let p = run(cri, pod, CgroupQos::Burstable, &c).await?;
    let cpus = parse_list(&cgroup_cpuset(p.pid)?)?;
    let mems = parse_list(&cgroup_mems(p.pid)?)?;
    let pages = touched_pages(p.pid, 64)?;
    report[pod] = json!({"cpuset.cpus": list(&cpus), "cpuset.mems": list(&mems), "numa_maps_anon_pages": pages});
    Ok((p, Whereabouts { cpus, mems, pages }))
}

/// Anonymous pages per node of `pid` once it has touched `mib` MiB (90% of its pages seen).
fn touched_pages(pid: u32, mib: u64) -> Result<BTreeMap<u32, u64>> {
    let want = mib * MIB / PAGE * 9 / 10;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let text = std::fs::read_to_string(format!("/proc/{pid}/numa_maps"))?;
        let anon: String = text
            .lines()
            .filter(|l| l.contains("anon="))
            .collect::<Vec<_>>()
            .join("\n");
        let pages = vm::parse_numa_maps(&anon);
        if pages.values().sum::<u64>() >= want {
            return Ok(pages);
        }
        ensure!(
            Instant::now() < deadline,
            "pid {pid} never touched {mib} MiB: {pages:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Pages outside `mems`, of all.
fn outside(pages: &BTreeMap<u32, u64>, mems: &BTreeSet<usize>) -> (u64, u64) {
    let all = pages.values().sum();
    let out = pages
        .iter()
        .filter(|(n, _)| !mems.contains(&(**n as usize)))
        .map(|(_, p)| p)
        .sum();
    (out, all)
}

/// A container's memory is on NUMA node `node`: its cgroup's `cpuset.mems` is that node alone,
/// and at most 1% of its pages are elsewhere.
fn memory_on_node(mems: &BTreeSet<usize>, pages: &BTreeMap<u32, u64>, node: usize) -> Result<()> {
    ensure!(
        *mems == BTreeSet::from([node]),
        "cpuset.mems {mems:?}, not node {node}"
    );
    let (out, all) = outside(pages, mems);
    ensure!(
        out * 100 <= all,
        "{out} of {all} pages outside node {node}: {pages:?}"
    );
    Ok(())
}

/// A memory limit larger than one node's memory gets memory nodes that hold it, and the pages
/// stay within them.
async fn memory_over_nodes(
    cri: &mut Cri,
    nodes: &GuestNodes,
    touch_mib: u64,
    report: &mut Value,
) -> Result<()> {
    let limit = 700 * MIB;
    let c = toucher("big", 1000, 2000, limit, touch_mib)?;
    let p = run(cri, "bigmem", CgroupQos::Burstable, &c).await?;
    let mems = parse_list(&cgroup_mems(p.pid)?)?;
    let cpus = parse_list(&cgroup_cpuset(p.pid)?)?;
    let pages = touched_pages(p.pid, touch_mib)?;
    report["bigmem"] = json!({"cpuset.cpus": list(&cpus), "cpuset.mems": list(&mems), "numa_maps_anon_pages": pages});
    let held: u64 = mems
        .iter()
        .filter_map(|n| nodes.mem_kib.get(n))
        .sum::<u64>()
        * 1024;
    ensure!(mems.len() >= 2, "a {limit}-byte limit got mems {mems:?}");
    ensure!(held >= limit, "mems {mems:?} hold {held} bytes < {limit}");
    let (out, all) = outside(&pages, &mems);
    ensure!(
        out * 100 <= all,
        "{out} of {all} pages outside {mems:?}: {pages:?}"
    );
    Ok(())
}

/// An exclusive grant of `cpus` CPUs next to shared containers: at rest no other container's
/// cgroup holds the exclusive CPUs (the guest kernel's cpusets, not the books).
async fn exclusive_next_to_shared(cri: &mut Cri, cpus: u64, report: &mut Value) -> Result<()> {
    let mut c = ContainerSpec::cpus("excl", cpus * 1000, Some(cpus * 1000));
    c.memory_limit_bytes = Some(64 * MIB as i64);
    let g = run(cri, "exclusive", CgroupQos::Guaranteed, &c).await?;
    let mine = parse_list(&cgroup_cpuset(g.pid)?)?;
    ensure!(
        mine.len() as u64 == cpus,
        "exclusive cpuset {mine:?}, not {cpus} CPUs"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let others = loop {
        let others = cgroup_cpusets_but(cri, &g.id).await?;
        ensure!(
            !others.is_empty(),
            "no shared container next to the exclusive one"
        );
        let overlap: Vec<_> = others
            .iter()
            .filter(|(_, theirs)| !theirs.is_disjoint(&mine))
            .collect();
        if overlap.is_empty() {
            break others;
        }
        ensure!(
            Instant::now() < deadline,
            "shared containers on exclusive {mine:?}: {overlap:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    report["exclusive"] = json!({
        "cpuset.cpus": list(&mine),
        "cpuset.mems": cgroup_mems(g.pid)?.trim(),
        "others_cpuset.cpus": others.iter().map(|(_, c)| list(c)).collect::<Vec<_>>(),
    });
    Ok(())
}

/// The cgroup `cpuset.cpus` of every running container but `except`: (id, CPUs).
async fn cgroup_cpusets_but(cri: &mut Cri, except: &str) -> Result<Vec<(String, BTreeSet<usize>)>> {
    let mut out = Vec::new();
    for id in cri.list_running().await? {
        if id != except {
            let pid = cri.pid(&id).await?;
            out.push((id, parse_list(&cgroup_cpuset(pid)?)?));
        }
    }
    Ok(out)
}

/// Usage-aware rebalancing on a real kernel: five touchers of 32 MiB (500m, limit 1
/// CPU) over the four nodes, so two share one; those two spin. The rebalancer moves one of
/// them to another node, `cpuset.mems` with it, and the kernel migrates its pages there.
async fn rebalance_moves_pages(
    cri: &mut Cri,
    nodes: &GuestNodes,
    report: &mut Value,
) -> Result<()> {
    let ctl = PathBuf::from(format!("/var/tmp/tap-rebalance-{}", std::process::id()));
    let mut placed = Vec::new();
    for i in 0..5 {
        let dir = ctl.join(i.to_string());
        std::fs::create_dir_all(&dir)?;
        let mut c = toucher("app", 500, 1000, 128 * MIB, 32)?;
        c.command.push("/ctl/go".into());
        c.mounts.push((dir.display().to_string(), "/ctl".into()));
        let p = run(cri, &format!("spin{i}"), CgroupQos::Burstable, &c).await?;
        placed.push((node_of(nodes, p.pid)?, dir, p));
    }
    let home = (0..nodes.cpus.len())
        .find(|n| placed.iter().filter(|(m, _, _)| m == n).count() >= 2)
        .context("no two touchers on one node")?;
    let pair: Vec<&(usize, PathBuf, Placed)> = placed
        .iter()
        .filter(|(m, _, _)| *m == home)
        .take(2)
        .collect();
    for (_, dir, p) in &pair {
        touched_pages(p.pid, 32)?;
        std::fs::write(dir.join("go"), b"")?;
    }
    let moved = wait_rebalanced(cri, nodes, &pair, home).await?;
    let mems = parse_list(&cgroup_mems(moved.pid)?)?;
    let to = node_of(nodes, moved.pid)?;
    let after = pages_after_move(moved.pid, 32, &mems).await?;
    report["rebalance"] = json!({
        "from": home, "to": to, "cpuset.mems": list(&mems), "numa_maps_anon_pages": after,
    });
    memory_on_node(&mems, &after, to)?;
    let _ = std::fs::remove_dir_all(&ctl);
    Ok(())
}

/// Waits (up to 3 minutes: TCG) until one of the pair runs on another node; containerd 1.7
/// takes the update with its next NRI request, so a probe container is started every 10 s.
async fn wait_rebalanced<'a>(
    cri: &mut Cri,
    nodes: &GuestNodes,
    pair: &[&'a (usize, PathBuf, Placed)],
    home: usize,
) -> Result<&'a Placed> {
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut probes = 0;
    let mut next_probe = Instant::now() + Duration::from_secs(10);
    loop {
        for (_, _, p) in pair {
            if node_of(nodes, p.pid).is_ok_and(|n| n != home) {
                return Ok(p);
            }
        }
        ensure!(
            Instant::now() < deadline,
            "neither spinning container left node {home} in 3 minutes"
        );
        if Instant::now() > next_probe {
            let probe = ContainerSpec::sleeper("probe");
            run(
                cri,
                &format!("probe{probes}"),
                CgroupQos::BestEffort,
                &probe,
            )
            .await?;
            probes += 1;
            next_probe = Instant::now() + Duration::from_secs(10);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Where the `mib` MiB of `pid` are once at most 1% of them are outside `mems`, or after a
/// minute: the kernel migrates them as the cgroup's mems change, slowly under TCG.
async fn pages_after_move(
    pid: u32,
    mib: u64,
    mems: &BTreeSet<usize>,
) -> Result<BTreeMap<u32, u64>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pages = touched_pages(pid, mib)?;
        let (out, all) = outside(&pages, mems);
        if out * 100 <= all || Instant::now() > deadline {
            return Ok(pages);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The NUMA node whose CPUs hold the process's cgroup cpuset (the x86 guest's shared pools
/// are whole nodes; the arm64 guest's may be clusters within one).
fn node_of(nodes: &GuestNodes, pid: u32) -> Result<usize> {
    let cpus = parse_list(&cgroup_cpuset(pid)?)?;
    nodes
        .holding(&cpus)
        .with_context(|| format!("cpuset {cpus:?} is not within one NUMA node"))
}
