//! The control endpoints (`/metrics /healthz /readyz /status /drain`).
//!
//! Even first byte: an `http::Request` built from fuzz data (method, URI,
//! headers, caller address, `--allow-drain-from`) goes through `route`, the
//! whole request validation; the decision must obey the endpoint contract.
//!
//! Odd first byte: the rest is raw bytes on a connection, served by hyper
//! with the real server settings into the real `Control::handle`, with a
//! real drain driver behind it. The caller is not loopback and not allowed,
//! so no drain ever starts and runs stay independent; nothing is dialled.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arbitrary::Arbitrary;
use drainshim::control::{may_mutate, route, Control, Route, RouteRefusal};
use drainshim::drain::{self, DrainSettings};
use drainshim::envoy::AdminClient;
use drainshim::metrics::Metrics;
use http::{Method, Request};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use ipnet::IpNet;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Arbitrary)]
struct Structured<'a> {
    method: &'a [u8],
    uri: &'a [u8],
    headers: Vec<(&'a [u8], &'a [u8])>,
    peer: Peer,
    allow: Vec<(Peer, u8)>,
}

#[derive(Debug, Arbitrary)]
enum Peer {
    V4([u8; 4]),
    V6([u8; 16]),
    Loopback,
}

impl Peer {
    fn ip(&self) -> IpAddr {
        match self {
            Peer::V4(b) => IpAddr::V4(Ipv4Addr::from(*b)),
            Peer::V6(b) => IpAddr::V6(Ipv6Addr::from(*b)),
            Peer::Loopback => IpAddr::V4(Ipv4Addr::LOCALHOST),
        }
    }
}

fn structured(data: &[u8]) {
    let Ok(input) = Structured::arbitrary_take_rest(arbitrary::Unstructured::new(data)) else {
        return;
    };
    let mut builder = Request::builder().method(input.method).uri(input.uri);
    for (k, v) in &input.headers {
        builder = builder.header(*k, *v);
    }
    // What hyper would refuse never reaches the handler.
    let Ok(req) = builder.body(()) else {
        return;
    };
    let peer = input.peer.ip();
    let allow: Vec<IpNet> = input
        .allow
        .iter()
        .filter_map(|(p, len)| IpNet::new(p.ip(), *len).ok())
        .collect();
    let path = req.uri().path();
    let query = req.uri().query().unwrap_or("");
    let decision = route(req.method(), path, query, peer, &allow);
    let get = matches!(*req.method(), Method::GET | Method::HEAD);
    match &decision {
        Route::Metrics | Route::Healthz | Route::Status | Route::Readyz => assert!(get),
        Route::Drain { wait } => {
            assert_eq!(path, "/drain");
            assert!(
                may_mutate(peer, &allow),
                "a drain from a caller not allowed"
            );
            assert!(*req.method() == Method::POST || (*req.method() == Method::GET && *wait));
        }
        Route::Refused(r) => {
            let resp = r.response();
            assert!(resp.status().is_client_error());
            if let RouteRefusal::NotFound(p) = r {
                assert_eq!(p, path);
            }
        }
    }
    if path != "/drain" {
        assert!(!matches!(decision, Route::Drain { .. }));
    }
}

struct Server {
    rt: tokio::runtime::Runtime,
    control: Arc<Control>,
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let control = rt.block_on(async {
            let mut registry = prometheus_client::registry::Registry::default();
            let metrics = Metrics::register(&mut registry);
            // Never dialled: no drain starts (see the module docs).
            let admin = AdminClient::new("http://127.0.0.1:9", Duration::from_millis(10))
                .expect("admin url");
            let (drain, _driver) = drain::spawn(
                DrainSettings {
                    timers: Default::default(),
                    admin,
                    guard: None,
                },
                metrics,
            );
            Arc::new(Control {
                drain,
                registry: Arc::new(registry),
                admin: None,
                allow_drain_from: Vec::new(),
                telemetry: None,
                // No stuck-DRAINING watcher: nothing here talks to an Envoy.
                envoy_health: None,
                // No guard, so no data path to check.
                data_path: None,
            })
        });
        Server { rt, control }
    })
}

fn raw(data: &[u8]) {
    let s = server();
    // TEST-NET-1: neither loopback nor allowed.
    let peer = SocketAddr::from(([192, 0, 2, 1], 40000));
    s.rt.block_on(async {
        let (mut client, conn) = tokio::io::duplex(64 * 1024);
        let control = s.control.clone();
        let svc = service_fn(move |req| {
            let control = control.clone();
            async move {
                let resp = control.handle(peer, req).await;
                assert_ne!(resp.status(), http::StatusCode::ACCEPTED, "a drain started");
                Ok::<_, std::convert::Infallible>(resp)
            }
        });
        let serve =
            drainshim::http::server::http1_builder().serve_connection(TokioIo::new(conn), svc);
        let talk = async {
            let _ = client.write_all(data).await;
            let _ = client.shutdown().await;
            let mut answer = Vec::new();
            let _ = client.read_to_end(&mut answer).await;
            answer
        };
        let (_, answer) = tokio::join!(serve, talk);
        // Nothing, or HTTP/1.x responses (1.0 for 1.0 requests).
        assert!(answer.is_empty() || answer.starts_with(b"HTTP/1."));
        assert!(!answer.windows(14).any(|w| w == b" 202 Accepted\r"));
    });
    assert_eq!(
        s.control.drain.status().phase,
        drainshim::drain::Phase::Serving,
        "a drain started"
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    if which % 2 == 0 {
        structured(rest);
    } else {
        raw(rest);
    }
});
