//! A small NRI *runtime* for driving a real `kunpeng-tap` in NRI mode without containerd:
//! it listens on a Unix socket, accepts the plugin's trunk connection, serves the `Runtime`
//! service (RegisterPlugin, UpdateContainers) on connection 2 and calls the plugin's `Plugin`
//! service on connection 1, through the agent's own multiplexer (`node_agent::nri::mux`) and
//! generated ttrpc code. The wire protocol is the one containerd speaks
//! (`/work/shared/NRI-NOTES.md` sections 2-4), so the agent cannot tell the difference.
//!
//! Used where the number of containers matters more than the runtime (1,000 containers in the
//! memory measurement `tap-nri-memory` and the `nri_scale` test); the `nri` tests use real
//! containerd.
//!
//! [`pod`] and [`container`] build messages shaped like the ones containerd 1.7 sends for a
//! kubelet-made container (kubelet labels, annotations and environment), so what the agent
//! keeps per container is what it would keep in production.

use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use futures_util::StreamExt;
use node_agent::nri::mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use node_agent::nri::proto::nri_ttrpc::{create_runtime, PluginClient, Runtime};
use node_agent::nri::proto::Event;
use node_agent::nri::proto::{
    ConfigureRequest, ConfigureResponse, Container, ContainerState, ContainerUpdate,
    CreateContainerRequest, CreateContainerResponse, Empty, LinuxCPU, LinuxContainer, LinuxMemory,
    LinuxPodSandbox, LinuxResources, OptionalInt64, OptionalUInt64, PodSandbox,
    RegisterPluginRequest, StateChangeEvent, StopContainerRequest, SynchronizeRequest,
    SynchronizeResponse, UpdateContainersRequest, UpdateContainersResponse,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UnixListener;
use ttrpc::r#async::transport::{Listener, Socket};
use ttrpc::r#async::{Client, Server, TtrpcContext};

/// containerd's default per-request timeout, sent in Configure and used for every call.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// The runtime's listening socket.
pub struct NriRuntime {
    listener: UnixListener,
    path: PathBuf,
}

impl NriRuntime {
    /// Listens on `path` (a stale file is removed). Needs a Tokio runtime.
    pub fn bind(path: &Path) -> Result<NriRuntime> {
        let _ = std::fs::remove_file(path);
        let listener =
            UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
        Ok(NriRuntime {
            listener,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts one plugin and waits for its RegisterPlugin (containerd's registration timeout
    /// is 5 s; `timeout` covers the connect as well).
    pub async fn accept(&self, timeout: Duration) -> Result<PluginSession> {
        let (stream, _) = tokio::time::timeout(timeout, self.listener.accept())
            .await
            .context("no plugin connected")??;
        // The runtime calls the plugin on conn 1 and serves conn 2.
        let (trunk, mut conns) =
            Mux::with_conns(stream, &[RUNTIME_SERVICE_CONN, PLUGIN_SERVICE_CONN]);
        let (Some(conn1), Some(conn2)) = (conns.pop(), conns.pop()) else {
            bail!("mux did not open both connections");
        };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let updates = Arc::new(Mutex::new(Vec::new()));
        let service = RuntimeService {
            registered: tx,
            updates: updates.clone(),
        };
        let mut server = Server::new()
            .register_service(create_runtime(Arc::new(service)))
            .add_listener(Listener::new(
                futures_util::stream::once(async move { Ok::<_, std::io::Error>(conn2) })
                    .chain(futures_util::stream::pending()),
            ));
        server
            .start()
            .await
            .context("starting the Runtime service")?;
        let client = PluginClient::new(Client::new(Socket::new(conn1)));
        let registered = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .context("the plugin did not register within 5 s")?
            .context("the plugin went away before registering")?;
        Ok(PluginSession {
            trunk,
            server: Mutex::new(server),
            client,
            registered,
            unsolicited: updates,
        })
    }
}

impl Drop for NriRuntime {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The `Runtime` service the plugin calls.
struct RuntimeService {
    registered: tokio::sync::mpsc::UnboundedSender<(String, String)>,
    updates: Arc<Mutex<Vec<ContainerUpdate>>>,
}

#[async_trait]
impl Runtime for RuntimeService {
    async fn register_plugin(
        &self,
        _ctx: &TtrpcContext,
        req: RegisterPluginRequest,
    ) -> ttrpc::Result<Empty> {
        let _ = self.registered.send((req.plugin_name, req.plugin_idx));
        Ok(Empty::new())
    }

    async fn update_containers(
        &self,
        _ctx: &TtrpcContext,
        req: UpdateContainersRequest,
    ) -> ttrpc::Result<UpdateContainersResponse> {
        self.updates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(req.update);
        Ok(UpdateContainersResponse::new())
    }
}

/// One registered plugin.
pub struct PluginSession {
    trunk: Mux,
    /// In a mutex only so the session can be shared between tasks (a `Server` is not `Sync`).
    server: Mutex<Server>,
    client: PluginClient,
    /// (plugin name, plugin index) from RegisterPlugin.
    pub registered: (String, String),
    unsolicited: Arc<Mutex<Vec<ContainerUpdate>>>,
}

fn ctx() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(REQUEST_TIMEOUT.as_nanos() as i64)
}

impl PluginSession {
    /// Configure, as containerd 1.7 sends it (request timeout 2 s).
    pub async fn configure(&self) -> Result<ConfigureResponse> {
        let mut req = ConfigureRequest::new();
        req.runtime_name = "tap-e2e-nri-runtime".into();
        req.runtime_version = env!("CARGO_PKG_VERSION").into();
        req.registration_timeout = 5000;
        req.request_timeout = REQUEST_TIMEOUT.as_millis() as i64;
        Ok(self.client.configure(ctx(), &req).await?)
    }

    /// Synchronize with what already runs (in one chunk).
    pub async fn synchronize(
        &self,
        pods: Vec<PodSandbox>,
        containers: Vec<Container>,
    ) -> Result<SynchronizeResponse> {
        let mut req = SynchronizeRequest::new();
        req.pods = pods;
        req.containers = containers;
        Ok(self.client.synchronize(ctx(), &req).await?)
    }

    /// Configure, then an empty Synchronize: the handshake of a runtime with no containers.
    pub async fn handshake(&self) -> Result<()> {
        self.configure().await?;
        self.synchronize(Vec::new(), Vec::new()).await?;
        Ok(())
    }

    pub async fn create_container(
        &self,
        pod: &PodSandbox,
        c: &Container,
    ) -> Result<CreateContainerResponse> {
        let mut req = CreateContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(c.clone()).into();
        let resp = self.client.create_container(ctx(), &req).await?;
        // containerd then creates and (the kubelet asking) starts the container, and says so.
        let mut done = StateChangeEvent::new();
        done.event = Event::POST_START_CONTAINER.into();
        done.pod = Some(pod.clone()).into();
        done.container = Some(c.clone()).into();
        self.client.state_change(ctx(), &done).await?;
        Ok(resp)
    }

    /// StopContainer, then the REMOVE_CONTAINER event: what containerd sends when the kubelet
    /// stops and removes a container.
    pub async fn stop_and_remove(&self, pod: &PodSandbox, c: &Container) -> Result<()> {
        let mut stop = StopContainerRequest::new();
        stop.pod = Some(pod.clone()).into();
        stop.container = Some(c.clone()).into();
        self.client.stop_container(ctx(), &stop).await?;
        let mut gone = StateChangeEvent::new();
        gone.event = Event::REMOVE_CONTAINER.into();
        gone.pod = Some(pod.clone()).into();
        gone.container = Some(c.clone()).into();
        self.client.state_change(ctx(), &gone).await?;
        Ok(())
    }

    /// Updates the plugin sent on its own (UpdateContainers), so far.
    pub fn unsolicited_updates(&self) -> Vec<ContainerUpdate> {
        self.unsolicited
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Closes the trunk (what the plugin sees when the runtime stops).
    pub async fn close(self) {
        self.trunk.close();
        let mut server = self.server.into_inner().unwrap_or_else(|p| p.into_inner());
        let _ = tokio::time::timeout(Duration::from_secs(3), server.shutdown()).await;
    }
}

/// The cpuset a create answer sets on the container (`None`: left as it is).
pub fn adjusted_cpus(resp: &CreateContainerResponse) -> Option<String> {
    let cpus = &resp
        .adjust
        .as_ref()?
        .linux
        .as_ref()?
        .resources
        .as_ref()?
        .cpu
        .as_ref()?
        .cpus;
    (!cpus.is_empty()).then(|| cpus.clone())
}

/// A Pod's QoS class, as the kubelet puts it in the cgroup parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl Qos {
    /// Container `i` of a 1,000-container mix: 5% Guaranteed, 75% Burstable, 20% BestEffort.
    pub fn of_index(i: usize) -> Qos {
        match i % 20 {
            0 => Qos::Guaranteed,
            1..=15 => Qos::Burstable,
            _ => Qos::BestEffort,
        }
    }
}

/// Pod `i` of class `qos`, with the labels and annotations the kubelet gives a Deployment's Pod.
pub fn pod(i: usize, qos: Qos) -> PodSandbox {
    let uid = format!("7f3c{i:04x}-1b2a-4c5d-8e9f-0a1b2c3d{i:04x}");
    let mut p = PodSandbox::new();
    p.id = format!("{:064x}", 0x5b00_0000u64 + i as u64);
    p.name = format!("web-7d9f8c6b5-{i:05}");
    p.uid = uid.clone();
    p.namespace = "default".into();
    p.runtime_handler = String::new();
    for (k, v) in [
        ("app", "web".to_string()),
        ("pod-template-hash", "7d9f8c6b5".into()),
        ("io.kubernetes.pod.name", p.name.clone()),
        ("io.kubernetes.pod.namespace", "default".into()),
        ("io.kubernetes.pod.uid", uid.clone()),
    ] {
        p.labels.insert(k.into(), v);
    }
    for (k, v) in [
        (
            "kubernetes.io/config.seen",
            "2026-12-03T10:00:00.000000000Z",
        ),
        ("kubernetes.io/config.source", "api"),
    ] {
        p.annotations.insert(k.into(), v.into());
    }
    let class = match qos {
        Qos::Guaranteed => String::new(),
        Qos::Burstable => "burstable/".into(),
        Qos::BestEffort => "besteffort/".into(),
    };
    let mut l = LinuxPodSandbox::new();
    l.cgroup_parent = format!("/kubepods/{class}pod{uid}");
    p.linux = Some(l).into();
    p
}

/// The CPU request and limit (milli-CPUs) of container `i` in the mix: Guaranteed 1 CPU,
/// Burstable 50m request and a 1-CPU limit, BestEffort nothing.
pub fn cpus_of(qos: Qos) -> (u64, Option<u64>) {
    match qos {
        Qos::Guaranteed => (1000, Some(1000)),
        Qos::Burstable => (50, Some(1000)),
        Qos::BestEffort => (0, None),
    }
}

/// Container `i` of `pod`, as containerd 1.7 reports a kubelet container at creation.
pub fn container(i: usize, pod: &PodSandbox, qos: Qos) -> Container {
    let (request, limit) = cpus_of(qos);
    let mut c = Container::new();
    c.id = format!("{:064x}", 0xc000_0000u64 + i as u64);
    c.pod_sandbox_id = pod.id.clone();
    c.name = "app".into();
    c.state = ContainerState::CONTAINER_CREATED.into();
    for (k, v) in [
        ("io.kubernetes.container.name", "app".to_string()),
        ("io.kubernetes.pod.name", pod.name.clone()),
        ("io.kubernetes.pod.namespace", pod.namespace.clone()),
        ("io.kubernetes.pod.uid", pod.uid.clone()),
    ] {
        c.labels.insert(k.into(), v);
    }
    for (k, v) in [
        ("io.kubernetes.container.hash", "5a1b2c3d".to_string()),
        ("io.kubernetes.container.restartCount", "0".into()),
        (
            "io.kubernetes.container.terminationMessagePath",
            "/dev/termination-log".into(),
        ),
        (
            "io.kubernetes.container.terminationMessagePolicy",
            "File".into(),
        ),
        ("io.kubernetes.cri.container-type", "container".into()),
        ("io.kubernetes.cri.container-name", "app".into()),
        (
            "io.kubernetes.cri.image-name",
            "docker.io/library/nginx:1.27".into(),
        ),
        ("io.kubernetes.cri.sandbox-id", pod.id.clone()),
        ("io.kubernetes.cri.sandbox-name", pod.name.clone()),
        ("io.kubernetes.cri.sandbox-namespace", pod.namespace.clone()),
        ("io.kubernetes.cri.sandbox-uid", pod.uid.clone()),
    ] {
        c.annotations.insert(k.into(), v);
    }
    c.args = vec!["nginx".into(), "-g".into(), "daemon off;".into()];
    c.env = [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOSTNAME=web",
        "NGINX_VERSION=1.27.3",
        "KUBERNETES_SERVICE_HOST=10.96.0.1",
        "KUBERNETES_SERVICE_PORT=443",
        "KUBERNETES_SERVICE_PORT_HTTPS=443",
        "KUBERNETES_PORT=tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP_PROTO=tcp",
        "KUBERNETES_PORT_443_TCP_PORT=443",
        "KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();

    let mut cpu = LinuxCPU::new();
    let mut shares = OptionalUInt64::new();
    // The kubelet's shares: request * 1024 / 1000, at least 2.
    shares.value = (request * 1024 / 1000).max(2);
    cpu.shares = Some(shares).into();
    let mut period = OptionalUInt64::new();
    period.value = 100_000;
    cpu.period = Some(period).into();
    if let Some(l) = limit {
        let mut quota = OptionalInt64::new();
        quota.value = (l * 100) as i64;
        cpu.quota = Some(quota).into();
    }
    let mut res = LinuxResources::new();
    res.cpu = Some(cpu).into();
    if qos != Qos::BestEffort {
        let mut mem = LinuxMemory::new();
        let mut limit = OptionalInt64::new();
        limit.value = 256 << 20;
        mem.limit = Some(limit).into();
        res.memory = Some(mem).into();
    }
    let mut linux = LinuxContainer::new();
    linux.resources = Some(res).into();
    linux.cgroups_path = format!(
        "{}:cri-containerd:{}",
        pod.linux
            .as_ref()
            .map(|l| l.cgroup_parent.as_str())
            .unwrap_or(""),
        c.id
    );
    c.linux = Some(linux).into();
    c
}

/// What the plugin answered to a run of creates.
#[derive(Debug, Clone, Default)]
pub struct CreateTally {
    pub answered: usize,
    /// Answers that set the container's cpuset.
    pub with_cpuset: usize,
    /// Ids of the first containers answered without a cpuset (at most 10).
    pub without_cpuset: Vec<String>,
    /// Each container as the runtime created it (the answer's adjustment applied), when asked
    /// to keep them.
    pub created: Vec<(PodSandbox, Container)>,
}

/// Sets the cpuset and memory nodes `resources` name (empty or absent ones leave `c` as it is).
fn apply_cpu(c: &mut Container, resources: Option<&LinuxResources>) {
    let Some(cpu) = resources.and_then(|r| r.cpu.as_ref()) else {
        return;
    };
    let ours = c
        .linux
        .mut_or_insert_default()
        .resources
        .mut_or_insert_default()
        .cpu
        .mut_or_insert_default();
    if !cpu.cpus.is_empty() {
        ours.cpus = cpu.cpus.clone();
    }
    if !cpu.mems.is_empty() {
        ours.mems = cpu.mems.clone();
    }
}

/// Applies a create answer's cpuset, memory nodes and annotations to `c`, as the runtime does.
pub fn apply_adjustment(c: &mut Container, resp: &CreateContainerResponse) {
    let Some(adj) = resp.adjust.as_ref() else {
        return;
    };
    for (k, v) in &adj.annotations {
        c.annotations.insert(k.clone(), v.clone());
    }
    apply_cpu(c, adj.linux.as_ref().and_then(|l| l.resources.as_ref()));
}

/// Applies a ContainerUpdate's cpuset and memory nodes to `c`.
pub fn apply_update(c: &mut Container, u: &ContainerUpdate) {
    apply_cpu(c, u.linux.as_ref().and_then(|l| l.resources.as_ref()));
}

/// Drops what the kubelet adds besides resources (labels, annotations, environment,
/// arguments): for telling what the agent keeps per container from what it is sent.
pub fn strip_metadata(p: &mut PodSandbox, c: &mut Container) {
    p.labels.clear();
    p.annotations.clear();
    c.labels.clear();
    c.annotations.clear();
    c.env.clear();
    c.args.clear();
}

/// How [`create_mix`] creates.
#[derive(Debug, Clone, Copy, Default)]
pub struct MixOptions {
    /// Keep each container as created in the tally (for a later Synchronize).
    pub keep: bool,
    /// Send containers without kubelet metadata ([`strip_metadata`]).
    pub bare: bool,
}

/// Creates containers `range` of the mix ([`Qos::of_index`], one Pod each), one after the
/// other as a runtime does for one kubelet, and tallies the answers.
pub async fn create_mix(
    s: &PluginSession,
    range: std::ops::Range<usize>,
    opts: MixOptions,
) -> Result<CreateTally> {
    let mut t = CreateTally::default();
    for i in range {
        let qos = Qos::of_index(i);
        let mut p = pod(i, qos);
        let mut c = container(i, &p, qos);
        if opts.bare {
            strip_metadata(&mut p, &mut c);
        }
        let resp = s
            .create_container(&p, &c)
            .await
            .with_context(|| format!("CreateContainer of container {i}"))?;
        t.answered += 1;
        if adjusted_cpus(&resp).is_some() {
            t.with_cpuset += 1;
        } else if t.without_cpuset.len() < 10 {
            t.without_cpuset.push(format!("{i} ({qos:?})"));
        }
        if opts.keep {
            apply_adjustment(&mut c, &resp);
            c.state = ContainerState::CONTAINER_RUNNING.into();
            t.created.push((p, c));
            // Updates to containers created earlier (their shared pool changed).
            for u in &resp.update {
                if let Some((_, other)) = t.created.iter_mut().find(|(_, o)| o.id == u.container_id)
                {
                    apply_update(other, u);
                }
            }
        }
    }
    Ok(t)
}

/// `kunpeng-tap` in NRI mode, registered with a test runtime.
pub struct AgentOnRuntime {
    pub agent: crate::docker::TapAgent,
    pub runtime: NriRuntime,
    pub session: PluginSession,
}

/// Starts `kunpeng-tap` in NRI mode on the sysfs fixture `sysfs`, with BestEffort containers
/// confined (every create is answered with a cpuset), its state in `<dir>/state` and its log in
/// `<dir>/agent.log`, against a test runtime listening in `dir`. Returns once the agent is
/// registered and configured.
pub async fn start_agent(dir: &Path, sysfs: &Path) -> Result<AgentOnRuntime> {
    let runtime = NriRuntime::bind(&dir.join("nri.sock"))?;
    let args: Vec<String> = vec![
        "--container-runtime-mode=NRI".into(),
        format!("--nri-socket-path={}", runtime.path().display()),
        format!("--sysfs-root={}", sysfs.display()),
        "--confine-best-effort".into(),
        format!("--state-dir={}", dir.join("state").display()),
    ];
    let accept = tokio::spawn(async move {
        let s = runtime.accept(Duration::from_secs(60)).await?;
        s.handshake().await?;
        anyhow::Ok((runtime, s))
    });
    let log = dir.join("agent.log");
    let agent =
        tokio::task::spawn_blocking(move || crate::docker::TapAgent::start(&args, &log)).await??;
    let (runtime, session) = accept.await??;
    Ok(AgentOnRuntime {
        agent,
        runtime,
        session,
    })
}

/// The agent's flags in the start-path benchmark's NRI row (b) and in `tap-nri-hop`: NRI mode
/// on `socket`, topology-aware on the sysfs fixture `fixture` folded onto this host, its state
/// in `state_dir`.
pub fn bench_agent_args(socket: &Path, fixture: &str, state_dir: &Path) -> Vec<String> {
    vec![
        "--container-runtime-mode=NRI".into(),
        format!("--nri-socket-path={}", socket.display()),
        "--resource-policy=topology-aware".into(),
        format!(
            "--sysfs-root={}",
            crate::util::fixture_dir(fixture).display()
        ),
        "--fold-cpus-to-host".into(),
        format!("--state-dir={}", state_dir.display()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_is_five_seventy_five_twenty() {
        let count = |q| (0..1000).filter(|&i| Qos::of_index(i) == q).count();
        assert_eq!(count(Qos::Guaranteed), 50);
        assert_eq!(count(Qos::Burstable), 750);
        assert_eq!(count(Qos::BestEffort), 200);
    }

    #[test]
    fn messages_carry_the_qos_in_the_cgroup_parent_and_the_kubelet_figures() {
        let p = pod(7, Qos::Burstable);
        let c = container(7, &p, Qos::Burstable);
        let parent = &p.linux.as_ref().unwrap().cgroup_parent;
        assert!(parent.starts_with("/kubepods/burstable/pod"), "{parent}");
        let cpu = c.linux.resources.cpu.as_ref().unwrap();
        assert_eq!(cpu.shares.value, 51);
        assert_eq!(cpu.quota.value, 100_000);
        assert_eq!(c.pod_sandbox_id, p.id);
        let g = pod(0, Qos::Guaranteed);
        assert!(!g.linux.cgroup_parent.contains("burstable"));
        let be = container(16, &pod(16, Qos::BestEffort), Qos::BestEffort);
        let cpu = be.linux.resources.cpu.as_ref().unwrap();
        assert_eq!((cpu.shares.value, cpu.quota.is_none()), (2, true));
    }
}
