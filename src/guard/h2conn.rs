//! One downstream HTTP/2 connection: the h2 server side, its shutdown
//! sequence (max connection age, drain, idle, slow first request) and the
//! hand-off of each stream to [`super::stream`].
//!
//! The GOAWAY sequence: h2's `graceful_shutdown` sends GOAWAY(2^31-1,
//! NO_ERROR) and a PING; on the PING ack h2 itself sends GOAWAY(last
//! processed stream). h2 has no timeout for that ack and does not report it,
//! so the guard queues a PING of its own right after: h2 sends user PINGs
//! only once the shutdown PING is acked, so the ack of ours proves the final
//! GOAWAY is on the wire. If no ack comes within `goaway_ack_timeout`, the
//! guard refuses any new stream itself (REFUSED_STREAM, which is safe to
//! retry) and sends the final GOAWAY with `abrupt_shutdown(NO_ERROR)` once no
//! stream is left: `abrupt_shutdown` fails every open stream, so it is only
//! used when there are none.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use h2::server::{Connection, SendResponse};
use h2::{Ping, PingPong, RecvStream};
use http::Request;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use super::accept::ConnInfo;
use super::grpc;
use super::schedule::jittered_age;
use super::sniff::{linger, Prefixed};
use super::stream::{self, StreamJob};
use super::upstream::H2Upstream;
use super::Inner;
use crate::metrics::Reason;

/// Largest window h2 accepts (2^31-1); larger configured values are clamped.
const MAX_WINDOW: u32 = (1 << 31) - 1;

type Io = Prefixed<TcpStream>;

/// Why a connection is going away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    MaxAge,
    Drain,
    Idle,
}

impl Cause {
    /// The metrics label, for the causes the contract counts.
    fn reason(self) -> Option<Reason> {
        match self {
            Cause::MaxAge => Some(Reason::max_age),
            Cause::Drain => Some(Reason::drain),
            Cause::Idle => None,
        }
    }
}

/// Where the connection is in its shutdown sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Accepting streams.
    Serving,
    /// GOAWAY(2^31-1) and PING sent; waiting for the ack until `until`.
    AwaitingAck { until: Instant },
    /// No new stream should arrive; open ones run on, and the connection
    /// closes once they are done. `acked`: h2 sent the final GOAWAY itself.
    Closing { acked: bool },
}

/// What woke the connection loop.
enum Event {
    Stream(Box<(Request<RecvStream>, SendResponse<Bytes>)>),
    Failed(h2::Error),
    Closed,
    /// Closing, no stream left on either side: time for the final GOAWAY.
    Quiet,
    Goaway(Cause),
    Terminate,
    MaxAge,
    Acked,
    AckTimeout,
    GraceOver,
    HeaderTimeout,
    CountChanged,
    HardDeadline,
}

/// The connection's timers and flags, kept together so the loop reads plainly.
struct State {
    /// See [`Phase`].
    phase: Phase,
    /// Why the GOAWAY was sent, once it was.
    cause: Option<Cause>,
    /// Set when the jittered age passed, even if a drain GOAWAY came first:
    /// the grace still applies.
    max_age_reached: bool,
    /// When the max-age grace ends and the remaining streams are ended.
    grace_until: Option<Instant>,
    /// The grace ended and the streams were asked to end.
    grace_done: bool,
    /// Until the first request head arrives: slowloris bound.
    first_stream_by: Option<Instant>,
    /// Since when no stream has been open (None while some are).
    idle_since: Option<Instant>,
    /// `terminate_all` was seen.
    terminate_seen: bool,
    /// The final GOAWAY was queued by us (`abrupt_shutdown`).
    close_sent: bool,
    /// Stop polling and drop the connection at this point.
    close_by: Option<Instant>,
}

/// Decrements the connection's stream count when a stream task ends.
pub struct CountGuard(Arc<watch::Sender<usize>>);

impl Drop for CountGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn pong(pings: &mut Option<PingPong>) {
    match pings {
        Some(p) => {
            // An error means the connection is gone; the connection poll
            // reports that, so this branch just stays quiet.
            if poll_fn(|cx| p.poll_pong(cx)).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// Drives the connection and reports a new stream, its end, or quiet.
fn poll_connection(
    conn: &mut Connection<Io, Bytes>,
    cx: &mut Context<'_>,
    want_quiet: bool,
) -> Poll<Event> {
    match conn.poll_accept(cx) {
        Poll::Ready(Some(Ok(s))) => Poll::Ready(Event::Stream(Box::new(s))),
        Poll::Ready(Some(Err(e))) => Poll::Ready(Event::Failed(e)),
        Poll::Ready(None) => Poll::Ready(Event::Closed),
        // `has_streams` is false only once every stream frame left h2's
        // queues, so closing now loses nothing.
        Poll::Pending if want_quiet && !conn.has_streams() => Poll::Ready(Event::Quiet),
        Poll::Pending => Poll::Pending,
    }
}

pub async fn serve(inner: Arc<Inner>, io: Io, info: ConnInfo) {
    let reclaim = io.reclaim();
    drive(&inner, io, info).await;
    // The h2 connection is dropped: close the socket without an RST.
    if let Some(tcp) = reclaim.take() {
        linger(tcp, inner.config.limits.shutdown_timeout).await;
    }
    tracing::debug!(peer = %info.peer, conn = info.id, "guard: HTTP/2 connection closed");
}

async fn drive(inner: &Arc<Inner>, io: Io, info: ConnInfo) {
    let l = inner.config.limits;
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(l.max_concurrent_streams)
        .max_header_list_size(l.max_header_list_size)
        .initial_window_size(l.stream_window.min(MAX_WINDOW))
        .initial_connection_window_size(l.connection_window.min(MAX_WINDOW))
        .max_send_buffer_size(l.max_send_buffer_size)
        .max_pending_accept_reset_streams(l.max_pending_accept_reset_streams)
        .max_local_error_reset_streams(Some(l.max_local_error_reset_streams));
    let first_stream_by = info.accepted_at + l.header_read_timeout;
    let mut conn = match tokio::time::timeout_at(first_stream_by, builder.handshake(io)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::debug!(peer = %info.peer, error = %e, "guard: HTTP/2 handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(peer = %info.peer, "guard: no HTTP/2 SETTINGS within the header read timeout");
            return;
        }
    };
    let mut pings = conn.ping_pong();
    let upstream = Arc::new(H2Upstream::new(
        inner.config.upstream,
        l,
        inner.tasks.clone(),
    ));
    let (count_tx, mut count_rx) = watch::channel(0usize);
    let count_tx = Arc::new(count_tx);
    let age_at = inner
        .config
        .max_connection_age
        .map(|age| info.accepted_at + jittered_age(age, fastrand::f64()));
    // Connections accepted after `goaway_all` serve the short requests that
    // still arrive; they go away with `terminate_all`.
    let watch_goaway = !inner.goaway.is_cancelled();
    // A connection accepted while terminating goes away after answering its
    // first stream, not at once: a GOAWAY racing the client's first request
    // makes some clients (hyper, so tonic) fail that request with a
    // non-retryable error instead of receiving the retryable refusal.
    let defer_goaway = inner.terminate.is_cancelled();
    let mut st = State {
        phase: Phase::Serving,
        cause: None,
        max_age_reached: false,
        grace_until: None,
        grace_done: false,
        first_stream_by: Some(first_stream_by),
        idle_since: Some(Instant::now()),
        terminate_seen: false,
        close_sent: false,
        close_by: None,
    };
    tracing::debug!(peer = %info.peer, conn = info.id, ?age_at, "guard: HTTP/2 connection");

    loop {
        let count = *count_tx.borrow();
        let closing = matches!(st.phase, Phase::Closing { .. });
        let want_quiet = closing && !st.close_sent && count == 0;
        let ack_until = match st.phase {
            Phase::AwaitingAck { until } => Some(until),
            _ => None,
        };
        let idle_at = match st.phase {
            Phase::Serving => st.idle_since.map(|t| t + l.idle_timeout),
            _ => None,
        };
        let age = age_at.filter(|_| !st.max_age_reached);
        let grace = st.grace_until.filter(|_| !st.grace_done);
        // Signals and timers first, so a busy connection cannot starve them;
        // the connection itself is polled on every turn.
        let event = tokio::select! {
            biased;
            _ = sleep_until_opt(st.close_by) => Event::HardDeadline,
            _ = inner.terminate.cancelled(), if !st.terminate_seen => Event::Terminate,
            _ = inner.goaway.cancelled(), if watch_goaway && st.cause.is_none() => Event::Goaway(Cause::Drain),
            _ = sleep_until_opt(age) => Event::MaxAge,
            _ = pong(&mut pings), if ack_until.is_some() => Event::Acked,
            _ = sleep_until_opt(ack_until) => Event::AckTimeout,
            _ = sleep_until_opt(grace) => Event::GraceOver,
            _ = sleep_until_opt(st.first_stream_by) => Event::HeaderTimeout,
            _ = sleep_until_opt(idle_at) => Event::Goaway(Cause::Idle),
            _ = count_rx.changed() => Event::CountChanged,
            e = poll_fn(|cx| poll_connection(&mut conn, cx, want_quiet)) => e,
        };
        let now = Instant::now();
        match event {
            Event::Stream(s) => {
                let (req, respond) = *s;
                st.first_stream_by = None;
                admit(inner, &upstream, &count_tx, &st, info, req, respond);
                if st.terminate_seen && st.cause.is_none() {
                    start_goaway(inner, &mut conn, &mut pings, &mut st, Cause::Drain, now);
                }
            }
            Event::Failed(e) => {
                tracing::debug!(peer = %info.peer, conn = info.id, error = %e, "guard: HTTP/2 connection failed");
                break;
            }
            Event::Closed => break,
            Event::Quiet => {
                // Sends GOAWAY(last processed stream, NO_ERROR) unless h2
                // already sent that exact frame, then closes after flushing.
                conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                st.close_sent = true;
            }
            Event::Goaway(cause) => {
                if st.cause.is_none() {
                    start_goaway(inner, &mut conn, &mut pings, &mut st, cause, now);
                }
            }
            Event::Terminate => {
                st.terminate_seen = true;
                if st.cause.is_none() && !defer_goaway {
                    start_goaway(inner, &mut conn, &mut pings, &mut st, Cause::Drain, now);
                }
                // The drain's schedule ends the streams; nothing more here.
            }
            Event::MaxAge => {
                st.max_age_reached = true;
                if st.cause.is_none() {
                    start_goaway(inner, &mut conn, &mut pings, &mut st, Cause::MaxAge, now);
                } else if matches!(st.phase, Phase::Closing { .. }) && st.grace_until.is_none() {
                    st.grace_until = Some(now + inner.config.max_connection_age_grace);
                }
            }
            Event::Acked => enter_closing(inner, &mut st, true, now),
            Event::AckTimeout => {
                tracing::info!(
                    peer = %info.peer,
                    conn = info.id,
                    timeout = ?l.goaway_ack_timeout,
                    "guard: no PING ack after GOAWAY; refusing new streams and sending the final GOAWAY once idle"
                );
                enter_closing(inner, &mut st, false, now);
            }
            Event::GraceOver => {
                st.grace_done = true;
                tracing::debug!(peer = %info.peer, conn = info.id, streams = count, "guard: max connection age grace over; ending streams");
                inner.registry.end_connection(info.id, Reason::max_age);
                // Every stream bounds its own ending; this is the backstop.
                let bound = now + l.end_timeout + l.shutdown_timeout;
                st.close_by = Some(st.close_by.map_or(bound, |c| c.min(bound)));
            }
            Event::HeaderTimeout => {
                tracing::debug!(peer = %info.peer, conn = info.id, "guard: no request within the header read timeout; closing");
                st.first_stream_by = None;
                conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                st.close_sent = true;
                st.phase = Phase::Closing { acked: false };
            }
            Event::CountChanged => {
                let n = *count_rx.borrow_and_update();
                st.idle_since = if n == 0 { Some(now) } else { None };
            }
            Event::HardDeadline => {
                tracing::debug!(peer = %info.peer, conn = info.id, "guard: closing deadline reached; dropping the connection");
                break;
            }
        }
        // Nothing left to serve: flush and close within the bound.
        if matches!(st.phase, Phase::Closing { .. }) && *count_tx.borrow() == 0 {
            let bound = now + l.shutdown_timeout;
            st.close_by = Some(st.close_by.map_or(bound, |c| c.min(bound)));
        }
    }
    upstream.close();
}

/// GOAWAY(2^31-1) + PING now; the final GOAWAY follows the ack.
fn start_goaway(
    inner: &Inner,
    conn: &mut Connection<Io, Bytes>,
    pings: &mut Option<PingPong>,
    st: &mut State,
    cause: Cause,
    now: Instant,
) {
    st.cause = Some(cause);
    if cause == Cause::MaxAge {
        st.max_age_reached = true;
    }
    conn.graceful_shutdown();
    if let Some(reason) = cause.reason() {
        inner.record_goaway(reason);
    }
    // Queued behind h2's shutdown PING; its ack proves the final GOAWAY went out.
    if let Some(p) = pings.as_mut() {
        if let Err(e) = p.send_ping(Ping::opaque()) {
            tracing::debug!(error = %e, "guard: could not queue the GOAWAY ack probe; relying on the timeout");
            *pings = None;
        }
    }
    st.phase = Phase::AwaitingAck {
        until: now + inner.config.limits.goaway_ack_timeout,
    };
}

/// No new stream will arrive: start the max-age grace if it applies.
fn enter_closing(inner: &Inner, st: &mut State, acked: bool, now: Instant) {
    st.phase = Phase::Closing { acked };
    if st.max_age_reached && st.grace_until.is_none() {
        st.grace_until = Some(now + inner.config.max_connection_age_grace);
    }
}

/// Starts a stream task, or refuses the stream retryably.
fn admit(
    inner: &Arc<Inner>,
    upstream: &Arc<H2Upstream>,
    count: &Arc<watch::Sender<usize>>,
    st: &State,
    info: ConnInfo,
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) {
    let grpc = grpc::is_grpc(req.headers());
    if st.phase == (Phase::Closing { acked: false }) {
        // The client ignored GOAWAY(2^31-1). REFUSED_STREAM tells it the
        // request was not processed and is safe to retry.
        respond.send_reset(h2::Reason::REFUSED_STREAM);
        return;
    }
    let Some(registered) = inner.registry.register(info.id, grpc) else {
        refuse_draining(&mut respond, grpc);
        return;
    };
    count.send_modify(|n| *n += 1);
    let job = StreamJob {
        inner: inner.clone(),
        upstream: upstream.clone(),
        registered,
        count: CountGuard(count.clone()),
        req,
        respond,
        peer: info.peer,
    };
    inner.tasks.spawn(stream::proxy(job));
}

/// The answer to a new stream while terminating: trailers-only UNAVAILABLE
/// for gRPC, REFUSED_STREAM (not processed, safe to retry) for others.
fn refuse_draining(respond: &mut SendResponse<Bytes>, grpc: bool) {
    if grpc {
        let resp = grpc::unavailable_response(grpc::REFUSED_MESSAGE);
        if respond.send_response(resp, true).is_err() {
            respond.send_reset(h2::Reason::REFUSED_STREAM);
        }
    } else {
        respond.send_reset(h2::Reason::REFUSED_STREAM);
    }
}
