//! The pure part of the CRI proxy: CRI messages to and from the agent's view of a container,
//! and the overlays that write an adjustment into a request.

use crate::agent::{runtime_cpus, runtime_nodes, Adjustment, ContainerInfo, PodInfo, Update};
use k8s_cri::v1 as cri;
use prost::Message;
use serde_json::Value;
use std::collections::HashMap;
use tap_engine::request::GRANT_KEY;

/// The engine key of a container.
pub fn container_key(sandbox_id: &str, name: &str, attempt: u32) -> String {
    format!("{sandbox_id}/{name}/{attempt}")
}

/// Pod information from a sandbox config (CreateContainer carries it).
pub fn pod_from_config(c: &cri::PodSandboxConfig) -> PodInfo {
    let md = c.metadata.clone().unwrap_or_default();
    PodInfo {
        uid: md.uid,
        name: md.name,
        namespace: md.namespace,
        labels: c.labels.clone(),
        annotations: c.annotations.clone(),
        cgroup_parent: c
            .linux
            .as_ref()
            .map(|l| l.cgroup_parent.clone())
            .filter(|s| !s.is_empty()),
    }
}

/// Copies the CPU and memory resources of a CRI request into `info`.
pub fn apply_linux_resources(info: &mut ContainerInfo, r: &cri::LinuxContainerResources) {
    if r.cpu_shares > 0 {
        info.cpu_shares = Some(r.cpu_shares as u64);
    }
    if r.cpu_quota != 0 {
        info.cpu_quota = Some(r.cpu_quota);
    }
    if r.cpu_period > 0 {
        info.cpu_period = Some(r.cpu_period as u64);
    }
    if r.memory_limit_in_bytes > 0 {
        info.memory_limit = Some(r.memory_limit_in_bytes);
    }
    let hugepages = r.hugepage_limits.iter();
    info.set_runtime_hugepage_limits(hugepages.map(|h| (h.page_size.as_str(), h.limit)));
}

/// A [`ContainerInfo`] for a CreateContainer request (`None` without a container config).
pub fn info_from_create(req: &cri::CreateContainerRequest, pod: PodInfo) -> Option<ContainerInfo> {
    let cfg = req.config.as_ref()?;
    let md = cfg.metadata.clone().unwrap_or_default();
    let mut info = ContainerInfo {
        id: container_key(&req.pod_sandbox_id, &md.name, md.attempt),
        name: md.name,
        pod,
        env: cfg
            .envs
            .iter()
            .map(|kv| format!("{}={}", kv.key, kv.value))
            .collect(),
        annotations: cfg.annotations.clone(),
        ..Default::default()
    };
    if let Some(r) = cfg.linux.as_ref().and_then(|l| l.resources.as_ref()) {
        apply_linux_resources(&mut info, r);
    }
    Some(info)
}

/// The overlay that gives a CreateContainer request an adjustment: `config.linux.resources`
/// `cpuset_cpus`/`cpuset_mems` and the grant record annotation (`None` if there is nothing to
/// change). Sent after the kubelet's message bytes, it replaces those fields and keeps the rest.
pub fn create_overlay(adj: &Adjustment) -> Option<Vec<u8>> {
    if adj.cpus.is_none() && adj.mems.is_none() {
        return None;
    }
    let overlay = cri::CreateContainerRequest {
        config: Some(cri::ContainerConfig {
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(cpuset_resources(adj)),
                ..Default::default()
            }),
            annotations: record_annotation(adj),
            ..Default::default()
        }),
        ..Default::default()
    };
    Some(overlay.encode_to_vec())
}

/// The overlay for an UpdateContainerResources request: `linux.cpuset_cpus/mems` and the
/// grant record annotation.
pub fn update_overlay(adj: &Adjustment) -> Option<Vec<u8>> {
    if adj.cpus.is_none() && adj.mems.is_none() && adj.record.is_none() {
        return None;
    }
    let overlay = cri::UpdateContainerResourcesRequest {
        linux: Some(cpuset_resources(adj)),
        annotations: record_annotation(adj),
        ..Default::default()
    };
    Some(overlay.encode_to_vec())
}

fn cpuset_resources(adj: &Adjustment) -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpuset_cpus: adj.cpus.map(|c| c.to_string()).unwrap_or_default(),
        cpuset_mems: adj.mems.map(|m| m.to_string()).unwrap_or_default(),
        ..Default::default()
    }
}

fn record_annotation(adj: &Adjustment) -> HashMap<String, String> {
    adj.record
        .iter()
        .map(|r| (GRANT_KEY.to_string(), r.clone()))
        .collect()
}

/// The resources to send for an [`Update`]: the cpuset and memory nodes only. containerd merges
/// an update into the container's spec field by field (a zero or empty field is left as it is),
/// so the CPU and memory values the kubelet set, possibly resized a moment ago, are never sent
/// back stale, and a memory limit is never re-sent (which would reset swap).
pub fn cpuset_update(u: &Update) -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpuset_cpus: u.cpus.to_string(),
        cpuset_mems: u.mems.map(|m| m.to_string()).unwrap_or_default(),
        ..Default::default()
    }
}

/// What a verbose ContainerStatus tells about resources: containerd's `info` JSON carries the
/// OCI spec (`runtimeSpec`), with the cpuset and CPU/memory limits as applied.
pub fn resources_from_verbose(info: &HashMap<String, String>, c: &mut ContainerInfo) {
    let Some(v) = info
        .get("info")
        .and_then(|s| serde_json::from_str::<Value>(s).ok())
    else {
        return;
    };
    let spec = &v["runtimeSpec"];
    let cpu = &spec["linux"]["resources"]["cpu"];
    if let Some(s) = cpu["shares"].as_u64().filter(|s| *s > 0) {
        c.cpu_shares = Some(s);
    }
    if let Some(q) = cpu["quota"].as_i64().filter(|q| *q != 0) {
        c.cpu_quota = Some(q);
    }
    if let Some(p) = cpu["period"].as_u64().filter(|p| *p > 0) {
        c.cpu_period = Some(p);
    }
    if let Some(s) = cpu["cpus"].as_str().and_then(|s| runtime_cpus(&c.id, s)) {
        c.cpus = Some(s);
    }
    if let Some(s) = cpu["mems"].as_str().and_then(|s| runtime_nodes(&c.id, s)) {
        c.mems = Some(s);
    }
    if let Some(m) = spec["linux"]["resources"]["memory"]["limit"]
        .as_i64()
        .filter(|m| *m > 0)
    {
        c.memory_limit = Some(m);
    }
    if let Some(env) = spec["process"]["env"].as_array() {
        c.env = env
            .iter()
            .filter_map(|e| e.as_str().map(str::to_string))
            .collect();
    }
}

/// The cgroup parent from a verbose PodSandboxStatus (`info.config.linux.cgroup_parent`).
pub fn cgroup_parent_from_verbose(info: &HashMap<String, String>) -> Option<String> {
    let v: Value = serde_json::from_str(info.get("info")?).ok()?;
    v["config"]["linux"]["cgroup_parent"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::test_sets::*;
    use crate::agent::HugepageLimit;
    use crate::cri_proxy::grpc::{frame, unary_message};
    use crate::Adjustment;
    use prost::Message;

    fn create_req() -> cri::CreateContainerRequest {
        cri::CreateContainerRequest {
            pod_sandbox_id: "sb1".into(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: "app".into(),
                    attempt: 2,
                }),
                envs: vec![cri::KeyValue {
                    key: "VA_VISIBLE_DEVICES".into(),
                    value: "0".into(),
                }],
                annotations: [("a".to_string(), "b".to_string())].into(),
                linux: Some(cri::LinuxContainerConfig {
                    resources: Some(cri::LinuxContainerResources {
                        cpu_shares: 4096,
                        cpu_quota: 800_000,
                        cpu_period: 100_000,
                        memory_limit_in_bytes: 1 << 30,
                        hugepage_limits: vec![
                            cri::HugepageLimit {
                                page_size: "1GB".into(),
                                limit: 2 << 30,
                            },
                            cri::HugepageLimit {
                                page_size: "2MB".into(),
                                limit: 0,
                            },
                        ],
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            sandbox_config: Some(cri::PodSandboxConfig {
                metadata: Some(cri::PodSandboxMetadata {
                    name: "web".into(),
                    uid: "u1".into(),
                    namespace: "shop".into(),
                    attempt: 0,
                }),
                labels: [("app".to_string(), "web".to_string())].into(),
                linux: Some(cri::LinuxPodSandboxConfig {
                    cgroup_parent: "/kubepods/burstable/podu1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn create_request_becomes_container_info() {
        let req = create_req();
        let pod = pod_from_config(req.sandbox_config.as_ref().unwrap());
        assert_eq!(pod.name, "web");
        assert_eq!(pod.namespace, "shop");
        assert_eq!(
            pod.cgroup_parent.as_deref(),
            Some("/kubepods/burstable/podu1")
        );
        let info = info_from_create(&req, pod).unwrap();
        assert_eq!(info.id, "sb1/app/2");
        assert_eq!(info.name, "app");
        assert_fixture_resources(&info);
        assert_eq!(
            info.hugepage_limits,
            [HugepageLimit {
                size_kb: 1 << 20,
                bytes: 2 << 30
            }]
        );
        assert_eq!(info.env, vec!["VA_VISIBLE_DEVICES=0"]);
        let mut no_cfg = create_req();
        no_cfg.config = None;
        assert!(info_from_create(&no_cfg, PodInfo::default()).is_none());
    }

    /// What the overlay must amount to, written on the decoded request.
    fn rewritten(
        mut req: cri::CreateContainerRequest,
        adj: &Adjustment,
    ) -> cri::CreateContainerRequest {
        let Some(cfg) = req.config.as_mut() else {
            return req;
        };
        let res = cfg
            .linux
            .get_or_insert_with(Default::default)
            .resources
            .get_or_insert_with(Default::default);
        if let Some(c) = &adj.cpus {
            res.cpuset_cpus = c.to_string();
        }
        if let Some(m) = &adj.mems {
            res.cpuset_mems = m.to_string();
        }
        if let Some(r) = &adj.record {
            cfg.annotations.insert(GRANT_KEY.to_string(), r.clone());
        }
        req
    }

    /// The message the runtime parses: the kubelet's bytes, then the overlay.
    fn merged<M: Message + Default>(original: &M, overlay: &[u8]) -> M {
        let body = frame(&[&original.encode_to_vec(), overlay]);
        M::decode(unary_message(&body).unwrap()).unwrap()
    }

    #[test]
    fn create_overlay_sets_the_cpuset_and_keeps_the_rest() {
        let adj = placed("0-23", "0", "v1;x");
        let overlay = create_overlay(&adj).unwrap();
        let got = merged(&create_req(), &overlay);
        assert_eq!(got, rewritten(create_req(), &adj));
        let cfg = got.config.as_ref().unwrap();
        let r = cfg.linux.as_ref().unwrap().resources.as_ref().unwrap();
        assert_eq!(
            (r.cpuset_cpus.as_str(), r.cpuset_mems.as_str()),
            ("0-23", "0")
        );
        assert_eq!(r.cpu_shares, 4096);
        assert_eq!(r.memory_limit_in_bytes, 1 << 30);
        assert_eq!(
            cfg.annotations.get(GRANT_KEY).map(String::as_str),
            Some("v1;x")
        );
        assert_eq!(cfg.annotations.get("a").map(String::as_str), Some("b"));
        assert_eq!(cfg.envs.len(), 1);

        // A kubelet cpuset is replaced; cpus only: the kubelet's mems stay.
        let mut pinned = create_req();
        {
            let cfg = pinned.config.as_mut().unwrap();
            let r = cfg.linux.as_mut().unwrap().resources.as_mut().unwrap();
            r.cpuset_cpus = "5".into();
            r.cpuset_mems = "1".into();
            cfg.annotations.insert(GRANT_KEY.into(), "old".into());
        }
        let cpus_only = Adjustment {
            cpus: Some(cpu_set("8-9")),
            mems: None,
            ..adj.clone()
        };
        let got = merged(&pinned, &create_overlay(&cpus_only).unwrap());
        assert_eq!(got, rewritten(pinned, &cpus_only));
        let r = got.config.unwrap().linux.unwrap().resources.unwrap();
        assert_eq!(
            (r.cpuset_cpus.as_str(), r.cpuset_mems.as_str()),
            ("8-9", "1")
        );

        // No linux section: one is made.
        let mut bare = create_req();
        bare.config.as_mut().unwrap().linux = None;
        assert_eq!(merged(&bare, &overlay), rewritten(bare, &adj));

        // Nothing to change: no overlay.
        assert_eq!(create_overlay(&Adjustment::default()), None);
    }

    #[test]
    fn update_overlay_sets_the_cpuset_and_keeps_the_rest() {
        let req = cri::UpdateContainerResourcesRequest {
            container_id: "c1".into(),
            linux: Some(cri::LinuxContainerResources {
                cpu_shares: 8192,
                cpu_quota: 1_600_000,
                cpu_period: 100_000,
                cpuset_cpus: "0-95".into(),
                unified: [("memory.high".to_string(), "max".to_string())].into(),
                ..Default::default()
            }),
            annotations: [("k".to_string(), "v".to_string())].into(),
            ..Default::default()
        };
        let adj = placed("24-47", "1", "v1;y");
        let got = merged(&req, &update_overlay(&adj).unwrap());
        let mut want = req.clone();
        {
            let l = want.linux.as_mut().unwrap();
            l.cpuset_cpus = "24-47".into();
            l.cpuset_mems = "1".into();
            want.annotations.insert(GRANT_KEY.into(), "v1;y".into());
        }
        assert_eq!(got, want);
        assert_eq!(update_overlay(&Adjustment::default()), None);
    }

    #[test]
    fn verbose_status_gives_resources_and_cgroup_parent() {
        let info: HashMap<String, String> = [(
            "info".to_string(),
            r#"{"runtimeSpec":{"process":{"env":["A=1"]},"linux":{"resources":{
                "cpu":{"shares":2048,"quota":400000,"period":100000,"cpus":"0-1","mems":"0"},
                "memory":{"limit":67108864}}}},
              "config":{"linux":{"cgroup_parent":"/kubepods/besteffort/pod9"}}}"#
                .to_string(),
        )]
        .into();
        let mut c = ContainerInfo::default();
        resources_from_verbose(&info, &mut c);
        assert_eq!(c.cpu_shares, Some(2048));
        assert_eq!(c.cpu_quota, Some(400_000));
        assert_eq!(c.cpu_period, Some(100_000));
        assert_eq!(shown(c.cpus).as_deref(), Some("0-1"));
        assert_eq!(shown(c.mems).as_deref(), Some("0"));
        assert_eq!(c.memory_limit, Some(64 << 20));
        assert_eq!(c.env, vec!["A=1"]);
        assert_eq!(
            cgroup_parent_from_verbose(&info).as_deref(),
            Some("/kubepods/besteffort/pod9")
        );
        let mut d = ContainerInfo::default();
        resources_from_verbose(&HashMap::new(), &mut d);
        assert_eq!(d, ContainerInfo::default());
        let bad: HashMap<String, String> = [("info".to_string(), "{".to_string())].into();
        assert_eq!(cgroup_parent_from_verbose(&bad), None);
    }

    #[test]
    fn updates_carry_the_cpuset_and_nothing_else() {
        let r = cpuset_update(&Update {
            container_id: "k".into(),
            cpus: cpu_set("4-7"),
            mems: Some(node_set("1")),
        });
        assert_eq!(
            r,
            cri::LinuxContainerResources {
                cpuset_cpus: "4-7".into(),
                cpuset_mems: "1".into(),
                ..Default::default()
            }
        );
    }
}
