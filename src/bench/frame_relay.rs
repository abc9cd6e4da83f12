//! An HTTP/2 frame relay: the frame-relay design for the guard
//! (docs/design.md, "Cost") measured before it is built. Each accepted
//! connection gets one connection to the upstream, and frames are passed on
//! unchanged, whole, in the batches they arrived in. On the way it does the
//! work such a guard has to do on every request, and nothing more:
//!
//! - splits both byte streams into frames (a guard injects its own frames
//!   only between whole ones);
//! - HPACK-decodes every header block in both directions, keeping each
//!   direction's dynamic table (a guard must read `content-type`, `:path`,
//!   `:status` and `grpc-status`, and forwarding blocks verbatim is only
//!   possible while its tables follow the peers');
//! - keeps a table of open streams, and in a gRPC response follows the
//!   length-prefixed messages across DATA frames (a graceful end lands on a
//!   message boundary).
//!
//! What it leaves out is what the guard does only when it ends something
//! (trailers encoded without touching the dynamic tables, RST_STREAM,
//! GOAWAY), and the guard's limits and request metrics. It is a bench tool:
//! it enforces no SETTINGS and answers nothing itself.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Buf, BytesMut};
use httlib_hpack::{Decoder, DecoderError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::guard::H2_PREFACE;

/// Every frame starts with a 9-byte header (RFC 9113 §4.1).
const FRAME_HEADER: usize = 9;
/// Room made for each read; a larger frame grows the buffer to fit it.
const READ_BUF: usize = 64 * 1024;
/// A gRPC message starts with a compressed flag and a 4-byte length.
const GRPC_PREFIX: usize = 5;

// Frame types and flags (RFC 9113 §6).
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// What the relay saw, over all its connections (for tests and logs).
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections relayed.
    pub connections: AtomicU64,
    /// Streams opened by clients.
    pub streams: AtomicU64,
    /// Of those, gRPC streams (`content-type: application/grpc...`).
    pub grpc_streams: AtomicU64,
    /// Whole gRPC response messages followed to their end.
    pub messages: AtomicU64,
    /// Header blocks decoded, both directions.
    pub header_blocks: AtomicU64,
}

/// Why a relayed connection was dropped.
#[derive(Debug, thiserror::Error)]
enum RelayError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("the client did not start with the HTTP/2 connection preface")]
    Preface,
    #[error("malformed {0} frame")]
    Malformed(&'static str),
    #[error("a header block was interrupted by another frame")]
    Interleaved,
    #[error("HPACK: {0:?}")]
    Hpack(DecoderError),
}

/// Which peer sent the bytes a pump reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Client,
    App,
}

/// Relays every connection accepted on `listener` to `upstream` until
/// `shutdown`; the relayed connections are then dropped.
pub async fn serve(
    listener: TcpListener,
    upstream: SocketAddr,
    stats: Arc<Stats>,
    shutdown: impl Future<Output = ()>,
) {
    super::relay::each_pair(
        listener,
        upstream,
        "frame-relay",
        shutdown,
        move |down, up| {
            let stats = stats.clone();
            async move {
                stats.connections.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = relay(down, up, &stats).await {
                    tracing::debug!(error = %e, "bench frame-relay: connection dropped");
                }
            }
        },
    )
    .await;
}

/// One connection, both directions in one task. Ends when both sides have
/// closed, or at the first error (the connection is then dropped).
async fn relay(down: TcpStream, up: TcpStream, stats: &Stats) -> Result<(), RelayError> {
    let (down_r, down_w) = down.into_split();
    let (up_r, up_w) = up.into_split();
    let table = Mutex::new(Streams::default());
    let to_app = pump(down_r, up_w, Inspector::new(Side::Client), &table, stats);
    let to_client = pump(up_r, down_w, Inspector::new(Side::App), &table, stats);
    tokio::pin!(to_app, to_client);
    let (mut app_done, mut client_done) = (false, false);
    while !(app_done && client_done) {
        tokio::select! {
            r = &mut to_app, if !app_done => { app_done = true; r?; }
            r = &mut to_client, if !client_done => { client_done = true; r?; }
        }
    }
    Ok(())
}

/// Reads `from`, inspects every whole frame, and writes the whole frames
/// of each read to `to` in one write. At the end of `from`, shuts `to`.
async fn pump<R, W>(
    mut from: R,
    mut to: W,
    mut inspect: Inspector,
    table: &Mutex<Streams>,
    stats: &Stats,
) -> Result<(), RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(READ_BUF);
    loop {
        if buf.capacity() - buf.len() < READ_BUF / 4 {
            buf.reserve(READ_BUF);
        }
        if from.read_buf(&mut buf).await? == 0 {
            to.shutdown().await?;
            return Ok(());
        }
        let (whole, need) = {
            let mut streams = table.lock().unwrap_or_else(|p| p.into_inner());
            inspect.frames(&buf, &mut streams, stats)?
        };
        if whole > 0 {
            to.write_all(&buf[..whole]).await?;
            buf.advance(whole);
        }
        // A frame larger than the room left: make room for all of it.
        buf.reserve(need);
    }
}

/// One stream, as the relay follows it.
#[derive(Debug, Default)]
struct Stream {
    /// A gRPC stream: its response DATA is followed message by message.
    grpc: bool,
    /// Response messages completed.
    messages: u64,
    /// Bytes of the current message's 5-byte prefix seen so far.
    prefix_len: usize,
    prefix: [u8; GRPC_PREFIX],
    /// Bytes of the current message's body still to come.
    body_left: u64,
}

impl Stream {
    /// Follows `data` through the response's messages; returns how many
    /// completed in it.
    fn messages(&mut self, mut data: &[u8]) -> u64 {
        let mut done = 0;
        while !data.is_empty() {
            if self.body_left == 0 {
                let take = (GRPC_PREFIX - self.prefix_len).min(data.len());
                self.prefix[self.prefix_len..self.prefix_len + take].copy_from_slice(&data[..take]);
                self.prefix_len += take;
                data = &data[take..];
                if self.prefix_len == GRPC_PREFIX {
                    self.prefix_len = 0;
                    let p = self.prefix;
                    self.body_left = u64::from(u32::from_be_bytes([p[1], p[2], p[3], p[4]]));
                    done += u64::from(self.body_left == 0);
                }
            } else {
                let take = self.body_left.min(data.len() as u64);
                self.body_left -= take;
                data = &data[take as usize..];
                done += u64::from(self.body_left == 0);
            }
        }
        self.messages += done;
        done
    }

    /// At a message boundary: where a graceful end may go.
    #[cfg(test)]
    fn at_boundary(&self) -> bool {
        self.prefix_len == 0 && self.body_left == 0
    }
}

/// The connection's open streams, shared by its two directions.
type Streams = HashMap<u32, Stream>;

/// One direction's parsing state.
struct Inspector {
    side: Side,
    /// The connection preface is still to be read (client side only).
    preface: bool,
    /// This direction's HPACK dynamic table.
    hpack: Decoder<'static>,
    /// A header block split over CONTINUATION frames: its stream, and
    /// whether its HEADERS ended the stream.
    pending: Option<(u32, bool)>,
    /// The header block being gathered and decoded (the decoder consumes a
    /// `Vec`), and the fields it yields; both kept to be reused.
    block: Vec<u8>,
    fields: Vec<(Vec<u8>, Vec<u8>, u8)>,
}

impl Inspector {
    fn new(side: Side) -> Self {
        Self {
            side,
            preface: side == Side::Client,
            hpack: Decoder::default(),
            pending: None,
            block: Vec::new(),
            fields: Vec::new(),
        }
    }

    /// Inspects the whole frames at the start of `buf`: returns how many
    /// bytes they take, and how many more bytes the next frame needs.
    fn frames(
        &mut self,
        buf: &[u8],
        streams: &mut Streams,
        stats: &Stats,
    ) -> Result<(usize, usize), RelayError> {
        let mut at = 0;
        if self.preface {
            if buf.len() < H2_PREFACE.len() {
                if !H2_PREFACE.starts_with(buf) {
                    return Err(RelayError::Preface);
                }
                return Ok((0, H2_PREFACE.len() - buf.len()));
            }
            if &buf[..H2_PREFACE.len()] != H2_PREFACE {
                return Err(RelayError::Preface);
            }
            self.preface = false;
            at = H2_PREFACE.len();
        }
        loop {
            let rest = &buf[at..];
            if rest.len() < FRAME_HEADER {
                return Ok((at, FRAME_HEADER - rest.len()));
            }
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            if rest.len() < FRAME_HEADER + len {
                return Ok((at, FRAME_HEADER + len - rest.len()));
            }
            let (kind, flags) = (rest[3], rest[4]);
            let id = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff;
            self.frame(
                kind,
                flags,
                id,
                &rest[FRAME_HEADER..FRAME_HEADER + len],
                streams,
                stats,
            )?;
            at += FRAME_HEADER + len;
        }
    }

    fn frame(
        &mut self,
        kind: u8,
        flags: u8,
        id: u32,
        payload: &[u8],
        streams: &mut Streams,
        stats: &Stats,
    ) -> Result<(), RelayError> {
        // Between HEADERS without END_HEADERS and the last CONTINUATION, no
        // other frame may come (RFC 9113 §6.10).
        if self.pending.is_some() && kind != CONTINUATION {
            return Err(RelayError::Interleaved);
        }
        match kind {
            DATA => {
                let data = unpadded(flags, payload, "DATA")?;
                if self.side == Side::App {
                    if let Some(s) = streams.get_mut(&id).filter(|s| s.grpc) {
                        let done = s.messages(data);
                        stats.messages.fetch_add(done, Ordering::Relaxed);
                    }
                }
                if flags & END_STREAM != 0 {
                    self.stream_end(id, streams);
                }
            }
            HEADERS => {
                let mut block = unpadded(flags, payload, "HEADERS")?;
                if flags & PRIORITY != 0 {
                    block = block.get(5..).ok_or(RelayError::Malformed("HEADERS"))?;
                }
                self.header_fragment(id, flags, block, streams, stats)?;
            }
            PUSH_PROMISE => {
                // Its header block is in this direction's HPACK context too.
                let block = unpadded(flags, payload, "PUSH_PROMISE")?;
                let block = block
                    .get(4..)
                    .ok_or(RelayError::Malformed("PUSH_PROMISE"))?;
                self.header_fragment(0, flags & !END_STREAM, block, streams, stats)?;
            }
            CONTINUATION => {
                let Some((pid, end_stream)) = self.pending else {
                    return Err(RelayError::Malformed("CONTINUATION"));
                };
                if pid != id {
                    return Err(RelayError::Interleaved);
                }
                self.block.extend_from_slice(payload);
                if flags & END_HEADERS != 0 {
                    self.pending = None;
                    self.header_block(id, end_stream, streams, stats)?;
                }
            }
            RST_STREAM => {
                streams.remove(&id);
            }
            // SETTINGS, PING, GOAWAY, WINDOW_UPDATE, PRIORITY and unknown
            // types pass as they are.
            _ => {}
        }
        Ok(())
    }

    fn header_fragment(
        &mut self,
        id: u32,
        flags: u8,
        fragment: &[u8],
        streams: &mut Streams,
        stats: &Stats,
    ) -> Result<(), RelayError> {
        let end_stream = flags & END_STREAM != 0;
        self.block.clear();
        self.block.extend_from_slice(fragment);
        if flags & END_HEADERS != 0 {
            return self.header_block(id, end_stream, streams, stats);
        }
        self.pending = Some((id, end_stream));
        Ok(())
    }

    /// The whole header block gathered in `block`, of stream `id` (0: a
    /// push promise's).
    fn header_block(
        &mut self,
        id: u32,
        end_stream: bool,
        streams: &mut Streams,
        stats: &Stats,
    ) -> Result<(), RelayError> {
        self.fields.clear();
        self.hpack
            .decode(&mut self.block, &mut self.fields)
            .map_err(RelayError::Hpack)?;
        let grpc = self.fields.iter().any(|(name, value, _)| {
            name == b"content-type" && value.starts_with(b"application/grpc")
        });
        stats.header_blocks.fetch_add(1, Ordering::Relaxed);
        if id == 0 {
            return Ok(());
        }
        // A client's first block opens a stream; its trailers, and the
        // application's head and trailers, change nothing the relay follows.
        if self.side == Side::Client {
            if let std::collections::hash_map::Entry::Vacant(v) = streams.entry(id) {
                stats.streams.fetch_add(1, Ordering::Relaxed);
                stats
                    .grpc_streams
                    .fetch_add(u64::from(grpc), Ordering::Relaxed);
                v.insert(Stream {
                    grpc,
                    ..Default::default()
                });
            }
        }
        if end_stream {
            self.stream_end(id, streams);
        }
        Ok(())
    }

    /// A side ended the stream. The application's end is the stream's end
    /// for the relay: nothing it follows comes after.
    fn stream_end(&mut self, id: u32, streams: &mut Streams) {
        if self.side == Side::App {
            streams.remove(&id);
        }
    }
}

/// The payload without its padding (RFC 9113 §6.1).
fn unpadded<'a>(flags: u8, payload: &'a [u8], kind: &'static str) -> Result<&'a [u8], RelayError> {
    if flags & PADDED == 0 {
        return Ok(payload);
    }
    let (&pad, rest) = payload.split_first().ok_or(RelayError::Malformed(kind))?;
    rest.len()
        .checked_sub(usize::from(pad))
        .map(|end| &rest[..end])
        .ok_or(RelayError::Malformed(kind))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::bench::stream_client::StreamClient;
    use crate::proto::bench::{EchoRequest, SubscribeRequest};
    use std::time::Duration;

    #[test]
    fn messages_are_followed_across_frames() {
        let mut s = Stream {
            grpc: true,
            ..Default::default()
        };
        // Two messages (3 bytes, then empty), split at awkward places.
        let wire = [0u8, 0, 0, 0, 3, b'a', b'b', b'c', 0, 0, 0, 0, 0];
        assert_eq!(s.messages(&wire[..2]), 0);
        assert!(!s.at_boundary());
        assert_eq!(s.messages(&wire[2..6]), 0);
        assert_eq!(s.messages(&wire[6..9]), 1);
        assert!(!s.at_boundary(), "inside the second prefix");
        assert_eq!(s.messages(&wire[9..]), 1);
        assert!(s.at_boundary());
        assert_eq!(s.messages, 2);
    }

    #[test]
    fn padding_is_checked() {
        assert_eq!(
            unpadded(PADDED, &[2, b'x', 0, 0], "DATA").ok(),
            Some(&b"x"[..])
        );
        assert!(unpadded(PADDED, &[4, b'x', 0, 0], "DATA").is_err());
        assert!(unpadded(PADDED, &[], "DATA").is_err());
    }

    #[test]
    fn a_client_without_the_preface_is_refused() {
        let mut i = Inspector::new(Side::Client);
        let stats = Stats::default();
        let mut streams = Streams::default();
        assert!(matches!(
            i.frames(b"GET / HTTP/1.1\r\n\r\n", &mut streams, &stats),
            Err(RelayError::Preface)
        ));
        // A preface still arriving is waited for.
        let mut i = Inspector::new(Side::Client);
        assert_eq!(
            i.frames(&H2_PREFACE[..5], &mut streams, &stats).ok(),
            Some((0, 19))
        );
    }

    /// Real gRPC through the relay: calls succeed and every stream and
    /// response message is seen.
    #[tokio::test]
    async fn grpc_passes_and_is_followed() {
        let backend_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let backend_addr = backend_listener.local_addr().expect("addr");
        let (stop_backend, backend_stopped) = tokio::sync::oneshot::channel::<()>();
        let backend = tokio::spawn(crate::bench::server::serve(
            backend_listener,
            crate::bench::server::BenchService::default(),
            async {
                let _ = backend_stopped.await;
            },
        ));
        let relay = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let relay_addr = relay.local_addr().expect("addr");
        let stats = Arc::new(Stats::default());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(serve(relay, backend_addr, stats.clone(), async {
            let _ = stop_rx.await;
        }));
        let calls = async {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{relay_addr}"))
                .expect("endpoint")
                .connect()
                .await
                .expect("connect to the relay");
            let mut client = StreamClient::new(channel);
            for n in 0..3 {
                let body = format!("hello {n}");
                let reply = client
                    .echo(EchoRequest {
                        body: body.clone(),
                        delay_ms: 0,
                    })
                    .await
                    .expect("echo")
                    .into_inner();
                assert_eq!(reply.body, body);
            }
            let mut ticks = client
                .subscribe(SubscribeRequest {
                    stream_id: "t".into(),
                    count: 5,
                    interval_ms: 1,
                    payload_bytes: 20_000,
                    burst: 0,
                })
                .await
                .expect("subscribe")
                .into_inner();
            let mut seqs = Vec::new();
            while let Some(t) = ticks.message().await.expect("tick") {
                assert_eq!(t.payload.len(), 20_000);
                seqs.push(t.seq);
            }
            assert_eq!(seqs.len(), 5, "every message arrives");
        };
        tokio::time::timeout(Duration::from_secs(30), calls)
            .await
            .expect("calls done in time");
        // Three echoes and the subscription: each a gRPC stream, each answer
        // and each tick a whole message; three header blocks per call
        // (request, response head, trailers).
        assert_eq!(stats.streams.load(Ordering::Relaxed), 4);
        assert_eq!(stats.grpc_streams.load(Ordering::Relaxed), 4);
        assert_eq!(stats.messages.load(Ordering::Relaxed), 3 + 5);
        assert_eq!(stats.header_blocks.load(Ordering::Relaxed), 4 * 3);
        assert_eq!(stats.connections.load(Ordering::Relaxed), 1);
        stop_tx.send(()).expect("stop");
        tokio::time::timeout(Duration::from_secs(10), served)
            .await
            .expect("serve returns on shutdown")
            .expect("serve task");
        let _ = stop_backend.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), backend).await;
    }
}
