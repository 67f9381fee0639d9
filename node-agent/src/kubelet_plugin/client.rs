//! The kubelet's side of the plugin's sockets: a gRPC channel over a Unix socket and one unary
//! call. For the plugin's tests and benches, which call the sockets as the kubelet does.

use hyper_util::rt::TokioIo;
use std::path::PathBuf;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint, Uri};

/// A channel to the Unix socket `socket`, connected on its first call.
pub fn channel(socket: PathBuf) -> Channel {
    Endpoint::from_static("http://[::]:50051").connect_with_connector_lazy(tower::service_fn(
        move |_: Uri| {
            let p = socket.clone();
            async move { tokio::net::UnixStream::connect(p).await.map(TokioIo::new) }
        },
    ))
}

/// One unary call of `method` (`/package.Service/Method`).
pub async fn call<Req, Resp>(
    ch: &Channel,
    method: &'static str,
    req: Req,
) -> Result<Resp, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("the plugin's socket: {e}")))?;
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    let resp = grpc
        .unary(
            tonic::Request::new(req),
            PathAndQuery::from_static(method),
            codec,
        )
        .await?;
    Ok(resp.into_inner())
}
