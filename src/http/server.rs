//! How drainshim serves its own HTTP/1.1 endpoints: the sidecar's control
//! endpoints (`control`), the node agent's API and each pod's preStop
//! listener (`node`), and the webhook's TLS and metrics ports (`inject`).
//! Each gets the same header timeout, buffer limit and bounded graceful
//! shutdown, and answers in the same plain-text, JSON and OpenMetrics forms;
//! what an endpoint says is its owner's.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Slowloris bound: a client must send its headers within this.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests here are tiny; 16 KiB of headers is plenty.
const MAX_BUF_SIZE: usize = 16 * 1024;
/// How long a connection still open at shutdown is given to finish.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// A plain-text answer with `status` (the control endpoints, the node
/// agent's, the webhook's, the bench's admin stand-in).
pub fn text(status: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.into())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// `v` as a JSON answer with `status`, ended by a newline; a 500 saying
/// why if it does not encode.
pub(crate) fn json<T: serde::Serialize>(status: StatusCode, v: &T) -> Response<Full<Bytes>> {
    match serde_json::to_vec(v) {
        Ok(mut body) => {
            body.push(b'\n');
            let mut r = Response::new(Full::new(Bytes::from(body)));
            *r.status_mut() = status;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding JSON: {e}\n"),
        ),
    }
}

/// 405 with the `Allow` header naming the methods that are.
pub(crate) fn not_allowed(allow: &'static str) -> Response<Full<Bytes>> {
    let mut r = text(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method not allowed; use {allow}\n"),
    );
    r.headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static(allow));
    r
}

/// `GET /metrics`: `body`, a registry rendered in the OpenMetrics text
/// format (`metrics::render`), with its content type.
pub fn openmetrics(body: String) -> Response<Full<Bytes>> {
    let mut r = text(StatusCode::OK, body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
    );
    r
}

/// How every connection is served: HTTP/1.1 with the header timeout and
/// buffer limit above.
pub fn http1_builder() -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_BUF_SIZE);
    b
}

/// Serves one accepted connection (plain TCP or TLS) with `handler` until it
/// ends; once `shutdown` is cancelled, asks it to finish (graceful shutdown)
/// and gives it [`CLOSE_GRACE`]. Returns the error the connection ended
/// with, for the caller to log; none after a shutdown.
pub async fn serve_connection<I, F, Fut>(
    io: I,
    handler: F,
    shutdown: &CancellationToken,
) -> Result<(), hyper::Error>
where
    I: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let svc = service_fn(move |req| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(handler(req).await) }
    });
    let conn = http1_builder().serve_connection(TokioIo::new(io), svc);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        res = conn.as_mut() => res,
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(CLOSE_GRACE, conn).await;
            Ok(())
        }
    }
}

/// Serves HTTP/1.1 on `listener` with `handler` until `shutdown` is
/// cancelled, then lets in-flight requests finish (bounded). The control
/// endpoints, the node agent's, the webhook's metrics port.
pub async fn serve_fn<F, Fut>(listener: TcpListener, shutdown: CancellationToken, handler: F)
where
    F: Fn(SocketAddr, Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    serve_fn_until(listener, shutdown.clone(), shutdown, handler).await
}

/// [`serve_fn`], but accepting stops at `accepting` while the connections
/// accepted until then are served until `shutdown` (the node agent's
/// hand-over: the listener is served by the next agent from then on).
pub async fn serve_fn_until<F, Fut>(
    listener: TcpListener,
    accepting: CancellationToken,
    shutdown: CancellationToken,
    handler: F,
) where
    F: Fn(SocketAddr, Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let tracker = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = accepting.cancelled() => break,
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "control: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let handler = handler.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            let handler = move |req| handler(peer, req);
            if let Err(e) = serve_connection(stream, handler, &shutdown).await {
                tracing::debug!(%peer, error = %e, "control connection ended with an error");
            }
        });
    }
    // Closing the listener first: a stopped server refuses at once.
    drop(listener);
    shutdown.cancelled().await;
    tracker.close();
    let _ = tokio::time::timeout(CLOSE_GRACE, tracker.wait()).await;
}
