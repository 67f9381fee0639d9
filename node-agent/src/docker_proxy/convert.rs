//! The pure part of the Docker proxy: routing, label parsing, and the rewriting of create and
//! update bodies.

use crate::agent::{runtime_cpus, runtime_nodes, Adjustment, ContainerInfo, PodInfo, Update};
use hyper::Method;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use tap_engine::request::GRANT_KEY;

pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
pub const LABEL_DOCKER_TYPE: &str = "io.kubernetes.docker.type";
pub const LABEL_SANDBOX_ID: &str = "io.kubernetes.sandbox.id";
pub const ANNOTATION_PREFIX: &str = "annotation.";

/// What the proxy does with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Create,
    Update(String),
    Stop(String),
    Delete(String),
    Other,
}

/// `/v1.41/containers/create` -> `/containers/create`; unversioned paths stay.
pub fn strip_version(path: &str) -> &str {
    if let Some(rest) = path.strip_prefix("/v") {
        if let Some(i) = rest.find('/') {
            let v = &rest[..i];
            if !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.') {
                return &rest[i..];
            }
        }
    }
    path
}

/// Routes a request by method and path (query excluded).
pub fn route(method: &Method, path: &str) -> Route {
    let p = strip_version(path);
    let Some(rest) = p.strip_prefix("/containers/") else {
        return Route::Other;
    };
    let parts: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
    match (method, parts.as_slice()) {
        (&Method::POST, ["create"]) => Route::Create,
        (&Method::POST, [id, "update"]) if !id.is_empty() => Route::Update(percent_decode(id)),
        (&Method::POST, [id, "stop"]) if !id.is_empty() => Route::Stop(percent_decode(id)),
        (&Method::DELETE, [id]) if !id.is_empty() => Route::Delete(percent_decode(id)),
        _ => Route::Other,
    }
}

/// Minimal `%XX` decoding for names and ids in paths and queries.
pub fn percent_decode(s: &str) -> String {
    fn hex(c: u8) -> Option<u8> {
        (c as char).to_digit(16).map(|d| d as u8)
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The value of `key` in a query string.
pub fn query_param(query: Option<&str>, key: &str) -> Option<String> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| percent_decode(v))
}

pub fn str_map(v: Option<&Value>) -> HashMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether labels mark a Kubernetes application container (not a sandbox, not a plain one).
pub fn is_k8s_container(labels: &HashMap<String, String>) -> bool {
    match labels.get(LABEL_DOCKER_TYPE).map(String::as_str) {
        Some("container") => true,
        Some(_) => false,
        None => labels.contains_key(LABEL_POD_NAME) && labels.contains_key(LABEL_CONTAINER_NAME),
    }
}

/// The container name from a `k8s_<container>_<pod>_<namespace>_<uid>_<attempt>` name.
fn name_from_docker_name(name: &str) -> Option<String> {
    let rest = name.trim_start_matches('/').strip_prefix("k8s_")?;
    rest.split('_').next().map(str::to_string)
}

/// A [`ContainerInfo`] from a container's labels (and its sandbox's, for the Pod's labels and
/// annotations); `None` when the labels do not mark a Kubernetes container.
///
/// cri-dockerd/dockershim labels: `io.kubernetes.pod.{name,namespace,uid}`,
/// `io.kubernetes.container.name`, `io.kubernetes.docker.type` (`container`/`podsandbox`),
/// `io.kubernetes.sandbox.id`; `annotation.<key>` labels carry annotations. The sandbox's
/// other labels are the Pod's labels.
pub fn info_from_labels(
    docker_name: &str,
    labels: &HashMap<String, String>,
    sandbox_labels: Option<&HashMap<String, String>>,
) -> Option<ContainerInfo> {
    if !is_k8s_container(labels) {
        return None;
    }
    let mut pod = PodInfo {
        uid: labels.get(LABEL_POD_UID).cloned().unwrap_or_default(),
        name: labels.get(LABEL_POD_NAME).cloned().unwrap_or_default(),
        namespace: labels.get(LABEL_POD_NAMESPACE).cloned().unwrap_or_default(),
        ..Default::default()
    };
    for source in sandbox_labels.into_iter().chain(std::iter::once(labels)) {
        for (k, v) in source {
            if let Some(a) = k.strip_prefix(ANNOTATION_PREFIX) {
                pod.annotations.insert(a.to_string(), v.clone());
            } else if !k.starts_with("io.kubernetes.") && k != GRANT_KEY {
                pod.labels.insert(k.clone(), v.clone());
            }
        }
    }
    let name = labels
        .get(LABEL_CONTAINER_NAME)
        .cloned()
        .or_else(|| name_from_docker_name(docker_name))
        .unwrap_or_default();
    Some(ContainerInfo {
        id: docker_name.trim_start_matches('/').to_string(),
        name,
        pod,
        annotations: labels.clone(),
        ..Default::default()
    })
}

fn as_u64(v: Option<&Value>) -> Option<u64> {
    v.and_then(Value::as_u64)
}

fn as_i64(v: Option<&Value>) -> Option<i64> {
    v.and_then(Value::as_i64)
}

/// Reads the CPU/memory resources and cgroup parent of a `HostConfig` (create, inspect) or an
/// update body (same field names, flat). Absent or zero fields keep what `info` has.
pub fn apply_resources(info: &mut ContainerInfo, res: &Value) {
    if let Some(s) = as_u64(res.get("CpuShares")).filter(|s| *s > 0) {
        info.cpu_shares = Some(s);
    }
    if let Some(q) = as_i64(res.get("CpuQuota")).filter(|q| *q != 0) {
        info.cpu_quota = Some(q);
    }
    if let Some(p) = as_u64(res.get("CpuPeriod")).filter(|p| *p > 0) {
        info.cpu_period = Some(p);
    }
    if let Some(m) = as_i64(res.get("Memory")).filter(|m| *m > 0) {
        info.memory_limit = Some(m);
    }
    if let Some(cg) = res
        .get("CgroupParent")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        info.pod.cgroup_parent = Some(cg.to_string());
    }
}

fn env_of(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|e| e.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A [`ContainerInfo`] from a create body (`Labels`, `Env`, `HostConfig`); `None` for
/// non-Kubernetes containers and sandboxes.
pub fn info_from_create(
    docker_name: &str,
    body: &Value,
    sandbox_labels: Option<&HashMap<String, String>>,
) -> Option<ContainerInfo> {
    let labels = str_map(body.get("Labels"));
    let mut info = info_from_labels(docker_name, &labels, sandbox_labels)?;
    info.env = env_of(body.get("Env"));
    if let Some(hc) = body.get("HostConfig") {
        apply_resources(&mut info, hc);
    }
    Some(info)
}

/// A [`ContainerInfo`] from `GET /containers/{id}/json` (for restore), with its current cpuset.
pub fn info_from_inspect(
    inspect: &Value,
    sandbox_labels: Option<&HashMap<String, String>>,
) -> Option<ContainerInfo> {
    let name = inspect.get("Name").and_then(Value::as_str)?;
    let config = inspect.get("Config")?;
    let labels = str_map(config.get("Labels"));
    let mut info = info_from_labels(name, &labels, sandbox_labels)?;
    info.env = env_of(config.get("Env"));
    if let Some(hc) = inspect.get("HostConfig") {
        apply_resources(&mut info, hc);
        let s = |k: &str| hc.get(k).and_then(Value::as_str).unwrap_or("");
        info.cpus = runtime_cpus(&info.id, s("CpusetCpus"));
        info.mems = runtime_nodes(&info.id, s("CpusetMems"));
    }
    Some(info)
}

/// Writes the adjustment into a create body: `HostConfig.CpusetCpus/CpusetMems` and the grant
/// record as the label [`GRANT_KEY`]. Returns whether anything changed.
///
/// A `HostConfig` (or, with a record to write, `Labels`) that is there but neither an object
/// nor `null` is a body dockerd refuses; it is left as it came (nothing changed), so the
/// client gets dockerd's own answer rather than a container made without its host config.
pub fn rewrite_create(body: &mut Value, adj: &Adjustment) -> bool {
    if adj.cpus.is_none() && adj.mems.is_none() {
        return false;
    }
    let Some(obj) = body.as_object_mut() else {
        return false;
    };
    let malformed = |k: &str| obj.get(k).is_some_and(|v| !v.is_object() && !v.is_null());
    if malformed("HostConfig") || (adj.record.is_some() && malformed("Labels")) {
        return false;
    }
    let hc = obj
        .entry("HostConfig")
        .or_insert_with(|| Value::Object(Map::new()));
    if !hc.is_object() {
        *hc = Value::Object(Map::new());
    }
    if let Some(hc) = hc.as_object_mut() {
        if let Some(c) = &adj.cpus {
            hc.insert("CpusetCpus".into(), Value::String(c.to_string()));
        }
        if let Some(m) = &adj.mems {
            hc.insert("CpusetMems".into(), Value::String(m.to_string()));
        }
    }
    if let Some(rec) = &adj.record {
        let labels = obj
            .entry("Labels")
            .or_insert_with(|| Value::Object(Map::new()));
        if !labels.is_object() {
            *labels = Value::Object(Map::new());
        }
        if let Some(l) = labels.as_object_mut() {
            l.insert(GRANT_KEY.into(), Value::String(rec.clone()));
        }
    }
    true
}

/// Writes the adjustment into an update body (flat resources). Returns whether it changed.
pub fn rewrite_update(body: &mut Value, adj: &Adjustment) -> bool {
    let Some(obj) = body.as_object_mut() else {
        return false;
    };
    let mut changed = false;
    if let Some(c) = &adj.cpus {
        obj.insert("CpusetCpus".into(), Value::String(c.to_string()));
        changed = true;
    }
    if let Some(m) = &adj.mems {
        obj.insert("CpusetMems".into(), Value::String(m.to_string()));
        changed = true;
    }
    changed
}

/// The body of `POST /containers/{id}/update` that applies an [`Update`].
pub fn update_body(u: &Update) -> Value {
    let mut v = json!({ "CpusetCpus": u.cpus.to_string() });
    if let Some(m) = &u.mems {
        v["CpusetMems"] = Value::String(m.to_string());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::test_sets::*;

    fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn routes_versioned_and_plain_paths() {
        assert_eq!(
            route(&Method::POST, "/v1.41/containers/create"),
            Route::Create
        );
        assert_eq!(route(&Method::POST, "/containers/create"), Route::Create);
        assert_eq!(
            route(&Method::POST, "/v1.24/containers/abc123/update"),
            Route::Update("abc123".into())
        );
        assert_eq!(
            route(&Method::POST, "/containers/k8s_app_p_ns_u_0/stop"),
            Route::Stop("k8s_app_p_ns_u_0".into())
        );
        assert_eq!(
            route(&Method::DELETE, "/v1.41/containers/abc"),
            Route::Delete("abc".into())
        );
        // dockerd's own paths, /healthz and /_ping included, are dockerd's to answer.
        assert_eq!(route(&Method::GET, "/healthz"), Route::Other);
        assert_eq!(route(&Method::GET, "/_ping"), Route::Other);
        assert_eq!(route(&Method::GET, "/v1.41/containers/json"), Route::Other);
        assert_eq!(route(&Method::GET, "/containers/abc/json"), Route::Other);
        assert_eq!(route(&Method::POST, "/containers/abc/attach"), Route::Other);
        assert_eq!(route(&Method::GET, "/containers/create"), Route::Other);
        assert_eq!(
            route(&Method::POST, "/version1/containers/create"),
            Route::Other
        );
        assert_eq!(strip_version("/v1.41"), "/v1.41");
        assert_eq!(strip_version("/vx/containers"), "/vx/containers");
    }

    #[test]
    fn query_and_percent_decoding() {
        assert_eq!(
            query_param(Some("name=k8s_a%5Fb&platform="), "name").as_deref(),
            Some("k8s_a_b")
        );
        assert_eq!(query_param(Some("platform=x"), "name"), None);
        assert_eq!(query_param(None, "name"), None);
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("%zz"), "%zz");
    }

    #[test]
    fn kubernetes_labels_become_container_info() {
        let c = labels(&[
            (LABEL_POD_NAME, "web"),
            (LABEL_POD_NAMESPACE, "shop"),
            (LABEL_POD_UID, "u-1"),
            (LABEL_CONTAINER_NAME, "nginx"),
            (LABEL_DOCKER_TYPE, "container"),
            (LABEL_SANDBOX_ID, "sb1"),
            ("annotation.io.kubernetes.container.hash", "abc"),
        ]);
        let sb = labels(&[
            (LABEL_DOCKER_TYPE, "podsandbox"),
            ("app", "web"),
            ("tap.kunpeng.huawei.com/skip", "true"),
            ("annotation.tap.kunpeng.huawei.com/level", "numa"),
        ]);
        let info = info_from_labels("/k8s_nginx_web_shop_u-1_0", &c, Some(&sb)).unwrap();
        assert_eq!(info.id, "k8s_nginx_web_shop_u-1_0");
        assert_eq!(info.name, "nginx");
        assert_eq!(info.pod.name, "web");
        assert_eq!(info.pod.namespace, "shop");
        assert_eq!(info.pod.uid, "u-1");
        assert_eq!(info.pod.labels.get("app").map(String::as_str), Some("web"));
        assert!(info.pod.labels.contains_key("tap.kunpeng.huawei.com/skip"));
        assert!(!info
            .pod
            .labels
            .keys()
            .any(|k| k.starts_with("io.kubernetes")));
        assert_eq!(
            info.pod
                .annotations
                .get("tap.kunpeng.huawei.com/level")
                .map(String::as_str),
            Some("numa")
        );
        assert_eq!(
            info.pod
                .annotations
                .get("io.kubernetes.container.hash")
                .map(String::as_str),
            Some("abc")
        );
        // Sandboxes and plain containers are not ours.
        assert!(info_from_labels("x", &sb, None).is_none());
        assert!(info_from_labels("x", &labels(&[("app", "x")]), None).is_none());
        // dockershim-era labels without a type still count; the name comes from the k8s_ name.
        let old = labels(&[(LABEL_POD_NAME, "p"), (LABEL_CONTAINER_NAME, "")]);
        assert!(info_from_labels("k8s_c_p_ns_u_0", &old, None).is_some());
        let mut no_name = labels(&[(LABEL_DOCKER_TYPE, "container")]);
        no_name.insert(LABEL_POD_NAME.into(), "p".into());
        assert_eq!(
            info_from_labels("/k8s_side_p_ns_u_1", &no_name, None)
                .unwrap()
                .name,
            "side"
        );
    }

    fn create_body() -> Value {
        json!({
            "Image": "busybox",
            "Env": ["A=1", "VA_VISIBLE_DEVICES=0"],
            "Labels": {
                LABEL_POD_NAME: "web", LABEL_POD_NAMESPACE: "default", LABEL_POD_UID: "u",
                LABEL_CONTAINER_NAME: "app", LABEL_DOCKER_TYPE: "container"
            },
            "HostConfig": {
                "CpuShares": 4096, "CpuQuota": 800000, "CpuPeriod": 100000,
                "Memory": 1073741824, "CgroupParent": "/kubepods/burstable/podu",
                "CpusetCpus": "", "Binds": ["/a:/b"]
            }
        })
    }

    #[test]
    fn create_body_is_parsed_and_rewritten() {
        let mut v = create_body();
        let info = info_from_create("k8s_app_web_default_u_0", &v, None).unwrap();
        assert_fixture_resources(&info);
        assert_eq!(
            info.pod.cgroup_parent.as_deref(),
            Some("/kubepods/burstable/podu")
        );
        assert_eq!(info.env, vec!["A=1", "VA_VISIBLE_DEVICES=0"]);
        let adj = placed("0-23", "0", "v1;p=topology-aware");
        assert!(rewrite_create(&mut v, &adj));
        assert_eq!(v["HostConfig"]["CpusetCpus"], "0-23");
        assert_eq!(v["HostConfig"]["CpusetMems"], "0");
        assert_eq!(v["HostConfig"]["Binds"][0], "/a:/b");
        assert_eq!(v["HostConfig"]["CpuShares"], 4096);
        assert_eq!(v["Labels"][GRANT_KEY], "v1;p=topology-aware");
        assert_eq!(v["Labels"][LABEL_POD_NAME], "web");
        // Missing HostConfig/Labels are created; an empty adjustment changes nothing.
        let mut bare = json!({"Image": "x"});
        assert!(!rewrite_create(&mut bare, &Adjustment::default()));
        assert_eq!(bare, json!({"Image": "x"}));
        assert!(rewrite_create(&mut bare, &adj));
        assert_eq!(bare["HostConfig"]["CpusetCpus"], "0-23");
        assert_eq!(bare["Labels"][GRANT_KEY], "v1;p=topology-aware");
        // Not an object: left alone.
        let mut arr = json!([1]);
        assert!(!rewrite_create(&mut arr, &adj));
    }

    /// Caught by the rewrite property in tests/fuzz_docker.rs: a `HostConfig` or `Labels` that is
    /// not an object was replaced by `{}`, dropping what the client sent (dockerd would have
    /// refused the body; the rewrite turned it into a container without that host config).
    #[test]
    fn malformed_host_config_or_labels_are_forwarded_unchanged() {
        let adj = Adjustment {
            cpus: Some(cpu_set("0-3")),
            mems: None,
            record: Some("v1;r".into()),
            updates: vec![],
        };
        for body in [
            json!({"Image": "x", "HostConfig": "oops"}),
            json!({"Image": "x", "HostConfig": [1, 2]}),
            json!({"Image": "x", "HostConfig": {}, "Labels": 7}),
        ] {
            let mut v = body.clone();
            assert!(!rewrite_create(&mut v, &adj), "{body}");
            assert_eq!(v, body);
        }
        // Without a record to write, odd Labels do not matter.
        let mut v = json!({"HostConfig": {}, "Labels": 7});
        let cpus_only = Adjustment {
            record: None,
            ..adj.clone()
        };
        assert!(rewrite_create(&mut v, &cpus_only));
        assert_eq!(v, json!({"HostConfig": {"CpusetCpus": "0-3"}, "Labels": 7}));
        // null is absent to dockerd: it is replaced.
        let mut v = json!({"HostConfig": null, "Labels": null});
        assert!(rewrite_create(&mut v, &adj));
        assert_eq!(v["HostConfig"]["CpusetCpus"], "0-3");
        assert_eq!(v["Labels"][GRANT_KEY], "v1;r");
    }

    #[test]
    fn update_body_is_rewritten_and_resources_merge() {
        let mut info = info_from_create("k8s_app_web_default_u_0", &create_body(), None).unwrap();
        let mut up = json!({"CpuShares": 8192, "CpuQuota": 1600000});
        apply_resources(&mut info, &up);
        assert_eq!(info.cpu_shares, Some(8192));
        assert_eq!(info.cpu_quota, Some(1_600_000));
        assert_eq!(info.cpu_period, Some(100_000));
        assert_eq!(info.memory_limit, Some(1 << 30));
        let adj = Adjustment {
            cpus: Some(cpu_set("24-47")),
            ..Default::default()
        };
        assert!(rewrite_update(&mut up, &adj));
        assert_eq!(up["CpusetCpus"], "24-47");
        assert!(up.get("CpusetMems").is_none());
        let u = Update {
            container_id: "c".into(),
            cpus: cpu_set("1-3"),
            mems: Some(node_set("0")),
        };
        assert_eq!(
            update_body(&u),
            json!({"CpusetCpus": "1-3", "CpusetMems": "0"})
        );
    }

    #[test]
    fn inspect_gives_current_cpuset_and_record() {
        let v = json!({
            "Id": "abc",
            "Name": "/k8s_app_web_default_u_0",
            "Config": {"Labels": {
                LABEL_POD_NAME: "web", LABEL_DOCKER_TYPE: "container",
                LABEL_CONTAINER_NAME: "app", GRANT_KEY: "v1;rec"
            }, "Env": null},
            "HostConfig": {"CpusetCpus": "0-1", "CpusetMems": "", "CpuShares": 2}
        });
        let info = info_from_inspect(&v, None).unwrap();
        assert_eq!(info.id, "k8s_app_web_default_u_0");
        assert_eq!(shown(info.cpus).as_deref(), Some("0-1"));
        assert_eq!(info.mems, None);
        assert_eq!(info.cpu_shares, Some(2));
        assert_eq!(
            info.annotations.get(GRANT_KEY).map(String::as_str),
            Some("v1;rec")
        );
        assert!(!info.pod.labels.contains_key(GRANT_KEY));
        assert!(info_from_inspect(&json!({"Name": "/x"}), None).is_none());
    }
}
