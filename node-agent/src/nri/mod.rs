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
use crate::ledger::{hook_span, Ledger, Listed};
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
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
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

/// The Plugin service: turns NRI calls into ledger calls.
pub struct NriPlugin {
    /// Shared by every session: the book outlives a reconnect.
    ledger: Arc<Ledger>,
    agent: Arc<Agent>,
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
        NriPlugin::with_ledger(Arc::new(Ledger::new(agent, None)))
    }

    pub fn with_ledger(ledger: Arc<Ledger>) -> NriPlugin {
        ledger.set_budget(hook_budget(DEFAULT_REQUEST_TIMEOUT));
        NriPlugin {
            agent: ledger.agent().clone(),
            ledger,
            pending_sync: Mutex::new((Vec::new(), Vec::new())),
            runtime: Mutex::new(None),
            session: CancellationToken::new(),
            synchronized: CancellationToken::new(),
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
        let budget = self.ledger.budget();
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

    /// Releases a stopped (`forget == false`) or removed container.
    fn release(&self, id: &str, forget: bool) -> Vec<crate::agent::Update> {
        let ups = self.ledger.release(id, forget);
        // Updates ride on the answer (or go out right after it): the runtime applies them.
        self.assume_applied(&ups);
        ups
    }

    fn assume_applied(&self, ups: &[crate::agent::Update]) {
        for u in ups {
            self.ledger.applied(u);
        }
    }
}

/// The hooks, each run inside its span.
impl NriPlugin {
    async fn on_create_container(
        &self,
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
        let ticket = self.ledger.begin_create(info).await;
        let adj = ticket.adjustment.clone();
        // The runtime applies the answer as it creates the container.
        let ups = self.ledger.commit_create(ticket, Some(id.clone()));
        if self.session.is_cancelled() {
            // A request of a connection that is gone (the runtime gave up on this plugin while
            // it hung, and the request waited in the socket): nobody applies the answer. The
            // next session's Synchronize may already have run, so the grant goes now.
            tracing::warn!(container = %id, "a create of a closed NRI session; its grant is released");
            self.agent.metrics().count_error("create", "stale_session");
            let _ = self.ledger.release(&id, false);
            return Ok(CreateContainerResponse::new());
        }
        self.assume_applied(&ups);
        if let Some(a) = convert::adjustment(&adj) {
            resp.adjust = Some(a).into();
        }
        resp.update = convert::container_updates(&ups);
        Ok(resp)
    }

    async fn on_update_container(
        &self,
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
        let mut resp = UpdateContainerResponse::new();
        let (adj, ups) = if self.ledger.resolve(&id).is_none() {
            // Not seen yet (created before a restart and missed by the sync): place it now.
            let ticket = self.ledger.begin_create(info).await;
            let adj = ticket.adjustment.clone();
            (adj, self.ledger.commit_create(ticket, Some(id.clone())))
        } else {
            let r = req.linux_resources.clone();
            let ticket = self
                .ledger
                .begin_update(&id, move |i| {
                    if let Some(r) = r.as_ref() {
                        convert::apply_resources(i, r);
                    }
                })
                .await;
            let adj = ticket.adjustment.clone();
            (adj, self.ledger.commit_update(ticket))
        };
        if let Some(cpus) = adj.cpus {
            let own = crate::agent::Update {
                container_id: id.clone(),
                cpus,
                mems: adj.mems,
            };
            self.ledger.applied(&own);
            resp.update.push(convert::container_update(&own));
        }
        let ups: Vec<_> = ups.into_iter().filter(|u| u.container_id != id).collect();
        self.assume_applied(&ups);
        resp.update.extend(convert::container_updates(&ups));
        Ok(resp)
    }

    async fn on_stop_container(
        &self,
        req: StopContainerRequest,
    ) -> ttrpc::Result<StopContainerResponse> {
        let id = req.container.get_or_default().id.clone();
        let ups = self.release(&id, false);
        let mut resp = StopContainerResponse::new();
        resp.update = convert::container_updates(&ups);
        Ok(resp)
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
        self.ledger.set_budget(hook_budget(timeout));
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
        let ledger = self.ledger.clone();
        let ups = self
            .ledger
            .decide("sync", move |_| reconcile(&ledger, &infos), |_, _| {})
            .await
            .unwrap_or_default();
        self.assume_applied(&ups);
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
        self.on_create_container(req)
            .instrument(hook_span("create", "NRI"))
            .await
    }

    async fn update_container(
        &self,
        _ctx: &TtrpcContext,
        req: UpdateContainerRequest,
    ) -> ttrpc::Result<UpdateContainerResponse> {
        self.on_update_container(req)
            .instrument(hook_span("update", "NRI"))
            .await
    }

    async fn stop_container(
        &self,
        _ctx: &TtrpcContext,
        req: StopContainerRequest,
    ) -> ttrpc::Result<StopContainerResponse> {
        self.on_stop_container(req)
            .instrument(hook_span("stop", "NRI"))
            .await
    }

    async fn state_change(
        &self,
        _ctx: &TtrpcContext,
        req: StateChangeEvent,
    ) -> ttrpc::Result<Empty> {
        match req.event.enum_value() {
            Ok(Event::REMOVE_CONTAINER) | Ok(Event::STOP_CONTAINER) => {
                let id = req.container.get_or_default().id.clone();
                let forget = req.event.enum_value() == Ok(Event::REMOVE_CONTAINER);
                let hook = if forget { "remove" } else { "stop" };
                let ups = hook_span(hook, "NRI").in_scope(|| self.release(&id, forget));
                // A state change cannot carry updates: send them on their own.
                self.push_updates(ups);
            }
            Ok(e) => tracing::debug!(event = ?e, "NRI state change"),
            Err(v) => tracing::debug!(event = v, "unknown NRI state change"),
        }
        Ok(Empty::new())
    }
}

/// Brings the ledger in line with what the runtime reports at (re)synchronization: grants of
/// containers the runtime no longer has (removed while we were disconnected) are released;
/// grants the runtime never applied (no grant record and no cpuset on the container: the
/// runtime gave up on our answer, e.g. after a timeout) are dropped so the container is treated
/// as unmanaged; then every container is adopted. Returns the cpuset updates, one per container.
pub fn reconcile(ledger: &Ledger, infos: &[ContainerInfo]) -> Vec<crate::agent::Update> {
    let listed = infos
        .iter()
        .map(|c| Listed {
            runtime_id: c.id.clone(),
            info: c.clone(),
        })
        .collect();
    ledger.reconcile(listed, u64::MAX, true).1
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
    let ledger = Arc::new(Ledger::new(agent.clone(), None));
    loop {
        if shutdown.is_cancelled() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        match session(&socket, &name, &idx, ledger.clone(), shutdown.clone()).await {
            SessionEnd::Shutdown => return Ok(()),
            SessionEnd::Lost(why) => {
                agent.metrics().set_ready(false);
                // A session that registered, or lived a while, starts the backoff over.
                let was_registered = agent.metrics().runtime_connected.get() == 1;
                agent.metrics().runtime_connected.set(0);
                if was_registered || started.elapsed() > Duration::from_secs(30) {
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
    ledger: Arc<Ledger>,
    shutdown: CancellationToken,
) -> SessionEnd {
    let agent = ledger.agent().clone();
    let stream = match tokio::net::UnixStream::connect(socket).await {
        Ok(s) => s,
        Err(e) => return SessionEnd::Lost(format!("connecting to {}: {e}", socket.display())),
    };
    // Both logical connections exist before the first frame is read.
    let (trunk, mut conns) = mux::Mux::with_conns(
        stream,
        &[mux::PLUGIN_SERVICE_CONN, mux::RUNTIME_SERVICE_CONN],
    );
    let (Some(conn2), Some(conn1)) = (conns.pop(), conns.pop()) else {
        return SessionEnd::Lost("internal: mux connections".into());
    };
    let plugin = Arc::new(NriPlugin::with_ledger(ledger));

    // Serve the Plugin service on connection 1 before registering: the runtime calls
    // Configure as soon as it has our registration.
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
    let client = RuntimeClient::new(Client::new(Socket::new(conn2)));
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
    // Requests of this connection still being handled must not grant anything any more.
    plugin.session.cancel();
    trunk.close();
    // Bounded: the server's own shutdown timeout applies.
    let _ = tokio::time::timeout(Duration::from_secs(3), server.shutdown()).await;
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use proto::nri_ttrpc::{create_runtime, PluginClient, Runtime};
    use tap_engine::sysfs::discover_dir;
    use tap_engine::{Engine, EngineConfig, Topology};

    fn test_agent() -> Arc<Agent> {
        let base = std::env::var_os("TAP_FIXTURES")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/sysfs")
            });
        let raw = discover_dir(&base.join("synthetic-2s-4numa-96c-gpu")).unwrap();
        let topo = Arc::new(Topology::build(&raw).unwrap());
        Arc::new(Agent::new(
            Engine::new(topo, EngineConfig::default()),
            Arc::new(Metrics::new()),
            None,
            "NRI",
        ))
    }

    /// The runtime side of the handshake: records RegisterPlugin.
    struct FakeRuntime {
        registered: tokio::sync::mpsc::UnboundedSender<(String, String)>,
    }

    #[async_trait]
    impl Runtime for FakeRuntime {
        async fn register_plugin(
            &self,
            _ctx: &TtrpcContext,
            req: RegisterPluginRequest,
        ) -> ttrpc::Result<Empty> {
            let _ = self.registered.send((req.plugin_name, req.plugin_idx));
            Ok(Empty::new())
        }
    }

    fn burstable(id: &str, annotations: usize) -> proto::Container {
        let mut shares = proto::OptionalUInt64::new();
        shares.value = 4096;
        let mut quota = proto::OptionalInt64::new();
        quota.value = 800_000;
        let mut period = proto::OptionalUInt64::new();
        period.value = 100_000;
        let mut cpu = proto::LinuxCPU::new();
        cpu.shares = Some(shares).into();
        cpu.quota = Some(quota).into();
        cpu.period = Some(period).into();
        let mut res = proto::LinuxResources::new();
        res.cpu = Some(cpu).into();
        let mut linux = proto::LinuxContainer::new();
        linux.resources = Some(res).into();
        let mut c = proto::Container::new();
        c.id = id.into();
        c.name = "app".into();
        c.pod_sandbox_id = "sb".into();
        c.linux = Some(linux).into();
        for i in 0..annotations {
            c.annotations.insert(format!("k{i}"), "v".repeat(64));
        }
        c
    }

    fn pod() -> proto::PodSandbox {
        let mut p = proto::PodSandbox::new();
        p.id = "sb".into();
        p.name = "web".into();
        p.uid = "u1".into();
        p.namespace = "default".into();
        let mut l = proto::LinuxPodSandbox::new();
        l.cgroup_parent = "/kubepods/burstable/podu1".into();
        p.linux = Some(l).into();
        p
    }

    /// A whole session over a real Unix socket with the NRI mux on both ends: register,
    /// Configure, a large Synchronize (many frames), CreateContainer, then the runtime goes
    /// away and the session ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn session_registers_configures_syncs_and_places() {
        let dir = std::env::temp_dir().join(format!("tap-nri-unit-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let sock = dir.join("nri.sock");
        let _ = std::fs::remove_file(&sock);
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let agent = test_agent();
        let stop = CancellationToken::new();
        let plugin_side = {
            let (sock, agent, stop) = (sock.clone(), agent.clone(), stop.clone());
            let ledger = Arc::new(Ledger::new(agent, None));
            tokio::spawn(async move { session(&sock, "kunpeng-tap", "10", ledger, stop).await })
        };

        let (stream, _) = listener.accept().await.unwrap();
        // The runtime serves conn 2 and calls the plugin on conn 1.
        let (trunk, mut conns) = mux::Mux::with_conns(
            stream,
            &[mux::RUNTIME_SERVICE_CONN, mux::PLUGIN_SERVICE_CONN],
        );
        let conn1 = conns.pop().unwrap();
        let conn2 = conns.pop().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut server = Server::new()
            .register_service(create_runtime(Arc::new(FakeRuntime { registered: tx })))
            .add_listener(Listener::new(
                futures_util::stream::once(async move { Ok::<_, std::io::Error>(conn2) })
                    .chain(futures_util::stream::pending()),
            ));
        server.start().await.unwrap();
        let plugin = PluginClient::new(Client::new(Socket::new(conn1)));
        let (name, idx) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((name.as_str(), idx.as_str()), ("kunpeng-tap", "10"));

        let ctx = || ttrpc::context::with_timeout(2_000_000_000);
        let mut cfg = ConfigureRequest::new();
        cfg.runtime_name = "fake".into();
        let r = plugin.configure(ctx(), &cfg).await.unwrap();
        assert_eq!(r.events, 0x688);

        // Five running containers on NUMA node 0 with bulky annotations: a request of ~70 KiB,
        // many frames.
        // Split sync (NRI v0.8+): a chunk with more=true is acknowledged with more=true and
        // nothing else; the state is rebuilt from all chunks at the last one.
        let mut first = SynchronizeRequest::new();
        first.pods.push(pod());
        first.more = true;
        let r = plugin.synchronize(ctx(), &first).await.unwrap();
        assert!(r.more && r.update.is_empty());
        let mut sync = SynchronizeRequest::new();
        for i in 0..5 {
            let mut c = burstable(&format!("old{i}"), 200);
            c.linux
                .mut_or_insert_default()
                .resources
                .mut_or_insert_default()
                .cpu
                .mut_or_insert_default()
                .cpus = "0-23".into();
            sync.containers.push(c);
        }
        assert!(protobuf::Message::compute_size(&sync) > 60_000);
        let r = plugin.synchronize(ctx(), &sync).await.unwrap();
        assert!(!r.more);
        let snap = agent.snapshot();
        for i in 0..5 {
            assert!(snap.grant(&format!("old{i}")).is_some(), "old{i} restored");
        }

        let mut create = CreateContainerRequest::new();
        create.pod = Some(pod()).into();
        create.container = Some(burstable("new", 0)).into();
        let r = plugin.create_container(ctx(), &create).await.unwrap();
        let adj = r.adjust.into_option().expect("an adjustment");
        let cpus = adj.linux.resources.cpu.cpus.clone();
        assert!(!cpus.is_empty());
        assert!(adj.annotations.contains_key(tap_engine::request::GRANT_KEY));

        // A container without an id is answered, unchanged.
        let r = plugin
            .create_container(ctx(), &CreateContainerRequest::new())
            .await
            .unwrap();
        assert!(r.adjust.is_none());

        let mut stop_req = StopContainerRequest::new();
        stop_req.container = Some(burstable("new", 0)).into();
        plugin.stop_container(ctx(), &stop_req).await.unwrap();
        assert!(agent.snapshot().grant("new").is_none());

        // The runtime goes away: the session reports it lost.
        trunk.close();
        let end = tokio::time::timeout(Duration::from_secs(10), plugin_side)
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(end, SessionEnd::Lost(_)), "{end:?}");
        let _ = server.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reconcile_releases_vanished_and_unapplied_grants() {
        let agent = test_agent();
        let sync_pod = convert::pod_info(&pod());
        let info = |id: &str| {
            let mut c = convert::container_info(Some(&pod()), &burstable(id, 0));
            c.pod = sync_pod.clone();
            c
        };
        let mut applied = info("applied");
        let adj = agent.create(&applied);
        applied.cpus = adj.cpus;
        applied
            .annotations
            .insert(tap_engine::request::GRANT_KEY.into(), adj.record.unwrap());
        assert!(!agent.create(&info("gone")).is_empty());
        assert!(!agent.create(&info("unapplied")).is_empty());
        // The runtime reports "applied" (with its record) and "unapplied" (no cpuset, no
        // record); "gone" was removed while we were away.
        let ledger = Ledger::new(agent.clone(), None);
        let _ = reconcile(&ledger, &[applied, info("unapplied")]);
        let snap = agent.snapshot();
        assert!(snap.grant("applied").is_some());
        assert!(snap.grant("gone").is_none());
        assert!(snap.grant("unapplied").is_none());
        let used: u64 = snap
            .pool_status()
            .iter()
            .filter(|p| p.level.as_str() == "numa")
            .map(|p| p.request_milli)
            .sum();
        assert_eq!(used, 4000);
    }

    #[tokio::test]
    async fn a_missed_deadline_answers_empty_and_releases_the_late_grant() {
        let plugin = NriPlugin::new(test_agent());
        plugin.ledger.set_budget(Duration::from_millis(50));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let out = plugin
            .ledger
            .decide(
                "create",
                |_| {
                    std::thread::sleep(Duration::from_millis(300));
                    7
                },
                move |_, v| {
                    let _ = tx.send(v);
                },
            )
            .await;
        assert_eq!(out, None);
        let late = tokio::time::timeout(Duration::from_secs(5), rx).await;
        assert_eq!(late.unwrap().unwrap(), 7);
        let m = plugin.agent.metrics().render();
        assert!(
            m.lines()
                .any(|l| l.contains("kind=\"timeout\"") && l.ends_with(" 1")),
            "{m}"
        );
    }

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
