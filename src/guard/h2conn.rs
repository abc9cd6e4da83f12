//! One downstream HTTP/2 connection: the h2 server side, its shutdown
//! sequence (max connection age, drain, idle, slow first request) and the
//! hand-off of each stream to [`super::stream`]. What to do when is decided
//! by the pure [`super::lifecycle`] machine; this module performs it.
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

use crate::timer::sleep_until_opt;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use h2::server::{Connection, SendResponse};
use h2::{Ping, PingPong, RecvStream};
use http::{HeaderValue, Request};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::conn::{ConnInfo, StreamCount};
use super::flood::Flood;
use super::grpc;
use super::headers::forwarded_for;
use super::lifecycle::{Action, Cause, Input, Lifecycle};
use super::rapid::PrematureResets;
use super::registry::Refused;
use super::sniff::{linger, Prefixed};
use super::stream::{self, StreamJob};
use super::upstream::H2Upstream;
use super::Inner;
use crate::metrics::{Limit, Reason};

/// Largest window h2 accepts (2^31-1); larger configured values are clamped.
const MAX_WINDOW: u32 = (1 << 31) - 1;

/// Most extra streams taken from h2's queue in one turn of the loop, so
/// timers and signals are still looked at between batches.
const ACCEPT_BATCH: usize = 256;

type Io = Flood<Prefixed<TcpStream>>;

/// What woke the connection loop.
enum Event {
    Stream(Box<(Request<RecvStream>, SendResponse<Bytes>)>),
    Failed(h2::Error),
    Closed,
    Input(Input),
    CountChanged,
    HardDeadline,
    /// Most streams were reset before they were answered (rapid reset).
    RapidReset,
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
/// (`poll_accept` is what h2's `accept()` polls; it is used directly so the
/// stream count can be checked right after each turn of the connection.)
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
        Poll::Pending if want_quiet && !conn.has_streams() => {
            Poll::Ready(Event::Input(Input::Quiet))
        }
        Poll::Pending => Poll::Pending,
    }
}

pub async fn serve(inner: Arc<Inner>, io: Prefixed<TcpStream>, info: ConnInfo) {
    let reclaim = io.reclaim();
    let io = Flood::new(io, inner.config.limits.flood, &inner.metrics);
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
        // RFC 8441: WebSockets over HTTP/2 (see `super::connect`).
        .enable_connect_protocol()
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
        inner.connector.clone(),
        l,
        inner.tasks.clone(),
    ));
    let count = Arc::new(StreamCount::default());
    // Whether the lifecycle was last told "no streams" (it starts idle).
    let mut told_empty = true;
    let resets = Arc::new(PrematureResets::new(l.max_pending_accept_reset_streams));
    // Whether the rapid-reset rule closed the connection.
    let mut calmed = false;
    let mut life = inner.lifecycle(&info);
    tracing::debug!(peer = %info.peer, conn = info.id, age_at = ?life.deadlines().age, "guard: HTTP/2 connection");
    let forwarded = forwarded_for(info.peer.ip());
    let shared = Shared {
        inner,
        upstream: &upstream,
        count: &count,
        resets: &resets,
        info,
        forwarded: &forwarded,
    };

    // The guard-wide signals, waited on for the whole connection: created
    // once, so a turn of the loop does not register and unregister waiters
    // on tokens every connection shares.
    let terminate = inner.terminate.cancelled();
    let goaway = inner.goaway.cancelled();
    let tripped = resets.tripped();
    tokio::pin!(terminate, goaway, tripped);
    loop {
        let d = life.deadlines();
        let want_quiet = life.wants_quiet();
        // Signals and timers first, so a busy connection cannot starve them;
        // the connection itself is polled on every turn. A change between
        // "no streams" and "some" is reported before anything else.
        let event = if told_empty != (count.get() == 0) {
            Event::CountChanged
        } else {
            tokio::select! {
            biased;
            _ = sleep_until_opt(d.close_by) => Event::HardDeadline,
            _ = &mut tripped, if !calmed => Event::RapidReset,
            _ = &mut terminate, if life.watches_terminate() => Event::Input(Input::Terminate),
            _ = &mut goaway, if life.watches_goaway() => Event::Input(Input::GoawayAll),
            _ = sleep_until_opt(d.age) => Event::Input(Input::AgeReached),
            _ = pong(&mut pings), if life.awaits_ack() => Event::Input(Input::Acked),
            _ = sleep_until_opt(d.ack) => Event::Input(Input::AckTimedOut),
            _ = sleep_until_opt(d.grace) => Event::Input(Input::GraceOver),
            _ = sleep_until_opt(d.first_stream) => Event::Input(Input::HeaderTimedOut),
            _ = sleep_until_opt(d.idle) => Event::Input(Input::IdleTimedOut),
            _ = count.emptied(), if !told_empty => Event::CountChanged,
            e = poll_fn(|cx| poll_connection(&mut conn, cx, want_quiet)) => e,
            }
        };
        let now = Instant::now();
        // Streams admitted in this turn (they may have ended already).
        let mut admitted = 0;
        let input = match event {
            Event::Stream(s) => {
                let (req, respond) = *s;
                admitted += usize::from(admit(&shared, &life, req, respond));
                // Take every stream h2 already has queued, so that streams a
                // caller opened and cancelled in one burst do not pile up as
                // pending-accept resets on a connection all callers share.
                let mut extra = 0;
                while extra < ACCEPT_BATCH {
                    match poll_fn(|cx| Poll::Ready(conn.poll_accept(cx))).await {
                        Poll::Ready(Some(Ok((req, respond)))) => {
                            // The one StreamAccepted below stands for the
                            // whole batch (its action must not be lost).
                            admitted += usize::from(admit(&shared, &life, req, respond));
                            extra += 1;
                        }
                        // Errors and the end are seen by the next poll.
                        _ => break,
                    }
                }
                Input::StreamAccepted
            }
            Event::Failed(e) => {
                tracing::debug!(peer = %info.peer, conn = info.id, error = %e, "guard: HTTP/2 connection failed");
                break;
            }
            Event::Closed => break,
            Event::HardDeadline => {
                tracing::debug!(peer = %info.peer, conn = info.id, "guard: closing deadline reached; dropping the connection");
                break;
            }
            Event::RapidReset => {
                tracing::warn!(
                    peer = %info.peer,
                    conn = info.id,
                    premature = resets.count(),
                    "guard: most streams on this connection were reset before they were answered (rapid reset); GOAWAY(ENHANCE_YOUR_CALM)"
                );
                inner.metrics.guard_limited(Limit::rapid_reset).inc();
                conn.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
                calmed = true;
                continue;
            }
            Event::CountChanged => {
                let n = count.get();
                if told_empty == (n == 0) {
                    // A stale wake-up: nothing the lifecycle cares about changed.
                    continue;
                }
                told_empty = n == 0;
                Input::Streams(n)
            }
            Event::Input(Input::AckTimedOut) => {
                tracing::info!(
                    peer = %info.peer,
                    conn = info.id,
                    timeout = ?l.goaway_ack_timeout,
                    "guard: no PING ack after GOAWAY; refusing new streams and sending the final GOAWAY once idle"
                );
                Input::AckTimedOut
            }
            Event::Input(i) => i,
        };
        match life.step(input, now) {
            None => {}
            Some(Action::Goaway(cause)) => {
                tracing::debug!(peer = %info.peer, conn = info.id, ?cause, "guard: GOAWAY");
                conn.graceful_shutdown();
                if let Some(reason) = metric_reason(cause) {
                    inner.record_goaway(reason);
                }
                // Queued behind h2's shutdown PING; its ack proves the final
                // GOAWAY went out.
                if let Some(p) = pings.as_mut() {
                    if let Err(e) = p.send_ping(Ping::opaque()) {
                        tracing::debug!(error = %e, "guard: could not queue the GOAWAY ack probe; relying on the timeout");
                        pings = None;
                    }
                }
            }
            Some(Action::EndStreams) => {
                tracing::debug!(peer = %info.peer, conn = info.id, "guard: max connection age grace over; ending streams");
                let streams =
                    inner
                        .registry
                        .connection_streams(info.id, now, inner.config.long_stream_age);
                inner.end_spread(streams, life.spread(), Reason::max_age);
            }
            // Sends GOAWAY(last processed stream, NO_ERROR) unless h2 already
            // sent that exact frame, then closes after flushing. Only asked
            // for when no stream is open: it would fail open streams.
            Some(Action::Close) => conn.abrupt_shutdown(h2::Reason::NO_ERROR),
        }
        if admitted > 0 && told_empty {
            // The connection is busy again (the idle timer stops), even if
            // those streams already ended: the loop's next turn then reports
            // "none" afresh, restarting the idle timer from now.
            told_empty = false;
            let action = life.step(Input::Streams(admitted), now);
            debug_assert!(action.is_none(), "a stream count never asks for an action");
        }
    }
    upstream.close();
}

/// What every stream of one connection shares.
struct Shared<'a> {
    inner: &'a Arc<Inner>,
    upstream: &'a Arc<H2Upstream>,
    /// The connection's stream count.
    count: &'a Arc<StreamCount>,
    /// The connection's premature resets.
    resets: &'a Arc<PrematureResets>,
    info: ConnInfo,
    /// The client's `X-Forwarded-For` entry, the same for every stream.
    forwarded: &'a HeaderValue,
}

/// Starts a stream task (true), or refuses the stream retryably (false).
fn admit(
    shared: &Shared<'_>,
    life: &Lifecycle,
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) -> bool {
    let Shared {
        inner,
        upstream,
        count,
        resets,
        info,
        forwarded,
    } = *shared;
    resets.accepted();
    if stream::already_reset(&mut respond) {
        // h2 read its RST_STREAM before the guard took it: nothing to
        // forward, and premature.
        resets.premature();
        return false;
    }
    let kind = super::body::request_kind(req.headers());
    let grpc = kind != super::body::Kind::Opaque;
    if life.refuses_streams() {
        // The client ignored GOAWAY(2^31-1). REFUSED_STREAM tells it the
        // request was not processed and is safe to retry.
        respond.send_reset(h2::Reason::REFUSED_STREAM);
        return false;
    }
    let registered = match inner.registry.try_register(info.id, grpc) {
        Ok(r) => r,
        Err(Refused::Terminating) => {
            refuse_draining(&mut respond, kind);
            return false;
        }
        // The process-wide cap: not processed, safe to retry (Envoy retries
        // refused-stream on the app when it fails open).
        Err(Refused::Full) => {
            respond.send_reset(h2::Reason::REFUSED_STREAM);
            return false;
        }
    };
    let count = count.enter();
    if super::connect::is_websocket(&req) {
        let task_inner = inner.clone();
        inner.tasks.spawn(async move {
            super::connect::proxy(task_inner, registered, req, respond, info).await;
            drop(count);
        });
        return true;
    }
    let job = StreamJob {
        inner: inner.clone(),
        upstream: upstream.clone(),
        registered,
        count,
        resets: resets.clone(),
        req,
        respond,
        peer: info.peer,
        forwarded: forwarded.clone(),
    };
    // Boxed: the stream's state is a few KiB, and a task moves its future
    // as it is wrapped and spawned; a box moves as one pointer.
    inner.tasks.spawn(Box::pin(stream::proxy(job)));
    true
}

/// The answer to a new stream while terminating: trailers-only UNAVAILABLE
/// for gRPC, REFUSED_STREAM (not processed, safe to retry) for others.
fn refuse_draining(respond: &mut SendResponse<Bytes>, kind: super::body::Kind) {
    match super::body::trailers_only(kind, grpc::REFUSED_MESSAGE) {
        Some(resp) => {
            if respond.send_response(resp, true).is_err() {
                respond.send_reset(h2::Reason::REFUSED_STREAM);
            }
        }
        None => respond.send_reset(h2::Reason::REFUSED_STREAM),
    }
}
