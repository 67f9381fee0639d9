//! A DRA device of another driver steers the agent: the e2e driver `accel.example.com`
//! (`tap_e2e::dra_accel`) registers its kubelet plugin with the real kubelet and publishes one
//! device on a NUMA node other than where a Pod without devices goes; the kube-scheduler
//! allocates it to a Burstable Pod's claim (from a ResourceClaimTemplate), the kubelet has the
//! plugin prepare it, the agent reads the claim's device from the kubelet's pod-resources API
//! and its NUMA node from the ResourceSlice, and places the container there.

use super::tier::{Placed, PodDef, Tier, POLL};
use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use std::time::Duration;
use tap_e2e::cluster::NODE;
use tap_e2e::containerd::cgroup_mems;
use tap_e2e::dra_accel::{device_class, resource_slice, slice_name, DraAccel, DraDevice, DRIVER};
use tap_e2e::util;

const POD: &str = "dra-accel";
/// The ResourceClaimTemplate, and the Pod's claim and the template's request of that name.
const CLAIM: &str = "accel";

pub(crate) fn dra_accel_hint(t: &mut Tier) -> Result<()> {
    let probe = t.run_pod(&PodDef::new("dra-probe", "250m", "500m"))?;
    let k = t.assert_on_one_node("probe Pod", &probe, "topology-aware")?;
    t.delete_pod("dra-probe")?;
    // The next node: another host CPU on a 2-CPU host (node k -> CPU k mod 2).
    let node = (k + 1) % 4;
    let plugin = DraAccel::start(&t.rt, &t.cl.dir.join("kubelet"), &t.cl.kube().kubeconfig);
    let r = plugin
        .wait_registered(Duration::from_secs(60))
        .and_then(|()| claimed_pod(t, &plugin, k, node));
    let cleaned = clean_up(t);
    drop(plugin);
    r.and(cleaned)
}

fn claimed_pod(t: &mut Tier, plugin: &DraAccel, probe_node: usize, node: usize) -> Result<()> {
    let device = format!("accel-{node}");
    publish(t, &device, node)?;
    t.wait_running(POD)?;
    let p = t.placed(POD)?;
    let got = t.assert_on_one_node("DRA accel Pod", &p, "topology-aware")?;
    ensure!(
        got == node,
        "the DRA accel Pod is on NUMA node {got}, its device on {node}"
    );
    let event = t.pod_event(POD, "TopologyPlaced")?;
    let named = format!("{DRIVER} {NODE}/{device} (NUMA {node})");
    ensure!(
        event.contains(&named),
        "the Event {event:?} does not say {named:?}"
    );
    let (claim, result) = claim_allocation(t, &device)?;
    let uid = claim["metadata"]["uid"].as_str().unwrap_or_default();
    let name = claim["metadata"]["name"].as_str().unwrap_or_default();
    ensure!(
        plugin.prepared_uid("default", name)? == uid,
        "the kubelet prepared another claim {name} than {uid}: {:?}",
        plugin.prepared()
    );
    let (spec_mems, cgroup_mems) = mems(t, &p)?;
    t.notes.push(format!(
        "DRA: a Pod without devices went to NUMA node {probe_node}; the Pod claiming {DRIVER} {device} \
         (NUMA {node}): grant {}, CRI cpuset_cpus {:?}, cgroup cpuset.cpus {:?}, CRI cpuset_mems \
         {spec_mems:?}, cgroup cpuset.mems {cgroup_mems:?}; \
         Event TopologyPlaced: {event}; ResourceClaim {name} status.allocation.devices.results: {result}",
        p.grant, p.spec_cpus, p.cgroup_cpus
    ));
    t.delete_pod(POD)?;
    util::wait_until(
        &format!("the kubelet's NodeUnprepareResources of {name}"),
        Duration::from_secs(60),
        POLL,
        || Ok(plugin.unprepared().iter().any(|c| c.uid == uid)),
    )
}

/// The DeviceClass, the node's ResourceSlice with `device` on NUMA node `node`, the claim
/// template and the Pod.
fn publish(t: &Tier, device: &str, node: usize) -> Result<()> {
    let devices = [DraDevice {
        name: device.to_string(),
        numa_node: u32::try_from(node)?,
    }];
    let kube = t.cl.kube();
    kube.apply(&device_class().to_string())?;
    kube.apply(&resource_slice(NODE, &devices).to_string())?;
    kube.apply(&template().to_string())?;
    kube.apply(&pod_manifest()?.to_string())?;
    Ok(())
}

/// The Pod's ResourceClaim (made from the template) and its allocation result, checked to be
/// this driver's device on this node, reserved for the Pod.
fn claim_allocation(t: &Tier, device: &str) -> Result<(Value, Value)> {
    let pod = t.pod_json(POD)?;
    let statuses = pod["status"]["resourceClaimStatuses"].as_array();
    let name = statuses
        .and_then(|s| s.iter().find(|s| s["name"] == CLAIM))
        .and_then(|s| s["resourceClaimName"].as_str())
        .with_context(|| format!("no claim in the Pod's status: {}", pod["status"]))?;
    let claim =
        t.cl.kube()
            .get_json(&["-n", "default", "get", "resourceclaim", name])?
            .with_context(|| format!("no ResourceClaim {name}"))?;
    let results = &claim["status"]["allocation"]["devices"]["results"];
    let want = json!([{"request": CLAIM, "driver": DRIVER, "pool": NODE, "device": device}]);
    ensure!(
        *results == want,
        "ResourceClaim {name}: allocation results {results}, not {want}"
    );
    let reserved = claim["status"]["reservedFor"].as_array();
    ensure!(
        reserved.is_some_and(|r| r
            .iter()
            .any(|r| r["resource"] == "pods" && r["name"] == POD)),
        "ResourceClaim {name} is not reserved for Pod {POD}: {}",
        claim["status"]
    );
    Ok((claim.clone(), results.clone()))
}

/// The container's memory nodes, the OCI spec's and the cgroup's, checked: the policy binds
/// memory only when asked to (the grant record then carries `mems=`).
fn mems(t: &Tier, p: &Placed) -> Result<(String, String)> {
    let mut cri = t.cri()?;
    let (spec, pid) = t.rt.block_on(async {
        let spec = cri.spec_mems(&p.id).await?;
        anyhow::Ok((spec, cri.pid(&p.id).await?))
    })?;
    ensure!(
        !p.field("mems").is_empty() || spec.is_empty(),
        "memory nodes {spec:?} set without a mems= record: grant {}",
        p.grant
    );
    Ok((spec, cgroup_mems(pid)?))
}

fn template() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": CLAIM, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": CLAIM, "exactly": {"deviceClassName": DRIVER}}
        ]}}},
    })
}

/// A Burstable Pod (250m/500m) whose container uses a claim made from the template.
fn pod_manifest() -> Result<Value> {
    let mut pod: Value = serde_json::from_str(&PodDef::new(POD, "250m", "500m").manifest())?;
    pod["spec"]["resourceClaims"] = json!([{"name": CLAIM, "resourceClaimTemplateName": CLAIM}]);
    pod["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": CLAIM}]);
    Ok(pod)
}

fn clean_up(t: &Tier) -> Result<()> {
    let slice = slice_name(NODE);
    let objects = [
        ("pod", POD, Some("default")),
        ("resourceclaimtemplate", CLAIM, Some("default")),
        ("resourceslice", slice.as_str(), None),
        ("deviceclass", DRIVER, None),
    ];
    t.delete_all(&objects)
}
