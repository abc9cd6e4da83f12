//! The guard's HTTP/2 data path as a frame relay (docs/design.md, "Cost").
//!
//! Each downstream connection gets one application connection, and frames
//! pass between them whole and unchanged, with the same stream ids, in the
//! batches they arrived in. Flow control is the peers' own, end to end. On
//! the way the relay reads what a guard needs and nothing more:
//! - every header block, HPACK-decoded in each direction with that
//!   direction's dynamic table, for the request's kind and path and the
//!   response's status;
//! - each response's message (or event) boundaries, across DATA frames;
//! - a table of open streams, each registered with the guard's registry.
//!
//! It writes frames of its own only to end or refuse something, and encodes
//! every header block it writes as literals without indexing, which change
//! neither peer's dynamic table. A graceful end is the h2 path's
//! ([`super::stream`]): at a boundary, in the application's first pause,
//! after a PING round trip to the application (its ack follows everything
//! the application had queued), trailers `grpc-status: 14` to the client
//! and RST_STREAM(CANCEL) to the application. Whatever the application
//! still sends for that stream is dropped, and the connection window its
//! DATA took is given back to it.
//!
//! A block the guard does not pass on would leave the receiver's HPACK
//! table behind the sender's if it changed it. Two kinds are never passed:
//! - a request the guard refuses (draining, over a limit, or reset by the
//!   client before it left): the application never sees it, so the
//!   client may retry it anywhere;
//! - an application block for a stream the client already saw end (the
//!   client would fail the connection over it).
//!
//! When such a block changed the table, the relay re-encodes that
//! direction's blocks as literals from then on, the first one clearing the
//! receiver's table (two size updates, to 0 and back).
//!
//! SETTINGS pass through, lowered to the guard's limits: the application's
//! stream limit so reaches the client, and one application connection is
//! enough. The GOAWAY sequence is the h2 path's, sent by the relay: the
//! application never sees it. WebSockets over extended CONNECT are served
//! beside the relayed streams, over HTTP/1.1 to the application
//! ([`super::connect`]). A connection whose application cannot be reached,
//! or does not answer HTTP/2 before anything reached the client, is served
//! by the h2 path ([`super::h2conn`]) from its first byte.

use std::collections::HashMap;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use http::StatusCode;
use std::future::Future;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::io::poll_read_buf;

use super::body::{request_kind_of, response_kind_of, Boundaries, End, Kind};
use super::conn::ConnInfo;
use super::ending::{record_outcome, Outcome, BARRIER_WAIT, BURST_GAP};
use super::flood::Buckets;
use super::grpc;
use super::lifecycle::{Action, Cause, Input, Lifecycle};
use super::rapid::{PrematureResets, PREMATURE_LIFETIME};
use super::registry::{EndQueue, Refused, Registered};
use super::signals;
use super::sniff::{linger, Prefixed, H2_PREFACE};
use super::upstream::connect_tcp;
use super::wire::{self, Head};
use super::Inner;
use crate::metrics::{Limit, Reason, StreamProtocol};

/// Room made for each read.
const READ_BUF: usize = 64 * 1024;
/// A side is not read while this much waits to be written to the other.
const HIGH_WATER: usize = 256 * 1024;
/// Most client bytes kept while the application's SETTINGS are awaited.
const REPLAY_MAX: usize = 64 * 1024;
/// The largest frame relayed; both peers' SETTINGS_MAX_FRAME_SIZE are
/// lowered to it, so the relay never holds more than this for one frame.
const MAX_FRAME: u32 = 1 << 20;
/// The default SETTINGS_MAX_FRAME_SIZE (RFC 9113 §6.5.2).
const DEFAULT_FRAME: usize = 16_384;
/// The initial flow-control window (RFC 9113 §6.9.2).
const DEFAULT_WINDOW: u32 = 65_535;
/// While the guard cannot write for want of the client's connection window,
/// it still reads the client (for its WINDOW_UPDATEs) until this much waits.
const BLOCKED_HIGH_WATER: usize = 4 * HIGH_WATER;
/// A decoded application header block past this is broken (or an HPACK bomb).
const APP_BLOCK_MAX: usize = 1 << 20;
/// The largest flow-control window (RFC 9113 §6.9.1).
const MAX_WINDOW: i64 = (1 << 31) - 1;
/// Most bytes buffered for a local stream's task, and read from it at once.
const LOCAL_CHUNK: usize = 16 * 1024;
/// The default SETTINGS_HEADER_TABLE_SIZE.
const DEFAULT_TABLE: u32 = 4_096;
/// A decoded header block this many times the header list limit is an
/// attack (an HPACK bomb): the connection is closed.
const BOMB_FACTOR: usize = 16;
/// More CONTINUATION frames than this in one block is a flood.
const MAX_CONTINUATIONS: usize = 64;
/// The first bytes of the guard's own PINGs' opaque data: a PING barrier
/// to the application, and the GOAWAY probe to the client.
const BARRIER_PING: [u8; 4] = *b"dsb\0";
const GOAWAY_PING: [u8; 8] = *b"dsgoaway";

/// Serves one HTTP/2 connection by relaying its frames to the application,
/// or, when the application cannot be reached or does not answer HTTP/2,
/// by answering the client itself (see [`Relay::alone`]).
pub async fn serve(inner: Arc<Inner>, io: Prefixed<TcpStream>, info: ConnInfo) {
    let l = inner.config.limits;
    let app = match connect_tcp(
        &inner.connector,
        inner.config.upstream,
        l.upstream_connect_timeout,
    )
    .await
    {
        Ok(app) => Some(app),
        Err(e) => {
            tracing::warn!(peer = %info.peer, error = %e, "guard: cannot reach the application; answering this connection's streams retryably");
            None
        }
    };
    let mut client = io;
    let mut reclaim = client.reclaim();
    let mut relay = Relay::new(&inner, info, app.is_none());
    let fallback = relay.run(&mut client, app).await;
    drop(relay);
    if let Some(replay) = fallback {
        // The application does not speak HTTP/2 (or closed before its
        // SETTINGS): nothing reached the client yet, so the guard serves
        // the connection alone from its first byte (a WebSocket over
        // extended CONNECT still reaches the application over HTTP/1.1;
        // other streams get their retryable answer).
        let (_, Some(tcp)) = client.into_parts() else {
            return;
        };
        tracing::debug!(peer = %info.peer, conn = info.id, replayed = replay.len(), "guard: the application did not answer HTTP/2; answering this connection's streams itself");
        client = Prefixed::new(replay.freeze(), tcp);
        reclaim = client.reclaim();
        let mut relay = Relay::new(&inner, info, true);
        relay.run(&mut client, None).await;
    }
    drop(client);
    if let Some(tcp) = reclaim.take() {
        linger(tcp, l.shutdown_timeout).await;
    }
    tracing::debug!(peer = %info.peer, conn = info.id, "guard: HTTP/2 connection closed");
}

/// Feeds one connection's bytes to a relay with no sockets: each chunk as
/// read from the client (true) or the application (false), then the timers;
/// what the relay writes is dropped. For the fuzz target: whatever the
/// peers send, the relay must neither panic nor hold more than its bounds.
/// Runs inside a tokio runtime (a WebSocket over HTTP/2 starts a task).
/// `alone`: the relay has no application, and the application's chunks
/// are dropped.
pub fn feed(inner: &Arc<Inner>, chunks: &[(bool, &[u8])], alone: bool) {
    let info = ConnInfo {
        id: u64::MAX,
        peer: std::net::SocketAddr::from(([127, 0, 0, 1], 1)),
        accepted_at: Instant::now(),
    };
    let mut relay = Relay::new(inner, info, alone);
    for &(from_client, bytes) in chunks {
        if alone && !from_client {
            continue;
        }
        let now = Instant::now();
        let result = if from_client {
            if relay.closing || relay.from_client.len() > READ_BUF + MAX_FRAME as usize {
                continue;
            }
            relay.from_client.extend_from_slice(bytes);
            if let Some(r) = relay.replay.as_mut() {
                r.extend_from_slice(bytes);
            }
            relay.client_frames(now)
        } else {
            relay.from_app.extend_from_slice(bytes);
            relay.app_frames(now)
        };
        match result {
            Err(Failure::NotHttp2) if relay.handshake => return,
            Err(e) => relay.fail(e),
            Ok(()) => {}
        }
        // Endings asked meanwhile (a drain, the app's GOAWAY), as `run` takes them.
        for id in relay.queue.take() {
            relay.begin_end(id, now);
        }
        let _ = relay.timers(now);
        relay.count_changed(now);
        relay.clear_gate();
        relay.to_app.clear();
        relay.to_client.clear();
        relay.cleared = 0;
        assert!(relay.from_app.len() <= READ_BUF + MAX_FRAME as usize + bytes.len());
    }
}

/// One relayed stream.
struct Stream {
    /// Its entry in the guard's registry (dropped: removed).
    reg: Registered,
    /// The request's kind, by its content type.
    kind: Kind,
    /// The response's boundaries, once its head arrived.
    bounds: Option<Boundaries>,
    /// The client ended its request (END_STREAM).
    req_done: bool,
    /// The application ended its response (END_STREAM).
    resp_done: bool,
    started: Instant,
    /// Response messages (or events) so far.
    messages: u64,
    /// When the application last sent data on it.
    last_data: Option<Instant>,
    ending: Option<Ending>,
    sig: Option<signals::Request>,
    /// The client's window for this stream's response data, and since when
    /// it has been shut (the client takes nothing: `write_stall_timeout`).
    window: i64,
    shut_since: Option<Instant>,
}

impl Stream {
    fn answered(&self) -> bool {
        self.bounds.is_some()
    }

    fn at_boundary(&self) -> bool {
        self.bounds.as_ref().is_some_and(Boundaries::at_boundary)
    }

    fn endable(&self) -> bool {
        self.bounds.as_ref().is_some_and(Boundaries::endable)
    }

    fn grpc(&self) -> bool {
        self.reg.ctl.grpc
    }

    fn protocol(&self) -> StreamProtocol {
        if self.grpc() {
            StreamProtocol::grpc
        } else {
            StreamProtocol::http
        }
    }
}

/// A stream being ended, and how far it got.
#[derive(Clone, Copy, Debug)]
struct Ending {
    reason: Reason,
    /// When the end was asked: `end_timeout` counts from here.
    asked: Instant,
    /// At a boundary: the PING barrier starts then, unless data comes first.
    quiet_at: Option<Instant>,
    /// Waiting for the ack of this barrier PING, at most until the instant.
    barrier: Option<(u64, Instant)>,
    /// Past `end_timeout` mid-message: the next boundary ends it, but no
    /// later than this.
    forced_by: Option<Instant>,
}

/// The PING barrier on the application connection: one PING in flight at a
/// time, shared by every stream waiting for one. A stream waits for two
/// round trips, the second PING sent on the first one's ack: an app's
/// HTTP/2 stack may write a PING's ack ahead of DATA it already queued (h2
/// does, so a tonic app under load did, and a message was lost), but it
/// writes that DATA before it has even read the next PING.
#[derive(Debug, Default)]
struct Barrier {
    /// PINGs sent, and the highest one acked.
    sent: u64,
    acked: u64,
    /// The highest PING a waiting stream needs acked; another is sent on
    /// each ack until it has been.
    wanted: u64,
}

/// A header block split over CONTINUATION frames, being gathered.
struct Block {
    id: u32,
    /// The HEADERS (or PUSH_PROMISE) ended the stream.
    end_stream: bool,
    /// A PUSH_PROMISE's promised stream (never relayed: see `app_fragment`).
    promised: Option<u32>,
    /// The frames as they came, and the block fragments from them.
    frames: BytesMut,
    fragment: Vec<u8>,
    /// CONTINUATION frames so far.
    continuations: usize,
}

impl Block {
    /// The block a HEADERS (or PUSH_PROMISE) frame starts.
    fn start(h: Head) -> Self {
        Self {
            id: h.id,
            end_stream: h.kind == wire::HEADERS && h.flags & wire::END_STREAM != 0,
            promised: None,
            frames: BytesMut::new(),
            fragment: Vec::new(),
            continuations: 0,
        }
    }

    /// Keeps a frame of a block not yet whole, and its fragment.
    fn gather(&mut self, frame: &[u8], fragment: &[u8]) {
        self.frames.extend_from_slice(frame);
        self.fragment.extend_from_slice(fragment);
        self.continuations += 1;
    }

    /// The whole block's encoded bytes, into `out` (cleared first).
    fn whole_into(&self, last: &[u8], out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.fragment);
        out.extend_from_slice(last);
    }
}

/// What woke the relay.
enum Event {
    FromClient,
    /// A local stream moved (its frames wait in `to_client`).
    Local,
    /// Everything for the client is written, and the connection waits for that.
    Flushed,
    FromApp,
    ClientGone,
    AppGone,
    Timer,
    Ended,
    Input(Input),
}

/// One connection's state (the sockets are the `run` loop's).
struct Relay<'a> {
    inner: &'a Arc<Inner>,
    info: ConnInfo,
    streams: HashMap<u32, Stream>,
    /// Highest stream id the client opened.
    last_id: u32,
    /// Lowest last-stream id the client was sent in a GOAWAY: newer streams
    /// are refused, and no later GOAWAY may name a higher one (RFC 9113
    /// §6.8: a peer treats a growing last-stream id as a connection error).
    sent_last: Option<u32>,
    /// Lowest last-stream id the application sent in a GOAWAY: it will
    /// never process a stream above it, so those are refused retryably.
    app_last: Option<u32>,
    from_client: BytesMut,
    from_app: BytesMut,
    to_app: BytesMut,
    to_client: BytesMut,
    /// The client's preface is still to come.
    preface: bool,
    /// The application's first frame (its SETTINGS) has not come yet:
    /// only the client's preface went on, and every client byte is kept
    /// in `replay` (up to `REPLAY_MAX`), in case it does not speak HTTP/2.
    handshake: bool,
    replay: Option<BytesMut>,
    /// A GOAWAY asked during the handshake, sent after the SETTINGS.
    goaway_held: bool,
    /// Each direction's HPACK decoder.
    client_hpack: wire::Hpack,
    app_hpack: wire::Hpack,
    client_block: Option<Block>,
    app_block: Option<Block>,
    /// The application's blocks are re-encoded (see the module doc); the
    /// first one clears the client's table.
    translate: Option<bool>,
    /// The same for the client's blocks, which the application gets
    /// re-encoded once the guard dropped one that changed the table.
    to_app_translate: Option<bool>,
    /// The application's SETTINGS_HEADER_TABLE_SIZE and MAX_FRAME_SIZE.
    app_table: u32,
    app_frame: usize,
    /// The last request forwarded, while still unwritten and last in
    /// `to_app`: its stream, where it starts and ends, and whether it
    /// changed the table.
    unsent: Option<(u32, usize, usize, bool)>,
    /// The error code of the application's last GOAWAY: the client's
    /// GOAWAY when the application's connection then closes.
    app_goaway_code: u32,
    /// The client's SETTINGS_HEADER_TABLE_SIZE and MAX_FRAME_SIZE.
    client_table: u32,
    /// HEADER_TABLE_SIZE of each client SETTINGS the application has not
    /// acked yet, oldest first (None: the frame did not set it).
    client_tables_unacked: std::collections::VecDeque<Option<u32>>,
    /// The client's table size the application acked last.
    client_table_acked: u32,
    /// The client lowered its table size and no block since told its
    /// decoder so: the next block to the client must start with a size
    /// update to this (RFC 7541 §4.2). The application's next block does;
    /// the guard's own puts one in front if it goes first.
    client_update_due: Option<u32>,
    /// Streams the client reset lately (bounded): the application's header
    /// blocks for them still go on (the client must decode them for its
    /// table, RFC 9113 §5.1), so dropping them needs no re-encoding.
    client_reset: std::collections::VecDeque<u32>,
    client_frame: usize,
    /// The largest MAX_FRAME_SIZE the client ever announced: an application
    /// frame above it is the application's error, never passed on.
    client_frame_max: usize,
    /// The application's SETTINGS have been seen (the first gets the
    /// guard's limits added).
    app_settings: bool,
    queue: Arc<EndQueue>,
    /// Streams being ended.
    ending: Vec<u32>,
    /// Streams whose client window was shut (some may have opened since).
    stalled: Vec<u32>,
    barrier: Barrier,
    life: Lifecycle,
    told_empty: bool,
    resets: PrematureResets,
    calmed: bool,
    /// The connection is closing: stop reading, flush (until the
    /// instant at most), then close.
    closing: bool,
    closing_by: Option<Instant>,
    /// The client's `x-forwarded-for` entry, as a CONTINUATION's block.
    forwarded: Vec<u8>,
    scratch: Vec<u8>,
    /// The client's control-frame rates, and until when reading it is
    /// paused because one ran out.
    buckets: Buckets,
    throttled_until: Option<Instant>,
    /// The fields of the last client block (kept to be reused).
    all: Vec<wire::Field>,
    /// WebSockets over HTTP/2 the guard serves itself, by stream id.
    locals: HashMap<u32, Local>,
    /// The client's connection window for DATA from this side (the
    /// application's and the guard's own): charged as `to_client` is cleared
    /// for writing (see [`Relay::clear_gate`]).
    conn_window: i64,
    /// The front of `to_client` already charged to `conn_window`: only that
    /// much may be written.
    cleared: usize,
    /// The guard's own DATA bytes the application's view of the window does
    /// not know of yet: withheld from the client's next WINDOW_UPDATEs.
    debt: i64,
    /// The GOAWAY probe PING went to the client and is not acked yet.
    probe_out: bool,
    /// After the application's GOAWAY: when streams that have become
    /// long-lived since are looked for next (a stream young at the GOAWAY
    /// would otherwise run into the application's grace).
    app_sweep_at: Option<Instant>,
    /// The client's SETTINGS_INITIAL_WINDOW_SIZE: each local stream's
    /// window for the guard's DATA starts there.
    client_window: i64,
    /// No application connection: the guard is the client's server (see
    /// [`Relay::alone`]); what would go to the application is dropped.
    alone: bool,
}

/// A WebSocket over HTTP/2 the guard serves itself: `io` is its task's
/// view of the stream (the task runs [`super::connect::proxy`]).
struct Local {
    io: tokio::io::DuplexStream,
    /// The task's answer, until it came.
    answer: Option<tokio::sync::oneshot::Receiver<super::connect::Answer>>,
    answered: bool,
    /// The client's window for this stream.
    window: i64,
    /// The client's DATA not yet handed to the task.
    to_task: BytesMut,
    /// The client ended its side; once `to_task` is handed over, the task
    /// sees the end (`shut`).
    client_eof: bool,
    shut: bool,
    /// The task ended its side: END_STREAM went to the client.
    task_eof: bool,
}

impl<'a> Relay<'a> {
    /// A relay for one connection; `alone` when there is no application
    /// connection (see [`Relay::alone`]).
    fn new(inner: &'a Arc<Inner>, info: ConnInfo, alone: bool) -> Self {
        let l = inner.config.limits;
        let life = inner.lifecycle(&info);
        let peer = info.peer.ip().to_string();
        let mut relay = Self {
            inner,
            info,
            streams: HashMap::new(),
            last_id: 0,
            sent_last: None,
            app_last: None,
            from_client: BytesMut::with_capacity(READ_BUF),
            from_app: BytesMut::with_capacity(READ_BUF),
            to_app: BytesMut::new(),
            to_client: BytesMut::new(),
            preface: true,
            handshake: true,
            replay: Some(BytesMut::new()),
            goaway_held: false,
            client_hpack: wire::Hpack::new(DEFAULT_TABLE as usize),
            app_hpack: wire::Hpack::new(DEFAULT_TABLE as usize),
            client_block: None,
            app_block: None,
            translate: None,
            to_app_translate: None,
            app_table: DEFAULT_TABLE,
            app_frame: DEFAULT_FRAME,
            unsent: None,
            app_goaway_code: wire::NO_ERROR,
            client_table: DEFAULT_TABLE,
            client_tables_unacked: std::collections::VecDeque::new(),
            client_table_acked: DEFAULT_TABLE,
            client_update_due: None,
            client_reset: std::collections::VecDeque::new(),
            client_frame: DEFAULT_FRAME,
            client_frame_max: DEFAULT_FRAME,
            app_settings: false,
            queue: Arc::new(EndQueue::default()),
            ending: Vec::new(),
            stalled: Vec::new(),
            barrier: Barrier::default(),
            life,
            told_empty: true,
            resets: PrematureResets::new(l.max_pending_accept_reset_streams),
            calmed: false,
            closing: false,
            closing_by: None,
            forwarded: wire::literal_block(&[("x-forwarded-for", &peer)]),
            scratch: Vec::new(),
            buckets: Buckets::new(l.flood, &inner.metrics, Instant::now()),
            throttled_until: None,
            all: Vec::new(),
            locals: HashMap::new(),
            conn_window: i64::from(DEFAULT_WINDOW),
            cleared: 0,
            debt: 0,
            probe_out: false,
            app_sweep_at: None,
            client_window: i64::from(DEFAULT_WINDOW),
            alone: false,
        };
        if alone {
            relay.alone();
        }
        relay
    }

    /// Serves the client without an application connection (the application
    /// cannot be reached, or does not answer HTTP/2): the guard's own
    /// SETTINGS (its limits, extended CONNECT) are the server's preface, and
    /// the guard acks the client's SETTINGS and PINGs. WebSockets over
    /// extended CONNECT still reach the application over HTTP/1.1; every
    /// other stream gets a retryable answer ([`Relay::unavailable`]). The
    /// lifecycle (max age, drain, idle) is the relayed connection's.
    fn alone(&mut self) {
        self.alone = true;
        self.handshake = false;
        self.replay = None;
        self.app_settings(0, &[]);
    }

    /// Relays until the connection is over. Returns every byte the client
    /// sent when the application turned out not to speak HTTP/2 before
    /// anything reached the client (the caller then serves it otherwise).
    async fn run(
        &mut self,
        client: &mut Prefixed<TcpStream>,
        mut app: Option<TcpStream>,
    ) -> Option<BytesMut> {
        let inner = self.inner;
        let terminate = inner.terminate.cancelled();
        let goaway = inner.goaway.cancelled();
        let queue = self.queue.clone();
        let ended = queue.ready();
        let timer = tokio::time::sleep_until(Instant::now());
        tokio::pin!(terminate, goaway, ended, timer);
        let mut timer_at: Option<Instant> = None;
        // Which side is read first; alternated so neither starves the other.
        let mut client_first = true;
        let info = self.info;
        tracing::debug!(peer = %info.peer, conn = info.id, "guard: HTTP/2 connection (frame relay)");
        loop {
            let now = Instant::now();
            self.count_changed(now);
            if self.life.wants_quiet()
                && self.streams.is_empty()
                && self.locals.is_empty()
                && self.to_client.is_empty()
            {
                self.step(Input::Quiet, now);
            }
            if self.closing && self.to_client.is_empty() {
                break;
            }
            let next = self.next_deadline();
            if next != timer_at {
                timer_at = next;
                if let Some(at) = next {
                    timer.as_mut().reset(at);
                }
            }
            client_first = !client_first;
            tracing::trace!(
                conn = info.id,
                to_app = self.to_app.len(),
                to_client = self.to_client.len(),
                cleared = self.cleared,
                conn_window = self.conn_window,
                debt = self.debt,
                from_client = self.from_client.len(),
                from_app = self.from_app.len(),
                "guard: relay turn"
            );
            let event = tokio::select! {
                biased;
                _ = &mut timer, if timer_at.is_some() => { timer_at = None; Event::Timer }
                _ = &mut terminate, if self.life.watches_terminate() => Event::Input(Input::Terminate),
                _ = &mut goaway, if self.life.watches_goaway() => Event::Input(Input::GoawayAll),
                _ = &mut ended => {
                    ended.set(queue.ready());
                    Event::Ended
                }
                e = poll_fn(|cx| self.poll_io(cx, client, &mut app, client_first)) => e,
            };
            let now = Instant::now();
            let result = match event {
                Event::FromClient => self.client_frames(now),
                Event::FromApp => self.app_frames(now),
                Event::ClientGone => break,
                Event::Flushed | Event::Local => Ok(()),
                Event::AppGone if self.handshake => return self.replay.take(),
                Event::AppGone => {
                    self.app_lost();
                    Ok(())
                }
                Event::Timer => self.timers(now),
                Event::Ended => {
                    for id in self.queue.take() {
                        self.begin_end(id, now);
                    }
                    Ok(())
                }
                Event::Input(input) => {
                    self.step(input, now);
                    Ok(())
                }
            };
            if matches!(result, Err(Failure::NotHttp2)) {
                return self.replay.take();
            }
            if let Err(e) = result {
                tracing::debug!(peer = %info.peer, conn = info.id, error = %e, "guard: HTTP/2 connection failed");
                self.fail(e);
            }
            if self.resets.is_tripped() && !self.calmed {
                tracing::warn!(peer = %info.peer, conn = info.id, premature = self.resets.count(),
                    "guard: most streams on this connection were reset before they were answered (rapid reset); GOAWAY(ENHANCE_YOUR_CALM)");
                inner.metrics.guard_limited(Limit::rapid_reset).inc();
                self.calmed = true;
                self.fail(Failure::Calm);
            }
            let now = Instant::now();
            if [self.life.deadlines().close_by, self.closing_by]
                .into_iter()
                .flatten()
                .any(|at| now >= at)
            {
                tracing::debug!(peer = %info.peer, conn = info.id, "guard: closing deadline reached; dropping the connection");
                break;
            }
        }
        // Whatever is still open is dropped with the connection; only what
        // the client's window allows is written.
        self.clear_gate();
        self.to_client.truncate(self.cleared);
        let _ = flush(client, &mut self.to_client).await;
        None
    }

    /// Writes what is queued, then reads the side(s) there is room for.
    fn poll_io(
        &mut self,
        cx: &mut Context<'_>,
        client: &mut Prefixed<TcpStream>,
        app: &mut Option<TcpStream>,
        client_first: bool,
    ) -> Poll<Event> {
        match app.as_mut() {
            Some(app) => {
                if write_some(cx, app, &mut self.to_app).is_err() {
                    return Poll::Ready(Event::AppGone);
                }
            }
            None => self.to_app.clear(),
        }
        let had = !self.to_client.is_empty();
        self.clear_gate();
        if write_cleared(cx, client, &mut self.to_client, &mut self.cleared).is_err() {
            return Poll::Ready(Event::ClientGone);
        }
        if had && self.to_client.is_empty() && (self.closing || self.life.wants_quiet()) {
            // What the loop waits for before it closes.
            return Poll::Ready(Event::Flushed);
        }
        // Which sides to read, from the buffers as the writes left them: this
        // poll repeats (on each socket wake) until an event, so wants fixed
        // before it would never see a full buffer drain, and with both sides
        // unread the connection would hang.
        let (want_client, want_app) = self.wants();
        // Local streams move first, but never instead of the reads: a busy
        // WebSocket must not starve the relayed streams beside it.
        let moved = !self.locals.is_empty() && self.poll_locals(cx);
        for client_turn in [client_first, !client_first] {
            if client_turn && want_client {
                let before = self.from_client.len();
                match read_some(cx, client, &mut self.from_client) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                        return Poll::Ready(Event::ClientGone)
                    }
                    Poll::Ready(Ok(_)) => {
                        if let Some(r) = self.replay.as_mut() {
                            r.extend_from_slice(&self.from_client[before..]);
                        }
                        return Poll::Ready(Event::FromClient);
                    }
                    Poll::Pending => {}
                }
            }
            if let (false, true, Some(app)) = (client_turn, want_app, app.as_mut()) {
                match read_some(cx, app, &mut self.from_app) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(Event::AppGone),
                    Poll::Ready(Ok(_)) => return Poll::Ready(Event::FromApp),
                    Poll::Pending => {}
                }
            }
        }
        if moved {
            return Poll::Ready(Event::Local);
        }
        Poll::Pending
    }

    /// Whether to read the client and the application now. A side is not
    /// read while what waits for the other side passes the high-water mark.
    /// The guard's own answers to the client (refusals, window returns) wait
    /// in `to_client` too: a client that does not read is not read either;
    /// but while the client's window holds `to_client` back, the client is
    /// read further, for its WINDOW_UPDATEs.
    fn wants(&self) -> (bool, bool) {
        let client_room = if self.cleared < self.to_client.len() {
            BLOCKED_HIGH_WATER
        } else {
            HIGH_WATER
        };
        (
            !self.closing
                && self.to_app.len() < HIGH_WATER
                && self.to_client.len() < client_room
                && self.throttled_until.is_none()
                && !(self.handshake && self.from_client.len() >= REPLAY_MAX),
            !self.closing && self.to_client.len() < HIGH_WATER,
        )
    }

    // ---- client → application -------------------------------------------

    fn client_frames(&mut self, now: Instant) -> Result<(), Failure> {
        // Offsets into `to_app` from before its last write are stale.
        self.unsent = None;
        if self.preface {
            let n = self.from_client.len().min(H2_PREFACE.len());
            if self.from_client[..n] != H2_PREFACE[..n] {
                return Err(Failure::Protocol(
                    "the client did not start with the HTTP/2 preface",
                ));
            }
            if n < H2_PREFACE.len() {
                return Ok(());
            }
            self.to_app.extend_from_slice(H2_PREFACE);
            self.preface = false;
            self.from_client.advance(H2_PREFACE.len());
        }
        if self.handshake {
            // Held until the application shows it speaks HTTP/2.
            return Ok(());
        }
        let buf = std::mem::take(&mut self.from_client);
        let result = self.each_frame(&buf, MAX_FRAME as usize, |relay, h, frame| {
            // PING, SETTINGS and RST_STREAM cost the application work for
            // free: past their rate the relay stops reading the client
            // until the next token is due (see `super::flood`).
            if let Err(until) = relay.buckets.take(h.kind, now) {
                relay.throttled_until = Some(until);
                return Ok(false);
            }
            relay.client_frame(h, frame, now).map(|()| true)
        });
        self.from_client = keep_rest(buf, result?);
        Ok(())
    }

    /// Calls `f` on each whole frame of `buf`; returns where the first
    /// incomplete frame starts. A frame larger than `max` is the sender's
    /// FRAME_SIZE_ERROR (for the application's frames, see `app_frames`).
    fn each_frame(
        &mut self,
        buf: &[u8],
        max: usize,
        mut f: impl FnMut(&mut Self, Head, &[u8]) -> Result<bool, Failure>,
    ) -> Result<usize, Failure> {
        let mut at = 0;
        while let Some(h) = wire::head(&buf[at..]) {
            if h.len > max {
                return Err(Failure::FrameSize(
                    "a frame larger than SETTINGS_MAX_FRAME_SIZE",
                ));
            }
            let end = at + wire::FRAME_HEADER + h.len;
            if buf.len() < end {
                break;
            }
            if !f(self, h, &buf[at..end])? {
                break;
            }
            at = end;
        }
        Ok(at)
    }

    fn client_frame(&mut self, h: Head, frame: &[u8], now: Instant) -> Result<(), Failure> {
        let payload = &frame[wire::FRAME_HEADER..];
        if self.client_block.is_some() && h.kind != wire::CONTINUATION {
            return Err(Failure::Protocol(
                "a header block was interrupted by another frame",
            ));
        }
        match h.kind {
            wire::HEADERS => {
                let fragment = wire::content(h, payload)?;
                self.client_fragment(Block::start(h), h, frame, fragment, now)
            }
            wire::CONTINUATION => {
                let block = self
                    .client_block
                    .take()
                    .filter(|b| b.id == h.id)
                    .ok_or(Failure::Protocol("CONTINUATION without its HEADERS"))?;
                self.client_fragment(block, h, frame, payload, now)
            }
            wire::DATA if self.locals.contains_key(&h.id) => {
                let data = wire::content(h, payload)?;
                // Padding is given back at once, the data as the task takes it.
                let padding = (h.len - data.len()) as u32;
                wire::window_update(&mut self.to_client, h.id, padding);
                wire::window_update(&mut self.to_client, 0, padding);
                if let Some(l) = self.locals.get_mut(&h.id) {
                    l.to_task.extend_from_slice(data);
                    l.client_eof |= h.flags & wire::END_STREAM != 0;
                }
                Ok(())
            }
            wire::DATA => {
                match self.streams.get_mut(&h.id) {
                    Some(s) => {
                        self.to_app.extend_from_slice(frame);
                        if h.flags & wire::END_STREAM != 0 {
                            s.req_done = true;
                            self.maybe_done(h.id);
                        }
                    }
                    // A stream the guard ended or refused: the application
                    // never sees this data, so the connection window it took
                    // is given back here.
                    None if h.id <= self.last_id => {
                        wire::window_update(&mut self.to_client, 0, h.len as u32)
                    }
                    // Alone, the guard is the server that judges it.
                    None if self.alone => {
                        return Err(Failure::Protocol("DATA on an idle stream"));
                    }
                    None => self.to_app.extend_from_slice(frame),
                }
                Ok(())
            }
            wire::RST_STREAM if self.locals.remove(&h.id).is_some() => Ok(()),
            wire::RST_STREAM => {
                if let Some(s) = self.streams.remove(&h.id) {
                    if self.client_reset.len() >= 64 {
                        self.client_reset.pop_front();
                    }
                    self.client_reset.push_back(h.id);
                    match self.unsent.take() {
                        // Reset before its request left: the application
                        // never gets it (as the h2 path never forwards a
                        // stream the client reset before it was taken).
                        Some((id, start, end, indexed))
                            if id == h.id && end == self.to_app.len() =>
                        {
                            self.to_app.truncate(start);
                            self.dropped_block(&wire::Fields {
                                indexed,
                                ..wire::Fields::default()
                            });
                        }
                        _ => self.to_app.extend_from_slice(frame),
                    }
                    if !s.answered()
                        && now.saturating_duration_since(s.started) < PREMATURE_LIFETIME
                    {
                        self.resets.premature();
                    }
                    self.finish(s, Outcome::ClientGone);
                }
                Ok(())
            }
            wire::SETTINGS | wire::PING | wire::GOAWAY if h.id != 0 => Err(Failure::Protocol(
                "a connection-level frame (SETTINGS, PING or GOAWAY) on a stream",
            )),
            wire::SETTINGS if !settings_size_ok(h) => Err(Failure::FrameSize("SETTINGS")),
            wire::PING if h.len != 8 => Err(Failure::FrameSize("PING")),
            wire::SETTINGS if h.flags & wire::ACK == 0 => {
                let mut payload = payload.to_vec();
                let mut table = None;
                wire::rewrite_settings(&mut payload, |id, v| match id {
                    wire::HEADER_TABLE_SIZE => {
                        // The application's encoder may use up to this.
                        table = Some(v);
                        self.client_table = v;
                        self.app_hpack.allow(v);
                        v
                    }
                    wire::MAX_FRAME_SIZE => {
                        let v = v.min(MAX_FRAME);
                        self.client_frame = v as usize;
                        self.client_frame_max = self.client_frame_max.max(v as usize);
                        v
                    }
                    wire::INITIAL_WINDOW_SIZE => {
                        let delta = i64::from(v) - self.client_window;
                        self.client_window = i64::from(v);
                        for l in self.locals.values_mut() {
                            l.window += delta;
                        }
                        for s in self.streams.values_mut() {
                            s.window += delta;
                        }
                        v
                    }
                    _ => v,
                });
                wire::put(&mut self.to_app, wire::SETTINGS, h.flags, 0, &payload);
                if self.client_tables_unacked.len() < 64 {
                    self.client_tables_unacked.push_back(table);
                }
                if self.alone {
                    self.settings_acked();
                }
                Ok(())
            }
            wire::PING if self.alone && h.flags & wire::ACK == 0 => {
                let mut opaque = [0u8; 8];
                opaque.copy_from_slice(payload);
                wire::ping(&mut self.to_client, true, opaque);
                Ok(())
            }
            wire::PING if h.flags & wire::ACK != 0 && payload == GOAWAY_PING && self.probe_out => {
                self.probe_out = false;
                self.step(Input::Acked, now);
                Ok(())
            }
            wire::WINDOW_UPDATE if h.id == 0 => {
                let credit = window_increment(payload)?;
                self.client_credit(credit)
            }
            wire::WINDOW_UPDATE if self.locals.contains_key(&h.id) => {
                let credit = window_increment(payload)?;
                if let Some(l) = self.locals.get_mut(&h.id) {
                    l.window += i64::from(credit);
                }
                Ok(())
            }
            wire::WINDOW_UPDATE if h.id != 0 => {
                let credit = window_increment(payload)?;
                if let Some(s) = self.streams.get_mut(&h.id) {
                    s.window += i64::from(credit);
                    if s.window > 0 {
                        s.shut_since = None;
                    }
                    let ending = s.ending.is_some();
                    self.to_app.extend_from_slice(frame);
                    if ending {
                        // An end of the guard's own may have waited for it.
                        self.advance(h.id, now);
                    }
                }
                Ok(())
            }
            _ => {
                self.to_app.extend_from_slice(frame);
                Ok(())
            }
        }
    }

    /// One fragment of a client header block; the block is read, and its
    /// frames go on, once it is whole.
    fn client_fragment(
        &mut self,
        mut block: Block,
        h: Head,
        frame: &[u8],
        fragment: &[u8],
        now: Instant,
    ) -> Result<(), Failure> {
        let limit = self.inner.config.limits.max_header_list_size as usize;
        if h.flags & wire::END_HEADERS == 0 {
            block.gather(frame, fragment);
            // A block this large, or in this many pieces, is a flood: h2
            // stacks buffer it whole before they can refuse it.
            if block.fragment.len() > 2 * limit + DEFAULT_FRAME
                || block.continuations > MAX_CONTINUATIONS
            {
                return Err(Failure::Calm);
            }
            self.client_block = Some(block);
            return Ok(());
        }
        // Whole: decode it (the application's table follows the client's).
        let mut encoded = std::mem::take(&mut self.scratch);
        block.whole_into(fragment, &mut encoded);
        // Every field is kept: a re-encoded block, and a WebSocket the
        // guard serves itself, need them all.
        let mut all = std::mem::take(&mut self.all);
        all.clear();
        let fields = wire::decode(
            &mut self.client_hpack,
            &mut encoded,
            limit * BOMB_FACTOR,
            Some(&mut all),
        );
        self.scratch = encoded;
        let result = self.client_block_whole(block, frame, fields, &all, limit, now);
        self.all = all;
        result
    }

    /// A whole client block, decoded: forwarded, answered, or served here.
    fn client_block_whole(
        &mut self,
        block: Block,
        frame: &[u8],
        fields: Result<wire::Fields, wire::BlockError>,
        all_fields: &[wire::Field],
        limit: usize,
        now: Instant,
    ) -> Result<(), Failure> {
        let all = self.to_app_translate.is_some().then_some(all_fields);
        let fields = fields.map_err(|e| match e {
            wire::BlockError::Compression => Failure::Compression,
            wire::BlockError::TooLarge => Failure::Calm,
        })?;
        let id = block.id;
        let fresh = id > self.last_id && id % 2 == 1;
        if self.alone && !fresh && id > self.last_id {
            return Err(Failure::Protocol("a stream id the client may not open"));
        }
        if !fresh {
            // Trailers (or a bad block, which the application judges).
            match self.streams.get_mut(&id) {
                Some(s) => {
                    if block.end_stream {
                        s.req_done = true;
                    }
                    self.forward_block(&block, frame, all, false);
                    self.maybe_done(id);
                }
                None if id <= self.last_id => {
                    if let Some(l) = self.locals.get_mut(&id) {
                        l.client_eof |= block.end_stream;
                    }
                    self.dropped_block(&fields)
                }
                None => self.forward_block(&block, frame, all, false),
            }
            return Ok(());
        }
        self.last_id = id;
        self.step(Input::StreamAccepted, now);
        if self.told_empty {
            // Busy again (the idle timer stops), even if this stream ends
            // in this same batch: the next turn reports "none" afresh.
            self.told_empty = false;
            self.step(Input::Streams(1), now);
        }
        if let Some(refusal) = self.admission(&fields, limit) {
            // Never forwarded: a refused stream is one the application
            // never saw, so the client may retry it anywhere.
            self.dropped_block(&fields);
            self.refuse(id, block.end_stream, refusal);
            return Ok(());
        }
        if fields.method.as_deref() == Some("CONNECT")
            && fields
                .protocol
                .as_deref()
                .is_some_and(|p| p.eq_ignore_ascii_case("websocket"))
        {
            // RFC 8441: served here over HTTP/1.1 to the application, as
            // the h2 path does (see `super::connect`).
            self.dropped_block(&fields);
            self.websocket(id, block.end_stream, all_fields);
            return Ok(());
        }
        if self.alone {
            if self.admit(id, block.end_stream, &fields, now) {
                self.unavailable(id);
            }
            return Ok(());
        }
        let start = self.to_app.len();
        self.forward_block(&block, frame, all, true);
        if self.admit(id, block.end_stream, &fields, now) {
            self.unsent = Some((id, start, self.to_app.len(), fields.indexed));
        } else {
            // Refused by the registry: take the request back.
            self.to_app.truncate(start);
            self.dropped_block(&fields);
        }
        Ok(())
    }

    /// Passes a whole client block on: as it came (with the client's
    /// address added to a request's), or re-encoded while the application's
    /// table is the guard's own (see the module doc).
    fn forward_block(
        &mut self,
        block: &Block,
        last: &[u8],
        all: Option<&[wire::Field]>,
        request: bool,
    ) {
        match all {
            Some(all) => {
                let clear = (self.to_app_translate == Some(true)).then_some(self.app_table);
                self.to_app_translate = Some(false);
                let mut encoded = literals(clear, all);
                if request {
                    encoded.extend_from_slice(&self.forwarded);
                }
                put_block(
                    &mut self.to_app,
                    block.id,
                    block.end_stream,
                    &encoded,
                    self.app_frame,
                );
            }
            None => {
                self.to_app.extend_from_slice(&block.frames);
                let at = self.to_app.len();
                self.to_app.extend_from_slice(last);
                if request {
                    // The client's address, in a CONTINUATION of its own:
                    // the last frame's END_HEADERS moves to it.
                    self.to_app[at + 4] &= !wire::END_HEADERS;
                    wire::put(
                        &mut self.to_app,
                        wire::CONTINUATION,
                        wire::END_HEADERS,
                        block.id,
                        &self.forwarded,
                    );
                }
            }
        }
    }

    /// A client block the application does not get: if it changed the
    /// client's table, the application's no longer follows it, and the
    /// guard re-encodes from now on.
    fn dropped_block(&mut self, fields: &wire::Fields) {
        if fields.indexed && self.to_app_translate.is_none() {
            tracing::debug!(conn = self.info.id, "guard: a client header block the application did not get changed its HPACK table; re-encoding the client's blocks from now on");
            self.to_app_translate = Some(true);
        }
    }

    /// Why a new stream is not admitted, if it is not.
    fn admission(&self, fields: &wire::Fields, limit: usize) -> Option<Refusal> {
        let l = &self.inner.config.limits;
        if fields.list_size > limit {
            return Some(Refusal::TooLarge);
        }
        let beyond = |last: Option<u32>| last.is_some_and(|last| self.last_id > last);
        if self.life.refuses_streams() || beyond(self.sent_last) || beyond(self.app_last) {
            return Some(Refusal::Reset);
        }
        (self.streams.len() >= l.max_concurrent_streams as usize).then_some(Refusal::Reset)
    }

    /// Registers and opens a stream (true), or answers it (false).
    fn admit(&mut self, id: u32, end_stream: bool, fields: &wire::Fields, now: Instant) -> bool {
        let inner = self.inner;
        let ct = fields.content_type.as_deref().unwrap_or("");
        let kind = request_kind_of(ct);
        let grpc = kind != Kind::Opaque;
        self.resets.accepted();
        let reg = match inner
            .registry
            .try_register_relayed(self.info.id, grpc, &self.queue, id)
        {
            Ok(r) => r,
            Err(Refused::Terminating) => {
                self.refuse(id, end_stream, Refusal::Draining(kind));
                return false;
            }
            Err(Refused::Full) => {
                self.refuse(id, end_stream, Refusal::Reset);
                return false;
            }
        };
        let protocol = if grpc {
            StreamProtocol::grpc
        } else {
            StreamProtocol::http
        };
        let sig = inner
            .signals
            .start(grpc, fields.path.as_deref().unwrap_or("/"), protocol);
        self.streams.insert(
            id,
            Stream {
                reg,
                kind,
                bounds: None,
                req_done: end_stream,
                resp_done: false,
                started: now,
                messages: 0,
                last_data: None,
                ending: None,
                sig,
                window: self.client_window,
                shut_since: None,
            },
        );
        true
    }

    /// Alone, an admitted stream's answer: the application could not be
    /// reached, so gRPC gets a trailers-only UNAVAILABLE (retryable), and
    /// HTTP a 502, as Envoy answers a failed upstream connect.
    fn unavailable(&mut self, id: u32) {
        let Some(s) = self.streams.get(&id) else {
            return;
        };
        let block = trailers_only(s.kind, grpc::UPSTREAM_UNAVAILABLE_MESSAGE)
            .unwrap_or_else(|| wire::literal_block(&[(":status", "502")]));
        self.own_block(id, &block, true);
        if let Some(s) = self.streams.get_mut(&id) {
            s.resp_done = true;
        }
        self.end_here(id, Outcome::UpstreamFailed);
    }

    /// A stream the application never sees, answered here.
    fn refuse(&mut self, id: u32, end_stream: bool, refusal: Refusal) {
        match refusal {
            Refusal::TooLarge => {
                let block = wire::literal_block(&[(":status", "431")]);
                self.own_block(id, &block, true);
            }
            Refusal::Reset => wire::rst(&mut self.to_client, id, wire::REFUSED_STREAM),
            Refusal::Draining(kind) => match trailers_only(kind, grpc::REFUSED_MESSAGE) {
                Some(block) => self.own_block(id, &block, true),
                None => wire::rst(&mut self.to_client, id, wire::REFUSED_STREAM),
            },
        }
        if !end_stream && !matches!(refusal, Refusal::Reset) {
            // Answered in full before the request's end: stop it, no error.
            wire::rst(&mut self.to_client, id, wire::NO_ERROR);
        }
    }

    /// The client's connection WINDOW_UPDATE: the guard's own DATA sent
    /// since the last one is withheld (the application's view of the window
    /// never counted it), the rest goes to the application.
    ///
    /// The guard owns the client's connection window: every DATA frame to
    /// the client, the application's and its own, is charged to it as it is
    /// cleared for writing ([`Relay::clear_gate`]), so nothing ever exceeds
    /// it. The application's view is the real window plus the guard's
    /// unrepaid DATA (`debt`): what it sends beyond the real window waits in
    /// `to_client` (bounded by its high-water mark) until credit comes. The
    /// guard keeps nothing back beforehand, so with nothing of its own to
    /// send it passes every byte of credit on, and a client that refills its
    /// window only once it ran dry still gets all the data it was promised.
    fn client_credit(&mut self, credit: u32) -> Result<(), Failure> {
        let credit = i64::from(credit);
        if credit == 0 {
            return Err(Failure::Protocol("a connection WINDOW_UPDATE of 0"));
        }
        self.conn_window += credit;
        if self.conn_window > MAX_WINDOW {
            return Err(Failure::FlowControl);
        }
        let repaid = self.debt.min(credit);
        self.debt -= repaid;
        wire::window_update(&mut self.to_app, 0, (credit - repaid) as u32);
        Ok(())
    }

    /// Charges the DATA frames waiting in `to_client`, from `cleared` on, to
    /// the client's connection window as far as it goes. A frame larger than
    /// what is left is split (its padding dropped and given back to the
    /// application), so the window is always used up: a client may wait for
    /// it to run dry before it sends a WINDOW_UPDATE.
    fn clear_gate(&mut self) {
        while let Some(h) = wire::head(&self.to_client[self.cleared..]) {
            let len = h.len as i64;
            if h.kind != wire::DATA || len <= self.conn_window {
                if h.kind == wire::DATA {
                    self.conn_window -= len;
                }
                self.cleared += wire::FRAME_HEADER + h.len;
                continue;
            }
            if self.conn_window <= 0 {
                return;
            }
            self.split_data(h, self.conn_window as usize);
        }
    }

    /// Splits the DATA frame at `cleared` so its first piece takes at most
    /// `room` bytes of window; padding goes (window given back to the app).
    fn split_data(&mut self, h: Head, room: usize) {
        let at = self.cleared;
        let rest = self.to_client.split_off(at);
        let frame_end = wire::FRAME_HEADER + h.len;
        // Frames in `to_client` were checked when they came in.
        let data = wire::content(h, &rest[wire::FRAME_HEADER..frame_end]).unwrap_or(&[]);
        let padding = (h.len - data.len()) as u32;
        if padding > 0 {
            wire::window_update(&mut self.to_app, 0, padding);
            wire::window_update(&mut self.to_app, h.id, padding);
            if let Some(s) = self.streams.get_mut(&h.id) {
                s.window += i64::from(padding);
            }
        }
        let flags = h.flags & wire::END_STREAM;
        let first = room.min(data.len());
        if first == data.len() {
            wire::put(&mut self.to_client, wire::DATA, flags, h.id, data);
        } else {
            wire::put(&mut self.to_client, wire::DATA, 0, h.id, &data[..first]);
            wire::put(&mut self.to_client, wire::DATA, flags, h.id, &data[first..]);
        }
        self.to_client.extend_from_slice(&rest[frame_end..]);
    }

    /// DATA of the guard's own to the client, in frames the client takes;
    /// the application's view of the connection window does not know of it.
    fn own_data(&mut self, id: u32, data: &[u8], end_stream: bool) {
        put_data(&mut self.to_client, id, data, end_stream, self.client_frame);
        self.debt += data.len() as i64;
    }

    /// Starts the task that serves a WebSocket over HTTP/2 (RFC 8441).
    fn websocket(&mut self, id: u32, end_stream: bool, fields: &[wire::Field]) {
        let inner = self.inner;
        let reg = match inner.registry.try_register(self.info.id, false) {
            Ok(r) => r,
            Err(_) => return self.refuse(id, end_stream, Refusal::Reset),
        };
        let Some(head) = connect_head(fields) else {
            wire::rst(&mut self.to_client, id, wire::PROTOCOL_ERROR);
            return;
        };
        let (task_io, io) = tokio::io::duplex(4 * LOCAL_CHUNK);
        let (tx, rx) = tokio::sync::oneshot::channel();
        inner.tasks.spawn(super::connect::proxy(
            inner.clone(),
            reg,
            head,
            task_io,
            tx,
            self.info,
        ));
        self.locals.insert(
            id,
            Local {
                io,
                answer: Some(rx),
                answered: false,
                window: self.client_window,
                to_task: BytesMut::new(),
                client_eof: end_stream,
                shut: false,
                task_eof: false,
            },
        );
    }

    /// Moves the local streams on: their answers, the client's data to
    /// their tasks, and theirs to the client within its windows. True if
    /// anything moved.
    fn poll_locals(&mut self, cx: &mut Context<'_>) -> bool {
        let Relay {
            locals,
            to_client,
            conn_window,
            debt,
            client_frame,
            client_update_due,
            ..
        } = self;
        let mut moved = false;
        let mut done = Vec::new();
        let mut chunk = [0u8; LOCAL_CHUNK];
        for (&id, l) in locals.iter_mut() {
            if let Some(rx) = l.answer.as_mut() {
                match Pin::new(rx).poll(cx) {
                    Poll::Ready(Ok((head, end))) => {
                        moved = true;
                        l.answer = None;
                        let mut block = Vec::new();
                        if let Some(size) = client_update_due.take() {
                            // See `own_block`.
                            wire::put_size_update(&mut block, size);
                        }
                        block.extend_from_slice(&head_block(&head));
                        put_block(to_client, id, end, &block, *client_frame);
                        if end {
                            if !l.client_eof {
                                wire::rst(to_client, id, wire::NO_ERROR);
                            }
                            done.push(id);
                            continue;
                        }
                        l.answered = true;
                    }
                    Poll::Ready(Err(_)) => {
                        wire::rst(to_client, id, wire::CANCEL);
                        done.push(id);
                        continue;
                    }
                    Poll::Pending => {}
                }
            }
            while !l.to_task.is_empty() {
                match Pin::new(&mut l.io).poll_write(cx, &l.to_task) {
                    Poll::Ready(Ok(n)) if n > 0 => {
                        l.to_task.advance(n);
                        wire::window_update(to_client, id, n as u32);
                        wire::window_update(to_client, 0, n as u32);
                        moved = true;
                    }
                    // The task is gone: nothing takes the data any more,
                    // and the connection window it took is given back.
                    Poll::Ready(_) => {
                        wire::window_update(to_client, 0, l.to_task.len() as u32);
                        l.to_task.clear();
                    }
                    Poll::Pending => break,
                }
            }
            if l.to_task.is_empty()
                && l.client_eof
                && !l.shut
                && Pin::new(&mut l.io).poll_shutdown(cx).is_ready()
            {
                l.shut = true;
                moved = true;
            }
            // The connection window is charged when `to_client` is written
            // (`clear_gate`); what waits for it is bounded by the high-water mark.
            while l.answered
                && !l.task_eof
                && l.window > 0
                && *conn_window > 0
                && to_client.len() < HIGH_WATER
            {
                let max = (l.window.min(*conn_window) as usize)
                    .min(*client_frame)
                    .min(LOCAL_CHUNK);
                let mut rb = ReadBuf::new(&mut chunk[..max]);
                match Pin::new(&mut l.io).poll_read(cx, &mut rb) {
                    Poll::Ready(Ok(())) if rb.filled().is_empty() => {
                        wire::put(to_client, wire::DATA, wire::END_STREAM, id, &[]);
                        l.task_eof = true;
                        moved = true;
                    }
                    Poll::Ready(Ok(())) => {
                        let n = rb.filled().len();
                        wire::put(to_client, wire::DATA, 0, id, rb.filled());
                        l.window -= n as i64;
                        *debt += n as i64;
                        moved = true;
                    }
                    Poll::Ready(Err(_)) => {
                        wire::rst(to_client, id, wire::CANCEL);
                        l.task_eof = true;
                        l.client_eof = true;
                        moved = true;
                    }
                    Poll::Pending => break,
                }
            }
            if l.task_eof && l.client_eof {
                done.push(id);
            }
        }
        for id in done {
            locals.remove(&id);
        }
        moved
    }

    // ---- application → client -------------------------------------------

    fn app_frames(&mut self, now: Instant) -> Result<(), Failure> {
        let mut released = false;
        if self.handshake {
            match wire::head(&self.from_app) {
                Some(h) if h.kind == wire::SETTINGS && h.flags & wire::ACK == 0 => {
                    // It speaks HTTP/2: the client's frames held so far go
                    // on, after its SETTINGS (the server's preface comes first).
                    self.handshake = false;
                    self.replay = None;
                    released = true;
                }
                Some(_) => return Err(Failure::NotHttp2),
                None if self.from_app.len() >= wire::FRAME_HEADER => return Err(Failure::NotHttp2),
                None => return Ok(()),
            }
        }
        let buf = std::mem::take(&mut self.from_app);
        // Frames go on whole: one larger than the client ever allowed is the
        // application's error (its streams end retryably), not the client's.
        let max = self.client_frame_max;
        let result = self.each_frame(&buf, max, |relay, h, frame| {
            relay.app_frame(h, frame, now).map(|()| true)
        });
        let result = result.map_err(|e| match e {
            Failure::FrameSize(_) => Failure::AppProtocol,
            e => e,
        });
        self.from_app = keep_rest(buf, result?);
        if released && std::mem::take(&mut self.goaway_held) {
            self.first_goaway();
        }
        if released {
            self.client_frames(now)?;
        }
        Ok(())
    }

    fn app_frame(&mut self, h: Head, frame: &[u8], now: Instant) -> Result<(), Failure> {
        let payload = &frame[wire::FRAME_HEADER..];
        if self.app_block.is_some() && h.kind != wire::CONTINUATION {
            return Err(Failure::AppProtocol);
        }
        match h.kind {
            wire::HEADERS | wire::PUSH_PROMISE => {
                let mut fragment = wire::content(h, payload).map_err(|_| Failure::AppProtocol)?;
                let mut block = Block::start(h);
                if h.kind == wire::PUSH_PROMISE {
                    // The promised stream id, then the block.
                    let promised = fragment.get(..4).ok_or(Failure::AppProtocol)?;
                    block.promised = Some(
                        u32::from_be_bytes([promised[0], promised[1], promised[2], promised[3]])
                            & wire::MAX_STREAM_ID,
                    );
                    fragment = &fragment[4..];
                }
                self.app_fragment(block, h, frame, fragment, now)
            }
            wire::CONTINUATION => {
                let block = self
                    .app_block
                    .take()
                    .filter(|b| b.id == h.id)
                    .ok_or(Failure::AppProtocol)?;
                self.app_fragment(block, h, frame, payload, now)
            }
            wire::DATA => {
                let Some(s) = self.streams.get_mut(&h.id) else {
                    // Ended by the guard: give the application its window back.
                    wire::window_update(&mut self.to_app, 0, h.len as u32);
                    return Ok(());
                };
                self.to_client.extend_from_slice(frame);
                let data = wire::content(h, payload).map_err(|_| Failure::AppProtocol)?;
                if !data.is_empty() {
                    s.last_data = Some(now);
                }
                s.window -= h.len as i64;
                if s.window <= 0 && s.shut_since.is_none() && h.len > 0 {
                    s.shut_since = Some(now);
                    self.stalled.push(h.id);
                }
                if let Some(b) = s.bounds.as_mut() {
                    if b.endable() && !data.is_empty() {
                        s.messages += b.consume(data);
                        if s.messages >= 2 {
                            s.reg.ctl.set_long_lived();
                        }
                        if let Some(sig) = s.sig.as_mut() {
                            sig.messages(s.messages);
                        }
                    }
                }
                if h.flags & wire::END_STREAM != 0 {
                    s.resp_done = true;
                    s.ending = None;
                    self.maybe_done(h.id);
                } else if s.ending.is_some() {
                    self.data_while_ending(h.id, now);
                }
                Ok(())
            }
            wire::SETTINGS | wire::PING | wire::GOAWAY if h.id != 0 => Err(Failure::AppProtocol),
            wire::SETTINGS if !settings_size_ok(h) => Err(Failure::AppProtocol),
            wire::PING if h.len != 8 => Err(Failure::AppProtocol),
            wire::GOAWAY if h.len < 8 => Err(Failure::AppProtocol),
            wire::RST_STREAM => {
                if let Some(mut s) = self.streams.remove(&h.id) {
                    self.to_client.extend_from_slice(frame);
                    if let (Some(sig), Ok(code)) = (s.sig.as_mut(), <[u8; 4]>::try_from(payload)) {
                        sig.reset(h2::Reason::from(u32::from_be_bytes(code)));
                    }
                    self.finish(s, Outcome::UpstreamFailed);
                }
                Ok(())
            }
            wire::SETTINGS if h.flags & wire::ACK == 0 => {
                self.app_settings(h.flags, payload);
                Ok(())
            }
            wire::SETTINGS => {
                self.settings_acked();
                Ok(())
            }
            wire::PING if h.flags & wire::ACK != 0 && payload.starts_with(&BARRIER_PING) => {
                let seq = u64::from(u32::from_be_bytes([
                    payload[4], payload[5], payload[6], payload[7],
                ]));
                self.barrier.acked = self.barrier.acked.max(seq);
                if self.barrier.wanted > self.barrier.sent
                    && self.barrier.acked >= self.barrier.sent
                {
                    self.send_barrier();
                }
                self.check_endings(now);
                Ok(())
            }
            wire::GOAWAY => {
                let last = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                    & wire::MAX_STREAM_ID;
                let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                self.app_goaway(last, code, now);
                Ok(())
            }
            wire::WINDOW_UPDATE if h.id != 0 && !self.streams.contains_key(&h.id) => Ok(()),
            _ => {
                self.to_client.extend_from_slice(frame);
                Ok(())
            }
        }
    }

    /// The application's SETTINGS (or, alone, the guard's own: none), on to
    /// the client lowered to the guard's limits; the first also gets the
    /// guard's limits where the application set none, and extended CONNECT
    /// (the guard serves WebSockets over HTTP/2 itself).
    fn app_settings(&mut self, flags: u8, payload: &[u8]) {
        let l = self.inner.config.limits;
        let mut payload = payload.to_vec();
        let (mut streams_seen, mut list_seen, mut connect_seen) = (false, false, false);
        wire::rewrite_settings(&mut payload, |id, v| match id {
            wire::HEADER_TABLE_SIZE => {
                self.app_table = v;
                self.client_hpack.allow(v);
                v
            }
            wire::MAX_CONCURRENT_STREAMS => {
                streams_seen = true;
                v.min(l.max_concurrent_streams)
            }
            wire::MAX_HEADER_LIST_SIZE => {
                list_seen = true;
                v.min(l.max_header_list_size)
            }
            // The guard serves WebSockets over HTTP/2 itself.
            wire::ENABLE_CONNECT_PROTOCOL => {
                connect_seen = true;
                1
            }
            wire::MAX_FRAME_SIZE => {
                let v = v.min(MAX_FRAME);
                self.app_frame = v as usize;
                v
            }
            _ => v,
        });
        if !std::mem::replace(&mut self.app_settings, true) {
            // The guard's own limits, where the application set none.
            for (seen, id, v) in [
                (
                    streams_seen,
                    wire::MAX_CONCURRENT_STREAMS,
                    l.max_concurrent_streams,
                ),
                (
                    list_seen,
                    wire::MAX_HEADER_LIST_SIZE,
                    l.max_header_list_size,
                ),
                (connect_seen, wire::ENABLE_CONNECT_PROTOCOL, 1),
            ] {
                if !seen {
                    payload.extend_from_slice(&id.to_be_bytes());
                    payload.extend_from_slice(&v.to_be_bytes());
                }
            }
        }
        wire::put(&mut self.to_client, wire::SETTINGS, flags, 0, &payload);
    }

    /// The application acked a client SETTINGS (alone: the guard does). A
    /// lower table size now binds, and the next block must say so.
    fn settings_acked(&mut self) {
        if let Some(Some(v)) = self.client_tables_unacked.pop_front() {
            if v < self.client_table_acked {
                self.client_update_due = Some(self.client_update_due.map_or(v, |d| d.min(v)));
            }
            self.client_table_acked = v;
        }
        wire::put(&mut self.to_client, wire::SETTINGS, wire::ACK, 0, &[]);
    }

    fn app_fragment(
        &mut self,
        mut block: Block,
        h: Head,
        frame: &[u8],
        fragment: &[u8],
        now: Instant,
    ) -> Result<(), Failure> {
        if h.flags & wire::END_HEADERS == 0 {
            block.gather(frame, fragment);
            if block.fragment.len() > MAX_FRAME as usize * 4 {
                return Err(Failure::AppProtocol);
            }
            self.app_block = Some(block);
            return Ok(());
        }
        let mut encoded = std::mem::take(&mut self.scratch);
        block.whole_into(fragment, &mut encoded);
        // A push is never relayed: every client of the guard is Envoy or
        // another proxy, and a client that disabled push (Envoy does) treats
        // a PUSH_PROMISE as a connection error.
        let forward = block.promised.is_none()
            && (self.streams.contains_key(&block.id) || self.client_reset.contains(&block.id));
        let mut all = (forward && self.translate.is_some()).then(Vec::new);
        let decoded = wire::decode(
            &mut self.app_hpack,
            &mut encoded,
            APP_BLOCK_MAX,
            all.as_mut(),
        );
        self.scratch = encoded;
        let fields = decoded.map_err(|_| Failure::AppProtocol)?;
        if let Some(promised) = block.promised {
            tracing::debug!(
                conn = self.info.id,
                stream = block.id,
                promised,
                "guard: the application pushed; refusing the pushed stream"
            );
            wire::rst(&mut self.to_app, promised, wire::REFUSED_STREAM);
        }
        if !forward {
            // The client saw this stream end (or it is a push). Dropped; if
            // the block changed the application's table, the client's no
            // longer follows it.
            if fields.indexed && self.translate.is_none() {
                tracing::debug!(conn = self.info.id, stream = block.id, "guard: an application header block the client does not get changed its HPACK table; re-encoding its blocks from now on");
                self.translate = Some(true);
            }
            return Ok(());
        }
        match all {
            Some(all) => self.put_translated(&block, &all),
            None => {
                // It starts with the size update that may be due (the
                // application's encoder owes it too).
                self.client_update_due = None;
                self.to_client.extend_from_slice(&block.frames);
                self.to_client.extend_from_slice(frame);
            }
        }
        self.app_head(block.id, block.end_stream, &fields, now);
        Ok(())
    }

    /// An application header block on an open stream, after it went on.
    fn app_head(&mut self, id: u32, end_stream: bool, fields: &wire::Fields, now: Instant) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        match fields.status {
            // Informational (100-continue): the real head is still to come.
            Some(status) if status < 200 => {}
            Some(status) if !s.answered() => {
                let ct = fields.content_type.as_deref().unwrap_or("");
                s.bounds = Some(Boundaries::new(response_kind_of(s.kind, ct)));
                s.reg.ctl.set_answered();
                if let (Some(sig), Ok(code)) = (s.sig.as_mut(), StatusCode::from_u16(status)) {
                    sig.head_status(code, fields.grpc_status.as_deref());
                }
            }
            _ => {
                if let Some(sig) = s.sig.as_mut() {
                    sig.grpc_status(fields.grpc_status.as_deref());
                }
            }
        }
        if end_stream {
            s.resp_done = true;
            // The application's own end wins over the guard's.
            s.ending = None;
            self.maybe_done(id);
        } else if s.ending.is_some() {
            self.advance(id, now);
        }
    }

    /// A block re-encoded as literals (see the module doc), the first one
    /// after clearing the client's table.
    fn put_translated(&mut self, block: &Block, all: &[wire::Field]) {
        let clear = (self.translate == Some(true)).then_some(self.client_table);
        self.translate = Some(false);
        let encoded = literals(clear, all);
        self.own_block(block.id, &encoded, block.end_stream);
    }

    /// A header block the guard encoded (its own, or re-encoded) to the
    /// client, after the table size update that is due, if one is.
    fn own_block(&mut self, id: u32, block: &[u8], end_stream: bool) {
        match self.client_update_due.take() {
            None => put_block(
                &mut self.to_client,
                id,
                end_stream,
                block,
                self.client_frame,
            ),
            Some(size) => {
                let mut encoded = Vec::with_capacity(block.len() + 6);
                wire::put_size_update(&mut encoded, size);
                encoded.extend_from_slice(block);
                put_block(
                    &mut self.to_client,
                    id,
                    end_stream,
                    &encoded,
                    self.client_frame,
                );
            }
        }
    }

    // ---- endings --------------------------------------------------------

    /// Stream `id` was asked to end (by a drain, or its connection's age).
    fn begin_end(&mut self, id: u32, now: Instant) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let Some(reason) = s.reg.ctl.reason() else {
            return;
        };
        if s.ending.is_some() || s.resp_done {
            return;
        }
        s.ending = Some(Ending {
            reason,
            asked: now,
            quiet_at: None,
            barrier: None,
            forced_by: None,
        });
        self.ending.push(id);
        self.advance(id, now);
    }

    /// Moves stream `id`'s ending on as far as it can go now.
    fn advance(&mut self, id: u32, now: Instant) {
        let l = self.inner.config.limits;
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let Some(mut e) = s.ending else {
            return;
        };
        if !s.answered() {
            // Nothing of the response went out: a retryable answer of the
            // guard's own, for the kinds that have one.
            if let Some(block) = trailers_only(s.kind, grpc::end_message(e.reason)) {
                self.own_block(id, &block, true);
                self.end_here(id, Outcome::Ended(e.reason));
            }
            return;
        }
        if !s.endable() {
            // Left to finish until the bound (`timers`).
            return;
        }
        if !s.at_boundary() {
            e.quiet_at = None;
            e.barrier = None;
        } else if let Some((seq, by)) = e.barrier {
            if (self.barrier.acked >= seq || now >= by) && self.end_gracefully(id, e.reason) {
                return;
            }
        } else if e.quiet_at.is_none() {
            e.quiet_at = Some(match s.last_data {
                // It just wrote: end in its pause.
                Some(t) if now.saturating_duration_since(t) < BURST_GAP => t + BURST_GAP,
                // Quiet already: give it a moment to write once more.
                _ => now + l.end_settle,
            });
        }
        if e.quiet_at.is_some_and(|at| now >= at) {
            e.quiet_at = None;
            e.barrier = Some((self.barrier_target(), now + BARRIER_WAIT));
        }
        if let Some(s) = self.streams.get_mut(&id) {
            s.ending = Some(e);
        }
    }

    /// Data arrived on a stream being ended: its pause starts again.
    fn data_while_ending(&mut self, id: u32, now: Instant) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let at_boundary = s.at_boundary();
        let Some(e) = s.ending.as_mut() else {
            return;
        };
        e.barrier = None;
        e.quiet_at = at_boundary.then_some(now + BURST_GAP);
        if e.forced_by.is_some() && at_boundary {
            // Forced: this data completed a message; end right after it.
            let reason = e.reason;
            // If it must wait for the client's window, the forced bound holds.
            let _ = self.end_gracefully(id, reason);
        }
    }

    /// The barrier PING a stream asking now must wait for: the second one
    /// sent from now on (see [`Barrier`]).
    fn barrier_target(&mut self) -> u64 {
        let target = if self.barrier.acked >= self.barrier.sent {
            self.send_barrier();
            self.barrier.sent + 1
        } else {
            // One is in flight: the next two count.
            self.barrier.sent + 2
        };
        self.barrier.wanted = self.barrier.wanted.max(target);
        target
    }

    fn send_barrier(&mut self) {
        self.barrier.sent += 1;
        let mut opaque = [0u8; 8];
        opaque[..4].copy_from_slice(&BARRIER_PING);
        opaque[4..].copy_from_slice(&(self.barrier.sent as u32).to_be_bytes());
        wire::ping(&mut self.to_app, false, opaque);
    }

    fn check_endings(&mut self, now: Instant) {
        for id in self.ending.clone() {
            self.advance(id, now);
        }
        self.ending
            .retain(|id| self.streams.get(id).is_some_and(|s| s.ending.is_some()));
    }

    /// The timers: endings past their bounds, and the lifecycle's.
    fn timers(&mut self, now: Instant) -> Result<(), Failure> {
        let l = self.inner.config.limits;
        for id in std::mem::take(&mut self.stalled) {
            match self.streams.get(&id).and_then(|s| s.shut_since) {
                Some(at) if now >= at + l.write_stall_timeout => {
                    tracing::info!(peer = %self.info.peer, stream = id, timeout = ?l.write_stall_timeout,
                        "guard: the client took no data; resetting its stream");
                    wire::rst(&mut self.to_client, id, wire::CANCEL);
                    wire::rst(&mut self.to_app, id, wire::CANCEL);
                    if let Some(s) = self.streams.remove(&id) {
                        self.finish(s, Outcome::ClientGone);
                    }
                }
                Some(_) => self.stalled.push(id),
                None => {}
            }
        }
        self.stalled.sort_unstable();
        self.stalled.dedup();
        if self.throttled_until.is_some_and(|at| now >= at) {
            self.throttled_until = None;
            // The frames already read go on first.
            self.client_frames(now)?;
        }
        for id in self.ending.clone() {
            let Some(s) = self.streams.get_mut(&id) else {
                continue;
            };
            let Some(mut e) = s.ending else {
                continue;
            };
            if let Some(by) = e.forced_by {
                if now >= by {
                    self.reset_here(id);
                }
                continue;
            }
            if now >= e.asked + l.end_timeout {
                if s.endable() && s.at_boundary() {
                    // A producer that never paused: end at this boundary
                    // (or, waiting for the client's window, within one more bound)...
                    if !self.end_gracefully(id, e.reason) {
                        if let Some(s) = self.streams.get_mut(&id) {
                            e.forced_by = Some(now + l.end_timeout);
                            s.ending = Some(e);
                        }
                    }
                } else if s.endable() {
                    // ...or at the next one, within one more bound.
                    e.forced_by = Some(now + l.end_timeout);
                    s.ending = Some(e);
                } else {
                    self.reset_here(id);
                }
            }
        }
        self.check_endings(now);
        if self.app_sweep_at.is_some_and(|at| now >= at) {
            // Those grown long-lived since the application's GOAWAY: now.
            self.end_long_lived(std::time::Duration::ZERO, now);
        }
        let d = self.life.deadlines();
        for (at, input) in [
            (d.age, Input::AgeReached),
            (d.ack, Input::AckTimedOut),
            (d.grace, Input::GraceOver),
            (d.first_stream, Input::HeaderTimedOut),
            (d.idle, Input::IdleTimedOut),
        ] {
            if at.is_some_and(|at| now >= at) {
                self.step(input, now);
            }
        }
        Ok(())
    }

    fn next_deadline(&self) -> Option<Instant> {
        let l = self.inner.config.limits;
        let d = self.life.deadlines();
        let mut next = [
            self.throttled_until,
            self.app_sweep_at,
            self.closing_by,
            d.close_by,
            d.age,
            d.ack,
            d.grace,
            d.first_stream,
            d.idle,
        ]
        .into_iter()
        .flatten()
        .min();
        for id in &self.stalled {
            if let Some(at) = self.streams.get(id).and_then(|s| s.shut_since) {
                next = next.into_iter().chain([at + l.write_stall_timeout]).min();
            }
        }
        for id in &self.ending {
            if let Some(e) = self.streams.get(id).and_then(|s| s.ending) {
                let at = [
                    e.quiet_at,
                    e.barrier.map(|(_, by)| by),
                    Some(e.forced_by.unwrap_or(e.asked + l.end_timeout)),
                ]
                .into_iter()
                .flatten()
                .min();
                next = next.into_iter().chain(at).min();
            }
        }
        next
    }

    /// The guard's own end at a boundary: trailers for gRPC, the trailer
    /// frame for gRPC-Web, the body's end for SSE. False when it has to wait
    /// for the client's stream window (gRPC-Web's trailer frame is DATA).
    fn end_gracefully(&mut self, id: u32, reason: Reason) -> bool {
        let Some(s) = self.streams.get(&id) else {
            return true;
        };
        match s
            .bounds
            .as_ref()
            .and_then(|b| b.ending(grpc::end_message(reason)))
        {
            Some(End::Trailers(t)) => {
                let fields: Vec<(&str, &str)> = t
                    .iter()
                    .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)))
                    .collect();
                let block = wire::literal_block(&fields);
                self.own_block(id, &block, true);
            }
            Some(End::Last(data)) => {
                if data.len() as i64 > s.window {
                    // The client's window for this stream cannot take it yet:
                    // its WINDOW_UPDATE moves the end on; the bound resets it.
                    return false;
                }
                if let Some(s) = self.streams.get_mut(&id) {
                    s.window -= data.len() as i64;
                }
                self.own_data(id, &data, true);
            }
            None => {
                self.reset_here(id);
                return true;
            }
        }
        self.end_here(id, Outcome::Ended(reason));
        true
    }

    /// No safe end point in time: REFUSED_STREAM for gRPC (retryable),
    /// CANCEL otherwise (an aborted response, never one that looks whole).
    fn reset_here(&mut self, id: u32) {
        let Some(s) = self.streams.get(&id) else {
            return;
        };
        let code = if s.grpc() {
            wire::REFUSED_STREAM
        } else {
            wire::CANCEL
        };
        tracing::warn!(peer = %self.info.peer, stream = id,
            "guard: stream could not reach a safe end point in time; reset (REFUSED_STREAM for gRPC: retryable)");
        wire::rst(&mut self.to_client, id, code);
        self.end_here(id, Outcome::Reset);
    }

    /// The client got the guard's end of stream `id`: the application's
    /// stream is cancelled, and the client's request stopped if unfinished.
    fn end_here(&mut self, id: u32, outcome: Outcome) {
        let Some(s) = self.streams.remove(&id) else {
            return;
        };
        if !s.resp_done {
            wire::rst(&mut self.to_app, id, wire::CANCEL);
        }
        if !s.req_done && outcome != Outcome::Reset {
            wire::rst(&mut self.to_client, id, wire::NO_ERROR);
        }
        self.finish(s, outcome);
    }

    /// A stream is over for the guard: metrics, signals, registry.
    fn finish(&mut self, mut s: Stream, outcome: Outcome) {
        let inner = self.inner;
        let protocol = s.protocol();
        match outcome {
            Outcome::Ended(reason) => inner.record_termination(reason, protocol),
            Outcome::Reset => {
                if let Some(reason) = s.reg.ctl.reason() {
                    inner.record_ungraceful(reason, protocol);
                }
            }
            _ => {}
        }
        let grpc = s.grpc();
        if let Some(sig) = s.sig.as_mut() {
            record_outcome(sig, grpc, &outcome);
        }
    }

    /// Removes stream `id` once both its directions are over.
    fn maybe_done(&mut self, id: u32) {
        if self
            .streams
            .get(&id)
            .is_some_and(|s| s.req_done && s.resp_done)
        {
            if let Some(s) = self.streams.remove(&id) {
                self.finish(s, Outcome::Completed);
            }
        }
    }

    /// The application's connection is gone: every open stream gets the
    /// retryable end it can still get, and the client a GOAWAY.
    fn app_lost(&mut self) {
        tracing::debug!(peer = %self.info.peer, conn = self.info.id, streams = self.streams.len(), "guard: the application closed its connection");
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            let Some(s) = self.streams.get(&id) else {
                continue;
            };
            let block = if !s.answered() {
                trailers_only(s.kind, grpc::UPSTREAM_LOST_MESSAGE)
            } else if s.endable() && s.at_boundary() {
                match s
                    .bounds
                    .as_ref()
                    .and_then(|b| b.ending(grpc::UPSTREAM_LOST_MESSAGE))
                {
                    Some(End::Trailers(_)) => Some(unavailable_block(grpc::UPSTREAM_LOST_MESSAGE)),
                    _ => None,
                }
            } else {
                None
            };
            let grpc = s.grpc();
            match block {
                Some(b) => self.own_block(id, &b, true),
                None => wire::rst(
                    &mut self.to_client,
                    id,
                    if grpc {
                        wire::REFUSED_STREAM
                    } else {
                        wire::CANCEL
                    },
                ),
            }
            if let Some(mut s) = self.streams.remove(&id) {
                s.resp_done = true;
                if let Some(sig) = s.sig.as_mut() {
                    record_outcome(sig, grpc, &Outcome::UpstreamFailed);
                }
            }
        }
        self.to_app.clear();
        self.close_with(self.app_goaway_code);
    }

    /// A connection error: GOAWAY with its code, then close.
    fn fail(&mut self, f: Failure) {
        let code = match f {
            Failure::Protocol(_) => wire::PROTOCOL_ERROR,
            Failure::Compression => wire::COMPRESSION_ERROR,
            Failure::Calm => wire::ENHANCE_YOUR_CALM,
            Failure::FrameSize(_) => wire::FRAME_SIZE_ERROR,
            Failure::FlowControl => wire::FLOW_CONTROL_ERROR,
            Failure::AppProtocol | Failure::NotHttp2 => {
                // The application broke the protocol: like losing it.
                return self.app_lost();
            }
        };
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            if let Some(s) = self.streams.remove(&id) {
                self.finish(s, Outcome::ClientGone);
            }
        }
        self.close_with(code);
    }

    fn close_with(&mut self, code: u32) {
        if !self.closing && self.handshake {
            // Nothing from the application yet: the guard's own (empty)
            // SETTINGS are the server's preface before its GOAWAY.
            wire::put(&mut self.to_client, wire::SETTINGS, 0, 0, &[]);
            self.replay = None;
        }
        if !self.closing {
            self.goaway_to_client(self.last_id, code);
            self.closing = true;
            self.closing_by = Some(Instant::now() + self.inner.config.limits.shutdown_timeout);
        }
    }

    /// A GOAWAY to the client naming `last`, or the lowest id named before
    /// (and never above the application's): a last-stream id never grows.
    fn goaway_to_client(&mut self, last: u32, code: u32) {
        let last = [Some(last), self.sent_last, self.app_last]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(last);
        wire::goaway(&mut self.to_client, last, code);
        self.sent_last = Some(last);
    }

    /// The first GOAWAY of the guard's sequence: every stream id (once
    /// nothing lower was sent), and the PING whose ack sends the final one.
    fn first_goaway(&mut self) {
        self.goaway_to_client(wire::MAX_STREAM_ID, wire::NO_ERROR);
        wire::ping(&mut self.to_client, false, GOAWAY_PING);
        self.probe_out = true;
    }

    /// The application sent GOAWAY: no stream above `last` reaches it, and
    /// it is on its way out (a graceful stop, as gRPC servers do on
    /// SIGTERM: GOAWAY(2^31-1), PING, GOAWAY(last), then the grace). Never
    /// relayed as it is: the client gets the guard's own sequence, whose
    /// last-stream ids never grow. Streams above `last` are refused
    /// retryably; the long-lived ones are ended gracefully over
    /// `app_shutdown_spread`, before the application's grace cuts them;
    /// short calls finish.
    fn app_goaway(&mut self, last: u32, code: u32, now: Instant) {
        let first = self.app_last.is_none();
        let last = self.app_last.map_or(last, |l| l.min(last));
        self.app_last = Some(last);
        self.app_goaway_code = code;
        let mut above: Vec<u32> = self
            .streams
            .keys()
            .copied()
            .filter(|&id| id > last)
            .collect();
        above.sort_unstable();
        for id in above {
            // The application never processed it: safe to retry anywhere.
            wire::rst(&mut self.to_client, id, wire::REFUSED_STREAM);
            if let Some(s) = self.streams.remove(&id) {
                self.finish(s, Outcome::Refused);
            }
        }
        if !first {
            return;
        }
        let inner = self.inner;
        tracing::info!(peer = %self.info.peer, conn = self.info.id, last, code,
            "guard: the application sent GOAWAY; ending this connection's long-lived streams gracefully");
        self.step(Input::AppGoaway, now);
        self.end_long_lived(inner.config.app_shutdown_spread, now);
    }

    /// After the application's GOAWAY: the streams long-lived by now (and
    /// not already asked to end) are ended over `spread`; the next look is
    /// one spread later, for as long as streams are open.
    fn end_long_lived(&mut self, spread: std::time::Duration, now: Instant) {
        let inner = self.inner;
        let long_after = inner.config.long_stream_age;
        let long: Vec<_> = inner
            .registry
            .connection_streams(self.info.id, now, long_after)
            .into_iter()
            .filter(|s| s.is_long_lived_at(now, long_after))
            .collect();
        inner.end_spread(long, spread, Reason::app_shutdown);
        let period = inner
            .config
            .app_shutdown_spread
            .max(std::time::Duration::from_secs(1));
        self.app_sweep_at = (!self.streams.is_empty()).then_some(now + period);
    }

    // ---- the connection's lifecycle ---------------------------------------

    fn count_changed(&mut self, now: Instant) {
        let n = self.streams.len() + self.locals.len();
        if self.told_empty != (n == 0) {
            self.told_empty = n == 0;
            self.step(Input::Streams(n), now);
        }
    }

    fn step(&mut self, input: Input, now: Instant) {
        if matches!(input, Input::Acked) {
            // The client has the first GOAWAY: the final one names the last
            // stream the application will see.
            self.goaway_to_client(self.last_id, wire::NO_ERROR);
        }
        if matches!(input, Input::AckTimedOut) {
            tracing::info!(peer = %self.info.peer, conn = self.info.id,
                "guard: no PING ack after GOAWAY; refusing new streams and sending the final GOAWAY once idle");
        }
        match self.life.step(input, now) {
            None => {}
            Some(Action::Goaway(cause)) => {
                tracing::debug!(peer = %self.info.peer, conn = self.info.id, ?cause, "guard: GOAWAY");
                if self.handshake {
                    // The server's SETTINGS come first: after the application's.
                    self.goaway_held = true;
                } else {
                    self.first_goaway();
                }
                if let Some(reason) = metric_reason(cause) {
                    self.inner.record_goaway(reason);
                }
            }
            Some(Action::EndStreams) => {
                let inner = self.inner;
                let streams = inner.registry.connection_streams(
                    self.info.id,
                    now,
                    inner.config.long_stream_age,
                );
                inner.end_spread(streams, self.life.spread(), Reason::max_age);
            }
            Some(Action::Close) => self.close_with(wire::NO_ERROR),
        }
    }
}

/// Why a new stream was refused.
enum Refusal {
    /// Past the header list limit: 431.
    TooLarge,
    /// Not processed, safe to retry (REFUSED_STREAM).
    Reset,
    /// The drain refuses new streams: trailers-only UNAVAILABLE for gRPC.
    Draining(Kind),
}

/// Why the connection is closed.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("{0}")]
    Protocol(&'static str),
    #[error("HPACK: the client's header block cannot be decoded")]
    Compression,
    #[error("the client's header blocks are too large (an HPACK bomb or CONTINUATION flood)")]
    Calm,
    #[error("the application broke the protocol")]
    AppProtocol,
    #[error("the application does not speak HTTP/2")]
    NotHttp2,
    #[error("{0}: wrong frame size")]
    FrameSize(&'static str),
    #[error("the client's WINDOW_UPDATEs overflowed the connection window")]
    FlowControl,
}

impl From<wire::Malformed> for Failure {
    fn from(m: wire::Malformed) -> Self {
        Self::Protocol(if m.0 == "DATA" {
            "malformed DATA frame"
        } else {
            "malformed HEADERS frame"
        })
    }
}

/// The metrics label, for the causes the contract counts.
fn metric_reason(cause: Cause) -> Option<Reason> {
    match cause {
        Cause::MaxAge => Some(Reason::max_age),
        Cause::Drain => Some(Reason::drain),
        Cause::App => Some(Reason::app_shutdown),
        Cause::Idle => None,
    }
}

/// A trailers-only UNAVAILABLE block for the gRPC kinds, as literals.
fn trailers_only(kind: Kind, message: &'static str) -> Option<Vec<u8>> {
    let ct = match kind {
        Kind::Grpc => "application/grpc",
        Kind::GrpcWeb { text: false } => "application/grpc-web+proto",
        Kind::GrpcWeb { text: true } => "application/grpc-web-text+proto",
        Kind::Sse | Kind::Opaque => return None,
    };
    Some(wire::literal_block(&[
        (":status", "200"),
        ("content-type", ct),
        ("grpc-status", grpc::STATUS_UNAVAILABLE),
        ("grpc-message", message),
    ]))
}

/// The request head of an extended CONNECT, from its fields.
fn connect_head(fields: &[wire::Field]) -> Option<http::request::Parts> {
    let (mut scheme, mut authority, mut path) = ("http".to_string(), None, "/".to_string());
    let mut headers = http::HeaderMap::new();
    for wire::Field { name, value, .. } in fields {
        let text = || String::from_utf8(value.clone()).ok();
        match name.as_slice() {
            b":scheme" => scheme = text()?,
            b":authority" => authority = Some(text()?),
            b":path" => path = text()?,
            n if n.starts_with(b":") => {}
            n => {
                headers.append(
                    http::HeaderName::from_bytes(n).ok()?,
                    http::HeaderValue::from_bytes(value).ok()?,
                );
            }
        }
    }
    let uri = match authority {
        Some(a) => format!("{scheme}://{a}{path}"),
        None => path,
    };
    let (mut head, ()) = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(uri)
        .body(())
        .ok()?
        .into_parts();
    head.headers = headers;
    Some(head)
}

/// A response head as literals.
fn head_block(head: &http::Response<()>) -> Vec<u8> {
    let status = head.status().as_u16().to_string();
    let mut fields = vec![(":status", status.as_str())];
    for (name, value) in head.headers() {
        if let Ok(v) = value.to_str() {
            fields.push((name.as_str(), v));
        }
    }
    wire::literal_block(&fields)
}

/// A SETTINGS frame's length: a multiple of 6, and 0 for an ack (RFC 9113 §6.5).
fn settings_size_ok(h: Head) -> bool {
    if h.flags & wire::ACK != 0 {
        h.len == 0
    } else {
        h.len.is_multiple_of(6)
    }
}

/// `data` as DATA frames of at most `max_frame` bytes, END_STREAM on the last.
fn put_data(out: &mut BytesMut, id: u32, data: &[u8], end_stream: bool, max_frame: usize) {
    let mut chunks = data.chunks(max_frame.max(1)).peekable();
    if chunks.peek().is_none() {
        let flags = if end_stream { wire::END_STREAM } else { 0 };
        return wire::put(out, wire::DATA, flags, id, &[]);
    }
    while let Some(chunk) = chunks.next() {
        let last = chunks.peek().is_none();
        let flags = if last && end_stream {
            wire::END_STREAM
        } else {
            0
        };
        wire::put(out, wire::DATA, flags, id, chunk);
    }
}

/// A WINDOW_UPDATE's increment.
fn window_increment(payload: &[u8]) -> Result<u32, Failure> {
    let b: [u8; 4] = payload
        .try_into()
        .map_err(|_| Failure::Protocol("malformed WINDOW_UPDATE frame"))?;
    Ok(u32::from_be_bytes(b) & wire::MAX_STREAM_ID)
}

/// Trailers `grpc-status: 14` with `message`, as literals.
fn unavailable_block(message: &'static str) -> Vec<u8> {
    wire::literal_block(&[
        ("grpc-status", grpc::STATUS_UNAVAILABLE),
        ("grpc-message", message),
    ])
}

/// `fields` as literals without indexing; with `clear`, first two table
/// size updates (to 0, evicting every entry, then back to the size).
fn literals(clear: Option<u32>, fields: &[wire::Field]) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(size) = clear {
        wire::put_size_update(&mut out, 0);
        wire::put_size_update(&mut out, size);
    }
    for f in fields {
        // A field sent never-indexed stays so (RFC 7541 §6.2.3).
        wire::put_literal(&mut out, &f.name, &f.value, f.never_indexed);
    }
    out
}

/// A header block as HEADERS and as many CONTINUATIONs as `max_frame` needs.
fn put_block(out: &mut BytesMut, id: u32, end_stream: bool, block: &[u8], max_frame: usize) {
    let mut chunks = block.chunks(max_frame.max(1)).peekable();
    let mut kind = wire::HEADERS;
    let mut flags = if end_stream { wire::END_STREAM } else { 0 };
    loop {
        let chunk = chunks.next().unwrap_or(&[]);
        let last = chunks.peek().is_none();
        if last {
            flags |= wire::END_HEADERS;
        }
        wire::put(out, kind, flags, id, chunk);
        if last {
            return;
        }
        kind = wire::CONTINUATION;
        flags = 0;
    }
}

/// What is left of `buf` from `at` (an incomplete frame), as the next read's
/// buffer, with room for the read.
fn keep_rest(mut buf: BytesMut, at: usize) -> BytesMut {
    buf.advance(at);
    if buf.capacity() - buf.len() < READ_BUF / 4 {
        buf.reserve(READ_BUF);
    }
    buf
}

/// Writes the first `cleared` bytes of `buf` until they are gone or the
/// socket is full.
fn write_cleared<W: AsyncWrite + Unpin>(
    cx: &mut Context<'_>,
    io: &mut W,
    buf: &mut BytesMut,
    cleared: &mut usize,
) -> std::io::Result<()> {
    while *cleared > 0 {
        match Pin::new(&mut *io).poll_write(cx, &buf[..*cleared]) {
            Poll::Ready(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Poll::Ready(Ok(n)) => {
                buf.advance(n);
                *cleared -= n;
            }
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => break,
        }
    }
    Ok(())
}

/// Writes from `buf` until it is empty or the socket is full.
fn write_some<W: AsyncWrite + Unpin>(
    cx: &mut Context<'_>,
    io: &mut W,
    buf: &mut BytesMut,
) -> std::io::Result<()> {
    while !buf.is_empty() {
        match Pin::new(&mut *io).poll_write(cx, buf) {
            Poll::Ready(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Poll::Ready(Ok(n)) => buf.advance(n),
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => break,
        }
    }
    Ok(())
}

fn read_some<R: AsyncRead + Unpin>(
    cx: &mut Context<'_>,
    io: &mut R,
    buf: &mut BytesMut,
) -> Poll<std::io::Result<usize>> {
    if buf.capacity() - buf.len() < READ_BUF / 4 {
        buf.reserve(READ_BUF);
    }
    poll_read_buf(Pin::new(io), cx, buf)
}

/// Writes all of `buf`, bounded by the caller.
async fn flush<W: AsyncWrite + Unpin>(io: &mut W, buf: &mut BytesMut) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let bound = std::time::Duration::from_secs(1);
    let _ = tokio::time::timeout(bound, async {
        while !buf.is_empty() {
            let n = io.write(buf).await?;
            if n == 0 {
                break;
            }
            buf.advance(n);
        }
        io.flush().await
    })
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every frame in `buf`: (kind, flags, stream, data without padding).
    fn frames_in(buf: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(h) = wire::head(&buf[at..]) {
            let payload = &buf[at + wire::FRAME_HEADER..at + wire::FRAME_HEADER + h.len];
            let data = if h.kind == wire::DATA {
                wire::content(h, payload).expect("well-formed").to_vec()
            } else {
                payload.to_vec()
            };
            out.push((h.kind, h.flags, h.id, data));
            at += wire::FRAME_HEADER + h.len;
        }
        assert_eq!(at, buf.len(), "whole frames only");
        out
    }

    fn credit_in(buf: &[u8], stream: u32) -> u64 {
        frames_in(buf)
            .iter()
            .filter(|f| f.0 == wire::WINDOW_UPDATE && f.2 == stream)
            .map(|f| u64::from(u32::from_be_bytes(f.3[..4].try_into().unwrap())))
            .sum()
    }

    fn test_relay(guard: &super::super::Guard) -> Relay<'_> {
        let info = ConnInfo {
            id: 1,
            peer: std::net::SocketAddr::from(([127, 0, 0, 1], 1)),
            accepted_at: Instant::now(),
        };
        Relay::new(&guard.inner, info, false)
    }

    fn test_guard() -> super::super::Guard {
        let metrics = crate::metrics::Metrics::register(
            &mut prometheus_client::registry::Registry::default(),
        );
        super::super::Guard::new(
            super::super::GuardConfig::new(([127, 0, 0, 1], 9).into()),
            metrics,
        )
    }

    #[tokio::test]
    async fn the_client_window_pays_for_every_data_byte_and_credit_passes_on_once() {
        let guard = test_guard();
        let mut r = test_relay(&guard);
        // The application's DATA beyond the client's 65,535-byte window
        // (one frame padded), and 1,000 bytes of the guard's own.
        let app: Vec<u8> = (0..5 * 16_384u32).map(|i| i as u8).collect();
        let chunks: Vec<&[u8]> = app.chunks(16_384).collect();
        for chunk in &chunks[..3] {
            wire::put(&mut r.to_client, wire::DATA, 0, 1, chunk);
        }
        // The fourth crosses the window's end: it is split.
        let mut padded = vec![10u8];
        padded.extend_from_slice(chunks[3]);
        padded.extend_from_slice(&[0u8; 10]);
        wire::put(&mut r.to_client, wire::DATA, wire::PADDED, 1, &padded);
        wire::put(&mut r.to_client, wire::DATA, wire::END_STREAM, 1, chunks[4]);
        r.own_data(3, &[9u8; 1_000], true);
        r.clear_gate();
        let cleared: usize = frames_in(&r.to_client[..r.cleared])
            .iter()
            .filter(|f| f.0 == wire::DATA)
            .map(|f| f.3.len())
            .sum();
        assert_eq!(cleared, 65_535, "the window is used up, never exceeded");
        assert_eq!(r.conn_window, 0);
        // The split dropped the padding (11 bytes): given back to the app.
        assert_eq!(credit_in(&r.to_app, 0), 11);
        assert_eq!(credit_in(&r.to_app, 1), 11);
        // The client's credit: the guard's own 1,000 bytes are withheld from
        // the application (its view never counted them), the rest passes on.
        r.client_credit(20_000).expect("credit");
        assert_eq!(credit_in(&r.to_app, 0), 11 + 19_000);
        assert_eq!(r.debt, 0);
        r.clear_gate();
        assert_eq!(r.cleared, r.to_client.len(), "everything fits now");
        // Both streams arrive whole, in order, ended once.
        let frames = frames_in(&r.to_client);
        for (id, want) in [(1, app.clone()), (3, vec![9u8; 1_000])] {
            let got: Vec<u8> = frames
                .iter()
                .filter(|f| f.0 == wire::DATA && f.2 == id)
                .flat_map(|f| f.3.clone())
                .collect();
            assert_eq!(got, want, "stream {id}");
            let ends: Vec<bool> = frames
                .iter()
                .filter(|f| f.0 == wire::DATA && f.2 == id)
                .map(|f| f.1 & wire::END_STREAM != 0)
                .collect();
            assert_eq!(ends.iter().filter(|e| **e).count(), 1, "stream {id}");
            assert!(ends.last().copied().unwrap_or(false), "stream {id}");
        }
        // Over the whole run: the client paid exactly what it was sent.
        let sent: i64 = frames
            .iter()
            .filter(|f| f.0 == wire::DATA)
            .map(|f| f.3.len() as i64)
            .sum();
        assert_eq!(i64::from(DEFAULT_WINDOW) + 20_000 - sent, r.conn_window);
    }

    #[tokio::test]
    async fn a_growing_goaway_is_never_sent() {
        let guard = test_guard();
        let mut r = test_relay(&guard);
        r.handshake = false;
        r.last_id = 7;
        r.first_goaway();
        r.app_goaway(5, wire::NO_ERROR, Instant::now());
        r.goaway_to_client(wire::MAX_STREAM_ID, wire::NO_ERROR);
        r.goaway_to_client(r.last_id, wire::NO_ERROR);
        let lasts: Vec<u32> = frames_in(&r.to_client)
            .iter()
            .filter(|f| f.0 == wire::GOAWAY)
            .map(|f| u32::from_be_bytes(f.3[..4].try_into().unwrap()))
            .collect();
        // The guard's first, then (the application's lower id) only 5.
        assert_eq!(lasts[0], wire::MAX_STREAM_ID);
        assert!(
            lasts.len() >= 3 && lasts[1..].iter().all(|&l| l == 5),
            "{lasts:?}"
        );
    }

    #[test]
    fn a_re_encoded_block_clears_the_table_then_decodes_alone() {
        let field = |n: &str, v: &str, never_indexed| wire::Field {
            name: n.as_bytes().to_vec(),
            value: v.as_bytes().to_vec(),
            never_indexed,
        };
        // A secret sent never-indexed stays so (RFC 7541 §6.2.3).
        let fields = vec![
            field(":status", "200", false),
            field("grpc-status", "0", false),
            field("authorization", "Bearer s3cret", true),
        ];
        let block = literals(Some(4096), &fields);
        // A decoder that holds an entry (`a: b`, literal with indexing).
        let mut dec = wire::Hpack::new(4096);
        let mut seed = vec![0x40, 1, b'a', 1, b'b'];
        let seeded = wire::decode(&mut dec, &mut seed, 1 << 16, None).unwrap();
        assert!(seeded.indexed);
        let mut all = Vec::new();
        let f = wire::decode(&mut dec, &mut block.clone(), 1 << 16, Some(&mut all)).unwrap();
        assert_eq!(all, fields);
        assert!(f.indexed, "the size updates count as table changes");
        let mut stale = vec![0x80 | 62];
        assert!(
            wire::decode(&mut dec, &mut stale, 1 << 16, None).is_err(),
            "the entry was evicted"
        );
    }

    #[test]
    fn blocks_are_split_over_continuations_at_the_frame_size() {
        let mut out = BytesMut::new();
        put_block(&mut out, 3, true, &[7u8; 25], 10);
        let mut frames = Vec::new();
        let mut at = 0;
        while let Some(h) = wire::head(&out[at..]) {
            frames.push((h.kind, h.flags, h.len));
            at += wire::FRAME_HEADER + h.len;
        }
        assert_eq!(
            frames,
            [
                (wire::HEADERS, wire::END_STREAM, 10),
                (wire::CONTINUATION, 0, 10),
                (wire::CONTINUATION, wire::END_HEADERS, 5),
            ]
        );
        out.clear();
        put_block(&mut out, 3, false, &[], 10);
        assert_eq!(
            wire::head(&out).map(|h| (h.flags, h.len)),
            Some((wire::END_HEADERS, 0))
        );
    }

    #[test]
    fn an_extended_connect_becomes_a_request_head() {
        let f = |n: &str, v: &str| wire::Field {
            name: n.as_bytes().to_vec(),
            value: v.as_bytes().to_vec(),
            never_indexed: false,
        };
        let head = connect_head(&[
            f(":method", "CONNECT"),
            f(":protocol", "websocket"),
            f(":scheme", "http"),
            f(":authority", "app.local"),
            f(":path", "/tick?id=1"),
            f("sec-websocket-version", "13"),
        ])
        .expect("a head");
        assert_eq!(head.method, http::Method::CONNECT);
        assert_eq!(head.uri.to_string(), "http://app.local/tick?id=1");
        assert_eq!(head.headers["sec-websocket-version"], "13");
        assert!(
            connect_head(&[f("bad header", "x")]).is_none(),
            "a name h2 would refuse"
        );
    }
}
