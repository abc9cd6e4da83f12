//! The plain-HTTP control endpoints on `--listen`, for Kubernetes:
//!
//! | endpoint | what |
//! |---|---|
//! | `GET /metrics` | Prometheus text |
//! | `GET /healthz` | the process is alive |
//! | `GET /readyz` | 503 while draining, while Envoy is not ready, or while Envoy is stuck (see `recovery`) |
//! | `GET /status` | the status JSON |
//! | `POST /drain` | start the drain (idempotent); 202 with the status |
//! | `GET\|POST /drain?wait=true` | start if needed, block until done; 200 with the report (preStop `httpGet`) |
//!
//! Mutating calls are accepted only from the pod's own loopback addresses
//! (127.0.0.1, ::1) or `--allow-drain-from`. Served by `http::server`, as
//! the node agent's API and the webhook are.

pub mod listener_drains;
pub mod readiness;
pub mod recovery;
pub mod telemetry;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use ipnet::IpNet;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::drain::{DrainHandle, Phase, Trigger};
use crate::envoy::AdminClient;
use crate::http::server::{json, not_allowed, openmetrics, serve_fn, text};

/// Prometheus' default scrape timeout is 10 s; stay well inside it.
const TELEMETRY_BUDGET: Duration = Duration::from_secs(5);

/// What the endpoints serve.
pub struct Control {
    pub drain: DrainHandle,
    pub registry: Arc<Registry>,
    /// Asked on `/readyz`; None when there is no Envoy to ask.
    pub admin: Option<AdminClient>,
    /// Besides loopback, who may start a drain.
    pub allow_drain_from: Vec<IpNet>,
    /// Read fresh at each scrape; None when there is no Envoy to read.
    pub telemetry: Option<Arc<crate::control::telemetry::Telemetry>>,
    /// The watcher of a stuck or half-drained Envoy; `/readyz` is 503 while
    /// it says so. None when nothing watches (node mode has its own view).
    pub envoy_health: Option<crate::control::recovery::EnvoyHealth>,
    /// Whether the guard accepts and the app answers (`--ready-failures`
    /// rule); `/readyz` is 503 while it says no. None without a guard.
    pub data_path: Option<crate::control::readiness::DataPath>,
}

/// 127.0.0.1 or ::1, or inside one of the allowed networks. IPv4-mapped
/// IPv6 addresses are judged as the IPv4 address they carry.
///
/// Not the rest of 127.0.0.0/8: Istio's inbound passthrough connects to the
/// app from 127.0.0.6, so in a mesh pod whose control port is captured, any
/// caller that reaches the pod IP arrives from there. Every `/drain` (the
/// sidecar's, the node agent's and each pod's listener) asks this.
pub fn may_mutate(peer: IpAddr, allow: &[IpNet]) -> bool {
    let peer = match peer {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
        v4 => v4,
    };
    let own_loopback = match peer {
        IpAddr::V4(v4) => v4 == Ipv4Addr::LOCALHOST,
        IpAddr::V6(v6) => v6 == Ipv6Addr::LOCALHOST,
    };
    own_loopback || allow.iter().any(|n| n.contains(&peer))
}

/// What a request asks for, decided from its method, path, query and caller
/// alone: no state is read and nothing is started here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET|HEAD /metrics`.
    Metrics,
    /// `GET|HEAD /healthz`.
    Healthz,
    /// `GET|HEAD /status`.
    Status,
    /// `GET|HEAD /readyz`.
    Readyz,
    /// `POST /drain[?wait=..]` or `GET /drain?wait=true`, from an allowed caller.
    Drain { wait: bool },
    /// Answered at once without touching the drain.
    Refused(RouteRefusal),
}

/// Why a request is answered with an error, and with which.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteRefusal {
    /// 404 for an unknown path.
    NotFound(String),
    /// 405 with `Allow`.
    NotAllowed(&'static str),
    /// 405: `GET /drain` without `?wait=true`.
    DrainGetWithoutWait,
    /// 400: a bad `/drain` query; the message says why.
    BadQuery(String),
    /// 403: a drain from a caller that is neither 127.0.0.1/::1 nor allowed.
    Forbidden(IpAddr),
}

/// Decides what a request gets. Pure, so it can be tested on any input.
pub fn route(method: &Method, path: &str, query: &str, peer: IpAddr, allow: &[IpNet]) -> Route {
    let get = matches!(*method, Method::GET | Method::HEAD);
    match path {
        "/metrics" if get => Route::Metrics,
        "/healthz" if get => Route::Healthz,
        "/status" if get => Route::Status,
        "/readyz" if get => Route::Readyz,
        "/metrics" | "/healthz" | "/status" | "/readyz" => {
            Route::Refused(RouteRefusal::NotAllowed("GET"))
        }
        "/drain" => match drain_form(method, query) {
            Err(refusal) => Route::Refused(refusal),
            Ok(wait) if may_mutate(peer, allow) => Route::Drain { wait },
            Ok(_) => Route::Refused(RouteRefusal::Forbidden(peer)),
        },
        _ => Route::Refused(RouteRefusal::NotFound(path.to_string())),
    }
}

/// The forms of a drain request, shared by every `/drain` (the sidecar's,
/// the node agent's per-pod API): `POST` starts it (with `?wait=true` it
/// also waits), `GET` only with `?wait=true` (what a preStop `httpGet`
/// sends). Returns whether to wait. The caller checks who is asking.
pub fn drain_form(method: &Method, query: &str) -> Result<bool, RouteRefusal> {
    let wait = parse_wait(query).map_err(RouteRefusal::BadQuery)?;
    match (method, wait) {
        (&Method::POST, _) | (&Method::GET, true) => Ok(wait),
        (&Method::GET, false) => Err(RouteRefusal::DrainGetWithoutWait),
        _ => Err(RouteRefusal::NotAllowed("GET, POST")),
    }
}

/// Starts (or joins) the drain behind `drain`: with `wait`, answers with its
/// report (200) once done; without, at once with its status (202).
pub async fn drain_response(
    drain: &DrainHandle,
    trigger: Trigger,
    wait: bool,
) -> Response<Full<Bytes>> {
    let status = drain.trigger(trigger).await;
    if !wait {
        return json(StatusCode::ACCEPTED, &status);
    }
    match drain.report().await {
        Some(report) => json(StatusCode::OK, &report),
        None => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the drain driver has stopped\n",
        ),
    }
}

/// Tasks alive on this runtime (`/status`'s `tasks`): a task left behind per
/// connection or pod shows as growth over a soak.
pub fn alive_tasks() -> usize {
    tokio::runtime::Handle::try_current().map_or(0, |h| h.metrics().num_alive_tasks())
}

// === impl RouteRefusal ===

impl RouteRefusal {
    /// The error answer, with a body that says what to do instead.
    pub fn response(&self) -> Response<Full<Bytes>> {
        match self {
            RouteRefusal::NotFound(path) => {
                text(StatusCode::NOT_FOUND, format!("no such endpoint: {path}\n"))
            }
            RouteRefusal::NotAllowed(allow) => not_allowed(allow),
            RouteRefusal::DrainGetWithoutWait => text(
                StatusCode::METHOD_NOT_ALLOWED,
                "GET /drain needs ?wait=true (the preStop form); use POST /drain to start without waiting\n",
            ),
            RouteRefusal::BadQuery(msg) => text(StatusCode::BAD_REQUEST, msg.clone()),
            RouteRefusal::Forbidden(ip) => text(
                StatusCode::FORBIDDEN,
                format!(
                    "drain refused: {ip} is not 127.0.0.1 or ::1 and not in --allow-drain-from\n"
                ),
            ),
        }
    }
}

// === impl Control ===

impl Control {
    /// Routes one request. Never panics on input.
    pub async fn handle(&self, peer: SocketAddr, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let query = req.uri().query().unwrap_or("");
        let route = route(
            req.method(),
            req.uri().path(),
            query,
            peer.ip(),
            &self.allow_drain_from,
        );
        match route {
            Route::Metrics => {
                self.refresh_telemetry().await;
                openmetrics(crate::metrics::render(&self.registry))
            }
            Route::Healthz => text(StatusCode::OK, "ok\n"),
            Route::Status => {
                // The drain's status, and the tasks alive on the runtime.
                let mut status = serde_json::to_value(self.drain.status()).unwrap_or_default();
                if let Some(map) = status.as_object_mut() {
                    map.insert("tasks".into(), alive_tasks().into());
                }
                json(StatusCode::OK, &status)
            }
            Route::Readyz => self.readyz().await,
            Route::Drain { wait } => self.drain(wait, peer).await,
            Route::Refused(refusal) => {
                if let RouteRefusal::Forbidden(_) = refusal {
                    tracing::warn!(%peer, "refused a drain request from a caller that is not allowed");
                }
                refusal.response()
            }
        }
    }

    /// Bounded, so a hung Envoy admin never holds a scrape past its timeout;
    /// the scrape then serves the last values.
    async fn refresh_telemetry(&self) {
        if let Some(t) = &self.telemetry {
            let draining = self.drain.status().phase != Phase::Serving;
            if tokio::time::timeout(TELEMETRY_BUDGET, t.refresh(draining))
                .await
                .is_err()
            {
                tracing::debug!("telemetry refresh timed out; serving the last values");
            }
        }
    }

    async fn readyz(&self) -> Response<Full<Bytes>> {
        let phase = self.drain.status().phase;
        if phase != Phase::Serving {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: draining ({phase:?})\n"),
            );
        }
        if let Some(reason) = self
            .envoy_health
            .as_ref()
            .and_then(|h| h.not_ready_reason())
        {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {reason}\n"),
            );
        }
        if let Some(reason) = self.data_path.as_ref().and_then(|d| d.not_ready_reason()) {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {reason}\n"),
            );
        }
        match &self.admin {
            None => text(StatusCode::OK, "ready\n"),
            Some(admin) => match admin.ready().await {
                Ok(true) => text(StatusCode::OK, "ready\n"),
                Ok(false) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready: envoy is not ready\n",
                ),
                Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
            },
        }
    }

    /// Starts the drain (idempotent); with `wait`, answers with the report.
    async fn drain(&self, wait: bool, peer: SocketAddr) -> Response<Full<Bytes>> {
        tracing::info!(%peer, wait, "drain requested");
        // The waiting form is what a preStop hook sends.
        let trigger = if wait { Trigger::Prestop } else { Trigger::Api };
        drain_response(&self.drain, trigger, wait).await
    }
}

/// Accepts `wait=true|false` (or a bare `wait`) and nothing else.
pub fn parse_wait(query: &str) -> Result<bool, String> {
    let mut wait = false;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, "true"));
        match (k, v) {
            ("wait", "true" | "1") => wait = true,
            ("wait", "false" | "0") => wait = false,
            ("wait", other) => {
                return Err(format!(
                    "bad value for wait: {other:?} (use true or false)\n"
                ))
            }
            (other, _) => {
                return Err(format!(
                    "unknown query parameter {other:?}; /drain takes only wait\n"
                ))
            }
        }
    }
    Ok(wait)
}

/// Serves HTTP/1.1 on `listener` until `shutdown` is cancelled, then lets
/// in-flight requests finish (bounded by the caller's own exit).
pub async fn serve(listener: TcpListener, control: Arc<Control>, shutdown: CancellationToken) {
    serve_fn(listener, shutdown, move |peer, req| {
        let control = control.clone();
        async move { control.handle(peer, req).await }
    })
    .await
}

#[cfg(test)]
mod tests {
    use http::header;

    use super::*;

    #[test]
    fn only_the_own_loopback_and_allowed_networks_may_drain() {
        let allow: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(may_mutate(ip("127.0.0.1"), &[]));
        assert!(may_mutate(ip("::1"), &[]));
        assert!(may_mutate(ip("::ffff:127.0.0.1"), &[]));
        // The rest of 127/8 is not the pod's own: Istio's inbound
        // passthrough connects from 127.0.0.6 on behalf of any caller.
        assert!(!may_mutate(ip("127.0.0.6"), &[]));
        assert!(!may_mutate(ip("127.3.4.5"), &[]));
        assert!(!may_mutate(ip("::ffff:127.0.0.6"), &[]));
        assert!(!may_mutate(ip("127.0.0.6"), &allow));
        // Unless --allow-drain-from names it.
        let passthrough: Vec<IpNet> = vec!["127.0.0.6/32".parse().unwrap()];
        assert!(may_mutate(ip("127.0.0.6"), &passthrough));
        assert!(may_mutate(ip("::ffff:127.0.0.6"), &passthrough));
        assert!(!may_mutate(ip("127.0.0.7"), &passthrough));
        assert!(!may_mutate(ip("10.1.2.3"), &[]));
        assert!(may_mutate(ip("10.1.2.3"), &allow));
        assert!(may_mutate(ip("::ffff:10.1.2.3"), &allow));
        assert!(!may_mutate(ip("192.168.1.1"), &allow));
        assert!(!may_mutate(ip("fe80::1"), &allow));
        assert!(!may_mutate(ip("::"), &[]));
        assert!(!may_mutate(ip("0.0.0.0"), &[]));
    }

    #[test]
    fn routes_check_method_query_and_caller() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let far: IpAddr = "192.0.2.7".parse().unwrap();
        let r =
            |m: Method, path: &str, query: &str, peer: IpAddr| route(&m, path, query, peer, &[]);
        assert_eq!(r(Method::GET, "/metrics", "", far), Route::Metrics);
        assert_eq!(r(Method::HEAD, "/readyz", "", far), Route::Readyz);
        assert_eq!(
            r(Method::POST, "/status", "", lo),
            Route::Refused(RouteRefusal::NotAllowed("GET"))
        );
        assert_eq!(
            r(Method::POST, "/drain", "", lo),
            Route::Drain { wait: false }
        );
        assert_eq!(
            r(Method::GET, "/drain", "wait=true", lo),
            Route::Drain { wait: true }
        );
        assert_eq!(
            r(Method::GET, "/drain", "", lo),
            Route::Refused(RouteRefusal::DrainGetWithoutWait)
        );
        assert_eq!(
            r(Method::PUT, "/drain", "", lo),
            Route::Refused(RouteRefusal::NotAllowed("GET, POST"))
        );
        // A bad query is refused before the caller is judged.
        assert!(matches!(
            r(Method::POST, "/drain", "force", far),
            Route::Refused(RouteRefusal::BadQuery(_))
        ));
        assert_eq!(
            r(Method::POST, "/drain", "", far),
            Route::Refused(RouteRefusal::Forbidden(far))
        );
        let passthrough: IpAddr = "127.0.0.6".parse().unwrap();
        assert_eq!(
            r(Method::GET, "/drain", "wait=true", passthrough),
            Route::Refused(RouteRefusal::Forbidden(passthrough))
        );
        assert_eq!(
            r(Method::GET, "/nope", "", lo),
            Route::Refused(RouteRefusal::NotFound("/nope".into()))
        );
        let forbidden = RouteRefusal::Forbidden(far).response();
        assert_eq!(forbidden.status(), StatusCode::FORBIDDEN);
        let not_allowed = RouteRefusal::NotAllowed("GET, POST").response();
        assert_eq!(not_allowed.headers()[header::ALLOW], "GET, POST");
    }

    #[test]
    fn wait_query() {
        assert_eq!(parse_wait(""), Ok(false));
        assert_eq!(parse_wait("wait=true"), Ok(true));
        assert_eq!(parse_wait("wait"), Ok(true));
        assert_eq!(parse_wait("wait=1&wait=false"), Ok(false));
        assert!(parse_wait("wait=soon").is_err());
        assert!(parse_wait("force=true").is_err());
    }
}
