//! Docker Engine API proxy mode (`--container-runtime-mode=Docker`).
//!
//! A reverse proxy on a unix socket in front of dockerd, for kubelet with cri-dockerd (or the
//! old dockershim). It rewrites `POST /containers/create` of Kubernetes containers (cpuset and
//! the grant record label) and `POST /containers/{id}/update`, releases at stop and delete,
//! and passes every other call through unchanged: streaming responses (`logs -f`, `events`)
//! are streamed frame by frame, upgraded connections (`attach`, `exec` start) are spliced.
//!
//! Containers are known to the ledger by their Docker name (`k8s_<container>_<pod>_…`), the
//! only key that exists before dockerd answers the create. A container without Kubernetes
//! labels, a sandbox, a body larger than [`MAX_BODY`] or anything the proxy cannot parse is
//! forwarded unmodified: the proxy never refuses a request.

pub mod convert;

pub use convert::*;

use crate::agent::{Agent, Update};
use crate::fail_open;
use crate::flags::Flags;
use crate::hook::Hook;
use crate::ledger::runtime::{LiveId, Runtime as LedgerRuntime};
use crate::ledger::state_file::StateFile;
use crate::ledger::{hook_span, Ledger, Listed, Release, WriteError, Writer};
use crate::proxy_server::{self, serve_connections, Serving};
use anyhow::Context;
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{combinators::BoxBody, BodyExt, BodyStream, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING, UPGRADE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The longest any call the proxy makes on its own behalf may take (sandbox labels, listing,
/// inspecting, cpuset writes).
pub const OWN_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `GET /containers/json` of Kubernetes containers and sandboxes only (both carry
/// `io.kubernetes.docker.type`), created or exited included.
const LIST_K8S: &str =
    "/containers/json?all=1&filters=%7B%22label%22%3A%5B%22io.kubernetes.docker.type%22%5D%7D";

/// The largest create or update body the proxy reads to rewrite (as for NRI frames and CRI
/// messages); a larger one is streamed through unmodified.
pub const MAX_BODY: usize = 16 * 1024 * 1024;

type Body = BoxBody<Bytes, hyper::Error>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

/// A request body read up to a bound.
enum Read {
    Whole(Bytes),
    /// Over the bound: what was read, and the rest still to come.
    TooLarge(Vec<Bytes>, Incoming),
    Failed(hyper::Error),
}

async fn read_bounded(mut body: Incoming, limit: usize) -> Read {
    let mut chunks = Vec::new();
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Ok(data) = f.into_data() {
                    len = len.saturating_add(data.len());
                    chunks.push(data);
                    if len > limit {
                        return Read::TooLarge(chunks, body);
                    }
                }
            }
            Err(e) => return Read::Failed(e),
        }
    }
    Read::Whole(chunks.concat().into())
}

/// The body of a request that was partly read: what was read, then the rest as it comes.
fn resumed(prefix: Vec<Bytes>, rest: Incoming) -> Body {
    let head = futures_util::stream::iter(
        prefix
            .into_iter()
            .map(|b| Ok::<_, hyper::Error>(Frame::data(b))),
    );
    BodyExt::boxed(StreamBody::new(head.chain(BodyStream::new(rest))))
}

pub struct DockerProxy {
    ledger: Arc<Ledger>,
    backend: PathBuf,
}

impl DockerProxy {
    pub fn new(agent: Arc<Agent>, backend: PathBuf, state_dir: Option<&Path>) -> DockerProxy {
        let file = state_dir.map(|d| StateFile::new(d.join("docker-grants.json")));
        DockerProxy {
            ledger: Ledger::shared(agent, file),
            backend,
        }
    }

    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    fn agent(&self) -> &Agent {
        self.ledger.agent()
    }

    /// Sends one request to dockerd on a fresh connection (upgrades allowed).
    async fn send(&self, req: Request<Body>) -> anyhow::Result<Response<Incoming>> {
        fail_open::Sent::mark_in(req.extensions());
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

    /// A JSON call of the proxy's own (restore, updates of other containers), under
    /// [`OWN_CALL_TIMEOUT`].
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(StatusCode, Value)> {
        match tokio::time::timeout(OWN_CALL_TIMEOUT, self.call_untimed(method, path, body)).await {
            Ok(r) => r,
            Err(_) => anyhow::bail!("{path}: no answer from dockerd within {OWN_CALL_TIMEOUT:?}"),
        }
    }

    async fn call_untimed(
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

    async fn labels_of(&self, id: &str) -> Option<HashMap<String, String>> {
        let (s, v) = self
            .call(Method::GET, &format!("/containers/{id}/json"), None)
            .await
            .ok()?;
        s.is_success()
            .then(|| str_map(v.get("Config").and_then(|c| c.get("Labels"))))
    }

    /// Every Kubernetes container and sandbox dockerd has, created or exited.
    async fn all_containers(&self) -> anyhow::Result<Vec<Value>> {
        let (s, list) = self.call(Method::GET, LIST_K8S, None).await?;
        anyhow::ensure!(s.is_success(), "listing containers: {s} {list}");
        Ok(list.as_array().cloned().unwrap_or_default())
    }

    /// Rebuilds the state from dockerd. Returns how many containers were reported.
    pub async fn restore(&self) -> anyhow::Result<usize> {
        self.ledger.restore_from(self).await
    }
}

/// A live (not exited) Kubernetes container of a `GET /containers/json` entry: id, name, labels.
fn live_k8s(c: &Value) -> Option<(String, String, HashMap<String, String>)> {
    let state = c.get("State").and_then(Value::as_str).unwrap_or("running");
    if !matches!(state, "created" | "running" | "paused" | "restarting") {
        return None;
    }
    let labels = str_map(c.get("Labels"));
    if !is_k8s_container(&labels) {
        return None;
    }
    let id = c.get("Id").and_then(Value::as_str)?.to_string();
    let name = c
        .get("Names")
        .and_then(Value::as_array)
        .and_then(|n| n.first())
        .and_then(Value::as_str)?
        .trim_start_matches('/')
        .to_string();
    Some((id, name, labels))
}

#[async_trait::async_trait]
impl Writer for DockerProxy {
    async fn write_cpuset(&self, u: &Update) -> Result<(), WriteError> {
        let path = format!("/containers/{}/update", u.container_id);
        match self.call(Method::POST, &path, Some(update_body(u))).await {
            Ok((s, _)) if s.is_success() => Ok(()),
            Ok((StatusCode::NOT_FOUND, _)) => Err(WriteError::NotFound),
            Ok((s, v)) => Err(WriteError::Refused(format!("{s} {v}"))),
            Err(e) => Err(WriteError::Unreachable(format!("{e:#}"))),
        }
    }
}

impl proxy_server::Proxy for DockerProxy {
    const KIND: &'static str = "Docker";

    fn ledger(&self) -> &Arc<Ledger> {
        DockerProxy::ledger(self)
    }
}

#[async_trait::async_trait]
impl LedgerRuntime for DockerProxy {
    async fn live(&self) -> anyhow::Result<Vec<LiveId>> {
        Ok(self
            .all_containers()
            .await?
            .iter()
            .filter_map(|c| {
                let running = c.get("State").and_then(Value::as_str) != Some("created");
                live_k8s(c).map(|(runtime_id, key, _)| LiveId {
                    key,
                    runtime_id,
                    running,
                })
            })
            .collect())
    }

    async fn list(&self) -> anyhow::Result<Vec<Listed>> {
        let all = self.all_containers().await?;
        let sandboxes: HashMap<String, HashMap<String, String>> = all
            .iter()
            .filter_map(|c| {
                let labels = str_map(c.get("Labels"));
                let id = c.get("Id").and_then(Value::as_str)?;
                (labels.get(LABEL_DOCKER_TYPE).map(String::as_str) == Some("podsandbox"))
                    .then(|| (id.to_string(), labels))
            })
            .collect();
        let mut out = Vec::new();
        for (id, _, labels) in all.iter().filter_map(live_k8s) {
            let (s, inspect) = self
                .call(Method::GET, &format!("/containers/{id}/json"), None)
                .await?;
            if !inspected(&id, s, &inspect)? {
                continue;
            }
            let sandbox = labels
                .get(LABEL_SANDBOX_ID)
                .and_then(|sid| sandboxes.get(sid));
            if let Some(info) = info_from_inspect(&inspect, sandbox) {
                out.push(Listed {
                    runtime_id: id,
                    info,
                });
            }
        }
        Ok(out)
    }
}

/// Whether a listed container's inspection describes it: `false` when it was removed between
/// the list and the inspection (404); any other failure fails the whole list, since it says
/// nothing about whether the container still runs (never taken as "gone").
fn inspected(id: &str, status: StatusCode, body: &Value) -> anyhow::Result<bool> {
    match status {
        s if s.is_success() => Ok(true),
        StatusCode::NOT_FOUND => Ok(false),
        s => anyhow::bail!("inspecting {id}: {s} {body}"),
    }
}

impl DockerProxy {
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let start = Instant::now();
        let r = route(req.method(), req.uri().path());
        let label = match &r {
            Route::Create => Some(Hook::Create),
            Route::Update(_) => Some(Hook::Update),
            Route::Stop(_) => Some(Hook::Stop),
            Route::Delete(_) => Some(Hook::Delete),
            Route::Other => None,
        };
        let resp = match (r, label) {
            (Route::Other, _) | (_, None) => self.pass(req).await,
            (r, Some(l)) => self.clone().intercepted(r, l, req).await,
        };
        if let Some(l) = label {
            self.agent()
                .metrics()
                .observe_proxy(l.as_str(), start.elapsed());
        }
        resp
    }

    /// An intercepted call, read whole, runs on a task of its own to the end even if the client
    /// goes away: the runtime may have acted on the call, and the ledger must follow it. If
    /// the task fails before dockerd had the call, the call is forwarded unadjusted
    /// ([`fail_open`]).
    async fn intercepted(
        self: Arc<Self>,
        r: Route,
        hook: Hook,
        req: Request<Incoming>,
    ) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        let sent = fail_open::Sent::default();
        parts.extensions.insert(sent.clone());
        let (parts, bytes) = match self.read_body(hook, parts, body).await {
            Ok(pb) => pb,
            Err(resp) => return resp,
        };
        let kept = (parts.clone(), bytes.clone());
        let p = self.clone();
        let call = async move {
            match r {
                Route::Create => p.create(parts, bytes).await,
                Route::Update(id) => p.update(parts, bytes, &id).await,
                Route::Stop(id) | Route::Delete(id) => p.release(parts, bytes, &id).await,
                Route::Other => p.forward(parts, bytes).await,
            }
        };
        let call = call.instrument(hook_span(hook, "Docker"));
        match fail_open::run(hook, self.agent().metrics(), &sent, call).await {
            fail_open::Outcome::Answered(r) => r,
            fail_open::Outcome::Forward => self.forward(kept.0, kept.1).await,
            fail_open::Outcome::Lost(e) => bad_gateway(&anyhow::anyhow!("Docker proxy: {e}")),
        }
    }

    /// Sends a body read whole, unchanged.
    async fn forward(&self, parts: hyper::http::request::Parts, bytes: Bytes) -> Response<Body> {
        match self.send_body(parts, bytes).await {
            Ok(r) => r.map(|b| b.boxed()),
            Err(e) => bad_gateway(&e),
        }
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

    /// Reads a body to rewrite. `Err` is the answer when the body is too large (forwarded
    /// unmodified) or cannot be read.
    async fn read_body(
        &self,
        hook: Hook,
        parts: hyper::http::request::Parts,
        body: Incoming,
    ) -> Result<(hyper::http::request::Parts, Bytes), Response<Body>> {
        match read_bounded(body, MAX_BODY).await {
            Read::Whole(b) => Ok((parts, b)),
            Read::TooLarge(prefix, rest) => {
                tracing::warn!(
                    limit = MAX_BODY,
                    path = %parts.uri.path(),
                    "body too large to rewrite; forwarded unmodified"
                );
                self.agent()
                    .metrics()
                    .count_error(hook, crate::metrics::ErrorKind::TooLarge);
                let req = Request::from_parts(parts, resumed(prefix, rest));
                Err(match self.send(req).await {
                    Ok(r) => r.map(|b| b.boxed()),
                    Err(e) => bad_gateway(&e),
                })
            }
            Read::Failed(e) => Err(text(StatusCode::BAD_REQUEST, &format!("reading body: {e}"))),
        }
    }

    /// Sends a rewritten body.
    async fn send_body(
        &self,
        mut parts: hyper::http::request::Parts,
        body: Bytes,
    ) -> anyhow::Result<Response<Incoming>> {
        parts.headers.remove(TRANSFER_ENCODING);
        parts
            .headers
            .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        self.send(Request::from_parts(parts, full(body))).await
    }

    async fn create(&self, parts: hyper::http::request::Parts, bytes: Bytes) -> Response<Body> {
        let name = query_param(parts.uri.query(), "name").unwrap_or_default();
        let mut value = serde_json::from_slice::<Value>(&bytes).ok();
        let labels = value
            .as_ref()
            .map(|v| str_map(v.get("Labels")))
            .unwrap_or_default();
        let info = match value.as_ref() {
            Some(v) if is_k8s_container(&labels) && !name.is_empty() => {
                let sandbox = match labels.get(LABEL_SANDBOX_ID) {
                    Some(sid) => self.labels_of(sid).await,
                    None => None,
                };
                info_from_create(&name, v, sandbox.as_ref())
            }
            _ => None,
        };
        let Some(info) = info else {
            return match self.send_body(parts, bytes).await {
                Ok(r) => r.map(|b| b.boxed()),
                Err(e) => bad_gateway(&e),
            };
        };
        if !self.agent().restored() {
            return match self.send_body(parts, bytes).await {
                Ok(r) => r.map(|b| b.boxed()),
                Err(e) => bad_gateway(&e),
            };
        }
        let ticket = self.ledger.begin_create(info).await;
        let mut out = bytes;
        if let Some(v) = value.as_mut() {
            if rewrite_create(v, &ticket.adjustment) {
                match serde_json::to_vec(v) {
                    Ok(b) => out = Bytes::from(b),
                    Err(e) => tracing::warn!("re-encoding the create body: {e}"),
                }
            }
        }
        let resp = match self.send_body(parts, out).await {
            Ok(r) => r,
            Err(e) => {
                self.ledger.abort(ticket);
                return bad_gateway(&e);
            }
        };
        let (rparts, rbody) = resp.into_parts();
        let rbytes = match rbody.collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                // dockerd answered, then the connection broke: whether it created the container
                // is unknown; the next reconcile finds out.
                self.ledger.commit_create(ticket, None);
                return bad_gateway(&anyhow::anyhow!("reading the runtime's answer: {e}"));
            }
        };
        if rparts.status.is_success() {
            let id = serde_json::from_slice::<Value>(&rbytes)
                .ok()
                .and_then(|v| v.get("Id").and_then(Value::as_str).map(str::to_string));
            self.ledger.commit_create(ticket, id)
        } else {
            self.ledger.abort(ticket)
        }
        Response::from_parts(rparts, full(rbytes))
    }

    async fn update(
        &self,
        parts: hyper::http::request::Parts,
        bytes: Bytes,
        id: &str,
    ) -> Response<Body> {
        if self.ledger.resolve(id).is_none() || !self.agent().restored() {
            return self.forward(parts, bytes).await;
        }
        let Ok(mut v) = serde_json::from_slice::<Value>(&bytes) else {
            return self.forward(parts, bytes).await;
        };
        let ticket = self
            .ledger
            .begin_update(id, |info| apply_resources(info, &v))
            .await;
        let mut out = bytes;
        if rewrite_update(&mut v, &ticket.adjustment) {
            if let Ok(b) = serde_json::to_vec(&v) {
                out = Bytes::from(b);
            }
        }
        match self.send_body(parts, out).await {
            Ok(r) if r.status().is_success() => {
                self.ledger.commit_update(ticket);
                r.map(|b| b.boxed())
            }
            Ok(r) => {
                self.ledger.abort(ticket);
                r.map(|b| b.boxed())
            }
            Err(e) => {
                self.ledger.abort(ticket);
                bad_gateway(&e)
            }
        }
    }

    /// Stop and delete: forward, then release on success (or when already stopped or gone).
    async fn release(
        &self,
        parts: hyper::http::request::Parts,
        bytes: Bytes,
        id: &str,
    ) -> Response<Body> {
        let why = if parts.method == Method::DELETE {
            Release::Removed
        } else {
            Release::Stopped
        };
        let key = self.ledger.resolve(id);
        let resp = self.forward(parts, bytes).await;
        let Some(key) = key else {
            return resp;
        };
        match resp.status() {
            s if s.is_success() || s == StatusCode::NOT_MODIFIED => self.ledger.release(&key, why),
            // A 404 can mean other things (an API path this dockerd does not serve): released
            // only when dockerd says the container is gone.
            StatusCode::NOT_FOUND if self.is_gone(id).await => {
                self.ledger.release(&key, Release::Removed)
            }
            _ => {}
        }
        resp
    }

    /// Whether dockerd says it has no container `id` (an error or timeout says nothing).
    async fn is_gone(&self, id: &str) -> bool {
        matches!(
            self.call(Method::GET, &format!("/containers/{id}/json"), None)
                .await,
            Ok((StatusCode::NOT_FOUND, _))
        )
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
    let Some(Serving { listener, loops }) =
        proxy_server::start(flags, agent.metrics(), &proxy, "dockerd".into(), &shutdown).await?
    else {
        return Ok(());
    };
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
                proxy_server::serve_until_stopped(conn, stop, "client").await;
            }
        },
    )
    .await;
    loops.finish(agent.metrics(), flags).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a 404 means the container is gone; a 500 or 503 from dockerd
    /// fails the list instead of releasing a live container.
    #[test]
    fn only_404_means_gone() {
        let body = json!({});
        assert!(inspected("c", StatusCode::OK, &body).unwrap());
        assert!(!inspected("c", StatusCode::NOT_FOUND, &body).unwrap());
        for s in [
            StatusCode::INTERNAL_SERVER_ERROR,
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::CONFLICT,
        ] {
            assert!(inspected("c", s, &body).is_err(), "{s}");
        }
    }
}
