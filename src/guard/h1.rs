//! One downstream HTTP/1.1 connection, proxied through hyper to an HTTP/1.1
//! upstream connection (see [`super::upstream`]).
//!
//! HTTP/1.1 has no GOAWAY: while the guard drains, every response carries
//! `Connection: close` and idle keep-alive connections are closed, so the
//! client's next request opens a connection elsewhere. Requests in flight are
//! let finish; at `terminate_all` they get `end_timeout` (then the connection
//! is closed, which a client sees as an incomplete body, never as a complete
//! one). Max connection age applies too: at the age, keep-alive is switched
//! off and the connection closes after the response in flight. Upgrades
//! (WebSocket) are not proxied: the `Upgrade` header is hop-by-hop and dropped.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::accept::ConnInfo;
use super::headers::{
    append_forwarded_for, is_websocket, strip_hop_by_hop, strip_hop_by_hop_keep_upgrade,
    upgrade_requested,
};
use super::registry::Registered;
use super::schedule::jittered_age;
use super::sniff::{linger, Prefixed};
use super::upstream::{H1Upstream, MIN_H1_BUF_SIZE};
use super::{websocket, Inner};
use crate::metrics::{Reason, StreamProtocol};

/// Errors a response body can end with.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Resolves when the guard asks the stream to end.
type EndFuture = Pin<Box<dyn Future<Output = Reason> + Send>>;

/// A response body: the application's, or empty for the guard's own answers.
/// It holds the stream's registration, so the stream counts as open until
/// the body is done. Once the guard asks the stream to end (drain or max
/// age), the body has `end_timeout` to finish on its own; then it is
/// aborted, which closes the connection (HTTP/1.1 has no other way to stop a
/// response, and a truncated body must never look complete).
pub struct H1Body {
    /// The application's body; None for an empty body.
    inner: Option<Incoming>,
    /// Unregisters the stream when the body is dropped.
    registered: Option<Registered>,
    /// Resolves when the end is asked; None once it was (or never watched).
    end: Option<EndFuture>,
    /// After the end was asked: when the body is aborted, and why.
    abort: Option<(Pin<Box<Sleep>>, Reason)>,
    /// Where to count an abort; None for the guard's own answers.
    guard: Option<Arc<Inner>>,
}

impl H1Body {
    fn empty() -> Self {
        Self {
            inner: None,
            registered: None,
            end: None,
            abort: None,
            guard: None,
        }
    }

    fn proxied(inner: Arc<Inner>, body: Incoming, registered: Registered) -> Self {
        let ctl = registered.ctl.clone();
        Self {
            inner: Some(body),
            registered: Some(registered),
            end: Some(Box::pin(async move { ctl.ended().await.0 })),
            abort: None,
            guard: Some(inner),
        }
    }
}

/// Why a response was aborted.
#[derive(Debug, thiserror::Error)]
#[error("response not finished {0:?} after the guard asked it to end ({1:?})")]
struct Aborted(std::time::Duration, Reason);

impl Body for H1Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(end) = this.end.as_mut() {
            if let Poll::Ready(reason) = end.as_mut().poll(cx) {
                this.end = None;
                let after = this
                    .guard
                    .as_ref()
                    .map_or(std::time::Duration::ZERO, |g| g.config.limits.end_timeout);
                this.abort = Some((Box::pin(tokio::time::sleep(after)), reason));
            }
        }
        if let Some((sleep, reason)) = this.abort.as_mut() {
            if sleep.as_mut().poll(cx).is_ready() {
                let reason = *reason;
                this.abort = None;
                this.inner = None;
                if let Some(g) = &this.guard {
                    g.record_ungraceful(reason, StreamProtocol::http);
                    let after = g.config.limits.end_timeout;
                    tracing::debug!(?reason, ?after, "guard: HTTP/1.1 response aborted: not finished in time after the end was asked");
                    return Poll::Ready(Some(Err(Box::new(Aborted(after, reason)))));
                }
                return Poll::Ready(None);
            }
        }
        match this.inner.as_mut() {
            Some(b) => Pin::new(b).poll_frame(cx).map_err(|e| e.into()),
            None => Poll::Ready(None),
        }
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

impl Drop for H1Body {
    fn drop(&mut self) {
        // Unregister first: the stream is over.
        self.registered.take();
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

pub async fn serve(inner: Arc<Inner>, io: Prefixed<TcpStream>, info: ConnInfo) {
    let reclaim = io.reclaim();
    drive(&inner, io, info).await;
    // hyper dropped the connection: close the socket without an RST.
    if let Some(tcp) = reclaim.take() {
        linger(tcp, inner.config.limits.shutdown_timeout).await;
    }
}

async fn drive(inner: &Arc<Inner>, io: Prefixed<TcpStream>, info: ConnInfo) {
    let l = inner.config.limits;
    let upstream = Arc::new(H1Upstream::new(
        inner.config.upstream,
        l,
        inner.tasks.clone(),
    ));
    let age = inner.config.max_connection_age;
    let age_at = age.map(|age| info.accepted_at + jittered_age(age, fastrand::f64()));
    // At age + grace the response in flight is asked to end (then it has
    // `end_timeout`), so age x (1 +- 10%) + grace + end_timeout + the close
    // bounds the connection's life.
    let grace_end = age_at.map(|at| at + inner.config.max_connection_age_grace);
    let service = {
        let inner = inner.clone();
        let upstream = upstream.clone();
        service_fn(move |req| handle(inner.clone(), upstream.clone(), info, grace_end, req))
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // Also closes keep-alive connections idle for this long: hyper starts
        // the timer when it waits for the next request head.
        .header_read_timeout(l.header_read_timeout)
        .max_buf_size(l.max_h1_buf_size.max(MIN_H1_BUF_SIZE))
        .keep_alive(true);
    let conn = builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(conn);
    // A connection accepted while draining is served (one request, answered
    // with `Connection: close`); only connections that were open when the
    // drain began are wound down from here.
    let watch_goaway = !inner.goaway.is_cancelled();
    let mut winding_down = false;
    let mut grace_over = false;
    // Only the guard's own shutdown closes connections by a fixed deadline;
    // a drain ends each response through the registry, spread over its
    // window like every other stream.
    let mut close_by: Option<Instant> = None;
    loop {
        tokio::select! {
            biased;
            _ = sleep_until_opt(close_by) => {
                tracing::debug!(peer = %info.peer, conn = info.id, "guard: HTTP/1.1 closing deadline reached");
                break;
            }
            _ = inner.closing.cancelled(), if close_by.is_none() => {
                if !winding_down {
                    conn.as_mut().graceful_shutdown();
                    winding_down = true;
                }
                let l = &inner.config.limits;
                close_by = Some(Instant::now() + l.end_timeout + l.shutdown_timeout);
            }
            _ = inner.terminate.cancelled(), if !winding_down => {
                conn.as_mut().graceful_shutdown();
                winding_down = true;
            }
            _ = inner.goaway.cancelled(), if watch_goaway && !winding_down => {
                conn.as_mut().graceful_shutdown();
                winding_down = true;
            }
            _ = sleep_until_opt(age_at), if !winding_down => {
                conn.as_mut().graceful_shutdown();
                winding_down = true;
            }
            _ = sleep_until_opt(grace_end), if !grace_over => {
                grace_over = true;
                for s in inner.registry.connection_streams(info.id) {
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
    inner: Arc<Inner>,
    upstream: Arc<H1Upstream>,
    info: ConnInfo,
    grace_end: Option<Instant>,
    mut req: Request<Incoming>,
) -> Result<Response<H1Body>, Infallible> {
    let Some(registered) = inner.registry.register(info.id, false) else {
        return Ok(answer(StatusCode::SERVICE_UNAVAILABLE, true));
    };
    append_forwarded_for(req.headers_mut(), info.peer.ip());
    if let Some(protocol) = upgrade_requested(req.headers()) {
        return Ok(upgrade(inner, upstream, info, grace_end, req, registered, protocol).await);
    }
    strip_hop_by_hop(req.headers_mut());
    let head_only = req.method() == Method::HEAD;
    let resp = match upstream.send(req).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(peer = %info.peer, error = %e, "guard: HTTP/1.1 request failed upstream");
            return Ok(answer(StatusCode::BAD_GATEWAY, draining(&inner)));
        }
    };
    Ok(respond(inner, resp, registered, head_only))
}

/// Forwards the application's response.
fn respond(
    inner: Arc<Inner>,
    resp: Response<Incoming>,
    registered: Registered,
    head_only: bool,
) -> Response<H1Body> {
    let (mut parts, body) = resp.into_parts();
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
    }
    strip_hop_by_hop(&mut parts.headers);
    // Decided when the response starts, so requests that began before the
    // drain also close their connection.
    if draining(&inner) {
        parts
            .headers
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    Response::from_parts(parts, H1Body::proxied(inner, body, registered))
}

/// Proxies an upgrade request. On the application's 101 the upgraded
/// connections are relayed by a task of their own: WebSocket frame by frame
/// with a graceful end ([`websocket::relay`]), anything else as raw bytes
/// ([`websocket::tunnel`]). Any other answer is an ordinary response.
async fn upgrade(
    inner: Arc<Inner>,
    upstream: Arc<H1Upstream>,
    info: ConnInfo,
    grace_end: Option<Instant>,
    mut req: Request<Incoming>,
    registered: Registered,
    protocol: HeaderValue,
) -> Response<H1Body> {
    strip_hop_by_hop_keep_upgrade(req.headers_mut(), protocol.clone());
    let client = hyper::upgrade::on(&mut req);
    let mut resp = match upstream.send_upgrade(req).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(peer = %info.peer, error = %e, "guard: HTTP/1.1 upgrade request failed upstream");
            return answer(StatusCode::BAD_GATEWAY, true);
        }
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return respond(inner, resp, registered, false);
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
        inner.tasks.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep_until(at) => ctl.end(Reason::max_age),
                _ = ctl.ended() => {}
            }
        });
    }
    if websocket {
        inner.tasks.spawn(websocket::relay(
            inner.clone(),
            client,
            app,
            registered,
            info,
        ));
    } else {
        let name = parts
            .headers
            .get(http::header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("?")
            .to_string();
        inner.tasks.spawn(websocket::tunnel(
            inner.clone(),
            client,
            app,
            registered,
            info,
            name,
        ));
    }
    Response::from_parts(parts, H1Body::empty())
}

fn draining(inner: &Inner) -> bool {
    inner.goaway.is_cancelled() || inner.terminate.is_cancelled()
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
