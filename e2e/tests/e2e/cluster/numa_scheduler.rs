//! The NUMA-aware scheduler reads what the agent publishes: kubernetes-sigs/scheduler-plugins'
//! kube-scheduler (hack/e2e/setup-scheduler-plugins.sh) runs as a second scheduler with
//! NodeResourceTopologyMatch in filter and score and its cache resync on, next to the default
//! one. The real node's NodeResourceTopology is the agent's; two Node objects without a
//! kubelet carry NodeResourceTopologies the test writes (the test checks the scheduler's
//! Binding there, nothing runs).

use super::tier::{Tier, GRANT_KEY, POLL};
use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use tap_e2e::cluster::NODE;
use tap_e2e::kube::Proc;
use tap_e2e::text::grant_fields;
use tap_e2e::util;

/// The second scheduler's profile.
pub(crate) const SCHEDULER: &str = "tap-numa-scheduler";
/// How often its cache compares the nodes' fingerprints with its own pods.
const RESYNC_SECONDS: u64 = 3;
/// The agent publishes the NodeResourceTopology at most once per this (its usage interval).
const PUBLISH_INTERVAL: Duration = Duration::from_secs(15);
/// Two nodes without a kubelet: zones of 2 free CPUs, and zones of 8.
const SMALL: &str = "numa-small";
const BIG: &str = "numa-big";

pub(crate) fn scheduler_bin() -> PathBuf {
    std::env::var_os("TAP_SCHED_PLUGINS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from("/var/cache/kunpeng-tap/bin/kube-scheduler-plugins-v0.35.4-devel")
        })
}

/// Starts the scheduler-plugins kube-scheduler (admin credentials: it reads
/// NodeResourceTopologies, which the system:kube-scheduler role does not grant).
fn start_scheduler(t: &Tier) -> Result<Proc> {
    let kc = t.cl.kube().kubeconfig.display().to_string();
    let config = format!(
        r#"apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: false
clientConnection:
  kubeconfig: "{kc}"
profiles:
  - schedulerName: {SCHEDULER}
    plugins:
      multiPoint:
        enabled:
          - name: NodeResourceTopologyMatch
    pluginConfig:
      - name: NodeResourceTopologyMatch
        args:
          cacheResyncPeriodSeconds: {RESYNC_SECONDS}
          scoringStrategy:
            type: LeastAllocated
"#
    );
    let path = t.cl.dir.join("numa-scheduler.yaml");
    std::fs::write(&path, config)?;
    let mut cmd = Command::new(scheduler_bin());
    cmd.arg(format!("--config={}", path.display()))
        .arg("--bind-address=127.0.0.1")
        .arg("--secure-port=0")
        // 4: the cache's fingerprint checks ("overriding cached info ... resynced").
        .arg("--v=4");
    let mut p = Proc::spawn(SCHEDULER, cmd, &t.cl.dir.join("numa-scheduler.log"))?;
    std::thread::sleep(Duration::from_secs(2));
    ensure!(p.running(), "{SCHEDULER} exited:\n{}", log_tail(&p));
    Ok(p)
}

/// The last lines of the scheduler's log, its flag dump left out.
fn log_tail(p: &Proc) -> String {
    let text = p.log_text();
    let lines: Vec<&str> = text.lines().filter(|l| !l.contains("] FLAG: ")).collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// A Node object without a kubelet, with 16 CPUs and 64 GiB, and its NodeResourceTopology:
/// two zones of `zone_cpus` CPUs and 32 GiB each.
fn fake_node(t: &Tier, name: &str, zone_cpus: u32) -> Result<()> {
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
    });
    t.cl.kube().apply(&node.to_string())?;
    let status = json!({"status": {
        "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
        "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "test node", "lastHeartbeatTime": now(), "lastTransitionTime": now()}],
    }});
    t.kubectl(&[
        "patch",
        "node",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ])?;
    let zone = |i: u32| {
        json!({"name": format!("node-{i}"), "type": "Node",
        "costs": [{"name": "node-0", "value": if i == 0 {10} else {20}},
                  {"name": "node-1", "value": if i == 1 {10} else {20}}],
        "resources": [
            {"name": "cpu", "capacity": zone_cpus.to_string(),
             "allocatable": zone_cpus.to_string(), "available": zone_cpus.to_string()},
            {"name": "memory", "capacity": "32Gi", "allocatable": "32Gi", "available": "32Gi"},
        ]})
    };
    let nrt = json!({
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": name},
        "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                       {"name": "topologyManagerScope", "value": "container"}],
        "zones": [zone(0), zone(1)],
    });
    t.cl.kube().apply(&nrt.to_string())?;
    Ok(())
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A Guaranteed Pod of `cpus` CPUs for the NUMA-aware scheduler (tolerating the taints a node
/// without a kubelet gets).
fn guaranteed(name: &str, cpus: &str, node_selector: Option<&str>) -> String {
    let mut spec = json!({
        "schedulerName": SCHEDULER,
        "terminationGracePeriodSeconds": 0,
        "tolerations": [{"operator": "Exists", "effect": "NoSchedule"},
                        {"operator": "Exists", "effect": "NoExecute"}],
        "containers": [{"name": "app", "image": tap_e2e::containerd::BUSYBOX_IMAGE,
            "imagePullPolicy": "Never", "command": ["/bin/sleep", "36000"],
            "resources": {"requests": {"cpu": cpus, "memory": "256Mi"},
                          "limits": {"cpu": cpus, "memory": "256Mi"}}}],
    });
    if let Some(n) = node_selector {
        spec["nodeSelector"] = json!({"kubernetes.io/hostname": n});
    }
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"}, "spec": spec})
    .to_string()
}

/// The node the scheduler bound `pod` to (waits for the Binding).
fn bound_node(t: &Tier, pod: &str) -> Result<String> {
    let mut node = String::new();
    util::wait_until(
        &format!("a Binding of {pod}"),
        Duration::from_secs(60),
        POLL,
        || {
            node = t.pod_json(pod)?["spec"]["nodeName"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            Ok(!node.is_empty())
        },
    )?;
    Ok(node)
}

/// The scheduler's last FailedScheduling message for `pod` (waits for one).
fn failed_scheduling(t: &Tier, pod: &str) -> Result<String> {
    t.pod_event(pod, "FailedScheduling")
}

/// The lines of the scheduler's log from byte `from` on.
fn log_since(s: &Proc, from: usize) -> String {
    let text = s.log_text();
    text.get(from..).unwrap_or_default().to_string()
}

/// The fingerprint of `NODE`'s pods but Pending ones, as the API server lists them (the set
/// the plugin counts with its default, dedicated pod informer).
fn counted_pods_fingerprint(t: &Tier) -> Result<String> {
    let field = format!("spec.nodeName={NODE},status.phase!=Pending");
    let list =
        t.cl.kube()
            .get_json(&["get", "pods", "-A", "--field-selector", &field])?
            .context("no pod list")?;
    let pods: Vec<(String, String)> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let m = &p["metadata"];
            Some((
                m["namespace"].as_str()?.to_string(),
                m["name"].as_str()?.to_string(),
            ))
        })
        .collect();
    Ok(node_agent::kube_link::fingerprint::sign(
        pods.iter().map(|(n, p)| (n.as_str(), p.as_str())),
    ))
}

/// Waits until the plugin's cache checks `NODE`'s NodeResourceTopology against its own pods
/// and finds them equal to `want` (its "podset fingerprint check" line, logged after byte
/// `from`, with `want` as both the published and the computed fingerprint), and takes the
/// object ("overriding cached info", reason "resynced"). Returns how long it took.
fn wait_resynced(s: &Proc, from: usize, want: &str, step: &str) -> Result<Duration> {
    let t0 = Instant::now();
    let node = format!("node=\"{NODE}\"");
    let (expected, computed) = (
        format!("expected=\"{want}\""),
        format!("computed=\"{want}\""),
    );
    let within = PUBLISH_INTERVAL + Duration::from_secs(RESYNC_SECONDS * 2 + 10);
    util::wait_until(
        &format!("the plugin's cache to accept {NODE}'s NodeResourceTopology after {step}"),
        within,
        POLL,
        || {
            let log = log_since(s, from);
            let mut checked = false;
            for l in log.lines().filter(|l| l.contains(&node)) {
                if l.contains("podset fingerprint check") {
                    checked = l.contains(&expected) && l.contains(&computed);
                } else if checked && l.contains("overriding cached info") && l.contains("resynced")
                {
                    return Ok(true);
                }
            }
            Ok(false)
        },
    )
    .with_context(|| {
        let lines = log_since(s, from)
            .lines()
            .filter(|l| l.contains(&node) && l.contains("fingerprint"))
            .take(6)
            .collect::<Vec<_>>()
            .join("\n");
        format!(
            "want {want}; the scheduler's fingerprint lines for {NODE} since the step:\n{lines}"
        )
    })?;
    Ok(t0.elapsed())
}

fn log_len(s: &Proc) -> usize {
    s.log_text().len()
}

pub(crate) fn numa_scheduler(t: &mut Tier) -> Result<()> {
    // The plugin's cache lists the NodeResourceTopologies when it starts and learns of later
    // ones only through its resync: every object is there before it starts.
    let r = nodes_and_objects(t).and_then(|()| {
        let mut sched = start_scheduler(t)?;
        let r = scenarios(t, &mut sched);
        if r.is_err() {
            eprintln!("--- {SCHEDULER} log (tail)\n{}", log_tail(&sched));
        }
        sched.terminate(Duration::from_secs(3));
        r
    });
    for p in [
        "numa-fits",
        "numa-fits-none",
        "numa-real",
        "pfp-burstable",
        "pfp-guaranteed",
        "pfp-job",
        "pfp-sidecar",
    ] {
        let _ = t.kubectl(&[
            "-n",
            "default",
            "delete",
            "pod",
            p,
            "--ignore-not-found",
            "--wait=false",
        ]);
    }
    for n in [SMALL, BIG] {
        let _ = t.kubectl(&["delete", "node", n, "--ignore-not-found", "--wait=false"]);
        let _ = t.kubectl(&[
            "delete",
            "noderesourcetopologies.topology.node.k8s.io",
            n,
            "--ignore-not-found",
        ]);
    }
    r
}

/// The two Node objects without a kubelet and their objects, and the agent's object for the
/// real node.
fn nodes_and_objects(t: &Tier) -> Result<()> {
    fake_node(t, SMALL, 2)?;
    fake_node(t, BIG, 8)?;
    util::wait_until(
        "the agent's NodeResourceTopology",
        Duration::from_secs(90),
        POLL,
        || {
            Ok(t.cl
                .kube()
                .get_json(&["get", "noderesourcetopologies.topology.node.k8s.io", NODE])?
                .is_some())
        },
    )
}

fn scenarios(t: &mut Tier, sched: &mut Proc) -> Result<()> {
    binding_by_zone_fit(t)?;
    pinned_where_counted(t)?;
    fingerprint_through_churn(t, sched)
}

/// 4 CPUs fit one zone of `numa-big` only (`numa-small`'s zones have 2, the real node 2 CPUs
/// in all); 12 CPUs fit no zone anywhere: Pending with the plugin's reason.
fn binding_by_zone_fit(t: &mut Tier) -> Result<()> {
    t.cl.kube().apply(&guaranteed("numa-fits", "4", None))?;
    let node = bound_node(t, "numa-fits")?;
    ensure!(node == BIG, "numa-fits (4 CPUs) bound to {node}, not {BIG}");
    t.cl.kube()
        .apply(&guaranteed("numa-fits-none", "12", None))?;
    let msg = failed_scheduling(t, "numa-fits-none")?;
    ensure!(
        msg.contains("cannot align"),
        "numa-fits-none (12 CPUs) not refused by the NUMA filter: {msg}"
    );
    let p = t.pod_json("numa-fits-none")?;
    ensure!(
        p["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "numa-fits-none was bound: {p}"
    );
    t.notes.push(format!(
        "NUMA scheduler: numa-fits bound to {node}; numa-fits-none Pending: {msg}"
    ));
    Ok(())
}

/// The real node's zones' CPUs as the agent's object says: zone name -> (allocatable,
/// available) in milli-CPUs.
fn zone_cpus(t: &Tier) -> Result<std::collections::BTreeMap<String, (u64, u64)>> {
    let nrt =
        t.cl.kube()
            .get_json(&["get", "noderesourcetopologies.topology.node.k8s.io", NODE])?
            .context("no NodeResourceTopology")?;
    let milli = |v: &Value| {
        let s = v.as_str().unwrap_or_default();
        s.strip_suffix('m').map_or_else(
            || s.parse::<u64>().ok().map(|c| c * 1000),
            |m| m.parse().ok(),
        )
    };
    let mut out = std::collections::BTreeMap::new();
    for z in nrt["zones"].as_array().into_iter().flatten() {
        let cpu = z["resources"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["name"] == "cpu"));
        if let (Some(name), Some(cpu)) = (z["name"].as_str(), cpu) {
            if let (Some(a), Some(v)) = (milli(&cpu["allocatable"]), milli(&cpu["available"])) {
                out.insert(name.to_string(), (a, v));
            }
        }
    }
    Ok(out)
}

/// The plugin's last "final verdict" line for `pod` on the real node (the zone it counted).
fn plugin_verdict(t: &Tier, pod: &str) -> String {
    let log = std::fs::read_to_string(t.cl.dir.join("numa-scheduler.log")).unwrap_or_default();
    log.lines()
        .rfind(|l| l.contains("final verdict") && l.contains(pod) && l.contains(NODE))
        .unwrap_or("(no final verdict line)")
        .to_string()
}

/// A Guaranteed 1-CPU Pod the NUMA-aware scheduler binds to the real node: the agent gives it
/// an exclusive CPU on one NUMA node, the zone the plugin counted it on, and the agent's
/// object then shows that zone one CPU fuller than before.
fn pinned_where_counted(t: &mut Tier) -> Result<()> {
    let before = zone_cpus(t)?;
    t.cl.kube()
        .apply(&guaranteed("numa-real", "1", Some(NODE)))?;
    let node = bound_node(t, "numa-real")?;
    ensure!(node == NODE, "numa-real bound to {node}");
    t.wait_running("numa-real")?;
    let placed = t.placed("numa-real")?;
    let f = grant_fields(&placed.grant);
    let numa = f.get("n").cloned().unwrap_or_default();
    ensure!(
        f.get("x").is_some_and(|x| !x.is_empty()) && numa.parse::<u32>().is_ok(),
        "numa-real: no exclusive CPU on one NUMA node: {} ({GRANT_KEY})",
        placed.grant
    );
    // The zone the plugin counted the container on (the kubelet's choice it emulates: the
    // lowest NUMA node that fits) is the one the agent pinned it to.
    let counted = plugin_verdict(t, "numa-real");
    ensure!(
        counted.contains(&format!("numaCell={numa}")),
        "numa-real: the agent pinned it to NUMA node {numa}, the plugin counted: {counted}"
    );
    let zone = format!("node-{numa}");
    let was = before
        .get(&zone)
        .map(|z| z.1)
        .context("zone missing before")?;
    let mut now = (0, 0);
    util::wait_until(
        &format!("zone {zone} one CPU fuller"),
        PUBLISH_INTERVAL * 3,
        POLL,
        || {
            now = zone_cpus(t)?.get(&zone).copied().unwrap_or_default();
            Ok(now.1 + 1000 <= was)
        },
    )?;
    t.notes.push(format!(
        "NUMA scheduler: numa-real bound to {node}, grant {} (cgroup cpus {}), zone {zone} cpu available {was}m -> {}m of {}m; plugin: {counted}",
        placed.grant, placed.cgroup_cpus, now.1, now.0
    ));
    t.delete_pod("numa-real")?;
    Ok(())
}

/// A churn step: the Pod's name, its manifest and the phase it ends in.
struct Step {
    name: &'static str,
    manifest: String,
    phase: &'static str,
}

/// The churn steps on the real node: a Burstable Pod, a Guaranteed one, a completed Job pod,
/// a Pod with an init container and a sidecar.
fn churn_steps() -> Vec<Step> {
    let container = |name: &str, cpu: &str, cmd: &[&str]| {
        json!({"name": name, "image": tap_e2e::containerd::BUSYBOX_IMAGE,
            "imagePullPolicy": "Never", "command": cmd,
            "resources": {"requests": {"cpu": cpu, "memory": "32Mi"},
                          "limits": {"cpu": cpu, "memory": "32Mi"}}})
    };
    let step = |name: &'static str, mut spec: Value, phase: &'static str| {
        // The default scheduler might pick a node without a kubelet otherwise.
        spec["nodeSelector"] = json!({"kubernetes.io/hostname": NODE});
        let manifest = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec})
        .to_string();
        Step {
            name,
            manifest,
            phase,
        }
    };
    let sleep = ["/bin/sleep", "36000"];
    let mut burstable = container("app", "100m", &sleep);
    burstable["resources"]["limits"]["cpu"] = json!("200m");
    let sidecar = json!({"restartPolicy": "Always", "name": "sidecar",
        "image": tap_e2e::containerd::BUSYBOX_IMAGE, "imagePullPolicy": "Never",
        "command": sleep, "resources": {"requests": {"cpu": "50m", "memory": "16Mi"}}});
    vec![
        step(
            "pfp-burstable",
            json!({"terminationGracePeriodSeconds": 0,
            "containers": [burstable]}),
            "Running",
        ),
        step(
            "pfp-guaranteed",
            json!({"terminationGracePeriodSeconds": 0,
            "containers": [container("app", "1", &sleep)]}),
            "Running",
        ),
        step(
            "pfp-job",
            json!({"restartPolicy": "Never",
            "containers": [container("app", "100m", &["/bin/true"])]}),
            "Succeeded",
        ),
        step(
            "pfp-sidecar",
            json!({"terminationGracePeriodSeconds": 0,
            "initContainers": [container("init", "100m", &["/bin/true"]), sidecar],
            "containers": [container("app", "100m", &sleep)]}),
            "Running",
        ),
    ]
}

/// Churn on the real node through the default scheduler (foreign pods to the plugin, which
/// marks the node for a resync): after each step the plugin's cache accepts the agent's
/// NodeResourceTopology, i.e. the fingerprints agree.
fn fingerprint_through_churn(t: &mut Tier, sched: &mut Proc) -> Result<()> {
    let mut took = Vec::new();
    for Step {
        name,
        manifest,
        phase,
    } in churn_steps()
    {
        let from = log_len(sched);
        t.cl.kube().apply(&manifest)?;
        util::wait_until(
            &format!("{name} {phase}"),
            Duration::from_secs(90),
            POLL,
            || Ok(t.pod_json(name)?["status"]["phase"] == phase),
        )
        .with_context(|| t.describe(name))?;
        // The set the plugin counts from now on; a check of exactly it must be accepted.
        let want = counted_pods_fingerprint(t)?;
        let d = wait_resynced(sched, from, &want, name)?;
        took.push(format!("{name} ({phase}) {:.1}s", d.as_secs_f64()));
    }
    t.notes.push(format!(
        "NUMA scheduler fingerprint accepted after each step: {}",
        took.join(", ")
    ));
    Ok(())
}
