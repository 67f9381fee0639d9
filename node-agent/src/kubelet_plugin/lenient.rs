//! A minimal gRPC server for unary calls over HTTP/2, on h2's frame codec instead of its server:
//! the kubelet's plugin watcher dials the registration socket by its bare path, so grpc-go sends
//! that path as `:authority`, which is no URI authority and which h2's server (under tonic)
//! answers with a stream reset (`PROTOCOL_ERROR`). Here `:authority` is not read at all.
//!
//! One connection at a time per task; each stream is one unary call: its request message is
//! collected to the end of the stream, handed to the [`Unary`] handler, and answered with the
//! response message and `grpc-status` trailers. The requests served here are a few bytes, so
//! flow control is only kept up by giving back what the peer sent.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use h2::frame::{self, Frame, StreamId};
use std::collections::HashMap;
use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tonic::codegen::http::{HeaderMap, HeaderValue, StatusCode};

/// What a client sends first on an HTTP/2 connection.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// How long a new connection may take to send the preface.
const PREFACE_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);
/// The most a request message may hold.
const MAX_MESSAGE: usize = 64 * 1024;

/// A unary method's answer: the encoded response, or a gRPC status code and message.
pub(super) type Answer = Result<Bytes, (tonic::Code, String)>;

/// Answers unary calls by their `:path`.
pub(super) trait Unary: Clone + Send + Sync + 'static {
    fn call(&self, path: &str, request: Bytes) -> Answer;
}

#[derive(Debug, thiserror::Error)]
pub(super) enum ConnError {
    #[error("reading the HTTP/2 preface: {0}")]
    Preface(std::io::Error),
    #[error("no HTTP/2 preface within {PREFACE_WITHIN:?}")]
    NoPreface,
    #[error("not an HTTP/2 client")]
    NotHttp2,
    #[error("reading a frame: {0}")]
    Read(h2::proto::Error),
    #[error("writing a frame: {0}")]
    Write(#[from] h2::SendError),
}

/// Accepts connections on `listener` until `stop`; each is served on its own task.
pub(super) async fn serve<U: Unary>(listener: UnixListener, handler: U, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((io, _)) => {
                let (h, s) = (handler.clone(), stop.clone());
                tokio::spawn(async move {
                    if let Err(e) = connection(io, h, s).await {
                        tracing::debug!(error = %e, "a kubelet plugin registration connection");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting on the kubelet plugin registration socket");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

type Codec = h2::Codec<UnixStream, Bytes>;

async fn connection<U: Unary>(
    mut io: UnixStream,
    handler: U,
    stop: CancellationToken,
) -> Result<(), ConnError> {
    let mut preface = [0u8; 24];
    tokio::select! {
        _ = stop.cancelled() => return Ok(()),
        r = tokio::time::timeout(PREFACE_WITHIN, io.read_exact(&mut preface)) => {
            r.map_err(|_| ConnError::NoPreface)?.map_err(ConnError::Preface)?;
        }
    }
    if &preface != PREFACE {
        return Err(ConnError::NotHttp2);
    }
    let mut codec = Codec::new(io);
    codec.send(frame::Settings::default().into()).await?;
    let mut calls: HashMap<StreamId, (String, BytesMut)> = HashMap::new();
    loop {
        let next = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            f = codec.next() => f,
        };
        let Some(f) = next else { return Ok(()) };
        match f.map_err(ConnError::Read)? {
            Frame::Settings(s) if !s.is_ack() => codec.send(frame::Settings::ack().into()).await?,
            Frame::Ping(p) if !p.is_ack() => {
                codec
                    .send(frame::Ping::pong(p.into_payload()).into())
                    .await?
            }
            Frame::Headers(h) => {
                let (id, end) = (h.stream_id(), h.is_end_stream());
                let path = h.into_parts().0.path.map(|p| p.to_string());
                calls.insert(id, (path.unwrap_or_default(), BytesMut::new()));
                if end {
                    answer(&mut codec, &handler, id, calls.remove(&id)).await?;
                }
            }
            Frame::Data(d) => {
                let (id, end) = (d.stream_id(), d.is_end_stream());
                let payload = d.into_payload();
                give_back(&mut codec, payload.len()).await?;
                if let Some((_, body)) = calls.get_mut(&id) {
                    if body.len().saturating_add(payload.len()) <= MAX_MESSAGE.saturating_add(5) {
                        body.put(payload);
                    }
                }
                if end {
                    answer(&mut codec, &handler, id, calls.remove(&id)).await?;
                }
            }
            Frame::Reset(r) => {
                calls.remove(&r.stream_id());
            }
            Frame::GoAway(_) => return Ok(()),
            _ => {}
        }
    }
}

/// Returns `n` bytes of connection window to the peer.
async fn give_back(codec: &mut Codec, n: usize) -> Result<(), ConnError> {
    match u32::try_from(n) {
        Ok(n) if n > 0 => {
            let update = frame::WindowUpdate::new(StreamId::zero(), n);
            codec.send(update.into()).await?;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Answers the call that ended on stream `id` (none: a stream this connection never opened).
async fn answer<U: Unary>(
    codec: &mut Codec,
    handler: &U,
    id: StreamId,
    call: Option<(String, BytesMut)>,
) -> Result<(), ConnError> {
    let Some((path, body)) = call else {
        return Ok(());
    };
    let reply = match unframe(body.freeze()) {
        Some(request) => handler.call(&path, request),
        None => Err((
            tonic::Code::InvalidArgument,
            "malformed gRPC message".into(),
        )),
    };
    let mut head = HeaderMap::new();
    head.insert("content-type", HeaderValue::from_static("application/grpc"));
    let (message, code, text) = match reply {
        Ok(m) => (Some(m), tonic::Code::Ok, String::new()),
        Err((code, text)) => (None, code, text),
    };
    let mut headers = frame::Headers::new(id, frame::Pseudo::response(StatusCode::OK), head);
    if let Some(m) = message {
        codec.send(headers.into()).await?;
        codec.send(frame::Data::new(id, framed(&m)).into()).await?;
        let trailers = frame::Headers::trailers(id, status_fields(code, &text));
        headers = trailers;
    } else {
        let (pseudo, mut fields) = headers.into_parts();
        fields.extend(status_fields(code, &text));
        headers = frame::Headers::new(id, pseudo, fields);
    }
    headers.set_end_stream();
    codec.send(headers.into()).await?;
    Ok(())
}

fn status_fields(code: tonic::Code, text: &str) -> HeaderMap {
    let mut m = HeaderMap::new();
    m.insert("grpc-status", HeaderValue::from(code as i32));
    if let Ok(v) = HeaderValue::from_str(&text.replace(['\r', '\n'], " ")) {
        if !text.is_empty() {
            m.insert("grpc-message", v);
        }
    }
    m
}

/// A gRPC length-prefixed message: flag 0 (not compressed), big-endian length, the message.
fn framed(message: &Bytes) -> Bytes {
    let mut out = BytesMut::with_capacity(message.len().saturating_add(5));
    out.put_u8(0);
    out.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    out.put_slice(message);
    out.freeze()
}

/// The one uncompressed message of a unary request body, if the body is one.
fn unframe(mut body: Bytes) -> Option<Bytes> {
    if body.len() < 5 || body[0] != 0 {
        return None;
    }
    body.advance(1);
    let len = usize::try_from(body.get_u32()).ok()?;
    (len == body.len() && len <= MAX_MESSAGE).then_some(body)
}
