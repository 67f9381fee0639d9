//! The agent's objects for the scheduler and the Pod owner, on the real kube-apiserver:
//! Pod Events (`TopologyPlaced`, what `kubectl describe pod` shows), and
//! NodeResourceTopology with the real CRD (the one the
//! scheduler-plugins NodeResourceTopologyMatch plugin reads, fetched from its Go module by
//! hack/e2e/setup-nrt-crd.sh): the agent in NRI mode on a real containerd, authenticated as
//! its ServiceAccount with deploy/rbac's rules, publishes one object for its node whose zones
//! follow the allocations it makes, and the API server keeps every field (nothing pruned by
//! the CRD's schema).

use anyhow::{bail, ensure, Context, Result};
use node_agent::kube_link::fingerprint;
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};
use tap_e2e::containerd::{
    with_containerd, CgroupQos, ContainerSpec, Containerd, ContainerdOptions, Cri, PodSpec,
};
use tap_e2e::docker::TapAgent;
use tap_e2e::kube::KubeCluster;
use tap_e2e::text::grant_nodes;

const GRANT_KEY: &str = "tap.kunpeng.huawei.com/grant";
const FIXTURE: &str = "synthetic-2s-4numa-96c-gpu";
const NODE: &str = "nrt-node";

fn attribute<'a>(nrt: &'a Value, name: &str) -> Option<&'a str> {
    nrt["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["name"] == name)?["value"]
        .as_str()
}

fn cpu_of<'a>(nrt: &'a Value, zone: &str) -> Option<&'a Value> {
    nrt["zones"]
        .as_array()?
        .iter()
        .find(|z| z["name"] == zone)?["resources"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == "cpu")
}

/// Milli-CPUs of a quantity the agent writes ("47" or "45000m").
fn milli(q: &Value) -> Option<u64> {
    let s = q.as_str()?;
    match s.strip_suffix('m') {
        Some(m) => m.parse().ok(),
        None => s.parse::<u64>().ok().map(|c| c * 1000),
    }
}

/// A Pod object bound to the node, in `phase` (its status written as the kubelet would).
fn api_pod(k: &KubeCluster, name: &str, phase: &str) -> Result<()> {
    // No controller-manager here to make the namespace's default ServiceAccount, which the
    // API server's admission wants for a Pod.
    let sa = serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": "default"}});
    k.kubectl_stdin(&["apply", "-f", "-"], &sa.to_string())?;
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "restartPolicy": "Never",
            "containers": [{"name": "c0", "image": "busybox",
                "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "4"}}}],
        },
    });
    k.kubectl_stdin(&["apply", "-f", "-"], &pod.to_string())?;
    let status = serde_json::json!({"status": {"phase": phase}});
    k.kubectl_ok(&[
        "patch",
        "pod",
        name,
        "-n",
        "default",
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ])?;
    Ok(())
}

/// The podfingerprint library's 259-pod test vector (`testdata/pods.json` of
/// github.com/k8stopologyawareschedwg/podfingerprint v0.2.2, the version scheduler-plugins
/// v0.35.4-devel pins), read from the Go module cache the e2e set-up fills
/// (hack/e2e/setup-scheduler-plugins.sh builds the plugin with it).
#[test]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
fn fingerprint_matches_the_librarys_published_vector() -> Result<()> {
    tap_e2e::util::require_e2e_tier();
    let dir = "/var/cache/kunpeng-tap/go/pkg/mod/github.com/k8stopologyawareschedwg/podfingerprint@v0.2.2";
    let path = Path::new(dir).join("testdata/pods.json");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "{}: run hack/e2e/setup-scheduler-plugins.sh (it downloads the module)",
            path.display()
        )
    })?;
    let pods: Vec<Value> = serde_json::from_str(&text)?;
    let names: Vec<(&str, &str)> = pods
        .iter()
        .filter_map(|p| Some((p["namespace"].as_str()?, p["name"].as_str()?)))
        .collect();
    ensure!(
        names.len() == pods.len() && names.len() > 200,
        "{} pods read",
        names.len()
    );
    // The library's own test: "precomputed and validated manually".
    ensure!(
        fingerprint::sign(names.iter().copied()) == "pfp0v001e477a4e3b2fc0ec6",
        "fingerprint of the library's pods.json: {}",
        fingerprint::sign(names.iter().copied())
    );
    Ok(())
}

/// Waits until the node's object satisfies `check`; returns it.
fn wait_nrt(k: &KubeCluster, what: &str, check: impl Fn(&Value) -> bool) -> Result<Value> {
    // Two usage intervals (15 s each) and slack: one slow or failed write must not fail it.
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let got = k.get_json(&["get", "noderesourcetopologies.topology.node.k8s.io", NODE])?;
        if let Some(v) = got {
            if check(&v) {
                return Ok(v);
            }
            if Instant::now() > until {
                bail!("timed out waiting for {what}; last object: {v:#}");
            }
        } else if Instant::now() > until {
            bail!("timed out waiting for {what}: no NodeResourceTopology {NODE}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e tier: needs real components (TAP_E2E=1, hack/test.sh e2e)"]
async fn node_resource_topology_follows_allocations() -> Result<()> {
    tap_e2e::util::require_e2e_tier();
    let k = KubeCluster::start()?;
    k.install_nrt_crd()?;
    k.apply_crds_and_rbac()?;
    let agent_kc = k.service_account_kubeconfig("agent", "kunpeng-tap-agent")?;
    std::env::set_var("KUBECONFIG", &agent_kc);

    let dir = k.dir.join("agent");
    std::fs::create_dir_all(&dir)?;
    let opts = ContainerdOptions::default();
    with_containerd(opts, &dir, async |ctd| scenario(&k, ctd, &dir).await).await
}

async fn scenario(k: &KubeCluster, ctd: &mut Containerd, dir: &Path) -> Result<()> {
    let mut args = ctd.nri_agent_args(Some(FIXTURE), &dir.join("state"));
    args.extend([
        "--reserved-cpus=0".into(),
        "--enable-node-topology".into(),
        format!("--node-name={NODE}"),
    ]);
    let agent = TapAgent::start(&args, &dir.join("agent.log"))?;

    // Published with nothing placed: every zone has all its allocatable CPUs available, and
    // the API server kept what the agent wrote (the schema prunes unknown fields silently).
    let idle = wait_nrt(k, "the first NodeResourceTopology", |v| {
        v["zones"].as_array().is_some_and(|z| z.len() == 4)
    })?;
    for z in 0..4 {
        let cpu = cpu_of(&idle, &format!("node-{z}")).context("cpu resource")?;
        ensure!(
            milli(&cpu["available"]) == milli(&cpu["allocatable"]),
            "zone node-{z} idle but {cpu}"
        );
        // 24 CPUs per node; CPU 0 (node 0) is reserved.
        let want = if z == 0 { 23_000 } else { 24_000 };
        ensure!(
            milli(&cpu["allocatable"]) == Some(want),
            "zone node-{z}: {cpu}"
        );
        ensure!(
            milli(&cpu["capacity"]) == Some(24_000),
            "zone node-{z}: {cpu}"
        );
    }
    ensure!(
        idle["zones"][0]["costs"]
            .as_array()
            .is_some_and(|c| c.len() == 4),
        "costs pruned or missing: {idle:#}"
    );
    let attrs = idle["attributes"].to_string();
    ensure!(
        attrs.contains("topologyManagerPolicy") && attrs.contains("single-numa-node"),
        "attributes: {attrs}"
    );

    // A Burstable container of 2 CPUs request: its NUMA node's zone shows 2 CPUs fewer.
    let mut cri: Cri = ctd.cri().await?;
    let spec = PodSpec::new("nrt", CgroupQos::Burstable);
    let pod_uid = spec.uid.clone();
    let pod = cri.run_pod(&spec).await?;
    let id = cri
        .run_container(&pod, &ContainerSpec::cpus("c0", 2000, Some(4000)))
        .await?;
    let record = cri
        .spec_annotations(&id)
        .await?
        .remove(GRANT_KEY)
        .context("no grant record on the container")?;
    let nodes = grant_nodes(&record)?;
    let node = match nodes.iter().collect::<Vec<_>>()[..] {
        [n] => *n,
        _ => anyhow::bail!("one NUMA node expected, record {record}"),
    };
    let zone = format!("node-{node}");

    // The Pod owner sees where the container went: a TopologyPlaced Event on the Pod, about
    // the container, naming its CPUs and pool, recorded with the agent's own RBAC.
    let field = format!("involvedObject.name=nrt,involvedObject.uid={}", pod_uid);
    let until = Instant::now() + Duration::from_secs(20);
    let ev = loop {
        let list = k
            .get_json(&["get", "events", "-n", "default", "--field-selector", &field])?
            .context("no event list")?;
        let found = list["items"].as_array().and_then(|items| {
            items
                .iter()
                .find(|e| e["reason"] == "TopologyPlaced")
                .cloned()
        });
        if let Some(e) = found {
            break e;
        }
        ensure!(Instant::now() < until, "no TopologyPlaced Event: {list:#}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let msg = ev["message"].as_str().unwrap_or_default();
    ensure!(
        msg.starts_with("container c0: cpus ") && msg.contains(&format!("(numa{node}")),
        "Event message {msg:?} should name the container and its pool numa{node}"
    );
    ensure!(
        ev["type"] == "Normal" && ev["involvedObject"]["fieldPath"] == "spec.containers{c0}",
        "Event {ev:#}"
    );
    ensure!(
        ev["reportingComponent"] == "kunpeng-tap-agent",
        "reporting controller: {ev:#}"
    );
    let placed = wait_nrt(k, "the allocation in the zones", |v| {
        cpu_of(v, &zone).is_some_and(|c| {
            milli(&c["available"])
                .zip(milli(&c["allocatable"]))
                .is_some_and(|(a, t)| a + 2000 == t)
        })
    })?;
    // The pod set's fingerprint covers the pods the scheduler plugin counts (with its default
    // dedicated informer: the node's pods but Pending ones), read from the API server, not
    // the runtime: with no Pod object yet, the empty set.
    let empty = fingerprint::sign([]);
    wait_nrt(k, "the fingerprint of no pod", |v| {
        attribute(v, fingerprint::ATTRIBUTE) == Some(empty.as_str())
    })?;
    // The Pod as the kubelet would report it, a completed Job pod and a Pending one beside
    // it: the Pending one is not counted.
    api_pod(k, "nrt", "Running")?;
    api_pod(k, "job-done", "Succeeded")?;
    api_pod(k, "waiting", "Pending")?;
    let want = fingerprint::sign([("default", "nrt"), ("default", "job-done")]);
    wait_nrt(k, "the pod fingerprint without the Pending Pod", |v| {
        attribute(v, fingerprint::ATTRIBUTE) == Some(want.as_str())
    })?;
    ensure!(
        attribute(&placed, fingerprint::METHOD_ATTRIBUTE) == Some("all")
            && attribute(&placed, "tap.kunpeng.huawei.com/reserved-cpus") == Some("0")
            && attribute(&placed, "tap.kunpeng.huawei.com/policy") == Some("topology-aware"),
        "attributes: {}",
        placed["attributes"]
    );
    for z in (0..4).filter(|z| *z != node) {
        let cpu = cpu_of(&placed, &format!("node-{z}")).context("cpu resource")?;
        ensure!(
            milli(&cpu["available"]) == milli(&cpu["allocatable"]),
            "zone node-{z} changed by a container on {zone}: {cpu}"
        );
    }

    // Removing the container gives the zone back.
    cri.stop_container(&id).await?;
    cri.remove_container(&id).await?;
    wait_nrt(k, "the zone given back", |v| {
        cpu_of(v, &zone).is_some_and(|c| milli(&c["available"]) == milli(&c["allocatable"]))
    })?;
    let _ = cri.remove_pod(&pod).await;
    ensure!(!agent.panicked(), "the agent log shows a panic");
    Ok(())
}
