//! CRI proxy mode (`--container-runtime-mode=Containerd`).
//!
//! Serves the CRI RuntimeService and ImageService (v1) on a unix socket and forwards every call
//! to the runtime's socket. CreateContainer gets its cpuset (and mems) and the grant record
//! annotation; UpdateContainerResources is re-placed; StopContainer and RemoveContainer release
//! (idempotently). At start the state is rebuilt from ListPodSandbox/PodSandboxStatus and
//! ListContainers/ContainerStatus (verbose). Every other call, the server-streaming
//! GetContainerEvents included, passes through untouched.
//!
//! The engine knows a container by `<sandbox id>/<name>/<attempt>`, a key that exists before
//! the runtime assigns the container id (and that restore rebuilds from ContainerStatus); the
//! proxy maps ids to keys.

use crate::agent::{Agent, ContainerInfo, PodInfo, Update};
use crate::docker_proxy::RecordFile;
use crate::flags::Flags;
use anyhow::Context;
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::image_service_server::{ImageService, ImageServiceServer};
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tap_engine::request::GRANT_KEY;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Request, Response, Status};

/// Message size limit both ways (the kubelet's).
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// Pure logic.

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

fn apply_linux_resources(info: &mut ContainerInfo, r: &cri::LinuxContainerResources) {
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

/// Writes an adjustment into a CreateContainer request: `linux.resources.cpuset_cpus/mems` and
/// the grant record annotation. Returns whether anything changed.
pub fn rewrite_create(req: &mut cri::CreateContainerRequest, adj: &crate::Adjustment) -> bool {
    if adj.cpus.is_none() && adj.mems.is_none() {
        return false;
    }
    let Some(cfg) = req.config.as_mut() else {
        return false;
    };
    let res = cfg
        .linux
        .get_or_insert_with(Default::default)
        .resources
        .get_or_insert_with(Default::default);
    if let Some(c) = &adj.cpus {
        res.cpuset_cpus = c.clone();
    }
    if let Some(m) = &adj.mems {
        res.cpuset_mems = m.clone();
    }
    if let Some(r) = &adj.record {
        cfg.annotations.insert(GRANT_KEY.to_string(), r.clone());
    }
    true
}

/// The resources to send for an [`Update`] of another container: what it has, new cpuset.
pub fn update_resources(info: &ContainerInfo, u: &Update) -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_shares: info.cpu_shares.unwrap_or(0) as i64,
        cpu_quota: info.cpu_quota.unwrap_or(0),
        cpu_period: info.cpu_period.unwrap_or(0) as i64,
        memory_limit_in_bytes: info.memory_limit.unwrap_or(0),
        cpuset_cpus: u.cpus.clone(),
        cpuset_mems: u.mems.clone().unwrap_or_default(),
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
    if let Some(s) = cpu["cpus"].as_str().filter(|s| !s.is_empty()) {
        c.cpus = Some(s.to_string());
    }
    if let Some(s) = cpu["mems"].as_str().filter(|s| !s.is_empty()) {
        c.mems = Some(s.to_string());
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

// ---------------------------------------------------------------------------------------------
// The proxy.

#[derive(Default)]
struct Known {
    /// Engine key -> container.
    by_key: HashMap<String, ContainerInfo>,
    /// Runtime container id -> engine key.
    ids: HashMap<String, String>,
}

impl Known {
    fn id_of(&self, key: &str) -> Option<String> {
        self.ids
            .iter()
            .find(|(_, k)| k.as_str() == key)
            .map(|(id, _)| id.clone())
    }
}

#[derive(Clone)]
pub struct CriProxy {
    inner: Arc<Inner>,
}

struct Inner {
    agent: Arc<Agent>,
    /// Records changed by UpdateContainerResources (annotations are fixed at create).
    records: Option<RecordFile>,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    known: Mutex<Known>,
}

/// A lazily connected channel to a unix socket.
pub fn unix_channel(path: &Path) -> anyhow::Result<Channel> {
    let path = path.to_path_buf();
    Ok(Endpoint::try_from("http://[::]:50051")?
        .connect_timeout(Duration::from_secs(10))
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
        Ok(CriProxy {
            inner: Arc::new(Inner {
                agent,
                records: state_dir.map(|d| RecordFile::new(d.join("cri-grants.json"))),
                runtime: RuntimeServiceClient::new(ch.clone())
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
                images: ImageServiceClient::new(ch)
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
                known: Mutex::new(Known::default()),
            }),
        })
    }

    fn rt(&self) -> RuntimeServiceClient<Channel> {
        self.inner.runtime.clone()
    }

    fn img(&self) -> ImageServiceClient<Channel> {
        self.inner.images.clone()
    }

    fn agent(&self) -> &Agent {
        &self.inner.agent
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.inner.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn apply_updates(&self, updates: &[Update]) {
        for u in updates {
            let target = {
                let k = self.known();
                k.id_of(&u.container_id).map(|id| {
                    (
                        id,
                        k.by_key.get(&u.container_id).cloned().unwrap_or_default(),
                    )
                })
            };
            let Some((id, info)) = target else {
                tracing::warn!(container = %u.container_id, "cpuset update for an unknown container");
                continue;
            };
            let req = cri::UpdateContainerResourcesRequest {
                container_id: id.clone(),
                linux: Some(update_resources(&info, u)),
                ..Default::default()
            };
            match self.rt().update_container_resources(req).await {
                Ok(_) => {
                    tracing::info!(container = %id, cpus = %u.cpus, "cpuset updated");
                    if let Some(i) = self.known().by_key.get_mut(&u.container_id) {
                        i.cpus = Some(u.cpus.clone());
                    }
                }
                Err(e) => {
                    tracing::warn!(container = %id, "cpuset update failed: {e}");
                    self.agent().metrics().count_error("update", "runtime");
                }
            }
        }
    }

    /// Rebuilds the state from the runtime. Returns how many containers were reported.
    pub async fn restore(&self) -> anyhow::Result<usize> {
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
        let containers = self
            .rt()
            .list_containers(cri::ListContainersRequest::default())
            .await
            .context("ListContainers")?
            .into_inner()
            .containers;
        let records = self
            .inner
            .records
            .as_ref()
            .map(RecordFile::load)
            .unwrap_or_default();
        let mut infos = Vec::new();
        let mut ids = HashMap::new();
        for c in containers {
            if c.state == cri::ContainerState::ContainerExited as i32 {
                continue;
            }
            let Ok(st) = self
                .rt()
                .container_status(cri::ContainerStatusRequest {
                    container_id: c.id.clone(),
                    verbose: true,
                })
                .await
            else {
                continue; // gone meanwhile
            };
            let st = st.into_inner();
            let md = c.metadata.clone().unwrap_or_default();
            let key = container_key(&c.pod_sandbox_id, &md.name, md.attempt);
            let mut info = ContainerInfo {
                id: key.clone(),
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
                if !r.cpuset_cpus.is_empty() {
                    info.cpus = Some(r.cpuset_cpus.clone());
                }
                if !r.cpuset_mems.is_empty() {
                    info.mems = Some(r.cpuset_mems.clone());
                }
            }
            resources_from_verbose(&st.info, &mut info);
            if let Some(r) = records.get(&key) {
                info.annotations.insert(GRANT_KEY.into(), r.clone());
            }
            ids.insert(c.id, key);
            infos.push(info);
        }
        let updates = self.agent().restore(&infos);
        {
            let mut k = self.known();
            for i in &infos {
                k.by_key.insert(i.id.clone(), i.clone());
            }
            k.ids.extend(ids);
        }
        self.apply_updates(&updates).await;
        Ok(infos.len())
    }

    async fn release(&self, container_id: &str, forget: bool) {
        let key = self.known().ids.get(container_id).cloned();
        if let Some(key) = key {
            let ups = self.agent().remove(&key);
            self.store_record(&key, None);
            if forget {
                let mut k = self.known();
                k.by_key.remove(&key);
                k.ids.remove(container_id);
            }
            self.apply_updates(&ups).await;
        }
    }

    fn store_record(&self, key: &str, record: Option<&str>) {
        if let Some(f) = &self.inner.records {
            if let Err(e) = f.store(key, record) {
                tracing::warn!(file = %f.path.display(), "cannot store the grant record: {e}");
                self.agent().metrics().count_error("update", "state");
            }
        }
    }

    fn observe(&self, method: &str, start: Instant) {
        self.agent()
            .metrics()
            .observe_proxy(method, start.elapsed());
    }
}

macro_rules! forward {
    ($client:ident; $($name:ident($req:ty) -> $resp:ty;)*) => {
        $(
            // The shape `#[async_trait]` gives trait methods (it cannot see into a macro).
            fn $name<'life0, 'async_trait>(
                &'life0 self,
                r: Request<$req>,
            ) -> std::pin::Pin<
                Box<dyn std::future::Future<Output = Result<Response<$resp>, Status>> + Send + 'async_trait>,
            >
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                let mut c = self.$client();
                Box::pin(async move { c.$name(r.into_inner()).await })
            }
        )*
    };
}

#[tonic::async_trait]
impl RuntimeService for CriProxy {
    forward! { rt;
        version(cri::VersionRequest) -> cri::VersionResponse;
        run_pod_sandbox(cri::RunPodSandboxRequest) -> cri::RunPodSandboxResponse;
        stop_pod_sandbox(cri::StopPodSandboxRequest) -> cri::StopPodSandboxResponse;
        remove_pod_sandbox(cri::RemovePodSandboxRequest) -> cri::RemovePodSandboxResponse;
        pod_sandbox_status(cri::PodSandboxStatusRequest) -> cri::PodSandboxStatusResponse;
        list_pod_sandbox(cri::ListPodSandboxRequest) -> cri::ListPodSandboxResponse;
        start_container(cri::StartContainerRequest) -> cri::StartContainerResponse;
        list_containers(cri::ListContainersRequest) -> cri::ListContainersResponse;
        container_status(cri::ContainerStatusRequest) -> cri::ContainerStatusResponse;
        reopen_container_log(cri::ReopenContainerLogRequest) -> cri::ReopenContainerLogResponse;
        exec_sync(cri::ExecSyncRequest) -> cri::ExecSyncResponse;
        exec(cri::ExecRequest) -> cri::ExecResponse;
        attach(cri::AttachRequest) -> cri::AttachResponse;
        port_forward(cri::PortForwardRequest) -> cri::PortForwardResponse;
        container_stats(cri::ContainerStatsRequest) -> cri::ContainerStatsResponse;
        list_container_stats(cri::ListContainerStatsRequest) -> cri::ListContainerStatsResponse;
        pod_sandbox_stats(cri::PodSandboxStatsRequest) -> cri::PodSandboxStatsResponse;
        list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest) -> cri::ListPodSandboxStatsResponse;
        update_runtime_config(cri::UpdateRuntimeConfigRequest) -> cri::UpdateRuntimeConfigResponse;
        status(cri::StatusRequest) -> cri::StatusResponse;
        checkpoint_container(cri::CheckpointContainerRequest) -> cri::CheckpointContainerResponse;
        list_metric_descriptors(cri::ListMetricDescriptorsRequest) -> cri::ListMetricDescriptorsResponse;
        list_pod_sandbox_metrics(cri::ListPodSandboxMetricsRequest) -> cri::ListPodSandboxMetricsResponse;
        runtime_config(cri::RuntimeConfigRequest) -> cri::RuntimeConfigResponse;
    }

    type GetContainerEventsStream = tonic::Streaming<cri::ContainerEventResponse>;

    async fn get_container_events(
        &self,
        r: Request<cri::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        self.rt().get_container_events(r.into_inner()).await
    }

    async fn create_container(
        &self,
        r: Request<cri::CreateContainerRequest>,
    ) -> Result<Response<cri::CreateContainerResponse>, Status> {
        let start = Instant::now();
        let mut req = r.into_inner();
        let pod = match &req.sandbox_config {
            Some(sc) => Some(pod_from_config(sc)),
            None => self
                .rt()
                .pod_sandbox_status(cri::PodSandboxStatusRequest {
                    pod_sandbox_id: req.pod_sandbox_id.clone(),
                    verbose: true,
                })
                .await
                .ok()
                .map(|st| {
                    let st = st.into_inner();
                    let cg = cgroup_parent_from_verbose(&st.info);
                    let s = st.status.unwrap_or_default();
                    let md = s.metadata.unwrap_or_default();
                    PodInfo {
                        uid: md.uid,
                        name: md.name,
                        namespace: md.namespace,
                        labels: s.labels,
                        annotations: s.annotations,
                        cgroup_parent: cg,
                    }
                }),
        };
        // An unknown sandbox is forwarded unmodified.
        let placed = pod.and_then(|pod| info_from_create(&req, pod)).map(|info| {
            let adj = self.agent().create(&info);
            rewrite_create(&mut req, &adj);
            (info, adj)
        });
        let res = self.rt().create_container(req).await;
        if let Some((mut info, adj)) = placed {
            match &res {
                Ok(resp) => {
                    info.cpus = adj.cpus.clone();
                    info.mems = adj.mems.clone();
                    if let Some(r) = &adj.record {
                        info.annotations.insert(GRANT_KEY.into(), r.clone());
                    }
                    {
                        let mut k = self.known();
                        k.ids
                            .insert(resp.get_ref().container_id.clone(), info.id.clone());
                        k.by_key.insert(info.id.clone(), info);
                    }
                    self.apply_updates(&adj.updates).await;
                }
                Err(_) => {
                    // The runtime refused: give the CPUs back.
                    let ups = self.agent().remove(&info.id);
                    self.apply_updates(&ups).await;
                }
            }
        }
        self.observe("CreateContainer", start);
        res
    }

    async fn update_container_resources(
        &self,
        r: Request<cri::UpdateContainerResourcesRequest>,
    ) -> Result<Response<cri::UpdateContainerResourcesResponse>, Status> {
        let start = Instant::now();
        let mut req = r.into_inner();
        let known = {
            let k = self.known();
            k.ids
                .get(&req.container_id)
                .and_then(|key| k.by_key.get(key))
                .cloned()
        };
        let mut updates = Vec::new();
        if let (Some(mut info), Some(linux)) = (known, req.linux.as_mut()) {
            apply_linux_resources(&mut info, linux);
            let adj = self.agent().update(&info);
            if let Some(c) = &adj.cpus {
                linux.cpuset_cpus = c.clone();
                info.cpus = Some(c.clone());
            }
            if let Some(m) = &adj.mems {
                linux.cpuset_mems = m.clone();
                info.mems = Some(m.clone());
            }
            if let Some(rec) = &adj.record {
                info.annotations.insert(GRANT_KEY.into(), rec.clone());
                req.annotations.insert(GRANT_KEY.into(), rec.clone());
                self.store_record(&info.id, Some(rec));
            }
            self.known().by_key.insert(info.id.clone(), info);
            updates = adj.updates;
        }
        let res = self.rt().update_container_resources(req).await;
        if res.is_ok() {
            self.apply_updates(&updates).await;
        }
        self.observe("UpdateContainerResources", start);
        res
    }

    async fn stop_container(
        &self,
        r: Request<cri::StopContainerRequest>,
    ) -> Result<Response<cri::StopContainerResponse>, Status> {
        let start = Instant::now();
        let req = r.into_inner();
        let id = req.container_id.clone();
        let res = self.rt().stop_container(req).await;
        match &res {
            Ok(_) => self.release(&id, false).await,
            Err(s) if s.code() == tonic::Code::NotFound => self.release(&id, true).await,
            Err(_) => {}
        }
        self.observe("StopContainer", start);
        res
    }

    async fn remove_container(
        &self,
        r: Request<cri::RemoveContainerRequest>,
    ) -> Result<Response<cri::RemoveContainerResponse>, Status> {
        let start = Instant::now();
        let req = r.into_inner();
        let id = req.container_id.clone();
        let res = self.rt().remove_container(req).await;
        match &res {
            Ok(_) => self.release(&id, true).await,
            Err(s) if s.code() == tonic::Code::NotFound => self.release(&id, true).await,
            Err(_) => {}
        }
        self.observe("RemoveContainer", start);
        res
    }
}

#[tonic::async_trait]
impl ImageService for CriProxy {
    forward! { img;
        list_images(cri::ListImagesRequest) -> cri::ListImagesResponse;
        image_status(cri::ImageStatusRequest) -> cri::ImageStatusResponse;
        pull_image(cri::PullImageRequest) -> cri::PullImageResponse;
        remove_image(cri::RemoveImageRequest) -> cri::RemoveImageResponse;
        image_fs_info(cri::ImageFsInfoRequest) -> cri::ImageFsInfoResponse;
    }
}

/// Serves both services on `listener` until `shutdown`.
pub async fn serve(
    proxy: CriProxy,
    listener: tokio::net::UnixListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    tonic::transport::Server::builder()
        .add_service(
            RuntimeServiceServer::new(proxy.clone())
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        )
        .add_service(
            ImageServiceServer::new(proxy)
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        )
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await
        .context("serving CRI")
}

/// Runs until `shutdown` is cancelled.
pub async fn run(
    flags: &Flags,
    agent: Arc<Agent>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let backend: PathBuf = flags.runtime_endpoint_path();
    let proxy = CriProxy::new(agent.clone(), &backend, Some(&flags.state_dir))?;
    let mut delay = Duration::from_millis(200);
    loop {
        match proxy.restore().await {
            Ok(n) => {
                tracing::info!(containers = n, "state rebuilt from the CRI runtime");
                break;
            }
            Err(e) => {
                tracing::warn!("cannot rebuild state from {} yet: {e:#}", backend.display());
                agent.metrics().count_error("sync", "runtime");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
    let listener = crate::docker_proxy::bind_unix(&flags.runtime_proxy_endpoint)?;
    agent.metrics().proxy_up.set(1);
    agent.metrics().runtime_connected.set(1);
    agent.metrics().set_ready(true);
    tracing::info!(socket = %flags.runtime_proxy_endpoint.display(), backend = %backend.display(), "CRI proxy serving");
    let res = serve(proxy, listener, shutdown).await;
    agent.metrics().proxy_up.set(0);
    let _ = std::fs::remove_file(&flags.runtime_proxy_endpoint);
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Adjustment;

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
        assert_eq!(info.cpu_shares, Some(4096));
        assert_eq!(info.cpu_quota, Some(800_000));
        assert_eq!(info.cpu_period, Some(100_000));
        assert_eq!(info.memory_limit, Some(1 << 30));
        assert_eq!(info.env, vec!["VA_VISIBLE_DEVICES=0"]);
        let mut no_cfg = create_req();
        no_cfg.config = None;
        assert!(info_from_create(&no_cfg, PodInfo::default()).is_none());
    }

    #[test]
    fn create_request_is_rewritten() {
        let mut req = create_req();
        let adj = Adjustment {
            cpus: Some("0-23".into()),
            mems: Some("0".into()),
            record: Some("v1;x".into()),
            updates: vec![],
        };
        assert!(rewrite_create(&mut req, &adj));
        let cfg = req.config.as_ref().unwrap();
        let r = cfg.linux.as_ref().unwrap().resources.as_ref().unwrap();
        assert_eq!(r.cpuset_cpus, "0-23");
        assert_eq!(r.cpuset_mems, "0");
        assert_eq!(r.cpu_shares, 4096);
        assert_eq!(
            cfg.annotations.get(GRANT_KEY).map(String::as_str),
            Some("v1;x")
        );
        assert_eq!(cfg.annotations.get("a").map(String::as_str), Some("b"));
        // Empty adjustment: untouched. No linux section: created.
        let mut req2 = create_req();
        assert!(!rewrite_create(&mut req2, &Adjustment::default()));
        assert_eq!(req2, create_req());
        req2.config.as_mut().unwrap().linux = None;
        assert!(rewrite_create(&mut req2, &adj));
        assert_eq!(
            req2.config
                .unwrap()
                .linux
                .unwrap()
                .resources
                .unwrap()
                .cpuset_cpus,
            "0-23"
        );
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
        assert_eq!(c.cpus.as_deref(), Some("0-1"));
        assert_eq!(c.mems.as_deref(), Some("0"));
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
    fn updates_keep_the_other_resources() {
        let info = ContainerInfo {
            cpu_shares: Some(1024),
            cpu_quota: Some(100_000),
            cpu_period: Some(100_000),
            memory_limit: Some(1 << 20),
            ..Default::default()
        };
        let r = update_resources(
            &info,
            &Update {
                container_id: "k".into(),
                cpus: "4-7".into(),
                mems: None,
            },
        );
        assert_eq!(r.cpu_shares, 1024);
        assert_eq!(r.cpu_quota, 100_000);
        assert_eq!(r.memory_limit_in_bytes, 1 << 20);
        assert_eq!(r.cpuset_cpus, "4-7");
        assert_eq!(r.cpuset_mems, "");
    }
}
