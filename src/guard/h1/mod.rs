//! One downstream HTTP/1.1 connection, proxied through hyper to an HTTP/1.1
//! upstream connection (see [`super::upstream`]).
//!
//! HTTP/1.1 has no GOAWAY: while the guard drains, every response carries
//! `Connection: close` and idle keep-alive connections are closed, so the
//! client's next request opens a connection elsewhere.
//!
//! Responses in flight follow the drain like every other stream: a response
//! of unknown length (chunked or until close: streams, event streams, long
//! polls) is long-lived and is ended when the drain's spread reaches it;
//! one with a `Content-Length` is short work, left to finish (if it is asked
//! to end, near the drain's deadline, it gets `end_timeout` first). A
//! response still running when its end comes is aborted and its connection
//! closed, which a client sees as an incomplete body, never as a complete one
//! (counted in `streams_ungraceful_total{protocol="http"}`).
//!
//! Max connection age (A9-like): at the age (±10%), keep-alive is switched
//! off, so the connection closes after the response in flight; at age +
//! grace that response is aborted. A connection's life is therefore bounded
//! by age × 1.1 + grace (+ the close).
//!
//! Upgrades are proxied: WebSocket frame by frame with a graceful end
//! (see [`super::websocket`]), anything else as raw bytes.
//!
//! Idle keep-alive connections are kept longer than Envoy keeps its pooled
//! ones (see [`super::keepalive`]); a request that meets a stale upstream
//! keep-alive connection is retried when that is safe (see
//! [`app::H1Upstream`]). The application gets the peer's
//! address appended to `X-Forwarded-For`.

mod app;

use crate::timer::sleep_until_opt;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::guard::body::{BodyKind, Boundaries};
use crate::guard::conn::ConnInfo;
use crate::guard::handle::Handle;
use crate::guard::headers::{
    append_forwarded_for, forwarded_for, is_websocket, strip_hop_by_hop,
    strip_hop_by_hop_keep_upgrade, upgrade_requested,
};
use crate::guard::keepalive::{Activity, Counted, HeadTimer, H1_IDLE_TIMEOUT};
use crate::guard::registry::Registered;
use crate::guard::registry::{Origin, ORIGIN_CONNECTION, ORIGIN_FILTER_CHAIN, ORIGIN_LISTENER};
use crate::guard::signals;
use crate::guard::sniff::{linger, Prefixed};
use crate::guard::websocket;
use crate::metrics::{Reason, StreamProtocol};
use app::{H1Upstream, MIN_H1_BUF_SIZE};

/// Errors a response body can end with.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Resolves when the guard asks the stream to end.
type EndFuture = Pin<Box<dyn Future<Output = Reason> + Send>>;

/// A response body: the application's, or empty for the guard's own answers.
/// It holds the stream's registration, so the stream counts as open until
/// the body is done. Once the guard asks the stream to end (its slot in the
/// drain's spread, or max age after its grace), a long-lived body is aborted
/// at once and a short one after `end_timeout` if it has not finished by
/// then. Aborting closes the connection: HTTP/1.1 has no other way to stop a
/// response, and a truncated body must never look complete.
pub struct H1Body {
    /// The application's body; None for an empty body.
    inner: Option<Incoming>,
    /// Unregisters the stream when the body is dropped.
    registered: Option<Registered>,
    /// Resolves when the end is asked; None once it was (or never watched).
    end: Option<EndFuture>,
    /// A short response asked to end: when it is aborted if still running.
    abort_at: Option<(Pin<Box<tokio::time::Sleep>>, Reason)>,
    /// Where to count an abort; None for the guard's own answers.
    guard: Option<Handle>,
    /// Server-Sent Events: event boundaries, so an ending lands between two
    /// events and the body ends cleanly (EventSource reconnects on its own).
    sse: Option<Boundaries>,
    /// Asked to end: the stream ends at the next event boundary after a
    /// write of the app's, or once `settle` passes with nothing written.
    sse_ending: Option<Reason>,
    /// An event stream asked to end between two events waits this long
    /// for the app's next event, so the end lands right after a write (the
    /// app's next one then furthest away) and never while one is on its way.
    settle: Option<Pin<Box<tokio::time::Sleep>>>,
    /// An event just completed after the end was asked: end now.
    end_now: Option<Reason>,
    /// The request's signals, recorded when the body is dropped (done,
    /// aborted, or the client gone).
    sig: Option<signals::Request>,
}

impl H1Body {
    fn empty() -> Self {
        Self {
            inner: None,
            registered: None,
            end: None,
            abort_at: None,
            guard: None,
            sse: None,
            sse_ending: None,
            settle: None,
            end_now: None,
            sig: None,
        }
    }

    fn proxied(
        guard: Handle,
        body: Incoming,
        registered: Registered,
        sse: bool,
        sig: Option<signals::Request>,
    ) -> Self {
        let ctl = registered.ctl.clone();
        Self {
            inner: Some(body),
            registered: Some(registered),
            end: Some(Box::pin(async move { ctl.ended().await.0 })),
            abort_at: None,
            guard: Some(guard),
            sse: sse.then(|| Boundaries::new(BodyKind::Sse)),
            sse_ending: None,
            settle: None,
            end_now: None,
            sig,
        }
    }

    /// Ends an event stream cleanly between two events, and counts it (as
    /// the guard's ending, not the application's outcome).
    fn end_events(&mut self, reason: Reason) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.inner = None;
        self.abort_at = None;
        if let Some(g) = &self.guard {
            g.record_termination(reason, StreamProtocol::http);
        }
        if let Some(s) = self.sig.as_mut() {
            s.ended_by_guard();
        }
        Poll::Ready(None)
    }
}

/// Why a response was aborted.
#[derive(Debug, thiserror::Error)]
#[error("response not finished when the guard asked it to end ({0:?})")]
struct Aborted(Reason);

impl Body for H1Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(reason) = this.end_now.take() {
            return this.end_events(reason);
        }
        if let Some(end) = this.end.as_mut() {
            if let Poll::Ready(reason) = end.as_mut().poll(cx) {
                this.end = None;
                if let Some(sse) = &this.sse {
                    // Between two events: the end waits for the app's next
                    // event, or the settle time. Mid-event: it finishes the
                    // event (bounded), then ends.
                    this.sse_ending = Some(reason);
                    if sse.at_boundary() {
                        let settle = this
                            .guard
                            .as_ref()
                            .map_or(std::time::Duration::ZERO, |g| g.config().limits.end_settle);
                        this.settle = Some(Box::pin(tokio::time::sleep(settle)));
                    }
                }
                // A long-lived response is ended at once (its slot in the
                // spread, or age + grace, was its time); short work gets
                // `end_timeout` to finish on its own first.
                let long = this
                    .registered
                    .as_ref()
                    .is_some_and(|r| r.ctl.is_long_lived());
                let after = match (&this.guard, long || this.sse_ending.is_some()) {
                    (Some(g), false) => g.config().limits.end_timeout,
                    // An event stream gets the bound to finish its event.
                    (Some(g), true) if this.sse_ending.is_some() => g.config().limits.end_timeout,
                    _ => std::time::Duration::ZERO,
                };
                this.abort_at = Some((Box::pin(tokio::time::sleep(after)), reason));
            }
        }
        if let Some(settle) = this.settle.as_mut() {
            if settle.as_mut().poll(cx).is_ready() {
                this.settle = None;
                let quiet = this.sse.as_ref().is_some_and(|s| s.at_boundary());
                if let Some(reason) = this.sse_ending.filter(|_| quiet) {
                    // No event came to time the end by.
                    if let Some(g) = &this.guard {
                        g.record_blind_ending(reason, StreamProtocol::http);
                    }
                    return this.end_events(reason);
                }
            }
        }
        if let Some((sleep, reason)) = this.abort_at.as_mut() {
            if sleep.as_mut().poll(cx).is_ready() {
                let reason = *reason;
                this.abort_at = None;
                if this.inner.as_ref().is_some_and(|b| !b.is_end_stream()) {
                    this.inner = None;
                    if let Some(g) = &this.guard {
                        g.record_ungraceful(reason, StreamProtocol::http);
                    }
                    if let Some(s) = this.sig.as_mut() {
                        s.ended_by_guard();
                    }
                    tracing::debug!(
                        ?reason,
                        "guard: HTTP/1.1 response aborted: the guard asked it to end"
                    );
                    return Poll::Ready(Some(Err(Box::new(Aborted(reason)))));
                }
            }
        }
        let frame = match this.inner.as_mut() {
            Some(b) => ready!(Pin::new(b).poll_frame(cx)),
            None => return Poll::Ready(None),
        };
        if let (Some(s), Some(Ok(f))) = (this.sig.as_mut(), frame.as_ref()) {
            if let Some(t) = f.trailers_ref() {
                s.trailers(t);
            }
        }
        if let (Some(sse), Some(Ok(f))) = (this.sse.as_mut(), frame.as_ref()) {
            if let Some(data) = f.data_ref() {
                sse.consume(data);
            }
            if let Some(reason) = this.sse_ending.filter(|_| sse.at_boundary()) {
                // This frame completes an event: send it, then end.
                this.sse_ending = None;
                this.settle = None;
                this.end_now = Some(reason);
            }
        }
        Poll::Ready(frame.map(|r| r.map_err(|e| e.into())))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint())
    }
}

pub async fn serve(guard: Handle, io: Prefixed<TcpStream>, info: ConnInfo) {
    let reclaim = io.reclaim();
    drive(&guard, io, info).await;
    // hyper dropped the connection: close the socket without an RST.
    if let Some(tcp) = reclaim.take() {
        linger(tcp, guard.config().limits.shutdown_timeout).await;
    }
}

async fn drive(guard: &Handle, io: Prefixed<TcpStream>, info: ConnInfo) {
    let l = guard.config().limits;
    let upstream = Arc::new(H1Upstream::new(
        guard.config().upstream,
        guard.connector().clone(),
        l,
        guard.clone(),
    ));
    // At age + grace the response in flight is asked to end (and aborted).
    let max_age = guard.max_age(info.accepted_at);
    let (age_at, grace_end) = (max_age.map(|m| m.at), max_age.map(|m| m.grace_end));
    let service = {
        let guard = guard.clone();
        let upstream = upstream.clone();
        service_fn(move |req| handle(guard.clone(), upstream.clone(), info, grace_end, req))
    };
    let activity = Arc::new(Activity::default());
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        // A request head must complete within the header read timeout from
        // its first byte; with no byte, the connection is idle, and stays
        // open longer than Envoy keeps its pooled connections (keepalive.rs).
        .timer(HeadTimer {
            activity: activity.clone(),
            head_timeout: l.header_read_timeout,
            idle_timeout: H1_IDLE_TIMEOUT,
        })
        .header_read_timeout(l.header_read_timeout)
        .max_buf_size(l.buffers.max_h1_buf_size.max(MIN_H1_BUF_SIZE))
        .keep_alive(true);
    let conn = builder
        .serve_connection(TokioIo::new(Counted::new(io, activity)), service)
        .with_upgrades();
    tokio::pin!(conn);
    // A connection accepted while draining is served (one request, answered
    // with `Connection: close`); only connections that were open when the
    // drain began are wound down from here.
    let watch_goaway = !guard.goaway_all_asked();
    let watch_terminate = !guard.terminating();
    let mut winding_down = false;
    let mut grace_over = false;
    // Only the guard's own shutdown closes connections by a fixed deadline;
    // a drain ends each response through the registry, spread over its
    // window like every other stream. A connection accepted while the guard
    // terminates gets its requests refused (503, `Connection: close`) and is
    // closed by this bound if the client lingers.
    let mut close_by: Option<Instant> =
        (!watch_terminate).then(|| info.accepted_at + l.header_read_timeout + l.shutdown_timeout);
    loop {
        tokio::select! {
            biased;
            _ = sleep_until_opt(close_by) => {
                tracing::debug!(peer = %info.peer, conn = info.id, "guard: HTTP/1.1 closing deadline reached");
                break;
            }
            _ = guard.closing(), if close_by.is_none() => {
                if !winding_down {
                    conn.as_mut().graceful_shutdown();
                    winding_down = true;
                }
                let l = &guard.config().limits;
                close_by = Some(Instant::now() + l.end_timeout + l.shutdown_timeout);
            }
            _ = guard.terminate_all(), if watch_terminate && !winding_down => {
                conn.as_mut().graceful_shutdown();
                winding_down = true;
            }
            _ = guard.goaway_all(), if watch_goaway && !winding_down => {
                conn.as_mut().graceful_shutdown();
                winding_down = true;
            }
            _ = sleep_until_opt(age_at), if !winding_down => {
                conn.as_mut().graceful_shutdown();
                winding_down = true;
            }
            _ = sleep_until_opt(grace_end), if !grace_over => {
                grace_over = true;
                let long_after = guard.config().long_stream_age;
                for s in guard.connection_streams(info.id, Instant::now(), long_after) {
                    s.end(Reason::max_age);
                }
            }
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(peer = %info.peer, conn = info.id, error = %e, "guard: HTTP/1.1 connection ended");
                }
                break;
            }
        }
    }
    upstream.close();
}

/// Proxies one request.
async fn handle(
    guard: Handle,
    upstream: Arc<H1Upstream>,
    info: ConnInfo,
    grace_end: Option<Instant>,
    mut req: Request<Incoming>,
) -> Result<Response<H1Body>, Infallible> {
    let Some(registered) = guard.register(info.id, false) else {
        return Ok(answer(StatusCode::SERVICE_UNAVAILABLE, true));
    };
    registered.set_origin(origin_of(req.headers()));
    append_forwarded_for(req.headers_mut(), &forwarded_for(info.peer.ip()));
    let grpc = super::body::request_kind(req.headers()) != BodyKind::Opaque;
    let upgrading = upgrade_requested(req.headers());
    let protocol = match &upgrading {
        Some(p) if is_websocket(p) => StreamProtocol::websocket,
        Some(_) => StreamProtocol::other,
        None if grpc => StreamProtocol::grpc,
        None => StreamProtocol::http,
    };
    let mut sig = guard.signals().start(grpc, req.uri().path(), protocol);
    if let Some(protocol) = upgrading {
        return Ok(upgrade(
            guard, upstream, info, grace_end, req, registered, protocol, sig,
        )
        .await);
    }
    strip_hop_by_hop(req.headers_mut());
    let head_only = req.method() == Method::HEAD;
    let resp = match upstream.send(req).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(peer = %info.peer, error = %e, "guard: HTTP/1.1 request failed upstream");
            if let Some(s) = sig.as_mut() {
                s.status_if_unset(StatusCode::BAD_GATEWAY);
            }
            return Ok(answer(StatusCode::BAD_GATEWAY, draining(&guard)));
        }
    };
    Ok(respond(guard, resp, registered, head_only, sig))
}

/// Forwards the application's response.
fn respond(
    guard: Handle,
    resp: Response<Incoming>,
    registered: Registered,
    head_only: bool,
    mut sig: Option<signals::Request>,
) -> Response<H1Body> {
    let (mut parts, body) = resp.into_parts();
    if let Some(s) = sig.as_mut() {
        s.head(parts.status, &parts.headers);
    }
    // A body of unknown length (chunked, or until close: a stream, an
    // event stream, a long poll) is long-lived: a drain ends it early,
    // spread over its window. A body with a length is short work, left to
    // finish.
    let bodiless = head_only
        || parts.status.is_informational()
        || parts.status == StatusCode::NO_CONTENT
        || parts.status == StatusCode::NOT_MODIFIED;
    if !bodiless && !parts.headers.contains_key(CONTENT_LENGTH) {
        registered.ctl.set_long_lived();
        if let Some(s) = sig.as_mut() {
            s.stream_from_head();
        }
    }
    strip_hop_by_hop(&mut parts.headers);
    // Decided when the response starts, so requests that began before the
    // drain also close their connection.
    if draining(&guard) {
        parts
            .headers
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    let sse = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|ct| ct.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream"));
    Response::from_parts(parts, H1Body::proxied(guard, body, registered, sse, sig))
}

/// Proxies an upgrade request. On the application's 101 the upgraded
/// connections are relayed by a task of their own: WebSocket frame by frame
/// with a graceful end ([`websocket::relay`]), anything else as raw bytes
/// ([`websocket::tunnel`]). Any other answer is an ordinary response.
#[allow(clippy::too_many_arguments)]
async fn upgrade(
    guard: Handle,
    upstream: Arc<H1Upstream>,
    info: ConnInfo,
    grace_end: Option<Instant>,
    mut req: Request<Incoming>,
    registered: Registered,
    protocol: HeaderValue,
    mut sig: Option<signals::Request>,
) -> Response<H1Body> {
    strip_hop_by_hop_keep_upgrade(req.headers_mut(), protocol.clone());
    let client = hyper::upgrade::on(&mut req);
    let mut resp = match upstream.send_upgrade(req).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(peer = %info.peer, error = %e, "guard: HTTP/1.1 upgrade request failed upstream");
            if let Some(s) = sig.as_mut() {
                s.status_if_unset(StatusCode::BAD_GATEWAY);
            }
            return answer(StatusCode::BAD_GATEWAY, true);
        }
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return respond(guard, resp, registered, false, sig);
    }
    // Upgraded: a stream from here, recorded when its relay ends.
    if let Some(s) = sig.as_mut() {
        s.head(resp.status(), resp.headers());
        s.stream_from_head();
    }
    let app = hyper::upgrade::on(&mut resp);
    let (mut parts, _empty) = resp.into_parts();
    let upgraded_to = parts.headers.get(http::header::UPGRADE).cloned();
    strip_hop_by_hop_keep_upgrade(&mut parts.headers, upgraded_to.unwrap_or(protocol));
    let websocket = parts
        .headers
        .get(http::header::UPGRADE)
        .is_some_and(is_websocket);
    // Max age reaches upgraded connections too: at age + grace they are
    // ended like a drain ends them.
    if let Some(at) = grace_end {
        let ctl = registered.ctl.clone();
        guard.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep_until(at) => ctl.end(Reason::max_age),
                _ = ctl.ended() => {}
            }
        });
    }
    if websocket {
        let relay = websocket::relay(guard.clone(), client, app, registered, info);
        guard.spawn(async move {
            let mut sig = sig;
            if relay.await {
                if let Some(s) = sig.as_mut() {
                    s.ended_by_guard();
                }
            }
            drop(sig);
        });
    } else {
        let name = parts
            .headers
            .get(http::header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("?")
            .to_string();
        let tunnel = websocket::tunnel(guard.clone(), client, app, registered, info, name);
        guard.spawn(async move {
            let mut sig = sig;
            if tunnel.await {
                if let Some(s) = sig.as_mut() {
                    s.ended_by_guard();
                }
            }
            drop(sig);
        });
    }
    Response::from_parts(parts, H1Body::empty())
}

fn draining(guard: &Handle) -> bool {
    guard.goaway_all_asked() || guard.terminating()
}

/// The guard's own answer: an empty body, closing the connection if asked.
fn answer(status: StatusCode, close: bool) -> Response<H1Body> {
    let mut r = Response::new(H1Body::empty());
    *r.status_mut() = status;
    if close {
        r.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    if status == StatusCode::SERVICE_UNAVAILABLE {
        // Nothing reached the application: any retry is safe.
        r.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("0"));
    }
    r
}

/// Where Envoy's route says the request came from (its origin headers).
fn origin_of(headers: &hyper::HeaderMap) -> Origin {
    // The last value, as the HTTP/2 path reads it: a route that appends
    // rather than overwrites puts Envoy's after the client's.
    let text = |name: &[u8]| {
        headers
            .get_all(std::str::from_utf8(name).unwrap_or_default())
            .iter()
            .next_back()
            .and_then(|v| v.to_str().ok())
    };
    Origin {
        connection: text(ORIGIN_CONNECTION).and_then(|v| v.parse().ok()),
        filter_chain: text(ORIGIN_FILTER_CHAIN).map(Into::into),
        listener: text(ORIGIN_LISTENER).map(Into::into),
    }
}
