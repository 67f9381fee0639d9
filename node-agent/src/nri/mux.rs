//! The NRI connection multiplexer: several logical byte streams over one Unix socket.
//!
//! Each frame is an 8-byte header (connection id, payload length; both u32 big-endian)
//! followed by the payload. There are no open/close frames: both sides use fixed ids
//! ([`PLUGIN_SERVICE_CONN`] carries the ttrpc server of the plugin, [`RUNTIME_SERVICE_CONN`]
//! the runtime's). Frames for an id nobody opened are dropped.
//!
//! The runtime reads every logical connection through a 4096-byte buffered reader and its
//! mux refuses a frame larger than the buffer it is offered, so this side never sends a
//! frame with more than [`MAX_FRAME_PAYLOAD`] payload bytes: one `poll_write` becomes one
//! frame of at most that size, and longer writes are split by the caller's `write_all`.

use bytes::{Buf, Bytes, BytesMut};
use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The plugin's ttrpc server (runtime -> plugin calls).
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// The runtime's ttrpc server (plugin -> runtime calls).
pub const RUNTIME_SERVICE_CONN: u32 = 2;
/// Largest payload this side puts in one frame (the runtime's read buffer).
pub const MAX_FRAME_PAYLOAD: usize = 4096;
/// Largest frame payload accepted from the runtime (NRI <= v0.6 sends one write per frame,
/// at most 16 MiB; later versions at most 4 MiB + 10).
pub const MAX_INBOUND_PAYLOAD: usize = 16 << 20;
/// Frame header length.
pub const HEADER_LEN: usize = 8;

/// Encodes one frame.
pub fn encode_frame(conn: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&conn.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Decodes a frame header into (connection id, payload length).
pub fn decode_header(h: &[u8; HEADER_LEN]) -> (u32, usize) {
    let conn = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
    (conn, len)
}

type Routes = Arc<Mutex<HashMap<u32, mpsc::UnboundedSender<Bytes>>>>;

/// One trunk connection. Dropping it does not stop its tasks; they end when the socket
/// closes or [`Mux::close`] is called.
pub struct Mux {
    routes: Routes,
    out: mpsc::UnboundedSender<Vec<u8>>,
    closed: CancellationToken,
}

impl Mux {
    /// Starts the reader and writer tasks over `stream` (needs a Tokio runtime).
    pub fn new<S>(stream: S) -> Mux
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        Mux::with_conns(stream, &[]).0
    }

    /// Like [`Mux::new`], with logical connections `ids` opened before the first frame is
    /// read (so nothing the peer sends early is dropped). Returned in the order of `ids`.
    pub fn with_conns<S>(stream: S, ids: &[u32]) -> (Mux, Vec<MuxConn>)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (mut rd, mut wr) = tokio::io::split(stream);
        let routes: Routes = Arc::new(Mutex::new(HashMap::new()));
        let (out, mut out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let conns: Vec<MuxConn> = ids
            .iter()
            .map(|&id| {
                let (tx, rx) = mpsc::unbounded_channel();
                lock(&routes).insert(id, tx);
                MuxConn {
                    id,
                    rx,
                    buf: Bytes::new(),
                    out: out.clone(),
                }
            })
            .collect();
        let closed = CancellationToken::new();

        // Writer: whole frames, one at a time, so frames of different connections never mix.
        let c = closed.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = c.cancelled() => break,
                    f = out_rx.recv() => match f {
                        Some(frame) => {
                            if let Err(e) = wr.write_all(&frame).await {
                                tracing::debug!("NRI trunk write failed: {e}");
                                break;
                            }
                        }
                        None => break,
                    }
                }
            }
            let _ = wr.shutdown().await;
            c.cancel();
        });

        // Reader: route payloads to their logical connection.
        let (r, c) = (routes.clone(), closed.clone());
        tokio::spawn(async move {
            let result = tokio::select! {
                _ = c.cancelled() => Ok(()),
                res = read_loop(&mut rd, &r) => res,
            };
            if let Err(e) = result {
                tracing::debug!("NRI trunk read ended: {e}");
            }
            // Every logical connection sees end-of-stream.
            lock(&r).clear();
            c.cancel();
        });

        (
            Mux {
                routes,
                out,
                closed,
            },
            conns,
        )
    }

    /// Opens logical connection `id` (the same id the peer uses for it).
    pub fn open(&self, id: u32) -> MuxConn {
        let (tx, rx) = mpsc::unbounded_channel();
        if !self.closed.is_cancelled() {
            lock(&self.routes).insert(id, tx);
        }
        MuxConn {
            id,
            rx,
            buf: Bytes::new(),
            out: self.out.clone(),
        }
    }

    /// Cancelled when the trunk is gone (peer closed, I/O error or [`Mux::close`]).
    pub fn closed(&self) -> CancellationToken {
        self.closed.clone()
    }

    /// Closes the trunk.
    pub fn close(&self) {
        self.closed.cancel();
    }
}

fn lock(r: &Routes) -> std::sync::MutexGuard<'_, HashMap<u32, mpsc::UnboundedSender<Bytes>>> {
    r.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the trunk reader asks of the socket at a time: a CreateContainer request (about
/// 3 KiB) and its frame header come in one read, and several frames often do.
const READ_CHUNK: usize = 16 << 10;

async fn read_loop<R: AsyncRead + Unpin>(rd: &mut R, routes: &Routes) -> io::Result<()> {
    // One buffer for the trunk's life: each payload is split off it without a copy (and
    // without zeroing a fresh allocation per frame); its memory is reused once the
    // logical connection has read the payload.
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        let Some((conn, payload)) = next_frame(rd, &mut buf).await? else {
            return Ok(());
        };
        if payload.is_empty() {
            continue;
        }
        let tx = lock(routes).get(&conn).cloned();
        match tx {
            Some(tx) => {
                if tx.send(payload).is_err() {
                    // The reader of that connection is gone; forget it.
                    lock(routes).remove(&conn);
                }
            }
            None => tracing::trace!(
                conn,
                len = payload.len(),
                "dropping NRI frame for an unopened connection"
            ),
        }
    }
}

/// The next whole frame from `rd`, read through `buf`; `None` where the stream ends between
/// frames (or inside a header).
async fn next_frame<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
) -> io::Result<Option<(u32, Bytes)>> {
    fill(rd, buf, HEADER_LEN).await?;
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let mut h = [0u8; HEADER_LEN];
    h.copy_from_slice(&buf[..HEADER_LEN]);
    let (conn, len) = decode_header(&h);
    if len > MAX_INBOUND_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("NRI frame of {len} bytes for connection {conn} is too large"),
        ));
    }
    buf.advance(HEADER_LEN);
    if len <= READ_CHUNK {
        fill(rd, buf, len).await?;
        if buf.len() < len {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        return Ok(Some((conn, buf.split_to(len).freeze())));
    }
    // A large frame (a big Synchronize from an old runtime): a buffer of exactly its size,
    // zeroed by the allocator (no element-by-element fill, slow in unoptimised builds).
    let have = buf.len().min(len);
    let mut payload = vec![0u8; len];
    payload[..have].copy_from_slice(&buf.split_to(have));
    rd.read_exact(&mut payload[have..]).await?;
    Ok(Some((conn, Bytes::from(payload))))
}

/// Reads until `buf` holds at least `want` bytes or the stream ends.
async fn fill<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut BytesMut, want: usize) -> io::Result<()> {
    while buf.len() < want {
        buf.reserve(READ_CHUNK);
        if rd.read_buf(buf).await? == 0 {
            return Ok(());
        }
    }
    Ok(())
}

/// One logical connection: a byte stream (a ttrpc message may span frames).
pub struct MuxConn {
    id: u32,
    rx: mpsc::UnboundedReceiver<Bytes>,
    buf: Bytes,
    out: mpsc::UnboundedSender<Vec<u8>>,
}

impl MuxConn {
    pub fn id(&self) -> u32 {
        self.id
    }
}

impl AsyncRead for MuxConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.buf.is_empty() {
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(b)) => this.buf = b,
                // Trunk closed: end of stream.
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = out.remaining().min(this.buf.len());
        out.put_slice(&this.buf.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for MuxConn {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = data.len().min(MAX_FRAME_PAYLOAD);
        match self.out.send(encode_frame(self.id, &data[..n])) {
            Ok(()) => Poll::Ready(Ok(n)),
            Err(_) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "NRI connection closed",
            ))),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The protocol has no close frame; the trunk closes as a whole.
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> (u32, Vec<u8>) {
        let mut h = [0u8; HEADER_LEN];
        r.read_exact(&mut h).await.unwrap();
        let (id, len) = decode_header(&h);
        let mut p = vec![0u8; len];
        r.read_exact(&mut p).await.unwrap();
        (id, p)
    }

    #[test]
    fn header_is_big_endian_id_then_length() {
        let f = encode_frame(2, b"abc");
        assert_eq!(&f[..8], &[0, 0, 0, 2, 0, 0, 0, 3]);
        assert_eq!(&f[8..], b"abc");
        let mut h = [0u8; 8];
        h.copy_from_slice(&f[..8]);
        assert_eq!(decode_header(&h), (2, 3));
        let big = encode_frame(0x0102_0304, &vec![0u8; 0x0506]);
        assert_eq!(&big[..8], &[1, 2, 3, 4, 0, 0, 5, 6]);
    }

    #[tokio::test]
    async fn writes_are_split_into_frames_of_at_most_4096_bytes() {
        let (ours, mut peer) = tokio::io::duplex(1 << 20);
        let mux = Mux::new(ours);
        let mut c = mux.open(RUNTIME_SERVICE_CONN);
        // A ttrpc-like message: 10-byte header + 9000 bytes.
        let msg: Vec<u8> = (0..9010u32).map(|i| (i % 251) as u8).collect();
        c.write_all(&msg).await.unwrap();
        let mut got = Vec::new();
        let mut sizes = Vec::new();
        while got.len() < msg.len() {
            let (id, p) = read_frame(&mut peer).await;
            assert_eq!(id, RUNTIME_SERVICE_CONN);
            assert!(!p.is_empty() && p.len() <= MAX_FRAME_PAYLOAD, "{}", p.len());
            sizes.push(p.len());
            got.extend(p);
        }
        assert_eq!(got, msg);
        assert_eq!(sizes, vec![4096, 4096, 818]);
        // A frame that holds a header (the first) is never larger than 4096 bytes.
        assert!(sizes[0] <= 4096);
    }

    #[tokio::test]
    async fn reads_reassemble_across_frames_and_route_by_id() {
        let (ours, mut peer) = tokio::io::duplex(1 << 20);
        let mux = Mux::new(ours);
        let mut one = mux.open(PLUGIN_SERVICE_CONN);
        let mut two = mux.open(RUNTIME_SERVICE_CONN);
        // A message split over three frames, interleaved with another connection and with a
        // frame for an id nobody opened (dropped).
        peer.write_all(&encode_frame(1, b"hel")).await.unwrap();
        peer.write_all(&encode_frame(7, b"junk")).await.unwrap();
        peer.write_all(&encode_frame(2, b"xy")).await.unwrap();
        peer.write_all(&encode_frame(1, b"lo wor")).await.unwrap();
        peer.write_all(&encode_frame(1, b"ld")).await.unwrap();
        let mut a = [0u8; 11];
        one.read_exact(&mut a).await.unwrap();
        assert_eq!(&a, b"hello world");
        let mut b = [0u8; 2];
        two.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"xy");
        // Two messages in one frame are read as a stream too.
        peer.write_all(&encode_frame(2, b"m1m2")).await.unwrap();
        let mut m = [0u8; 2];
        two.read_exact(&mut m).await.unwrap();
        assert_eq!(&m, b"m1");
        two.read_exact(&mut m).await.unwrap();
        assert_eq!(&m, b"m2");
    }

    #[tokio::test]
    async fn peer_close_ends_every_connection() {
        let (ours, peer) = tokio::io::duplex(1024);
        let mux = Mux::new(ours);
        let mut one = mux.open(PLUGIN_SERVICE_CONN);
        let closed = mux.closed();
        drop(peer);
        let mut buf = Vec::new();
        assert_eq!(one.read_to_end(&mut buf).await.unwrap(), 0);
        tokio::time::timeout(std::time::Duration::from_secs(2), closed.cancelled())
            .await
            .unwrap();
        // Writing after close fails instead of hanging.
        let mut c = mux.open(RUNTIME_SERVICE_CONN);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(c.write_all(b"x").await.is_err());
    }

    #[tokio::test]
    async fn oversized_inbound_frame_closes_the_trunk() {
        let (ours, mut peer) = tokio::io::duplex(1024);
        let mux = Mux::new(ours);
        let _one = mux.open(PLUGIN_SERVICE_CONN);
        let mut h = Vec::new();
        h.extend_from_slice(&1u32.to_be_bytes());
        h.extend_from_slice(&((MAX_INBOUND_PAYLOAD + 1) as u32).to_be_bytes());
        peer.write_all(&h).await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(2), mux.closed().cancelled())
            .await
            .unwrap();
    }
}
