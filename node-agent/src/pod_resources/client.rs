//! The kubelet's pod-resources service over its unix socket: `Get` for the one pod (the
//! kubelet's default since 1.34), `List` where `Get` is not served (older kubelets, or the
//! `KubeletPodResourcesGet` gate off), remembered for the process.

use super::dra::DraTopology;
use super::proto::{self, GetPodResourcesRequest, ListPodResourcesRequest};
use super::{
    container_devices, count_zone_devices, ContainerRef, DeviceSource, KubeletDevice,
    PodResourcesError, ZoneDevices,
};
use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Status};

/// How long connecting to the socket may take (the call's own timeout is the caller's).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The kubelet's default socket.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

pub struct KubeletPodResources {
    socket: PathBuf,
    /// Where this node's DRA devices are (kept by the kube link).
    dra: Arc<DraTopology>,
    channel: Channel,
    /// `Get` answered "not served": use `List` from now on.
    get_unserved: AtomicBool,
}

impl KubeletPodResources {
    /// A client of the socket at `socket`; connects at the first call (and again after the
    /// kubelet restarts). Call it inside the async runtime (the channel's worker is spawned).
    pub fn new(socket: &Path, dra: Arc<DraTopology>) -> KubeletPodResources {
        let path = socket.to_path_buf();
        let channel = Endpoint::from_static("http://[::]:50051")
            .connect_timeout(CONNECT_TIMEOUT)
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let p = path.clone();
                async move { tokio::net::UnixStream::connect(p).await.map(TokioIo::new) }
            }));
        KubeletPodResources {
            socket: socket.to_path_buf(),
            dra,
            channel,
            get_unserved: AtomicBool::new(false),
        }
    }

    async fn call<Req, Resp>(&self, method: &'static str, req: Req) -> Result<Resp, Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("{}: {e}", self.socket.display())))?;
        let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
        let path = PathAndQuery::from_static(method);
        grpc.unary(tonic::Request::new(req), path, codec)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn get(&self, c: ContainerRef<'_>) -> Result<Option<proto::PodResources>, Status> {
        let req = GetPodResourcesRequest {
            pod_name: c.pod.to_string(),
            pod_namespace: c.namespace.to_string(),
        };
        let resp: proto::GetPodResourcesResponse = self.call(proto::GET, req).await?;
        Ok(resp.pod_resources)
    }

    async fn list(&self, c: ContainerRef<'_>) -> Result<Option<proto::PodResources>, Status> {
        let resp: proto::ListPodResourcesResponse =
            self.call(proto::LIST, ListPodResourcesRequest {}).await?;
        Ok(resp
            .pod_resources
            .into_iter()
            .find(|p| p.name == c.pod && p.namespace == c.namespace))
    }

    async fn pod(
        &self,
        c: ContainerRef<'_>,
    ) -> Result<Option<proto::PodResources>, PodResourcesError> {
        if !self.get_unserved.load(Ordering::Relaxed) {
            match self.get(c).await {
                Ok(p) => return Ok(p),
                Err(s) if get_not_served(&s) => {
                    tracing::info!(error = %s.message(), "the kubelet does not serve pod-resources Get; using List");
                    self.get_unserved.store(true, Ordering::Relaxed);
                }
                Err(status) => return Err(failed("Get")(status)),
            }
        }
        self.list(c).await.map_err(failed("List"))
    }
}

/// The error of a call of `method` that the kubelet answered with `status`.
fn failed(method: &'static str) -> impl FnOnce(Status) -> PodResourcesError {
    move |status| PodResourcesError::Call {
        method,
        status: Box::new(status),
    }
}

/// `Get` unknown to the kubelet (before 1.27) or behind its feature gate.
fn get_not_served(s: &Status) -> bool {
    s.code() == Code::Unimplemented || s.message().contains("Get method disabled")
}

impl KubeletPodResources {
    async fn zone_counts(&self) -> Result<Vec<ZoneDevices>, PodResourcesError> {
        let alloc: proto::AllocatableResourcesResponse = self
            .call(proto::ALLOCATABLE, proto::AllocatableResourcesRequest {})
            .await
            .map_err(failed("GetAllocatableResources"))?;
        let list: proto::ListPodResourcesResponse = self
            .call(proto::LIST, ListPodResourcesRequest {})
            .await
            .map_err(failed("List"))?;
        Ok(count_zone_devices(&alloc.devices, &list.pod_resources))
    }
}

#[async_trait::async_trait]
impl DeviceSource for KubeletPodResources {
    async fn zone_devices(&self) -> Result<Vec<ZoneDevices>, PodResourcesError> {
        if !self.socket.exists() {
            return Err(PodResourcesError::NoSocket(self.socket.clone()));
        }
        self.zone_counts().await
    }

    async fn devices(&self, c: ContainerRef<'_>) -> Result<Vec<KubeletDevice>, PodResourcesError> {
        if !self.socket.exists() {
            return Err(PodResourcesError::NoSocket(self.socket.clone()));
        }
        match self.pod(c).await? {
            Some(p) => Ok(container_devices(&p, c.container, &self.dra)),
            None => Err(PodResourcesError::PodNotListed(format!(
                "{}/{}",
                c.namespace, c.pod
            ))),
        }
    }
}
