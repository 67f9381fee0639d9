//! The cluster tier's means: the Pods it defines, what it reads back from CRI, the cgroup and
//! the NodeTopology, and the helm and image steps the scenarios in `cluster.rs` share.

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tap_e2e::cluster::{Cluster, NODE};
use tap_e2e::containerd::{cgroup_cpuset, Cri};
use tap_e2e::images::{build_static, scratch_image_archive, ImageFile};
use tap_e2e::util;

pub(crate) const FIXTURE: &str = "synthetic-2s-4numa-96c-gpu";
/// How often the tier polls what it waits for.
pub(crate) const POLL: Duration = Duration::from_millis(500);
pub(crate) const GRANT_KEY: &str = "tap.kunpeng.huawei.com/grant";
pub(crate) const NS: &str = "kunpeng-tap";
pub(crate) const AGENT_IMAGE: &str = "tap.local/kunpeng-tap-agent";
pub(crate) const OPERATOR_IMAGE: &str = "tap.local/kunpeng-tap-operator";
pub(crate) const TAG: &str = "e2e";
/// Where the agent's image carries the fixture.
pub(crate) const IMAGE_FIXTURE: &str = "/tap-fixtures/synthetic-2s-4numa-96c-gpu";

pub(crate) use tap_e2e::util::{folded_node, host_cpus};

pub(crate) fn parse_list(s: &str) -> BTreeSet<usize> {
    util::parse_list(s).unwrap_or_else(|e| panic!("CPU list {s:?}: {e}"))
}

/// The fixture's CPUs of NUMA node `n`.
pub(crate) fn node_cpus(n: usize) -> BTreeSet<usize> {
    let p = util::fixture_dir(FIXTURE).join(format!("devices/system/node/node{n}/cpulist"));
    parse_list(&std::fs::read_to_string(p).unwrap())
}

/// helm with a private home and the cluster's admin kubeconfig.
pub(crate) fn helm(cl: &Cluster, args: &[&str]) -> Result<String> {
    let home = cl.dir.join("helm-home");
    let out = Command::new(tap_e2e::helm::helm_bin())
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env("KUBECONFIG", &cl.kube().kubeconfig)
        .args(args)
        .output()
        .context("running helm")?;
    if !out.status.success() {
        bail!(
            "helm {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A Pod running busybox `sleep` with one container `app`.
pub(crate) struct PodDef<'a> {
    pub(crate) name: &'a str,
    pub(crate) cpu_request: &'a str,
    pub(crate) cpu_limit: &'a str,
    pub(crate) memory: &'a str,
    pub(crate) labels: &'a [(&'a str, &'a str)],
    pub(crate) annotations: &'a [(&'a str, &'a str)],
    /// Extended resources in the limits (`example.com/accel`, `1`).
    pub(crate) extended: &'a [(&'a str, &'a str)],
}

impl<'a> PodDef<'a> {
    pub(crate) fn new(name: &'a str, cpu_request: &'a str, cpu_limit: &'a str) -> Self {
        PodDef {
            name,
            cpu_request,
            cpu_limit,
            memory: "64Mi",
            labels: &[],
            annotations: &[],
            extended: &[],
        }
    }

    pub(crate) fn manifest(&self) -> String {
        let map = |kv: &[(&str, &str)]| -> Value {
            Value::Object(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
                    .collect(),
            )
        };
        let mut limits = serde_json::json!({"cpu": self.cpu_limit, "memory": self.memory});
        for (k, v) in self.extended {
            limits[*k] = Value::String(v.to_string());
        }
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": "default",
                "labels": map(self.labels),
                "annotations": map(self.annotations),
            },
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "containers": [{
                    "name": "app",
                    "image": tap_e2e::containerd::BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sleep", "36000"],
                    "resources": {
                        "requests": {"cpu": self.cpu_request, "memory": self.memory},
                        "limits": limits,
                    },
                }],
            },
        })
        .to_string()
    }
}

/// What is known about a running container of a Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placed {
    pub(crate) id: String,
    /// The OCI spec's `linux.resources.cpu.cpus` through CRI ContainerStatus (what
    /// `crictl inspect … | grep cpuset_cpus` shows).
    pub(crate) spec_cpus: String,
    /// The running container's cgroup `cpuset.cpus`.
    pub(crate) cgroup_cpus: String,
    /// The grant record the agent stored with the container ("" when none): an OCI spec
    /// annotation in NRI mode, a CRI annotation in CRI proxy mode.
    pub(crate) grant: String,
}

impl Placed {
    pub(crate) fn field(&self, k: &str) -> String {
        tap_e2e::text::grant_fields(&self.grant)
            .get(k)
            .cloned()
            .unwrap_or_default()
    }
}

pub(crate) struct Tier {
    pub(crate) cl: Cluster,
    pub(crate) rt: tokio::runtime::Runtime,
    /// The cpusets the guide's Pod got (for the report).
    pub(crate) notes: Vec<String>,
}

impl Tier {
    pub(crate) fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.cl.kube().kubectl_ok(args)
    }

    /// Deletes each `(kind, name, namespace)` that exists and waits until it is gone.
    pub(crate) fn delete_all(&self, objects: &[(&str, &str, Option<&str>)]) -> Result<()> {
        for &(kind, name, ns) in objects {
            let mut args = vec!["delete", kind, name, "--ignore-not-found", "--wait=true"];
            args.extend(ns.map(|ns| ["-n", ns]).into_iter().flatten());
            self.kubectl(&args)?;
        }
        Ok(())
    }

    pub(crate) fn cri(&self) -> Result<Cri> {
        let sock = self.cl.containerd().cri_socket();
        self.rt.block_on(Cri::connect(&sock))
    }

    pub(crate) fn run_pod(&self, def: &PodDef) -> Result<Placed> {
        self.cl.kube().apply(&def.manifest())?;
        self.wait_running(def.name)?;
        self.placed(def.name)
    }

    /// Pod `name` of the default namespace, as JSON.
    pub(crate) fn pod_json(&self, name: &str) -> Result<Value> {
        self.cl
            .kube()
            .get_json(&["-n", "default", "get", "pod", name])?
            .with_context(|| format!("no pod {name}"))
    }

    pub(crate) fn wait_running(&self, pod: &str) -> Result<()> {
        util::wait_until(
            &format!("Pod {pod} Running"),
            Duration::from_secs(90),
            POLL,
            || {
                let p = self.pod_json(pod)?;
                Ok(p["status"]["phase"] == "Running"
                    && p["status"]["containerStatuses"][0]["ready"] == true)
            },
        )
        .with_context(|| self.describe(pod))
    }

    /// The name of the ResourceClaim of the Pod's first claim (its status says it).
    pub(crate) fn claim_name(&self, pod: &str) -> Result<String> {
        let p = self.pod_json(pod)?;
        Ok(p["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
            .as_str()
            .with_context(|| format!("no claim: {}", p["status"]))?
            .to_string())
    }

    /// `status.allocation.devices.results` of the Pod's first claim.
    pub(crate) fn claim_results(&self, pod: &str) -> Result<Value> {
        let name = self.claim_name(pod)?;
        let c = self
            .cl
            .kube()
            .get_json(&["-n", "default", "get", "resourceclaim", &name])?;
        Ok(
            c.with_context(|| format!("no ResourceClaim {name}"))?["status"]["allocation"]
                ["devices"]["results"]
                .clone(),
        )
    }

    /// The message of the Pod's first Event with `reason` (waits for it up to 30 s).
    pub(crate) fn pod_event(&self, pod: &str, reason: &str) -> Result<String> {
        let field = format!("involvedObject.name={pod},reason={reason}");
        let mut message = String::new();
        util::wait_until(
            &format!("a {reason} Event on Pod {pod}"),
            Duration::from_secs(30),
            POLL,
            || {
                let list = self
                    .cl
                    .kube()
                    .get_json(&["get", "events", "-n", "default", "--field-selector", &field])?
                    .context("no event list")?;
                let first = list["items"].as_array().and_then(|i| i.first().cloned());
                if let Some(e) = first {
                    message = e["message"].as_str().unwrap_or_default().to_string();
                }
                Ok(!message.is_empty())
            },
        )?;
        Ok(message)
    }

    pub(crate) fn describe(&self, pod: &str) -> String {
        self.cl
            .kube()
            .kubectl(&["-n", "default", "describe", "pod", pod])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    pub(crate) fn container_id(&self, ns: &str, pod: &str) -> Result<String> {
        let p = self
            .cl
            .kube()
            .get_json(&["-n", ns, "get", "pod", pod])?
            .context("no pod")?;
        let id = p["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .context("no containerID yet")?;
        Ok(id.trim_start_matches("containerd://").to_string())
    }

    /// The ids and states of the default-namespace Pod's containers as containerd holds them
    /// (CRI ListContainers by the kubelet's labels), not as the API server last heard.
    pub(crate) fn runtime_containers(&self, pod: &str) -> Result<Vec<(String, i32)>> {
        let mut cri = self.cri()?;
        let labels = [
            ("io.kubernetes.pod.name", pod),
            ("io.kubernetes.pod.namespace", "default"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let list = self.rt.block_on(cri.raw().list_containers(
            k8s_cri::v1::ListContainersRequest {
                filter: Some(k8s_cri::v1::ContainerFilter {
                    label_selector: labels,
                    ..Default::default()
                }),
            },
        ))?;
        Ok(list
            .into_inner()
            .containers
            .into_iter()
            .map(|c| (c.id, c.state))
            .collect())
    }

    /// The Pod still has exactly its container `before`, running: the kubelet (restarted, or
    /// pointed at another runtime endpoint) did not recreate it. Read from containerd, since
    /// the API server may still show the old kubelet's report.
    pub(crate) fn assert_not_recreated(&self, pod: &str, before: &Placed) -> Result<()> {
        let running = k8s_cri::v1::ContainerState::ContainerRunning as i32;
        let now = self.runtime_containers(pod)?;
        ensure!(
            now == vec![(before.id.clone(), running)],
            "Pod {pod}: containerd holds {now:?}, expected only {} running",
            before.id
        );
        Ok(())
    }

    /// Waits for the running kubelet to have taken the Pod from the API server (its `SyncLoop
    /// ADD` log line; each kubelet run logs one), `runs_before` = such lines before the restart.
    pub(crate) fn wait_kubelet_sync(&self, pod: &str, runs_before: usize) -> Result<()> {
        util::wait_until(
            &format!("the restarted kubelet's SyncLoop ADD of default/{pod}"),
            Duration::from_secs(60),
            POLL,
            || Ok(self.kubelet_adds(pod) > runs_before),
        )
    }

    /// How many `SyncLoop ADD` lines of the kubelet's logs (every run) name the Pod.
    pub(crate) fn kubelet_adds(&self, pod: &str) -> usize {
        let needle = format!("\"default/{pod}\"");
        self.cl
            .kubelet_log()
            .lines()
            .filter(|l| l.contains("\"SyncLoop ADD\"") && l.contains(&needle))
            .count()
    }

    pub(crate) fn placed(&self, pod: &str) -> Result<Placed> {
        let id = self.container_id("default", pod)?;
        let mut cri = self.cri()?;
        let (spec_cpus, ann, cri_ann, pid) = self.rt.block_on(async {
            let spec = cri.spec_cpuset(&id).await?;
            let ann = cri.spec_annotations(&id).await?;
            let (st, _) = cri.container_status(&id).await?;
            let pid = cri.pid(&id).await?;
            anyhow::Ok((spec, ann, st.annotations, pid))
        })?;
        Ok(Placed {
            id,
            spec_cpus,
            cgroup_cpus: cgroup_cpuset(pid)?,
            grant: ann
                .get(GRANT_KEY)
                .or_else(|| cri_ann.get(GRANT_KEY))
                .cloned()
                .unwrap_or_default(),
        })
    }

    /// Checks a placed container: its grant names one NUMA node k of `policy`, and CRI and
    /// the cgroup both show node k folded onto this host. Returns k.
    pub(crate) fn assert_on_one_node(&self, what: &str, p: &Placed, policy: &str) -> Result<usize> {
        ensure!(!p.grant.is_empty(), "{what}: no grant record: {p:?}");
        ensure!(
            p.field("p") == policy,
            "{what}: policy {} != {policy}: {p:?}",
            p.field("p")
        );
        let k: usize = p
            .field("n")
            .parse()
            .with_context(|| format!("{what}: not one NUMA node: {p:?}"))?;
        let want = folded_node(k);
        ensure!(
            parse_list(&p.spec_cpus) == want,
            "{what}: CRI cpuset {} != NUMA node {k} folded {want:?}: {p:?}",
            p.spec_cpus
        );
        ensure!(
            parse_list(&p.cgroup_cpus) == want,
            "{what}: cgroup cpuset {} != NUMA node {k} folded {want:?}: {p:?}",
            p.cgroup_cpus
        );
        Ok(k)
    }

    pub(crate) fn delete_pod(&self, pod: &str) -> Result<()> {
        self.kubectl(&[
            "-n",
            "default",
            "delete",
            "pod",
            pod,
            "--wait=true",
            "--timeout=60s",
        ])?;
        Ok(())
    }

    /// The agent's Pods (`kubectl get pods -l ...` as JSON), if the namespace has any list.
    pub(crate) fn agent_pods(&self) -> Result<Option<Value>> {
        let selector = "app.kubernetes.io/component=agent";
        self.cl
            .kube()
            .get_json(&["-n", NS, "get", "pods", "-l", selector])
    }

    pub(crate) fn agent_pod(&self) -> Result<String> {
        let v = self.agent_pods()?.context("no pods")?;
        let items = v["items"].as_array().context("items")?;
        let running: Vec<&Value> = items
            .iter()
            .filter(|p| {
                p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null()
            })
            .collect();
        ensure!(running.len() == 1, "{} running agent Pods", running.len());
        Ok(running[0]["metadata"]["name"].as_str().unwrap().to_string())
    }

    /// `kubectl logs` of the agent Pod (through the API server and the kubelet).
    pub(crate) fn agent_log(&self) -> Result<String> {
        let pod = self.agent_pod()?;
        self.kubectl(&["-n", NS, "logs", &pod])
    }

    pub(crate) fn wait_agent_log(&self, needle: &str, count: usize) -> Result<()> {
        util::wait_until(
            &format!("{count} × {needle:?} in the agent log"),
            Duration::from_secs(60),
            POLL,
            || Ok(self.agent_log()?.matches(needle).count() >= count),
        )
    }

    pub(crate) fn node_topology(&self) -> Result<Value> {
        self.cl
            .kube()
            .get_json(&["get", "nodetopology", NODE])?
            .context("no NodeTopology for the node")
    }

    /// The allocation the agent reports: per zone (name -> allocated milli, containers).
    pub(crate) fn allocation(&self) -> Result<BTreeMap<String, (i64, i64)>> {
        let nt = self.node_topology()?;
        let mut out = BTreeMap::new();
        for z in nt["status"]["zones"].as_array().context("no zones")? {
            out.insert(
                z["name"].as_str().unwrap_or("?").to_string(),
                (
                    z["allocatedMilli"].as_i64().unwrap_or(0),
                    z["containers"].as_i64().unwrap_or(0),
                ),
            );
        }
        Ok(out)
    }

    pub(crate) fn wait_containers(&self, n: i64) -> Result<()> {
        util::wait_until(
            &format!("NodeTopology status.containers == {n}"),
            Duration::from_secs(60),
            POLL,
            || Ok(self.node_topology()?["status"]["containers"].as_i64() == Some(n)),
        )
    }

    /// The node's TopologyPolicy: topology-aware with `reserved` CPUs that Pods asking by
    /// annotation may use (`annotation`: `ignored` or `honoured`) and kube-system's; waits until
    /// the node's NodeTopology carries it.
    pub(crate) fn set_reserved_policy(&self, reserved: &str, annotation: &str) -> Result<()> {
        let extra = format!(
            "  reservedCPUs: \"{reserved}\"\n  reservedCPUsFor:\n    namespaces: [kube-system]\n    annotation: {annotation}\n"
        );
        self.apply_policy("topology-aware", &extra, |p| {
            p["reservedCPUs"] == reserved && p["reservedCPUsFor"]["annotation"] == annotation
        })
    }

    pub(crate) fn set_policy(&self, policy: &str) -> Result<()> {
        self.apply_policy(policy, "", |p| {
            p["reservedCPUs"].as_str().unwrap_or("").is_empty()
        })
    }

    /// Applies the node's TopologyPolicy (`policy` and the `extra` spec lines) and waits until
    /// the node's NodeTopology carries that policy and `arrived` holds for it.
    fn apply_policy(
        &self,
        policy: &str,
        extra: &str,
        arrived: impl Fn(&Value) -> bool,
    ) -> Result<()> {
        self.cl.kube().apply(&format!(
            r#"apiVersion: tap.kunpeng.io/v1alpha1
kind: TopologyPolicy
metadata:
  name: e2e-node
spec:
  nodeSelector:
    matchLabels:
      kubernetes.io/hostname: {NODE}
  policy: {policy}
  priority: 10
{extra}"#
        ))?;
        util::wait_until(
            &format!("NodeTopology {NODE} with policy {policy} {}", extra.trim()),
            Duration::from_secs(60),
            POLL,
            || {
                let p = &self.node_topology()?["spec"]["policy"];
                Ok(p["policy"] == policy && arrived(p))
            },
        )
    }
}

pub(crate) fn scratch_images(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let agent_bin = build_static("node-agent", "kunpeng-tap");
    let operator_bin = build_static("tap-operator", "kunpeng-tap-operator");
    let agent = scratch_image_archive(
        &dir.join("agent-image.tar"),
        &format!("{AGENT_IMAGE}:{TAG}"),
        &[
            vec![ImageFile {
                source: agent_bin,
                dest: "/usr/local/bin/kunpeng-tap".into(),
                mode: 0o755,
            }],
            vec![ImageFile {
                source: util::fixture_dir(FIXTURE),
                dest: IMAGE_FIXTURE.into(),
                mode: 0o755,
            }],
        ],
        &["/usr/local/bin/kunpeng-tap"],
        "65532:65532",
    )?;
    let operator = scratch_image_archive(
        &dir.join("operator-image.tar"),
        &format!("{OPERATOR_IMAGE}:{TAG}"),
        &[vec![ImageFile {
            source: operator_bin,
            dest: "/usr/local/bin/kunpeng-tap-operator".into(),
            mode: 0o755,
        }]],
        &["/usr/local/bin/kunpeng-tap-operator"],
        "65532:65532",
    )?;
    Ok((agent, operator))
}
