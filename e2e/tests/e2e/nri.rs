//! NRI plugin mode against a real containerd 1.7 (NRI v0.6.1) with runc, or the containerd 2.x
//! that `TAP_CONTAINERD_ROOT` names (docs/design/nri.md, "containerd versions tested").
//!
//! The agent runs as an external NRI plugin with a fixture topology
//! (synthetic-2s-4numa-96c-gpu: 4 NUMA nodes, 0-23 / 24-47 / 48-71 / 72-95) and
//! `--fold-cpus-to-host`, so its decisions are applied to this host's CPUs (NUMA node k -> host CPU
//! k mod n: containers on different NUMA nodes get different cgroup cpusets). Pods and
//! containers are made through CRI; each check reads back (a) the container's OCI spec from
//! ContainerStatus (verbose) and (b) the running container's cgroup `cpuset.cpus`, and the
//! grant record the plugin stored in the container's annotations says what the engine decided.

use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tap_e2e::containerd::{
    cgroup_cpuset, cgroup_mems, remove_cgroup_tree, CgroupQos, ContainerSpec, Containerd,
    ContainerdOptions, Cri, PodSpec,
};
use tap_e2e::text::{grant_fields, samples};
use tap_e2e::util;

const GRANT_KEY: &str = "tap.kunpeng.huawei.com/grant";
const FIXTURE: &str = "synthetic-2s-4numa-96c-gpu";
/// Two threads per core, siblings n and n+48 (hyperthread controls).
const SMT: &str = "synthetic-2s-2numa-smt-96t";

// ---- small helpers ---------------------------------------------------------------------------

fn parse_list(s: &str) -> BTreeSet<usize> {
    util::parse_list(s).unwrap_or_else(|e| panic!("CPU list {s:?}: {e}"))
}

/// What `--fold-cpus-to-host` does to a fixture cpuset: every CPU of NUMA node k ->
/// host[k % n] (node_agent::fold).
fn fold(fixture_cpus: &BTreeSet<usize>) -> BTreeSet<usize> {
    fold_in(FIXTURE, fixture_cpus)
}

/// [`fold`] for another fixture: its NUMA node k onto host CPU k mod n.
fn fold_in(fixture: &str, fixture_cpus: &BTreeSet<usize>) -> BTreeSet<usize> {
    let host = util::host_cpus();
    let node = |k: usize| {
        let p = util::fixture_dir(fixture).join(format!("devices/system/node/node{k}/cpulist"));
        std::fs::read_to_string(p).ok().map(|s| parse_list(&s))
    };
    (0..)
        .map_while(|k| node(k).map(|cpus| (k, cpus)))
        .filter(|(_, cpus)| !cpus.is_disjoint(fixture_cpus))
        .map(|(k, _)| host[k % host.len()])
        .collect()
}

/// The fixture's CPUs of NUMA node `n`.
fn node_cpus(n: usize) -> BTreeSet<usize> {
    let p = util::fixture_dir(FIXTURE).join(format!("devices/system/node/node{n}/cpulist"));
    parse_list(&std::fs::read_to_string(&p).unwrap())
}

/// Whether the /metrics text `m` has a series of error kind `kind` at exactly 1.
fn counted_once(m: &str, kind: &str) -> bool {
    let label = format!("kind=\"{kind}\"");
    m.lines().any(|l| l.contains(&label) && l.ends_with(" 1"))
}

/// The agent as an NRI plugin; killed on drop.
struct Agent {
    child: Option<Child>,
    log: PathBuf,
    metrics_port: u16,
}

impl Agent {
    fn start(ctd: &Containerd, tag: &str, extra: &[&str]) -> Result<Agent> {
        Agent::start_on(ctd, tag, FIXTURE, extra)
    }

    /// The agent on another fixture's topology (folded onto this host).
    fn start_on(ctd: &Containerd, tag: &str, fixture: &str, extra: &[&str]) -> Result<Agent> {
        let log = ctd.dir().join(format!("agent-{tag}.log"));
        let f = std::fs::File::create(&log)?;
        let metrics_port = util::free_port()?;
        let child = Command::new(util::agent_binary().expect("building kunpeng-tap"))
            .args(ctd.nri_agent_args(Some(fixture), &ctd.dir().join("agent-state")))
            .arg("--resource-policy=topology-aware")
            .arg(format!("--metrics-bind-address=127.0.0.1:{metrics_port}"))
            .args(extra)
            .env("NO_COLOR", "1")
            .env_remove("TAP_LOG")
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .context("starting kunpeng-tap")?;
        let mut a = Agent {
            child: Some(child),
            log,
            metrics_port,
        };
        a.wait_log(
            "state restored from the runtime",
            1,
            Duration::from_secs(20),
        )?;
        Ok(a)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `needle` appears at least `count` times in the agent log.
    fn wait_log(&mut self, needle: &str, count: usize, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log_text().matches(needle).count() >= count {
                return Ok(());
            }
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("the agent exited ({st}):\n{}", self.log_text());
            }
            if Instant::now() > deadline {
                bail!(
                    "agent log never showed {needle:?} x{count}:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The agent's /metrics text.
    fn metrics_text(&self) -> Result<String> {
        util::http_get(self.metrics_port, "/metrics")
    }

    /// `tap_topology_node_usage_cpus` per NUMA zone, from /metrics.
    fn numa_usage(&self) -> Result<HashMap<String, f64>> {
        let body = self.metrics_text()?;
        let out: HashMap<String, f64> = samples(&body, "tap_topology_node_usage_cpus")
            .into_iter()
            .filter(|s| s.labels.get("level").map(String::as_str) == Some("numa"))
            .map(|s| (s.labels.get("zone").cloned().unwrap_or_default(), s.value))
            .collect();
        if out.is_empty() {
            bail!("no NUMA usage in /metrics:\n{body}");
        }
        Ok(out)
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args([&format!("-{sig}"), &c.id().to_string()])
                .status();
        }
    }

    fn stop(&mut self) {
        util::stop_child(&mut self.child);
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Removes the e2e cgroups when the test ends, also on failure (declared first, dropped last).
struct CgroupGuard;
impl Drop for CgroupGuard {
    fn drop(&mut self) {
        remove_cgroup_tree();
    }
}

/// What one container got.
#[derive(Debug)]
struct Placement {
    spec_cpus: String,
    spec_mems: String,
    cgroup_cpus: String,
    record: Option<BTreeMap<String, String>>,
}

async fn placement(cri: &mut Cri, id: &str) -> Result<Placement> {
    let spec_cpus = cri.spec_cpuset(id).await?;
    let spec_mems = cri.spec_mems(id).await?;
    let ann = cri.spec_annotations(id).await?;
    let pid = cri.pid(id).await?;
    Ok(Placement {
        spec_cpus,
        spec_mems,
        cgroup_cpus: cgroup_cpuset(pid)?,
        record: ann.get(GRANT_KEY).map(|r| grant_fields(r)),
    })
}

/// A placed container: the spec and the cgroup both show the folded engine decision.
fn assert_placed_on_node(p: &Placement, what: &str) -> usize {
    let rec = p
        .record
        .as_ref()
        .unwrap_or_else(|| panic!("{what}: no grant record in the spec annotations: {p:?}"));
    let nodes = parse_list(&rec["n"]);
    assert_eq!(nodes.len(), 1, "{what}: expected one NUMA node: {p:?}");
    let node = *nodes.iter().next().unwrap();
    let want = fold(&node_cpus(node));
    assert_eq!(parse_list(&p.spec_cpus), want, "{what}: spec cpuset {p:?}");
    assert_eq!(
        parse_list(&p.cgroup_cpus),
        want,
        "{what}: cgroup cpuset {p:?}"
    );
    node
}

fn assert_untouched(p: &Placement, what: &str) {
    assert!(p.record.is_none(), "{what}: unexpected grant {p:?}");
    assert_eq!(p.spec_cpus, "", "{what}: spec cpuset was set {p:?}");
    let all: BTreeSet<usize> = util::host_cpus().into_iter().collect();
    assert_eq!(parse_list(&p.cgroup_cpus), all, "{what}: cgroup {p:?}");
}

async fn run_burstable(cri: &mut Cri, name: &str) -> Result<(String, String)> {
    let pod = PodSpec::new(name, CgroupQos::Burstable);
    let sb = cri.run_pod(&pod).await?;
    let id = cri
        .run_container(&sb, &ContainerSpec::cpus("app", 4000, Some(8000)))
        .await?;
    Ok((sb, id))
}

/// Runs Pod `pod` with the one container `spec`; the container's id.
async fn start(cri: &mut Cri, pod: &PodSpec, spec: &ContainerSpec) -> String {
    let sb = cri.run_pod(pod).await.expect("the Pod runs");
    cri.run_container(&sb, spec)
        .await
        .expect("the container runs")
}

/// [`start`] of a container `app` of `req` (and `lim`) millicores; its id and placement.
async fn run_app(cri: &mut Cri, pod: &PodSpec, req: u64, lim: Option<u64>) -> (String, Placement) {
    let id = start(cri, pod, &ContainerSpec::cpus("app", req, lim)).await;
    let p = placement(cri, &id).await.expect("a placement");
    (id, p)
}

fn setup() -> (CgroupGuard, Containerd) {
    util::require_e2e_tier();
    let guard = CgroupGuard;
    remove_cgroup_tree();
    let ctd = Containerd::start(ContainerdOptions::default()).expect("starting containerd");
    (guard, ctd)
}

// ---- tests -----------------------------------------------------------------------------------

/// The cpuset the agent decided for container `id`, in the fixture's CPUs (unfolded), from its
/// `placed` log line.
fn logged_cpus(agent: &Agent, id: &str) -> Option<BTreeSet<usize>> {
    tap_e2e::util::logged_cpus(&agent.log_text(), &format!("container={id} "))
}

/// Hyperthreads on the 2-thread fixture (siblings n and n+48), folded: a
/// Guaranteed 3-CPU Pod is no whole number of cores (shared CPUs, a Warning, a metric); a
/// `sibling-pair` Pod gets one core's two threads; a `hide-hyperthreads` Pod holds two whole
/// cores and runs on one thread of each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn nri_hyperthread_controls() {
    let (_g, ctd) = setup();
    let agent = Agent::start_on(&ctd, "ht", SMT, &[]).expect("agent");
    let mut cri = ctd.cri().await.expect("cri");
    let guaranteed = |name: &str| PodSpec::new(name, CgroupQos::Guaranteed);

    let (_, p) = run_app(&mut cri, &guaranteed("three"), 3000, Some(3000)).await;
    let rec = p.record.as_ref().expect("placed");
    assert_eq!(rec["x"], "", "3 CPUs are no whole cores: shared, {p:?}");
    assert!(
        !p.cgroup_cpus.is_empty() && p.cgroup_cpus == p.spec_cpus,
        "{p:?}"
    );
    assert!(
        agent
            .log_text()
            .contains("not honoured: exclusive-cores whole"),
        "{}",
        agent.log_text()
    );
    let m = agent.metrics_text().unwrap();
    assert!(counted_once(&m, "whole_cores"), "{m}");
    eprintln!(
        "guaranteed-3: record {rec:?}, cgroup cpuset {}",
        p.cgroup_cpus
    );

    let pod =
        guaranteed("pair").annotation("tap.kunpeng.huawei.com/exclusive-cores", "sibling-pair");
    let (_, p) = run_app(&mut cri, &pod, 2000, Some(2000)).await;
    let x = parse_list(&p.record.as_ref().expect("placed")["x"]);
    let v: Vec<usize> = x.iter().copied().collect();
    assert!(
        v.len() == 2 && v[1] == v[0] + 48,
        "one core's siblings: {p:?}"
    );
    assert_eq!(parse_list(&p.cgroup_cpus), fold_in(SMT, &x), "{p:?}");
    eprintln!("sibling-pair: x={v:?}, cgroup cpuset {}", p.cgroup_cpus);

    let pod = guaranteed("hide").annotation("tap.kunpeng.huawei.com/hide-hyperthreads", "true");
    let (id, p) = run_app(&mut cri, &pod, 4000, Some(4000)).await;
    let x = parse_list(&p.record.as_ref().expect("placed")["x"]);
    assert_eq!(x.len(), 4, "two whole cores held: {p:?}");
    assert!(x.iter().all(|c| x.contains(&((c + 48) % 96))), "{x:?}");
    let seen = logged_cpus(&agent, &id).expect("placed line");
    assert_eq!(seen.len(), 2, "one thread per core: {seen:?}");
    assert!(
        seen.is_subset(&x) && seen.iter().all(|c| *c < 48),
        "{seen:?} of {x:?}"
    );
    assert_eq!(parse_list(&p.cgroup_cpus), fold_in(SMT, &seen), "{p:?}");
    eprintln!(
        "hide-hyperthreads: x={x:?}, container cpuset {seen:?}, cgroup cpuset {}",
        p.cgroup_cpus
    );
    cri.remove_all_pods().await.unwrap();
}

/// Memory tiers on the 2-PMEM server fixture, folded (this host has one NUMA
/// node and no PMEM, so the runtime gets its node 0; the grant record keeps the fixture's
/// nodes): a plain Pod's mems hold DRAM only; a `memory-type: pmem` Pod's hold its node and the
/// PMEM node nearest to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn nri_memory_tiers() {
    let (_g, ctd) = setup();
    let fixture = "2socket-snc2-4numa-2pmem-112cpu-smt2";
    let agent =
        Agent::start_on(&ctd, "tiers", fixture, &["--enable-memory-topology"]).expect("agent");
    let mut cri = ctd.cri().await.expect("cri");
    let mems_of = |p: &Placement| parse_list(&p.record.as_ref().expect("placed")["mems"]);

    let (_, p) = run_app(
        &mut cri,
        &PodSpec::new("plain", CgroupQos::Burstable),
        2000,
        Some(4000),
    )
    .await;
    let plain = mems_of(&p);
    assert!(
        plain.len() == 1 && plain.iter().all(|n| *n < 4),
        "DRAM only: {p:?}"
    );
    assert_eq!(p.spec_mems, "0", "{p:?}");

    let pod = PodSpec::new("pmem", CgroupQos::Burstable)
        .annotation("tap.kunpeng.huawei.com/memory-type", "dram,pmem");
    let (id, p) = run_app(&mut cri, &pod, 2000, Some(4000)).await;
    let mems = mems_of(&p);
    let rec = p.record.as_ref().unwrap();
    let node: usize = rec["n"].parse().expect("one node");
    let near = if node == 2 { 5 } else { 4 };
    assert_eq!(mems, BTreeSet::from([node, near]), "{p:?}");
    assert_eq!(p.spec_mems, "0", "{p:?}");
    assert_eq!(cgroup_mems(cri.pid(&id).await.unwrap()).unwrap(), "0");
    eprintln!(
        "memory-type pmem: record {rec:?}, spec mems {}",
        p.spec_mems
    );

    // No HBM here: DRAM only, a Warning and the metric.
    let pod = PodSpec::new("hbm", CgroupQos::Burstable)
        .annotation("tap.kunpeng.huawei.com/memory-type", "hbm");
    let (_, p) = run_app(&mut cri, &pod, 2000, Some(4000)).await;
    assert_eq!(mems_of(&p).len(), 1, "{p:?}");
    assert!(agent.log_text().contains("not honoured: memory-type hbm"));
    let m = agent.metrics_text().unwrap();
    assert!(counted_once(&m, "memory_type"), "{m}");
    cri.remove_all_pods().await.unwrap();
}

/// The cache level on the fixture with 4 L3 groups of 8 CPUs per NUMA node,
/// folded: Burstable 4/8 containers land on L3 groups (`pool=cache<k>` in the grant record),
/// different ones; with `level: numa` on the node; a metric zone per cache pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn nri_cache_level() {
    let (_g, ctd) = setup();
    let fixture = "synthetic-2s-2numa-64t-8ccx";
    let agent = Agent::start_on(&ctd, "cache", fixture, &[]).expect("agent");
    let mut cri = ctd.cri().await.expect("cri");
    let mut pools = BTreeSet::new();
    for i in 0..2 {
        let (_, id) = run_burstable(&mut cri, &format!("l3-{i}")).await.unwrap();
        let p = placement(&mut cri, &id).await.unwrap();
        let rec = p.record.as_ref().expect("placed");
        assert!(rec["pool"].starts_with("cache"), "{p:?}");
        let seen = logged_cpus(&agent, &id).expect("placed line");
        assert_eq!(seen.len(), 8, "one L3 group: {seen:?}");
        assert_eq!(parse_list(&p.cgroup_cpus), fold_in(fixture, &seen), "{p:?}");
        eprintln!(
            "burstable 4/8 #{i}: pool {}, cpus {seen:?}, cgroup cpuset {}",
            rec["pool"], p.cgroup_cpus
        );
        pools.insert(rec["pool"].clone());
    }
    assert_eq!(pools.len(), 2, "two L3 groups: {pools:?}");
    let pod = PodSpec::new("numa-level", CgroupQos::Burstable)
        .annotation("tap.kunpeng.huawei.com/level", "numa");
    let (_, p) = run_app(&mut cri, &pod, 4000, Some(8000)).await;
    assert!(
        p.record.as_ref().unwrap()["pool"].starts_with("socket"),
        "{p:?}"
    );
    let m = agent.metrics_text().unwrap();
    assert!(m.contains("level=\"cache\""), "cache zones:\n{m}");
    cri.remove_all_pods().await.unwrap();
}

/// `numa-policy: exclusive` on the 4-node fixture, folded: the Pod gets every
/// CPU of one node (its grant record), a BestEffort container started next runs without them,
/// Burstable containers go to the other nodes, and a second exclusive Pod with no free node is
/// left unpinned with the metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn nri_numa_exclusive() {
    let (_g, ctd) = setup();
    let agent = Agent::start(&ctd, "numa-exclusive", &[]).expect("agent");
    let mut cri = ctd.cri().await.expect("cri");
    let exclusive = |name: &str| {
        PodSpec::new(name, CgroupQos::Burstable)
            .annotation("tap.kunpeng.huawei.com/numa-policy", "exclusive")
    };
    let (_, p) = run_app(&mut cri, &exclusive("whole-node"), 2000, Some(4000)).await;
    let rec = p.record.as_ref().expect("placed");
    let node: usize = rec["n"].parse().expect("one node");
    let x = parse_list(&rec["x"]);
    assert_eq!(x, node_cpus(node), "every CPU of node {node}: {p:?}");
    assert_eq!(parse_list(&p.cgroup_cpus), fold(&x), "{p:?}");
    eprintln!(
        "numa-policy exclusive: node {node}, x={}, cgroup cpuset {}",
        rec["x"], p.cgroup_cpus
    );

    let be = start(
        &mut cri,
        &PodSpec::new("be", CgroupQos::BestEffort),
        &ContainerSpec::sleeper("app"),
    )
    .await;
    placement(&mut cri, &be).await.unwrap();
    let seen = logged_cpus(&agent, &be).expect("placed line");
    assert!(
        seen.is_disjoint(&x) && seen.len() == 72,
        "BestEffort: {seen:?}"
    );
    for i in 0..3 {
        let (_, id) = run_burstable(&mut cri, &format!("b{i}")).await.unwrap();
        let p = placement(&mut cri, &id).await.unwrap();
        assert_ne!(assert_placed_on_node(&p, "burstable"), node, "{p:?}");
    }
    let id = start(
        &mut cri,
        &exclusive("no-node-left"),
        &ContainerSpec::cpus("app", 2000, Some(4000)),
    )
    .await;
    assert_untouched(&placement(&mut cri, &id).await.unwrap(), "no free node");
    let m = agent.metrics_text().unwrap();
    assert!(counted_once(&m, "exclusive_numa"), "{m}");
    cri.remove_all_pods().await.unwrap();
}

/// Burstable 4/8, four of them on four NUMA nodes, Guaranteed exclusive, BestEffort, opt-out
/// label and annotation, a malformed annotation, removal freeing capacity, memory binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn nri_places_containers_through_containerd() {
    let (_g, ctd) = setup();
    let started = Instant::now();
    let agent = Agent::start(&ctd, "a", &["--enable-memory-topology"]).expect("agent");
    let mut cri = ctd.cri().await.expect("cri");

    // Burstable 4/8 x4: one NUMA node each, four different nodes.
    let mut nodes = Vec::new();
    let mut ids = Vec::new();
    for i in 0..4 {
        let (sb, id) = run_burstable(&mut cri, &format!("burst{i}")).await.unwrap();
        let p = placement(&mut cri, &id).await.unwrap();
        let node = assert_placed_on_node(&p, &format!("burstable {i}"));
        // Memory topology on: mems = the node (folded onto this host's nodes).
        assert_eq!(p.spec_mems, "0", "mems in spec: {p:?}");
        assert_eq!(cgroup_mems(cri.pid(&id).await.unwrap()).unwrap(), "0");
        assert_eq!(p.record.as_ref().unwrap()["r"], "4000");
        nodes.push(node);
        ids.push((sb, id));
    }
    let distinct: BTreeSet<usize> = nodes.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        4,
        "four 4/8 containers on four nodes: {nodes:?}"
    );
    // The fold tells NUMA nodes apart: containers on neighbouring nodes (k, k+1) have
    // different cgroup cpusets on any host with more than one CPU.
    if util::host_cpus().len() > 1 {
        let mut by_node = HashMap::new();
        for (node, (_, id)) in nodes.iter().zip(&ids) {
            let pid = cri.pid(id).await.unwrap();
            by_node.insert(*node, cgroup_cpuset(pid).unwrap());
        }
        for k in 0..3 {
            assert_ne!(
                by_node[&k],
                by_node[&(k + 1)],
                "NUMA nodes {k} and {} share a cgroup cpuset: {by_node:?}",
                k + 1
            );
        }
    }
    let usage = agent.numa_usage().unwrap();
    assert_eq!(usage.values().sum::<f64>(), 16.0, "{usage:?}");

    // Removal frees capacity: remove the one on node 2; the next 4/8 goes there.
    let k = nodes.iter().position(|n| *n == 2).unwrap();
    let (sb, id) = ids.remove(k);
    cri.stop_container(&id).await.unwrap();
    cri.remove_container(&id).await.unwrap();
    cri.remove_pod(&sb).await.unwrap();
    let usage = agent.numa_usage().unwrap();
    assert_eq!(
        usage.values().sum::<f64>(),
        12.0,
        "after removal: {usage:?}"
    );
    let (_, id) = run_burstable(&mut cri, "burst-again").await.unwrap();
    let p = placement(&mut cri, &id).await.unwrap();
    assert_eq!(assert_placed_on_node(&p, "after removal"), 2);

    // Guaranteed with one integer CPU: an exclusive CPU.
    let pod = PodSpec::new("guaranteed", CgroupQos::Guaranteed);
    let (_, p) = run_app(&mut cri, &pod, 1000, Some(1000)).await;
    let rec = p.record.as_ref().expect("guaranteed grant");
    let x = parse_list(&rec["x"]);
    assert_eq!(x.len(), 1, "one exclusive CPU: {p:?}");
    assert_eq!(parse_list(&p.spec_cpus), fold(&x), "{p:?}");
    assert_eq!(parse_list(&p.cgroup_cpus), fold(&x), "{p:?}");
    assert_eq!(p.spec_cpus.len(), 1, "a single host CPU: {p:?}");

    // BestEffort: left alone.
    let pod = PodSpec::new("besteffort", CgroupQos::BestEffort);
    let id = start(&mut cri, &pod, &ContainerSpec::sleeper("app")).await;
    // BestEffort runs on the machine's shared CPUs (no NUMA affinity, as the reference and the
    // kubelet do), charged nothing (r=0); folded, that is every host CPU.
    let usage_before = agent.numa_usage().unwrap();
    let p = placement(&mut cri, &id).await.unwrap();
    let rec = p
        .record
        .as_ref()
        .unwrap_or_else(|| panic!("besteffort: no grant record: {p:?}"));
    assert_eq!(rec["pool"], "machine", "besteffort: {p:?}");
    assert_eq!(rec["r"], "0", "besteffort: {p:?}");
    let all: BTreeSet<usize> = util::host_cpus().into_iter().collect();
    assert_eq!(
        parse_list(&p.spec_cpus),
        all,
        "besteffort: spec cpuset {p:?}"
    );
    assert_eq!(
        p.cgroup_cpus, p.spec_cpus,
        "besteffort: cgroup cpuset {p:?}"
    );
    assert_eq!(
        agent.numa_usage().unwrap(),
        usage_before,
        "BestEffort charges nothing"
    );

    // Opt-out label (any value) and opt-out annotation.
    let pod =
        PodSpec::new("skip-label", CgroupQos::Burstable).label("tap.kunpeng.huawei.com/skip", "");
    let id = start(
        &mut cri,
        &pod,
        &ContainerSpec::cpus("app", 4000, Some(8000)),
    )
    .await;
    assert_untouched(&placement(&mut cri, &id).await.unwrap(), "skip label");
    let pod = PodSpec::new("skip-annotation", CgroupQos::Burstable)
        .annotation("tap.kunpeng.huawei.com/policy", "none");
    let id = start(
        &mut cri,
        &pod,
        &ContainerSpec::cpus("app", 4000, Some(8000)),
    )
    .await;
    assert_untouched(&placement(&mut cri, &id).await.unwrap(), "skip annotation");

    // A malformed annotation: the container still starts (and is still placed).
    let pod = PodSpec::new("malformed", CgroupQos::Burstable)
        .annotation("tap.kunpeng.huawei.com/level", "nowhere")
        .annotation("tap.kunpeng.huawei.com/exclusive-cpus", "perhaps");
    let (id, p) = run_app(&mut cri, &pod, 4000, Some(8000)).await;
    assert_placed_on_node(&p, "malformed annotation");
    assert!(agent.log_text().contains("ignoring annotation"));
    let m = agent.metrics_text().unwrap();
    assert!(
        m.lines().any(|l| l.starts_with("tap_errors_total{")
            && l.contains("kind=\"annotation\"")
            && !l.ends_with(" 0")),
        "the bad annotation is counted:\n{m}"
    );
    // What an alert sees in NRI mode: the build info, no proxy gauge (there is no proxy), and
    // no cluster zones (the fixture has 24 clusters, cluster affinity is off).
    assert!(
        m.lines().any(|l| l.starts_with("tap_build_info{")
            && l.contains("mode=\"NRI\"")
            && l.contains(&format!("arch=\"{}\"", std::env::consts::ARCH))
            && l.contains("policy=\"topology-aware\"")
            && l.ends_with(" 1")),
        "tap_build_info:\n{m}"
    );
    assert!(
        !m.contains("tap_proxy_up"),
        "tap_proxy_up in NRI mode:\n{m}"
    );
    assert!(
        m.contains("level=\"numa\"") && !m.contains("level=\"cluster\""),
        "zones without cluster affinity:\n{m}"
    );

    // UpdateContainer: new resources re-place the container (8/8 now), the usage follows.
    let before: f64 = agent.numa_usage().unwrap().values().sum();
    let mut spec = ContainerSpec::cpus("app", 8000, Some(8000));
    spec.memory_limit_bytes = None;
    cri.update_resources(&id, spec.resources()).await.unwrap();
    let after: f64 = agent.numa_usage().unwrap().values().sum();
    assert_eq!(after - before, 4.0, "update re-charged 8 instead of 4 CPUs");
    let p = placement(&mut cri, &id).await.unwrap();
    assert!(
        !p.spec_cpus.is_empty() && p.cgroup_cpus == p.spec_cpus,
        "{p:?}"
    );

    cri.remove_all_pods().await.unwrap();
    let usage = agent.numa_usage().unwrap();
    assert_eq!(usage.values().sum::<f64>(), 0.0, "all released: {usage:?}");
    eprintln!("nri placement scenarios: {:?}", started.elapsed());
}

/// Agent restart: state rebuilt from Synchronize (grant records), no double allocation.
/// containerd restart: the plugin reconnects and placement goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn nri_survives_agent_and_containerd_restarts() {
    let (_g, mut ctd) = setup();
    let started = Instant::now();
    let mut agent = Agent::start(&ctd, "a", &[]).expect("agent");
    let mut cri = ctd.cri().await.expect("cri");

    let mut nodes = BTreeSet::new();
    for i in 0..3 {
        let (_, id) = run_burstable(&mut cri, &format!("before{i}"))
            .await
            .unwrap();
        nodes.insert(assert_placed_on_node(
            &placement(&mut cri, &id).await.unwrap(),
            "before restart",
        ));
    }
    assert_eq!(nodes.len(), 3);
    let before = agent.numa_usage().unwrap();

    // Agent restart: a fresh process sees the three grants again through Synchronize.
    agent.stop();
    let mut agent = Agent::start(&ctd, "b", &[]).expect("agent restart");
    let log = agent.log_text();
    assert!(
        log.contains("from_record=3"),
        "restored from records:\n{log}"
    );
    let after = agent.numa_usage().unwrap();
    assert_eq!(after, before, "same usage after an agent restart");
    // The free node is the only one without a container: a new 4/8 goes there.
    let free: Vec<usize> = (0..4).filter(|n| !nodes.contains(n)).collect();
    let (_, id) = run_burstable(&mut cri, "after-agent-restart")
        .await
        .unwrap();
    let n = assert_placed_on_node(&placement(&mut cri, &id).await.unwrap(), "after restart");
    assert_eq!(vec![n], free, "no double allocation after restart");
    let usage_4 = agent.numa_usage().unwrap();
    assert_eq!(usage_4.values().sum::<f64>(), 16.0);

    // containerd restart: the plugin reconnects (backoff) and synchronizes again.
    drop(cri);
    ctd.restart().expect("containerd restart");
    agent
        .wait_log(
            "state restored from the runtime",
            2,
            Duration::from_secs(30),
        )
        .expect("plugin reconnected after the containerd restart");
    assert!(agent.log_text().contains("NRI connection lost"));
    let mut cri = ctd.cri().await.expect("cri after restart");
    assert_eq!(
        agent.numa_usage().unwrap(),
        usage_4,
        "the resync kept the grants (no double allocation)"
    );
    let (_, id) = run_burstable(&mut cri, "after-containerd-restart")
        .await
        .unwrap();
    let p = placement(&mut cri, &id).await.unwrap();
    assert_placed_on_node(&p, "after containerd restart");
    assert_eq!(agent.numa_usage().unwrap().values().sum::<f64>(), 20.0);

    cri.remove_all_pods().await.unwrap();
    assert_eq!(agent.numa_usage().unwrap().values().sum::<f64>(), 0.0);
    eprintln!("nri restarts: {:?}", started.elapsed());
}

/// A hung plugin (SIGSTOP) never blocks container creation: containerd gives up after its
/// 2 s request timeout and creates the container unadjusted. When the plugin wakes up it
/// reconnects, and the resync drops the grant containerd never applied and the grant of a
/// container removed meanwhile, so nothing leaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn nri_hung_plugin_fails_open_and_recovers() {
    let (_g, ctd) = setup();
    let mut agent = Agent::start(&ctd, "a", &[]).expect("agent");
    let mut cri = ctd.cri().await.expect("cri");
    let t = Instant::now();
    let (sb_a, id_a) = run_burstable(&mut cri, "placed").await.unwrap();
    let baseline = t.elapsed();
    assert_placed_on_node(&placement(&mut cri, &id_a).await.unwrap(), "placed");

    agent.signal("STOP");
    let t = Instant::now();
    let (_, id_b) = run_burstable(&mut cri, "while-hung").await.unwrap();
    let waited = t.elapsed();
    let p = placement(&mut cri, &id_b).await.unwrap();
    assert!(p.record.is_none() && p.spec_cpus.is_empty(), "{p:?}");
    // The same Pod start as with a live plugin, plus containerd's 2 s plugin timeout (for the
    // sandbox and the container) and slack for a loaded machine: not blocked.
    let bound = baseline + Duration::from_secs(4) + Duration::from_secs(6);
    assert!(
        waited < bound,
        "creation waited {waited:?} (a Pod start took {baseline:?} with the plugin awake)"
    );
    // Removed while the plugin is gone: it hears nothing of it.
    cri.remove_pod(&sb_a).await.unwrap();
    agent.signal("CONT");

    agent
        .wait_log(
            "state restored from the runtime",
            2,
            Duration::from_secs(30),
        )
        .expect("the plugin reconnected");
    let usage = agent.numa_usage().unwrap();
    assert_eq!(
        usage.values().sum::<f64>(),
        0.0,
        "nothing leaked: {usage:?}\n{}",
        agent.log_text()
    );
    let (_, id_c) = run_burstable(&mut cri, "after").await.unwrap();
    assert_placed_on_node(&placement(&mut cri, &id_c).await.unwrap(), "after");
    cri.remove_all_pods().await.unwrap();
}

/// Without the agent, containerd runs containers unadjusted; the harness itself works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn nri_without_plugin_containers_run_unadjusted() {
    let (_g, ctd) = setup();
    let mut cri = ctd.cri().await.expect("cri");
    let (_, id) = run_burstable(&mut cri, "noplugin").await.unwrap();
    assert_untouched(&placement(&mut cri, &id).await.unwrap(), "no plugin");
    cri.remove_all_pods().await.unwrap();
}

/// Strict reserved CPUs: with the fixture's NUMA nodes 0 and 2 reserved
/// (`--reserved-cpus=0-23,48-71`, folded: host CPU 0 of a 2-CPU host) and `kube-system` allowed
/// on them, a `kube-system` container runs on exactly the reserved CPUs (cgroup cpuset), charged
/// to no NUMA node; a `default` container never touches them, and one that asks by annotation
/// without being allowed is placed on the pools with a `not honoured` warning and a metric.
/// A restarted agent keeps the daemon where it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn nri_reserved_cpus_for_system_daemons() {
    let (_g, ctd) = setup();
    const RESERVED: &str = "0-23,48-71";
    let flags = [
        &format!("--reserved-cpus={RESERVED}")[..],
        "--reserved-cpus-namespaces=kube-system",
    ];
    let mut agent = Agent::start(&ctd, "reserved", &flags).expect("agent");
    let mut cri = ctd.cri().await.expect("cri");
    let reserved = parse_list(RESERVED);

    let mut pod = PodSpec::new("daemon", CgroupQos::Burstable);
    pod.namespace = "kube-system".into();
    let daemon = start(
        &mut cri,
        &pod,
        &ContainerSpec::cpus("app", 4000, Some(8000)),
    )
    .await;
    let p = placement(&mut cri, &daemon).await.unwrap();
    let rec = p.record.as_ref().expect("the daemon has a grant");
    assert_eq!(rec.get("on").map(String::as_str), Some("reserved"), "{p:?}");
    assert_eq!(logged_cpus(&agent, &daemon), Some(reserved.clone()));
    let want = fold(&reserved);
    assert_eq!(parse_list(&p.spec_cpus), want, "daemon spec {p:?}");
    assert_eq!(parse_list(&p.cgroup_cpus), want, "daemon cgroup {p:?}");
    eprintln!("kube-system daemon: cgroup cpuset {}", p.cgroup_cpus);

    let (_, app) = run_burstable(&mut cri, "app").await.unwrap();
    let ask = PodSpec::new("asks", CgroupQos::Burstable)
        .annotation("tap.kunpeng.huawei.com/reserved-cpus", "true");
    let asks = start(
        &mut cri,
        &ask,
        &ContainerSpec::cpus("app", 4000, Some(8000)),
    )
    .await;
    for (id, what) in [(&app, "default app"), (&asks, "default app asking")] {
        let p = placement(&mut cri, id).await.unwrap();
        let cpus = logged_cpus(&agent, id).expect("placed");
        assert!(
            cpus.is_disjoint(&reserved),
            "{what} on reserved CPUs {cpus:?}"
        );
        assert_eq!(
            parse_list(&p.cgroup_cpus),
            fold(&cpus),
            "{what} cgroup {p:?}"
        );
        if util::host_cpus().len() == 2 {
            assert!(
                parse_list(&p.cgroup_cpus).is_disjoint(&want),
                "{what}: {p:?}"
            );
        }
        eprintln!("{what}: cgroup cpuset {}", p.cgroup_cpus);
    }
    assert!(
        agent.log_text().contains("not honoured: reserved-cpus"),
        "{}",
        agent.log_text()
    );
    let m = agent.metrics_text().unwrap();
    assert!(counted_once(&m, "reserved_cpus"), "{m}");
    // The daemon is charged nowhere: the two others' 4-CPU requests only.
    assert_eq!(agent.numa_usage().unwrap().values().sum::<f64>(), 8.0);

    // A restarted agent reads the daemon's grant back and leaves it on the reserved CPUs.
    agent.stop();
    let agent = Agent::start(&ctd, "reserved-again", &flags).expect("agent again");
    let p = placement(&mut cri, &daemon).await.unwrap();
    assert_eq!(
        parse_list(&p.cgroup_cpus),
        want,
        "daemon after restart {p:?}"
    );
    assert_eq!(agent.numa_usage().unwrap().values().sum::<f64>(), 8.0);
    cri.remove_all_pods().await.unwrap();
}
