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
//! neither peer's dynamic table. A graceful end ([`ending`], where every
//! rule and step of it lives) comes at a boundary, in the
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
//! ([`Relay::serve_alone`]): the guard is then the client's server, and answers
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
//! The parts of a connection are types of their own, with private fields
//! (docs/design.md, "The relay's map"): the two sides, [`ClientSide`] (its
//! [`Peer`](peer::Peer), its stream ids, its preface and its
//! [`Defences`]) and [`AppSide`] (its peer, and its handshake: whether it
//! answered HTTP/2 yet, or is there at all), the open streams
//! ([`Streams`]), the [`Window`], the [`PeerSettings`], the connection's
//! [`Life`], the [`Endings`], [`Forward`] and the local WebSockets
//! ([`Locals`]). A chapter that wants another's work done returns it
//! ([`Next`]) for the loop here to carry out, so the calls run one way.
//! The work that spans parts takes only the parts it needs, borrowed for
//! one step: a stream's end works on [`Ends`] (the streams, the endings,
//! both peers, the window and the SETTINGS; [`Relay::ends`]); the
//! connection's life and the application's frames on [`Conn`] (those, the
//! lifecycle, the client's ids, the application's handshake and the local
//! WebSockets; [`Relay::conn`]). The client's frames are judged by its
//! side ([`ClientSide::judge`]: what only that side knows), and the loop
//! here hands each, by what it is ([`Judged`]), to the work on its stream:
//! on [`Conn`], with what the client's side keeps of its requests beside
//! it ([`Kept`]: [`Forward`] and its [`Defences`]; [`Relay::conn_kept`]).
//! No file but this one opens `impl Relay`:
//!
//! | file | what it does |
//! |---|---|
//! | `mod.rs` | [`serve`], the relay's parts and its loop (I/O turn, backpressure, the timers, what the chapters ask next, each client frame handed on) |
//! | `client/` | the client's frames, held to RFC 9113: judged by its side (`mod.rs`), then the work on their streams, each new stream decided (`streams.rs`, over [`Conn`] and [`Kept`]) |
//! | `app.rs` | the application's frames, SETTINGS and GOAWAY, over [`Conn`] |
//! | `admit.rs` | admission, registration, the answers of streams not let through, §8.1's message rules: functions over the parts they read |
//! | `ending/` | how a stream ends: the rules and outcomes (`mod.rs`), the cadence, its state (kept by the stream store), the connection's own planned ends |
//! | `ends.rs` | the one protocol that carries those rules out, over [`Ends`] (the store among them) |
//! | `goaway.rs` | the connection's steps over [`Conn`]: GOAWAY, the timers' work, failure, close (its state: `life.rs`) |
//!
//! and these own one part each: `sides.rs` (the two sides), `peer.rs` (a
//! peer: its frames split, its header blocks gathered, decoded and
//! written, the same code both ways), `streams.rs` (the stream store: each
//! [`Stream`](streams::Stream), its fields its own, the bytes held across
//! them, and the graceful ends not written yet), `ending/state.rs` (a
//! stream's ending, the barrier, the planned ends), `blocks.rs` (the
//! guard's own blocks, and what goes with a forwarded request), `local.rs`
//! (the WebSockets the guard serves itself; `connect.rs` their task),
//! `ids.rs`, `window.rs`, `settings.rs`, `defences.rs` (over `flood.rs`,
//! control-frame rates, and `rapid.rs`, rapid reset); `failure.rs` and
//! `limits.rs` are leaves (why a connection fails; the relay's bounds and
//! the RFC's defaults), `next.rs` what a chapter asks the loop for,
//! `wire.rs` and `hpack.rs` the frame and header codecs, `io.rs` the socket
//! reads and writes, `feed.rs` the relay without sockets, for the fuzz
//! target.

mod admit;
mod app;
mod blocks;
mod client;
mod connect;
mod defences;
mod ending;
mod ends;
mod failure;
// The relay without sockets, for the `frame_relay` fuzz target and the
// unit tests; nothing outside the guard uses it.
#[doc(hidden)]
pub mod feed;
mod flood;
mod goaway;
mod hpack;
mod ids;
mod io;
mod life;
mod limits;
mod local;
mod next;
mod peer;
mod rapid;
mod settings;
mod sides;
mod streams;
#[cfg(test)]
mod tests;
mod window;
// Public for the `hpack` fuzz target; nothing outside the guard uses it.
#[doc(hidden)]
pub mod wire;

use std::future::poll_fn;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::guard::conn::ConnInfo;
use crate::guard::handle::Handle;
use crate::guard::lifecycle::Input;
use crate::guard::sniff::{linger, Prefixed};
use crate::metrics::Limit;

use blocks::Forward;
use client::streams::Kept;
use client::Judged;
use defences::Defences;
use ending::state::Endings;
use ends::{ending_due, Ends};
use failure::Failure;
use flood::Buckets;
use goaway::Conn;
use io::{flush, read_some, write_some};
use life::Life;
use limits::{BLOCKED_HIGH_WATER, HIGH_WATER, MAX_FRAME, READ_BUF, REPLAY_MAX};
use local::Locals;
use next::Next;
use rapid::PrematureResets;
use settings::{PeerSettings, UNACKED_RETRY};
use sides::{AppSide, ClientSide};
use streams::{Stream, Streams};
use window::Window;
use wire::Head;

/// Serves one HTTP/2 connection by relaying its frames to the application,
/// or, when the application cannot be reached or does not answer HTTP/2,
/// by answering the client itself (see [`Relay::serve_alone`]).
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
    /// The application's connection is gone: cleanly (its end of file
    /// read), or not (a read or write error).
    AppGone(bool),
    Timer,
    Ended,
    Input(Input),
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

/// One connection's state (the sockets are the `run` loop's): the parts,
/// each its own type. The chapters take the parts they need ([`Ends`],
/// [`Conn`], [`Kept`], or the parts one by one).
struct Relay<'a> {
    /// What the relay may use of the guard (settings, registry, the drain's
    /// signals, its counters).
    guard: &'a Handle,
    /// Who the client is, for logs and the registry.
    info: ConnInfo,
    /// The relayed streams still open, by id.
    streams: Streams,
    /// WebSockets over HTTP/2 the guard serves itself, by stream id.
    locals: Locals,
    /// The two sides, each with its peer and what is only that side's.
    client: ClientSide,
    app: AppSide,
    /// The client's connection window, which the guard owns.
    window: Window,
    /// The SETTINGS each way, as the relay follows them.
    settings: PeerSettings,
    /// The connection's lifecycle, GOAWAYs and close.
    life: Life,
    /// Streams being ended, and the barrier their ends wait for.
    endings: Endings,
    /// What goes with each forwarded request.
    forward: Forward,
}

impl<'a> Relay<'a> {
    /// A relay for one connection; `alone` when there is no application
    /// connection (see [`Relay::serve_alone`]).
    fn new(guard: &'a Handle, info: ConnInfo, alone: bool) -> Self {
        let l = guard.config().limits;
        let peer = info.peer.ip().to_string();
        let mut relay = Self {
            guard,
            info,
            streams: Streams::default(),
            locals: Locals::default(),
            client: ClientSide::new(Defences::new(
                Buckets::new(l.flood, |k| guard.limited(k), Instant::now()),
                PrematureResets::new(l.max_pending_accept_reset_streams),
            )),
            app: AppSide::new(),
            window: Window::default(),
            settings: PeerSettings::new(l.max_concurrent_streams),
            life: Life::new(guard.lifecycle(&info), random_opaque()),
            endings: Endings::default(),
            forward: Forward::new(&peer),
        };
        if alone {
            relay.serve_alone();
        }
        relay
    }

    /// Serves the client without an application connection (the application
    /// cannot be reached, or does not answer HTTP/2): the guard's own
    /// SETTINGS (its limits, extended CONNECT) are the server's preface, and
    /// the guard acks the client's SETTINGS and PINGs. WebSockets over
    /// extended CONNECT still reach the application over HTTP/1.1; every
    /// other stream gets a retryable answer (`unavailable`, in
    /// `client/streams.rs`). The lifecycle (max age, drain, idle) is the
    /// relayed connection's.
    fn serve_alone(&mut self) {
        self.app.go_alone();
        self.conn().app_settings(0, &[]);
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
        let queue = self.endings.queue.clone();
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
            // Graceful ends written since the last turn are counted.
            self.ends().settle_written(None);
            self.count_changed(now);
            if self.life.machine().wants_quiet()
                && self.streams.is_empty()
                && self.locals.is_empty()
                && self.client.peer.write.is_empty()
            {
                self.conn().step(Input::Quiet, now);
            }
            if self.life.closing() && self.client.peer.write.is_empty() {
                break;
            }
            self.endings.prune_stalled(|id| self.streams.shut(id));
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
                to_app = self.app.peer.write.len(),
                to_client = self.client.peer.write.len(),
                cleared = self.window.cleared(),
                conn_window = self.window.available(),
                debt = self.window.debt(),
                from_client = self.client.peer.read.len(),
                from_app = self.app.peer.read.len(),
                "guard: relay turn"
            );
            let event = tokio::select! {
                biased;
                _ = &mut timer, if timer_at.is_some() => { timer_at = None; Wake::Timer }
                _ = &mut terminate, if self.life.machine().watches_terminate() => Wake::Input(Input::Terminate),
                _ = &mut goaway, if self.life.machine().watches_goaway() => Wake::Input(Input::GoawayAll),
                _ = &mut ended => {
                    ended.set(queue.ready());
                    Wake::Ended
                }
                e = poll_fn(|cx| self.poll_io(cx, client, &mut app, client_first)) => e,
            };
            let now = Instant::now();
            let result = match event {
                Wake::FromClient if self.life.closing() => {
                    self.window.credit_while_closing(&mut self.client.peer.read);
                    Ok(())
                }
                Wake::FromClient => self.client_frames(now),
                Wake::FromApp => self.app_frames(now),
                Wake::ClientGone => break,
                Wake::Flushed | Wake::Local => Ok(()),
                Wake::AppGone(_) if self.app.handshake.pending => {
                    return self.app.handshake.replay.take()
                }
                Wake::AppGone(clean) => {
                    self.conn().app_lost(clean);
                    Ok(())
                }
                Wake::Timer => self.timers(now),
                Wake::Ended => {
                    for id in self.endings.queue.take() {
                        self.ends().begin_end(id, now);
                    }
                    Ok(())
                }
                Wake::Input(input) => {
                    self.conn().step(input, now);
                    Ok(())
                }
            };
            if matches!(result, Err(Failure::NotHttp2)) {
                return self.app.handshake.replay.take();
            }
            if let Err(e) = result {
                tracing::debug!(peer = %info.peer, conn = info.id, error = %e, "guard: HTTP/2 connection failed");
                self.conn().fail(e);
            }
            if let Some(premature) = self.client.defences.calm_now() {
                tracing::warn!(peer = %info.peer, conn = info.id, premature,
                    "guard: most streams on this connection were reset before they were answered (rapid reset); GOAWAY(ENHANCE_YOUR_CALM)");
                guard.limited(Limit::rapid_reset).inc();
                self.conn().fail(Failure::Calm);
            }
            let now = Instant::now();
            if self.life.close_deadline().is_some_and(|at| now >= at) {
                let open = self.streams.len() + self.locals.len();
                if open > 0 {
                    // Every stream has its own bounded end before this
                    // backstop: one still open here is cut, says so, and
                    // is counted.
                    tracing::warn!(peer = %info.peer, conn = info.id, open,
                        "guard: closing deadline reached with streams still open; dropping the connection cuts them");
                    self.ends().cut_open();
                } else {
                    tracing::debug!(peer = %info.peer, conn = info.id, "guard: closing deadline reached; dropping the connection");
                }
                break;
            }
        }
        // Whatever is still open is dropped with the connection; only what
        // the client's window allows is written. A graceful end that does
        // not leave is a cut.
        self.clear_gate();
        let ends = self.ends().closing_ends();
        let queued = self.client.peer.write.len();
        let _ = flush(client, &mut self.client.peer.write).await;
        let written = queued - self.client.peer.write.len();
        self.ends().settle_closed(&ends, written);
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
            Some(app) if self.app.write_failed.is_none() => {
                if let Err(e) = write_some(cx, app, &mut self.app.peer.write) {
                    if self.life.closing() {
                        // Closing reads nothing of the application's.
                        return Poll::Ready(Wake::AppGone(false));
                    }
                    // The application closed or reset its connection. What
                    // it wrote before is still to be read from the socket:
                    // it is read first, so none of it is lost, and the
                    // read's end (end of file or error) says it is gone.
                    self.app.write_failed = Some(e.kind());
                    self.app.peer.write.clear();
                }
            }
            _ => self.app.peer.write.clear(),
        }
        let had = !self.client.peer.write.is_empty();
        self.clear_gate();
        if self
            .window
            .write(cx, client, &mut self.client.peer.write)
            .is_err()
        {
            return Poll::Ready(Wake::ClientGone);
        }
        if had
            && self.client.peer.write.is_empty()
            && (self.life.closing()
                || self.life.machine().wants_quiet()
                || self.streams.has_unwritten())
        {
            // What the loop waits for before it closes; and graceful ends
            // now written are counted at once, not at the connection's next
            // event (a connection left idle after its last ending has none).
            return Poll::Ready(Wake::Flushed);
        }
        // Which sides to read, from the buffers as the writes left them: this
        // poll repeats (on each socket wake) until an event, so wants fixed
        // before it would never see a full buffer drain, and with both sides
        // unread the connection would hang.
        let (want_client, want_app) = self.wants();
        // Local streams move first, but never instead of the reads: a busy
        // WebSocket must not starve the relayed streams beside it.
        let moved = !self.locals.is_empty()
            && self.locals.poll(
                cx,
                &mut self.client.peer,
                &mut self.window,
                &mut self.settings,
            );
        for client_turn in [client_first, !client_first] {
            if client_turn && want_client {
                let before = self.client.peer.read.len();
                match read_some(cx, client, &mut self.client.peer.read) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                        return Poll::Ready(Wake::ClientGone)
                    }
                    Poll::Ready(Ok(_)) => {
                        if let Some(r) = self.app.handshake.replay.as_mut() {
                            r.extend_from_slice(&self.client.peer.read[before..]);
                        }
                        return Poll::Ready(Wake::FromClient);
                    }
                    Poll::Pending => {}
                }
            }
            if let (false, true, Some(app)) = (client_turn, want_app, app.as_mut()) {
                match read_some(cx, app, &mut self.app.peer.read) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Wake::AppGone(self.app.end_is_clean()))
                    }
                    Poll::Ready(Err(_)) => return Poll::Ready(Wake::AppGone(false)),
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

    /// The application's frames read so far, then what they ask for.
    fn app_frames(&mut self, now: Instant) -> Result<(), Failure> {
        let next = self.conn().app_read(now)?;
        self.carry_out(next, now)
    }

    /// The timers: stalled streams and the flood pause first, then what
    /// that asks for, then the endings' bounds and the lifecycle's.
    fn timers(&mut self, now: Instant) -> Result<(), Failure> {
        self.conn().stall_timers(now);
        if self.client.defences.resume(now) {
            // The client's frames already read go on, before the other timers.
            self.client_frames(now)?;
        }
        self.conn().bound_timers(now);
        Ok(())
    }

    /// The client's frames read so far: its preface, then each frame judged
    /// by its side and handed on, until the reads run dry or a defence
    /// pauses them.
    fn client_frames(&mut self, now: Instant) -> Result<(), Failure> {
        // Offsets into `to_app` from before its last write are stale.
        self.forward.forget();
        if !self.client.preface(&mut self.app.peer.write)? {
            return Ok(());
        }
        if self.app.handshake.pending {
            // Held until the application shows it speaks HTTP/2.
            return Ok(());
        }
        let mut frames = self.client.peer.frames(self.app.peer.frame_max());
        while let Some((h, frame)) = frames.next()? {
            if self.settings_waits(h, now) {
                break;
            }
            // PING, SETTINGS and RST_STREAM cost the application work for
            // free: past their rate the relay stops reading the client
            // until the next token is due (see `flood`). Not WINDOW_UPDATE:
            // it is passed on one for one and costs O(1) (some stacks send
            // one per DATA frame: h2, oghttp2, Go's).
            if !self.client.defences.take(h.kind, now) {
                break;
            }
            self.client_frame(h, frame, now)?;
            frames.handled(h);
        }
        self.client.peer.keep(frames);
        Ok(())
    }

    /// A client SETTINGS waits while `MAX_UNACKED_SETTINGS` of its SETTINGS
    /// are unacked: reading the client pauses, as for a flood bucket, and
    /// is tried again shortly (the application's acks do not wake it).
    fn settings_waits(&mut self, h: Head, now: Instant) -> bool {
        let waits = h.kind == wire::SETTINGS && h.flags & wire::ACK == 0 && self.settings.full();
        if waits {
            self.client.defences.pause_until(now + UNACKED_RETRY);
        }
        waits
    }

    /// One client frame: judged by the client's side, then handed to the
    /// work on its stream (`client/streams.rs`) by what it is.
    fn client_frame(&mut self, h: Head, frame: &[u8], now: Instant) -> Result<(), Failure> {
        let judged = self.client.judge(h, frame, self.app.handshake.alone)?;
        let (mut conn, mut kept) = self.conn_kept();
        match judged {
            Judged::Done => Ok(()),
            Judged::Fragment(block, fragment) => {
                conn.client_fragment(block, h, frame, fragment, now, &mut kept)
            }
            Judged::Data(data) => conn.client_data(h, frame, data, now, &mut kept),
            Judged::Reset => {
                conn.client_reset(h, frame, now, &mut kept);
                Ok(())
            }
            Judged::Priority(error) => conn.client_priority(h, frame, error, now, &mut kept),
            Judged::Credit(credit) => conn.client_credit(credit),
            Judged::WindowUpdate(credit) => {
                conn.client_window_update(h, frame, credit, now, &mut kept);
                Ok(())
            }
            Judged::Settings => conn.client_settings(h, &frame[wire::FRAME_HEADER..]),
            Judged::PingAck if conn.life.probe_acked(&frame[wire::FRAME_HEADER..]) => {
                conn.step(Input::Acked, now);
                Ok(())
            }
            Judged::SettingsAck => {
                // The client's ack of the application's SETTINGS (passed on,
                // the app's to pair): a lower stream limit now binds.
                conn.ends.settings.client_acked_streams();
                conn.ends.app.write.extend_from_slice(frame);
                Ok(())
            }
            Judged::PingAck | Judged::Pass => {
                conn.ends.app.write.extend_from_slice(frame);
                Ok(())
            }
        }
    }

    /// Does what a chapter asked for.
    fn carry_out(&mut self, next: Next, now: Instant) -> Result<(), Failure> {
        match next {
            Next::Done => Ok(()),
            Next::ClientFrames => self.client_frames(now),
        }
    }

    /// The parts the connection's life works on, for one step.
    fn conn(&mut self) -> Conn<'_> {
        self.conn_kept().0
    }

    /// What the connection's life works on, and beside it what the
    /// client's side keeps of its requests: the parts a client frame on a
    /// stream works on, for one frame.
    fn conn_kept(&mut self) -> (Conn<'_>, Kept<'_>) {
        let conn = Conn {
            ends: Ends {
                guard: self.guard,
                info: &self.info,
                streams: &mut self.streams,
                endings: &mut self.endings,
                client: &mut self.client.peer,
                app: &mut self.app.peer,
                window: &mut self.window,
                settings: &mut self.settings,
            },
            life: &mut self.life,
            ids: &mut self.client.ids,
            handshake: &mut self.app.handshake,
            locals: &mut self.locals,
        };
        let kept = Kept {
            forward: &mut self.forward,
            defences: &mut self.client.defences,
        };
        (conn, kept)
    }

    /// The parts a stream's ending works on, for one step.
    fn ends(&mut self) -> Ends<'_> {
        self.conn().ends
    }

    /// When the loop must wake next: the flood pause's end, the planned
    /// ends, the lifecycle's deadlines, the stall timers and the endings'
    /// bounds.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let l = self.guard.config().limits;
        let d = self.life.machine().deadlines();
        let mut next = [
            self.client.defences.paused_until(),
            self.endings.planned.front().map(|p| p.at),
            self.life.sweep_at(),
            self.life.close_deadline(),
            d.age,
            d.ack,
            d.grace,
            d.first_stream,
            d.idle,
        ]
        .into_iter()
        .flatten()
        .min();
        for id in &self.endings.stalled {
            if let Some(at) = self.streams.get(id).and_then(Stream::shut_since) {
                next = next.into_iter().chain([at + l.write_stall_timeout]).min();
            }
        }
        for &id in &self.endings.asked {
            next = next
                .into_iter()
                .chain(ending_due(&self.streams, l.end_timeout, id))
                .min();
        }
        next
    }

    /// The connection's stream count, told to the lifecycle when it goes
    /// to or from zero.
    pub(super) fn count_changed(&mut self, now: Instant) {
        let n = self.streams.len() + self.locals.len();
        if self.life.count_changed(n) {
            self.conn().step(Input::Streams(n), now);
        }
    }

    /// Charges what waits for the client to its connection window (see
    /// [`Window::clear_gate`]); the padding of a DATA frame it split is
    /// given back to the application.
    fn clear_gate(&mut self) {
        for (id, padding) in self.window.clear_gate(&mut self.client.peer.write) {
            wire::window_update(&mut self.app.peer.write, 0, padding);
            wire::window_update(&mut self.app.peer.write, id, padding);
            if let Some(s) = self.streams.get_mut(&id) {
                s.grow_window(i64::from(padding));
            }
        }
    }

    /// Whether to read the client and the application now. A side is not
    /// read while what waits for the other side passes the high-water mark.
    /// The guard's own answers to the client (refusals, window returns) wait
    /// in `to_client` too: a client that does not read is not read either;
    /// but while the client's window holds `to_client` back, the client is
    /// read further, for its WINDOW_UPDATEs.
    fn wants(&self) -> (bool, bool) {
        let held = self.window.holds_back(self.client.peer.write.len());
        let client_room = if held { BLOCKED_HIGH_WATER } else { HIGH_WATER };
        if self.life.closing() {
            // Only for the WINDOW_UPDATEs what waits at the gate needs.
            return (
                held && self.client.peer.read.len() < READ_BUF + MAX_FRAME as usize,
                false,
            );
        }
        (
            !self.life.closing()
                && self.app.peer.write.len() < HIGH_WATER
                && self.client.peer.write.len() < client_room
                && self.client.defences.paused_until().is_none()
                && !(self.app.handshake.pending && self.client.peer.read.len() >= REPLAY_MAX),
            // While an ending waits for the barrier's ack, the application
            // is read further (its acks and what it wrote before them), up
            // to the mark that also bounds a client whose window is shut.
            // One whose socket failed a write is read to its end whatever
            // the client takes: what is left is the kernel's buffer, and
            // only its end lets the connection's streams end.
            self.app.write_failed.is_some()
                || (!self.streams.holds_too_much()
                    && (self.client.peer.write.len() < HIGH_WATER
                        || (self.endings.awaits_ack()
                            && self.client.peer.write.len() < BLOCKED_HIGH_WATER))),
        )
    }
}
