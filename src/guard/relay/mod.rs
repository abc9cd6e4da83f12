//! The guard's HTTP/2 path: a frame relay (docs/design.md, "Cost").
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
//! neither peer's dynamic table. A graceful end ([`stream_end`], by the
//! rules in [`crate::guard::ending`]) comes at a boundary, in the
//! application's first pause: RST_STREAM(CANCEL) to the application, then
//! a barrier of two empty-SETTINGS round trips (their acks follow
//! everything it wrote before it read the cancel, which is forwarded;
//! SETTINGS, because gRPC servers punish PINGs on a quiet connection), then
//! trailers `grpc-status: 14` to the client. Whatever the application
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
//! enough. The GOAWAY sequence is the relay's own: the application never
//! sees it. WebSockets over extended CONNECT are served beside the relayed
//! streams, over HTTP/1.1 to the application ([`local`], [`connect`]).
//!
//! A connection whose application cannot be reached, or does not answer
//! HTTP/2 before anything reached the client, is served by the relay alone
//! ([`Relay::alone`]): the guard is then the client's server, and answers
//! every stream retryably itself.
//!
//! To the client the guard *is* the server, so it holds the client to RFC
//! 9113 itself and answers what breaks a MUST with the code the RFC names;
//! the frame is never passed on (the application would answer it on its
//! own connection, with every other stream on it, or never see a frame the
//! guard swallowed). Connection errors (GOAWAY, then close): a bad preface
//! (also one that diverges after `PRI * HTTP/2.0`, in `sniff`), a stream
//! frame on stream 0, a frame on an idle stream, a stream id lower than one
//! opened or an even one, a frame over the SETTINGS_MAX_FRAME_SIZE the
//! client was told, a wrong length, a setting out of its range, a window
//! past 2^31-1 on the connection (or by an INITIAL_WINDOW_SIZE change), an
//! undecodable or interrupted header block, a PUSH_PROMISE. Stream errors
//! (RST_STREAM, the application's stream cancelled): DATA or HEADERS after
//! the client ended its side (STREAM_CLOSED), a stream window past 2^31-1,
//! an increment of 0, a PRIORITY of the wrong size or on itself, a
//! malformed request (RFC 9113 §8.1: its pseudo-headers, uppercase or
//! connection-specific fields, content-length against its DATA, trailers
//! without END_STREAM), a stream past the MAX_CONCURRENT_STREAMS the client
//! was told (REFUSED_STREAM). Frames that are legal go on as they came,
//! unknown types and settings too; frames on a stream the guard or the
//! application reset are dropped, as the client may not have seen the
//! reset yet.
//!
//! Where each part is:
//!
//! | file | what it does |
//! |---|---|
//! | `mod.rs` | [`serve`], the relay's state and its loop (I/O turn, backpressure) |
//! | `client.rs` | the client's frames, held to RFC 9113; each new stream decided |
//! | `admit.rs` | admission, the answers of streams not let through, §8.1's message rules |
//! | `app.rs` | the application's frames, SETTINGS and GOAWAY |
//! | `blocks.rs` | header blocks: gathered, passed on, re-encoded, the guard's own |
//! | `flow.rs` | the client's connection window; socket reads and writes |
//! | `stream_end.rs` | the graceful end of a stream, and its outcome |
//! | `goaway.rs` | the connection's lifecycle: GOAWAY, timers, failure, close |
//! | `local.rs`, `connect.rs` | WebSockets the guard serves itself |
//! | `wire.rs`, `hpack.rs` | the frame and header codecs |
//! | `feed.rs` | the relay without sockets, for the fuzz target |
//! | `flood.rs`, `rapid.rs` | control-frame rates, rapid reset |

mod admit;
mod app;
mod blocks;
mod cadence;
mod client;
mod connect;
mod feed;
mod flood;
mod flow;
mod goaway;
mod hpack;
mod local;
mod rapid;
mod stream_end;
#[cfg(test)]
mod tests;
// Public for the `hpack` fuzz target; nothing outside the guard uses it.
#[doc(hidden)]
pub mod wire;

#[doc(hidden)]
pub use feed::{feed, FeedStep};

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

use crate::guard::body::{request_kind_of, response_kind_of, BodyKind, Boundaries, End};
use crate::guard::conn::ConnInfo;
use crate::guard::ending::{record_outcome, StreamOutcome, BARRIER_WAIT, BURST_GAP};
use crate::guard::grpc;
use crate::guard::handle::Handle;
use crate::guard::lifecycle::{Cause, ConnAction, Input, Lifecycle};
use crate::guard::registry::{EndQueue, Refused, Registered};
use crate::guard::signals;
use crate::guard::sniff::{linger, Prefixed, H2_PREFACE};
use crate::metrics::{Limit, Reason, StreamProtocol};

use admit::Refusal;
use blocks::{put_block, trailers_only, unavailable_block, Block};
use cadence::Cadence;
use client::settings_size_ok;
use flood::Buckets;
use flow::{flush, keep_rest, read_some, write_cleared, write_some};
use local::Local;
use rapid::{PrematureResets, PREMATURE_LIFETIME};
use stream_end::{Barrier, Stream};
use wire::Head;

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
/// Most SETTINGS the application has not acked yet (the client's, and the
/// guard's barrier round trip): the client's next one waits (the client is
/// not read) until an ack comes, so every ack pairs with its own frame's
/// entry in `settings_unacked`.
const MAX_UNACKED_SETTINGS: usize = 64;
/// How soon a SETTINGS held back by `MAX_UNACKED_SETTINGS` is tried again.
const UNACKED_RETRY: std::time::Duration = std::time::Duration::from_millis(10);
/// Streams the client ended (END_STREAM or RST_STREAM) remembered: its DATA
/// or HEADERS on one is STREAM_CLOSED (RFC 9113 §5.1). On a stream it ended
/// longer ago they are dropped like those for a stream the guard reset.
const CLOSED_KEPT: usize = 128;
/// Ranges of stream ids the client skipped remembered: HEADERS on one is
/// a stream id lower than one it opened (RFC 9113 §5.1.1).
const SKIPS_KEPT: usize = 16;

/// Serves one HTTP/2 connection by relaying its frames to the application,
/// or, when the application cannot be reached or does not answer HTTP/2,
/// by answering the client itself (see [`Relay::alone`]).
pub async fn serve(guard: Handle, io: Prefixed<TcpStream>, info: ConnInfo) {
    let l = guard.config().limits;
    let app = match guard.connect_app().await {
        Ok(app) => Some(app),
        Err(e) => {
            tracing::warn!(peer = %info.peer, error = %e, "guard: cannot reach the application; answering this connection's streams retryably");
            None
        }
    };
    let mut client = io;
    let mut reclaim = client.reclaim();
    let mut relay = Relay::new(&guard, info, app.is_none());
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
        let mut relay = Relay::new(&guard, info, true);
        relay.run(&mut client, None).await;
    }
    drop(client);
    if let Some(tcp) = reclaim.take() {
        linger(tcp, l.shutdown_timeout).await;
    }
    tracing::debug!(peer = %info.peer, conn = info.id, "guard: HTTP/2 connection closed");
}

/// What woke the relay.
enum Wake {
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

/// One peer of the relay, the client or the application, as the relay
/// sees it: the bytes each way, and the HTTP/2 state of that peer that the
/// relay follows (h2 splits a connection the same way, into its receiving
/// and its sending half).
struct Side {
    /// Read from this peer and not handled yet (a frame in part stays).
    read: BytesMut,
    /// To be written to this peer: the other peer's frames and the guard's
    /// own.
    write: BytesMut,
    /// Decodes this peer's header blocks: its encoder's dynamic table.
    hpack: wire::Hpack,
    /// This peer's header block being gathered over CONTINUATION frames.
    block: Option<Block>,
    /// This peer's SETTINGS_MAX_FRAME_SIZE: the largest frame written to it.
    frame: usize,
    /// Blocks to this peer are re-encoded as literals (see the module doc):
    /// set once the guard dropped a block that changed the other peer's
    /// table; `Some(true)` until the first, which clears this peer's table.
    translate: Option<bool>,
}

impl Side {
    /// A peer at the start: nothing read, the RFC's default SETTINGS.
    fn new() -> Self {
        Self {
            read: BytesMut::with_capacity(READ_BUF),
            write: BytesMut::new(),
            hpack: wire::Hpack::new(DEFAULT_TABLE as usize),
            block: None,
            frame: DEFAULT_FRAME,
            translate: None,
        }
    }
}

/// A SETTINGS frame the relay sent the application, as its ack will say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unacked {
    /// The client's, passed on, with the HEADER_TABLE_SIZE it set (if any):
    /// the ack goes back to the client, and a lower table size then binds.
    Client(Option<u32>),
    /// The guard's own empty SETTINGS, barrier round trip `n` (see [`Barrier`]).
    Barrier(u64),
}

/// Eight bytes no peer can guess (std's per-process random hash keys,
/// mixed with a per-call counter): the guard's own PING data.
fn random_opaque() -> [u8; 8] {
    use std::hash::{BuildHasher, Hasher};
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.finish().to_be_bytes()
}

/// One connection's state (the sockets are the `run` loop's).
struct Relay<'a> {
    /// What the relay may use of the guard (settings, registry, the drain's
    /// signals, its counters).
    guard: &'a Handle,
    /// Who the client is, for logs and the registry.
    info: ConnInfo,
    /// The relayed streams still open, by id.
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
    /// The two peers: what the relay reads from and writes to each, and
    /// what it knows of each one's HPACK table and SETTINGS.
    client: Side,
    app: Side,
    /// The client's preface is still to come.
    preface: bool,
    /// The application's first frame (its SETTINGS) has not come yet:
    /// only the client's preface went on, and every client byte is kept
    /// in `replay` (up to `REPLAY_MAX`), in case it does not speak HTTP/2.
    handshake: bool,
    replay: Option<BytesMut>,
    /// A GOAWAY asked during the handshake, sent after the SETTINGS.
    goaway_held: bool,
    /// The last request forwarded, while still unwritten and last in
    /// `to_app`: its stream, where it starts and ends, and whether it
    /// changed the table.
    unsent: Option<(u32, usize, usize, bool)>,
    /// The error code of the application's last GOAWAY: the client's
    /// GOAWAY when the application's connection then closes.
    app_goaway_code: u32,
    /// Each SETTINGS frame the application has not acked yet, oldest first:
    /// its acks come in this order.
    settings_unacked: std::collections::VecDeque<Unacked>,
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
    /// The largest MAX_FRAME_SIZE the client ever announced: an application
    /// frame above it is the application's error, never passed on.
    client_frame_max: usize,
    /// The application's SETTINGS have been seen (the first gets the
    /// guard's limits added).
    app_settings: bool,
    /// Where the registry puts the ids of this connection's streams a
    /// drain or the max age asks to end.
    queue: Arc<EndQueue>,
    /// Streams being ended.
    ending: Vec<u32>,
    /// Streams whose client window was shut (some may have opened since).
    stalled: Vec<u32>,
    /// The barrier on the application connection (SETTINGS round trips).
    barrier: Barrier,
    /// When the connection goes away (max age, drain, idle): a pure machine.
    life: Lifecycle,
    /// The lifecycle was last told the connection has no streams.
    told_empty: bool,
    /// Streams the client reset before they were answered (rapid reset).
    resets: PrematureResets,
    /// GOAWAY(ENHANCE_YOUR_CALM) was sent for rapid reset (once).
    calmed: bool,
    /// The connection is closing: stop reading, flush (until the
    /// instant at most), then close.
    closing: bool,
    closing_by: Option<Instant>,
    /// The client's `x-forwarded-for` entry, as a CONTINUATION's block.
    forwarded: Vec<u8>,
    /// A header block's bytes, kept between blocks to reuse the allocation.
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
    /// The probe's opaque data: random per connection, so no PING of the
    /// application's that the client acks is ever taken for it.
    probe: [u8; 8],
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
    /// The client's preface still lacks its SETTINGS frame, which must be
    /// its first frame (RFC 9113 §3.4).
    settings_due: bool,
    /// The client's header block in progress came in a HEADERS whose
    /// priority makes its stream depend on itself (RFC 9113 §5.3.1).
    self_dependent: bool,
    /// Streams the client ended lately (END_STREAM or RST_STREAM, at most
    /// `CLOSED_KEPT`), whether or not they are still open: its DATA or
    /// HEADERS on them is STREAM_CLOSED (RFC 9113 §5.1).
    closed_by_client: std::collections::VecDeque<u32>,
    /// Ranges of stream ids the client skipped (closed unused, RFC 9113
    /// §5.1), the last `SKIPS_KEPT`: HEADERS on one is a PROTOCOL_ERROR.
    skipped: std::collections::VecDeque<(u32, u32)>,
    /// For each relayed request with a content-length, the bytes of it
    /// still to come: its DATA must add up to it (RFC 9113 §8.1.1).
    body_left: HashMap<u32, u64>,
    /// The largest SETTINGS_MAX_FRAME_SIZE the client was told (the
    /// application's, lowered to `MAX_FRAME`): a larger client frame is a
    /// FRAME_SIZE_ERROR (RFC 9113 §4.2).
    frame_told: usize,
    /// The SETTINGS_MAX_CONCURRENT_STREAMS the client was last told (the
    /// application's, lowered to the guard's limit): a stream past it is
    /// refused here (RFC 9113 §5.1.2), never passed on.
    streams_told: u32,
    /// The SETTINGS_INITIAL_WINDOW_SIZE the client was last told (the
    /// application's, passed on): a local stream's window for the client's
    /// DATA starts there.
    window_told: i64,
}

impl<'a> Relay<'a> {
    /// A relay for one connection; `alone` when there is no application
    /// connection (see [`Relay::alone`]).
    fn new(guard: &'a Handle, info: ConnInfo, alone: bool) -> Self {
        let l = guard.config().limits;
        let life = guard.lifecycle(&info);
        let peer = info.peer.ip().to_string();
        let mut relay = Self {
            guard,
            info,
            streams: HashMap::new(),
            last_id: 0,
            sent_last: None,
            app_last: None,
            client: Side::new(),
            app: Side::new(),
            preface: true,
            handshake: true,
            replay: Some(BytesMut::new()),
            goaway_held: false,
            unsent: None,
            app_goaway_code: wire::NO_ERROR,
            settings_unacked: std::collections::VecDeque::new(),
            client_table_acked: DEFAULT_TABLE,
            client_update_due: None,
            client_reset: std::collections::VecDeque::new(),
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
            buckets: Buckets::new(l.flood, |k| guard.limited(k), Instant::now()),
            throttled_until: None,
            all: Vec::new(),
            locals: HashMap::new(),
            conn_window: i64::from(DEFAULT_WINDOW),
            cleared: 0,
            debt: 0,
            probe_out: false,
            probe: random_opaque(),
            app_sweep_at: None,
            client_window: i64::from(DEFAULT_WINDOW),
            alone: false,
            settings_due: true,
            self_dependent: false,
            closed_by_client: std::collections::VecDeque::new(),
            skipped: std::collections::VecDeque::new(),
            body_left: HashMap::new(),
            frame_told: DEFAULT_FRAME,
            streams_told: l.max_concurrent_streams,
            window_told: i64::from(DEFAULT_WINDOW),
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
        let guard = self.guard;
        let terminate = guard.terminate_all();
        let goaway = guard.goaway_all();
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
                && self.client.write.is_empty()
            {
                self.step(Input::Quiet, now);
            }
            if self.closing && self.client.write.is_empty() {
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
                to_app = self.app.write.len(),
                to_client = self.client.write.len(),
                cleared = self.cleared,
                conn_window = self.conn_window,
                debt = self.debt,
                from_client = self.client.read.len(),
                from_app = self.app.read.len(),
                "guard: relay turn"
            );
            let event = tokio::select! {
                biased;
                _ = &mut timer, if timer_at.is_some() => { timer_at = None; Wake::Timer }
                _ = &mut terminate, if self.life.watches_terminate() => Wake::Input(Input::Terminate),
                _ = &mut goaway, if self.life.watches_goaway() => Wake::Input(Input::GoawayAll),
                _ = &mut ended => {
                    ended.set(queue.ready());
                    Wake::Ended
                }
                e = poll_fn(|cx| self.poll_io(cx, client, &mut app, client_first)) => e,
            };
            let now = Instant::now();
            let result = match event {
                Wake::FromClient if self.closing => {
                    self.credit_while_closing();
                    Ok(())
                }
                Wake::FromClient => self.client_frames(now),
                Wake::FromApp => self.app_frames(now),
                Wake::ClientGone => break,
                Wake::Flushed | Wake::Local => Ok(()),
                Wake::AppGone if self.handshake => return self.replay.take(),
                Wake::AppGone => {
                    self.app_lost();
                    Ok(())
                }
                Wake::Timer => self.timers(now),
                Wake::Ended => {
                    for id in self.queue.take() {
                        self.begin_end(id, now);
                    }
                    Ok(())
                }
                Wake::Input(input) => {
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
                guard.limited(Limit::rapid_reset).inc();
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
        self.client.write.truncate(self.cleared);
        let _ = flush(client, &mut self.client.write).await;
        None
    }

    /// Writes what is queued, then reads the side(s) there is room for.
    fn poll_io(
        &mut self,
        cx: &mut Context<'_>,
        client: &mut Prefixed<TcpStream>,
        app: &mut Option<TcpStream>,
        client_first: bool,
    ) -> Poll<Wake> {
        match app.as_mut() {
            Some(app) => {
                if write_some(cx, app, &mut self.app.write).is_err() {
                    return Poll::Ready(Wake::AppGone);
                }
            }
            None => self.app.write.clear(),
        }
        let had = !self.client.write.is_empty();
        self.clear_gate();
        if write_cleared(cx, client, &mut self.client.write, &mut self.cleared).is_err() {
            return Poll::Ready(Wake::ClientGone);
        }
        if had && self.client.write.is_empty() && (self.closing || self.life.wants_quiet()) {
            // What the loop waits for before it closes.
            return Poll::Ready(Wake::Flushed);
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
                let before = self.client.read.len();
                match read_some(cx, client, &mut self.client.read) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                        return Poll::Ready(Wake::ClientGone)
                    }
                    Poll::Ready(Ok(_)) => {
                        if let Some(r) = self.replay.as_mut() {
                            r.extend_from_slice(&self.client.read[before..]);
                        }
                        return Poll::Ready(Wake::FromClient);
                    }
                    Poll::Pending => {}
                }
            }
            if let (false, true, Some(app)) = (client_turn, want_app, app.as_mut()) {
                match read_some(cx, app, &mut self.app.read) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(Wake::AppGone),
                    Poll::Ready(Ok(_)) => return Poll::Ready(Wake::FromApp),
                    Poll::Pending => {}
                }
            }
        }
        if moved {
            return Poll::Ready(Wake::Local);
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
        let client_room = if self.cleared < self.client.write.len() {
            BLOCKED_HIGH_WATER
        } else {
            HIGH_WATER
        };
        if self.closing {
            // Only for the WINDOW_UPDATEs what waits at the gate needs.
            return (
                self.cleared < self.client.write.len()
                    && self.client.read.len() < READ_BUF + MAX_FRAME as usize,
                false,
            );
        }
        (
            !self.closing
                && self.app.write.len() < HIGH_WATER
                && self.client.write.len() < client_room
                && self.throttled_until.is_none()
                && !(self.handshake && self.client.read.len() >= REPLAY_MAX),
            !self.closing && self.client.write.len() < HIGH_WATER,
        )
    }
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
