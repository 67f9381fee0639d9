//! gRPC over HTTP/2 at the byte level: what the CRI proxy needs to pass calls through without
//! decoding them, and to look into the few it intercepts.
//!
//! A pass-through call is one HTTP/2 request forwarded as it came (headers, message bytes,
//! trailers, streaming bodies included) over one shared connection to the runtime. Nothing is
//! decoded, so fields and methods this build does not know reach the runtime unchanged.
//!
//! An intercepted unary call is read whole ([`read_unary`]), its message looked at, and sent on
//! as the original bytes followed by an *overlay*: a second encoding of the same message type
//! that sets only the changed fields. Protobuf parsers merge a repeated occurrence of a
//! message field into the first and let the last scalar win, so the runtime sees the original
//! request with those fields replaced, and every field it holds that we do not model survives.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{HeaderMap, CONTENT_LENGTH};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use tonic::{Code, Status};

/// The body type of everything the proxy sends (either way).
pub type ProxyBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

/// HTTP/2 flow-control windows of both connections: large enough that a multi-megabyte
/// ListContainers answer does not stall on window updates.
pub const STREAM_WINDOW: u32 = 4 * 1024 * 1024;
pub const CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;

/// The 5-byte gRPC message prefix: compressed flag and big-endian length.
const PREFIX: usize = 5;

/// Why an intercepted message cannot be looked into (it is then forwarded untouched).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("the body holds {0} bytes, not one gRPC message")]
    NotOneMessage(usize),
    #[error("the message is compressed")]
    Compressed,
}

/// The message of a unary gRPC body (exactly one uncompressed message).
pub fn unary_message(body: &[u8]) -> Result<&[u8], FrameError> {
    if body.len() < PREFIX {
        return Err(FrameError::NotOneMessage(body.len()));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if body.len() != PREFIX + len {
        return Err(FrameError::NotOneMessage(body.len()));
    }
    if body[0] != 0 {
        return Err(FrameError::Compressed);
    }
    Ok(&body[PREFIX..])
}

/// One gRPC message made of `parts` laid end to end (message bytes, then overlays).
pub fn frame(parts: &[&[u8]]) -> Bytes {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut out = BytesMut::with_capacity(PREFIX + len);
    out.put_u8(0);
    out.put_u32(len as u32);
    for p in parts {
        out.put_slice(p);
    }
    out.freeze()
}

/// A unary body whose message is followed by `overlay` (see the module's documentation).
pub fn with_overlay(body: &[u8], overlay: &[u8]) -> Result<Bytes, FrameError> {
    Ok(frame(&[unary_message(body)?, overlay]))
}

/// The gRPC status code of a response: from the trailers, else from the headers (a
/// trailers-only response), else `Unknown` (a body without status is a broken call).
pub fn status_code(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> Code {
    trailers
        .and_then(|t| t.get(Status::GRPC_STATUS))
        .or_else(|| headers.get(Status::GRPC_STATUS))
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<i32>().ok())
        .map(Code::from_i32)
        .unwrap_or(Code::Unknown)
}

/// A response the proxy makes itself: a trailers-only gRPC error.
pub fn error_response(status: Status) -> Response<ProxyBody> {
    status.into_http()
}

/// A body the proxy holds in memory: at most one data frame, then the trailers.
#[derive(Debug, Default)]
pub struct Replay {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Replay {
    pub fn new(data: Bytes, trailers: Option<HeaderMap>) -> Replay {
        Replay {
            data: (!data.is_empty()).then_some(data),
            trailers,
        }
    }

    pub fn boxed(self) -> ProxyBody {
        self.map_err(|never| match never {}).boxed()
    }
}

impl Body for Replay {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(d) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.remaining()) as u64)
    }
}

/// A unary call read whole: its head, the body bytes and the trailers.
#[derive(Clone)]
pub struct Unary<H> {
    pub head: H,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

impl<H> Unary<H> {
    /// The message, if the body is one uncompressed message.
    pub fn message(&self) -> Result<&[u8], FrameError> {
        unary_message(&self.body)
    }
}

impl Unary<hyper::http::response::Parts> {
    pub fn code(&self) -> Code {
        status_code(&self.head.headers, self.trailers.as_ref())
    }

    /// Decodes the response message of a successful call.
    pub fn decode<M: prost::Message + Default>(&self) -> Option<M> {
        if self.code() != Code::Ok {
            return None;
        }
        M::decode(self.message().ok()?).ok()
    }

    pub fn into_response(self) -> Response<ProxyBody> {
        Response::from_parts(self.head, Replay::new(self.body, self.trailers).boxed())
    }
}

impl Unary<hyper::http::request::Parts> {
    /// The request to send upstream with `body` (the original or a rewritten one).
    pub fn into_request(mut self, body: Bytes) -> Request<ProxyBody> {
        self.head.headers.remove(CONTENT_LENGTH);
        Request::from_parts(self.head, Replay::new(body, self.trailers).boxed())
    }
}

/// Reads a whole HTTP message of at most `limit` body bytes.
async fn read_whole<B>(body: B, limit: usize) -> Result<(Bytes, Option<HeaderMap>), Status>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let collected = Limited::new(body, limit).collect().await.map_err(|e| {
        match e.downcast_ref::<http_body_util::LengthLimitError>() {
            Some(_) => Status::resource_exhausted(format!("message larger than {limit} bytes")),
            None => Status::unavailable(format!("reading the message: {e}")),
        }
    })?;
    let trailers = collected.trailers().cloned();
    Ok((collected.to_bytes(), trailers))
}

/// Reads an incoming unary request whole.
pub async fn read_unary(
    req: Request<Incoming>,
    limit: usize,
) -> Result<Unary<hyper::http::request::Parts>, Status> {
    let (head, body) = req.into_parts();
    let (body, trailers) = read_whole(body, limit).await?;
    Ok(Unary {
        head,
        body,
        trailers,
    })
}

/// The runtime's socket: one HTTP/2 connection shared by all calls, made on first use and
/// again after it closed (a runtime restart).
pub struct Upstream {
    path: PathBuf,
    sender: Mutex<Option<hyper::client::conn::http2::SendRequest<ProxyBody>>>,
    connecting: tokio::sync::Mutex<()>,
}

impl Upstream {
    pub fn new(path: &Path) -> Upstream {
        Upstream {
            path: path.to_path_buf(),
            sender: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    fn cached(&self) -> Option<hyper::client::conn::http2::SendRequest<ProxyBody>> {
        let guard = self.sender.lock().unwrap_or_else(|p| p.into_inner());
        guard.as_ref().filter(|s| !s.is_closed()).cloned()
    }

    async fn sender(&self) -> Result<hyper::client::conn::http2::SendRequest<ProxyBody>, Status> {
        if let Some(s) = self.cached() {
            return Ok(s);
        }
        let _one = self.connecting.lock().await;
        if let Some(s) = self.cached() {
            return Ok(s);
        }
        let unavailable = |e: &dyn std::fmt::Display| {
            Status::unavailable(format!("runtime {}: {e}", self.path.display()))
        };
        let stream = tokio::net::UnixStream::connect(&self.path)
            .await
            .map_err(|e| unavailable(&e))?;
        let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unavailable(&e))?;
        let path = self.path.clone();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(runtime = %path.display(), "runtime connection ended: {e}");
            }
        });
        *self.sender.lock().unwrap_or_else(|p| p.into_inner()) = Some(sender.clone());
        Ok(sender)
    }

    /// Sends a request as it is; the response streams back as it comes.
    pub async fn send(&self, mut req: Request<ProxyBody>) -> Result<Response<Incoming>, Status> {
        absolute_uri(&mut req);
        let mut s = self.sender().await?;
        s.send_request(req)
            .await
            .map_err(|e| Status::unavailable(format!("runtime {}: {e}", self.path.display())))
    }

    /// Forwards a call untouched; a failure to reach the runtime is a gRPC `Unavailable`.
    pub async fn forward(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        match self.send(req.map(BodyExt::boxed)).await {
            Ok(resp) => resp.map(BodyExt::boxed),
            Err(status) => error_response(status),
        }
    }

    /// Sends a unary request and reads the response whole.
    pub async fn call(
        &self,
        req: Request<ProxyBody>,
        limit: usize,
    ) -> Result<Unary<hyper::http::response::Parts>, Status> {
        let (head, body) = self.send(req).await?.into_parts();
        let (body, trailers) = read_whole(body, limit).await?;
        Ok(Unary {
            head,
            body,
            trailers,
        })
    }
}

/// The HTTP/2 client wants a scheme and an authority; a request from the kubelet has them,
/// one made otherwise may not.
fn absolute_uri<B>(req: &mut Request<B>) {
    let uri = req.uri();
    if uri.scheme().is_some() && uri.authority().is_some() {
        return;
    }
    let pq = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_string();
    if let Ok(u) = hyper::Uri::builder()
        .scheme("http")
        .authority("localhost")
        .path_and_query(pq)
        .build()
    {
        *req.uri_mut() = u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    #[test]
    fn frames_round_trip() {
        let f = frame(&[b"abc", b"de"]);
        assert_eq!(&f[..], &[0, 0, 0, 0, 5, b'a', b'b', b'c', b'd', b'e']);
        assert_eq!(unary_message(&f), Ok(&b"abcde"[..]));
        assert_eq!(unary_message(&frame(&[])), Ok(&b""[..]));
    }

    #[test]
    fn overlays_extend_the_one_message() {
        let body = frame(&[b"abc"]);
        let out = with_overlay(&body, b"de").expect("one message");
        assert_eq!(&out[..], &frame(&[b"abcde"])[..]);
        assert_eq!(
            with_overlay(&[1, 0, 0, 0, 1, 9], b"x"),
            Err(FrameError::Compressed)
        );
    }

    #[test]
    fn odd_bodies_are_refused() {
        assert_eq!(unary_message(b""), Err(FrameError::NotOneMessage(0)));
        assert_eq!(unary_message(&[0, 0, 0]), Err(FrameError::NotOneMessage(3)));
        // Length says 4, body has 3 or 5 bytes after the prefix.
        assert!(unary_message(&[0, 0, 0, 0, 4, 1, 2, 3]).is_err());
        assert!(unary_message(&[0, 0, 0, 0, 4, 1, 2, 3, 4, 5]).is_err());
        // Two messages are not one.
        let two = [&frame(&[b"a"])[..], &frame(&[b"b"])[..]].concat();
        assert!(unary_message(&two).is_err());
        assert_eq!(
            unary_message(&[1, 0, 0, 0, 1, 9]),
            Err(FrameError::Compressed)
        );
    }

    #[test]
    fn status_comes_from_trailers_then_headers() {
        let mut h = HeaderMap::new();
        let mut t = HeaderMap::new();
        assert_eq!(status_code(&h, None), Code::Unknown);
        h.insert("grpc-status", HeaderValue::from_static("5"));
        assert_eq!(status_code(&h, None), Code::NotFound);
        t.insert("grpc-status", HeaderValue::from_static("0"));
        assert_eq!(status_code(&h, Some(&t)), Code::Ok);
        t.insert("grpc-status", HeaderValue::from_static("x"));
        assert_eq!(status_code(&HeaderMap::new(), Some(&t)), Code::Unknown);
    }

    #[tokio::test]
    async fn replay_gives_data_then_trailers() {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        let c = Replay::new(Bytes::from_static(b"xyz"), Some(t))
            .collect()
            .await
            .expect("infallible");
        assert_eq!(
            c.trailers().and_then(|t| t.get("grpc-status")).cloned(),
            Some(HeaderValue::from_static("0"))
        );
        assert_eq!(&c.to_bytes()[..], b"xyz");
        assert!(Replay::default().is_end_stream());
    }

    #[test]
    fn relative_uris_get_an_authority() {
        let mut r = Request::builder()
            .uri("/runtime.v1.RuntimeService/Version")
            .body(())
            .expect("request");
        absolute_uri(&mut r);
        assert_eq!(
            r.uri().to_string(),
            "http://localhost/runtime.v1.RuntimeService/Version"
        );
        let mut r = Request::builder()
            .uri("http://kubelet/runtime.v1.RuntimeService/Version")
            .body(())
            .expect("request");
        absolute_uri(&mut r);
        assert_eq!(r.uri().authority().map(|a| a.as_str()), Some("kubelet"));
    }
}
