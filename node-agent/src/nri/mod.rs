//! NRI plugin mode: kunpeng-tap as an external containerd/CRI-O NRI plugin.
//!
//! One Unix connection to the runtime's NRI socket carries two ttrpc connections through the
//! NRI multiplexer ([`mux`]): on id 1 we serve the `Plugin` service, on id 2 we call the
//! runtime's `Runtime` service. A session is: connect, RegisterPlugin, then the runtime calls
//! Configure (we subscribe to container create/update/stop/remove), Synchronize (state is
//! rebuilt from every existing container through [`Agent::restore`]) and then the events.
//! When the connection drops (runtime restart, or the runtime dropped us after an error) we
//! reconnect with exponential backoff, and the new Synchronize rebuilds the state.
//!
//! Fail open: every hook runs on a blocking thread under a deadline below the runtime's
//! request timeout; an error, panic or missed deadline gives an empty answer (the container
//! runs unadjusted), a log line and `tap_errors_total{hook,kind}`. We never answer an event
//! with an error status, since for CreateContainer that would fail the container.

pub mod convert;
pub mod mux;
pub mod proto;

use crate::agent::{Agent, ContainerInfo};
use crate::flags::Flags;
use async_trait::async_trait;
use futures_util::StreamExt;
use proto::{
    ConfigureRequest, ConfigureResponse, CreateContainerRequest, CreateContainerResponse, Empty,
    Event, RegisterPluginRequest, RuntimeClient, StateChangeEvent, StopContainerRequest,
    StopContainerResponse, SynchronizeRequest, SynchronizeResponse, UpdateContainerRequest,
    UpdateContainerResponse, UpdateContainersRequest,
};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use ttrpc::r#async::transport::{Listener, Socket};
use ttrpc::r#async::{Client, Server, TtrpcContext};

/// The runtime's default per-request timeout (containerd `plugin_request_timeout`).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// First and longest wait between connection attempts.
pub const BACKOFF_MIN: Duration = Duration::from_millis(200);
pub const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// The share of the runtime's request timeout a hook may use; the rest is transport margin.
fn hook_budget(request_timeout: Duration) -> Duration {
    let t = if request_timeout.is_zero() {
        DEFAULT_REQUEST_TIMEOUT
    } else {
        request_timeout
    };
    t.mul_f64(0.75)
}

/// Next backoff after `cur`: doubled, capped.
pub fn next_backoff(cur: Duration) -> Duration {
    (cur * 2).clamp(BACKOFF_MIN, BACKOFF_MAX)
}

/// The Plugin service: turns NRI calls into hook-layer calls.
pub struct NriPlugin {
    agent: Arc<Agent>,
    /// Hook deadline in milliseconds (from Configure's request timeout).
    budget_ms: AtomicU64,
    /// Pods and containers of a split Synchronize (`more = true`), until the last chunk.
    pending_sync: Mutex<(Vec<proto::PodSandbox>, Vec<proto::Container>)>,
    /// For updates no event response can carry (after RemoveContainer).
    runtime: Mutex<Option<RuntimeClient>>,
    /// Cancelled when the runtime is done with us (Shutdown) or the session ends.
    session: CancellationToken,
    synchronized: CancellationToken,
}

impl NriPlugin {
    pub fn new(agent: Arc<Agent>) -> NriPlugin {
        NriPlugin {
            agent,
            budget_ms: AtomicU64::new(hook_budget(DEFAULT_REQUEST_TIMEOUT).as_millis() as u64),
            pending_sync: Mutex::new((Vec::new(), Vec::new())),
            runtime: Mutex::new(None),
            session: CancellationToken::new(),
            synchronized: CancellationToken::new(),
        }
    }

    fn budget(&self) -> Duration {
        Duration::from_millis(self.budget_ms.load(Ordering::Relaxed))
    }

    /// Runs a hook on a blocking thread under the deadline. `None` on a missed deadline or a
    /// failed task (logged and counted). `on_late` runs with the result if it arrives after
    /// the deadline (to undo a grant the runtime never heard of).
    async fn run_hook<T, F, L>(&self, hook: &'static str, f: F, on_late: L) -> Option<T>
    where
        T: Send + 'static,
        F: FnOnce(&Agent) -> T + Send + 'static,
        L: FnOnce(&Agent, T) + Send + 'static,
    {
        let agent = self.agent.clone();
        let mut task = tokio::task::spawn_blocking(move || f(&agent));
        match tokio::time::timeout(self.budget(), &mut task).await {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                tracing::error!(
                    hook,
                    "NRI hook failed: {e}; leaving the container unchanged"
                );
                self.agent.metrics().count_error(hook, "internal");
                None
            }
            Err(_) => {
                tracing::error!(
                    hook,
                    budget_ms = self.budget().as_millis() as u64,
                    "NRI hook missed its deadline; answering without adjustment"
                );
                self.agent.metrics().count_error(hook, "timeout");
                let agent = self.agent.clone();
                tokio::spawn(async move {
                    if let Ok(v) = task.await {
                        on_late(&agent, v);
                    }
                });
                None
            }
        }
    }

    /// Sends updates that no event response can carry, in the background.
    fn push_updates(&self, ups: Vec<crate::agent::Update>) {
        if ups.is_empty() {
            return;
        }
        let Some(client) = self
            .runtime
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        else {
            tracing::warn!(
                updates = ups.len(),
                "no runtime connection for unsolicited updates"
            );
            return;
        };
        let metrics = self.agent.metrics().clone();
        let budget = self.budget();
        tokio::spawn(async move {
            let mut req = UpdateContainersRequest::new();
            req.update = convert::container_updates(&ups);
            let ctx = ttrpc::context::with_timeout(budget.as_nanos() as i64);
            match client.update_containers(ctx, &req).await {
                Ok(resp) if resp.failed.is_empty() => {
                    tracing::info!(updates = ups.len(), "cpuset updates applied")
                }
                Ok(resp) => {
                    tracing::warn!(failed = resp.failed.len(), "some cpuset updates failed");
                    metrics.count_error("update_containers", "runtime");
                }
                Err(e) => {
                    tracing::warn!("UpdateContainers failed: {e}");
                    metrics.count_error("update_containers", "runtime");
                }
            }
        });
    }

    async fn release(&self, hook: &'static str, id: String) -> Vec<crate::agent::Update> {
        self.run_hook(hook, move |a| a.remove(&id), |_, _| {})
            .await
            .unwrap_or_default()
    }
}

#[async_trait]
impl proto::Plugin for NriPlugin {
    async fn configure(
        &self,
        _ctx: &TtrpcContext,
        req: ConfigureRequest,
    ) -> ttrpc::Result<ConfigureResponse> {
        let timeout = Duration::from_millis(req.request_timeout.max(0) as u64);
        self.budget_ms
            .store(hook_budget(timeout).as_millis() as u64, Ordering::Relaxed);
        tracing::info!(
            runtime = %req.runtime_name,
            version = %req.runtime_version,
            request_timeout_ms = req.request_timeout,
            "NRI configure"
        );
        if !req.config.trim().is_empty() {
            tracing::info!("ignoring NRI plugin configuration text (flags configure kunpeng-tap)");
        }
        let mut resp = ConfigureResponse::new();
        resp.events = convert::event_mask(&convert::SUBSCRIBED_EVENTS);
        Ok(resp)
    }

    async fn synchronize(
        &self,
        _ctx: &TtrpcContext,
        req: SynchronizeRequest,
    ) -> ttrpc::Result<SynchronizeResponse> {
        let (pods, containers) = {
            let mut p = self.pending_sync.lock().unwrap_or_else(|p| p.into_inner());
            p.0.extend(req.pods);
            p.1.extend(req.containers);
            if req.more {
                let mut resp = SynchronizeResponse::new();
                resp.more = true;
                return Ok(resp);
            }
            std::mem::take(&mut *p)
        };
        let by_id: HashMap<&str, &proto::PodSandbox> =
            pods.iter().map(|p| (p.id.as_str(), p)).collect();
        let infos: Vec<ContainerInfo> = containers
            .iter()
            .filter(|c| {
                // Stopped containers hold nothing.
                c.state.enum_value_or_default() != proto::ContainerState::CONTAINER_STOPPED
            })
            .map(|c| convert::container_info(by_id.get(c.pod_sandbox_id.as_str()).copied(), c))
            .collect();
        tracing::info!(
            pods = pods.len(),
            containers = infos.len(),
            "NRI synchronize"
        );
        let ups = self
            .run_hook("sync", move |a| a.restore(&infos), |_, _| {})
            .await
            .unwrap_or_default();
        self.synchronized.cancel();
        self.agent.metrics().set_ready(true);
        let mut resp = SynchronizeResponse::new();
        resp.update = convert::container_updates(&ups);
        Ok(resp)
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: Empty) -> ttrpc::Result<Empty> {
        tracing::info!("the runtime asked the NRI plugin to shut down");
        self.session.cancel();
        Ok(Empty::new())
    }

    async fn create_container(
        &self,
        _ctx: &TtrpcContext,
        req: CreateContainerRequest,
    ) -> ttrpc::Result<CreateContainerResponse> {
        let info = convert::container_info(req.pod.as_ref(), req.container.get_or_default());
        let mut resp = CreateContainerResponse::new();
        if info.id.is_empty() {
            tracing::warn!("CreateContainer without a container id; leaving it unchanged");
            self.agent.metrics().count_error("create", "input");
            return Ok(resp);
        }
        let id = info.id.clone();
        let adj = self
            .run_hook(
                "create",
                move |a| a.create(&info),
                move |a, late: crate::agent::Adjustment| {
                    if !late.is_empty() {
                        tracing::warn!(container = %id, "releasing a grant that came too late");
                        let _ = a.remove(&id);
                    }
                },
            )
            .await
            .unwrap_or_default();
        if let Some(a) = convert::adjustment(&adj) {
            resp.adjust = Some(a).into();
        }
        resp.update = convert::container_updates(&adj.updates);
        Ok(resp)
    }

    async fn update_container(
        &self,
        _ctx: &TtrpcContext,
        req: UpdateContainerRequest,
    ) -> ttrpc::Result<UpdateContainerResponse> {
        let mut info = convert::container_info(req.pod.as_ref(), req.container.get_or_default());
        if let Some(r) = req.linux_resources.as_ref() {
            convert::apply_resources(&mut info, r);
        }
        let id = info.id.clone();
        if id.is_empty() {
            return Ok(UpdateContainerResponse::new());
        }
        let adj = self
            .run_hook("update", move |a| a.update(&info), |_, _| {})
            .await
            .unwrap_or_default();
        let mut resp = UpdateContainerResponse::new();
        if let Some(cpus) = adj.cpus.clone() {
            resp.update
                .push(convert::container_update(&crate::agent::Update {
                    container_id: id,
                    cpus,
                    mems: adj.mems.clone(),
                }));
        }
        resp.update.extend(convert::container_updates(&adj.updates));
        Ok(resp)
    }

    async fn stop_container(
        &self,
        _ctx: &TtrpcContext,
        req: StopContainerRequest,
    ) -> ttrpc::Result<StopContainerResponse> {
        let id = req.container.get_or_default().id.clone();
        let ups = self.release("stop", id).await;
        let mut resp = StopContainerResponse::new();
        resp.update = convert::container_updates(&ups);
        Ok(resp)
    }

    async fn state_change(
        &self,
        _ctx: &TtrpcContext,
        req: StateChangeEvent,
    ) -> ttrpc::Result<Empty> {
        match req.event.enum_value() {
            Ok(Event::REMOVE_CONTAINER) | Ok(Event::STOP_CONTAINER) => {
                let id = req.container.get_or_default().id.clone();
                let ups = self.release("remove", id).await;
                // A state change cannot carry updates: send them on their own.
                self.push_updates(ups);
            }
            Ok(e) => tracing::debug!(event = ?e, "NRI state change"),
            Err(v) => tracing::debug!(event = v, "unknown NRI state change"),
        }
        Ok(Empty::new())
    }
}

/// Why a session ended.
#[derive(Debug)]
enum SessionEnd {
    Shutdown,
    Lost(String),
}

/// Runs until `shutdown` is cancelled: connect, register, serve; reconnect with backoff.
pub async fn run(
    flags: &Flags,
    agent: Arc<Agent>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let socket = flags.nri_socket_path.clone();
    let name = flags.nri_plugin_name.clone();
    let idx = flags.nri_plugin_index.clone();
    let mut backoff = BACKOFF_MIN;
    loop {
        if shutdown.is_cancelled() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        match session(&socket, &name, &idx, agent.clone(), shutdown.clone()).await {
            SessionEnd::Shutdown => return Ok(()),
            SessionEnd::Lost(why) => {
                agent.metrics().set_ready(false);
                agent.metrics().runtime_connected.set(0);
                // A session that lived a while resets the backoff.
                if started.elapsed() > Duration::from_secs(30) {
                    backoff = BACKOFF_MIN;
                }
                tracing::warn!(
                    socket = %socket.display(),
                    retry_in_ms = backoff.as_millis() as u64,
                    "NRI connection lost: {why}"
                );
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = next_backoff(backoff);
            }
        }
    }
}

async fn session(
    socket: &Path,
    name: &str,
    idx: &str,
    agent: Arc<Agent>,
    shutdown: CancellationToken,
) -> SessionEnd {
    let stream = match tokio::net::UnixStream::connect(socket).await {
        Ok(s) => s,
        Err(e) => return SessionEnd::Lost(format!("connecting to {}: {e}", socket.display())),
    };
    let trunk = mux::Mux::new(stream);
    let plugin = Arc::new(NriPlugin::new(agent.clone()));

    // Serve the Plugin service on connection 1 before registering: the runtime calls
    // Configure as soon as it has our registration.
    let conn1 = trunk.open(mux::PLUGIN_SERVICE_CONN);
    let listener = Listener::new(
        futures_util::stream::once(async move { Ok::<_, std::io::Error>(conn1) })
            .chain(futures_util::stream::pending()),
    );
    let service: Arc<dyn proto::Plugin + Send + Sync> = plugin.clone();
    let mut server = Server::new()
        .register_service(proto::create_plugin(service))
        .add_listener(listener);
    if let Err(e) = server.start().await {
        trunk.close();
        return SessionEnd::Lost(format!("starting the ttrpc server: {e}"));
    }
    let client = RuntimeClient::new(Client::new(Socket::new(
        trunk.open(mux::RUNTIME_SERVICE_CONN),
    )));
    *plugin.runtime.lock().unwrap_or_else(|p| p.into_inner()) = Some(client.clone());

    let mut reg = RegisterPluginRequest::new();
    reg.plugin_name = name.to_string();
    reg.plugin_idx = idx.to_string();
    let ctx = ttrpc::context::with_timeout(Duration::from_secs(5).as_nanos() as i64);
    let end = match client.register_plugin(ctx, &reg).await {
        Err(e) => SessionEnd::Lost(format!("RegisterPlugin: {e}")),
        Ok(_) => {
            tracing::info!(
                socket = %socket.display(),
                plugin = %format!("{idx}-{name}"),
                "registered with the runtime as an NRI plugin"
            );
            agent.metrics().runtime_connected.set(1);
            let closed = trunk.closed();
            tokio::select! {
                _ = shutdown.cancelled() => SessionEnd::Shutdown,
                _ = plugin.session.cancelled() => {
                    // The runtime said Shutdown: reconnect later as after a restart.
                    SessionEnd::Lost("the runtime sent Shutdown".into())
                }
                _ = closed.cancelled() => SessionEnd::Lost("connection closed by the runtime".into()),
            }
        }
    };
    *plugin.runtime.lock().unwrap_or_else(|p| p.into_inner()) = None;
    trunk.close();
    // Bounded: the server's own shutdown timeout applies.
    let _ = tokio::time::timeout(Duration::from_secs(3), server.shutdown()).await;
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let mut b = BACKOFF_MIN;
        let mut seen = vec![b];
        for _ in 0..10 {
            b = next_backoff(b);
            seen.push(b);
        }
        assert_eq!(seen[1], Duration::from_millis(400));
        assert_eq!(*seen.last().unwrap(), BACKOFF_MAX);
        assert!(seen.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn hook_budget_is_below_the_request_timeout() {
        assert_eq!(hook_budget(Duration::ZERO), Duration::from_millis(1500));
        assert_eq!(hook_budget(Duration::from_secs(4)), Duration::from_secs(3));
        assert!(hook_budget(DEFAULT_REQUEST_TIMEOUT) < DEFAULT_REQUEST_TIMEOUT);
    }
}
