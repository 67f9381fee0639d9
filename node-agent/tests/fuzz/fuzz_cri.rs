//! Property tests of what the CRI proxy reads from the kubelet and the runtime:
//! the gRPC framing (`cri_proxy::grpc`), the CRI conversions and the overlays
//! (`cri_proxy::convert`).

use crate::common::{
    adjustment, cpu_set, cpuset_list, edge_i64, edge_u64, node_set, num, shown, text, Num,
};
use k8s_cri::v1 as cri;
use node_agent::cri_proxy::convert::{
    apply_linux_resources, cgroup_parent_from_verbose, container_key, cpuset_update,
    create_overlay, info_from_create, pod_from_config, resources_from_verbose, update_overlay,
};
use node_agent::cri_proxy::grpc::{frame, unary_message, with_overlay, FrameError};
use node_agent::{Adjustment, ContainerInfo, PodInfo, Update};
use proptest::prelude::*;
use prost::Message;
use serde_json::{json, Value};
use std::collections::HashMap;
use tap_engine::request::GRANT_KEY;

// ---- strategies -------------------------------------------------------------------------

fn string_map() -> BoxedStrategy<HashMap<String, String>> {
    let k = prop_oneof![1 => Just(GRANT_KEY.to_string()), 4 => "[a-z./-]{1,10}"];
    proptest::collection::hash_map(k, text(), 0..4).boxed()
}

fn resources() -> BoxedStrategy<cri::LinuxContainerResources> {
    (
        (edge_i64(), edge_i64(), edge_i64(), edge_i64()),
        (
            edge_i64(),
            edge_i64(),
            crate::common::cpuset(),
            crate::common::cpuset(),
        ),
        proptest::collection::hash_map("[a-z.]{1,10}", text(), 0..3),
        proptest::collection::vec(("[0-9A-Z]{1,4}", edge_u64()), 0..2),
    )
        .prop_map(
            |((period, quota, shares, mem), (oom, swap, cpus, mems), unified, huge)| {
                cri::LinuxContainerResources {
                    cpu_period: period,
                    cpu_quota: quota,
                    cpu_shares: shares,
                    memory_limit_in_bytes: mem,
                    oom_score_adj: oom,
                    memory_swap_limit_in_bytes: swap,
                    cpuset_cpus: cpus,
                    cpuset_mems: mems,
                    unified,
                    hugepage_limits: huge
                        .into_iter()
                        .map(|(page_size, limit)| cri::HugepageLimit { page_size, limit })
                        .collect(),
                }
            },
        )
        .boxed()
}

fn container_config() -> BoxedStrategy<cri::ContainerConfig> {
    (
        proptest::option::of((text(), any::<u32>())),
        proptest::collection::vec((text(), text()), 0..3),
        string_map(),
        string_map(),
        proptest::option::of(proptest::option::of(resources())),
        proptest::collection::vec(text(), 0..3),
        text(),
    )
        .prop_map(
            |(md, envs, annotations, labels, linux, command, image)| cri::ContainerConfig {
                metadata: md.map(|(name, attempt)| cri::ContainerMetadata { name, attempt }),
                image: Some(cri::ImageSpec {
                    image,
                    ..Default::default()
                }),
                command,
                envs: envs
                    .into_iter()
                    .map(|(key, value)| cri::KeyValue { key, value })
                    .collect(),
                annotations,
                labels,
                linux: linux.map(|resources| cri::LinuxContainerConfig {
                    resources,
                    ..Default::default()
                }),
                tty: true,
                ..Default::default()
            },
        )
        .boxed()
}

fn sandbox_config() -> BoxedStrategy<cri::PodSandboxConfig> {
    (
        proptest::option::of((text(), text(), text(), any::<u32>())),
        string_map(),
        string_map(),
        proptest::option::of((text(), proptest::option::of(resources()))),
    )
        .prop_map(|(md, labels, annotations, linux)| cri::PodSandboxConfig {
            metadata: md.map(|(name, uid, namespace, attempt)| cri::PodSandboxMetadata {
                name,
                uid,
                namespace,
                attempt,
            }),
            labels,
            annotations,
            linux: linux.map(|(cgroup_parent, overhead)| cri::LinuxPodSandboxConfig {
                cgroup_parent,
                overhead,
                ..Default::default()
            }),
            hostname: "h".into(),
            ..Default::default()
        })
        .boxed()
}

fn create_request() -> BoxedStrategy<cri::CreateContainerRequest> {
    (
        text(),
        proptest::option::weighted(0.9, container_config()),
        proptest::option::of(sandbox_config()),
    )
        .prop_map(
            |(pod_sandbox_id, config, sandbox_config)| cri::CreateContainerRequest {
                pod_sandbox_id,
                config,
                sandbox_config,
            },
        )
        .boxed()
}

fn update_request() -> BoxedStrategy<cri::UpdateContainerResourcesRequest> {
    (text(), proptest::option::of(resources()), string_map())
        .prop_map(
            |(container_id, linux, annotations)| cri::UpdateContainerResourcesRequest {
                container_id,
                linux,
                annotations,
                ..Default::default()
            },
        )
        .boxed()
}

/// A gRPC body near the edge of valid: a flag, a declared length close to (or far from) the
/// real one, and the bytes.
fn grpc_body() -> impl Strategy<Value = Vec<u8>> {
    let declared = prop_oneof![
        Just(0i64),
        -2i64..=2,
        Just(i64::from(u32::MAX)),
        Just(1i64 << 31),
    ];
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        (
            prop_oneof![Just(0u8), Just(1u8), any::<u8>()],
            declared,
            proptest::collection::vec(any::<u8>(), 0..64),
            any::<bool>(),
        )
            .prop_map(|(flag, delta, msg, relative)| {
                // relative: the real length plus delta; else delta is the length itself.
                let len = if relative {
                    (msg.len() as i64).saturating_add(delta)
                } else {
                    delta
                };
                let len = u32::try_from(len.clamp(0, i64::from(u32::MAX))).unwrap_or(u32::MAX);
                let mut b = vec![flag];
                b.extend_from_slice(&len.to_be_bytes());
                b.extend_from_slice(&msg);
                b
            }),
    ]
}

// ---- models -----------------------------------------------------------------------------

/// An overlay string field replaces the kubelet's only when it is on the wire: proto3 does not
/// encode an empty string, so an empty cpuset in an adjustment leaves the kubelet's as it is.
fn merge_str(field: &mut String, v: &Option<String>) {
    if let Some(v) = v.as_ref().filter(|v| !v.is_empty()) {
        field.clone_from(v);
    }
}

/// The create request the runtime must see: the kubelet's, with exactly the cpuset and the
/// grant annotation replaced.
fn created_as(
    mut req: cri::CreateContainerRequest,
    adj: &Adjustment,
) -> cri::CreateContainerRequest {
    let cfg = req.config.get_or_insert_with(Default::default);
    let res = cfg
        .linux
        .get_or_insert_with(Default::default)
        .resources
        .get_or_insert_with(Default::default);
    merge_str(&mut res.cpuset_cpus, &shown(adj.cpus));
    merge_str(&mut res.cpuset_mems, &shown(adj.mems));
    if let Some(r) = &adj.record {
        cfg.annotations.insert(GRANT_KEY.to_string(), r.clone());
    }
    req
}

fn updated_as(
    mut req: cri::UpdateContainerResourcesRequest,
    adj: &Adjustment,
) -> cri::UpdateContainerResourcesRequest {
    let res = req.linux.get_or_insert_with(Default::default);
    merge_str(&mut res.cpuset_cpus, &shown(adj.cpus));
    merge_str(&mut res.cpuset_mems, &shown(adj.mems));
    if let Some(r) = &adj.record {
        req.annotations.insert(GRANT_KEY.to_string(), r.clone());
    }
    req
}

/// What the runtime parses: the kubelet's body with the overlay after its message.
fn through_proxy<M: Message + Default>(kubelet: &M, overlay: &[u8]) -> M {
    let body = frame(&[&kubelet.encode_to_vec()]);
    let out = with_overlay(&body, overlay).expect("a framed message takes an overlay");
    let msg = unary_message(&out).expect("the rewritten body is one message");
    M::decode(msg).expect("the runtime can parse the rewritten message")
}

fn verbose(v: &Value) -> HashMap<String, String> {
    [("info".to_string(), v.to_string())].into()
}

fn put(obj: &mut serde_json::Map<String, Value>, k: &str, n: &Num) {
    if let Some(v) = n.json() {
        obj.insert(k.to_string(), v);
    }
}

// ---- properties -------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random bodies: never a panic; accepted exactly when they are one uncompressed message,
    /// and then the overlay lands right after the message.
    #[test]
    fn grpc_framing_accepts_exactly_one_uncompressed_message(
        body in grpc_body(),
        overlay in proptest::collection::vec(any::<u8>(), 0..32),
    ) {
        let declared = body
            .get(1..5)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
        let one = declared.is_some_and(|d| body.len().checked_sub(5) == Some(d));
        match unary_message(&body) {
            Ok(m) => {
                prop_assert!(one && body[0] == 0);
                prop_assert_eq!(m, &body[5..]);
            }
            Err(FrameError::Compressed) => prop_assert!(one && body[0] != 0),
            Err(FrameError::NotOneMessage(n)) => {
                prop_assert!(!one);
                prop_assert_eq!(n, body.len());
            }
        }
        match with_overlay(&body, &overlay) {
            Ok(out) => {
                let mut want = body[5..].to_vec();
                want.extend_from_slice(&overlay);
                prop_assert_eq!(unary_message(&out), Ok(&want[..]));
            }
            Err(e) => prop_assert_eq!(Err(e), unary_message(&body).map(|_| ())),
        }
    }

    /// The kubelet's CreateContainer with the overlay after it decodes as the kubelet's
    /// request with exactly cpuset_cpus/cpuset_mems and the grant annotation replaced.
    #[test]
    fn create_overlay_replaces_exactly_the_cpuset_and_the_grant(
        req in create_request(),
        adj in adjustment(),
    ) {
        match create_overlay(&adj) {
            None => prop_assert!(adj.cpus.is_none() && adj.mems.is_none()),
            Some(overlay) => {
                prop_assert_eq!(through_proxy(&req, &overlay), created_as(req, &adj));
            }
        }
    }

    #[test]
    fn update_overlay_replaces_exactly_the_cpuset_and_the_grant(
        req in update_request(),
        adj in adjustment(),
    ) {
        match update_overlay(&adj) {
            None => {
                prop_assert!(adj.cpus.is_none() && adj.mems.is_none() && adj.record.is_none())
            }
            Some(overlay) => {
                prop_assert_eq!(through_proxy(&req, &overlay), updated_as(req, &adj));
            }
        }
    }

    /// Any i64 resources: positive shares/periods/limits are taken as they are, a non-zero
    /// quota as it is, the rest ignored; nothing wraps.
    #[test]
    fn create_requests_become_container_info(req in create_request()) {
        let pod = req.sandbox_config.as_ref().map(pod_from_config).unwrap_or_default();
        let Some(info) = info_from_create(&req, pod.clone()) else {
            prop_assert!(req.config.is_none());
            return Ok(());
        };
        let cfg = req.config.as_ref().expect("info only with a config");
        let md = cfg.metadata.clone().unwrap_or_default();
        prop_assert_eq!(&info.id, &container_key(&req.pod_sandbox_id, &md.name, md.attempt));
        prop_assert_eq!(&info.pod, &pod);
        prop_assert_eq!(info.env.len(), cfg.envs.len());
        let r = cfg.linux.as_ref().and_then(|l| l.resources.clone()).unwrap_or_default();
        prop_assert_eq!(info.cpu_shares, u64::try_from(r.cpu_shares).ok().filter(|s| *s > 0));
        prop_assert_eq!(info.cpu_quota, Some(r.cpu_quota).filter(|q| *q != 0));
        prop_assert_eq!(info.cpu_period, u64::try_from(r.cpu_period).ok().filter(|p| *p > 0));
        prop_assert_eq!(info.memory_limit, Some(r.memory_limit_in_bytes).filter(|m| *m > 0));
    }

    /// A cpuset update carries the cpuset and memory nodes, as the runtime reads them back,
    /// and no other resource (containerd leaves zero fields as they are).
    #[test]
    fn cpuset_updates_round_trip_and_carry_nothing_else(
        cpus in cpu_set(),
        mems in proptest::option::of(node_set()),
    ) {
        let u = Update { container_id: "c".into(), cpus, mems };
        let r = cpuset_update(&u);
        prop_assert_eq!(&r.cpuset_cpus, &cpus.to_string());
        prop_assert_eq!(&r.cpuset_mems, &shown(mems).unwrap_or_default());
        let mut back = ContainerInfo::default();
        apply_linux_resources(&mut back, &r);
        prop_assert_eq!(back.cpu_shares, None);
        prop_assert_eq!(back.cpu_quota, None);
        prop_assert_eq!(back.cpu_period, None);
        prop_assert_eq!(back.memory_limit, None);
        let empty = cri::LinuxContainerResources::default();
        prop_assert_eq!(
            cri::LinuxContainerResources { cpuset_cpus: String::new(), cpuset_mems: String::new(), ..r },
            empty
        );
    }


    /// Any string as the verbose `info`: never a panic, and nothing read from what is not JSON.
    #[test]
    fn verbose_info_of_any_text_never_panics(s in ".{0,64}", t in "[{}\\[\\]\":,0-9a-z ]{0,64}") {
        for text in [s, t] {
            let info: HashMap<String, String> = [("info".to_string(), text.clone())].into();
            let mut c = ContainerInfo::default();
            resources_from_verbose(&info, &mut c);
            let parent = cgroup_parent_from_verbose(&info);
            if serde_json::from_str::<Value>(&text).is_err() {
                prop_assert_eq!(c, ContainerInfo::default());
                prop_assert_eq!(parent, None);
            }
        }
    }

    /// Any JSON tree as the verbose `info` (random values where numbers, strings and arrays
    /// are expected): never a panic.
    #[test]
    fn verbose_info_of_any_json_never_panics(v in crate::common::json_value(), w in crate::common::json_value()) {
        for doc in [
            v.clone(),
            json!({"runtimeSpec": v.clone(), "config": w.clone()}),
            json!({"runtimeSpec": {"linux": {"resources": {"cpu": v.clone(), "memory": w.clone()}},
                                   "process": w.clone()},
                   "config": {"linux": v}}),
        ] {
            let mut c = ContainerInfo::default();
            resources_from_verbose(&verbose(&doc), &mut c);
            let _ = cgroup_parent_from_verbose(&verbose(&doc));
        }
    }

    /// Numbers in the verbose `info` at the u64/i64 extremes are read exactly or not at all:
    /// shares/period as u64 (> 0), quota as i64 (!= 0), limit as i64 (> 0); negative,
    /// fractional, out-of-range or non-numbers are ignored.
    #[test]
    fn verbose_numbers_are_read_without_wrapping(
        shares in num(), quota in num(), period in num(), limit in num(),
        cpus in proptest::option::of(cpuset_list()), parent in proptest::option::of(text()),
    ) {
        let mut cpu = serde_json::Map::new();
        put(&mut cpu, "shares", &shares);
        put(&mut cpu, "quota", &quota);
        put(&mut cpu, "period", &period);
        if let Some(c) = &cpus {
            cpu.insert("cpus".into(), Value::String(c.clone()));
        }
        let mut memory = serde_json::Map::new();
        put(&mut memory, "limit", &limit);
        let doc = json!({
            "runtimeSpec": {"linux": {"resources": {"cpu": cpu, "memory": memory}}},
            "config": {"linux": {"cgroup_parent": parent}},
        });
        let mut c = ContainerInfo::default();
        resources_from_verbose(&verbose(&doc), &mut c);
        prop_assert_eq!(c.cpu_shares, shares.exact_u64().filter(|s| *s > 0));
        prop_assert_eq!(c.cpu_quota, quota.exact_i64().filter(|q| *q != 0));
        prop_assert_eq!(c.cpu_period, period.exact_u64().filter(|p| *p > 0));
        prop_assert_eq!(c.memory_limit, limit.exact_i64().filter(|m| *m > 0));
        prop_assert_eq!(shown(c.cpus), cpus.filter(|s| !s.is_empty()));
        prop_assert_eq!(
            cgroup_parent_from_verbose(&verbose(&doc)),
            parent.filter(|s| !s.is_empty())
        );
    }
}

/// The information of a Pod comes from its sandbox config; without one it is empty.
#[test]
fn missing_sandbox_config_is_an_empty_pod() {
    let req = cri::CreateContainerRequest {
        config: Some(Default::default()),
        ..Default::default()
    };
    let info = info_from_create(&req, PodInfo::default()).expect("a config");
    assert_eq!(info.pod, PodInfo::default());
    assert_eq!(info.id, "//0");
}
