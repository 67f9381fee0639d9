//! Docker Engine API proxy mode (`--container-runtime-mode=Docker`).
//!
//! A reverse proxy on a unix socket in front of dockerd, for kubelet with cri-dockerd (or the
//! old dockershim). It rewrites `POST /containers/create` of Kubernetes containers (cpuset and
//! the grant record label) and `POST /containers/{id}/update`, releases at stop and delete,
//! and passes every other call through unchanged: streaming responses (`logs -f`, `events`)
//! are streamed frame by frame, upgraded connections (`attach`, `exec` start) are spliced.
//!
//! Containers are known to the engine by their Docker name (`k8s_<container>_<pod>_…`), the
//! only key that exists before dockerd answers the create; the proxy maps ids to names.
//! A container without Kubernetes labels, a sandbox, or anything the proxy cannot parse is
//! forwarded unmodified: the proxy never refuses a request.

use crate::agent::{Adjustment, Agent, ContainerInfo, PodInfo, Update};
use crate::flags::Flags;
use crate::proxy_server::{bind_unix, restore_until_done, serve_connections};
use anyhow::Context;
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING, UPGRADE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tap_engine::request::GRANT_KEY;
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
pub const LABEL_DOCKER_TYPE: &str = "io.kubernetes.docker.type";
pub const LABEL_SANDBOX_ID: &str = "io.kubernetes.sandbox.id";
pub const ANNOTATION_PREFIX: &str = "annotation.";

type Body = BoxBody<Bytes, hyper::Error>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

// ---------------------------------------------------------------------------------------------
// Pure logic: routing, label parsing, body rewriting.

/// What the proxy does with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Healthz,
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
    if p == "/healthz" && (method == Method::GET || method == Method::HEAD) {
        return Route::Healthz;
    }
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

fn str_map(v: Option<&Value>) -> HashMap<String, String> {
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
        let s = |k: &str| {
            hc.get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        info.cpus = s("CpusetCpus");
        info.mems = s("CpusetMems");
    }
    Some(info)
}

/// Writes the adjustment into a create body: `HostConfig.CpusetCpus/CpusetMems` and the grant
/// record as the label [`GRANT_KEY`]. Returns whether anything changed.
pub fn rewrite_create(body: &mut Value, adj: &Adjustment) -> bool {
    if adj.cpus.is_none() && adj.mems.is_none() {
        return false;
    }
    let Some(obj) = body.as_object_mut() else {
        return false;
    };
    let hc = obj
        .entry("HostConfig")
        .or_insert_with(|| Value::Object(Map::new()));
    if !hc.is_object() {
        *hc = Value::Object(Map::new());
    }
    if let Some(hc) = hc.as_object_mut() {
        if let Some(c) = &adj.cpus {
            hc.insert("CpusetCpus".into(), Value::String(c.clone()));
        }
        if let Some(m) = &adj.mems {
            hc.insert("CpusetMems".into(), Value::String(m.clone()));
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
        obj.insert("CpusetCpus".into(), Value::String(c.clone()));
        changed = true;
    }
    if let Some(m) = &adj.mems {
        obj.insert("CpusetMems".into(), Value::String(m.clone()));
        changed = true;
    }
    changed
}

/// The body of `POST /containers/{id}/update` that applies an [`Update`].
pub fn update_body(u: &Update) -> Value {
    let mut v = json!({ "CpusetCpus": u.cpus });
    if let Some(m) = &u.mems {
        v["CpusetMems"] = Value::String(m.clone());
    }
    v
}

// ---------------------------------------------------------------------------------------------
// The proxy.

/// Grant records that changed after create (the runtime cannot update the label or annotation
/// it stores): engine key -> record, in a small JSON file under `--state-dir`, read at restore
/// in preference to the one stored at create. Writes are serialised and atomic (rename).
pub struct RecordFile {
    pub path: PathBuf,
    lock: Mutex<()>,
}

impl RecordFile {
    pub fn new(path: PathBuf) -> RecordFile {
        RecordFile {
            path,
            lock: Mutex::new(()),
        }
    }

    pub fn load(&self) -> HashMap<String, String> {
        match std::fs::read(&self.path) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::warn!(file = %self.path.display(), "ignoring unreadable grant records: {e}");
                HashMap::new()
            }),
            Err(_) => HashMap::new(),
        }
    }

    /// Sets (`Some`) or drops (`None`) the record of `key`.
    pub fn store(&self, key: &str, record: Option<&str>) -> std::io::Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut all = self.load();
        let changed = match record {
            Some(r) => all.insert(key.to_string(), r.to_string()).as_deref() != Some(r),
            None => all.remove(key).is_some(),
        };
        if !changed {
            return Ok(());
        }
        if let Some(d) = self.path.parent() {
            std::fs::create_dir_all(d)?;
        }
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(&all).unwrap_or_default())?;
        std::fs::rename(&tmp, &self.path)
    }
}

#[derive(Default)]
struct Known {
    /// Engine key (Docker name without `/`) -> what we know of the container.
    by_name: HashMap<String, ContainerInfo>,
    /// Docker id -> name.
    ids: HashMap<String, String>,
}

impl Known {
    /// The name of a managed container from an id, id prefix or name in a path.
    fn resolve(&self, id: &str) -> Option<String> {
        let id = id.trim_start_matches('/');
        if self.by_name.contains_key(id) {
            return Some(id.to_string());
        }
        if let Some(n) = self.ids.get(id) {
            return Some(n.clone());
        }
        if id.len() >= 4 && id.chars().all(|c| c.is_ascii_hexdigit()) {
            let mut hits = self.ids.iter().filter(|(full, _)| full.starts_with(id));
            if let (Some((_, n)), None) = (hits.next(), hits.next()) {
                return Some(n.clone());
            }
        }
        None
    }
}

pub struct DockerProxy {
    agent: Arc<Agent>,
    backend: PathBuf,
    known: Mutex<Known>,
    /// Grant records changed by an update (Docker labels are immutable after create).
    records: Option<RecordFile>,
}

impl DockerProxy {
    pub fn new(agent: Arc<Agent>, backend: PathBuf, state_dir: Option<&Path>) -> DockerProxy {
        DockerProxy {
            agent,
            backend,
            known: Mutex::new(Known::default()),
            records: state_dir.map(|d| RecordFile::new(d.join("docker-grants.json"))),
        }
    }

    fn load_records(&self) -> HashMap<String, String> {
        self.records
            .as_ref()
            .map(RecordFile::load)
            .unwrap_or_default()
    }

    /// Sets (`Some`) or drops (`None`) the stored record of a container.
    fn store_record(&self, name: &str, record: Option<&str>) {
        if let Some(f) = &self.records {
            if let Err(e) = f.store(name, record) {
                tracing::warn!(file = %f.path.display(), "cannot store the grant record: {e}");
                self.agent.metrics().count_error("update", "state");
            }
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends one request to dockerd on a fresh connection (upgrades allowed).
    async fn send(&self, req: Request<Body>) -> anyhow::Result<Response<Incoming>> {
        let stream = UnixStream::connect(&self.backend)
            .await
            .with_context(|| format!("connecting to {}", self.backend.display()))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP handshake with the runtime")?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!("runtime connection ended: {e}");
            }
        });
        Ok(sender.send_request(req).await?)
    }

    /// A JSON call of the proxy's own (restore, updates of other containers).
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let mut b = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "docker");
        let body = match body {
            Some(v) => {
                b = b.header(CONTENT_TYPE, "application/json");
                full(serde_json::to_vec(&v)?)
            }
            None => full(Bytes::new()),
        };
        let resp = self.send(b.body(body)?).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let v = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        Ok((status, v))
    }

    async fn apply_updates(&self, updates: &[Update]) {
        for u in updates {
            let path = format!("/containers/{}/update", u.container_id);
            match self.call(Method::POST, &path, Some(update_body(u))).await {
                Ok((s, _)) if s.is_success() => {
                    tracing::info!(container = %u.container_id, cpus = %u.cpus, "cpuset updated")
                }
                Ok((s, v)) => {
                    tracing::warn!(container = %u.container_id, status = %s, "cpuset update refused: {v}");
                    self.agent.metrics().count_error("update", "runtime");
                }
                Err(e) => {
                    tracing::warn!(container = %u.container_id, "cpuset update failed: {e:#}");
                    self.agent.metrics().count_error("update", "runtime");
                }
            }
        }
    }

    async fn labels_of(&self, id: &str) -> Option<HashMap<String, String>> {
        let (s, v) = self
            .call(Method::GET, &format!("/containers/{id}/json"), None)
            .await
            .ok()?;
        s.is_success()
            .then(|| str_map(v.get("Config").and_then(|c| c.get("Labels"))))
    }

    /// Rebuilds the state from the running containers (`GET /containers/json` + inspect).
    pub async fn restore(&self) -> anyhow::Result<usize> {
        let (s, list) = self.call(Method::GET, "/containers/json", None).await?;
        anyhow::ensure!(s.is_success(), "listing containers: {s} {list}");
        let list = list.as_array().cloned().unwrap_or_default();
        let mut sandboxes: HashMap<String, HashMap<String, String>> = HashMap::new();
        let mut candidates = Vec::new();
        for c in &list {
            let id = c.get("Id").and_then(Value::as_str).unwrap_or_default();
            let labels = str_map(c.get("Labels"));
            if labels.get(LABEL_DOCKER_TYPE).map(String::as_str) == Some("podsandbox") {
                sandboxes.insert(id.to_string(), labels);
            } else if is_k8s_container(&labels) {
                candidates.push((id.to_string(), labels));
            }
        }
        let records = self.load_records();
        let mut infos = Vec::new();
        let mut ids = HashMap::new();
        for (id, labels) in candidates {
            let (s, inspect) = self
                .call(Method::GET, &format!("/containers/{id}/json"), None)
                .await?;
            if !s.is_success() {
                continue; // gone meanwhile
            }
            let sandbox = labels
                .get(LABEL_SANDBOX_ID)
                .and_then(|sid| sandboxes.get(sid));
            if let Some(mut info) = info_from_inspect(&inspect, sandbox) {
                if let Some(r) = records.get(&info.id) {
                    info.annotations.insert(GRANT_KEY.into(), r.clone());
                }
                ids.insert(id, info.id.clone());
                infos.push(info);
            }
        }
        let updates = self.agent.restore(&infos);
        {
            let mut k = self.known();
            for info in &infos {
                k.by_name.insert(info.id.clone(), info.clone());
            }
            k.ids.extend(ids);
        }
        self.apply_updates(&updates).await;
        Ok(infos.len())
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let start = Instant::now();
        let r = route(req.method(), req.uri().path());
        let label = match &r {
            Route::Healthz => return text(StatusCode::OK, "ok"),
            Route::Create => Some("create"),
            Route::Update(_) => Some("update"),
            Route::Stop(_) => Some("stop"),
            Route::Delete(_) => Some("delete"),
            Route::Other => None,
        };
        let resp = match r {
            Route::Create => self.create(req).await,
            Route::Update(id) => self.update(req, &id).await,
            Route::Stop(id) | Route::Delete(id) => self.release(req, &id).await,
            _ => self.pass(req).await,
        };
        if let Some(l) = label {
            self.agent.metrics().observe_proxy(l, start.elapsed());
        }
        resp
    }

    /// Forwards unchanged; splices the two connections when dockerd upgrades (attach, exec).
    async fn pass(&self, mut req: Request<Incoming>) -> Response<Body> {
        let client_up = req
            .headers()
            .contains_key(UPGRADE)
            .then(|| hyper::upgrade::on(&mut req));
        let req = req.map(|b| b.boxed());
        match self.send(req).await {
            Ok(mut resp) => {
                if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
                    if let Some(client_up) = client_up {
                        let backend_up = hyper::upgrade::on(&mut resp);
                        tokio::spawn(async move {
                            match tokio::try_join!(client_up, backend_up) {
                                Ok((c, b)) => {
                                    let (mut c, mut b) = (TokioIo::new(c), TokioIo::new(b));
                                    if let Err(e) =
                                        tokio::io::copy_bidirectional(&mut c, &mut b).await
                                    {
                                        tracing::debug!("upgraded stream ended: {e}");
                                    }
                                }
                                Err(e) => tracing::debug!("upgrade failed: {e}"),
                            }
                        });
                    }
                }
                resp.map(|b| b.boxed())
            }
            Err(e) => bad_gateway(&e),
        }
    }

    async fn create(&self, req: Request<Incoming>) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        let bytes = match body.collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return text(StatusCode::BAD_REQUEST, &format!("reading body: {e}")),
        };
        let name = query_param(parts.uri.query(), "name").unwrap_or_default();
        let mut adjusted: Option<(ContainerInfo, Adjustment)> = None;
        let mut out = bytes.clone();
        if let Ok(mut v) = serde_json::from_slice::<Value>(&bytes) {
            let labels = str_map(v.get("Labels"));
            if is_k8s_container(&labels) && !name.is_empty() {
                let sandbox = match labels.get(LABEL_SANDBOX_ID) {
                    Some(sid) => self.labels_of(sid).await,
                    None => None,
                };
                if let Some(info) = info_from_create(&name, &v, sandbox.as_ref()) {
                    let adj = self.agent.create(&info);
                    if rewrite_create(&mut v, &adj) {
                        match serde_json::to_vec(&v) {
                            Ok(b) => out = Bytes::from(b),
                            Err(e) => tracing::warn!("re-encoding the create body: {e}"),
                        }
                    }
                    adjusted = Some((info, adj));
                }
            }
        } else {
            tracing::debug!("create body is not JSON; forwarded unmodified");
        }
        parts.headers.remove(TRANSFER_ENCODING);
        parts
            .headers
            .insert(CONTENT_LENGTH, HeaderValue::from(out.len()));
        let resp = match self.send(Request::from_parts(parts, full(out))).await {
            Ok(r) => r,
            Err(e) => {
                if let Some((info, _)) = &adjusted {
                    let ups = self.agent.remove(&info.id);
                    self.apply_updates(&ups).await;
                }
                return bad_gateway(&e);
            }
        };
        let Some((mut info, adj)) = adjusted else {
            return resp.map(|b| b.boxed());
        };
        let (rparts, rbody) = resp.into_parts();
        let rbytes = match rbody.collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return bad_gateway(&anyhow::anyhow!("reading the runtime's answer: {e}")),
        };
        if rparts.status.is_success() {
            let id = serde_json::from_slice::<Value>(&rbytes)
                .ok()
                .and_then(|v| v.get("Id").and_then(Value::as_str).map(str::to_string));
            info.cpus = adj.cpus.clone();
            info.mems = adj.mems.clone();
            {
                let mut k = self.known();
                if let Some(id) = id {
                    k.ids.insert(id, info.id.clone());
                }
                k.by_name.insert(info.id.clone(), info);
            }
            self.apply_updates(&adj.updates).await;
        } else {
            // The runtime refused: give the CPUs back.
            let ups = self.agent.remove(&info.id);
            self.apply_updates(&ups).await;
        }
        Response::from_parts(rparts, full(rbytes))
    }

    async fn update(&self, req: Request<Incoming>, id: &str) -> Response<Body> {
        let Some(name) = self.known().resolve(id) else {
            return self.pass(req).await;
        };
        let (mut parts, body) = req.into_parts();
        let bytes = match body.collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return text(StatusCode::BAD_REQUEST, &format!("reading body: {e}")),
        };
        let mut out = bytes.clone();
        let mut updates = Vec::new();
        if let Ok(mut v) = serde_json::from_slice::<Value>(&bytes) {
            let info = self.known().by_name.get(&name).cloned();
            if let Some(mut info) = info {
                apply_resources(&mut info, &v);
                let adj = self.agent.update(&info);
                if rewrite_update(&mut v, &adj) {
                    if let Ok(b) = serde_json::to_vec(&v) {
                        out = Bytes::from(b);
                    }
                    info.cpus = adj.cpus.clone();
                    info.mems = adj.mems.clone().or(info.mems);
                }
                if let Some(rec) = &adj.record {
                    info.annotations.insert(GRANT_KEY.into(), rec.clone());
                    self.store_record(&name, Some(rec));
                }
                self.known().by_name.insert(name.clone(), info);
                updates = adj.updates;
            }
        }
        parts.headers.remove(TRANSFER_ENCODING);
        parts
            .headers
            .insert(CONTENT_LENGTH, HeaderValue::from(out.len()));
        let resp = match self.send(Request::from_parts(parts, full(out))).await {
            Ok(r) => r,
            Err(e) => return bad_gateway(&e),
        };
        self.apply_updates(&updates).await;
        resp.map(|b| b.boxed())
    }

    /// Stop and delete: forward, then release on success (or when already stopped/gone).
    async fn release(&self, req: Request<Incoming>, id: &str) -> Response<Body> {
        let is_delete = req.method() == Method::DELETE;
        let name = self.known().resolve(id);
        let resp = self.pass(req).await;
        if let Some(name) = name {
            let s = resp.status();
            let released = s.is_success()
                || s == StatusCode::NOT_MODIFIED
                || (is_delete && s == StatusCode::NOT_FOUND);
            if released {
                let ups = self.agent.remove(&name);
                self.store_record(&name, None);
                if is_delete || s == StatusCode::NOT_FOUND {
                    let mut k = self.known();
                    k.by_name.remove(&name);
                    k.ids.retain(|_, n| *n != name);
                }
                self.apply_updates(&ups).await;
            }
        }
        resp
    }
}

fn text(status: StatusCode, msg: &str) -> Response<Body> {
    let mut r = Response::new(full(msg.to_string()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

fn bad_gateway(e: &anyhow::Error) -> Response<Body> {
    tracing::warn!("runtime unreachable: {e:#}");
    let body = json!({ "message": format!("kunpeng-tap proxy: runtime unreachable: {e:#}") });
    let mut r = Response::new(full(body.to_string()));
    *r.status_mut() = StatusCode::BAD_GATEWAY;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// Runs until `shutdown` is cancelled.
pub async fn run(
    flags: &Flags,
    agent: Arc<Agent>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let proxy = Arc::new(DockerProxy::new(
        agent.clone(),
        flags.runtime_endpoint_path(),
        Some(&flags.state_dir),
    ));
    if !restore_until_done(agent.metrics(), "dockerd", &shutdown, || proxy.restore()).await {
        return Ok(());
    }
    let listener = bind_unix(&flags.runtime_proxy_endpoint)?;
    agent.metrics().proxy_up.set(1);
    agent.metrics().runtime_connected.set(1);
    agent.metrics().set_ready(true);
    tracing::info!(socket = %flags.runtime_proxy_endpoint.display(), backend = %flags.runtime_endpoint_path().display(), "Docker proxy serving");
    serve_connections(
        listener,
        shutdown,
        flags.graceful_timeout,
        move |stream, stop| {
            let p = proxy.clone();
            async move {
                let svc = hyper::service::service_fn(move |req| {
                    let p = p.clone();
                    async move { Ok::<_, std::convert::Infallible>(p.handle(req).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .with_upgrades();
                tokio::pin!(conn);
                tokio::select! {
                    r = conn.as_mut() => if let Err(e) = r { tracing::debug!("client connection: {e}") },
                    _ = stop.cancelled() => {
                        conn.as_mut().graceful_shutdown();
                        let _ = conn.await;
                    }
                }
            }
        },
    )
    .await;
    agent.metrics().proxy_up.set(0);
    let _ = std::fs::remove_file(&flags.runtime_proxy_endpoint);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(route(&Method::GET, "/healthz"), Route::Healthz);
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
        assert_eq!(info.cpu_shares, Some(4096));
        assert_eq!(info.cpu_quota, Some(800_000));
        assert_eq!(info.cpu_period, Some(100_000));
        assert_eq!(info.memory_limit, Some(1 << 30));
        assert_eq!(
            info.pod.cgroup_parent.as_deref(),
            Some("/kubepods/burstable/podu")
        );
        assert_eq!(info.env, vec!["A=1", "VA_VISIBLE_DEVICES=0"]);
        let adj = Adjustment {
            cpus: Some("0-23".into()),
            mems: Some("0".into()),
            record: Some("v1;p=topology-aware".into()),
            updates: vec![],
        };
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
            cpus: Some("24-47".into()),
            ..Default::default()
        };
        assert!(rewrite_update(&mut up, &adj));
        assert_eq!(up["CpusetCpus"], "24-47");
        assert!(up.get("CpusetMems").is_none());
        let u = Update {
            container_id: "c".into(),
            cpus: "1-3".into(),
            mems: Some("0".into()),
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
        assert_eq!(info.cpus.as_deref(), Some("0-1"));
        assert_eq!(info.mems, None);
        assert_eq!(info.cpu_shares, Some(2));
        assert_eq!(
            info.annotations.get(GRANT_KEY).map(String::as_str),
            Some("v1;rec")
        );
        assert!(!info.pod.labels.contains_key(GRANT_KEY));
        assert!(info_from_inspect(&json!({"Name": "/x"}), None).is_none());
    }

    #[test]
    fn record_file_sets_replaces_and_drops() {
        let dir = std::env::temp_dir().join(format!("tap-recfile-{}", std::process::id()));
        let f = RecordFile::new(dir.join("sub/grants.json"));
        assert!(f.load().is_empty());
        f.store("a", Some("v1;1")).unwrap();
        f.store("b", Some("v1;2")).unwrap();
        f.store("a", Some("v1;3")).unwrap();
        f.store("c", None).unwrap();
        let all = f.load();
        assert_eq!(all.get("a").map(String::as_str), Some("v1;3"));
        assert_eq!(all.len(), 2);
        f.store("a", None).unwrap();
        assert_eq!(f.load().keys().collect::<Vec<_>>(), vec!["b"]);
        std::fs::write(&f.path, "not json").unwrap();
        assert!(f.load().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ids_resolve_by_name_full_id_and_unique_prefix() {
        let mut k = Known::default();
        k.by_name.insert("k8s_a".into(), ContainerInfo::default());
        k.ids.insert("abcdef0123".into(), "k8s_a".into());
        k.ids.insert("abcfff0000".into(), "k8s_b".into());
        assert_eq!(k.resolve("k8s_a").as_deref(), Some("k8s_a"));
        assert_eq!(k.resolve("/k8s_a").as_deref(), Some("k8s_a"));
        assert_eq!(k.resolve("abcdef0123").as_deref(), Some("k8s_a"));
        assert_eq!(k.resolve("abcd").as_deref(), Some("k8s_a"));
        assert_eq!(k.resolve("abc"), None); // too short
        assert_eq!(k.resolve("abcf").as_deref(), Some("k8s_b"));
        assert_eq!(k.resolve("ab00"), None);
        assert_eq!(k.resolve("other"), None);
    }
}
