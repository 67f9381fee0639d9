//! Property tests of the NRI connection multiplexer (`nri::mux`), the decoder that reads the
//! runtime's Unix stream.
//!
//! * Arbitrary bytes from the peer (valid frames, headers claiming up to 4 GiB, junk, cut
//!   anywhere) never panic, never make the reader allocate more than `MAX_INBOUND_PAYLOAD` in
//!   one piece, and deliver to each opened connection exactly what a reference decoder finds
//!   before the first bad or truncated frame; the trunk then closes.
//! * What is written through one `Mux` arrives intact through another, both ways at once,
//!   carried in non-empty frames of at most `MAX_FRAME_PAYLOAD` bytes.
//!
//! The largest single allocation is tracked per thread by a wrapping global allocator; each
//! case runs on a current-thread Tokio runtime, so the mux's reader task allocates on the
//! thread that measures.

use node_agent::nri::mux::{
    decode_header, encode_frame, Mux, HEADER_LEN, MAX_FRAME_PAYLOAD, MAX_INBOUND_PAYLOAD,
    PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN,
};
use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // try_with: the slot may be gone while the thread exits.
    let _ = LARGEST.try_with(|l| {
        if size > l.get() {
            l.set(size);
        }
    });
}

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Tracking = Tracking;

/// Runs `f` on a fresh current-thread runtime and returns its value with the largest single
/// allocation made on this thread meanwhile.
fn measured<T>(f: impl std::future::Future<Output = T>) -> (T, usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    LARGEST.with(|l| l.set(0));
    let out = rt.block_on(f);
    let largest = LARGEST.with(|l| l.get());
    (out, largest)
}

/// Deterministic filler bytes (a byte vector strategy per payload would dominate run time).
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A piece of what the peer sends.
#[derive(Debug, Clone)]
enum Piece {
    /// A well-formed frame.
    Frame { conn: u32, len: usize, seed: u64 },
    /// A header alone, with any length (up to 4 GiB); the bytes after it are its payload.
    Header { conn: u32, len: u32 },
    /// Junk.
    Raw(Vec<u8>),
}

fn conn_id() -> impl Strategy<Value = u32> {
    prop_oneof![
        3 => Just(PLUGIN_SERVICE_CONN),
        3 => Just(RUNTIME_SERVICE_CONN),
        1 => Just(0u32),
        1 => Just(u32::MAX),
        1 => any::<u32>(),
    ]
}

fn piece() -> impl Strategy<Value = Piece> {
    let claimed = prop_oneof![
        any::<u32>(),
        Just(u32::MAX),
        Just(MAX_INBOUND_PAYLOAD as u32),
        Just(MAX_INBOUND_PAYLOAD as u32 + 1),
        0u32..64,
    ];
    prop_oneof![
        6 => (conn_id(), 0usize..6000, any::<u64>())
            .prop_map(|(conn, len, seed)| Piece::Frame { conn, len, seed }),
        1 => (conn_id(), claimed).prop_map(|(conn, len)| Piece::Header { conn, len }),
        1 => proptest::collection::vec(any::<u8>(), 0..24).prop_map(Piece::Raw),
    ]
}

fn wire(pieces: &[Piece]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in pieces {
        match p {
            Piece::Frame { conn, len, seed } => {
                out.extend_from_slice(&encode_frame(*conn, &bytes(*len, *seed)))
            }
            Piece::Header { conn, len } => {
                out.extend_from_slice(&conn.to_be_bytes());
                out.extend_from_slice(&len.to_be_bytes());
            }
            Piece::Raw(b) => out.extend_from_slice(b),
        }
    }
    out
}

/// What a correct decoder delivers per connection: every whole frame up to the first one that
/// is oversized or cut short.
fn reference(mut b: &[u8]) -> HashMap<u32, Vec<u8>> {
    let mut out: HashMap<u32, Vec<u8>> = HashMap::new();
    while b.len() >= HEADER_LEN {
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&b[..HEADER_LEN]);
        let (conn, len) = decode_header(&h);
        if len > MAX_INBOUND_PAYLOAD || b.len() - HEADER_LEN < len {
            break;
        }
        out.entry(conn)
            .or_default()
            .extend_from_slice(&b[HEADER_LEN..HEADER_LEN + len]);
        b = &b[HEADER_LEN + len..];
    }
    out
}

/// Splits the whole reference stream of frames into (connection id, payload) pairs, checking
/// that the stream is nothing but whole frames.
fn frames_of(mut b: &[u8]) -> Vec<(u32, usize)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        assert!(b.len() >= HEADER_LEN, "a cut header at the end");
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&b[..HEADER_LEN]);
        let (conn, len) = decode_header(&h);
        assert!(b.len() - HEADER_LEN >= len, "a cut frame at the end");
        out.push((conn, len));
        b = &b[HEADER_LEN + len..];
    }
    out
}

/// Writes `data` in pieces of the given sizes (cycled), then closes.
async fn write_in_pieces<W: AsyncWrite + Unpin>(mut w: W, data: &[u8], cuts: &[usize]) {
    let mut rest = data;
    let mut i = 0;
    while !rest.is_empty() {
        let n = cuts
            .get(i % cuts.len().max(1))
            .copied()
            .unwrap_or(rest.len())
            .clamp(1, rest.len());
        if w.write_all(&rest[..n]).await.is_err() {
            // The mux closed the trunk (an oversized frame): the rest is not read.
            return;
        }
        rest = &rest[n..];
        i += 1;
    }
    let _ = w.shutdown().await;
}

async fn read_all<R: AsyncRead + Unpin>(mut r: R) -> Vec<u8> {
    let mut out = Vec::new();
    r.read_to_end(&mut out)
        .await
        .expect("a mux connection never fails a read");
    out
}

const DEADLINE: Duration = Duration::from_secs(10);

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_input_is_decoded_like_the_reference_and_never_over_allocates(
        pieces in proptest::collection::vec(piece(), 0..24),
        cuts in proptest::collection::vec(1usize..9000, 1..8),
    ) {
        let input = wire(&pieces);
        let want = reference(&input);
        let ((one, two), largest) = measured(async {
            tokio::time::timeout(DEADLINE, async {
                let (ours, peer) = tokio::io::duplex(16 * 1024);
                let (mux, mut conns) =
                    Mux::with_conns(ours, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]);
                let two = conns.pop().expect("two connections");
                let one = conns.pop().expect("two connections");
                let (_, a, b) = tokio::join!(
                    write_in_pieces(peer, &input, &cuts),
                    read_all(one),
                    read_all(two),
                );
                mux.closed().cancelled().await;
                (a, b)
            })
            .await
            .expect("the mux ends every connection when the peer is done")
        });
        prop_assert_eq!(one, want.get(&PLUGIN_SERVICE_CONN).cloned().unwrap_or_default());
        prop_assert_eq!(two, want.get(&RUNTIME_SERVICE_CONN).cloned().unwrap_or_default());
        prop_assert!(
            largest <= MAX_INBOUND_PAYLOAD,
            "one allocation of {} bytes (limit {})", largest, MAX_INBOUND_PAYLOAD
        );
    }

    #[test]
    fn what_one_mux_writes_the_other_reads_in_frames_of_at_most_4096_bytes(
        a_to_b in proptest::collection::vec((any::<bool>(), 0usize..20_000, any::<u64>()), 0..8),
        b_to_a in proptest::collection::vec((any::<bool>(), 0usize..20_000, any::<u64>()), 0..8),
    ) {
        // (plugin connection?, length, seed) per message.
        let msgs = |m: &[(bool, usize, u64)], plugin: bool| -> Vec<Vec<u8>> {
            m.iter()
                .filter(|(p, _, _)| *p == plugin)
                .map(|(_, len, seed)| bytes(*len, *seed))
                .collect()
        };
        let ids = [PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN];
        let sent_ab = [msgs(&a_to_b, true), msgs(&a_to_b, false)];
        let sent_ba = [msgs(&b_to_a, true), msgs(&b_to_a, false)];

        let (got, _) = measured(async {
            tokio::time::timeout(DEADLINE, async {
                // A <-> relay <-> B; the relay keeps a copy of both directions.
                let (a_end, relay_a) = tokio::io::duplex(8 * 1024);
                let (b_end, relay_b) = tokio::io::duplex(8 * 1024);
                let (mux_a, conns_a) = Mux::with_conns(a_end, &ids);
                let (mux_b, conns_b) = Mux::with_conns(b_end, &ids);
                let (ra_rd, ra_wr) = tokio::io::split(relay_a);
                let (rb_rd, rb_wr) = tokio::io::split(relay_b);
                let relay = |mut rd: tokio::io::ReadHalf<tokio::io::DuplexStream>,
                             mut wr: tokio::io::WriteHalf<tokio::io::DuplexStream>| async move {
                    let mut seen = Vec::new();
                    let mut buf = vec![0u8; 3000];
                    loop {
                        let n = rd.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            let _ = wr.shutdown().await;
                            return seen;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        if wr.write_all(&buf[..n]).await.is_err() {
                            return seen;
                        }
                    }
                };
                let ab = tokio::spawn(relay(ra_rd, rb_wr));
                let ba = tokio::spawn(relay(rb_rd, ra_wr));

                // Each connection: write its messages while reading what the other side
                // sends, exactly as many bytes as were sent.
                async fn talk(
                    mut c: node_agent::nri::mux::MuxConn,
                    out: Vec<Vec<u8>>,
                    expect: usize,
                ) -> (node_agent::nri::mux::MuxConn, Vec<u8>) {
                    let (mut rd, mut wr) = tokio::io::split(&mut c);
                    let write = async {
                        for m in &out {
                            wr.write_all(m).await.expect("write through the mux");
                        }
                    };
                    let read = async {
                        let mut got = vec![0u8; expect];
                        rd.read_exact(&mut got).await.expect("read through the mux");
                        got
                    };
                    let ((), got) = tokio::join!(write, read);
                    (c, got)
                }
                let total = |v: &[Vec<u8>]| v.iter().map(Vec::len).sum::<usize>();
                let mut ca = conns_a.into_iter();
                let mut cb = conns_b.into_iter();
                let (a1, a2) = (ca.next().expect("conn"), ca.next().expect("conn"));
                let (b1, b2) = (cb.next().expect("conn"), cb.next().expect("conn"));
                let ((a1, a1_got), (a2, a2_got), (b1, b1_got), (b2, b2_got)) = tokio::join!(
                    talk(a1, sent_ab[0].clone(), total(&sent_ba[0])),
                    talk(a2, sent_ab[1].clone(), total(&sent_ba[1])),
                    talk(b1, sent_ba[0].clone(), total(&sent_ab[0])),
                    talk(b2, sent_ba[1].clone(), total(&sent_ab[1])),
                );
                // Nothing more arrives: closing A ends both trunks and every connection
                // reads end-of-stream with no extra bytes.
                mux_a.close();
                let extra = [read_all(a1).await, read_all(a2).await,
                             read_all(b1).await, read_all(b2).await];
                mux_b.closed().cancelled().await;
                let wire_ab = ab.await.expect("relay");
                let wire_ba = ba.await.expect("relay");
                ([a1_got, a2_got, b1_got, b2_got], extra, wire_ab, wire_ba)
            })
            .await
            .expect("the round trip finishes")
        });
        let ([a1_got, a2_got, b1_got, b2_got], extra, wire_ab, wire_ba) = got;
        prop_assert_eq!(b1_got, sent_ab[0].concat());
        prop_assert_eq!(b2_got, sent_ab[1].concat());
        prop_assert_eq!(a1_got, sent_ba[0].concat());
        prop_assert_eq!(a2_got, sent_ba[1].concat());
        for e in &extra {
            prop_assert!(e.is_empty(), "{} bytes after the messages", e.len());
        }
        for (wire, sent) in [(&wire_ab, &sent_ab), (&wire_ba, &sent_ba)] {
            let frames = frames_of(wire);
            for &(conn, len) in &frames {
                prop_assert!(ids.contains(&conn), "frame for connection {}", conn);
                prop_assert!(len > 0 && len <= MAX_FRAME_PAYLOAD, "frame of {} bytes", len);
            }
            // Every message of n bytes takes ceil(n / 4096) frames: no frame is wasted.
            let want: usize = sent
                .iter()
                .flatten()
                .map(|m| m.len().div_ceil(MAX_FRAME_PAYLOAD))
                .sum();
            prop_assert_eq!(frames.len(), want);
            let by_conn = reference(wire);
            for (i, id) in ids.iter().enumerate() {
                prop_assert_eq!(
                    by_conn.get(id).cloned().unwrap_or_default(),
                    sent[i].concat()
                );
            }
        }
    }
}

/// A header claiming 4 GiB is refused without allocating it, even with the bytes behind it.
#[test]
fn a_four_gib_header_is_refused_not_allocated() {
    let (ended, largest) = measured(async {
        let (ours, mut peer) = tokio::io::duplex(1024);
        let (mux, mut conns) = Mux::with_conns(ours, &[PLUGIN_SERVICE_CONN]);
        let mut h = Vec::new();
        h.extend_from_slice(&PLUGIN_SERVICE_CONN.to_be_bytes());
        h.extend_from_slice(&u32::MAX.to_be_bytes());
        h.extend_from_slice(&[7u8; 100]);
        let _ = peer.write_all(&h).await;
        let c = conns.pop().expect("one connection");
        let got = tokio::time::timeout(DEADLINE, read_all(c)).await;
        tokio::time::timeout(DEADLINE, mux.closed().cancelled())
            .await
            .is_ok()
            && got.is_ok_and(|g| g.is_empty())
    });
    assert!(ended, "the trunk closes and the connection reads nothing");
    assert!(
        largest < MAX_INBOUND_PAYLOAD,
        "largest allocation {largest}"
    );
}

/// The allocation tracker sees the reader's payload buffer: a header claiming exactly the
/// limit is accepted and its buffer (the largest the reader ever makes) is allocated, then
/// the cut-short frame ends the trunk.
#[test]
fn the_tracker_sees_the_readers_buffer() {
    let (ended, largest) = measured(async {
        let (ours, mut peer) = tokio::io::duplex(1024);
        let (mux, _conns) = Mux::with_conns(ours, &[PLUGIN_SERVICE_CONN]);
        let mut h = Vec::new();
        h.extend_from_slice(&PLUGIN_SERVICE_CONN.to_be_bytes());
        h.extend_from_slice(&(MAX_INBOUND_PAYLOAD as u32).to_be_bytes());
        h.extend_from_slice(&[7u8; 100]);
        let _ = peer.write_all(&h).await;
        drop(peer);
        tokio::time::timeout(DEADLINE, mux.closed().cancelled())
            .await
            .is_ok()
    });
    assert!(ended);
    assert_eq!(largest, MAX_INBOUND_PAYLOAD);
}
