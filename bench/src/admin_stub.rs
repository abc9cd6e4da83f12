//! A light stand-in for Envoy's admin API, for node-mode scale benchmarks
//! where a hundred real Envoys would measure Envoy, not the agent. It
//! answers what the agent asks, with fixed documents:
//!
//! | endpoint | answer |
//! |---|---|
//! | `GET /server_info` | `version` `stub/<version>/Clean/RELEASE/BoringSSL`, LIVE, node metadata NAMESPACE/NAME |
//! | `GET /stats` | no stats |
//! | `GET /config_dump` | no listeners |
//! | `GET /listeners` | no listeners |
//! | `GET /ready` | LIVE (503 after `POST /healthcheck/fail`) |
//! | `POST /healthcheck/fail`, `/healthcheck/ok`, `/drain_listeners` | 200 |
//!
//! It is never a substitute for Envoy in tests of behaviour.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use drainshim::http::server::text;

/// Who the stub says it is.
#[derive(Clone, Debug)]
pub struct StubIdentity {
    /// Envoy release to report, e.g. `1.40.0`.
    pub version: String,
    /// Node metadata NAMESPACE.
    pub namespace: String,
    /// Node metadata NAME.
    pub pod: String,
}

struct Stub {
    /// The `/server_info` document, rendered once.
    server_info: String,
    /// Set by `POST /healthcheck/fail`.
    failed: AtomicBool,
}

/// Serves until `shutdown`.
pub async fn serve(listener: TcpListener, id: StubIdentity, shutdown: CancellationToken) {
    let server_info = serde_json::json!({
        "version": format!("stub/{}/Clean/RELEASE/BoringSSL", id.version),
        "state": "LIVE",
        "node": {
            "id": "drainshim-admin-stub",
            "cluster": "bench",
            "metadata": {"NAMESPACE": id.namespace, "NAME": id.pod},
        },
        "command_line_options": {"drain_time": "600s", "parent_shutdown_time": "900s"},
    })
    .to_string();
    let stub = Arc::new(Stub {
        server_info,
        failed: AtomicBool::new(false),
    });
    drainshim::http::server::serve_fn(listener, shutdown, move |_peer: SocketAddr, req| {
        let stub = stub.clone();
        async move { stub.handle(req) }
    })
    .await
}

impl Stub {
    fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let json = |body: &str| {
            let mut r = text(StatusCode::OK, body);
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            r
        };
        match (req.method(), req.uri().path()) {
            (&Method::GET, "/server_info") => json(&self.server_info),
            (&Method::GET, "/stats") => json(r#"{"stats":[]}"#),
            (&Method::GET, "/config_dump") => json(r#"{"configs":[]}"#),
            (&Method::GET, "/listeners") => json(r#"{"listener_statuses":[]}"#),
            (&Method::GET, "/ready") if self.failed.load(Ordering::Relaxed) => {
                text(StatusCode::SERVICE_UNAVAILABLE, "LIVE\n")
            }
            (&Method::GET, "/ready") => text(StatusCode::OK, "LIVE\n"),
            (&Method::POST, "/healthcheck/fail") => {
                self.failed.store(true, Ordering::Relaxed);
                text(StatusCode::OK, "OK\n")
            }
            (&Method::POST, "/healthcheck/ok") => {
                self.failed.store(false, Ordering::Relaxed);
                text(StatusCode::OK, "OK\n")
            }
            (&Method::POST, "/drain_listeners") => text(StatusCode::OK, "OK\n"),
            (_, path) => text(StatusCode::NOT_FOUND, format!("stub: no {path}\n")),
        }
    }
}
