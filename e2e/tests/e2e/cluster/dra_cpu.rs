//! kunpeng-tap as the DRA driver of CPUs and memory (`--dra-driver=on`), with the real
//! kube-scheduler's allocator and a real kubelet: the agent publishes one device per NUMA node
//! of its (folded) fixture; a claim of 4 CPUs and 256 MiB tied to the accel device of the e2e
//! driver `accel.example.com` by `matchAttribute: resource.kubernetes.io/numaNode` is allocated
//! the accel's node, prepared (4 CPUs of that node booked), and its container runs there with
//! that node's memory; a claim no node can hold leaves its Pod Pending; restarts of the agent and
//! the kubelet change nothing; deleting the Pod gives the CPUs back.

use super::tier::{node_cpus, parse_list, PodDef, Tier, POLL};
use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tap_e2e::cluster::NODE;
use tap_e2e::dra_accel::{device_class, resource_slice, slice_name, DraAccel, DraDevice};
use tap_e2e::util::{self, folded_node};

/// The agent's DRA driver and DeviceClass.
const TAP: &str = "dra.tap.kunpeng.io";
const ACCEL: &str = tap_e2e::dra_accel::DRIVER;
const POD: &str = "dra-cpu";
const TOO_BIG: &str = "dra-cpu-too-big";
const REPLICATED: &str = "dra-cpu-guaranteed";
/// The NUMA node the accel device is on.
const ACCEL_NODE: usize = 3;

pub(crate) fn dra_cpu_claim(t: &mut Tier) -> Result<()> {
    let version = check_slice(t)?;
    let plugin = DraAccel::start(&t.rt, &t.cl.dir.join("kubelet"), &t.cl.kube().kubeconfig);
    let r = plugin
        .wait_registered(Duration::from_secs(60))
        .and_then(|()| claims(t, &version));
    let cleaned = clean_up(t);
    drop(plugin);
    r.and(cleaned)
}

fn claims(t: &mut Tier, slice_version: &str) -> Result<()> {
    let kube = t.cl.kube();
    let accel = [DraDevice {
        name: format!("accel-{ACCEL_NODE}"),
        numa_node: u32::try_from(ACCEL_NODE)?,
    }];
    kube.apply(&device_class().to_string())?;
    kube.apply(&resource_slice(NODE, &accel).to_string())?;
    kube.apply(&template("cpu-and-accel", "4", true).to_string())?;
    let t0 = Instant::now();
    kube.apply(&pod(POD, "cpu-and-accel")?.to_string())?;
    t.wait_running(POD)?;
    let running = t0.elapsed();
    let cpus = aligned_pod(t)?;
    let log = t.agent_log()?;
    let prepared: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("DRA claim prepared"))
        .filter_map(|l| l.split("elapsed_us=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    ensure!(!prepared.is_empty(), "no prepare logged by the agent");
    t.notes.push(format!(
        "DRA CPU claim: Pod create to Running {:.1}s; NodePrepareResources in the agent (API read, booking, checkpoint) {prepared:?} µs",
        running.as_secs_f64()
    ));
    too_big(t)?;
    replicated(t)?;
    restart_agent(t, &cpus)?;
    // Claims prepared, Pods placed and refused, the agent restarted: the slice never written.
    ensure!(
        slice_resource_version(t)? == slice_version,
        "the agent's ResourceSlice was written during the claims"
    );
    restart_kubelet(t, &cpus)?;
    t.delete_pod(POD)?;
    util::wait_until(
        "the claim's CPUs given back (checkpoint empty, shared again)",
        Duration::from_secs(60),
        POLL,
        || Ok(booked(t)?.is_empty() && !shared_on(t, ACCEL_NODE)?.is_disjoint(&cpus)),
    )
}

fn slice_resource_version(t: &Tier) -> Result<String> {
    let s =
        t.cl.kube()
            .get_json(&["get", "resourceslice", &format!("{NODE}-{TAP}")])?;
    let s = s.context("the agent's ResourceSlice is gone")?;
    Ok(s["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// The agent's ResourceSlice: one device per NUMA node of the fixture, its CPUs and memory.
/// Returns its resourceVersion.
fn check_slice(t: &mut Tier) -> Result<String> {
    let name = format!("{NODE}-{TAP}");
    let mut slice = Value::Null;
    util::wait_until(
        "the agent's ResourceSlice",
        Duration::from_secs(90),
        POLL,
        || {
            slice =
                t.cl.kube()
                    .get_json(&["get", "resourceslice", &name])?
                    .unwrap_or_default();
            Ok(!slice.is_null())
        },
    )?;
    let devices = slice["spec"]["devices"].as_array().context("no devices")?;
    let names: Vec<&str> = devices.iter().filter_map(|d| d["name"].as_str()).collect();
    ensure!(
        names == ["numa0", "numa1", "numa2", "numa3"],
        "devices {names:?}"
    );
    for (k, d) in devices.iter().enumerate() {
        let node = &d["attributes"]["resource.kubernetes.io/numaNode"]["int"];
        ensure!(*node == json!(k), "{}: numaNode {node}", names[k]);
        let cpus: usize = d["capacity"]["cpu"]["value"]
            .as_str()
            .unwrap_or_default()
            .parse()?;
        ensure!(
            cpus > 0 && cpus <= node_cpus(k).len(),
            "{}: cpu capacity {cpus} of {} CPUs",
            names[k],
            node_cpus(k).len()
        );
    }
    let yaml = t.kubectl(&["get", "resourceslice", &name, "-o", "yaml"])?;
    t.notes
        .push(format!("DRA: the agent's ResourceSlice\n{yaml}"));
    slice_resource_version(t)
}

/// The Pod of the CPU + accel claim: its container on 4 CPUs of the accel's node booked for
/// the claim, that node's memory, and shared containers off those CPUs. Returns the CPUs.
fn aligned_pod(t: &mut Tier) -> Result<BTreeSet<usize>> {
    let p = t.placed(POD)?;
    let node: usize = p.field("n").parse().with_context(|| format!("{p:?}"))?;
    ensure!(
        node == ACCEL_NODE,
        "the claim's container is on node {node}, the accel on {ACCEL_NODE}: {p:?}"
    );
    ensure!(p.grant.contains(";on=claim:"), "not on a claim: {p:?}");
    ensure!(
        parse_list(&p.cgroup_cpus) == folded_node(node),
        "cgroup cpuset {p:?}"
    );
    let claims = booked(t)?;
    ensure!(claims.len() == 1, "booked claims {claims:?}");
    let cpus = claims[0].clone();
    ensure!(
        cpus.len() == 4 && cpus.is_subset(&node_cpus(node)),
        "claim CPUs {cpus:?}"
    );
    let mut shared = BTreeSet::new();
    util::wait_until(
        "shared CPUs off the claim's, the claim's listed (NodeTopology status)",
        Duration::from_secs(60),
        POLL,
        || {
            shared = shared_on(t, node)?;
            let claimed = zone_cpus(t, node, "claimedCPUs")?;
            Ok(!shared.is_empty() && shared.is_disjoint(&cpus) && claimed == cpus)
        },
    )?;
    let results = allocation(t, POD)?;
    let event = t.pod_event(POD, "TopologyPlaced")?;
    ensure!(
        event.contains(TAP) && event.contains(ACCEL),
        "Event {event:?}"
    );
    let mems = cgroup_mems(t, &p.id)?;
    let env = cdi_env(t, &p.id)?;
    ensure!(
        env == [
            format!("TAP_DRA_CPUS={}", p.cgroup_cpus),
            format!("TAP_DRA_MEMS={mems}"),
            format!("TAP_DRA_CLAIM=default/{}", t.claim_name(POD)?),
        ],
        "the container's CDI variables {env:?}, its cgroup cpus {:?} mems {mems:?}",
        p.cgroup_cpus
    );
    t.notes.push(format!(
        "DRA CPU+accel Pod: grant {}; claim CPUs (fixture) {cpus:?} of NUMA {node}, cgroup cpuset.cpus {:?} (folded), \
         mems {:?}; CDI environment {env:?}; shared CPUs of numa{node}: {}; Event: {event}; allocation: {results}",
        p.grant, p.cgroup_cpus, mems, list(&shared)
    ));
    Ok(cpus)
}

/// A claim of 25 CPUs: more than any NUMA node's 24; the scheduler leaves its Pod Pending and
/// the agent books nothing.
fn too_big(t: &mut Tier) -> Result<()> {
    let kube = t.cl.kube();
    kube.apply(&template("too-big", "25", false).to_string())?;
    kube.apply(&pod(TOO_BIG, "too-big")?.to_string())?;
    let why = t.pod_event(TOO_BIG, "FailedScheduling")?;
    let phase = t.kubectl(&["get", "pod", TOO_BIG, "-o", "jsonpath={.status.phase}"])?;
    ensure!(phase == "Pending", "the too-big Pod is {phase}");
    ensure!(booked(t)?.len() == 1, "a claim no node can hold was booked");
    t.notes
        .push(format!("DRA claim of 25 CPUs: Pending, {why}"));
    t.delete_pod(TOO_BIG)
}

/// A Guaranteed Pod whose requests replicate its 1-CPU claim (as docs/user/dra.md recommends):
/// its container gets the claim's CPU and nothing else; no exclusive CPU is taken for it.
fn replicated(t: &mut Tier) -> Result<()> {
    let kube = t.cl.kube();
    kube.apply(&template("one-cpu", "1", false).to_string())?;
    let mut pod: Value = serde_json::from_str(&PodDef::new(REPLICATED, "1", "1").manifest())?;
    pod["spec"]["resourceClaims"] =
        json!([{"name": "cpus", "resourceClaimTemplateName": "one-cpu"}]);
    pod["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": "cpus"}]);
    kube.apply(&pod.to_string())?;
    t.wait_running(REPLICATED)?;
    let p = t.placed(REPLICATED)?;
    ensure!(
        p.grant.contains(";on=claim:") && p.field("x").is_empty(),
        "{p:?}"
    );
    let claims = booked(t)?;
    ensure!(
        claims.iter().any(|c| c.len() == 1),
        "no 1-CPU claim booked: {claims:?}"
    );
    let nt = t.node_topology()?;
    let zones = nt["status"]["zones"].as_array().context("no zones")?;
    let exclusive: Vec<&Value> = zones
        .iter()
        .map(|z| &z["exclusiveCPUs"])
        .filter(|x| *x != "")
        .collect();
    ensure!(
        exclusive.is_empty(),
        "exclusive CPUs taken beside the claim: {exclusive:?}"
    );
    t.notes.push(format!(
        "DRA Guaranteed 1/1 Pod with a 1-CPU claim: grant {}, claims booked {claims:?}",
        p.grant
    ));
    t.delete_pod(REPLICATED)?;
    util::wait_until(
        "the 1-CPU claim given back",
        Duration::from_secs(60),
        POLL,
        || Ok(booked(t)?.len() == 1),
    )
}

/// The agent's restart leaves the claim, its container and the books alone.
fn restart_agent(t: &mut Tier, cpus: &BTreeSet<usize>) -> Result<()> {
    let before = t.placed(POD)?;
    super::restart_agent_pod(t)?;
    ensure!(
        booked(t)? == [cpus.clone()],
        "the claim after the agent's restart"
    );
    ensure!(
        t.placed(POD)? == before,
        "the container after the agent's restart"
    );
    ensure!(
        shared_on(t, ACCEL_NODE)?.is_disjoint(cpus),
        "shared CPUs after the agent's restart"
    );
    Ok(())
}

/// The kubelet's restart (it may prepare the claim again) leaves them alone too.
fn restart_kubelet(t: &mut Tier, cpus: &BTreeSet<usize>) -> Result<()> {
    let before = t.placed(POD)?;
    t.cl.restart_kubelet()?;
    std::thread::sleep(Duration::from_secs(10));
    t.wait_running(POD)?;
    t.assert_not_recreated(POD, &before)?;
    ensure!(
        booked(t)? == [cpus.clone()],
        "the claim after the kubelet's restart"
    );
    ensure!(
        t.placed(POD)? == before,
        "the container after the kubelet's restart"
    );
    ensure!(
        shared_on(t, ACCEL_NODE)?.is_disjoint(cpus),
        "shared CPUs after the kubelet's restart"
    );
    Ok(())
}

/// The CPUs of each claim in the agent's checkpoint (fixture CPU ids).
fn booked(t: &Tier) -> Result<Vec<BTreeSet<usize>>> {
    let path = t.cl.dir.join("agent-state/dra-claims.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).context(path.display().to_string()),
    };
    let cp: Value = serde_json::from_str(&text)?;
    let claims = cp["claims"].as_array().cloned().unwrap_or_default();
    Ok(claims
        .iter()
        .map(|c| {
            let parts = c["parts"].as_array().cloned().unwrap_or_default();
            parts
                .iter()
                .flat_map(|p| parse_list(p["cpus"].as_str().unwrap_or_default()))
                .collect()
        })
        .collect())
}

/// The shared CPUs of NUMA node `n` as the NodeTopology status reports them.
fn shared_on(t: &Tier, n: usize) -> Result<BTreeSet<usize>> {
    zone_cpus(t, n, "sharedCPUs")
}

/// The CPUs of NUMA node `n`'s zone that the NodeTopology status lists under `field`.
fn zone_cpus(t: &Tier, n: usize, field: &str) -> Result<BTreeSet<usize>> {
    let nt = t.node_topology()?;
    let zones = nt["status"]["zones"].as_array().context("no zones")?;
    let zone = zones
        .iter()
        .find(|z| z["name"] == format!("numa{n}"))
        .with_context(|| format!("no zone numa{n}"))?;
    Ok(parse_list(zone[field].as_str().unwrap_or_default()))
}

/// The allocation results of the Pod's claim: this driver's device of the accel's node with 4
/// CPUs and 256Mi consumed, and the accel device.
fn allocation(t: &Tier, pod: &str) -> Result<Value> {
    let results = t.claim_results(pod)?;
    let cpu = results
        .as_array()
        .and_then(|r| r.iter().find(|r| r["driver"] == TAP))
        .with_context(|| format!("no {TAP} result: {results}"))?;
    ensure!(cpu["device"] == format!("numa{ACCEL_NODE}"), "{results}");
    ensure!(cpu["consumedCapacity"]["cpu"] == "4", "{results}");
    // The API server keeps a quantity in its canonical form (256Mi as 268435456).
    let memory = cpu["consumedCapacity"]["memory"]
        .as_str()
        .unwrap_or_default();
    ensure!(["256Mi", "268435456"].contains(&memory), "{results}");
    ensure!(
        results
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["driver"] == ACCEL)),
        "{results}"
    );
    Ok(results)
}

/// A template of `cpu` CPUs and 256Mi of this driver, with the accel device on the same NUMA
/// node when `with_accel`.
fn template(name: &str, cpu: &str, with_accel: bool) -> Value {
    let mut requests = vec![json!({"name": "cpus", "exactly": {
        "deviceClassName": TAP,
        "capacity": {"requests": {"cpu": cpu, "memory": "256Mi"}},
    }})];
    let mut constraints = Vec::new();
    if with_accel {
        requests.push(json!({"name": "accel", "exactly": {"deviceClassName": ACCEL}}));
        constraints.push(json!({
            "requests": ["cpus", "accel"],
            "matchAttribute": "resource.kubernetes.io/numaNode",
        }));
    }
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": requests, "constraints": constraints}}},
    })
}

/// A Burstable Pod (100m/200m: this 2-CPU host cannot hold a request of the claim's size, which
/// docs/user/dra.md recommends elsewhere) whose container uses a claim from `template`.
fn pod(name: &str, template: &str) -> Result<Value> {
    let mut pod: Value = serde_json::from_str(&PodDef::new(name, "100m", "200m").manifest())?;
    pod["spec"]["resourceClaims"] =
        json!([{"name": "cpus", "resourceClaimTemplateName": template}]);
    pod["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": "cpus"}]);
    Ok(pod)
}

/// The container's cgroup `cpuset.mems` (folded onto the host's nodes).
fn cgroup_mems(t: &Tier, id: &str) -> Result<String> {
    let mut cri = t.cri()?;
    let pid = t.rt.block_on(cri.pid(id))?;
    tap_e2e::containerd::cgroup_mems(pid)
}

/// The container's `TAP_DRA_*` variables (set by the claim's CDI device), in their order.
fn cdi_env(t: &Tier, id: &str) -> Result<Vec<String>> {
    let mut cri = t.cri()?;
    let pid = t.rt.block_on(cri.pid(id))?;
    let raw = std::fs::read(format!("/proc/{pid}/environ"))?;
    Ok(raw
        .split(|b| *b == 0)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .filter(|v| v.starts_with("TAP_DRA_"))
        .collect())
}

fn list(s: &BTreeSet<usize>) -> String {
    s.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

fn clean_up(t: &Tier) -> Result<()> {
    let slice = slice_name(NODE);
    let objects = [
        ("pod", POD, Some("default")),
        ("pod", TOO_BIG, Some("default")),
        ("pod", REPLICATED, Some("default")),
        ("resourceclaimtemplate", "one-cpu", Some("default")),
        ("resourceclaimtemplate", "cpu-and-accel", Some("default")),
        ("resourceclaimtemplate", "too-big", Some("default")),
        ("resourceslice", slice.as_str(), None),
        ("deviceclass", ACCEL, None),
    ];
    t.delete_all(&objects)
}
