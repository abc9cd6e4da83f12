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
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, CONNECTION, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::accept::ConnInfo;
use super::headers::strip_hop_by_hop;
use super::registry::Registered;
use super::schedule::jittered_age;
use super::sniff::{linger, Prefixed};
use super::upstream::{H1Upstream, MIN_H1_BUF_SIZE};
use super::Inner;

/// A response body: the application's, or empty for the guard's own answers.
/// It holds the stream's registration, so the stream counts as open until
/// the body is done.
pub struct H1Body {
    /// The application's body; None for an empty body.
    inner: Option<Incoming>,
    /// Unregisters the stream when the body is dropped.
    _registered: Option<Registered>,
}

impl H1Body {
    fn empty() -> Self {
        Self {
            inner: None,
            _registered: None,
        }
    }
}

impl Body for H1Body {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut().inner.as_mut() {
            Some(b) => Pin::new(b).poll_frame(cx),
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
    let service = {
        let inner = inner.clone();
        let upstream = upstream.clone();
        service_fn(move |req| handle(inner.clone(), upstream.clone(), info, req))
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // Also closes keep-alive connections idle for this long: hyper starts
        // the timer when it waits for the next request head.
        .header_read_timeout(l.header_read_timeout)
        .max_buf_size(l.max_h1_buf_size.max(MIN_H1_BUF_SIZE))
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let age_at = inner
        .config
        .max_connection_age
        .map(|age| info.accepted_at + jittered_age(age, fastrand::f64()));
    // A connection accepted while draining is served (one request, answered
    // with `Connection: close`); only connections that were open when the
    // drain began are wound down from here.
    let watch_goaway = !inner.goaway.is_cancelled();
    let mut terminate_seen = inner.terminate.is_cancelled();
    let mut winding_down = false;
    let mut close_by: Option<Instant> = terminate_seen
        .then(|| info.accepted_at + l.header_read_timeout + l.end_timeout + l.shutdown_timeout);
    loop {
        tokio::select! {
            biased;
            _ = sleep_until_opt(close_by) => {
                tracing::debug!(peer = %info.peer, conn = info.id, "guard: HTTP/1.1 closing deadline reached");
                break;
            }
            _ = inner.terminate.cancelled(), if !terminate_seen => {
                terminate_seen = true;
                if !winding_down {
                    conn.as_mut().graceful_shutdown();
                    winding_down = true;
                }
                let l = &inner.config.limits;
                close_by = Some(Instant::now() + l.end_timeout + l.shutdown_timeout);
            }
            _ = inner.goaway.cancelled(), if watch_goaway && !winding_down => {
                conn.as_mut().graceful_shutdown();
                winding_down = true;
            }
            _ = sleep_until_opt(age_at), if !winding_down => {
                conn.as_mut().graceful_shutdown();
                winding_down = true;
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
    mut req: Request<Incoming>,
) -> Result<Response<H1Body>, Infallible> {
    let Some(registered) = inner.registry.register(info.id, false) else {
        return Ok(answer(StatusCode::SERVICE_UNAVAILABLE, true));
    };
    strip_hop_by_hop(req.headers_mut());
    let resp = match upstream.send(req).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(peer = %info.peer, error = %e, "guard: HTTP/1.1 request failed upstream");
            return Ok(answer(StatusCode::BAD_GATEWAY, draining(&inner)));
        }
    };
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    // Decided when the response starts, so requests that began before the
    // drain also close their connection.
    if draining(&inner) {
        parts
            .headers
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(Response::from_parts(
        parts,
        H1Body {
            inner: Some(body),
            _registered: Some(registered),
        },
    ))
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
