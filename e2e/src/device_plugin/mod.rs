//! A small device plugin for the cluster tier: it advertises devices of one extended resource
//! (`example.com/accel`) with NUMA topology to a real kubelet over the v1beta1 device-plugin
//! API (`Registration.Register`, then `DevicePlugin.ListAndWatch` and `Allocate`), so that a
//! Pod requesting one is given a device the way a GPU or NIC plugin gives it.

pub mod proto;

use anyhow::{Context, Result};
use futures_util::stream::{self, Stream, StreamExt};
use hyper_util::rt::TokioIo;
use proto::*;
use std::convert::Infallible;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::{Grpc, NamedService, ServerStreamingService, UnaryService};
use tonic::{Request, Response, Status};

/// One advertised device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccelDevice {
    pub id: String,
    pub numa_node: i64,
}

/// The environment variable `Allocate` sets in the container: the device ids, comma-separated.
pub const ENV: &str = "ACCEL_VISIBLE_DEVICES";

/// A running plugin: stopped and its socket removed on drop.
pub struct DevicePlugin {
    stop: CancellationToken,
    socket: PathBuf,
    allocations: Arc<Mutex<Vec<Vec<String>>>>,
}

impl DevicePlugin {
    /// Serves `devices` as `resource` on `<plugin_dir>/<name>.sock` and registers it with the
    /// kubelet's `<plugin_dir>/kubelet.sock`. Call on a Tokio runtime.
    pub async fn start(
        plugin_dir: &Path,
        name: &str,
        resource: &str,
        devices: Vec<AccelDevice>,
    ) -> Result<DevicePlugin> {
        let endpoint = format!("{name}.sock");
        let socket = plugin_dir.join(&endpoint);
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket)
            .with_context(|| format!("binding {}", socket.display()))?;
        let stop = CancellationToken::new();
        let allocations = Arc::new(Mutex::new(Vec::new()));
        let svc = Plugin {
            devices: Arc::new(devices),
            allocations: allocations.clone(),
            stop: stop.clone(),
        };
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let until = stop.clone();
        tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(incoming, until.cancelled_owned())
                .await;
            if let Err(e) = served {
                eprintln!("device plugin: {e}");
            }
        });
        register(&plugin_dir.join("kubelet.sock"), &endpoint, resource).await?;
        Ok(DevicePlugin {
            stop,
            socket,
            allocations,
        })
    }

    /// The device ids of each container `Allocate` was asked for, in order.
    pub fn allocated(&self) -> Vec<Vec<String>> {
        self.allocations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for DevicePlugin {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_file(&self.socket);
    }
}

async fn register(kubelet: &Path, endpoint: &str, resource: &str) -> Result<()> {
    let path = kubelet.to_path_buf();
    let channel = tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let p = path.clone();
            async move { tokio::net::UnixStream::connect(p).await.map(TokioIo::new) }
        }))
        .await
        .with_context(|| format!("connecting to {}", kubelet.display()))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.context("the kubelet's registration")?;
    let req = RegisterRequest {
        version: "v1beta1".into(),
        endpoint: endpoint.into(),
        resource_name: resource.into(),
        options: Some(DevicePluginOptions::default()),
    };
    let codec = tonic_prost::ProstCodec::<RegisterRequest, Empty>::default();
    let path = http::uri::PathAndQuery::from_static(REGISTER);
    grpc.unary(Request::new(req), path, codec)
        .await
        .context("Register")?;
    Ok(())
}

/// The `v1beta1.DevicePlugin` service.
#[derive(Clone)]
struct Plugin {
    devices: Arc<Vec<AccelDevice>>,
    allocations: Arc<Mutex<Vec<Vec<String>>>>,
    stop: CancellationToken,
}

impl NamedService for Plugin {
    const NAME: &'static str = SERVICE;
}

impl Plugin {
    fn list(&self) -> ListAndWatchResponse {
        let devices = self.devices.iter().map(|d| Device {
            id: d.id.clone(),
            health: "Healthy".into(),
            topology: Some(TopologyInfo {
                nodes: vec![NumaNode { id: d.numa_node }],
            }),
        });
        ListAndWatchResponse {
            devices: devices.collect(),
        }
    }

    fn allocate(&self, req: AllocateRequest) -> AllocateResponse {
        let mut seen = self.allocations.lock().unwrap_or_else(|p| p.into_inner());
        let container_responses = req
            .container_requests
            .into_iter()
            .map(|c| {
                seen.push(c.devices_ids.clone());
                ContainerAllocateResponse {
                    envs: [(ENV.to_string(), c.devices_ids.join(","))].into(),
                }
            })
            .collect();
        AllocateResponse {
            container_responses,
        }
    }

    async fn route(self, req: http::Request<Body>) -> http::Response<Body> {
        let method = req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_string();
        match method.as_str() {
            "GetDevicePluginOptions" => {
                unary(req, |_: Empty| Ok(DevicePluginOptions::default())).await
            }
            "ListAndWatch" => {
                let codec = tonic_prost::ProstCodec::<ListAndWatchResponse, Empty>::default();
                Grpc::new(codec).server_streaming(Watch(self), req).await
            }
            "Allocate" => unary(req, move |r: AllocateRequest| Ok(self.allocate(r))).await,
            "GetPreferredAllocation" => {
                unary(req, |_: PreferredAllocationRequest| {
                    Ok(PreferredAllocationResponse {})
                })
                .await
            }
            "PreStartContainer" => {
                unary(req, |_: PreStartContainerRequest| {
                    Ok(PreStartContainerResponse {})
                })
                .await
            }
            _ => Status::unimplemented(method).into_http(),
        }
    }
}

impl tower::Service<http::Request<Body>> for Plugin {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.route(req).await) })
    }
}

async fn unary<Req, Resp, F>(req: http::Request<Body>, f: F) -> http::Response<Body>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: FnMut(Req) -> Result<Resp, Status> + Send + 'static,
{
    let codec = tonic_prost::ProstCodec::<Resp, Req>::default();
    Grpc::new(codec).unary(Unary(f), req).await
}

/// A plain function as a unary method.
struct Unary<F>(F);

impl<Req, Resp, F> UnaryService<Req> for Unary<F>
where
    F: FnMut(Req) -> Result<Resp, Status>,
{
    type Response = Resp;
    type Future = std::future::Ready<Result<Response<Resp>, Status>>;

    fn call(&mut self, request: Request<Req>) -> Self::Future {
        std::future::ready((self.0)(request.into_inner()).map(Response::new))
    }
}

/// `ListAndWatch`: the devices once, then the stream stays open until the plugin stops.
struct Watch(Plugin);

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

impl ServerStreamingService<Empty> for Watch {
    type Response = ListAndWatchResponse;
    type ResponseStream = DeviceStream;
    type Future = std::future::Ready<Result<Response<DeviceStream>, Status>>;

    fn call(&mut self, _: Request<Empty>) -> Self::Future {
        let first = stream::iter([Ok(self.0.list())]);
        let stop = self.0.stop.clone().cancelled_owned();
        let rest = stream::once(stop).filter_map(|_| async { None });
        let s: DeviceStream = Box::pin(first.chain(rest));
        std::future::ready(Ok(Response::new(s)))
    }
}
