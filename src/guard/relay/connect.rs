//! WebSocket over HTTP/2 (RFC 8441 extended CONNECT), as Envoy sends it
//! when its upstream speaks HTTP/2: `:method CONNECT`, `:protocol
//! websocket`, and the stream's DATA frames carrying the WebSocket frames.
//!
//! Applications serve WebSockets over HTTP/1.1, so the guard does what
//! Envoy would do in its place: it opens an HTTP/1.1 connection to the
//! application and asks for `Upgrade: websocket` (with the client's
//! `Sec-WebSocket-Key` when a proxy kept it, a fresh one otherwise). On the
//! application's 101 the client gets a 200, and the two byte streams are
//! relayed by [`crate::guard::websocket`], with the same frame-boundary graceful
//! end (1001 to the application first, everything it sent, then 1012 to the
//! client). Any other answer is passed to the client as it is.

use std::net::SocketAddr;

use base64::Engine;
use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, CONNECTION, HOST, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_VERSION, UPGRADE,
};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;

use crate::guard::conn::ConnInfo;
use crate::guard::handle::Handle;
use crate::guard::headers::{append_forwarded_for, forwarded_for, strip_hop_by_hop};
use crate::guard::registry::Registered;

/// The answer the frame relay sends for a WebSocket it serves itself: the
/// head, and whether it ends the stream (a refusal).
pub type Answer = (Response<()>, bool);

/// Proxies one extended-CONNECT WebSocket to the application over HTTP/1.1,
/// for the frame relay, which serves it itself: the client's stream is
/// `client` (its DATA both ways), and the head of the answer goes to
/// `answer`.
pub async fn proxy<C>(
    guard: Handle,
    registered: Registered,
    head: http::request::Parts,
    client: C,
    answer: tokio::sync::oneshot::Sender<Answer>,
    info: ConnInfo,
) where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (ok, app_upgrade) = match upgrade(&guard, &head, info).await {
        Ok(pair) => pair,
        Err(status) => {
            let mut r = Response::new(());
            *r.status_mut() = status;
            let _ = answer.send((r, true));
            return;
        }
    };
    if answer.send((ok, false)).is_err() {
        return;
    }
    let app_io = match app_upgrade.await {
        Ok(io) => io,
        Err(e) => {
            tracing::debug!(peer = %info.peer, error = %e, "guard: WebSocket (HTTP/2) upgrade did not complete");
            return;
        }
    };
    crate::guard::websocket::relay_streams(guard, client, app_io, registered, info).await;
}

/// Asks the application for the WebSocket upgrade over HTTP/1.1: the head
/// for the client (200 with the application's headers) and the upgrade to
/// await, or the status the client gets instead.
async fn upgrade(
    guard: &Handle,
    head: &http::request::Parts,
    info: ConnInfo,
) -> Result<(Response<()>, hyper::upgrade::OnUpgrade), StatusCode> {
    let l = guard.config().limits;
    let app = guard.config().upstream;
    let upgrade = async {
        let tcp = guard.connect_app().await.map_err(|e| e.to_string())?;
        let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
            .handshake::<_, Empty<Bytes>>(TokioIo::new(tcp))
            .await
            .map_err(|e| format!("upstream {app}: HTTP/1.1 handshake: {e}"))?;
        guard.spawn(async move {
            let _ = conn.with_upgrades().await;
        });
        let up = upgrade_request(head, app, info.peer)?;
        sender
            .send_request(up)
            .await
            .map_err(|e| format!("upstream {app}: WebSocket upgrade: {e}"))
    };
    let answer = match tokio::time::timeout(l.upstream_connect_timeout, upgrade).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::warn!(peer = %info.peer, error = %e, "guard: WebSocket (HTTP/2) upgrade to the application failed");
            return Err(StatusCode::BAD_GATEWAY);
        }
        Err(_) => {
            tracing::warn!(peer = %info.peer, "guard: WebSocket (HTTP/2) upgrade: the application did not answer in time");
            return Err(StatusCode::GATEWAY_TIMEOUT);
        }
    };
    if answer.status().is_success() {
        // A 2xx that is not an upgrade: passed on, it would tell the client
        // its tunnel is open (RFC 8441 §5) when nothing carries it.
        tracing::warn!(peer = %info.peer, status = %answer.status(), "guard: WebSocket (HTTP/2) upgrade: the application answered without upgrading");
        return Err(StatusCode::BAD_GATEWAY);
    }
    if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
        // Refused (401, 426, ...): the client gets the application's status.
        return Err(answer.status());
    }
    // The application's headers, Sec-WebSocket-Accept included: a proxy in
    // front that turned an HTTP/1.1 upgrade into this CONNECT (Envoy) kept
    // the client's key, and hands the accept back to it.
    let mut ok = Response::new(());
    for (name, value) in answer.headers() {
        if name != CONNECTION && name != UPGRADE {
            ok.headers_mut().append(name.clone(), value.clone());
        }
    }
    strip_hop_by_hop(ok.headers_mut());
    Ok((ok, hyper::upgrade::on(answer)))
}

/// The HTTP/1.1 upgrade request for an extended CONNECT.
fn upgrade_request(
    head: &http::request::Parts,
    app: SocketAddr,
    peer: SocketAddr,
) -> Result<Request<Empty<Bytes>>, String> {
    let path = head
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let mut req = Request::builder()
        .method(Method::GET)
        .uri(path)
        .body(Empty::new())
        .map_err(|e| format!("WebSocket upgrade request: {e}"))?;
    let h = req.headers_mut();
    for (name, value) in &head.headers {
        h.append(name.clone(), value.clone());
    }
    strip_hop_by_hop(h);
    append_forwarded_for(h, &forwarded_for(peer.ip()));
    let host = head
        .uri
        .authority()
        .map_or_else(|| app.to_string(), |a| a.to_string());
    if let Ok(v) = HeaderValue::from_str(&host) {
        h.insert(HOST, v);
    }
    h.insert(UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    h.entry(SEC_WEBSOCKET_VERSION)
        .or_insert(HeaderValue::from_static("13"));
    // A CONNECT carries no key of its own; one that a proxy translated from
    // an HTTP/1.1 upgrade still has the client's, which is kept so the
    // application's accept matches what that client expects.
    if !h.contains_key(SEC_WEBSOCKET_KEY) {
        let key: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
        let key = base64::engine::general_purpose::STANDARD.encode(key);
        h.insert(
            SEC_WEBSOCKET_KEY,
            HeaderValue::from_str(&key).map_err(|e| e.to_string())?,
        );
    }
    // HTTP/2 pseudo-header leftovers never travel as HTTP/1.1 headers.
    h.remove(HeaderName::from_static("protocol"));
    Ok(req)
}
