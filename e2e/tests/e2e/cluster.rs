//! The cluster tier: a real single-node Kubernetes cluster (`tap_e2e::cluster`), Pods created by
//! the kubelet, the agent and the operator installed with `helm install` from the repository's
//! chart and the locally built images.
//!
//! One cluster per test binary: the single test runs the scenarios in order on it and tears it
//! down at the end (also when a scenario fails). The agent runs as the chart's DaemonSet Pod in
//! NRI mode on the fixture topology (synthetic-2s-4numa-96c-gpu, 4 NUMA nodes) folded onto this
//! host (`--fold-cpus-to-host`: NUMA node k -> host CPU k mod n), so two containers on different
//! NUMA nodes get different cgroup cpusets on a 2-CPU host.
//!
//! The images: the static binaries `tap_e2e::images::build_static` builds for the Dockerfiles'
//! `prebuilt` path (the same build e2e/tests/e2e/images.rs uses), packed as the Dockerfiles' final
//! stage packs them (`scratch`, the binary in /usr/local/bin, user 65532) and imported with
//! `ctr images import`; the agent's image has a second layer with the fixture.

mod dra_accel;
mod dra_cpu;
mod dra_peer;
mod numa_scheduler;
mod tier;

use anyhow::{ensure, Context, Result};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tap_e2e::cluster::{Cluster, RuntimeEndpoint, NODE};
use tap_e2e::device_plugin::{AccelDevice, DevicePlugin};
use tap_e2e::docker::TapAgent;
use tap_e2e::util::{self, workspace_root};
use tier::*;

/// The test device plugin's extended resource.
const ACCEL: &str = "example.com/accel";

// ---- scenarios -------------------------------------------------------------------------------

/// helm install: the agent runs as the DaemonSet's Pod and registers over NRI, the operator as
/// its Deployment.
fn helm_install(t: &Tier) -> Result<()> {
    let ctd = t.cl.containerd();
    let env = t.cl.api_env();
    let values = serde_json::json!({
        "agent": {
            "image": {"repository": AGENT_IMAGE, "tag": TAG, "pullPolicy": "Never"},
            "flags": {
                "containerRuntimeMode": "NRI",
                "nriSocketPath": ctd.nri_socket().display().to_string(),
                "stateDir": t.cl.dir.join("agent-state").display().to_string(),
                // The tier's kubelet runs with its own --root-dir.
                "podResourcesSocket": t.cl.dir.join("kubelet/pod-resources/kubelet.sock").display().to_string(),
                "foldCpusToHost": true,
                "logFormat": "text",
                // The DRA driver for CPUs and memory, on the tier's kubelet (its --root-dir).
                "draDriver": "on",
                "kubeletRootDir": t.cl.dir.join("kubelet").display().to_string(),
                // The tier's containerd reads CDI specs from its own folder.
                "draCdiDir": ctd.cdi_dir().display().to_string(),
            },
            "extraArgs": [format!("--sysfs-root={IMAGE_FIXTURE}")],
            "extraEnv": env.iter().map(|(k, v)| serde_json::json!({"name": k, "value": v})).collect::<Vec<_>>(),
        },
        "operator": {
            "image": {"repository": OPERATOR_IMAGE, "tag": TAG, "pullPolicy": "Never"},
            "replicas": 1,
            // The operator is not a workload to place (and keeps the counts below exact).
            "podLabels": {"tap.kunpeng.huawei.com/skip": "true"},
            "extraEnv": env.iter().map(|(k, v)| serde_json::json!({"name": k, "value": v})).collect::<Vec<_>>(),
        },
    });
    let vf = t.cl.dir.join("values.json");
    std::fs::write(&vf, values.to_string())?;
    let chart = workspace_root().join("charts/kunpeng-tap");
    let t0 = Instant::now();
    helm(
        &t.cl,
        &[
            "install",
            "tap",
            &chart.to_string_lossy(),
            "-n",
            NS,
            "--create-namespace",
            "-f",
            &vf.to_string_lossy(),
            "--wait",
            "--timeout",
            "180s",
        ],
    )?;
    eprintln!("helm install --wait: {:.1}s", t0.elapsed().as_secs_f64());
    // helm's --wait accepts a DaemonSet with maxUnavailable Pods not ready: wait for both.
    let agent = ("daemonset", "tap-kunpeng-tap-agent", "numberReady");
    wait_status_one(t, agent, "the agent DaemonSet's Pod Ready")?;
    let operator = ("deployment", "tap-kunpeng-tap-operator", "readyReplicas");
    wait_status_one(t, operator, "the operator Deployment available")?;
    // Registered over NRI: containerd logs the plugin, the agent synchronized with it.
    t.wait_agent_log("state restored from the runtime", 1)?;
    let log = std::fs::read_to_string(ctd.log_path())?;
    ensure!(
        log.contains("kunpeng-tap"),
        "containerd's log does not mention the plugin"
    );
    Ok(())
}

/// A TopologyPolicy reaches the node's NodeTopology and the agent follows it; the guide's Pod
/// gets one NUMA node; two Pods on different NUMA nodes get different cgroup cpusets.
fn guide_pod_and_policy_switch(t: &mut Tier) -> Result<()> {
    t.set_policy("numa-aware")?;
    t.wait_agent_log("policy configuration changed", 1)?;
    // The guide's example (requests cpu 4 / memory 4Gi, limits cpu 8 / 4Gi), scaled to this
    // 2-CPU node with the same ratios: cpu 1 / 1Gi, limits cpu 2 / 1Gi.
    let mut guide = PodDef::new("guide", "1", "2");
    guide.memory = "1Gi";
    let g = t.run_pod(&guide)?;
    let k = t.assert_on_one_node("guide Pod", &g, "numa-aware")?;
    let note = format!(
        "guide Pod (numa-aware): grant {} ; NUMA node {k} = fixture CPUs {:?}; CRI cpuset_cpus {:?}; cgroup cpuset.cpus {:?}",
        g.grant,
        node_cpus(k),
        g.spec_cpus,
        g.cgroup_cpus
    );
    eprintln!("{note}");
    t.notes.push(note);

    // A second Pod goes to another NUMA node (more free capacity): another host CPU.
    let second = t.run_pod(&PodDef::new("second", "250m", "500m"))?;
    let k2 = t.assert_on_one_node("second Pod", &second, "numa-aware")?;
    ensure!(k2 != k, "both Pods on NUMA node {k}");
    // Each was checked against its own node's image (host CPU k mod n); nodes whose images
    // differ must show different cgroup cpusets.
    let n = host_cpus().len();
    if k2 % n != k % n {
        ensure!(
            second.cgroup_cpus != g.cgroup_cpus,
            "NUMA nodes {k} and {k2}, same cgroup cpuset {}",
            g.cgroup_cpus
        );
    }
    t.notes.push(format!(
        "second Pod: NUMA node {k2}, cgroup cpuset.cpus {:?}",
        second.cgroup_cpus
    ));

    // Switch to topology-aware: the next Pod is placed by it.
    t.set_policy("topology-aware")?;
    t.wait_agent_log("policy configuration changed", 2)?;
    let third = t.run_pod(&PodDef::new("third", "250m", "500m"))?;
    ensure!(
        third.field("p") == "topology-aware",
        "third Pod not placed by topology-aware: {third:?}"
    );
    // The earlier Pods keep their grants.
    ensure!(t.placed("guide")? == g, "the guide Pod changed");
    t.delete_pod("third")?;
    Ok(())
}

/// Annotations and the skip label set on the Pod by the user take effect.
fn annotations_and_skip_label(t: &Tier) -> Result<()> {
    let mut skipped = PodDef::new("skipped", "100m", "200m");
    skipped.labels = &[("tap.kunpeng.huawei.com/skip", "true")];
    let s = t.run_pod(&skipped)?;
    ensure!(
        s.grant.is_empty(),
        "skip label: a grant was recorded: {s:?}"
    );
    let all: BTreeSet<usize> = host_cpus().into_iter().collect();
    ensure!(
        s.spec_cpus.is_empty() && parse_list(&s.cgroup_cpus) == all,
        "skip label: the container was adjusted: {s:?}"
    );
    // The node's policy is topology-aware now; the Pod asks for numa-aware.
    let mut annotated = PodDef::new("annotated", "100m", "200m");
    annotated.annotations = &[("tap.kunpeng.huawei.com/policy", "numa-aware")];
    let a = t.run_pod(&annotated)?;
    t.assert_on_one_node("annotated Pod", &a, "numa-aware")?;
    // Skip by annotation too.
    let mut none = PodDef::new("policy-none", "100m", "200m");
    none.annotations = &[("tap.kunpeng.huawei.com/policy", "none")];
    let n = t.run_pod(&none)?;
    ensure!(
        n.grant.is_empty() && n.spec_cpus.is_empty(),
        "policy none: {n:?}"
    );
    for p in ["skipped", "annotated", "policy-none"] {
        t.delete_pod(p)?;
    }
    Ok(())
}

/// A device plugin (`tap_e2e::device_plugin`) advertises one `example.com/accel` device on a
/// NUMA node other than where a Pod without devices goes; the kubelet allocates it to a Pod
/// that asks for it, the agent reads the allocation from the kubelet's pod-resources API and
/// places the Pod on the device's node, and the Pod's Event names the device.
fn device_plugin_hint(t: &mut Tier) -> Result<()> {
    let probe = t.run_pod(&PodDef::new("probe", "250m", "500m"))?;
    let k = t.assert_on_one_node("probe Pod", &probe, "topology-aware")?;
    t.delete_pod("probe")?;
    // The next node: another host CPU on this 2-CPU host (node k -> CPU k mod 2).
    let node = (k + 1) % 4;
    let id = format!("accel-{node}");
    // The kubelet's device manager listens at a fixed path, whatever its --root-dir.
    let dir = std::path::Path::new("/var/lib/kubelet/device-plugins");
    let devices = vec![AccelDevice {
        id: id.clone(),
        numa_node: node as i64,
    }];
    let plugin =
        t.rt.block_on(DevicePlugin::start(dir, "tap-accel", ACCEL, devices))?;
    util::wait_until(
        "the node's allocatable example.com/accel",
        Duration::from_secs(60),
        POLL,
        || {
            let n =
                t.cl.kube()
                    .get_json(&["get", "node", NODE])?
                    .context("no node")?;
            Ok(n["status"]["allocatable"][ACCEL] == "1")
        },
    )?;
    let mut def = PodDef::new("accel", "250m", "500m");
    def.extended = &[(ACCEL, "1")];
    let p = t.run_pod(&def)?;
    let got = t.assert_on_one_node("accel Pod", &p, "topology-aware")?;
    ensure!(
        plugin.allocated() == vec![vec![id.clone()]],
        "the kubelet allocated {:?}, not [[{id}]]",
        plugin.allocated()
    );
    ensure!(
        got == node,
        "the accel Pod is on NUMA node {got}, its device on {node}"
    );
    let event = t.pod_event("accel", "TopologyPlaced")?;
    let named = format!("devices {ACCEL} {id} (NUMA {node})");
    ensure!(
        event.contains(&named),
        "the Event {event:?} does not say {named:?}"
    );
    // The NodeResourceTopology's zone of the device counts it from the real kubelet's
    // pod-resources API: allocatable 1, available 0 while the Pod holds it, 1 once it is gone.
    let zone = format!("node-{node}");
    wait_zone_device(t, &zone, "0")?;
    t.notes.push(format!(
        "device plugin: a Pod without devices went to NUMA node {k}; the accel Pod, given {id} on node {node}: \
         grant {}, CRI cpuset_cpus {:?}, cgroup cpuset.cpus {:?}; Event TopologyPlaced: {event}; \
         NodeResourceTopology zone {zone}: {ACCEL} allocatable 1, available 0",
        p.grant, p.spec_cpus, p.cgroup_cpus
    ));
    t.delete_pod("accel")?;
    wait_zone_device(t, &zone, "1")?;
    drop(plugin);
    Ok(())
}

/// Waits until the agent's NodeResourceTopology zone `zone` shows one `example.com/accel`
/// allocatable and `available` free (device counts are asked every 10 s and the object is
/// written at most every 15 s).
fn wait_zone_device(t: &Tier, zone: &str, available: &str) -> Result<()> {
    util::wait_until(
        &format!("{ACCEL} available {available} of 1 in zone {zone} of the NodeResourceTopology"),
        Duration::from_secs(60),
        POLL,
        || {
            let nrt =
                t.cl.kube()
                    .get_json(&["get", "noderesourcetopologies.topology.node.k8s.io", NODE])?
                    .context("no NodeResourceTopology")?;
            let res = nrt["zones"].as_array().and_then(|z| {
                z.iter().find(|z| z["name"] == zone)?["resources"]
                    .as_array()?
                    .iter()
                    .find(|r| r["name"] == ACCEL)
                    .cloned()
            });
            Ok(res.is_some_and(|r| r["allocatable"] == "1" && r["available"] == available))
        },
    )
}

/// The per-Pod controls of the annotation table, one Pod each, through the kubelet: a level,
/// NUMA policies `exclusive` and `strict`, a memory type this machine lacks, and the cache
/// level; each shows its grant or its Warning Event.
fn per_pod_controls(t: &mut Tier) -> Result<()> {
    // level: socket -> a socket pool.
    let s = t.run_pod(&annotated("ctl-socket", &[(LEVEL, "socket")]))?;
    ensure!(s.field("pool").starts_with("socket"), "level socket: {s:?}");
    // numa-policy: exclusive -> a whole NUMA node (24 CPUs held exclusively).
    let x = t.run_pod(&annotated("ctl-numa-excl", &[(NUMA_POLICY, "exclusive")]))?;
    let k: usize = x.field("n").parse().with_context(|| format!("{x:?}"))?;
    ensure!(
        parse_list(&x.field("x")) == node_cpus(k),
        "numa-policy exclusive: not all of node {k} held: {x:?}"
    );
    ensure!(parse_list(&x.cgroup_cpus) == folded_node(k), "{x:?}");
    t.notes
        .push(format!("numa-policy exclusive: grant {}", x.grant));
    // numa-policy: strict is judged by the request, as the kubelet's single-numa-node: a limit
    // no NUMA node holds (30 CPUs on 24-CPU nodes) with a request one holds gets one node. (A
    // request no node holds is refused: engine tests; this 2-CPU node admits no such Pod.)
    let mut big = annotated("ctl-strict", &[(NUMA_POLICY, "strict")]);
    big.cpu_limit = "30";
    let b = t.run_pod(&big)?;
    let one_node = b.field("n").parse::<usize>().is_ok();
    ensure!(
        one_node && b.field("pool").starts_with("numa") && b.field("l") == "30000",
        "strict 100m/30: not one NUMA node: {b:?}"
    );
    let e = t.pod_event("ctl-strict", "TopologyPlaced")?;
    t.notes.push(format!(
        "numa-policy strict 100m/30: grant {} ; Event {e}",
        b.grant
    ));
    // memory-type: pmem on a DRAM-only machine: placed, and a Warning says why not.
    let m = t.run_pod(&annotated(
        "ctl-pmem",
        &[("tap.kunpeng.huawei.com/memory-type", "pmem")],
    ))?;
    ensure!(!m.grant.is_empty(), "memory-type: {m:?}");
    let e = t.pod_event("ctl-pmem", "TopologyNotHonoured")?;
    ensure!(e.contains("pmem"), "memory-type: Event {e:?}");
    // level: cache on a fixture without cache information: the root, and a Warning says so.
    let c = t.run_pod(&annotated("ctl-cache", &[(LEVEL, "cache")]))?;
    ensure!(c.field("pool") == "machine", "level cache: {c:?}");
    let e = t.pod_event("ctl-cache", "TopologyNotHonoured")?;
    ensure!(e.contains("cache"), "level cache: Event {e:?}");
    t.notes
        .push(format!("level cache: grant {} ; Warning {e}", c.grant));
    for p in [
        "ctl-socket",
        "ctl-numa-excl",
        "ctl-strict",
        "ctl-pmem",
        "ctl-cache",
    ] {
        t.delete_pod(p)?;
    }
    Ok(())
}

/// Strict reserved CPUs through the TopologyPolicy: fixture NUMA node 3 (CPUs 72-95, no Pod on
/// it now) is reserved; a Pod asking for the reserved CPUs by annotation is refused while the
/// policy ignores the annotation (placed on the pools, a Warning), and gets exactly them once
/// the policy honours it (its grant says `on=reserved`, its cgroup is the node folded).
fn reserved_cpus(t: &mut Tier) -> Result<()> {
    const RESERVED: &str = "72-95";
    const ASK: &[(&str, &str)] = &[("tap.kunpeng.huawei.com/reserved-cpus", "true")];
    t.set_reserved_policy(RESERVED, "ignored")?;
    let refused = t.run_pod(&annotated("asks", ASK))?;
    ensure!(
        !refused.grant.contains("on=reserved") && refused.field("n") != "3",
        "an ask the policy ignores got the reserved CPUs: {refused:?}"
    );
    let e = t.pod_event("asks", "TopologyNotHonoured")?;
    ensure!(e.contains("reserved-cpus"), "asks: Event {e:?}");
    t.delete_pod("asks")?;
    t.set_reserved_policy(RESERVED, "honoured")?;
    let daemon = t.run_pod(&annotated("daemon", ASK))?;
    ensure!(daemon.grant.contains("on=reserved"), "daemon: {daemon:?}");
    ensure!(
        parse_list(&daemon.cgroup_cpus) == folded_node(3),
        "daemon: cgroup {} is not the reserved CPUs folded: {daemon:?}",
        daemon.cgroup_cpus
    );
    let e = t.pod_event("daemon", "TopologyPlaced")?;
    ensure!(e.contains("(reserved)"), "daemon: Event {e:?}");
    t.notes.push(format!(
        "reserved CPUs {RESERVED}: daemon grant {}, cgroup cpuset.cpus {:?}; Event {e}",
        daemon.grant, daemon.cgroup_cpus
    ));
    t.delete_pod("daemon")?;
    t.set_policy("topology-aware")
}

const LEVEL: &str = "tap.kunpeng.huawei.com/level";
const NUMA_POLICY: &str = "tap.kunpeng.huawei.com/numa-policy";

/// A Burstable 100m/200m Pod with `annotations`.
fn annotated<'a>(name: &'a str, annotations: &'a [(&'a str, &'a str)]) -> PodDef<'a> {
    let mut d = PodDef::new(name, "100m", "200m");
    d.annotations = annotations;
    d
}

/// `kubectl get nodetopology` shows the allocation; deleting a Pod releases it.
fn nodetopology_and_release(t: &Tier) -> Result<()> {
    // guide + second are placed now.
    t.wait_containers(2)?;
    let table = t.kubectl(&["get", "nodetopology"])?;
    eprintln!("kubectl get nodetopology:\n{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with(NODE))
        .context("no row for the node")?;
    ensure!(
        row.contains("1.25/"),
        "the node's row does not show 1.25 CPUs allocated: {row}"
    );
    t.delete_pod("second")?;
    t.wait_containers(1)?;
    let nt = t.node_topology()?;
    ensure!(
        nt["status"]["allocated"]
            .as_str()
            .unwrap_or("")
            .starts_with("1/"),
        "after deleting a Pod: {}",
        nt["status"]["allocated"]
    );
    Ok(())
}

/// In-place resize reaches the agent's update path.
fn resize(t: &Tier) -> Result<()> {
    let id = t.container_id("default", "guide")?;
    let before = t
        .agent_log()?
        .lines()
        .filter(|l| l.contains(&id) && l.contains("update"))
        .count();
    t.kubectl(&[
        "-n",
        "default",
        "patch",
        "pod",
        "guide",
        "--subresource",
        "resize",
        "-p",
        r#"{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"500m","memory":"1Gi"},"limits":{"cpu":"2","memory":"1Gi"}}}]}}"#,
    ])?;
    util::wait_until(
        "the agent's update hook for the resized container",
        Duration::from_secs(60),
        POLL,
        || {
            Ok(t.agent_log()?
                .lines()
                .filter(|l| l.contains(&id) && l.contains("update"))
                .count()
                > before)
        },
    )?;
    util::wait_until(
        "NodeTopology shows the resized request",
        Duration::from_secs(60),
        POLL,
        || {
            Ok(t.node_topology()?["status"]["allocated"]
                .as_str()
                .unwrap_or("")
                .starts_with("0.5/"))
        },
    )?;
    Ok(())
}

/// Deletes the agent Pod, waits for the DaemonSet's new one, for its state to be restored and
/// for its first NodeTopology status.
fn restart_agent_pod(t: &mut Tier) -> Result<()> {
    let old = t.agent_pod()?;
    t.kubectl(&[
        "-n",
        NS,
        "delete",
        "pod",
        &old,
        "--wait=true",
        "--timeout=60s",
    ])?;
    util::wait_until("a new agent Pod", Duration::from_secs(120), POLL, || {
        Ok(t.agent_pod().map(|p| p != old).unwrap_or(false))
    })?;
    t.wait_agent_log("state restored from the runtime", 1)?;
    // The NodeTopology status read next is the new agent's, not its predecessor's.
    t.wait_agent_log("NodeTopology status published", 1)?;
    Ok(())
}

/// After an in-place resize, deleting the agent Pod must leave the allocation as the resize
/// made it: a restored grant charges the resources the runtime reports, not the `r=` its record
/// was written with at create (NRI cannot rewrite it on update). Before that fix NodeTopology
/// went from 0.5 to 1 CPU allocated on numa0 (measured 2026-12-03).
///
/// The comparison is made once the new agent has published its own status: an agent that
/// published before its state was restored showed an empty node for up to 15 s (seen in CI on
/// 2026-12-03).
fn agent_restart_after_resize(t: &mut Tier) -> Result<()> {
    t.wait_containers(1)?;
    let alloc = t.allocation()?;
    restart_agent_pod(t)?;
    let after = t.allocation()?;
    ensure!(
        after == alloc,
        "resized allocation {alloc:?}, after the agent's restart {after:?}"
    );
    Ok(())
}

/// Deleting the agent Pod (the DaemonSet recreates it) and restarting the kubelet leave the
/// allocations identical.
fn agent_pod_and_kubelet_restarts(t: &mut Tier) -> Result<()> {
    t.wait_containers(1)?;
    let alloc = t.allocation()?;
    let guide = t.placed("guide")?;
    restart_agent_pod(t)?;
    util::wait_until(
        "the same allocation after the agent's restart",
        Duration::from_secs(60),
        POLL,
        || Ok(t.allocation()? == alloc),
    )
    .with_context(|| format!("before {alloc:?} after {:?}", t.allocation()))?;
    ensure!(
        t.placed("guide")? == guide,
        "the guide Pod changed after the agent's restart"
    );

    let adds = t.kubelet_adds("guide");
    let t0 = Instant::now();
    t.cl.restart_kubelet()?;
    eprintln!(
        "kubelet restarted, node Ready in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    // The new kubelet took the Pod and synced it: give the sync time to act (it must not
    // recreate the container), then ask containerd, not the API server's old report.
    t.wait_kubelet_sync("guide", adds)?;
    std::thread::sleep(Duration::from_secs(10));
    t.assert_not_recreated("guide", &guide)?;
    t.wait_running("guide")?;
    ensure!(
        t.placed("guide")? == guide,
        "the guide Pod changed after the kubelet's restart"
    );
    util::wait_until(
        "the same allocation after the kubelet's restart",
        Duration::from_secs(60),
        POLL,
        || Ok(t.allocation()? == alloc),
    )?;
    Ok(())
}

/// helm uninstall leaves running Pods running (with their cpusets).
fn helm_uninstall(t: &Tier) -> Result<()> {
    let guide = t.placed("guide")?;
    helm(
        &t.cl,
        &["uninstall", "tap", "-n", NS, "--wait", "--timeout", "120s"],
    )?;
    util::wait_until("the agent Pod gone", Duration::from_secs(90), POLL, || {
        let v = t.agent_pods()?;
        Ok(
            v.map(|v| v["items"].as_array().map(|a| a.is_empty()).unwrap_or(false))
                .unwrap_or(true),
        )
    })?;
    t.wait_running("guide")?;
    ensure!(
        t.placed("guide")? == guide,
        "the guide Pod changed after helm uninstall"
    );
    Ok(())
}

/// The CRI proxy mode as the guide deploys it: the agent as a host service in Containerd mode,
/// the kubelet's `containerRuntimeEndpoint` at the proxy's socket. Pods run and get cpusets.
fn cri_proxy_mode(t: &mut Tier) -> Result<()> {
    let guide = t.placed("guide")?;
    with_proxy_agent(
        t,
        "proxy",
        FIXTURE,
        &["--resource-policy=numa-aware"],
        |t, _| {
            t.wait_running("guide")?;
            let a = t.run_pod(&PodDef::new("proxied-a", "250m", "500m"))?;
            let ka = t.assert_on_one_node("proxied Pod a", &a, "numa-aware")?;
            let b = t.run_pod(&PodDef::new("proxied-b", "250m", "500m"))?;
            let kb = t.assert_on_one_node("proxied Pod b", &b, "numa-aware")?;
            ensure!(ka != kb, "both proxied Pods on NUMA node {ka}");
            ensure!(
                a.cgroup_cpus != b.cgroup_cpus || host_cpus().len() == 1,
                "different NUMA nodes, same cgroup cpuset"
            );
            t.notes.push(format!(
                "CRI proxy: Pods on NUMA nodes {ka} and {kb}, cgroup cpusets {:?} and {:?}",
                a.cgroup_cpus, b.cgroup_cpus
            ));
            // The Pod made before the switch kept its container and its cpuset.
            t.assert_not_recreated("guide", &guide)?;
            ensure!(
                t.placed("guide")?.cgroup_cpus == guide.cgroup_cpus,
                "the guide Pod moved"
            );
            t.delete_pod("proxied-a")?;
            t.delete_pod("proxied-b")?;
            Ok(())
        },
    )
}

/// Runs `f` with the kubelet talking to a CRI proxy agent (a host process named `name`, on
/// `fixture`, with `extra` flags and no NodeTopology link), switched to once the kubelet has
/// synced `guide`, and back to containerd before the proxy goes (also when `f` fails, whose
/// error comes with the agent's log).
fn with_proxy_agent(
    t: &mut Tier,
    name: &str,
    fixture: &str,
    extra: &[&str],
    f: impl FnOnce(&mut Tier, &TapAgent) -> Result<()>,
) -> Result<()> {
    let proxy = t.cl.dir.join(format!("tap-{name}.sock"));
    let state = t.cl.dir.join(format!("{name}-state"));
    let mut args =
        t.cl.containerd()
            .cri_proxy_agent_args(&proxy, Some(fixture), &state);
    args.extend(extra.iter().map(|a| a.to_string()));
    args.push("--enable-node-topology=false".to_string());
    let agent = TapAgent::start(&args, &t.cl.dir.join(format!("{name}-agent.log")))?;
    let r = (|| -> Result<()> {
        let adds = t.kubelet_adds("guide");
        t.cl.set_runtime_endpoint(RuntimeEndpoint::Proxy(proxy.clone()))?;
        t.wait_kubelet_sync("guide", adds)?;
        f(t, &agent)
    })();
    if r.is_err() {
        eprintln!("--- {name} agent log\n{}", agent.log_tail(80));
    }
    t.cl.set_runtime_endpoint(RuntimeEndpoint::Containerd)?;
    drop(agent);
    r
}

/// The hyperthread and cache controls need a machine with SMT and L3 groups smaller than a
/// NUMA node: the CRI proxy agent (a host process, as in `cri_proxy_mode`) runs on the fixture
/// `synthetic-2s-2numa-64t-8ccx` (2 threads a core, 8 L3 groups of 4 cores) while the kubelet
/// makes the Pods. `second` goes first (if still there), so that a Guaranteed 1-CPU Pod fits
/// the 2-CPU node next to `guide`.
fn smt_and_cache_controls(t: &mut Tier) -> Result<()> {
    const CCX: &str = "synthetic-2s-2numa-64t-8ccx";
    t.kubectl(&[
        "-n",
        "default",
        "delete",
        "pod",
        "second",
        "--ignore-not-found",
        "--wait=true",
        "--timeout=60s",
    ])?;
    with_proxy_agent(t, "proxy-ccx", CCX, &[], smt_and_cache_pods)
}

fn smt_and_cache_pods(t: &mut Tier, agent: &TapAgent) -> Result<()> {
    // level: cache -> one L3 group (4 cores, 8 threads).
    let c = t.run_pod(&annotated("ht-cache", &[(LEVEL, "cache")]))?;
    ensure!(c.field("pool").starts_with("cache"), "level cache: {c:?}");
    // hide-hyperthreads: one thread of each core of its cache pool.
    let h = t.run_pod(&annotated("ht-hide", &[(HIDE_HT, "true")]))?;
    ensure!(
        h.field("pool").starts_with("cache"),
        "hide-hyperthreads: {h:?}"
    );
    let cpus = util::logged_cpus(&agent.log_text(), " pod=ht-hide ")
        .context("no placed line for ht-hide")?;
    ensure!(
        cpus.len() == 4,
        "hide-hyperthreads: {cpus:?} is not one thread of 4 cores"
    );
    // A Guaranteed 1-CPU container: no whole 2-thread core, so shared CPUs and a warning...
    let mut g = annotated("ht-whole", &[]);
    (g.cpu_request, g.cpu_limit) = ("1", "1");
    let w = t.run_pod(&g)?;
    ensure!(
        w.field("x").is_empty(),
        "whole cores gave exclusive CPUs: {w:?}"
    );
    let log = agent.log_text();
    ensure!(
        log.lines()
            .any(|l| l.contains("ht-whole") && l.contains("whole free cores")),
        "no whole-cores warning for ht-whole"
    );
    t.delete_pod("ht-whole")?;
    // ... and with exclusive-cores: threads, one exclusive thread.
    let mut g = annotated(
        "ht-threads",
        &[("tap.kunpeng.huawei.com/exclusive-cores", "threads")],
    );
    (g.cpu_request, g.cpu_limit) = ("1", "1");
    let x = t.run_pod(&g)?;
    ensure!(
        parse_list(&x.field("x")).len() == 1,
        "exclusive-cores threads: {x:?}"
    );
    t.notes.push(format!(
        "SMT and L3 fixture through the kubelet: level cache {} ; hide-hyperthreads {} cpus {cpus:?} ; exclusive-cores threads {}",
        c.grant, h.grant, x.grant
    ));
    for p in ["ht-cache", "ht-hide", "ht-threads"] {
        t.delete_pod(p)?;
    }
    Ok(())
}

const HIDE_HT: &str = "tap.kunpeng.huawei.com/hide-hyperthreads";

/// Waits (2 min at most) until the chart namespace's `(kind, name, field)` has `status.<field>`
/// 1.
fn wait_status_one(t: &Tier, (kind, name, field): (&str, &str, &str), what: &str) -> Result<()> {
    util::wait_until(what, Duration::from_secs(120), POLL, || {
        let o = t.cl.kube().get_json(&["-n", NS, "get", kind, name])?;
        let o = o.with_context(|| format!("no {kind} {name}"))?;
        Ok(o["status"][field] == 1)
    })
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn cluster_tier() {
    util::require_e2e_tier();
    let t0 = Instant::now();
    let build_dir = util::temp_dir("tap-cl-img").expect("temp dir");
    let (agent_img, operator_img) = scratch_images(&build_dir).expect("building the images");
    eprintln!("images built in {:.1}s", t0.elapsed().as_secs_f64());
    let cl = Cluster::start().expect("starting the cluster");
    let mut t = Tier {
        cl,
        rt: tokio::runtime::Runtime::new().unwrap(),
        notes: Vec::new(),
    };
    t.cl.containerd()
        .import_image(&agent_img)
        .expect("importing the agent image");
    t.cl.containerd()
        .import_image(&operator_img)
        .expect("importing the operator image");
    let _ = std::fs::remove_dir_all(&build_dir);
    // Served before the agent starts, so it publishes its NodeResourceTopology at once.
    t.cl.kube()
        .install_nrt_crd()
        .expect("installing the NodeResourceTopology CRD");

    let mut failures = Vec::new();
    // TAP_CLUSTER_SCENARIOS=a,b runs only those (a scenario may need an earlier one's state;
    // helm_install is the first of all).
    let only: Option<Vec<String>> = std::env::var("TAP_CLUSTER_SCENARIOS")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    // dra_peer runs only when named: each DRA driver must be the node's only NRI plugin, so
    // hack/test.sh runs it in a cluster of its own (TAP_CLUSTER_SCENARIOS=dra_peer).
    let peer_named = only
        .as_ref()
        .is_some_and(|o| o.iter().any(|s| s == "dra_peer"));
    let mut run = |name: &str, t: &mut Tier, f: &dyn Fn(&mut Tier) -> Result<()>| -> bool {
        if only.as_ref().is_some_and(|o| !o.iter().any(|s| s == name)) {
            return true;
        }
        let s = Instant::now();
        let r = f(t);
        eprintln!(
            "scenario {name}: {} in {:.1}s",
            if r.is_ok() { "ok" } else { "FAILED" },
            s.elapsed().as_secs_f64()
        );
        if let Err(e) = r {
            failures.push(format!("{name}: {e:#}"));
            return false;
        }
        true
    };
    // Later scenarios need the earlier ones' state: stop at the first failure.
    let _ = run("helm_install", &mut t, &|t| helm_install(t))
        && run("numa_scheduler", &mut t, &numa_scheduler::numa_scheduler)
        // Before the guide Pod takes the 2-CPU node's second CPU: a Guaranteed 1-CPU Pod
        // replicating its claim must fit.
        && run("dra_cpu_claim", &mut t, &dra_cpu::dra_cpu_claim)
        && run(
            "guide_pod_and_policy_switch",
            &mut t,
            &guide_pod_and_policy_switch,
        )
        && run("annotations_and_skip_label", &mut t, &|t| {
            annotations_and_skip_label(t)
        })
        && run("nodetopology_and_release", &mut t, &|t| {
            nodetopology_and_release(t)
        })
        && run("device_plugin_hint", &mut t, &device_plugin_hint)
        && run("dra_accel_hint", &mut t, &dra_accel::dra_accel_hint)
        && run("per_pod_controls", &mut t, &per_pod_controls)
        && run("reserved_cpus", &mut t, &reserved_cpus)
        && run(
            "agent_pod_and_kubelet_restarts",
            &mut t,
            &agent_pod_and_kubelet_restarts,
        )
        && run("resize", &mut t, &|t| resize(t))
        && run(
            "agent_restart_after_resize",
            &mut t,
            &agent_restart_after_resize,
        )
        && run("helm_uninstall", &mut t, &|t| helm_uninstall(t))
        && run("cri_proxy_mode", &mut t, &cri_proxy_mode)
        && run("smt_and_cache_controls", &mut t, &smt_and_cache_controls)
        && (!peer_named || run("dra_peer", &mut t, &dra_peer::dra_peer));
    for n in &t.notes {
        eprintln!("NOTE {n}");
    }
    if !failures.is_empty() {
        eprintln!("--- agent log\n{}", t.agent_log().unwrap_or_default());
        eprintln!("{}", t.cl.logs_tail(60));
    }
    drop(t);
    eprintln!("cluster tier: {:.1}s in all", t0.elapsed().as_secs_f64());
    assert!(
        failures.is_empty(),
        "cluster tier failed:\n{}",
        failures.join("\n")
    );
}
