//! CRI proxy mode (`--container-runtime-mode=Containerd`).
//!
//! Serves the CRI (v1) on a unix socket and forwards every call to the runtime's socket.
//! Calls pass through at the HTTP/2 level ([`grpc`]): not decoded, so streaming calls, methods
//! and fields newer than this build reach the runtime unchanged, and a pass-through call costs
//! no more than relaying its frames. Five calls are looked into:
//! - CreateContainer gets its cpuset (and mems) and the grant record annotation, written as an
//!   overlay after the kubelet's bytes (see [`grpc`]);
//! - UpdateContainerResources is re-placed the same way;
//! - StartContainer is forwarded unchanged, the loop's writes for that container held while
//!   it is out (containerd 1.7 loses a write that overlaps a start: [`Ledger::begin_start`]);
//! - StopContainer and RemoveContainer release (idempotently).
//!
//! At start the state is rebuilt from ListPodSandbox/PodSandboxStatus and
//! ListContainers/ContainerStatus (verbose).
//!
//! The engine knows a container by `<sandbox id>/<name>/<attempt>`, a key that exists before
//! the runtime assigns the container id (and that restore rebuilds from ContainerStatus); the
//! proxy maps ids to keys.

pub mod convert;
pub mod grpc;

pub use convert::*;

use crate::agent::{runtime_cpus, runtime_nodes, Agent, ContainerInfo, PodInfo, Update};
use crate::fail_open;
use crate::flags::Flags;
use crate::hook::Hook;
use crate::ledger::runtime::{LiveId, Runtime as LedgerRuntime};
use crate::ledger::state_file::StateFile;
use crate::ledger::{hook_span, Ledger, Listed, Release, WriteError, Writer};
use crate::proxy_server::{self, Serving};
use anyhow::Context;
use grpc::{error_response, read_unary, with_overlay, ProxyBody, Unary, Upstream};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use prost::Message;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Status};
use tracing::Instrument;

/// Message size limit both ways (the kubelet's).
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;
/// The longest any call the proxy makes on its own behalf may take (sandbox lookups, listing,
/// cpuset writes): a hung shim never holds a create, a restore or the loop for longer.
pub const OWN_CALL_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// The proxy.

#[derive(Clone)]
pub struct CriProxy {
    inner: Arc<Inner>,
}

struct Inner {
    ledger: Arc<Ledger>,
    /// Where the calls of the kubelet go, as HTTP/2 streams.
    upstream: Upstream,
    /// The calls the proxy makes itself (restore, sandbox lookups, updates of other containers).
    runtime: RuntimeServiceClient<Channel>,
}

/// A lazily connected channel to a unix socket.
pub fn unix_channel(path: &Path) -> anyhow::Result<Channel> {
    let path = path.to_path_buf();
    Ok(Endpoint::try_from("http://[::]:50051")?
        .connect_timeout(Duration::from_secs(10))
        .timeout(OWN_CALL_TIMEOUT)
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let p = path.clone();
            async move { tokio::net::UnixStream::connect(p).await.map(TokioIo::new) }
        })))
}

impl CriProxy {
    pub fn new(
        agent: Arc<Agent>,
        backend: &Path,
        state_dir: Option<&Path>,
    ) -> anyhow::Result<CriProxy> {
        let ch = unix_channel(backend)?;
        let file = state_dir.map(|d| StateFile::new(d.join("cri-grants.json")));
        Ok(CriProxy {
            inner: Arc::new(Inner {
                ledger: Ledger::shared(agent, file),
                upstream: Upstream::new(backend),
                runtime: RuntimeServiceClient::new(ch)
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            }),
        })
    }

    fn rt(&self) -> RuntimeServiceClient<Channel> {
        self.inner.runtime.clone()
    }

    fn agent(&self) -> &Agent {
        self.inner.ledger.agent()
    }

    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.inner.ledger
    }

    /// The Pod of every sandbox, by sandbox id.
    async fn pods(&self) -> anyhow::Result<HashMap<String, PodInfo>> {
        let sandboxes = self
            .rt()
            .list_pod_sandbox(cri::ListPodSandboxRequest::default())
            .await
            .context("ListPodSandbox")?
            .into_inner()
            .items;
        let mut pods: HashMap<String, PodInfo> = HashMap::new();
        for sb in sandboxes {
            let md = sb.metadata.clone().unwrap_or_default();
            let mut pod = PodInfo {
                uid: md.uid,
                name: md.name,
                namespace: md.namespace,
                labels: sb.labels.clone(),
                annotations: sb.annotations.clone(),
                cgroup_parent: None,
            };
            if let Ok(st) = self
                .rt()
                .pod_sandbox_status(cri::PodSandboxStatusRequest {
                    pod_sandbox_id: sb.id.clone(),
                    verbose: true,
                })
                .await
            {
                pod.cgroup_parent = cgroup_parent_from_verbose(&st.get_ref().info);
            }
            pods.insert(sb.id, pod);
        }
        Ok(pods)
    }

    /// The runtime's live containers (not exited).
    async fn live_containers(&self) -> anyhow::Result<Vec<cri::Container>> {
        Ok(self
            .rt()
            .list_containers(cri::ListContainersRequest::default())
            .await
            .context("ListContainers")?
            .into_inner()
            .containers
            .into_iter()
            .filter(|c| c.state != cri::ContainerState::ContainerExited as i32)
            .collect())
    }

    /// Rebuilds the state from the runtime. Returns how many containers were reported.
    pub async fn restore(&self) -> anyhow::Result<usize> {
        self.inner.ledger.restore_from(self).await
    }
}

impl proxy_server::Proxy for CriProxy {
    const KIND: &'static str = "CRI";

    fn ledger(&self) -> &Arc<Ledger> {
        CriProxy::ledger(self)
    }
}

#[async_trait::async_trait]
impl Writer for CriProxy {
    async fn write_cpuset(&self, u: &Update) -> Result<(), WriteError> {
        let req = cri::UpdateContainerResourcesRequest {
            container_id: u.container_id.clone(),
            linux: Some(cpuset_update(u)),
            ..Default::default()
        };
        match self.rt().update_container_resources(req).await {
            Ok(_) => Ok(()),
            Err(s) => Err(write_error(&s)),
        }
    }
}

/// A CRI error as a cpuset write's outcome.
fn write_error(s: &Status) -> WriteError {
    match s.code() {
        Code::NotFound => WriteError::NotFound,
        Code::Unavailable => WriteError::Unreachable(s.message().to_string()),
        Code::DeadlineExceeded | Code::Cancelled => WriteError::Timeout(OWN_CALL_TIMEOUT),
        _ => WriteError::Refused(format!("{:?}: {}", s.code(), s.message())),
    }
}

#[async_trait::async_trait]
impl LedgerRuntime for CriProxy {
    async fn live(&self) -> anyhow::Result<Vec<LiveId>> {
        Ok(self
            .live_containers()
            .await?
            .into_iter()
            .map(|c| {
                let md = c.metadata.unwrap_or_default();
                LiveId {
                    key: container_key(&c.pod_sandbox_id, &md.name, md.attempt),
                    running: c.state == cri::ContainerState::ContainerRunning as i32,
                    runtime_id: c.id,
                }
            })
            .collect())
    }

    async fn list(&self) -> anyhow::Result<Vec<Listed>> {
        let pods = self.pods().await?;
        let mut out = Vec::new();
        for c in self.live_containers().await? {
            let status = self
                .rt()
                .container_status(cri::ContainerStatusRequest {
                    container_id: c.id.clone(),
                    verbose: true,
                })
                .await;
            let Some(st) = listed(&c.id, status.map(|s| s.into_inner()))? else {
                continue;
            };
            let md = c.metadata.clone().unwrap_or_default();
            let mut info = ContainerInfo {
                id: container_key(&c.pod_sandbox_id, &md.name, md.attempt),
                name: md.name,
                pod: pods.get(&c.pod_sandbox_id).cloned().unwrap_or_default(),
                annotations: st
                    .status
                    .as_ref()
                    .map(|s| s.annotations.clone())
                    .unwrap_or_else(|| c.annotations.clone()),
                ..Default::default()
            };
            if let Some(r) = st
                .status
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.linux.as_ref())
            {
                apply_linux_resources(&mut info, r);
                if let Some(cpus) = runtime_cpus(&info.id, &r.cpuset_cpus) {
                    info.cpus = Some(cpus);
                }
                if let Some(mems) = runtime_nodes(&info.id, &r.cpuset_mems) {
                    info.mems = Some(mems);
                }
            }
            resources_from_verbose(&st.info, &mut info);
            out.push(Listed {
                runtime_id: c.id,
                info,
            });
        }
        Ok(out)
    }
}

/// A listed container's status: `None` when it was removed between the list and its status
/// call (NotFound); any other error fails the whole list, since it says nothing about whether
/// the container still runs (a transient error is never taken as "gone").
fn listed<T>(id: &str, status: Result<T, Status>) -> anyhow::Result<Option<T>> {
    match status {
        Ok(st) => Ok(Some(st)),
        Err(s) if s.code() == Code::NotFound => Ok(None),
        Err(s) => anyhow::bail!("ContainerStatus {id}: {:?} {}", s.code(), s.message()),
    }
}

impl CriProxy {
    fn observe(&self, method: &'static str, start: Instant) {
        self.agent()
            .metrics()
            .observe_proxy(method, start.elapsed());
    }
}

/// The CRI calls the proxy looks into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Intercept {
    Create,
    Update,
    Start,
    Stop,
    Remove,
}

impl Intercept {
    /// The hook's name in spans and metrics.
    fn hook(self) -> Hook {
        match self {
            Intercept::Create => Hook::Create,
            Intercept::Update => Hook::Update,
            Intercept::Start => Hook::Start,
            Intercept::Stop => Hook::Stop,
            Intercept::Remove => Hook::Remove,
        }
    }
}

const RUNTIME_SERVICE: &str = "/runtime.v1.RuntimeService/";
const IMAGE_SERVICE: &str = "/runtime.v1.ImageService/";

/// CRI v1 method names, for the metric label (anything else is `other`, so a client cannot
/// grow the label set).
const METHODS: &[&str] = &[
    "Version",
    "RunPodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "PodSandboxStatus",
    "ListPodSandbox",
    "CreateContainer",
    "StartContainer",
    "StopContainer",
    "RemoveContainer",
    "ListContainers",
    "ContainerStatus",
    "UpdateContainerResources",
    "ReopenContainerLog",
    "ExecSync",
    "Exec",
    "Attach",
    "PortForward",
    "ContainerStats",
    "ListContainerStats",
    "PodSandboxStats",
    "ListPodSandboxStats",
    "UpdateRuntimeConfig",
    "Status",
    "CheckpointContainer",
    "GetContainerEvents",
    "ListMetricDescriptors",
    "ListPodSandboxMetrics",
    "RuntimeConfig",
    "UpdatePodSandboxResources",
    "ListImages",
    "ImageStatus",
    "PullImage",
    "RemoveImage",
    "ImageFsInfo",
];

/// The metric label of a request path.
pub fn method_label(path: &str) -> &'static str {
    let name = path
        .strip_prefix(RUNTIME_SERVICE)
        .or_else(|| path.strip_prefix(IMAGE_SERVICE));
    name.and_then(|n| METHODS.iter().find(|m| **m == n).copied())
        .unwrap_or("other")
}

fn intercept_of(path: &str) -> Option<Intercept> {
    match path.strip_prefix(RUNTIME_SERVICE)? {
        "CreateContainer" => Some(Intercept::Create),
        "UpdateContainerResources" => Some(Intercept::Update),
        "StartContainer" => Some(Intercept::Start),
        "StopContainer" => Some(Intercept::Stop),
        "RemoveContainer" => Some(Intercept::Remove),
        _ => None,
    }
}

impl CriProxy {
    /// Answers one call of the kubelet.
    pub async fn handle(&self, req: hyper::Request<Incoming>) -> hyper::Response<ProxyBody> {
        let start = Instant::now();
        let path = req.uri().path();
        let method = method_label(path);
        let resp = match intercept_of(path) {
            None => self.inner.upstream.forward(req).await,
            Some(kind) => self.handle_intercepted(kind, req).await,
        };
        self.observe(method, start);
        resp
    }

    /// An intercepted call runs on a task of its own, to the end even if the kubelet gives up
    /// waiting: the runtime may have acted on the call, and the state must follow the
    /// runtime. `gone` tells the call whether the kubelet is still there to hear the answer.
    /// If the task fails before the runtime had the call, the call is forwarded unadjusted
    /// ([`fail_open`]).
    async fn handle_intercepted(
        &self,
        kind: Intercept,
        req: hyper::Request<Incoming>,
    ) -> hyper::Response<ProxyBody> {
        let mut call = match read_unary(req, MAX_MESSAGE).await {
            Ok(c) => c,
            Err(s) => return error_response(s),
        };
        let sent = fail_open::Sent::default();
        call.head.extensions.insert(sent.clone());
        let kept = call.clone();
        let gone = CancellationToken::new();
        let guard = gone.clone().drop_guard();
        let p = self.clone();
        let handler = async move { p.intercepted(kind, call, gone).await };
        let outcome = fail_open::run(kind.hook(), self.agent().metrics(), &sent, handler).await;
        guard.disarm();
        match outcome {
            fail_open::Outcome::Answered(r) => r,
            fail_open::Outcome::Forward => {
                let body = kept.body.clone();
                reply(self.send(kept, body).await)
            }
            fail_open::Outcome::Lost(e) => {
                error_response(Status::internal(format!("CRI proxy: {e}")))
            }
        }
    }

    async fn intercepted(
        &self,
        kind: Intercept,
        call: Unary<hyper::http::request::Parts>,
        gone: CancellationToken,
    ) -> hyper::Response<ProxyBody> {
        let hook = kind.hook();
        async move {
            match kind {
                Intercept::Create => self.create_container(call, gone).await,
                Intercept::Update => self.update_container_resources(call).await,
                Intercept::Start => self.start_container(call).await,
                Intercept::Stop => self.stop_or_remove(call, Release::Stopped).await,
                Intercept::Remove => self.stop_or_remove(call, Release::Removed).await,
            }
        }
        .instrument(hook_span(hook, "Containerd"))
        .await
    }

    /// The message of an intercepted call, or why it is forwarded without a look.
    fn decode_call<M: Message + Default>(
        &self,
        hook: Hook,
        call: &Unary<hyper::http::request::Parts>,
    ) -> Option<M> {
        let decoded = call
            .message()
            .map_err(|e| e.to_string())
            .and_then(|m| M::decode(m).map_err(|e| e.to_string()));
        match decoded {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(path = %call.head.uri.path(), "forwarded without adjustment: {e}");
                self.agent()
                    .metrics()
                    .count_error(hook, crate::metrics::ErrorKind::Request);
                None
            }
        }
    }

    /// Sends an intercepted call with `body` and returns the runtime's answer, read whole.
    async fn send(
        &self,
        call: Unary<hyper::http::request::Parts>,
        body: bytes::Bytes,
    ) -> Result<Unary<hyper::http::response::Parts>, Status> {
        fail_open::Sent::mark_in(&call.head.extensions);
        self.inner
            .upstream
            .call(call.into_request(body), MAX_MESSAGE)
            .await
    }

    async fn pod_of(&self, req: &cri::CreateContainerRequest) -> Option<PodInfo> {
        if let Some(sc) = &req.sandbox_config {
            return Some(pod_from_config(sc));
        }
        let st = self
            .rt()
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: req.pod_sandbox_id.clone(),
                verbose: true,
            })
            .await
            .ok()?
            .into_inner();
        let cgroup_parent = cgroup_parent_from_verbose(&st.info);
        let s = st.status.unwrap_or_default();
        let md = s.metadata.unwrap_or_default();
        Some(PodInfo {
            uid: md.uid,
            name: md.name,
            namespace: md.namespace,
            labels: s.labels,
            annotations: s.annotations,
            cgroup_parent,
        })
    }

    async fn create_container(
        &self,
        call: Unary<hyper::http::request::Parts>,
        gone: CancellationToken,
    ) -> hyper::Response<ProxyBody> {
        let original = call.body.clone();
        let Some(req) = self.decode_call::<cri::CreateContainerRequest>(Hook::Create, &call) else {
            return reply(self.send(call, original).await);
        };
        // An unknown sandbox is forwarded unmodified.
        let info = match self.pod_of(&req).await {
            Some(pod) => info_from_create(&req, pod),
            None => None,
        };
        let Some(info) = info else {
            return reply(self.send(call, original).await);
        };
        let ledger = &self.inner.ledger;
        if !ledger.agent().restored() {
            return reply(self.send(call, original).await);
        }
        let ticket = ledger.begin_create(info).await;
        let body = match create_overlay(&ticket.adjustment) {
            Some(overlay) => with_overlay(&original, &overlay).unwrap_or(original),
            None => original,
        };
        let res = self.send(call, body).await;
        let created = res
            .as_ref()
            .ok()
            .filter(|r| r.code() == Code::Ok)
            .map(|r| r.decode::<cri::CreateContainerResponse>());
        match created {
            Some(resp) => {
                let id = resp.map(|r| r.container_id).filter(|id| !id.is_empty());
                if id.is_none() {
                    tracing::warn!(
                        container = %ticket.key(),
                        "created, but the runtime's answer has no readable container id; \
                         the next reconcile learns it"
                    );
                }
                let key = ticket.key().to_string();
                ledger.commit_create(ticket, id);
                if gone.is_cancelled() {
                    // The kubelet gave up before the answer (its deadline): it never learns
                    // this container's id and creates another attempt; this one stays created
                    // and unstarted until the kubelet's garbage collection removes it. It
                    // holds no CPU, so its grant is released now.
                    tracing::warn!(
                        container = %key,
                        "the kubelet gave up on this create before the runtime answered; \
                         its grant is released (the container is never started)"
                    );
                    ledger
                        .agent()
                        .metrics()
                        .count_error(Hook::Create, crate::metrics::ErrorKind::Abandoned);
                    ledger.release(&key, Release::Stopped);
                }
            }
            // The runtime refused (or could not be reached): give the CPUs back.
            None => ledger.abort(ticket),
        }
        reply(res)
    }

    async fn update_container_resources(
        &self,
        call: Unary<hyper::http::request::Parts>,
    ) -> hyper::Response<ProxyBody> {
        let original = call.body.clone();
        let Some(req) =
            self.decode_call::<cri::UpdateContainerResourcesRequest>(Hook::Update, &call)
        else {
            return reply(self.send(call, original).await);
        };
        let Some(linux) = req.linux.as_ref() else {
            return reply(self.send(call, original).await);
        };
        let ledger = &self.inner.ledger;
        if !ledger.agent().restored() {
            return reply(self.send(call, original).await);
        }
        let ticket = ledger
            .begin_update(&req.container_id, |info| apply_linux_resources(info, linux))
            .await;
        let body = update_overlay(&ticket.adjustment)
            .and_then(|o| with_overlay(&original, &o).ok())
            .unwrap_or(original);
        let res = self.send(call, body).await;
        if matches!(&res, Ok(r) if r.code() == Code::Ok) {
            ledger.commit_update(ticket)
        } else {
            ledger.abort(ticket)
        }
        reply(res)
    }

    /// StartContainer, forwarded unchanged while the loop holds its writes for the container.
    async fn start_container(
        &self,
        call: Unary<hyper::http::request::Parts>,
    ) -> hyper::Response<ProxyBody> {
        let original = call.body.clone();
        let ledger = &self.inner.ledger;
        let started = self
            .decode_call::<cri::StartContainerRequest>(Hook::Start, &call)
            .and_then(|r| ledger.begin_start(&r.container_id));
        let res = self.send(call, original).await;
        if let Some(key) = started {
            ledger.end_start(&key);
        }
        reply(res)
    }

    async fn stop_or_remove(
        &self,
        call: Unary<hyper::http::request::Parts>,
        why: Release,
    ) -> hyper::Response<ProxyBody> {
        let original = call.body.clone();
        // StopContainerRequest and RemoveContainerRequest both carry the id as field 1.
        let id = self
            .decode_call::<cri::RemoveContainerRequest>(Hook::Remove, &call)
            .map(|r| r.container_id);
        let res = self.send(call, original).await;
        if let Some(id) = id {
            match res.as_ref().map(|r| r.code()) {
                Ok(Code::Ok) => self.inner.ledger.release(&id, why),
                Ok(Code::NotFound) => self.inner.ledger.release(&id, Release::Removed),
                _ => {}
            }
        }
        reply(res)
    }
}

/// The kubelet's answer to an intercepted call.
fn reply(res: Result<Unary<hyper::http::response::Parts>, Status>) -> hyper::Response<ProxyBody> {
    match res {
        Ok(r) => r.into_response(),
        Err(s) => error_response(s),
    }
}

/// Serves the CRI on `listener` until `shutdown`; connections then get up to `grace` to finish
/// their calls (a GetContainerEvents stream never does: it is closed then).
pub async fn serve(
    proxy: CriProxy,
    listener: tokio::net::UnixListener,
    shutdown: CancellationToken,
    grace: Duration,
) {
    serve_calls(listener, shutdown, grace, move |req| {
        let p = proxy.clone();
        async move { p.handle(req).await }
    })
    .await
}

/// Serves HTTP/2 on `listener`, each call answered by `handle`, as [`serve`] does (the same
/// windows and graceful stop). The start-path benchmark's pass-through relay
/// (`tap-cri-relay`, its row (g)) serves [`Upstream::forward`] with it: the proxy's transport
/// without the proxy's work.
pub async fn serve_calls<H, F>(
    listener: tokio::net::UnixListener,
    shutdown: CancellationToken,
    grace: Duration,
    handle: H,
) where
    H: Fn(hyper::Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = hyper::Response<ProxyBody>> + Send + 'static,
{
    let mut h2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    h2.initial_stream_window_size(grpc::STREAM_WINDOW)
        .initial_connection_window_size(grpc::CONNECTION_WINDOW);
    let h2 = Arc::new(h2);
    proxy_server::serve_connections(listener, shutdown, grace, move |stream, stop| {
        let handle = handle.clone();
        let h2 = h2.clone();
        async move {
            let svc = hyper::service::service_fn(move |req| {
                let f = handle(req);
                async move { Ok::<_, std::convert::Infallible>(f.await) }
            });
            let conn = h2.serve_connection(TokioIo::new(stream), svc);
            proxy_server::serve_until_stopped(conn, stop, "kubelet").await;
        }
    })
    .await;
}

/// Runs until `shutdown` is cancelled.
pub async fn run(
    flags: &Flags,
    agent: Arc<Agent>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let backend: PathBuf = flags.runtime_endpoint_path();
    let proxy = Arc::new(CriProxy::new(
        agent.clone(),
        &backend,
        Some(&flags.state_dir),
    )?);
    let runtime = format!("the CRI runtime at {}", backend.display());
    let Some(Serving { listener, loops }) =
        proxy_server::start(flags, agent.metrics(), &proxy, runtime, &shutdown).await?
    else {
        return Ok(());
    };
    serve((*proxy).clone(), listener, shutdown, flags.graceful_timeout).await;
    loops.finish(agent.metrics(), flags).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only NotFound means the container is gone; a transient error
    /// (unavailable, deadline, internal) fails the list instead of releasing a live container.
    #[test]
    fn only_not_found_means_gone() {
        assert_eq!(listed("c", Ok::<u8, Status>(1)).unwrap(), Some(1));
        assert_eq!(
            listed::<u8>("c", Err(Status::not_found("gone"))).unwrap(),
            None
        );
        for s in [
            Status::unavailable("connection reset"),
            Status::deadline_exceeded("slow"),
            Status::internal("shim"),
        ] {
            assert!(listed::<u8>("c", Err(s)).is_err());
        }
    }

    #[test]
    fn metric_labels_are_cri_method_names() {
        assert_eq!(
            method_label("/runtime.v1.RuntimeService/Version"),
            "Version"
        );
        assert_eq!(
            method_label("/runtime.v1.ImageService/PullImage"),
            "PullImage"
        );
        assert_eq!(
            method_label("/runtime.v1.RuntimeService/NotYetInvented"),
            "other"
        );
        assert_eq!(
            method_label("/runtime.v1alpha2.RuntimeService/Version"),
            "other"
        );
        assert_eq!(method_label("/"), "other");
        assert_eq!(
            intercept_of("/runtime.v1.RuntimeService/CreateContainer"),
            Some(Intercept::Create)
        );
        assert_eq!(
            intercept_of("/runtime.v1.RuntimeService/StartContainer"),
            Some(Intercept::Start)
        );
        assert_eq!(
            intercept_of("/runtime.v1.ImageService/CreateContainer"),
            None
        );
        assert_eq!(
            intercept_of("/runtime.v1.RuntimeService/ListContainers"),
            None
        );
    }
}
