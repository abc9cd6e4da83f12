//! Endpoint security of the sidecar's control listener (issue 8 item 3),
//! for real: callers in a second network namespace made by the test (veth,
//! addresses from 198.18.0.0/15, removed on drop even when a test fails).
//!
//! - A caller that is not loopback gets 403 for `POST /drain` and
//!   `GET /drain?wait=true`, and no drain starts; read-only endpoints answer.
//! - `--allow-drain-from` covering its address lets it drain.
//! - With the default `--listen 127.0.0.1:15099`, nothing at all is
//!   reachable from another namespace.
//!
//! Needs root; fails (never skips) without it.

use crate::support;
use crate::support::node as node_support;

use std::net::{Ipv4Addr, SocketAddr};

use drainshim::drain::{Outcome, Phase, Report, Status, Trigger};
use drainshim_bench::envoy::EnvoyProcess;
use node_support::{http_in, Lab};
use support::*;

/// An in-process sidecar on `listen` (not loopback), against `envoy`.
async fn sidecar_on(
    listen: SocketAddr,
    envoy: &EnvoyProcess,
    allow_drain_from: &[&str],
) -> (
    SocketAddr,
    drainshim::drain::DrainHandle,
    tokio::sync::mpsc::UnboundedSender<()>,
) {
    let settings = sidecar_settings(&envoy.admin_url(), |s| {
        short_timers(s);
        s.listen = listen;
        s.allow_drain_from = allow_drain_from
            .iter()
            .map(|n| n.parse().expect("CIDR"))
            .collect();
    });
    let s = drainshim::sidecar::start(settings)
        .await
        .expect("start sidecar");
    let addr = s.local_addr();
    let drain = s.drain().clone();
    // The caller holds the SIGTERM sender: dropping it reads as a SIGTERM.
    let (sigterm, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(s.run(rx));
    (addr, drain, sigterm)
}

#[tokio::test]
async fn drains_from_another_namespace_are_refused_unless_allowed() {
    let lab = Lab::new("sec");
    let caller = lab.netns("caller");
    let (host_ip, caller_ip): (Ipv4Addr, Ipv4Addr) = lab.link_host(&caller);
    let from = caller.handle();
    let backend = backend().await;
    let envoy = envoy("1.40.0", backend.addr).await;

    // Default policy: loopback only.
    let (shim, drain, _sig) = sidecar_on(SocketAddr::from((host_ip, 0)), &envoy, &[]).await;
    for (method, path) in [("POST", "/drain"), ("GET", "/drain?wait=true")] {
        let (code, body) = http_in(Some(&from), shim, method, path)
            .await
            .unwrap_or_else(|e| panic!("{method} {path} from {caller_ip}: {e}"));
        assert_eq!(code, 403, "{method} {path}: {body}");
        assert!(
            body.contains(&caller_ip.to_string()) && body.contains("--allow-drain-from"),
            "{body}"
        );
    }
    // Read-only endpoints answer from there; no drain started.
    let (code, body) = http_in(Some(&from), shim, "GET", "/healthz")
        .await
        .expect("healthz");
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let (code, body) = http_in(Some(&from), shim, "GET", "/status")
        .await
        .expect("status");
    assert_eq!(code, 200);
    let status: Status = serde_json::from_str(&body).expect("status JSON");
    assert_eq!(status.phase, Phase::Serving);
    assert_eq!(drain.status().phase, Phase::Serving);
    assert_eq!(envoy.admin_client().ready().await.ok(), Some(true));

    // Allowed by CIDR: the same caller drains.
    let allow = format!("{caller_ip}/32");
    let (shim2, _drain2, _sig2) =
        sidecar_on(SocketAddr::from((host_ip, 0)), &envoy, &[&allow]).await;
    let (code, body) = http_in(Some(&from), shim2, "POST", "/drain")
        .await
        .expect("POST /drain");
    assert_eq!(code, 202, "{body}");
    let status: Status = serde_json::from_str(&body).expect("status JSON");
    assert_eq!(status.trigger, Some(Trigger::Api));
    let (code, body) = http_in(Some(&from), shim2, "GET", "/drain?wait=true")
        .await
        .expect("GET /drain?wait=true");
    assert_eq!(code, 200, "{body}");
    let report: Report = serde_json::from_str(&body).expect("report");
    assert_eq!(report.outcome, Outcome::Quiesced, "{report:?}");
    // The first shim, still refusing, never drained.
    assert_eq!(drain.status().phase, Phase::Serving);
}

#[tokio::test]
async fn the_default_listen_address_is_unreachable_from_another_namespace() {
    let lab = Lab::new("lis");
    let pod = lab.netns("shim");
    let other = lab.netns("other");
    let (pod_ip, _other_ip) = lab.link_pair(&pod, &other);
    // The real binary with the default --listen, inside the pod namespace
    // (so the fixed port 15099 is free for sure).
    let mut cmd = tokio::process::Command::new("ip");
    cmd.args(["netns", "exec", &pod.name])
        .arg(drainshim_bin())
        .args(["sidecar", "--linger", "0s"]);
    let shim = sidecar_bin_cmd(cmd).await;
    assert_eq!(
        shim.addr,
        "127.0.0.1:15099".parse::<SocketAddr>().expect("addr")
    );
    // It serves inside its own namespace.
    let (code, _) = http_in(Some(&pod.handle()), shim.addr, "GET", "/healthz")
        .await
        .expect("healthz from inside the pod");
    assert_eq!(code, 200);
    // From the other namespace nothing connects: not the pod's address, not
    // any endpoint.
    let from = other.handle();
    for target in [SocketAddr::from((pod_ip, 15099)), shim.addr] {
        for (method, path) in [("GET", "/healthz"), ("POST", "/drain")] {
            let err = http_in(Some(&from), target, method, path)
                .await
                .expect_err("reachable from another namespace");
            assert!(
                err.contains("refused") || err.contains("unreachable"),
                "{target}: {err}"
            );
        }
    }
}
