//! A small `bench reconnect` in every mode, asserting what must hold: with
//! drainshim nothing is cut and nothing lost; a plain Envoy SIGTERM cuts
//! every stream on the restarted pod; Istio's default drain cuts every
//! stream older than its 5 s.

use crate::support;

use std::time::Duration;

use drainshim_bench::measure::ModeResult;
use drainshim_bench::population::Protocol;
use drainshim_bench::reconnect::{run_mode, Mode, ReconnectOptions};
use support::envoy_binary;

fn small() -> ReconnectOptions {
    let mut o = ReconnectOptions::new(envoy_binary("1.40.0"));
    o.streams = 40;
    o.deregistration_delay = Duration::from_millis(500);
    o.drain_time = Duration::from_secs(3);
    o.parent_shutdown_time = Duration::from_secs(6);
    o.progress = false;
    o
}

/// The one result row of a single-protocol run.
fn one(mut rows: Vec<ModeResult>) -> ModeResult {
    assert_eq!(rows.len(), 1, "{rows:?}");
    rows.remove(0)
}

#[tokio::test]
async fn drainshim_mode_cuts_nothing_and_loses_nothing() {
    let r = one(run_mode(&small(), Mode::Drainshim).await.expect("bench"));
    eprintln!("{r:?}");
    assert!(r.streams_on_restarted_pod >= 10, "{r:?}");
    assert_eq!(r.cut, 0, "{r:?}");
    assert_eq!(r.lost_messages, 0, "{r:?}");
    assert_eq!(r.graceful, r.streams_on_restarted_pod, "{r:?}");
    // Every client found pod B again.
    assert!(r.reconnect_p99_ms > 0.0, "{r:?}");
}

/// Half gRPC streams, half WebSockets: both kinds end gracefully (trailers
/// 14, Close 1012), nothing cut, nothing lost, one row each.
#[tokio::test]
async fn drainshim_mode_ends_grpc_streams_and_websockets_alike() {
    let mut o = small();
    o.protocol = Protocol::Mixed;
    let rows = run_mode(&o, Mode::Drainshim).await.expect("bench");
    eprintln!("{rows:?}");
    let protocols: Vec<&str> = rows.iter().map(|r| r.protocol.as_str()).collect();
    assert_eq!(protocols, ["grpc", "websocket"]);
    for r in &rows {
        assert!(r.streams_on_restarted_pod >= 5, "{r:?}");
        assert_eq!(r.cut, 0, "{r:?}");
        assert_eq!(r.lost_messages, 0, "{r:?}");
        assert_eq!(r.graceful, r.streams_on_restarted_pod, "{r:?}");
    }
}

#[tokio::test]
async fn envoy_sigterm_cuts_every_stream_on_the_pod() {
    let r = one(run_mode(&small(), Mode::EnvoySigterm).await.expect("bench"));
    eprintln!("{r:?}");
    assert!(r.streams_on_restarted_pod >= 10, "{r:?}");
    assert_eq!(r.cut, r.streams_on_restarted_pod, "{r:?}");
}

#[tokio::test]
async fn envoy_sigterm_cuts_every_websocket_on_the_pod() {
    let mut o = small();
    o.protocol = Protocol::Websocket;
    let r = one(run_mode(&o, Mode::EnvoySigterm).await.expect("bench"));
    eprintln!("{r:?}");
    assert_eq!(r.protocol, "websocket");
    assert!(r.streams_on_restarted_pod >= 10, "{r:?}");
    assert_eq!(r.cut, r.streams_on_restarted_pod, "{r:?}");
}

#[tokio::test]
async fn istio_default_cuts_every_stream_older_than_its_drain() {
    let r = one(run_mode(&small(), Mode::IstioDefault).await.expect("bench"));
    eprintln!("{r:?}");
    // Every stream on pod A was opened before the restart began, so each is
    // older than 5 s when Envoy is killed.
    assert!(r.streams_on_restarted_pod >= 10, "{r:?}");
    assert_eq!(r.cut, r.streams_on_restarted_pod, "{r:?}");
    assert!(r.restart_seconds >= 5.0, "{r:?}");
}

/// A short soak under the guard's max connection age: connections are
/// recycled (GOAWAY, grace, graceful end) and every stream comes back, with
/// nothing cut and nothing lost: the steady state an operator soaks for a week.
#[tokio::test]
async fn soak_under_max_connection_age_recycles_streams_gracefully() {
    let mut o = small();
    o.streams = 20;
    o.max_connection_age = Some(Duration::from_secs(2));
    o.max_connection_age_grace = Duration::from_secs(1);
    // Envoy pools its upstream connections: one connection carries many
    // streams, and the spread keeps them from reconnecting together.
    o.max_connection_age_spread = Duration::from_secs(1);
    let r = drainshim_bench::reconnect::soak(&o, Duration::from_secs(8))
        .await
        .expect("soak");
    eprintln!("{r:?}");
    assert!(
        r.reconnects >= 20,
        "max age should have recycled every stream at least once: {r:?}"
    );
    assert_eq!(r.cut, 0, "{r:?}");
    assert_eq!(r.lost_messages, 0, "{r:?}");
    assert_eq!(r.graceful, r.reconnects, "{r:?}");
}
