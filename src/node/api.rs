//! The agent's own endpoints on `--listen`, in the node's namespace:
//!
//! | endpoint | what |
//! |---|---|
//! | `GET /metrics` | every pod's series, labelled `namespace`/`pod` (see `metrics`) |
//! | `GET /healthz` | the agent is alive |
//! | `GET /readyz` | 200 once the first scan is done |
//! | `GET /status` | the pods, their listeners, Envoy state and drain status |
//! | `GET /pods/<namespace>/<pod>` | one pod's status |
//! | `POST /pods/<namespace>/<pod>/drain[?wait=true]` | drain that pod (also `GET ...?wait=true`) |
//!
//! Drains through this API are accepted from loopback only: the pods'
//! preStop goes through their own listener, never through here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::Shared;
use crate::control::{json, may_mutate, not_allowed, parse_wait, text};
use crate::drain::Trigger;

/// Prometheus' default scrape timeout is 10 s; stay well inside it.
const TELEMETRY_BUDGET: Duration = Duration::from_secs(5);

pub(super) async fn serve(listener: TcpListener, shared: Arc<Shared>, shutdown: CancellationToken) {
    crate::control::serve_fn(listener, shutdown, move |peer, req| {
        let shared = shared.clone();
        async move { handle(&shared, peer, req).await }
    })
    .await
}

async fn handle(
    shared: &Shared,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let get = matches!(method, Method::GET | Method::HEAD);
    match path.as_str() {
        "/metrics" if get => {
            if tokio::time::timeout(TELEMETRY_BUDGET, shared.refresh_telemetry())
                .await
                .is_err()
            {
                tracing::debug!("telemetry refresh timed out; serving the last values");
            }
            let mut r = text(StatusCode::OK, crate::metrics::render(&shared.registry));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            r
        }
        "/healthz" if get => text(StatusCode::OK, "ok\n"),
        "/readyz" if get => {
            if shared.scans.load(std::sync::atomic::Ordering::Relaxed) > 0 {
                text(StatusCode::OK, "ready\n")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "first scan pending\n")
            }
        }
        "/status" if get => json(StatusCode::OK, &shared.status()),
        "/metrics" | "/healthz" | "/readyz" | "/status" => not_allowed("GET"),
        p if p.starts_with("/pods/") => pod_route(shared, &method, p, &query, peer).await,
        _ => text(StatusCode::NOT_FOUND, format!("no such endpoint: {path}\n")),
    }
}

/// `/pods/<namespace>/<pod>[/drain]`. An empty namespace (a pod known only by
/// its UID) is written `/pods//<uid>`.
async fn pod_route(
    shared: &Shared,
    method: &Method,
    path: &str,
    query: &str,
    peer: SocketAddr,
) -> Response<Full<Bytes>> {
    let parts: Vec<&str> = path["/pods/".len()..].split('/').collect();
    let (namespace, name, drain) = match parts.as_slice() {
        [ns, pod] => (*ns, *pod, false),
        [ns, pod, "drain"] => (*ns, *pod, true),
        _ => {
            return text(
                StatusCode::NOT_FOUND,
                "expected /pods/<namespace>/<pod>[/drain]\n",
            )
        }
    };
    let Some((handle, status)) = shared.find(namespace, name) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("no pod {namespace}/{name} on this node\n"),
        );
    };
    if !drain {
        return match *method {
            Method::GET | Method::HEAD => json(StatusCode::OK, &status),
            _ => not_allowed("GET"),
        };
    }
    let wait = match parse_wait(query) {
        Ok(w) => w,
        Err(msg) => return text(StatusCode::BAD_REQUEST, msg),
    };
    match (method, wait) {
        (&Method::POST, _) | (&Method::GET, true) => {}
        (&Method::GET, false) => {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                "GET .../drain needs ?wait=true; use POST to start without waiting\n",
            )
        }
        _ => return not_allowed("GET, POST"),
    }
    if !may_mutate(peer.ip(), &[]) {
        tracing::warn!(%peer, namespace, pod = name, "refused an API drain from a non-loopback caller");
        return text(
            StatusCode::FORBIDDEN,
            format!(
                "drain refused: the node API accepts drains from loopback only, not {}\n",
                peer.ip()
            ),
        );
    }
    tracing::info!(%peer, namespace, pod = name, wait, "API drain requested");
    if wait {
        handle.trigger(Trigger::Api).await;
        match handle.report().await {
            Some(r) => json(StatusCode::OK, &r),
            None => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the drain driver has stopped\n",
            ),
        }
    } else {
        let s = handle.trigger(Trigger::Api).await;
        json(StatusCode::ACCEPTED, &s)
    }
}
