//! The operator and the agent's NodeTopology link against a real kube-apiserver + etcd.
//!
//! One cluster for the whole scenario (starting one costs seconds): CRDs and RBAC applied from
//! the repository, two operator replicas with leader election, plain Node objects,
//! overlapping TopologyPolicies, the agent's link (`kunpeng-tap-kube-link`) on a sysfs fixture,
//! and RBAC checks by impersonation. The operator and the agent authenticate as their service
//! accounts (client certificates), so the RBAC manifests are exercised for real.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use tap_e2e::kube::{cargo_bin, free_port, KubeCluster, Proc};
use tap_e2e::util;

const T: Duration = Duration::from_secs(30);
const OPERATOR_SA: &str = "system:serviceaccount:kunpeng-tap:kunpeng-tap-operator";
const AGENT_SA: &str = "system:serviceaccount:kunpeng-tap:kunpeng-tap-agent";

fn node_json(name: &str, labels: &[(&str, &str)]) -> String {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
        .collect();
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
    })
    .to_string()
}

fn policy_yaml(name: &str, policy: &str, priority: i32, selector: &str) -> String {
    format!(
        "apiVersion: tap.kunpeng.io/v1alpha1\nkind: TopologyPolicy\nmetadata:\n  name: {name}\nspec:\n  policy: {policy}\n  priority: {priority}\n  nodeSelector: {selector}\n"
    )
}

/// The TopologyPolicy name a NodeTopology's spec points at (`None` = no assignment or no
/// object).
fn assigned(k: &KubeCluster, node: &str) -> Result<Option<String>> {
    Ok(k.get_json(&["get", "nodetopology", node])?
        .and_then(|v| v["spec"]["source"]["name"].as_str().map(str::to_string)))
}

fn wait_assigned(k: &KubeCluster, node: &str, want: Option<&str>) -> Result<()> {
    k.wait_for(T, &format!("NodeTopology {node} -> {want:?}"), |k| {
        let nt = k.get_json(&["get", "nodetopology", node])?;
        let Some(nt) = nt else { return Ok(false) };
        let src = nt["spec"]["source"]["name"].as_str();
        Ok(src == want && (want.is_some() == nt["spec"].get("policy").is_some()))
    })
}

fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn scrape(port: u16) -> Result<String> {
    tap_e2e::util::http_get(port, "/metrics")
}

fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

struct Operator {
    proc: Proc,
    metrics_port: u16,
    health_port: u16,
    name: String,
}

fn start_operator(k: &KubeCluster, bin: &Path, kubeconfig: &Path, name: &str) -> Result<Operator> {
    let metrics_port = free_port()?;
    let health_port = free_port()?;
    let mut cmd = Command::new(bin);
    cmd.env("KUBECONFIG", kubeconfig)
        .env_remove("POD_NAMESPACE")
        .env_remove("POD_NAME")
        .arg("--leader-elect")
        .arg("--lease-namespace=kunpeng-tap")
        // Long enough that a loaded machine's slow API calls do not move the leadership
        // before the failover step does (the checks before it read the leader's counters).
        .arg("--lease-duration=10s")
        .arg("--renew-deadline=8s")
        .arg("--retry-period=1s")
        .arg(format!("--identity={name}"))
        .arg(format!("--metrics-bind-address=127.0.0.1:{metrics_port}"))
        .arg(format!(
            "--health-probe-bind-address=127.0.0.1:{health_port}"
        ))
        .arg("-v=3");
    let proc = Proc::spawn(name, cmd, &k.dir.join(format!("{name}.log")))?;
    Ok(Operator {
        proc,
        metrics_port,
        health_port,
        name: name.to_string(),
    })
}

fn lease_holder(k: &KubeCluster) -> Result<Option<String>> {
    Ok(
        k.get_json(&["-n", "kunpeng-tap", "get", "lease", "kunpeng-tap-operator"])?
            .and_then(|v| v["spec"]["holderIdentity"].as_str().map(str::to_string)),
    )
}

fn header(out: &str) -> Vec<String> {
    out.lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn can_i(k: &KubeCluster, who: &str, verb: &str, resource: &str) -> Result<bool> {
    let mut args = vec!["auth", "can-i", verb];
    match resource.split_once('/') {
        Some((r, sub)) => args.extend([r, "--subresource", sub]),
        None => args.push(resource),
    }
    args.extend(["--as", who]);
    let out = k.kubectl(&args)?;
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    match s.as_str() {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => bail!(
            "kubectl auth can-i {verb} {resource} --as {who}: {s} {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn operator_and_agent_against_a_real_apiserver() {
    util::require_e2e_tier();
    let start = Instant::now();
    let mut ops: Vec<Operator> = Vec::new();
    let mut agent: Option<Proc> = None;
    let k = KubeCluster::start().expect("starting etcd + kube-apiserver");
    let result = scenario(&k, &mut ops, &mut agent);
    if let Err(e) = &result {
        for o in &ops {
            eprintln!("--- {} log:\n{}", o.name, o.proc.log_tail(60));
        }
        if let Some(a) = &agent {
            eprintln!("--- agent log:\n{}", a.log_tail(60));
        }
        eprintln!("--- kube-apiserver log:\n{}", k.apiserver.log_tail(30));
        panic!("{e:#}");
    }
    eprintln!(
        "operator e2e scenario passed in {:.1}s",
        start.elapsed().as_secs_f64()
    );
}

fn step(t0: Instant, what: &str) {
    eprintln!("[{:6.1}s] {what}", t0.elapsed().as_secs_f64());
}

fn scenario(k: &KubeCluster, ops: &mut Vec<Operator>, agent: &mut Option<Proc>) -> Result<()> {
    let t0 = Instant::now();
    let root = util::workspace_root();
    let op_bin = cargo_bin("tap-operator", "kunpeng-tap-operator")?;
    let link_bin = cargo_bin("node-agent", "kunpeng-tap-kube-link")?;

    step(t0, "binaries built; applying CRDs");
    // --- CRDs (from the repository) and their validation.
    k.apply_crds()?;
    for (bad, why) in [
        (
            "apiVersion: tap.kunpeng.io/v1alpha1\nkind: TopologyPolicy\nmetadata: {name: bad1}\nspec: {policy: numa-aware, reservedCPUs: \"3-1\"}\n",
            "descending range",
        ),
        (
            "apiVersion: tap.kunpeng.io/v1alpha1\nkind: TopologyPolicy\nmetadata: {name: bad2}\nspec: {policy: numa-aware, reservedCPUs: \"0-1,a\"}\n",
            "not a CPU list",
        ),
        (
            "apiVersion: tap.kunpeng.io/v1alpha1\nkind: TopologyPolicy\nmetadata: {name: bad3}\nspec: {policy: best-effort}\n",
            "unknown policy",
        ),
    ] {
        if k.kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], bad).is_ok() {
            bail!("the API server accepted a TopologyPolicy with a {why}");
        }
    }
    k.kubectl_stdin(
        &["apply", "--dry-run=server", "-f", "-"],
        "apiVersion: tap.kunpeng.io/v1alpha1\nkind: TopologyPolicy\nmetadata: {name: good}\nspec: {policy: numa-aware, reservedCPUs: \"0-1,4,6-7\"}\n",
    )
    .context("a valid TopologyPolicy was refused")?;

    step(t0, "CRD validation checked");
    // --- RBAC from deploy/rbac, checked by impersonation.
    k.kubectl_ok(&[
        "apply",
        "-f",
        &root.join("deploy/rbac").display().to_string(),
    ])?;
    let agent_can = [
        ("get", "nodetopologies", true),
        ("list", "nodetopologies", true),
        ("watch", "nodetopologies", true),
        ("patch", "nodetopologies/status", true),
        ("update", "nodetopologies/status", true),
        ("patch", "nodetopologies", false),
        ("update", "nodetopologies", false),
        ("create", "nodetopologies", false),
        ("delete", "nodetopologies", false),
        ("create", "topologypolicies", false),
        ("patch", "topologypolicies/status", false),
        ("patch", "nodes", false),
        ("create", "pods", false),
        ("get", "secrets", false),
    ];
    let operator_can = [
        ("patch", "nodetopologies", true),
        ("delete", "nodetopologies", true),
        ("patch", "topologypolicies/status", true),
        ("patch", "topologypolicies", false),
        ("list", "nodes", true),
        ("patch", "nodes", false),
        ("get", "secrets", false),
    ];
    for (who, sa, table) in [
        ("agent", AGENT_SA, &agent_can[..]),
        ("operator", OPERATOR_SA, &operator_can[..]),
    ] {
        for &(verb, res, want) in table {
            let got = can_i(k, sa, verb, res)?;
            if got != want {
                bail!("{who} can-i {verb} {res}: {got}, expected {want}");
            }
        }
    }
    let op_kc = k.service_account_kubeconfig("operator", "kunpeng-tap-operator")?;
    let agent_kc = k.service_account_kubeconfig("agent", "kunpeng-tap-agent")?;

    step(t0, "RBAC checked");
    // --- Nodes and overlapping policies.
    for (n, labels) in [
        ("n1", vec![("arch", "arm64"), ("rack", "1")]),
        ("n2", vec![("arch", "arm64")]),
        ("n3", vec![("rack", "2")]),
    ] {
        k.apply(&node_json(n, &labels))?;
    }
    k.apply(&policy_yaml("all", "topology-aware", 0, "{}"))?;
    k.apply(&policy_yaml(
        "arm",
        "numa-aware",
        10,
        "{matchLabels: {arch: arm64}}",
    ))?;
    // Same priority as `arm`, younger: loses the overlap on n1, and both report a conflict.
    std::thread::sleep(Duration::from_millis(1100));
    k.apply(&policy_yaml(
        "rack1",
        "topology-aware",
        10,
        "{matchExpressions: [{key: rack, operator: In, values: [\"1\"]}]}",
    ))?;

    step(t0, "nodes and policies created");
    // --- Two replicas; one leader.
    ops.push(start_operator(k, &op_bin, &op_kc, "op-a")?);
    ops.push(start_operator(k, &op_bin, &op_kc, "op-b")?);
    wait_assigned(k, "n1", Some("arm"))?;
    wait_assigned(k, "n2", Some("arm"))?;
    wait_assigned(k, "n3", Some("all"))?;
    let nt1 = k.get_json(&["get", "nodetopology", "n1"])?.context("n1")?;
    if nt1["spec"]["policy"]["policy"] != "numa-aware" {
        bail!("n1 spec: {}", nt1["spec"]);
    }
    let owner = &nt1["metadata"]["ownerReferences"][0];
    let n1_uid = k.get_json(&["get", "node", "n1"])?.context("node n1")?["metadata"]["uid"].clone();
    if owner["kind"] != "Node" || owner["uid"] != n1_uid {
        bail!("n1 owner reference: {owner}");
    }
    k.wait_for(T, "TopologyPolicy statuses", |k| {
        let arm = k
            .get_json(&["get", "topologypolicy", "arm"])?
            .context("arm")?;
        let rack1 = k
            .get_json(&["get", "topologypolicy", "rack1"])?
            .context("rack1")?;
        let all = k
            .get_json(&["get", "topologypolicy", "all"])?
            .context("all")?;
        Ok(arm["status"]["matchedNodes"] == 2
            && rack1["status"]["matchedNodes"] == 0
            && all["status"]["matchedNodes"] == 1
            && condition(&arm, "Conflict").is_some_and(|c| c["status"] == "True")
            && condition(&rack1, "Conflict").is_some_and(|c| c["status"] == "True")
            && condition(&all, "Conflict").is_some_and(|c| c["status"] == "False")
            && condition(&all, "Ready").is_some_and(|c| c["status"] == "True"))
    })?;

    step(t0, "assignments and statuses as expected");
    // Only the leader writes.
    let holder = lease_holder(k)?.context("no Lease holder")?;
    let leader_idx = ops
        .iter()
        .position(|o| holder.starts_with(&format!("{}_", o.name)))
        .with_context(|| format!("Lease held by {holder}, not by op-a/op-b"))?;
    let standby_idx = 1 - leader_idx;
    let lm = scrape(ops[leader_idx].metrics_port)?;
    let sm = scrape(ops[standby_idx].metrics_port)?;
    if metric(&lm, "tap_operator_writes_total") < 3.0 || metric(&lm, "tap_operator_leader ") != 1.0
    {
        bail!("leader metrics:\n{lm}");
    }
    if metric(&sm, "tap_operator_writes_total") != 0.0
        || metric(&sm, "tap_operator_reconciles_total") != 0.0
        || metric(&sm, "tap_operator_leader ") != 0.0
    {
        bail!("the standby wrote or reconciled:\n{sm}");
    }
    // Events come from the leader only (the last one is recorded after its node's write).
    let leader_prefix = format!("{}_", ops[leader_idx].name);
    k.wait_for(T, "PolicyAssigned events for n1..n3", |k| {
        let events = k
            .get_json(&["get", "events.events.k8s.io", "-A"])?
            .context("events")?;
        let mut assigned_events = 0;
        for e in events["items"].as_array().into_iter().flatten() {
            if e["reportingController"] == "kunpeng-tap-operator" {
                if !e["reportingInstance"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with(&leader_prefix)
                {
                    bail!("event from a non-leader: {e}");
                }
                if e["reason"] == "PolicyAssigned" {
                    assigned_events += 1;
                }
            }
        }
        Ok(assigned_events >= 3)
    })?;
    // Health and readiness endpoints answer on both.
    for o in ops.iter() {
        for path in ["/healthz", "/readyz"] {
            let r = tap_e2e::util::http_get(o.health_port, path)?;
            if !r.starts_with("HTTP/1.0 200") && !r.starts_with("HTTP/1.1 200") {
                bail!("{} {path}: {r}", o.name);
            }
        }
    }

    step(t0, "leader-only writes checked");
    // --- Label change: n3 becomes arm64 -> arm.
    k.kubectl_ok(&["label", "node", "n3", "arch=arm64"])?;
    wait_assigned(k, "n3", Some("arm"))?;
    // Priority change: rack1 above arm -> n1 switches, the conflict clears.
    k.kubectl_ok(&[
        "patch",
        "topologypolicy",
        "rack1",
        "--type=merge",
        "-p",
        "{\"spec\":{\"priority\":20}}",
    ])?;
    wait_assigned(k, "n1", Some("rack1"))?;
    k.wait_for(T, "conflict cleared", |k| {
        let arm = k
            .get_json(&["get", "topologypolicy", "arm"])?
            .context("arm")?;
        Ok(
            condition(&arm, "Conflict").is_some_and(|c| c["status"] == "False")
                && arm["status"]["matchedNodes"] == 2,
        )
    })?;
    // No policy matches any more: the assignment is removed (object kept for the agent).
    k.kubectl_ok(&["delete", "topologypolicy", "all"])?;
    k.kubectl_ok(&["label", "node", "n3", "arch-", "rack=9", "--overwrite"])?;
    wait_assigned(k, "n3", None)?;

    step(t0, "label/priority/removal switches checked");
    // --- The agent's link on n1, with a sysfs fixture.
    let fixture = util::fixture_dir("synthetic-2s-4numa-96c-gpu");
    if !fixture.is_dir() {
        bail!("fixture {} missing", fixture.display());
    }
    let state_dir = k.dir.join("agent-state");
    let start_agent = |kc: &Path, log: &str| -> Result<Proc> {
        let mut cmd = Command::new(&link_bin);
        cmd.env("KUBECONFIG", kc)
            .env("NODE_NAME", "n1")
            .arg("--enable-node-topology")
            .arg(format!("--sysfs-root={}", fixture.display()))
            .arg(format!("--state-dir={}", state_dir.display()))
            .arg("--resource-policy=topology-aware")
            .arg("-v=3");
        Proc::spawn("agent", cmd, &k.dir.join(log))
    };
    *agent = Some(start_agent(&agent_kc, "agent.log")?);
    k.wait_for(T, "agent status on n1", |k| {
        let nt = k.get_json(&["get", "nodetopology", "n1"])?.context("n1")?;
        let st = &nt["status"];
        Ok(st["topology"]["numaNodeCount"] == 4
            && st["topology"]["cpuCount"] == 96
            && st["agent"]["mode"] == "kube-link"
            && st["agent"]["policy"] == "topology-aware"
            && st["agent"]["configSource"] == "NodeTopology"
            && condition(&nt, "Ready").is_some_and(|c| c["status"] == "True"))
    })?;
    // rack1 is topology-aware; make it numa-aware with memory topology: the agent follows.
    k.kubectl_ok(&[
        "patch",
        "topologypolicy",
        "rack1",
        "--type=merge",
        "-p",
        "{\"spec\":{\"policy\":\"numa-aware\",\"memoryTopology\":true,\"reservedCPUs\":\"0-1\"}}",
    ])?;
    k.wait_for(T, "agent applies the new policy", |k| {
        let nt = k.get_json(&["get", "nodetopology", "n1"])?.context("n1")?;
        let a = &nt["status"]["agent"];
        Ok(a["policy"] == "numa-aware"
            && a["memoryTopology"] == true
            && a["reservedCPUs"] == "0-1"
            && a["observedGeneration"] == nt["metadata"]["generation"])
    })?;
    let cache = std::fs::read_to_string(state_dir.join("node-topology-policy.json"))
        .context("the agent's policy cache")?;
    if !cache.contains("numa-aware") {
        bail!("policy cache: {cache}");
    }
    // kubectl get shows the columns, with the agent's figures.
    let out = k.kubectl_ok(&["get", "nodetopology"])?;
    let want = [
        "NAME",
        "NODE",
        "POLICY",
        "NUMA",
        "CPUS",
        "ALLOCATED",
        "CONTAINERS",
        "READY",
        "AGE",
    ];
    if header(&out) != want {
        bail!("kubectl get nodetopology:\n{out}");
    }
    let n1_row: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("n1 "))
        .context("n1 row")?
        .split_whitespace()
        .collect();
    if n1_row[1..8] != ["n1", "rack1", "4", "96", "0/94", "0", "True"] {
        bail!("kubectl get nodetopology row: {n1_row:?}\n{out}");
    }
    eprintln!("{out}");
    let out = k.kubectl_ok(&["get", "topologypolicy"])?;
    if header(&out) != ["NAME", "POLICY", "NODES", "PRIORITY", "READY", "AGE"] {
        bail!("kubectl get topologypolicy:\n{out}");
    }
    eprintln!("{out}");

    // The agent may not write the spec (its own credentials, for real).
    let denied = k.kubectl_as(
        &agent_kc,
        &[
            "patch",
            "nodetopology",
            "n1",
            "--type=merge",
            "-p",
            "{\"spec\":{\"nodeName\":\"x\"}}",
        ],
    )?;
    if denied.status.success() || !String::from_utf8_lossy(&denied.stderr).contains("forbidden") {
        bail!(
            "the agent patched a NodeTopology spec: {}",
            String::from_utf8_lossy(&denied.stderr)
        );
    }

    step(t0, "agent status and columns checked");
    // Restart without an API server: the cached policy applies.
    if let Some(mut a) = agent.take() {
        a.terminate(Duration::from_secs(5));
    }
    let dead_kc = k.dir.join("dead.kubeconfig");
    let dead_port = free_port()?;
    std::fs::write(
        &dead_kc,
        std::fs::read_to_string(&agent_kc)?.replace(
            &format!("127.0.0.1:{}", k.port),
            &format!("127.0.0.1:{dead_port}"),
        ),
    )?;
    *agent = Some(start_agent(&dead_kc, "agent-offline.log")?);
    let waited = Instant::now();
    loop {
        let log = agent.as_ref().map(|a| a.log_text()).unwrap_or_default();
        if log.contains("policy from the cache") && log.contains("numa-aware") {
            break;
        }
        if waited.elapsed() > Duration::from_secs(15) {
            bail!("the agent did not apply its cached policy:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    if let Some(mut a) = agent.take() {
        a.terminate(Duration::from_secs(5));
    }

    step(t0, "agent cache restart checked");
    // --- Failover: kill the leader without releasing; the standby takes over and writes.
    ops[leader_idx].proc.kill();
    let standby_name = ops[standby_idx].name.clone();
    k.wait_for(Duration::from_secs(40), "standby becomes leader", |k| {
        Ok(lease_holder(k)?.is_some_and(|h| h.starts_with(&format!("{standby_name}_"))))
    })?;
    k.kubectl_ok(&["label", "node", "n2", "rack=1"])?;
    wait_assigned(k, "n2", Some("rack1"))?;
    let nm = scrape(ops[standby_idx].metrics_port)?;
    if metric(&nm, "tap_operator_writes_total") < 1.0 || metric(&nm, "tap_operator_leader ") != 1.0
    {
        bail!("new leader metrics:\n{nm}");
    }

    step(t0, "failover checked");
    // --- Node deleted: its NodeTopology goes too (the operator deletes orphans; there is no
    // kube-controller-manager garbage collector here).
    k.kubectl_ok(&["delete", "node", "n3"])?;
    k.wait_for(T, "NodeTopology n3 deleted", |k| {
        Ok(k.get_json(&["get", "nodetopology", "n3"])?.is_none())
    })?;
    // A NodeTopology for a Node that never existed is removed as well.
    k.apply(
        "apiVersion: tap.kunpeng.io/v1alpha1\nkind: NodeTopology\nmetadata: {name: ghost}\nspec: {nodeName: ghost}\n",
    )?;
    k.wait_for(T, "NodeTopology ghost deleted", |k| {
        Ok(k.get_json(&["get", "nodetopology", "ghost"])?.is_none())
    })?;
    if assigned(k, "n1")?.as_deref() != Some("rack1") {
        bail!("n1 lost its assignment");
    }

    step(t0, "node deletion checked");
    // Clean stop of the remaining replica releases the Lease.
    ops[standby_idx].proc.terminate(Duration::from_secs(10));
    k.wait_for(Duration::from_secs(10), "Lease released", |k| {
        Ok(lease_holder(k)?.is_none())
    })?;
    Ok(())
}
