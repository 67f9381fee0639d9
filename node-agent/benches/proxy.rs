//! CRI proxy overhead: a pass-through unary call (`Version`) through the proxy versus the same
//! call straight to the backend. The backend is a real tonic CRI server on a unix socket, started
//! here; the proxy is the production `cri_proxy` code on another unix socket in front of it.
//! The difference of the two medians is the proxy's added latency.

use criterion::{criterion_group, criterion_main, Criterion};
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use node_agent::agent::Agent;
use node_agent::cri_proxy::{serve, unix_channel, CriProxy};
use node_agent::metrics::Metrics;
use std::path::PathBuf;
use std::sync::Arc;
use tap_engine::sysfs::discover_dir;
use tap_engine::{Engine, EngineConfig, Topology};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

struct Backend;

macro_rules! unimplemented_calls {
    ($($name:ident($req:ty) -> $resp:ty;)*) => {
        $(
            fn $name<'life0, 'async_trait>(
                &'life0 self,
                _r: Request<$req>,
            ) -> std::pin::Pin<
                Box<dyn std::future::Future<Output = Result<Response<$resp>, Status>> + Send + 'async_trait>,
            >
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(async { Err(Status::unimplemented(stringify!($name))) })
            }
        )*
    };
}

#[tonic::async_trait]
impl RuntimeService for Backend {
    async fn version(
        &self,
        _r: Request<cri::VersionRequest>,
    ) -> Result<Response<cri::VersionResponse>, Status> {
        Ok(Response::new(cri::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "bench".into(),
            runtime_version: "1".into(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn list_pod_sandbox(
        &self,
        _r: Request<cri::ListPodSandboxRequest>,
    ) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
        Ok(Response::new(Default::default()))
    }

    async fn list_containers(
        &self,
        _r: Request<cri::ListContainersRequest>,
    ) -> Result<Response<cri::ListContainersResponse>, Status> {
        Ok(Response::new(Default::default()))
    }

    unimplemented_calls! {
        run_pod_sandbox(cri::RunPodSandboxRequest) -> cri::RunPodSandboxResponse;
        stop_pod_sandbox(cri::StopPodSandboxRequest) -> cri::StopPodSandboxResponse;
        remove_pod_sandbox(cri::RemovePodSandboxRequest) -> cri::RemovePodSandboxResponse;
        pod_sandbox_status(cri::PodSandboxStatusRequest) -> cri::PodSandboxStatusResponse;
        create_container(cri::CreateContainerRequest) -> cri::CreateContainerResponse;
        start_container(cri::StartContainerRequest) -> cri::StartContainerResponse;
        stop_container(cri::StopContainerRequest) -> cri::StopContainerResponse;
        remove_container(cri::RemoveContainerRequest) -> cri::RemoveContainerResponse;
        container_status(cri::ContainerStatusRequest) -> cri::ContainerStatusResponse;
        update_container_resources(cri::UpdateContainerResourcesRequest) -> cri::UpdateContainerResourcesResponse;
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
        _r: Request<cri::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        Err(Status::unimplemented("events"))
    }
}

fn fixture_agent() -> Arc<Agent> {
    let root = std::env::var_os("TAP_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/sysfs")
        })
        .join("synthetic-2s-4numa-96c-gpu");
    let topo = Arc::new(Topology::build(&discover_dir(&root).expect("fixture")).expect("topology"));
    Arc::new(Agent::new(
        Engine::new(topo, EngineConfig::default()),
        Arc::new(Metrics::new()),
        None,
        "bench",
    ))
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = std::env::temp_dir().join(format!("tap-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let backend_sock = dir.join("backend.sock");
    let proxy_sock = dir.join("proxy.sock");
    let stop = CancellationToken::new();

    let (mut direct, mut proxied) = rt.block_on(async {
        let l = tokio::net::UnixListener::bind(&backend_sock).expect("bind backend");
        let s = stop.clone();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(RuntimeServiceServer::new(Backend))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(l),
                    s.cancelled_owned(),
                )
                .await
                .expect("backend");
        });
        let proxy = CriProxy::new(fixture_agent(), &backend_sock, None).expect("proxy");
        proxy.restore().await.expect("restore");
        let l = tokio::net::UnixListener::bind(&proxy_sock).expect("bind proxy");
        tokio::spawn(serve(proxy, l, stop.clone()));
        let direct = RuntimeServiceClient::new(unix_channel(&backend_sock).expect("channel"));
        let proxied = RuntimeServiceClient::new(unix_channel(&proxy_sock).expect("channel"));
        (direct, proxied)
    });

    let mut g = c.benchmark_group("cri_version");
    g.bench_function("direct", |b| {
        b.iter(|| {
            rt.block_on(direct.version(cri::VersionRequest::default()))
                .expect("direct call")
        })
    });
    g.bench_function("via_proxy", |b| {
        b.iter(|| {
            rt.block_on(proxied.version(cri::VersionRequest::default()))
                .expect("proxied call")
        })
    });
    g.finish();
    stop.cancel();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
