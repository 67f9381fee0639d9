//! The peer, side by side: kubernetes-sigs/dra-driver-cpu (`tap_e2e::dra_peer`, driver
//! `dra.cpu`) and kunpeng-tap's own DRA driver (`dra.tap.kunpeng.io`), one after the other on
//! the same cluster, each as the node's only NRI plugin and both as host processes on this
//! host's own topology (the peer cannot fold a fixture onto the host's CPUs, so neither does
//! kunpeng-tap here). Each gets the same claims and Pods:
//!
//! 1. a claim of 1 CPU (kunpeng-tap's with 256Mi, the peer has no memory capacity) for a
//!    Burstable Pod, and a plain Burstable Pod next to it: the claim's allocation, both
//!    containers' cgroup cpusets (never overlapping) and memory nodes, Pod create to Running;
//! 2. the same claim tied to an `accel.example.com` device by
//!    `matchAttribute: resource.kubernetes.io/numaNode`: allocated and aligned when the driver's
//!    devices carry that attribute, else Pending with the scheduler's reason;
//! 3. a claim of 4 CPUs: Pending when no device holds 4.
//!
//! What is expected of 2 and 3 is read from the driver's own ResourceSlice, not assumed. Opt-in
//! (`TAP_CLUSTER_SCENARIOS=dra_peer`): the peer's binary comes from
//! hack/e2e/setup-dra-driver-cpu.sh, which CI does not run.

use super::tier::{parse_list, PodDef, Tier, NS, POLL};
use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tap_e2e::cluster::NODE;
use tap_e2e::containerd::cgroup_mems;
use tap_e2e::docker::TapAgent;
use tap_e2e::dra_accel::{self, DraAccel, DraDevice};
use tap_e2e::dra_peer::{self, DraCpu, PeerPaths};
use tap_e2e::images::oci_arch;
use tap_e2e::util;

const STD_NUMA: &str = "resource.kubernetes.io/numaNode";
const ACCEL: &str = dra_accel::DRIVER;
const TAP: &str = "dra.tap.kunpeng.io";
/// The claimed Pods, one per round (`-1`, `-2`, …): the last stays for the plain one.
const CLAIMED: &str = "peer-claimed";
const PLAIN: &str = "peer-plain";
const ALIGNED: &str = "peer-aligned";
const FOUR: &str = "peer-four";
const TEMPLATES: [&str; 3] = ["peer-cpu1", "peer-aligned", "peer-cpu4"];
/// How many times the claimed Pod is made (each time measured from create to Running).
const ROUNDS: usize = 3;

#[derive(Debug, Clone, Copy)]
enum Driver {
    Peer,
    Tap,
}

impl Driver {
    fn name(self) -> &'static str {
        match self {
            Driver::Peer => dra_peer::DRIVER,
            Driver::Tap => TAP,
        }
    }

    fn title(self) -> String {
        match self {
            Driver::Peer => format!("dra-driver-cpu {}", dra_peer::VERSION),
            Driver::Tap => "kunpeng-tap".to_string(),
        }
    }

    /// A claim's capacity request of `cpus` CPUs in the driver's own capacity names.
    fn capacity(self, cpus: &str) -> Value {
        match self {
            Driver::Peer => json!({"dra.cpu/cpu": cpus}),
            Driver::Tap => json!({"cpu": cpus, "memory": "256Mi"}),
        }
    }

    fn device_class(self) -> Value {
        match self {
            Driver::Peer => dra_peer::device_class(),
            Driver::Tap => json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": TAP},
                "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{TAP}\"")}}]},
            }),
        }
    }
}

/// A driver's process, kept for the length of its leg.
enum Running {
    Peer(DraCpu),
    Tap(TapAgent),
}

impl Running {
    fn log_tail(&self, n: usize) -> String {
        match self {
            Running::Peer(p) => p.log_tail(n),
            Running::Tap(a) => a.log_tail(n),
        }
    }

    fn log_text(&self) -> String {
        match self {
            Running::Peer(p) => p.log_text(),
            Running::Tap(a) => a.log_text(),
        }
    }
}

/// One of the driver's devices as its ResourceSlice shows it.
#[derive(Debug)]
struct Device {
    name: String,
    /// `resource.kubernetes.io/numaNode`, when the device carries it.
    numa: Option<i64>,
    cpus: i64,
}

pub(crate) fn dra_peer(t: &mut Tier) -> Result<()> {
    // Each driver must be the node's only NRI plugin: not with the chart's agent.
    let ds =
        t.cl.kube()
            .get_json(&["-n", NS, "get", "daemonset", "tap-kunpeng-tap-agent"])?;
    ensure!(
        ds.is_none(),
        "the chart's agent is installed: run dra_peer alone or after helm_uninstall"
    );
    let node = host_numa_node()?;
    let plugin = DraAccel::start(&t.rt, &t.cl.dir.join("kubelet"), &t.cl.kube().kubeconfig);
    let r = plugin
        .wait_registered(Duration::from_secs(60))
        .and_then(|()| publish_accel(t, node))
        .and_then(|()| agent_copy(t))
        .and_then(|agent| both(t, node, &agent));
    let cleaned = delete_all(
        t,
        &[
            ("resourceslice", &dra_accel::slice_name(NODE), None),
            ("deviceclass", ACCEL, None),
        ],
    );
    drop(plugin);
    r.and(cleaned)
}

/// The first NUMA node of this host, where the accel device is published.
fn host_numa_node() -> Result<i64> {
    let online = std::fs::read_to_string("/sys/devices/system/node/online")?;
    let nodes = parse_list(online.trim());
    let first = nodes.first().context("no NUMA node online")?;
    Ok(i64::try_from(*first)?)
}

fn publish_accel(t: &Tier, node: i64) -> Result<()> {
    let devices = [DraDevice {
        name: format!("accel-{node}"),
        numa_node: u32::try_from(node)?,
    }];
    let kube = t.cl.kube();
    kube.apply(&dra_accel::device_class().to_string())?;
    kube.apply(&dra_accel::resource_slice(NODE, &devices).to_string())?;
    Ok(())
}

/// Both legs, each whatever the other's outcome; fails if either failed.
/// The static release agent the tier's image was built with (`target/image/<arch>/`, made at
/// the tier's start), copied into the cluster's folder before the legs: no rebuild of a checkout
/// that changed since, and no later one under the legs.
fn agent_copy(t: &Tier) -> Result<PathBuf> {
    let built = util::workspace_root()
        .join("target/image")
        .join(oci_arch())
        .join("kunpeng-tap");
    let copy = t.cl.dir.join("kunpeng-tap");
    std::fs::copy(&built, &copy).with_context(|| format!("copying {}", built.display()))?;
    Ok(copy)
}

fn both(t: &mut Tier, node: i64, agent: &Path) -> Result<()> {
    let mut failed = Vec::new();
    for d in [Driver::Peer, Driver::Tap] {
        match leg(t, d, node, agent) {
            Ok(row) => {
                eprintln!("{row}");
                t.notes.push(row);
            }
            Err(e) => failed.push(format!("{}: {e:#}", d.title())),
        }
    }
    ensure!(failed.is_empty(), "{}", failed.join("\n"));
    Ok(())
}

fn leg(t: &mut Tier, d: Driver, node: i64, agent: &Path) -> Result<String> {
    let run = start(t, d, agent)?;
    let r = measure(t, d, node);
    if r.is_err() {
        eprintln!("--- {} log\n{}", d.title(), run.log_tail(80));
    }
    // When each claim was prepared and unprepared, for the create-to-Running times.
    let prepares: Vec<String> = run
        .log_text()
        .lines()
        .filter(|l| l.contains("repare"))
        .map(str::to_string)
        .collect();
    let from = prepares.len().saturating_sub(60);
    eprintln!(
        "--- {} prepare lines\n{}",
        d.title(),
        prepares[from..].join("\n")
    );
    let kubelet: Vec<String> =
        t.cl.kubelet_log()
            .lines()
            .filter(|l| l.contains("repare") && l.contains(CLAIMED))
            .map(str::to_string)
            .collect();
    let from = kubelet.len().saturating_sub(60);
    eprintln!("--- kubelet prepare lines\n{}", kubelet[from..].join("\n"));
    let claimed: Vec<String> = (1..=ROUNDS).map(|r| format!("{CLAIMED}-{r}")).collect();
    let mut names: Vec<&str> = claimed.iter().map(String::as_str).collect();
    names.extend([PLAIN, ALIGNED, FOUR]);
    let pods: Vec<_> = names.iter().map(|p| ("pod", *p, Some("default"))).collect();
    let templates = TEMPLATES.map(|n| ("resourceclaimtemplate", n, Some("default")));
    let cleaned = delete_all(t, &pods).and_then(|()| delete_all(t, &templates));
    drop(run);
    // Its slices once it is gone (the kubelet would drop them later); then its class.
    let gone = delete_slices(t, d).and_then(|()| delete_all(t, &[("deviceclass", d.name(), None)]));
    r.and_then(|row| cleaned.and(gone).map(|()| row))
}

fn start(t: &Tier, d: Driver, agent: &Path) -> Result<Running> {
    let kubelet = t.cl.dir.join("kubelet");
    let kubeconfig = t.cl.kube().kubeconfig.clone();
    let ctd = t.cl.containerd();
    let log = t.cl.dir.join(format!("{}.log", d.name()));
    match d {
        Driver::Peer => {
            let nri_dir = ctd
                .nri_socket()
                .parent()
                .context("NRI folder")?
                .to_path_buf();
            let paths = PeerPaths {
                nri_dir,
                registry_dir: kubelet.join("plugins_registry"),
                cdi_dir: ctd.cdi_dir(),
                kubeconfig,
                node: NODE.to_string(),
            };
            Ok(Running::Peer(DraCpu::start(
                &dra_peer::binary(),
                &paths,
                &log,
            )?))
        }
        Driver::Tap => {
            // The static release build the agent's image ships, with the API server reached
            // through KUBECONFIG (an env(1) in front: TapAgent passes no environment).
            let args: Vec<String> = vec![
                format!("KUBECONFIG={}", kubeconfig.display()),
                agent.display().to_string(),
                "--container-runtime-mode=NRI".into(),
                format!("--nri-socket-path={}", ctd.nri_socket().display()),
                "--sysfs-root=/sys".into(),
                format!("--state-dir={}", t.cl.dir.join("peer-tap-state").display()),
                format!(
                    "--pod-resources-socket={}",
                    kubelet.join("pod-resources/kubelet.sock").display()
                ),
                "--dra-driver=on".into(),
                // Where this containerd reads CDI specs (the claim's CDI device resolves).
                format!("--dra-cdi-dir={}", ctd.cdi_dir().display()),
                format!("--kubelet-root-dir={}", kubelet.display()),
                format!("--node-name={NODE}"),
                "--enable-node-topology=false".into(),
            ];
            Ok(Running::Tap(TapAgent::start_binary(
                Path::new("/usr/bin/env"),
                &args,
                &log,
            )?))
        }
    }
}

fn measure(t: &Tier, d: Driver, node: i64) -> Result<String> {
    let kube = t.cl.kube();
    kube.apply(&d.device_class().to_string())?;
    let devices = wait_devices(t, d)?;
    kube.apply(&template(d, TEMPLATES[0], "1", false).to_string())?;
    kube.apply(&template(d, TEMPLATES[1], "1", true).to_string())?;
    kube.apply(&template(d, TEMPLATES[2], "4", false).to_string())?;
    let side = claimed_and_plain(t, d)?;
    let aligned = aligned(t, d, &devices, node)?;
    let four = four(t, &devices)?;
    let slice: Vec<String> = devices
        .iter()
        .map(|v| format!("{} cpu {} {STD_NUMA} {:?}", v.name, v.cpus, v.numa))
        .collect();
    Ok(format!(
        "DRA PEER {}: devices [{}]; {side}; CPU+accel claim: {aligned}; 4-CPU claim: {four}",
        d.title(),
        slice.join(", ")
    ))
}

/// The driver's devices on this node, once it has published them.
fn wait_devices(t: &Tier, d: Driver) -> Result<Vec<Device>> {
    let selector = format!("spec.driver={},spec.nodeName={NODE}", d.name());
    let mut devices = Vec::new();
    util::wait_until(
        &format!("the ResourceSlice of {}", d.name()),
        Duration::from_secs(90),
        POLL,
        || {
            let list =
                t.cl.kube()
                    .get_json(&["get", "resourceslices", "--field-selector", &selector])?;
            devices = list.map(|l| slice_devices(&l)).unwrap_or_default();
            Ok(!devices.is_empty())
        },
    )?;
    Ok(devices)
}

fn slice_devices(list: &Value) -> Vec<Device> {
    let slices = list["items"].as_array().cloned().unwrap_or_default();
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|v| {
            let capacity = v["capacity"]
                .as_object()
                .and_then(|c| c.iter().find(|(k, _)| *k == "cpu" || k.ends_with("/cpu")))
                .and_then(|(_, c)| c["value"].as_str())
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            Device {
                name: v["name"].as_str().unwrap_or_default().to_string(),
                numa: v["attributes"][STD_NUMA]["int"].as_i64(),
                cpus: capacity,
            }
        })
        .collect()
}

/// Step 1: the claimed Pod, then the plain one next to it; the claimed CPUs are the claimed
/// container's alone and go back to the plain one when the claimed Pod is deleted.
fn claimed_and_plain(t: &Tier, d: Driver) -> Result<String> {
    let mut times = Vec::new();
    let mut refusals = Vec::new();
    let mut name = String::new();
    for round in 1..=ROUNDS {
        name = format!("{CLAIMED}-{round}");
        let (_, secs) = run_timed(t, &pod(&name, Some(TEMPLATES[0]))?)?;
        times.push(format!("{secs:.2}"));
        refusals.push(prepare_failures(t, &name)?);
        if round < ROUNDS {
            delete_claimed(t, &name)?;
        }
    }
    let results = allocation(t, &name, d)?;
    let c = t.placed(&name)?;
    let c_mems = mems(t, &c.id)?;
    let c_cpus = parse_list(&c.cgroup_cpus);
    ensure!(
        c_cpus.len() == 1,
        "a claim of 1 CPU, cgroup cpuset {}",
        c.cgroup_cpus
    );
    let (_, plain_s) = run_timed(t, &pod(PLAIN, None)?)?;
    let p = t.placed(PLAIN)?;
    let p_cpus = parse_list(&p.cgroup_cpus);
    ensure!(
        p_cpus.is_disjoint(&c_cpus),
        "the plain container's cpuset {} meets the claimed {}",
        p.cgroup_cpus,
        c.cgroup_cpus
    );
    t.delete_pod(&name)?;
    let mut after = BTreeSet::new();
    util::wait_until(
        "the claimed CPUs back to the plain container",
        Duration::from_secs(60),
        POLL,
        || {
            after = parse_list(&t.placed(PLAIN)?.cgroup_cpus);
            Ok(after.is_superset(&c_cpus))
        },
    )?;
    t.delete_pod(PLAIN)?;
    Ok(format!(
        "1-CPU claim: allocation {results}; claimed container cgroup cpuset.cpus {:?} (CRI {:?}), {}, grant {:?}, \
         Pod create->Running {} s (the kubelet's failed prepares on the way: {}); plain Burstable container next to it: cgroup cpuset.cpus {:?}, \
         create->Running {plain_s:.2}s; after the claimed Pod's deletion {}",
        c.cgroup_cpus,
        c.spec_cpus,
        c_mems,
        c.grant,
        times.join(", "),
        refusals.join(", "),
        p.cgroup_cpus,
        list(&after)
    ))
}

/// Step 2: expected allocated and aligned iff one of the driver's devices is on the accel's
/// node by the standard attribute (and holds a CPU).
fn aligned(t: &Tier, d: Driver, devices: &[Device], node: i64) -> Result<String> {
    let can = devices.iter().any(|v| v.numa == Some(node) && v.cpus >= 1);
    let manifest = pod(ALIGNED, Some(TEMPLATES[1]))?;
    if !can {
        t.cl.kube().apply(&manifest.to_string())?;
        let why = pending(t, ALIGNED)?;
        t.delete_pod(ALIGNED)?;
        return Ok(format!("Pending (no device with {STD_NUMA}): {why}"));
    }
    let (_, secs) = run_timed(t, &manifest)?;
    let results = allocation(t, ALIGNED, d)?;
    let cpu_dev = result_device(&results, d.name())?;
    let on = devices
        .iter()
        .find(|v| v.name == cpu_dev)
        .and_then(|v| v.numa);
    ensure!(
        on == Some(node),
        "CPU device {cpu_dev} on NUMA {on:?}, the accel on {node}: {results}"
    );
    let a = t.placed(ALIGNED)?;
    let m = mems(t, &a.id)?;
    t.delete_pod(ALIGNED)?;
    Ok(format!(
        "allocated {results}, aligned on NUMA {node}; cgroup cpuset.cpus {:?}, {m}; Pod create->Running {secs:.2} s",
        a.cgroup_cpus
    ))
}

/// Step 3: expected Pending iff no device holds 4 CPUs.
fn four(t: &Tier, devices: &[Device]) -> Result<String> {
    let fits = devices.iter().any(|v| v.cpus >= 4);
    t.cl.kube()
        .apply(&pod(FOUR, Some(TEMPLATES[2]))?.to_string())?;
    let out = if fits {
        t.wait_running(FOUR)?;
        "Running".to_string()
    } else {
        format!("Pending (no device holds 4 CPUs): {}", pending(t, FOUR)?)
    };
    t.delete_pod(FOUR)?;
    Ok(out)
}

/// Deletes the claimed Pod and waits until its ResourceClaim is gone too, so that the next
/// round does not start while the claim still holds its CPU.
fn delete_claimed(t: &Tier, pod: &str) -> Result<()> {
    let claim = t.claim_name(pod)?;
    t.delete_pod(pod)?;
    util::wait_until(
        &format!("ResourceClaim {claim} deleted"),
        Duration::from_secs(60),
        POLL,
        || {
            let c =
                t.cl.kube()
                    .get_json(&["-n", "default", "get", "resourceclaim", &claim])?;
            Ok(c.is_none())
        },
    )
}

/// The kubelet's `FailedPrepareDynamicResources` Events on `pod` (Warnings it records when the
/// driver refuses a prepare, before it retries): how many, and the first message.
fn prepare_failures(t: &Tier, pod: &str) -> Result<String> {
    // By uid: both legs name their Pods alike.
    let p = t.pod_json(pod)?;
    let uid = p["metadata"]["uid"].as_str().context("no uid")?;
    let field = format!("involvedObject.uid={uid},reason=FailedPrepareDynamicResources");
    let list =
        t.cl.kube()
            .get_json(&["get", "events", "-n", "default", "--field-selector", &field])?;
    let items = list
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default();
    let count: i64 = items.iter().map(|e| e["count"].as_i64().unwrap_or(1)).sum();
    Ok(match items.first() {
        Some(e) => format!("{count} ({})", e["message"].as_str().unwrap_or_default()),
        None => "0".to_string(),
    })
}

/// The scheduler's reason for leaving `pod` Pending (its FailedScheduling Event).
fn pending(t: &Tier, pod: &str) -> Result<String> {
    let why = t.pod_event(pod, "FailedScheduling")?;
    let phase = t.kubectl(&[
        "-n",
        "default",
        "get",
        "pod",
        pod,
        "-o",
        "jsonpath={.status.phase}",
    ])?;
    ensure!(
        phase == "Pending",
        "Pod {pod} is {phase}, expected Pending: {why}"
    );
    Ok(why)
}

/// Applies `manifest` and waits (polling every 100 ms) until the Pod runs; returns the
/// container id and the time from the apply to Running.
fn run_timed(t: &Tier, manifest: &Value) -> Result<(String, f64)> {
    let name = manifest["metadata"]["name"]
        .as_str()
        .context("no name")?
        .to_string();
    let t0 = Instant::now();
    t.cl.kube().apply(&manifest.to_string())?;
    util::wait_until(
        &format!("Pod {name} Running"),
        Duration::from_secs(90),
        Duration::from_millis(100),
        || {
            let p =
                t.cl.kube()
                    .get_json(&["-n", "default", "get", "pod", &name])?;
            let p = p.context("no pod")?;
            Ok(p["status"]["phase"] == "Running"
                && p["status"]["containerStatuses"][0]["ready"] == true)
        },
    )
    .with_context(|| t.describe(&name))?;
    let secs = t0.elapsed().as_secs_f64();
    Ok((t.container_id("default", &name)?, secs))
}

/// The allocation results of the Pod's claim, checked to hold one device of the driver.
fn allocation(t: &Tier, pod: &str, d: Driver) -> Result<Value> {
    let results = t.claim_results(pod)?;
    result_device(&results, d.name())?;
    Ok(results)
}

fn result_device(results: &Value, driver: &str) -> Result<String> {
    let ours: Vec<&Value> = results
        .as_array()
        .map(|r| r.iter().filter(|r| r["driver"] == driver).collect())
        .unwrap_or_default();
    ensure!(
        ours.len() == 1,
        "not one {driver} device allocated: {results}"
    );
    Ok(ours[0]["device"].as_str().unwrap_or_default().to_string())
}

/// The container's memory nodes: the OCI spec's and the cgroup's.
fn mems(t: &Tier, id: &str) -> Result<String> {
    let mut cri = t.cri()?;
    let (spec, pid) = t.rt.block_on(async {
        let spec = cri.spec_mems(id).await?;
        anyhow::Ok((spec, cri.pid(id).await?))
    })?;
    Ok(format!(
        "CRI cpuset_mems {spec:?}, cgroup cpuset.mems {:?}",
        cgroup_mems(pid)?
    ))
}

/// A template of `cpus` CPUs of the driver, with the accel device on the same NUMA node by the
/// standard attribute when `with_accel`.
fn template(d: Driver, name: &str, cpus: &str, with_accel: bool) -> Value {
    let mut requests = vec![json!({"name": "cpus", "exactly": {
        "deviceClassName": d.name(),
        "capacity": {"requests": d.capacity(cpus)},
    }})];
    let mut constraints = Vec::new();
    if with_accel {
        requests.push(json!({"name": "accel", "exactly": {"deviceClassName": ACCEL}}));
        constraints.push(json!({"requests": ["cpus", "accel"], "matchAttribute": STD_NUMA}));
    }
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": requests, "constraints": constraints}}},
    })
}

/// A Burstable Pod (100m/200m, as kunpeng-tap's own DRA scenario) whose container uses a claim
/// from `template` when given.
fn pod(name: &str, template: Option<&str>) -> Result<Value> {
    let mut pod: Value = serde_json::from_str(&PodDef::new(name, "100m", "200m").manifest())?;
    if let Some(tmpl) = template {
        pod["spec"]["resourceClaims"] =
            json!([{"name": "cpus", "resourceClaimTemplateName": tmpl}]);
        pod["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": "cpus"}]);
    }
    Ok(pod)
}

/// Deletes the driver's ResourceSlices of this node.
fn delete_slices(t: &Tier, d: Driver) -> Result<()> {
    let selector = format!("spec.driver={},spec.nodeName={NODE}", d.name());
    t.kubectl(&[
        "delete",
        "resourceslices",
        "--field-selector",
        &selector,
        "--wait=true",
    ])?;
    Ok(())
}

fn delete_all(t: &Tier, objects: &[(&str, &str, Option<&str>)]) -> Result<()> {
    for (kind, name, ns) in objects {
        let mut args = vec![
            "delete",
            kind,
            name,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=60s",
        ];
        args.extend(ns.map(|ns| ["-n", ns]).into_iter().flatten());
        t.kubectl(&args)?;
    }
    Ok(())
}

fn list(s: &BTreeSet<usize>) -> String {
    s.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}
