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
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::Shared;
use crate::control::{drain_form, drain_response, may_mutate, RouteRefusal};
use crate::drain::Trigger;
use crate::http::server::{json, not_allowed, openmetrics, serve_fn_until, text};

/// Prometheus' default scrape timeout is 10 s; stay well inside it.
const TELEMETRY_BUDGET: Duration = Duration::from_secs(5);

pub(super) async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    accepting: CancellationToken,
    shutdown: CancellationToken,
) {
    serve_fn_until(listener, accepting, shutdown, move |peer, req| {
        let shared = shared.clone();
        async move { handle(&shared, peer, req).await }
    })
    .await
}

/// What a request to the agent's API asks for, decided from its method,
/// path, query and caller alone: no state is read and nothing is started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiRoute {
    /// `GET|HEAD /metrics`.
    Metrics,
    /// `GET|HEAD /healthz`.
    Healthz,
    /// `GET|HEAD /readyz`.
    Readyz,
    /// `GET|HEAD /status`.
    Status,
    /// `/pods/<namespace>/<pod>[/drain]`: the pod is looked up first (404 if
    /// it is not on this node), then `then` applies.
    Pod {
        namespace: String,
        pod: String,
        then: PodThen,
    },
    /// Answered at once: (status, `Allow` header for 405, body).
    Answer(StatusCode, Option<&'static str>, String),
}

/// What to do with a pod that was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodThen {
    /// Its status (`GET|HEAD /pods/<ns>/<pod>`).
    Show,
    /// Drain it, from loopback (`POST .../drain`, `GET .../drain?wait=true`).
    Drain { wait: bool },
    /// Refused: (status, `Allow` header for 405, body).
    Refuse(StatusCode, Option<&'static str>, String),
}

/// Decides what a request asks for. Never panics on input.
pub fn route(method: &Method, path: &str, query: &str, peer: SocketAddr) -> ApiRoute {
    let get = matches!(*method, Method::GET | Method::HEAD);
    match path {
        "/metrics" if get => ApiRoute::Metrics,
        "/healthz" if get => ApiRoute::Healthz,
        "/readyz" if get => ApiRoute::Readyz,
        "/status" if get => ApiRoute::Status,
        "/metrics" | "/healthz" | "/readyz" | "/status" => ApiRoute::Answer(
            StatusCode::METHOD_NOT_ALLOWED,
            Some("GET"),
            "method not allowed; use GET\n".into(),
        ),
        p => match p.strip_prefix("/pods/") {
            Some(rest) => pod_route(method, rest, query, peer),
            None => ApiRoute::Answer(
                StatusCode::NOT_FOUND,
                None,
                format!("no such endpoint: {path}\n"),
            ),
        },
    }
}

/// `/pods/<namespace>/<pod>[/drain]` (`rest` is what follows `/pods/`). An
/// empty namespace (a pod known only by its UID) is written `/pods//<uid>`.
fn pod_route(method: &Method, rest: &str, query: &str, peer: SocketAddr) -> ApiRoute {
    let parts: Vec<&str> = rest.split('/').collect();
    let (namespace, pod, drain) = match parts.as_slice() {
        [ns, pod] => (*ns, *pod, false),
        [ns, pod, "drain"] => (*ns, *pod, true),
        _ => {
            return ApiRoute::Answer(
                StatusCode::NOT_FOUND,
                None,
                "expected /pods/<namespace>/<pod>[/drain]\n".into(),
            )
        }
    };
    let then = if !drain {
        match *method {
            Method::GET | Method::HEAD => PodThen::Show,
            _ => PodThen::Refuse(
                StatusCode::METHOD_NOT_ALLOWED,
                Some("GET"),
                "method not allowed; use GET\n".into(),
            ),
        }
    } else {
        drain_then(method, query, peer)
    };
    ApiRoute::Pod {
        namespace: namespace.to_string(),
        pod: pod.to_string(),
        then,
    }
}

fn drain_then(method: &Method, query: &str, peer: SocketAddr) -> PodThen {
    let wait = match drain_form(method, query) {
        Ok(wait) => wait,
        Err(RouteRefusal::BadQuery(msg)) => {
            return PodThen::Refuse(StatusCode::BAD_REQUEST, None, msg)
        }
        Err(RouteRefusal::DrainGetWithoutWait) => {
            return PodThen::Refuse(
                StatusCode::METHOD_NOT_ALLOWED,
                None,
                "GET .../drain needs ?wait=true; use POST to start without waiting\n".into(),
            )
        }
        Err(_) => {
            return PodThen::Refuse(
                StatusCode::METHOD_NOT_ALLOWED,
                Some("GET, POST"),
                "method not allowed; use GET, POST\n".into(),
            )
        }
    };
    if !may_mutate(peer.ip(), &[]) {
        return PodThen::Refuse(
            StatusCode::FORBIDDEN,
            None,
            format!(
                "drain refused: the node API accepts drains from loopback only, not {}\n",
                peer.ip()
            ),
        );
    }
    PodThen::Drain { wait }
}

/// A refusal as a response; 405s carry their `Allow` header.
fn refusal(status: StatusCode, allow: Option<&'static str>, body: String) -> Response<Full<Bytes>> {
    match allow {
        Some(allow) if status == StatusCode::METHOD_NOT_ALLOWED => not_allowed(allow),
        _ => text(status, body),
    }
}

async fn handle(
    shared: &Shared,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let query = req.uri().query().unwrap_or("");
    match route(req.method(), req.uri().path(), query, peer) {
        ApiRoute::Metrics => {
            if tokio::time::timeout(TELEMETRY_BUDGET, shared.refresh_telemetry())
                .await
                .is_err()
            {
                tracing::debug!("telemetry refresh timed out; serving the last values");
            }
            openmetrics(crate::metrics::render(&shared.metrics.registry))
        }
        ApiRoute::Healthz => text(StatusCode::OK, "ok\n"),
        ApiRoute::Readyz => {
            if shared.scans.load(std::sync::atomic::Ordering::Relaxed) > 0 {
                text(StatusCode::OK, "ready\n")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "first scan pending\n")
            }
        }
        ApiRoute::Status => json(StatusCode::OK, &shared.status()),
        ApiRoute::Answer(status, allow, body) => refusal(status, allow, body),
        ApiRoute::Pod {
            namespace,
            pod,
            then,
        } => {
            let Some((handle, status)) = shared.find(&namespace, &pod) else {
                return text(
                    StatusCode::NOT_FOUND,
                    format!("no pod {namespace}/{pod} on this node\n"),
                );
            };
            match then {
                PodThen::Show => json(StatusCode::OK, &status),
                PodThen::Refuse(status, allow, body) => {
                    if status == StatusCode::FORBIDDEN {
                        tracing::warn!(%peer, namespace, pod, "refused an API drain from a non-loopback caller");
                    }
                    refusal(status, allow, body)
                }
                PodThen::Drain { wait } => {
                    tracing::info!(%peer, namespace, pod, wait, "API drain requested");
                    drain_response(&handle.start(), Trigger::Api, wait).await
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ip: [u8; 4]) -> SocketAddr {
        SocketAddr::from((ip, 40_000))
    }

    #[test]
    fn routes_by_method_path_query_and_caller() {
        let lo = at([127, 0, 0, 1]);
        let far = at([10, 0, 0, 7]);
        let pod = |then| ApiRoute::Pod {
            namespace: "pay".into(),
            pod: "a".into(),
            then,
        };
        for (method, path, query, peer, want) in [
            (Method::GET, "/metrics", "", far, ApiRoute::Metrics),
            (Method::HEAD, "/status", "", far, ApiRoute::Status),
            (Method::GET, "/pods/pay/a", "", far, pod(PodThen::Show)),
            (
                Method::POST,
                "/pods/pay/a/drain",
                "",
                lo,
                pod(PodThen::Drain { wait: false }),
            ),
            (
                Method::GET,
                "/pods/pay/a/drain",
                "wait=true",
                lo,
                pod(PodThen::Drain { wait: true }),
            ),
            (
                Method::GET,
                "/pods//uid-1",
                "",
                far,
                ApiRoute::Pod {
                    namespace: String::new(),
                    pod: "uid-1".into(),
                    then: PodThen::Show,
                },
            ),
        ] {
            assert_eq!(
                route(&method, path, query, peer),
                want,
                "{method} {path}?{query}"
            );
        }
        for (method, path, query, peer, status) in [
            (
                Method::POST,
                "/metrics",
                "",
                lo,
                StatusCode::METHOD_NOT_ALLOWED,
            ),
            (Method::GET, "/nope", "", lo, StatusCode::NOT_FOUND),
            (Method::GET, "/pods/pay", "", lo, StatusCode::NOT_FOUND),
            (
                Method::GET,
                "/pods/pay/a/b/c",
                "",
                lo,
                StatusCode::NOT_FOUND,
            ),
            (
                Method::POST,
                "/pods/pay/a/drain",
                "",
                far,
                StatusCode::FORBIDDEN,
            ),
            (
                Method::GET,
                "/pods/pay/a/drain",
                "",
                lo,
                StatusCode::METHOD_NOT_ALLOWED,
            ),
            (
                Method::GET,
                "/pods/pay/a/drain",
                "wait=maybe",
                lo,
                StatusCode::BAD_REQUEST,
            ),
            (
                Method::DELETE,
                "/pods/pay/a/drain",
                "",
                lo,
                StatusCode::METHOD_NOT_ALLOWED,
            ),
            (
                Method::POST,
                "/pods/pay/a",
                "",
                lo,
                StatusCode::METHOD_NOT_ALLOWED,
            ),
        ] {
            let got = match route(&method, path, query, peer) {
                ApiRoute::Answer(s, _, _) => s,
                ApiRoute::Pod {
                    then: PodThen::Refuse(s, _, _),
                    ..
                } => s,
                other => panic!("{method} {path}?{query} from {peer}: {other:?}"),
            };
            assert_eq!(got, status, "{method} {path}?{query} from {peer}");
        }
    }
}
