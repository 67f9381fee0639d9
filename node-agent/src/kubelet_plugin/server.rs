//! The DRA gRPC service over tonic's generic server, and the little plumbing both of the
//! plugin's services share (a unary method as an async closure, serving on a Unix listener).

use super::proto::{self, *};
use super::{ClaimRef, DraDriver, PreparedDevice};
use futures_util::future::{join_all, BoxFuture};
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};

/// Serves `svc` on `listener` until `stop` is cancelled.
pub(super) async fn serve<S>(
    listener: UnixListener,
    svc: S,
    stop: CancellationToken,
) -> Result<(), tonic::transport::Error>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    tonic::transport::Server::builder()
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
        .await
}

/// The last segment of a gRPC path: the method's name.
pub(super) fn method_of(req: &http::Request<Body>) -> String {
    req.uri()
        .path()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Answers one unary call with `f`.
pub(super) async fn unary<Req, Resp, F, Fut>(req: http::Request<Body>, f: F) -> http::Response<Body>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: FnOnce(Req) -> Fut + Send + 'static,
    Fut: Future<Output = Resp> + Send + 'static,
{
    let codec = tonic_prost::ProstCodec::<Resp, Req>::default();
    Grpc::new(codec).unary(Once(Some(f)), req).await
}

/// An async closure as a unary method (tonic calls it once per request).
struct Once<F>(Option<F>);

impl<Req, Resp, F, Fut> UnaryService<Req> for Once<F>
where
    F: FnOnce(Req) -> Fut,
    Fut: Future<Output = Resp> + Send + 'static,
    Resp: Send + 'static,
{
    type Response = Resp;
    type Future = BoxFuture<'static, Result<Response<Resp>, Status>>;

    fn call(&mut self, request: Request<Req>) -> Self::Future {
        match self.0.take() {
            Some(f) => {
                let answer = f(request.into_inner());
                Box::pin(async move { Ok(Response::new(answer.await)) })
            }
            None => Box::pin(std::future::ready(Err(Status::internal(
                "a unary method was called twice",
            )))),
        }
    }
}

/// The `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` service.
pub(super) struct DraService<D> {
    driver: Arc<D>,
}

impl<D> Clone for DraService<D> {
    fn clone(&self) -> Self {
        DraService {
            driver: self.driver.clone(),
        }
    }
}

impl<D: DraDriver> DraService<D> {
    pub(super) fn new(driver: Arc<D>) -> Self {
        DraService { driver }
    }

    async fn route(self, req: http::Request<Body>) -> http::Response<Body> {
        let driver = self.driver;
        match method_of(&req).as_str() {
            "NodePrepareResources" => {
                unary(req, |r: NodePrepareResourcesRequest| prepare_all(driver, r)).await
            }
            "NodeUnprepareResources" => {
                unary(req, |r: NodeUnprepareResourcesRequest| {
                    unprepare_all(driver, r)
                })
                .await
            }
            other => Status::unimplemented(other.to_string()).into_http(),
        }
    }
}

impl<D> NamedService for DraService<D> {
    const NAME: &'static str = proto::DRA_SERVICE;
}

impl<D: DraDriver> tower::Service<http::Request<Body>> for DraService<D> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.route(req).await) })
    }
}

fn claim_ref(c: Claim) -> ClaimRef {
    ClaimRef {
        namespace: c.namespace,
        uid: c.uid,
        name: c.name,
    }
}

/// Which of the driver's calls a claim is handed to.
#[derive(Debug, Clone, Copy)]
enum Step {
    Prepare,
    Unprepare,
}

/// Runs `call` for each claim on its own task; a claim's error or panic is its own answer.
async fn each_claim<T, Fut>(
    claims: Vec<Claim>,
    step: Step,
    call: impl Fn(ClaimRef) -> Fut,
) -> HashMap<String, Result<T, String>>
where
    T: Send + 'static,
    Fut: Future<Output = Result<T, String>> + Send + 'static,
{
    let tasks = claims.into_iter().map(|c| {
        let claim = claim_ref(c);
        let uid = claim.uid.clone();
        let task = tokio::spawn(call(claim));
        async move {
            let answer = task.await.unwrap_or_else(|e| {
                tracing::warn!(claim_uid = %uid, ?step, error = %e, "the DRA driver's task failed");
                Err(format!("{step:?} of the claim failed: {e}"))
            });
            (uid, answer)
        }
    });
    join_all(tasks).await.into_iter().collect()
}

/// The error and its sources, `outer: inner: ...`.
fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

async fn prepare_all<D: DraDriver>(
    driver: Arc<D>,
    req: NodePrepareResourcesRequest,
) -> NodePrepareResourcesResponse {
    let answers = each_claim(req.claims, Step::Prepare, |claim| {
        let driver = driver.clone();
        async move { driver.prepare(&claim).await.map_err(|e| error_text(&e)) }
    })
    .await;
    let claims = answers
        .into_iter()
        .map(|(uid, answer)| {
            let entry = match answer {
                Ok(devices) => NodePrepareResourceResponse {
                    devices: devices.into_iter().map(device).collect(),
                    error: String::new(),
                },
                Err(error) => NodePrepareResourceResponse {
                    devices: Vec::new(),
                    error,
                },
            };
            (uid, entry)
        })
        .collect();
    NodePrepareResourcesResponse { claims }
}

fn device(d: PreparedDevice) -> Device {
    Device {
        request_names: d.requests,
        pool_name: d.pool,
        device_name: d.device,
        cdi_device_ids: d.cdi_device_ids,
        share_id: None,
    }
}

async fn unprepare_all<D: DraDriver>(
    driver: Arc<D>,
    req: NodeUnprepareResourcesRequest,
) -> NodeUnprepareResourcesResponse {
    let answers = each_claim(req.claims, Step::Unprepare, |claim| {
        let driver = driver.clone();
        async move { driver.unprepare(&claim).await.map_err(|e| error_text(&e)) }
    })
    .await;
    let claims = answers
        .into_iter()
        .map(|(uid, answer)| {
            let error = answer.err().unwrap_or_default();
            (uid, NodeUnprepareResourceResponse { error })
        })
        .collect();
    NodeUnprepareResourcesResponse { claims }
}
