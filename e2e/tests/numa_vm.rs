//! The NUMA guest tier: the agent on a real kernel with real NUMA nodes (docs/design/numa-vm.md).
//!
//! `x86_numa_guest` boots one x86 guest (TCG) of 8 vCPUs in 2 sockets of 2 NUMA nodes (512 MiB
//! each, distances 10/12/20) and runs this same test binary in it (`in_guest`, ignored on the
//! host), on the guest's own kernel: containerd with NRI and runc as installed by the e2e setup,
//! the agent in NRI mode reading the guest's live `/sys` (no `--fold-cpus-to-host`), with
//! memory topology on. The guest writes what it saw to `report.json` in the exchange folder;
//! the host test fails with the guest's log when any check failed.

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tap_e2e::containerd::{
    cgroup_cpuset, cgroup_mems, CgroupQos, ContainerSpec, Containerd, ContainerdOptions, Cri,
    PodSpec,
};
use tap_e2e::util;
use tap_e2e::util::parse_list;
use tap_e2e::vm::{self, Shape};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;
/// Where the memory toucher is mounted in containers.
const TOUCH_IN_CTR: &str = "/tap/tap-touch";

// ---- host side ---------------------------------------------------------------------------------

#[test]
fn x86_numa_guest() -> Result<()> {
    if util::skip_unless_enabled("x86_numa_guest") {
        return Ok(());
    }
    let agent = util::agent_binary()?;
    let touch = build_toucher()?;
    let exe = std::env::current_exe()?;
    let script = format!(
        "x=$(dirname \"$0\")\n\
         export TAP_E2E=1 TAP_IN_GUEST=1 TAP_AGENT_BIN={agent} TAP_TOUCH_BIN={touch} \
         TAP_GUEST_REPORT=$x/report.json RUST_BACKTRACE=1 NO_COLOR=1\n\
         cd {ws}\n\
         exec {exe} --ignored --exact in_guest --nocapture --test-threads=1\n",
        agent = agent.display(),
        touch = touch.display(),
        ws = util::workspace_root().display(),
        exe = exe.display(),
    );
    let run = vm::run_x86(
        &Shape::x86_two_sockets_four_nodes(),
        &script,
        Duration::from_secs(900),
    )?;
    let report = std::fs::read_to_string(run.dir.join("report.json")).unwrap_or_default();
    println!(
        "guest ran {:.1} s wall, rc {:?}\nreport: {report}",
        run.wall.as_secs_f64(),
        run.rc
    );
    if run.rc != Some(0) {
        bail!(
            "the guest's checks failed (rc {:?}):\n--- run.log\n{}\n--- console (last 40 lines)\n{}",
            run.rc,
            run.log,
            tail(&run.console, 40)
        );
    }
    let _ = std::fs::remove_dir_all(&run.dir);
    Ok(())
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The memory toucher (`e2e/vm/touch.rs`), static so it runs in a busybox container.
fn build_toucher() -> Result<PathBuf> {
    let dir = PathBuf::from(format!("/var/tmp/tap-touch-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let out = dir.join("tap-touch");
    let src = util::workspace_root().join("e2e/vm/touch.rs");
    let st = Command::new("rustc")
        .args([
            "-O",
            "-C",
            "target-feature=+crt-static",
            "--edition",
            "2021",
        ])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status()
        .context("running rustc")?;
    ensure!(st.success(), "building {} failed", src.display());
    Ok(out)
}

// ---- guest side --------------------------------------------------------------------------------

#[test]
#[ignore = "runs inside the NUMA guest that x86_numa_guest boots"]
fn in_guest() -> Result<()> {
    ensure!(
        std::env::var("TAP_IN_GUEST").as_deref() == Ok("1"),
        "runs only inside the NUMA guest (x86_numa_guest boots it)"
    );
    let report_path = PathBuf::from(std::env::var("TAP_GUEST_REPORT")?);
    let mut report = json!({});
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(guest_checks(&mut report));
    if let Err(e) = &result {
        report["error"] = json!(format!("{e:#}"));
    }
    std::fs::write(&report_path, serde_json::to_string_pretty(&report)?)?;
    result
}

async fn guest_checks(report: &mut Value) -> Result<()> {
    let shape = Shape::x86_two_sockets_four_nodes();
    let nodes = GuestNodes::read()?;
    report["nodes"] = json!(nodes
        .cpus
        .iter()
        .map(|(n, c)| (n.to_string(), list(c)))
        .collect::<BTreeMap<_, _>>());
    explain_matches_shape(&shape, &nodes, report)?;

    let opts = ContainerdOptions {
        // TCG is an order of magnitude slower than the host.
        nri_request_timeout: Duration::from_secs(10),
        ..ContainerdOptions::default()
    };
    let ctd = Containerd::start(opts)?;
    let mut agent = GuestAgent::start(&ctd, &[])?;
    let mut cri = ctd.cri().await?;
    let steps = async {
        guide_pod_on_one_node(&mut cri, &nodes, report).await?;
        memory_over_nodes(&mut cri, &nodes, report).await?;
        exclusive_next_to_shared(&mut cri, report).await?;
        resize_moves_pages(&mut cri, &nodes, report).await?;
        // The last step restarts the agent with rebalancing on.
        cri.remove_all_pods().await?;
        agent.stop();
        agent = GuestAgent::start(&ctd, &["--rebalance=usage", "--rebalance-interval=1s"])?;
        rebalance_moves_pages(&mut cri, &nodes, report).await?;
        anyhow::Ok(())
    };
    let out = steps.await;
    if out.is_err() {
        println!("--- agent log\n{}", agent.log());
        println!("--- containerd log (tail)\n{}", ctd.log_tail(40));
    }
    agent.stop();
    out
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
}

fn list(s: &BTreeSet<usize>) -> String {
    s.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// `--explain` on the guest's live `/sys` names QEMU's shape: sockets, NUMA nodes, each
/// node's CPUs (as the kernel lists them) and distances.
fn explain_matches_shape(shape: &Shape, nodes: &GuestNodes, report: &mut Value) -> Result<()> {
    let out = Command::new(agent_bin()?)
        .args(["--explain", "--resource-policy=topology-aware"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    ensure!(
        out.status.success(),
        "--explain failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    report["explain"] = json!(text);
    let head = format!(
        "topology: {} CPUs online, {} sockets,",
        shape.cpus(),
        shape.sockets
    );
    ensure!(text.contains(&head), "--explain lacks {head:?}:\n{text}");
    ensure!(
        text.contains(&format!("{} NUMA nodes", shape.nodes.len())),
        "--explain lacks the NUMA node count:\n{text}"
    );
    for (i, n) in shape.nodes.iter().enumerate() {
        let i = i as u32;
        let kernel_cpus = nodes
            .cpus
            .get(&(i as usize))
            .context("guest node missing")?;
        let qemu_cpus: BTreeSet<usize> = (n.cpus.0 as usize..=n.cpus.1 as usize).collect();
        ensure!(
            *kernel_cpus == qemu_cpus,
            "node {i}: kernel cpus {kernel_cpus:?}, QEMU {qemu_cpus:?}"
        );
        let dist: Vec<String> = (0..shape.nodes.len() as u32)
            .map(|j| shape.distance(i, j).to_string())
            .collect();
        let line = format!("numa node {i}: cpus [{}-{}]", n.cpus.0, n.cpus.1);
        let found = text
            .lines()
            .find(|l| l.trim_start().starts_with(&line))
            .with_context(|| format!("--explain lacks {line:?}:\n{text}"))?;
        let want = format!("distances [{}]", dist.join(" "));
        ensure!(found.contains(&want), "{found:?} lacks {want:?}");
    }
    Ok(())
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
}

impl GuestAgent {
    fn start(ctd: &Containerd, extra: &[&str]) -> Result<GuestAgent> {
        let log = ctd.dir().join("agent.log");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let restored = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("state restored from the runtime")
            .count();
        let child = Command::new(agent_bin()?)
            .arg("--container-runtime-mode=NRI")
            .arg(format!("--nri-socket-path={}", ctd.nri_socket().display()))
            .arg("--resource-policy=topology-aware")
            .arg("--enable-memory-topology=true")
            .arg("--metrics-bind-address=127.0.0.1:0")
            .arg(format!(
                "--state-dir={}",
                ctd.dir().join("agent-state").display()
            ))
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
        };
        let deadline = Instant::now() + Duration::from_secs(180);
        while a.log().matches("state restored from the runtime").count() <= restored {
            if let Some(st) = a.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("the agent exited ({st}):\n{}", a.log());
            }
            ensure!(
                Instant::now() < deadline,
                "the agent never restored:\n{}",
                a.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(a)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for GuestAgent {
    fn drop(&mut self) {
        self.stop();
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

/// The guide's Pod shape (Burstable, 1 CPU requested, 2 limit, 256 MiB) lands on one NUMA node:
/// its cgroup holds exactly that node's CPUs and memory node, and its pages are there.
async fn guide_pod_on_one_node(
    cri: &mut Cri,
    nodes: &GuestNodes,
    report: &mut Value,
) -> Result<Placed> {
    let c = toucher("app", 1000, 2000, 256 * MIB, 64)?;
    let p = run(cri, "guide", CgroupQos::Burstable, &c).await?;
    let cpus = parse_list(&cgroup_cpuset(p.pid)?)?;
    let mems = parse_list(&cgroup_mems(p.pid)?)?;
    let pages = touched_pages(p.pid, 64)?;
    report["guide"] = json!({"cpuset.cpus": list(&cpus), "cpuset.mems": list(&mems), "numa_maps_anon_pages": pages});
    let node = nodes.exactly(&cpus).with_context(|| {
        format!(
            "cpuset {cpus:?} is not one NUMA node's CPUs {:?}",
            nodes.cpus
        )
    })?;
    memory_on_node(&mems, &pages, node)?;
    Ok(p)
}

/// A memory limit larger than one node's memory gets memory nodes that hold it, and the pages
/// stay within them.
async fn memory_over_nodes(cri: &mut Cri, nodes: &GuestNodes, report: &mut Value) -> Result<()> {
    let limit = 700 * MIB;
    let c = toucher("big", 1000, 2000, limit, 400)?;
    let p = run(cri, "bigmem", CgroupQos::Burstable, &c).await?;
    let mems = parse_list(&cgroup_mems(p.pid)?)?;
    let cpus = parse_list(&cgroup_cpuset(p.pid)?)?;
    let pages = touched_pages(p.pid, 400)?;
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

/// An exclusive grant next to shared containers: at rest no other container's cgroup holds
/// the exclusive CPUs (the guest kernel's cpusets, not the books).
async fn exclusive_next_to_shared(cri: &mut Cri, report: &mut Value) -> Result<()> {
    let mut c = ContainerSpec::cpus("excl", 1000, Some(1000));
    c.memory_limit_bytes = Some(64 * MIB as i64);
    let g = run(cri, "exclusive", CgroupQos::Guaranteed, &c).await?;
    let mine = parse_list(&cgroup_cpuset(g.pid)?)?;
    ensure!(mine.len() == 1, "exclusive cpuset {mine:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut overlap = Vec::new();
        for id in cri.list_running().await? {
            if id == g.id {
                continue;
            }
            let pid = cri.pid(&id).await?;
            let theirs = parse_list(&cgroup_cpuset(pid)?)?;
            if !theirs.is_disjoint(&mine) {
                overlap.push((id, list(&theirs)));
            }
        }
        if overlap.is_empty() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "shared containers on exclusive {mine:?}: {overlap:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    report["exclusive"] = json!({"cpuset.cpus": list(&mine)});
    Ok(())
}

/// A resize that no longer fits the container's NUMA node moves it to another one (the engine
/// keeps a resized container where it is while it fits): its cgroup's CPUs and memory node
/// change, and its pages follow (cgroup v2 migrates a cgroup's pages when `cpuset.mems`
/// changes). The layout is made with the engine's own rules: one container per node, a second
/// one on the mover's node, one node emptied, then the mover grows.
async fn resize_moves_pages(cri: &mut Cri, nodes: &GuestNodes, report: &mut Value) -> Result<()> {
    cri.remove_all_pods().await?;
    let mover = run(
        cri,
        "mover",
        CgroupQos::Burstable,
        &toucher("app", 1000, 2000, 256 * MIB, 64)?,
    )
    .await?;
    let home = node_of(nodes, mover.pid)?;
    let mut fillers = Vec::new();
    for i in 0..nodes.cpus.len() - 1 {
        let mut f = ContainerSpec::cpus("fill", 1000, Some(2000));
        f.memory_limit_bytes = Some(32 * MIB as i64);
        let p = run(cri, &format!("fill{i}"), CgroupQos::Burstable, &f).await?;
        fillers.push((node_of(nodes, p.pid)?, p));
    }
    let mut c = ContainerSpec::cpus("second", 1000, Some(1000));
    c.memory_limit_bytes = Some(32 * MIB as i64);
    let second = run(cri, "second", CgroupQos::Burstable, &c).await?;
    let second_node = node_of(nodes, second.pid)?;
    ensure!(
        second_node == home,
        "layout: the second container went to node {second_node}, not the mover's node {home} (fillers on {:?})",
        fillers.iter().map(|(n, _)| *n).collect::<Vec<_>>()
    );
    // Empty one node: the one whose filler is removed.
    let (freed, last) = fillers.pop().context("no filler")?;
    cri.stop_container(&last.id).await?;
    cri.remove_container(&last.id).await?;
    let before = touched_pages(mover.pid, 64)?;
    let mut grown = toucher("app", 1500, 2000, 256 * MIB, 64)?;
    grown.cpu_request_milli = Some(1500);
    cri.update_resources(&mover.id, grown.resources()).await?;
    let cpus = parse_list(&cgroup_cpuset(mover.pid)?)?;
    let mems = parse_list(&cgroup_mems(mover.pid)?)?;
    let after = pages_after_move(mover.pid, 64, &mems).await?;
    report["resize"] = json!({
        "before": {"node": home, "numa_maps_anon_pages": before},
        "after": {"cpuset.cpus": list(&cpus), "cpuset.mems": list(&mems), "numa_maps_anon_pages": after},
        "emptied_node": freed,
    });
    ensure!(
        nodes.exactly(&cpus) == Some(freed),
        "the grown container's cpuset {cpus:?}: not node {freed}'s CPUs"
    );
    memory_on_node(&mems, &after, freed)
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

/// The NUMA node whose CPUs are exactly the process's cgroup cpuset.
fn node_of(nodes: &GuestNodes, pid: u32) -> Result<usize> {
    let cpus = parse_list(&cgroup_cpuset(pid)?)?;
    nodes
        .exactly(&cpus)
        .with_context(|| format!("cpuset {cpus:?} is not one NUMA node's CPUs"))
}

// ---- arm64 guest -------------------------------------------------------------------------------

/// The static arm64 agent: `TAP_ARM64_AGENT`, else what hack/build-arm64.sh built.
fn arm64_agent() -> Result<PathBuf> {
    let p = std::env::var_os("TAP_ARM64_AGENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/kunpeng-tap/arm64/out/kunpeng-tap"));
    ensure!(
        p.exists(),
        "{} is missing: run hack/build-arm64.sh",
        p.display()
    );
    Ok(p)
}

/// The files of the guest's sysfs the agent reads, copied as they are (node meminfo: its
/// MemTotal line), with the kernel's `cpuN/nodeK` links: a fixture of the live arm64 kernel.
const CAPTURE_SYSFS: &str = r#"
S=/sys/devices/system; O=/xchg/sysfs/devices/system
mkdir -p $O/cpu $O/node
for f in online possible present isolated offline; do [ -f $S/cpu/$f ] && cat $S/cpu/$f > $O/cpu/$f; done
for c in $S/cpu/cpu[0-9]*; do
  n=${c##*/}; mkdir -p $O/cpu/$n/topology $O/cpu/$n/regs/identification
  for f in $c/topology/*; do [ -f $f ] && cat $f > $O/cpu/$n/topology/${f##*/}; done
  for f in midr_el1 revidr_el1; do [ -f $c/regs/identification/$f ] && cat $c/regs/identification/$f > $O/cpu/$n/regs/identification/$f; done
  for l in $c/node[0-9]*; do [ -e $l ] && ln -s ../../node/${l##*/} $O/cpu/$n/${l##*/}; done
done
for f in online possible has_cpu has_memory has_normal_memory; do [ -f $S/node/$f ] && cat $S/node/$f > $O/node/$f; done
for d in $S/node/node[0-9]*; do
  n=${d##*/}; mkdir -p $O/node/$n
  cat $d/cpulist > $O/node/$n/cpulist; cat $d/distance > $O/node/$n/distance
  grep MemTotal $d/meminfo > $O/node/$n/meminfo
done
"#;

/// The arm64 agent on a live arm64 kernel shaped like a Kunpeng (2 sockets, 2 clusters of 2
/// cores each, 2 NUMA nodes): its pool tree shows what QEMU was given, a small container with
/// cluster affinity lands on a cluster, and the guest's sysfs, captured, is the repository's
/// fixture `qemu-arm64-2s-4cluster-2numa` (and the host's agent explains it the same way).
#[test]
fn arm64_guest_topology() -> Result<()> {
    if util::skip_unless_enabled("arm64_guest_topology") {
        return Ok(());
    }
    let agent = arm64_agent()?;
    let dir = vm::exchange_dir()?;
    std::fs::copy(&agent, dir.join("kunpeng-tap"))?;
    let script = format!(
        "cd /xchg\n\
         ./kunpeng-tap --explain --topology-cluster-affinity --resource-policy=topology-aware > explain.txt 2> explain.err\n\
         echo $? > explain.rc\n\
         {CAPTURE_SYSFS}\n\
         exit $(cat explain.rc)\n"
    );
    let shape = Shape::arm64_two_sockets_four_clusters();
    let run = vm::run(
        vm::Arch::Arm64,
        &shape,
        &dir,
        &script,
        Duration::from_secs(300),
    )?;
    let explain = std::fs::read_to_string(dir.join("explain.txt")).unwrap_or_default();
    println!(
        "arm64 guest ran {:.1} s wall, rc {:?}\n{explain}",
        run.wall.as_secs_f64(),
        run.rc
    );
    ensure!(
        run.rc == Some(0),
        "the arm64 agent failed in the guest (rc {:?}):\n{}\n{}\n--- console\n{}",
        run.rc,
        run.log,
        std::fs::read_to_string(dir.join("explain.err")).unwrap_or_default(),
        tail(&run.console, 30)
    );
    check_arm64_explain(&explain)?;
    let captured = dir.join("sysfs");
    compare_with_fixture(&captured)?;
    // The host's (x86) agent reads the captured tree as the arm64 agent read the live one.
    let host = Command::new(util::agent_binary()?)
        .args([
            "--explain",
            "--topology-cluster-affinity",
            "--resource-policy=topology-aware",
        ])
        .arg(format!("--sysfs-root={}", captured.display()))
        .output()?;
    let host_text = String::from_utf8_lossy(&host.stdout);
    ensure!(
        host_text == explain,
        "the host's agent explains the captured sysfs differently:\n{host_text}\n--- guest:\n{explain}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn check_arm64_explain(explain: &str) -> Result<()> {
    for want in [
        "topology: 8 CPUs online, 2 sockets,",
        "2 NUMA nodes, 4 clusters, 8 cores",
        "numa node 0: cpus [0-3]",
        "numa node 1: cpus [4-7]",
        "distances [20 10]",
    ] {
        ensure!(
            explain.contains(want),
            "--explain lacks {want:?}:\n{explain}"
        );
    }
    // QEMU's `-cpu max` is no HiSilicon part: identified from the live midr_el1, not a Kunpeng.
    let cpu = explain
        .lines()
        .find(|l| l.starts_with("cpu:"))
        .context("no cpu: line")?;
    ensure!(
        cpu.contains("midr_el1") && !cpu.contains("Kunpeng"),
        "the guest's CPU line: {cpu}"
    );
    let clusters: Vec<&str> = explain
        .lines()
        .filter(|l| l.contains("[cluster] cpus"))
        .collect();
    ensure!(clusters.len() == 4, "4 cluster pools expected:\n{explain}");
    for (i, cpus) in ["0-1", "2-3", "4-5", "6-7"].iter().enumerate() {
        ensure!(
            clusters[i].contains(&format!("cpus {cpus} (2)")),
            "cluster {i} is not CPUs {cpus}: {}",
            clusters[i]
        );
    }
    let small = explain
        .lines()
        .find(|l| l.trim_start().starts_with("burstable-1-2"))
        .context("no burstable-1-2 sample")?;
    ensure!(
        small.contains("(cluster") && small.contains("fits one cluster"),
        "a 1-2 CPU container did not get a cluster: {small}"
    );
    Ok(())
}

/// The captured tree equals the fixture in the repository, file by file.
fn compare_with_fixture(captured: &Path) -> Result<()> {
    let fixture = util::fixture_dir("qemu-arm64-2s-4cluster-2numa");
    let (got, want) = (tree(captured)?, tree(&fixture)?);
    let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    let differ: Vec<_> = want
        .iter()
        .filter(|(k, v)| got.get(*k).is_some_and(|g| !same_file(k, g, v)))
        .map(|(k, _)| k)
        .collect();
    ensure!(
        missing.is_empty() && extra.is_empty() && differ.is_empty(),
        "the guest's sysfs differs from fixtures/sysfs/qemu-arm64-2s-4cluster-2numa \
         (if QEMU or the kernel changed: python3 hack/sysfsdump.py dump {} \
         fixtures/sysfs/qemu-arm64-2s-4cluster-2numa): missing {missing:?}, extra {extra:?}, differ {differ:?}",
        captured.display()
    );
    Ok(())
}

/// Equal contents; a node's `meminfo` (its MemTotal line) within 1%: the kernel's own
/// allocations move it by a page or so from one boot to the next (513,344 kB, then 513,340 kB).
fn same_file(path: &str, got: &str, want: &str) -> bool {
    if !path.ends_with("/meminfo") {
        return got == want;
    }
    match (mem_total_kb(got), mem_total_kb(want)) {
        (Some(g), Some(w)) => g.abs_diff(w).saturating_mul(100) <= w,
        _ => got == want,
    }
}

fn mem_total_kb(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.contains("MemTotal:"))?;
    line.split_whitespace().rev().nth(1)?.parse().ok()
}

/// Relative path → content (a symlink: "-> target").
fn tree(root: &Path) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e?.path();
            let rel = p.strip_prefix(root)?.display().to_string();
            let meta = std::fs::symlink_metadata(&p)?;
            if meta.file_type().is_symlink() {
                out.insert(rel, format!("-> {}", std::fs::read_link(&p)?.display()));
            } else if meta.is_dir() {
                stack.push(p);
            } else {
                out.insert(rel, std::fs::read_to_string(&p)?);
            }
        }
    }
    Ok(out)
}

/// The fixture comparison's tolerance: a page of MemTotal is noise, another size is not.
#[test]
fn meminfo_compared_within_one_percent() {
    let want = "Node 1 MemTotal:         513344 kB\n";
    let path = "devices/system/node/node1/meminfo";
    assert!(same_file(
        path,
        "Node 1 MemTotal:         513340 kB\n",
        want
    ));
    assert!(!same_file(
        path,
        "Node 1 MemTotal:         400000 kB\n",
        want
    ));
    assert!(!same_file(path, "garbage\n", want));
    assert!(!same_file(
        "devices/system/node/node1/cpulist",
        "0-3\n",
        "4-7\n"
    ));
}
