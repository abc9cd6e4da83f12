//! The node agent's API routing (`drainshim node`): the agent's own
//! endpoints (`node::api::route`) and each pod's preStop listener
//! (`node::pod::pod_listener_route`), on requests built from fuzz data.
//!
//! Beyond "never panics", the decisions must obey the endpoint contract:
//! a drain only for a POST (or a GET with `?wait=true`) from loopback on
//! `/pods/<namespace>/<pod>/drain`; the namespace and pod are exactly the
//! path's two segments; the read-only endpoints only for GET/HEAD; a pod
//! listener drains only on `GET /drain?wait=true`.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use arbitrary::Arbitrary;
use drainshim::node::api::{route, ApiRoute, PodThen};
use drainshim::node::pod::{pod_listener_route, PodListenerRoute};
use http::{Method, StatusCode, Uri};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input<'a> {
    method: &'a [u8],
    /// Either a whole request target, or one shaped like the pod routes.
    uri: Target<'a>,
    peer: Peer,
}

#[derive(Debug, Arbitrary)]
enum Target<'a> {
    Raw(&'a [u8]),
    Pod {
        namespace: &'a str,
        pod: &'a str,
        drain: bool,
        query: &'a str,
    },
}

#[derive(Debug, Arbitrary)]
enum Peer {
    V4([u8; 4]),
    V6([u8; 16]),
    Loopback,
}

impl Peer {
    fn addr(&self) -> SocketAddr {
        let ip = match self {
            Peer::V4(b) => IpAddr::V4(Ipv4Addr::from(*b)),
            Peer::V6(b) => IpAddr::V6(Ipv6Addr::from(*b)),
            Peer::Loopback => IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        SocketAddr::new(ip, 40_000)
    }
}

/// The only callers a drain may come from: 127.0.0.1 and ::1 (and
/// 127.0.0.1 mapped into IPv6), not the rest of 127/8 (Istio's inbound
/// passthrough connects from 127.0.0.6).
fn loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6 == Ipv6Addr::LOCALHOST, |v4| v4 == Ipv4Addr::LOCALHOST),
        IpAddr::V4(v4) => v4 == Ipv4Addr::LOCALHOST,
    }
}

fuzz_target!(|input: Input| {
    let Ok(method) = Method::from_bytes(input.method) else {
        return;
    };
    let uri: Result<Uri, _> = match input.uri {
        Target::Raw(b) => Uri::try_from(b),
        Target::Pod {
            namespace,
            pod,
            drain,
            query,
        } => {
            let tail = if drain { "/drain" } else { "" };
            Uri::try_from(format!("/pods/{namespace}/{pod}{tail}?{query}"))
        }
    };
    let Ok(uri) = uri else {
        return;
    };
    let path = uri.path();
    let query = uri.query().unwrap_or("");
    let peer = input.peer.addr();
    let get = matches!(method, Method::GET | Method::HEAD);

    match route(&method, path, query, peer) {
        ApiRoute::Metrics | ApiRoute::Healthz | ApiRoute::Readyz | ApiRoute::Status => {
            assert!(get, "{method} {path} routed to a read-only endpoint");
            assert!(matches!(
                path,
                "/metrics" | "/healthz" | "/readyz" | "/status"
            ));
        }
        ApiRoute::Pod {
            namespace,
            pod,
            then,
        } => {
            assert!(!namespace.contains('/') && !pod.contains('/'));
            let base = format!("/pods/{namespace}/{pod}");
            let drain_path = path == format!("{base}/drain");
            assert!(
                path == base || drain_path,
                "{path} is not /pods/{namespace}/{pod}[/drain]"
            );
            match then {
                PodThen::Show => assert!(get && path == base),
                PodThen::Drain { wait } => {
                    assert!(drain_path, "a drain from {path}");
                    assert!(loopback(peer.ip()), "a drain from {peer}");
                    assert!(
                        method == Method::POST || (method == Method::GET && wait),
                        "{method} {path}?{query} drains"
                    );
                }
                PodThen::Refuse(status, allow, _) => {
                    assert!(status.is_client_error(), "{status}");
                    assert!(allow.is_none() || status == StatusCode::METHOD_NOT_ALLOWED);
                }
            }
        }
        ApiRoute::Answer(status, allow, _) => {
            assert!(status.is_client_error(), "{status}");
            assert!(allow.is_none() || status == StatusCode::METHOD_NOT_ALLOWED);
        }
    }

    match pod_listener_route(&method, path, query) {
        PodListenerRoute::Drain => {
            assert_eq!((&method, path), (&Method::GET, "/drain"));
            assert_eq!(drainshim::control::parse_wait(query), Ok(true));
        }
        PodListenerRoute::Healthz => assert!(get && path == "/healthz"),
        PodListenerRoute::NotFound => {}
    }
});
