//! CRI proxy overhead: pass-through calls through the proxy versus the same calls straight to
//! the runtime.
//!
//! Threads are laid out as on a node: the runtime (a real tonic CRI server on a unix socket,
//! standing in for containerd) runs on its own thread, the proxy (the production `cri_proxy`
//! code) on a 2-worker runtime like the agent's, and the client (the kubelet) on the bench
//! thread. The difference of the medians is what the proxy adds: its relay work plus one more
//! round trip between threads.
//!
//! `platform/unix_round_trip` measures that round trip alone (one byte each way over a unix
//! socket pair, to an echo thread), so the proxy's share can be told from the machine's.
//! Under `taskset -c 0` every thread shares one CPU: no cross-CPU wake-ups, and the
//! difference is the proxy's processing alone.

use criterion::{criterion_group, criterion_main, Criterion};
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use node_agent::agent::Agent;
use node_agent::cri_proxy::{serve, unix_channel, CriProxy};
use node_agent::metrics::Metrics;
use std::io::{Read, Write};
use std::sync::Arc;
use tap_engine::{Engine, EngineConfig, Topology};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// The runtime: answers Version, and ListContainers with a prepared list.
struct Backend {
    containers: cri::ListContainersResponse,
}

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
        Ok(Response::new(self.containers.clone()))
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
    let topo = Arc::new(
        Topology::build(
            &tap_engine::testdata::discover_fixture("synthetic-2s-4numa-96c-gpu").expect("fixture"),
        )
        .expect("topology"),
    );
    Arc::new(Agent::new(
        Engine::new(topo, EngineConfig::default()),
        Arc::new(Metrics::new()),
        None,
        "bench",
    ))
}

/// `n` running containers as containerd lists them (about 400 bytes each).
fn container_list(n: usize) -> cri::ListContainersResponse {
    cri::ListContainersResponse {
        containers: (0..n)
            .map(|i| cri::Container {
                id: format!("{i:064x}"),
                pod_sandbox_id: format!("{:064x}", i / 2),
                metadata: Some(cri::ContainerMetadata {
                    name: format!("app-{i}"),
                    attempt: 0,
                }),
                image: Some(cri::ImageSpec {
                    image: "sha256:0123456789abcdef".into(),
                    ..Default::default()
                }),
                image_ref: "registry.example/app@sha256:0123456789abcdef".into(),
                state: cri::ContainerState::ContainerRunning as i32,
                created_at: 1_700_000_000_000_000_000 + i as i64,
                labels: [
                    ("io.kubernetes.pod.name".to_string(), format!("web-{i}")),
                    (
                        "io.kubernetes.pod.namespace".to_string(),
                        "shop".to_string(),
                    ),
                    (
                        "io.kubernetes.container.name".to_string(),
                        format!("app-{i}"),
                    ),
                ]
                .into(),
                annotations: [(
                    "io.kubernetes.container.restartCount".to_string(),
                    "0".to_string(),
                )]
                .into(),
                ..Default::default()
            })
            .collect(),
    }
}

/// A runtime on a thread of its own (the tasks it runs stay on it).
fn runtime_thread(workers: usize) -> tokio::runtime::Handle {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = if workers == 0 {
            tokio::runtime::Builder::new_current_thread()
        } else {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(workers);
            b
        }
        .enable_all()
        .build()
        .expect("runtime");
        tx.send(rt.handle().clone()).expect("handle");
        rt.block_on(std::future::pending::<()>());
    });
    rx.recv().expect("runtime thread")
}

fn bench(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("tap-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let backend_sock = dir.join("backend.sock");
    let proxy_sock = dir.join("proxy.sock");
    let stop = CancellationToken::new();

    // The runtime (containerd's place): one thread.
    let containerd = runtime_thread(0);
    let l = containerd
        .block_on(async { tokio::net::UnixListener::bind(&backend_sock).expect("bind backend") });
    let s = stop.clone();
    let backend = Backend {
        containers: container_list(500),
    };
    containerd.spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RuntimeServiceServer::new(backend).max_encoding_message_size(64 << 20))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(l),
                s.cancelled_owned(),
            )
            .await
            .expect("backend");
    });

    // The proxy: two workers, as the agent's runtime.
    let agent = runtime_thread(2);
    let (b, p, s) = (backend_sock.clone(), proxy_sock.clone(), stop.clone());
    agent.block_on(async move {
        let proxy = CriProxy::new(fixture_agent(), &b, None).expect("proxy");
        proxy.restore().await.expect("restore");
        let l = tokio::net::UnixListener::bind(&p).expect("bind proxy");
        tokio::spawn(serve(proxy, l, s, std::time::Duration::from_secs(1)));
    });

    // The kubelet: the bench thread.
    let kubelet = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (mut direct, mut proxied) = kubelet.block_on(async {
        let client = |path: &std::path::Path| {
            RuntimeServiceClient::new(unix_channel(path).expect("channel"))
                .max_decoding_message_size(64 << 20)
        };
        (client(&backend_sock), client(&proxy_sock))
    });

    let mut g = c.benchmark_group("cri_version");
    g.bench_function("direct", |b| {
        b.iter(|| {
            kubelet
                .block_on(direct.version(cri::VersionRequest::default()))
                .expect("direct call")
        })
    });
    g.bench_function("via_proxy", |b| {
        b.iter(|| {
            kubelet
                .block_on(proxied.version(cri::VersionRequest::default()))
                .expect("proxied call")
        })
    });
    g.finish();

    // A larger answer: 500 containers, about 200 KB.
    let mut g = c.benchmark_group("cri_list_containers_500");
    for (name, client) in [("direct", &mut direct), ("via_proxy", &mut proxied)] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let r = kubelet
                    .block_on(client.list_containers(cri::ListContainersRequest::default()))
                    .expect("list");
                assert_eq!(r.get_ref().containers.len(), 500);
                r
            })
        });
    }
    g.finish();

    // The machine's own cost of one round trip between two threads.
    let (mut near, far) = std::os::unix::net::UnixStream::pair().expect("socket pair");
    std::thread::spawn(move || {
        let mut far = far;
        let mut buf = [0u8; 1];
        while far.read_exact(&mut buf).is_ok() {
            if far.write_all(&buf).is_err() {
                break;
            }
        }
    });
    c.bench_function("platform/unix_round_trip", |b| {
        let mut buf = [7u8; 1];
        b.iter(|| {
            near.write_all(&buf).expect("ping");
            near.read_exact(&mut buf).expect("pong");
        })
    });
    drop(near);

    stop.cancel();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
