//! One HTTP/2 stream through the guard: the request flows downstream →
//! upstream and the response upstream → downstream, each with flow control
//! end to end (a chunk is released to the sender only once the receiver's
//! window took it), and the graceful end.
//!
//! Invariants, whatever ends the stream:
//! - **Nothing received is dropped.** Every byte the application sent and
//!   the guard received is forwarded; a message in progress is finished
//!   (within `end_timeout`) before anything ends the stream.
//! - **The application's own answer wins.** If its trailers (or END_STREAM,
//!   or its own RST_STREAM) arrive, they are what the client gets; the
//!   guard's `grpc-status: 14` is only ever sent where the application has
//!   not finished.
//! - **Degraded paths stay retryable.** Where the application did not answer
//!   (no response head), a gRPC client gets a trailers-only UNAVAILABLE and
//!   an HTTP client a 503 or REFUSED_STREAM; where a response cannot reach a
//!   message boundary in time, RST_STREAM(REFUSED_STREAM), which gRPC maps to
//!   UNAVAILABLE. CANCEL is only ever passed on from a peer.
//!
//! The graceful end of a gRPC stream, once asked: everything received is
//! forwarded and the message in progress is completed. The stream then ends
//! in the application's first pause: at a message boundary, when nothing
//! more has arrived for `BURST_GAP` (2 ms) after a message (a producer that
//! just wrote is between writes, so the cancel that follows cannot catch a
//! message on its way). An application that was already quiet gets up to
//! `end_settle` to write once more, so the end lands right after a write
//! rather than at a random moment that may meet one. Past `end_timeout` a
//! stream at a boundary is ended there (a producer that never pauses for
//! 2 ms: what it handed its transport after the cancel left is lost, which
//! no proxy can avoid without the application's help), and one
//! mid-message is reset.
//!
//! A stream is marked long-lived once its response carried two messages
//! (see [`super::registry`]): a drain ends only such streams early.

use crate::timer::sleep_until_opt;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::header::{HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Request, Response, StatusCode};

use super::body::{request_kind, response_kind, trailers_only, Boundaries, End, Kind};
use super::conn::CountGuard;
use super::grpc;
use super::headers::{append_forwarded_for, strip_hop_by_hop};
use super::rapid::PrematureResets;
use super::registry::{Registered, StreamCtl};
use super::signals;
use super::upstream::{Barrier, H2Upstream};
use super::Inner;
use crate::metrics::{Code, Reason};

/// Everything one stream task needs.
pub struct StreamJob {
    /// Limits, metrics and counters.
    pub inner: Arc<Inner>,
    /// The application connections of this downstream connection.
    pub upstream: Arc<H2Upstream>,
    /// The stream's entry in the registry; dropping it unregisters.
    pub registered: Registered,
    /// The connection's stream count; dropping it decrements.
    pub count: CountGuard,
    /// The connection's streams reset before they were forwarded.
    pub resets: Arc<PrematureResets>,
    /// The request as the client sent it.
    pub req: Request<RecvStream>,
    /// Where the response goes.
    pub respond: SendResponse<Bytes>,
    /// The client, for logs.
    pub peer: SocketAddr,
    /// The client as its `x-forwarded-for` entry.
    pub forwarded: HeaderValue,
}

/// Whether the client has reset the stream (checked without waiting).
pub fn already_reset(respond: &mut SendResponse<Bytes>) -> bool {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    respond.poll_reset(&mut cx).is_ready()
}

/// How a stream ended, for metrics and logs.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The application finished the response (its own status, whatever it is).
    Completed,
    /// The guard ended it gracefully (trailers or trailers-only).
    Ended(Reason),
    /// Ended before it reached the application: refused, safe to retry.
    Refused,
    /// The client reset it or went away.
    ClientGone,
    /// The application could not be reached or failed the stream.
    UpstreamFailed,
    /// No safe end point in time: reset (retryably for gRPC).
    Reset,
}

/// Why forwarding a chunk stopped.
enum SendError {
    /// The receiver reset the stream or the connection failed.
    Gone,
    /// The ending's deadline fired first.
    Interrupted,
    /// The receiver took nothing for `write_stall_timeout`.
    Stalled,
}

/// After a message, this long without more data means the application
/// paused between writes: the stream may end there (after the PING round
/// trip, which collects whatever it had already queued). Short, because the
/// end should come as soon after a write as possible: a producer's next
/// write is then furthest away.
pub(super) const BURST_GAP: Duration = Duration::from_millis(2);

/// Longest wait for the PING round trip before an ending goes ahead anyway.
pub(super) const BARRIER_WAIT: Duration = Duration::from_millis(50);

/// A stream task. Its state is what an open stream costs in memory, so what
/// is only needed for a moment (the request side, the heads) does not stay
/// in it (see `docs/benchmarks.md`, "How the guard's cost came down"). Not an `async fn`: one keeps its
/// arguments twice in its state (as given, and moved into the body), and
/// the job is 400 bytes; an `async move` block uses them in place.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn would hold the job twice"
)]
pub fn proxy(mut job: StreamJob) -> impl Future<Output = ()> + Send {
    async move {
        // Reset before the guard did anything with it: not forwarded, and
        // counted against the connection (rapid reset).
        if already_reset(&mut job.respond) {
            job.resets.premature();
            return;
        }
        let started = Instant::now();
        let ctl = job.registered.ctl.clone();
        let id = job.respond.stream_id().as_u32();
        let path = job.req.uri().path().to_string();
        let protocol = if ctl.grpc {
            crate::metrics::StreamProtocol::grpc
        } else {
            crate::metrics::StreamProtocol::http
        };
        let mut sig = job.inner.signals.start(ctl.grpc, &path, protocol);
        let outcome = run(
            &job.inner,
            &job.upstream,
            &ctl,
            job.req,
            &mut job.respond,
            &job.forwarded,
            &mut sig,
        )
        .await;
        if outcome == Outcome::ClientGone
            && !ctl.answered()
            && started.elapsed() < super::rapid::PREMATURE_LIFETIME
        {
            job.resets.premature();
        }
        if let Some(s) = sig.as_mut() {
            record_outcome(s, ctl.grpc, &outcome);
        }
        drop(sig);
        let peer = job.peer;
        match &outcome {
            Outcome::Ended(reason) => job.inner.record_termination(*reason, protocol),
            Outcome::Reset => {
                tracing::warn!(
                    %peer, stream = id, %path,
                    "guard: stream could not reach a safe end point in time; reset (REFUSED_STREAM for gRPC: retryable)"
                );
                if let Some(reason) = ctl.reason() {
                    job.inner.record_ungraceful(reason, protocol);
                }
            }
            _ => {}
        }
        tracing::trace!(%peer, stream = id, %path, ?outcome, "guard: stream done");
        drop(job.registered);
        drop(job.count);
    }
}

/// What the client got, for the guard's request signals, where the stream's
/// end decided it rather than the application's head or trailers. A stream
/// the guard ended itself, gracefully or by a reset, is not the
/// application's outcome: it is left out of the request counter (the
/// ending is counted by `record_termination` or `record_ungraceful`).
pub(super) fn record_outcome(s: &mut signals::Request, grpc: bool, outcome: &Outcome) {
    match outcome {
        Outcome::Completed => {}
        // gRPC: the guard's `grpc-status: 14`; SSE: a clean end of the body.
        // REFUSED_STREAM: the ending found no safe point in time.
        Outcome::Ended(_) | Outcome::Reset => s.ended_by_guard(),
        Outcome::Refused => s.answered_by_guard(Code::UNAVAILABLE, StatusCode::SERVICE_UNAVAILABLE),
        Outcome::UpstreamFailed if grpc => s.code_if_unset(Code::UNAVAILABLE),
        Outcome::UpstreamFailed => s.status_if_unset(StatusCode::BAD_GATEWAY),
        Outcome::ClientGone if grpc => s.code_if_unset(Code::CANCELLED),
        Outcome::ClientGone => {}
    }
}

/// Not an `async fn`, so the request is kept once (see [`proxy`]).
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn would hold the request twice"
)]
fn run<'a>(
    inner: &'a Inner,
    upstream: &'a H2Upstream,
    ctl: &'a StreamCtl,
    req: Request<RecvStream>,
    respond: &'a mut SendResponse<Bytes>,
    forwarded: &'a HeaderValue,
    sig: &'a mut Option<signals::Request>,
) -> impl Future<Output = Outcome> + 'a {
    async move {
        let l = &inner.config.limits;
        let kind = request_kind(req.headers());

        // 1. A slot on an application connection.
        let mut lease = match tokio::select! {
            biased;
            _ = poll_fn(|cx| respond.poll_reset(cx)) => return Outcome::ClientGone,
            (reason, _) = ctl.ended() => {
                // Nothing reached the application yet.
                return match end_trailers_only(respond, kind, reason) {
                    Some(outcome) => outcome,
                    None => {
                        respond.send_reset(h2::Reason::REFUSED_STREAM);
                        Outcome::Refused
                    }
                };
            }
            r = upstream.ready() => r,
        } {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "guard: cannot reach the application");
                return fail_before_response(respond, kind, grpc::UPSTREAM_UNAVAILABLE_MESSAGE);
            }
        };

        // 2. The request head; the body follows in `pump_request`.
        let (response, request_body) = match send_head(req, &mut lease.sender, forwarded) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "guard: application connection refused the request");
                return fail_before_response(respond, kind, grpc::UPSTREAM_UNAVAILABLE_MESSAGE);
            }
        };

        let response_side =
            respond_side(ctl, kind, respond, response, l, lease.barrier.clone(), sig);
        tokio::pin!(response_side);
        // The request side is boxed, and freed once the request is over: a
        // long response (a server stream) does not carry its state.
        let over = match request_body {
            Some((body, up_send)) => {
                let mut request_side = Box::pin(pump_request(body, up_send));
                tokio::select! {
                    biased;
                    // The response is over: the request side has nothing left
                    // to do, and is dropped here.
                    outcome = &mut response_side => Some(outcome),
                    () = &mut request_side => None,
                }
            }
            None => None,
        };
        let outcome = match over {
            Some(outcome) => outcome,
            None => response_side.await,
        };
        // Dropping the upstream handles of an unfinished stream resets it with
        // CANCEL: the application stops producing for a client that is gone.
        // The lease is dropped with it, freeing the slot.
        drop(lease);
        outcome
    }
}

/// Sends the request head upstream: hop-by-hop headers stripped and the
/// client appended to `x-forwarded-for`. Returns the response to come and,
/// unless the head ended the request, its body with the upstream stream it
/// goes to. Not async: the head is not kept in the stream's state.
fn send_head(
    req: Request<RecvStream>,
    sender: &mut h2::client::SendRequest<Bytes>,
    forwarded: &HeaderValue,
) -> Result<(h2::client::ResponseFuture, RequestBody), h2::Error> {
    let (mut head, body) = req.into_parts();
    strip_hop_by_hop(&mut head.headers);
    append_forwarded_for(&mut head.headers, forwarded);
    let done = body.is_end_stream();
    let (response, send) = sender.send_request(Request::from_parts(head, ()), done)?;
    Ok((response, (!done).then_some((body, send))))
}

/// A request body still to forward: downstream, and the upstream stream.
type RequestBody = Option<(RecvStream, SendStream<Bytes>)>;

/// Answers a gRPC (or gRPC-Web) stream that never reached the application,
/// or that the application never answered, with a trailers-only
/// UNAVAILABLE. None for requests that are not gRPC.
fn end_trailers_only(
    respond: &mut SendResponse<Bytes>,
    kind: Kind,
    reason: Reason,
) -> Option<Outcome> {
    let resp = trailers_only(kind, grpc::end_message(reason))?;
    Some(match respond.send_response(resp, true) {
        Ok(_) => Outcome::Ended(reason),
        Err(_) => Outcome::ClientGone,
    })
}

/// A plain HTTP answer of the guard's own, with an empty body.
fn status_only(status: StatusCode) -> Response<()> {
    let mut r = Response::new(());
    *r.status_mut() = status;
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("0"));
    }
    r
}

/// The application did not answer: UNAVAILABLE for gRPC, 502 for others.
fn fail_before_response(
    respond: &mut SendResponse<Bytes>,
    kind: Kind,
    message: &'static str,
) -> Outcome {
    let resp = trailers_only(kind, message).unwrap_or_else(|| status_only(StatusCode::BAD_GATEWAY));
    if respond.send_response(resp, true).is_err() {
        return Outcome::ClientGone;
    }
    Outcome::UpstreamFailed
}

/// Resolves `end_timeout` after the stream was asked to end.
async fn end_deadline(ctl: &StreamCtl, end_timeout: Duration) {
    let (_, at) = ctl.ended().await;
    tokio::time::sleep_until(at + end_timeout).await;
}

/// Sends `data` within the receiver's flow-control window: capacity is
/// reserved for the chunk and only what the window grants is handed to h2,
/// so h2 never buffers beyond the window. A receiver that grants nothing
/// for `stall` is given up on. `interrupt` makes the wait that ends it
/// early; it is only made (and boxed) when the window is full, so the usual
/// chunk carries neither it nor its timers in the stream's state.
async fn send_flow_controlled<F: Future<Output = ()>>(
    stream: &mut SendStream<Bytes>,
    mut data: Bytes,
    make_interrupt: impl Fn() -> F,
    stall: Duration,
) -> Result<(), SendError> {
    let mut interrupt: Option<std::pin::Pin<Box<F>>> = None;
    while !data.is_empty() {
        stream.reserve_capacity(data.len());
        // h2 assigns what the windows allow at once: the usual case (a
        // small message, open windows) sends without waiting, timers or
        // interrupts.
        let ready = stream.capacity();
        if ready > 0 {
            let n = ready.min(data.len());
            stream
                .send_data(data.split_to(n), false)
                .map_err(|_| SendError::Gone)?;
            continue;
        }
        let interrupt = interrupt.get_or_insert_with(|| Box::pin(make_interrupt()));
        let granted = tokio::select! {
            biased;
            _ = interrupt.as_mut() => return Err(SendError::Interrupted),
            _ = tokio::time::sleep(stall) => return Err(SendError::Stalled),
            g = poll_fn(|cx| {
                if stream.poll_reset(cx).is_ready() {
                    return Poll::Ready(Err(SendError::Gone));
                }
                match stream.poll_capacity(cx) {
                    Poll::Ready(Some(Ok(n))) if n > 0 => Poll::Ready(Ok(n)),
                    Poll::Ready(Some(Err(_))) | Poll::Ready(None) => Poll::Ready(Err(SendError::Gone)),
                    _ if stream.capacity() > 0 => Poll::Ready(Ok(stream.capacity())),
                    _ => Poll::Pending,
                }
            }) => g?,
        };
        let n = granted.min(data.len());
        stream
            .send_data(data.split_to(n), false)
            .map_err(|_| SendError::Gone)?;
    }
    Ok(())
}

/// Request body and trailers, downstream → upstream, until done (or the
/// response is over: the caller then drops it).
async fn pump_request(mut body: RecvStream, mut up: SendStream<Bytes>) {
    loop {
        let next = tokio::select! {
            biased;
            // The application no longer reads the request (it answered, or reset).
            _ = poll_fn(|cx| up.poll_reset(cx)) => return,
            d = body.data() => d,
        };
        match next {
            Some(Ok(chunk)) => {
                let len = chunk.len();
                let sent =
                    send_flow_controlled(&mut up, chunk, std::future::pending, Duration::MAX).await;
                if sent.is_err() {
                    return;
                }
                // Only now may the client send more: end-to-end backpressure.
                let _ = body.flow_control().release_capacity(len);
            }
            Some(Err(_)) => {
                // The client reset the stream (or its connection failed).
                up.send_reset(h2::Reason::CANCEL);
                return;
            }
            None => {
                match body.trailers().await {
                    Ok(Some(mut t)) => {
                        strip_hop_by_hop(&mut t);
                        let _ = up.send_trailers(t);
                    }
                    Ok(None) => {
                        let _ = up.send_data(Bytes::new(), true);
                    }
                    Err(_) => up.send_reset(h2::Reason::CANCEL),
                }
                return;
            }
        }
    }
}

/// The response head and body, upstream → downstream, and the graceful end.
async fn respond_side(
    ctl: &StreamCtl,
    kind: Kind,
    respond: &mut SendResponse<Bytes>,
    mut response: h2::client::ResponseFuture,
    l: &super::Limits,
    barrier: Arc<Barrier>,
    sig: &mut Option<signals::Request>,
) -> Outcome {
    // The head. Asked to end before the application answered: at max age a
    // gRPC stream gets its trailers-only answer at once (the age bound);
    // in a drain (only ever at its deadline for unanswered calls) the
    // application gets `end_timeout` to answer first. In a block: the head
    // is not kept beside the body's pump.
    let (body, down, bounds) = {
        let mut asked: Option<Reason> = None;
        let head = loop {
            tokio::select! {
                biased;
                _ = poll_fn(|cx| respond.poll_reset(cx)) => return Outcome::ClientGone,
                (reason, _) = ctl.ended(), if asked.is_none() => {
                    if reason == Reason::max_age {
                        if let Some(outcome) = end_trailers_only(respond, kind, reason) {
                            return outcome;
                        }
                    }
                    asked = Some(reason);
                }
                _ = end_deadline(ctl, l.end_timeout), if asked.is_some() => {
                    let reason = asked.unwrap_or(Reason::drain);
                    return match end_trailers_only(respond, kind, reason) {
                        Some(outcome) => outcome,
                        None => match respond.send_response(status_only(StatusCode::SERVICE_UNAVAILABLE), true) {
                            Ok(_) => Outcome::Refused,
                            Err(_) => Outcome::ClientGone,
                        },
                    };
                }
                r = &mut response => break r,
            }
        };
        match answer_head(ctl, kind, respond, head, sig) {
            Ok(started) => started,
            Err(outcome) => return outcome,
        }
    };
    let mut pump = Pump {
        ctl,
        body,
        down,
        bounds,
        l,
        barrier,
        sig,
    };
    pump.run().await
}

/// Passes the application's response head on. Returns the body to pump, the
/// client's side of it and its message boundaries, or how the stream ended
/// (the head ended it, or it failed). Not async: the head is not kept in the
/// stream's state.
fn answer_head(
    ctl: &StreamCtl,
    kind: Kind,
    respond: &mut SendResponse<Bytes>,
    head: Result<Response<RecvStream>, h2::Error>,
    sig: &mut Option<signals::Request>,
) -> Result<(RecvStream, SendStream<Bytes>, Boundaries), Outcome> {
    let (mut parts, body) = match head {
        Ok(r) => r.into_parts(),
        Err(e) => return Err(upstream_failed_before_response(respond, kind, e, sig)),
    };
    if let Some(s) = sig.as_mut() {
        s.head(parts.status, &parts.headers);
    }
    strip_hop_by_hop(&mut parts.headers);
    // Framing is only followed where request and response agree on it.
    let bounds = Boundaries::new(response_kind(kind, &parts.headers));
    let done = body.is_end_stream();
    let down = match respond.send_response(Response::from_parts(parts, ()), done) {
        Ok(s) => s,
        Err(_) => return Err(Outcome::ClientGone),
    };
    ctl.set_answered();
    if done {
        return Err(Outcome::Completed);
    }
    Ok((body, down, bounds))
}

/// The application failed the stream before answering.
fn upstream_failed_before_response(
    respond: &mut SendResponse<Bytes>,
    kind: Kind,
    e: h2::Error,
    sig: &mut Option<signals::Request>,
) -> Outcome {
    match e.reason() {
        // The application itself reset the stream: pass its reason on, so
        // REFUSED_STREAM stays retryable and its own CANCEL stays CANCEL.
        Some(reason) if e.is_reset() && e.is_remote() => {
            if let Some(s) = sig.as_mut() {
                s.reset(reason);
            }
            respond.send_reset(reason);
            Outcome::UpstreamFailed
        }
        // Refused on our side of the application connection (its GOAWAY
        // came first, or the connection broke): the application never
        // answered, so the client gets a retryable answer of the guard's own.
        _ => {
            tracing::debug!(error = %e, "guard: application connection failed before the response");
            fail_before_response(respond, kind, grpc::UPSTREAM_LOST_MESSAGE)
        }
    }
}

/// What woke the response pump.
enum Next {
    ClientGone,
    End(Reason),
    Timeout,
    Forced,
    Quiet,
    Flushed,
    Data(Option<Result<Bytes, h2::Error>>),
}

/// The response body of one stream, application → client.
struct Pump<'a> {
    ctl: &'a StreamCtl,
    body: RecvStream,
    down: SendStream<Bytes>,
    /// Where the body may be ended (gRPC messages, SSE events), if anywhere.
    bounds: Boundaries,
    l: &'a super::Limits,
    /// PING round trips on the application connection: before the end,
    /// everything already on its way is let arrive.
    barrier: Arc<Barrier>,
    /// The request's signals (None when they are off).
    sig: &'a mut Option<signals::Request>,
}

impl Pump<'_> {
    async fn run(&mut self) -> Outcome {
        let (ctl, l) = (self.ctl, self.l);
        let endable = self.bounds.endable();
        // Messages (or events) the response carried.
        let mut messages = 0u64;
        // Set once the stream is asked to end.
        let mut ending: Option<Reason> = None;
        // When the application last sent data.
        let mut last_data: Option<Instant> = None;
        // While ending, at a boundary: end here unless data arrives first.
        let mut quiet_at: Option<Instant> = None;
        // While ending, quiet: the PING round trip that lets anything the
        // application already wrote arrive before the end.
        let barrier = self.barrier.clone();
        let mut flush: Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>>> = None;
        // Past the ending's bound: end at the very next boundary, before this.
        let mut forced_by: Option<Instant> = None;
        loop {
            let next = tokio::select! {
                biased;
                _ = poll_fn(|cx| self.down.poll_reset(cx)) => Next::ClientGone,
                (reason, _) = ctl.ended(), if ending.is_none() => Next::End(reason),
                _ = end_deadline(ctl, l.end_timeout), if ending.is_some() && forced_by.is_none() => Next::Timeout,
                _ = sleep_until_opt(forced_by), if forced_by.is_some() => Next::Forced,
                // Data first: nothing received is left behind by the timers.
                d = self.body.data() => Next::Data(d),
                _ = sleep_until_opt(quiet_at), if quiet_at.is_some() => Next::Quiet,
                _ = async { if let Some(f) = flush.as_mut() { f.await } }, if flush.is_some() => Next::Flushed,
            };
            match next {
                Next::ClientGone => return Outcome::ClientGone,
                Next::End(reason) => {
                    ending = Some(reason);
                    if endable && self.bounds.at_boundary() {
                        let now = Instant::now();
                        quiet_at = Some(match last_data {
                            // It just wrote: end in its pause.
                            Some(t) if now.saturating_duration_since(t) < BURST_GAP => {
                                t + BURST_GAP
                            }
                            // Quiet already: give it a moment to write once more.
                            _ => now + l.end_settle,
                        });
                    }
                }
                Next::Quiet => {
                    quiet_at = None;
                    if ending.is_some() {
                        let b = barrier.clone();
                        // Bounded: a slow PING answer must not hold the
                        // ending (and every other on that connection) back.
                        flush = Some(Box::pin(async move {
                            let _ = tokio::time::timeout(BARRIER_WAIT, b.round_trip()).await;
                        }));
                    }
                }
                Next::Flushed => {
                    flush = None;
                    if let Some(reason) = ending {
                        return self.end_with_trailers(reason);
                    }
                }
                Next::Timeout => match ending {
                    // A producer that never paused: end at this boundary...
                    Some(reason) if endable && self.bounds.at_boundary() => {
                        return self.end_with_trailers(reason)
                    }
                    // ...or at the next one, within one more bound.
                    Some(_) if endable && forced_by.is_none() => {
                        forced_by = Some(Instant::now() + l.end_timeout);
                    }
                    _ => return self.reset(),
                },
                Next::Forced => return self.reset(),
                Next::Data(Some(Ok(chunk))) => {
                    let len = chunk.len();
                    last_data = Some(Instant::now());
                    if endable {
                        messages += self.bounds.consume(&chunk);
                        if messages >= 2 {
                            ctl.set_long_lived();
                        }
                        if let Some(s) = self.sig.as_mut() {
                            s.messages(messages);
                        }
                        if ending.is_some() {
                            // More came: wait for the next pause.
                            flush = None;
                            quiet_at = self
                                .bounds
                                .at_boundary()
                                .then(|| Instant::now() + BURST_GAP);
                        }
                        if let (Some(reason), Some(_)) = (ending, forced_by) {
                            if self.bounds.at_boundary() {
                                // Forced: this chunk completes a message; end
                                // right after it.
                                return match self.forward(chunk, len).await {
                                    Ok(()) => self.end_with_trailers(reason),
                                    Err(outcome) => outcome,
                                };
                            }
                        }
                    }
                    if let Err(outcome) = self.forward(chunk, len).await {
                        return outcome;
                    }
                }
                Next::Data(None) => return self.finish(ending.is_some()).await,
                Next::Data(Some(Err(e))) => return self.upstream_failed(e),
            }
        }
    }

    /// Forwards one chunk within the client's window, then lets the
    /// application send as much more (end-to-end backpressure). Asked to end
    /// while blocked here, the ending's bound still limits the wait.
    async fn forward(&mut self, chunk: Bytes, len: usize) -> Result<(), Outcome> {
        let l = self.l;
        let ctl = self.ctl;
        let interrupt = || async move {
            end_deadline(ctl, l.end_timeout).await;
            // A forced end has one more bound.
            tokio::time::sleep(l.end_timeout).await;
        };
        match send_flow_controlled(&mut self.down, chunk, interrupt, l.write_stall_timeout).await {
            Ok(()) => {}
            Err(SendError::Gone) => return Err(Outcome::ClientGone),
            Err(SendError::Interrupted) => return Err(self.reset()),
            Err(SendError::Stalled) => {
                tracing::info!(timeout = ?l.write_stall_timeout, "guard: the client took no data; resetting its stream");
                self.down.send_reset(h2::Reason::CANCEL);
                return Err(Outcome::ClientGone);
            }
        }
        let _ = self.body.flow_control().release_capacity(len);
        Ok(())
    }

    /// The guard's own end at a boundary: `grpc-status: 14` trailers for
    /// gRPC, the trailer frame for gRPC-Web, the body's end for SSE; a reset
    /// for anything else.
    fn end_with_trailers(&mut self, reason: Reason) -> Outcome {
        match self.send_end(grpc::end_message(reason)) {
            Some(true) => Outcome::Ended(reason),
            Some(false) => Outcome::ClientGone,
            None => self.reset(),
        }
    }

    /// Sends the guard's last words for this body kind: Some(sent), or None
    /// when the body cannot be ended in-protocol.
    fn send_end(&mut self, message: &'static str) -> Option<bool> {
        Some(match self.bounds.ending(message)? {
            End::Trailers(t) => self.down.send_trailers(t).is_ok(),
            End::Last(data) => self.down.send_data(data, true).is_ok(),
        })
    }

    /// No safe end point: REFUSED_STREAM for gRPC (clients read it as
    /// UNAVAILABLE and reconnect), CANCEL for other bodies (an aborted
    /// response, never one that looks complete).
    fn reset(&mut self) -> Outcome {
        let grpc = matches!(self.bounds.kind(), Kind::Grpc | Kind::GrpcWeb { .. });
        let reason = if grpc || self.ctl.grpc {
            h2::Reason::REFUSED_STREAM
        } else {
            h2::Reason::CANCEL
        };
        self.down.send_reset(reason);
        Outcome::Reset
    }

    /// The application's body ended: its trailers (or END_STREAM) go to the
    /// client as they are, ending or not.
    async fn finish(&mut self, ending: bool) -> Outcome {
        let l = self.l;
        let trailers = tokio::select! {
            biased;
            _ = poll_fn(|cx| self.down.poll_reset(cx)) => return Outcome::ClientGone,
            _ = end_deadline(self.ctl, l.end_timeout), if ending => return self.reset(),
            t = self.body.trailers() => t,
        };
        match trailers {
            Ok(Some(t)) => self.forward_trailers(t),
            Ok(None) => match self.down.send_data(Bytes::new(), true) {
                Ok(()) => Outcome::Completed,
                Err(_) => Outcome::ClientGone,
            },
            Err(e) => self.upstream_failed(e),
        }
    }

    fn forward_trailers(&mut self, mut t: HeaderMap) -> Outcome {
        if let Some(s) = self.sig.as_mut() {
            s.trailers(&t);
        }
        strip_hop_by_hop(&mut t);
        match self.down.send_trailers(t) {
            Ok(()) => Outcome::Completed,
            Err(_) => Outcome::ClientGone,
        }
    }

    /// The application's side failed after the response started.
    fn upstream_failed(&mut self, e: h2::Error) -> Outcome {
        tracing::debug!(error = %e, "guard: application failed the stream mid-response");
        if let Some(reason) = e.reason().filter(|_| e.is_reset() && e.is_remote()) {
            // The application's own reset, passed on as it is.
            if let Some(s) = self.sig.as_mut() {
                s.reset(reason);
            }
            self.down.send_reset(reason);
            return Outcome::UpstreamFailed;
        }
        if self.bounds.at_boundary() {
            // Between messages the client can still get a clean, retryable end.
            return match self.send_end(grpc::UPSTREAM_LOST_MESSAGE) {
                Some(true) => Outcome::UpstreamFailed,
                Some(false) => Outcome::ClientGone,
                None => {
                    self.reset();
                    Outcome::UpstreamFailed
                }
            };
        }
        self.reset();
        Outcome::UpstreamFailed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_guards_own_endings_are_not_the_applications_outcomes() {
        let m = crate::metrics::Metrics::new();
        let s = signals::Signals::new(signals::SignalSettings::default(), m.clone());
        let path = "/shop.Feed/Watch";
        let p = crate::metrics::StreamProtocol::grpc;
        for outcome in [
            Outcome::Ended(Reason::max_age),
            Outcome::Ended(Reason::drain),
            Outcome::Ended(Reason::app_shutdown),
            Outcome::Reset,
            Outcome::UpstreamFailed,
            Outcome::Completed,
        ] {
            let mut r = s.start(true, path, p).expect("on");
            r.head(StatusCode::OK, &HeaderMap::new());
            r.messages(2);
            if outcome == Outcome::Completed {
                let mut t = HeaderMap::new();
                t.insert("grpc-status", HeaderValue::from_static("0"));
                r.trailers(&t);
            }
            record_outcome(&mut r, true, &outcome);
        }
        let count = |code| {
            m.guard_requests
                .get(&crate::metrics::GuardRequestLabels {
                    key: crate::metrics::ServiceKey {
                        service: "shop.Feed".into(),
                        method: None,
                    },
                    code,
                    protocol: p,
                })
                .map_or(0, |c| c.get())
        };
        // Only the application's failure and its success are requests.
        assert_eq!(count(Code::UNAVAILABLE), 1);
        assert_eq!(count(Code::OK), 1);
        // Every stream was still opened and its lifetime observed.
        let text = crate::metrics::render(&{
            let mut reg = prometheus_client::registry::Registry::default();
            reg.register("o", "o", m.guard_streams_opened.clone());
            reg.register("l", "l", m.guard_stream_lifetime.clone());
            reg
        });
        assert!(
            text.contains("o_total{service=\"shop.Feed\",protocol=\"grpc\"} 6"),
            "{text}"
        );
        assert!(text.contains("l_count{protocol=\"grpc\"} 6"), "{text}");
    }

    #[test]
    fn burst_gap_is_far_below_the_settle_default() {
        assert!(BURST_GAP * 10 <= super::super::limits::DEFAULT_END_SETTLE);
    }
}
