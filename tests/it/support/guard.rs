//! Shared harness for the stream guard tests: the bench backend, a guard in
//! front of it, tonic clients that record what they receive, a
//! frame-recording TCP tap, and a raw HTTP/2 frame writer for clients that
//! misbehave on purpose.
//!
#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drainshim::guard::{Guard, GuardConfig};
use drainshim::metrics::Metrics;
use drainshim_bench::proto::bench::stream_client::StreamClient;
use drainshim_bench::proto::bench::{EchoRequest, SubscribeRequest};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

/// Everything here waits at most this long for a condition: generous, so a
/// loaded CI machine is slow rather than flaky.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Polls `cond` until it holds, failing the test after `PATIENCE`.
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    crate::support::wait_for(what, PATIENCE, || std::future::ready(cond())).await
}

/// Awaits `fut`, failing the test after `PATIENCE`.
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

pub use super::Backend;

/// The harness's one bench backend ([`super::backend`]).
pub async fn start_backend() -> Backend {
    super::backend().await
}

/// A guard serving on 127.0.0.1:0.
pub struct RunningGuard {
    /// The guard under test.
    pub guard: Guard,
    /// Where clients connect.
    pub addr: SocketAddr,
    /// The guard's metrics, read directly.
    pub metrics: Metrics,
    /// `serve`'s shutdown token; cancelled on drop.
    pub shutdown: CancellationToken,
    /// The `serve` task; it ends after shutdown.
    pub task: JoinHandle<()>,
}

impl RunningGuard {
    /// Streams ended gracefully for `reason`, every protocol together.
    pub fn streams_terminated(&self, reason: drainshim::metrics::Reason) -> u64 {
        drainshim::metrics::STREAM_PROTOCOLS
            .into_iter()
            .map(|protocol| {
                self.metrics
                    .streams_terminated
                    .get_or_create(&drainshim::metrics::TerminatedLabels { reason, protocol })
                    .get()
            })
            .sum()
    }

    pub fn goaways(&self, reason: drainshim::metrics::Reason) -> u64 {
        self.metrics
            .goaways
            .get_or_create(&drainshim::metrics::ReasonLabels { reason })
            .get()
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The bench backend and a guard in front of it, its config set by
/// `configure`.
pub async fn guarded(configure: impl FnOnce(&mut GuardConfig)) -> (Backend, RunningGuard) {
    let backend = start_backend().await;
    let mut config = GuardConfig::new(backend.addr);
    configure(&mut config);
    (backend, start_guard(config).await)
}

pub async fn start_guard(config: GuardConfig) -> RunningGuard {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind guard");
    let addr = listener.local_addr().expect("guard addr");
    let metrics = Metrics::register(&mut Registry::default());
    let guard = Guard::new(config, metrics.clone());
    let shutdown = CancellationToken::new();
    let (g, s) = (guard.clone(), shutdown.clone());
    let task = tokio::spawn(async move { g.serve(listener, s).await });
    RunningGuard {
        guard,
        addr,
        metrics,
        shutdown,
        task,
    }
}

/// A tonic client on its own connection to `addr` (connected eagerly).
pub async fn connect_client(addr: SocketAddr) -> StreamClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    StreamClient::new(channel)
}

pub async fn echo(client: &mut StreamClient<Channel>, body: &str) -> Result<String, tonic::Status> {
    client
        .echo(EchoRequest {
            body: body.to_string(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().body)
}

/// A Subscribe stream held open, recording every sequence number.
pub struct Sub {
    /// Sequence numbers received, in order.
    pub seqs: Arc<Mutex<Vec<u64>>>,
    /// Resolves with how the stream ended and when.
    pub done: JoinHandle<(Result<(), tonic::Status>, Instant)>,
}

impl Sub {
    pub fn received(&self) -> usize {
        self.seqs.lock().map(|s| s.len()).unwrap_or(0)
    }

    /// Waits for the end of the stream: its final status and when it came.
    pub async fn finish(&mut self) -> (Result<(), tonic::Status>, Instant) {
        within("the end of a stream", &mut self.done)
            .await
            .expect("subscriber task")
    }

    /// Asserts the sequence numbers are exactly 1..=n.
    pub fn assert_no_gaps(&self) {
        let seqs = self.seqs.lock().expect("seqs").clone();
        let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
        assert_eq!(seqs, expected, "sequence numbers have gaps");
    }
}

pub fn subscribe(
    client: &StreamClient<Channel>,
    id: &str,
    interval_ms: u32,
    payload_bytes: u32,
) -> Sub {
    let mut client = client.clone();
    let seqs = Arc::new(Mutex::new(Vec::new()));
    let rec = seqs.clone();
    let req = SubscribeRequest {
        stream_id: id.to_string(),
        count: 0,
        interval_ms,
        payload_bytes,
        ..Default::default()
    };
    let done = tokio::spawn(async move {
        let result = async {
            let mut s = client.subscribe(req).await?.into_inner();
            while let Some(tick) = s.message().await? {
                if let Ok(mut v) = rec.lock() {
                    v.push(tick.seq);
                }
            }
            Ok(())
        }
        .await;
        (result, Instant::now())
    });
    Sub { seqs, done }
}

// ===== HTTP/2 frames =====

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const CONTINUATION: u8 = 0x9;
pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const REFUSED_STREAM: u32 = 0x7;
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// One frame as seen on the wire: the 9-byte header, plus the fields of
/// GOAWAY and RST_STREAM payloads and the start of a DATA payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Payload length.
    pub len: u32,
    /// Frame type (DATA, HEADERS, ...).
    pub ty: u8,
    /// Flags (END_STREAM, ACK, END_HEADERS, ...).
    pub flags: u8,
    /// Stream id (0 for connection frames).
    pub stream: u32,
    /// GOAWAY: (last stream id, error code).
    pub goaway: Option<(u32, u32)>,
    /// RST_STREAM: error code.
    pub rst: Option<u32>,
    /// DATA: the first [`DATA_HEAD`] bytes of its payload (whose message
    /// it carries); empty for other frames.
    pub head: Vec<u8>,
}

/// Bytes of a DATA frame's payload a [`Frame`] keeps.
pub const DATA_HEAD: usize = 64;

fn u32_at(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Parses one complete frame at the start of `buf`; returns it and its size.
pub fn parse_frame(buf: &[u8]) -> Option<(Frame, usize)> {
    if buf.len() < 9 {
        return None;
    }
    let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]);
    let total = 9 + len as usize;
    if buf.len() < total {
        return None;
    }
    let ty = buf[3];
    let payload = &buf[9..total];
    let frame = Frame {
        len,
        ty,
        flags: buf[4],
        stream: u32_at(&buf[5..9]) & 0x7fff_ffff,
        goaway: (ty == GOAWAY && payload.len() >= 8)
            .then(|| (u32_at(payload) & 0x7fff_ffff, u32_at(&payload[4..]))),
        rst: (ty == RST_STREAM && payload.len() >= 4).then(|| u32_at(payload)),
        head: if ty == DATA {
            payload[..payload.len().min(DATA_HEAD)].to_vec()
        } else {
            Vec::new()
        },
    };
    Some((frame, total))
}

pub fn encode_frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.push(ty);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn hpack_int(out: &mut Vec<u8>, mut value: usize, prefix_bits: u32, first: u8) {
    let max = (1usize << prefix_bits) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// HPACK "literal header field without indexing, new name", no Huffman.
pub fn hpack_literal(out: &mut Vec<u8>, name: &str, value: &str) {
    out.push(0x00);
    hpack_int(out, name.len(), 7, 0);
    out.extend_from_slice(name.as_bytes());
    hpack_int(out, value.len(), 7, 0);
    out.extend_from_slice(value.as_bytes());
}

/// A gRPC request header block for `path`, plus `extra` headers.
pub fn grpc_request_block(path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (n, v) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "guard.test"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        hpack_literal(&mut b, n, v);
    }
    for (n, v) in extra {
        hpack_literal(&mut b, n, v);
    }
    b
}

/// A raw HTTP/2 client connection: it writes what it is told, however rude,
/// and reads frames back.
pub struct RawH2 {
    /// The connection to the guard.
    pub tcp: TcpStream,
    /// Bytes read but not yet parsed into a frame.
    buf: Vec<u8>,
}

impl RawH2 {
    /// Connects and sends the preface and an empty SETTINGS frame.
    pub async fn connect(addr: SocketAddr) -> RawH2 {
        let mut tcp = TcpStream::connect(addr).await.expect("connect raw");
        tcp.write_all(PREFACE).await.expect("preface");
        tcp.write_all(&encode_frame(SETTINGS, 0, 0, &[]))
            .await
            .expect("settings");
        RawH2 {
            tcp,
            buf: Vec::new(),
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.tcp.write_all(bytes).await
    }

    /// The next frame, or None at EOF or on a read error (reset).
    pub async fn next_frame(&mut self) -> Option<Frame> {
        loop {
            if let Some((f, n)) = parse_frame(&self.buf) {
                self.buf.drain(..n);
                return Some(f);
            }
            let mut chunk = [0u8; 16 * 1024];
            match self.tcp.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Reads frames (acking SETTINGS) until `pred` matches one, or EOF.
    pub async fn until(&mut self, mut pred: impl FnMut(&Frame) -> bool) -> Option<Frame> {
        while let Some(f) = self.next_frame().await {
            if f.ty == SETTINGS && f.flags & ACK == 0 {
                let _ = self.send(&encode_frame(SETTINGS, ACK, 0, &[])).await;
            }
            if pred(&f) {
                return Some(f);
            }
        }
        None
    }
}

// ===== The tap =====

/// Direction of bytes through the tap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Client to guard.
    Up,
    /// Guard to client.
    Down,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum What {
    /// The tap accepted the client's connection (and connected to the guard).
    Accepted,
    Frame(Frame),
    /// The sender of this direction closed it.
    Eof,
}

#[derive(Clone, Debug)]
pub struct Event {
    /// When the tap saw it.
    pub at: Instant,
    /// Index of the tapped connection, in accept order.
    pub conn: usize,
    /// Which way the bytes flowed.
    pub dir: Dir,
    /// What was seen.
    pub what: What,
}

/// A TCP proxy that records every HTTP/2 frame header passing through it,
/// in both directions, with the time it was seen.
#[derive(Clone)]
pub struct Tap {
    /// Where clients connect instead of the guard.
    pub addr: SocketAddr,
    /// Everything seen, in order.
    events: Arc<Mutex<Vec<Event>>>,
    /// Bumped on every event, so waiters wake instead of polling.
    changed: watch::Sender<usize>,
    /// Ends the accept loop ([`Tap::stop`]); connections already piped run on.
    accepting: CancellationToken,
}

impl Tap {
    pub async fn start(target: SocketAddr) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind tap");
        let addr = listener.local_addr().expect("tap addr");
        let (changed, _) = watch::channel(0);
        let tap = Tap {
            addr,
            events: Arc::default(),
            changed,
            accepting: CancellationToken::new(),
        };
        let t = tap.clone();
        tokio::spawn(async move {
            let mut conn = 0;
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    _ = t.accepting.cancelled() => break,
                };
                let Ok((client, _)) = accepted else { break };
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                t.record(conn, Dir::Up, What::Accepted);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(t.clone().pipe(conn, Dir::Up, cr, sw));
                tokio::spawn(t.clone().pipe(conn, Dir::Down, sr, cw));
                conn += 1;
            }
        });
        tap
    }

    /// Stops accepting (the listener closes); what was accepted runs on
    /// until its peers close it.
    pub fn stop(&self) {
        self.accepting.cancel();
    }

    fn record(&self, conn: usize, dir: Dir, what: What) {
        let n = {
            let mut e = self.events.lock().expect("events");
            e.push(Event {
                at: Instant::now(),
                conn,
                dir,
                what,
            });
            e.len()
        };
        self.changed.send_replace(n);
    }

    async fn pipe(
        self,
        conn: usize,
        dir: Dir,
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
    ) {
        // The client's direction starts with the preface, which is no frame.
        let mut skip = if dir == Dir::Up { PREFACE.len() } else { 0 };
        let mut parse = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // Recorded before it is passed on, so an answer to a frame is
            // never stamped earlier than the frame (a task can be paused
            // between the write and the record on a loaded machine).
            let mut data = &chunk[..n];
            let s = skip.min(data.len());
            skip -= s;
            data = &data[s..];
            parse.extend_from_slice(data);
            while let Some((f, used)) = parse_frame(&parse) {
                parse.drain(..used);
                self.record(conn, dir, What::Frame(f));
            }
            if to.write_all(&chunk[..n]).await.is_err() {
                break;
            }
        }
        self.record(conn, dir, What::Eof);
        let _ = to.shutdown().await;
    }

    /// A copy of everything recorded so far.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().expect("events").clone()
    }

    /// Waits until `pick` finds something in the events, failing after `PATIENCE`.
    pub async fn wait_for<T>(&self, what: &str, mut pick: impl FnMut(&[Event]) -> Option<T>) -> T {
        let mut rx = self.changed.subscribe();
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(t) = pick(&self.events()) {
                return t;
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                panic!("timed out waiting for {what}; events: {:#?}", self.events());
            }
        }
    }
}

/// Frames of one connection in one direction, with their times.
pub fn frames(events: &[Event], conn: usize, dir: Dir) -> Vec<(Instant, Frame)> {
    events
        .iter()
        .filter(|e| e.conn == conn && e.dir == dir)
        .filter_map(|e| match &e.what {
            What::Frame(f) => Some((e.at, f.clone())),
            _ => None,
        })
        .collect()
}

/// When connection `conn` was accepted by the tap.
pub fn accepted_at(events: &[Event], conn: usize) -> Option<Instant> {
    events
        .iter()
        .find(|e| e.conn == conn && e.what == What::Accepted)
        .map(|e| e.at)
}

/// When `dir` of connection `conn` was closed by its sender.
pub fn eof_at(events: &[Event], conn: usize, dir: Dir) -> Option<Instant> {
    events
        .iter()
        .find(|e| e.conn == conn && e.dir == dir && e.what == What::Eof)
        .map(|e| e.at)
}
