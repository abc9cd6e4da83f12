//! WebSocket over HTTP/2 (RFC 8441 extended CONNECT), as Envoy sends it when
//! its upstream to the guard speaks HTTP/2: the real `drainshim` binary's
//! guard takes the extended CONNECT, upgrades to the application over
//! HTTP/1.1, relays the frames, and a drain still ends every WebSocket with
//! a Close 1012 after everything the application sent.

use crate::support;

use support::ws::*;
use support::*;

/// An HTTP/1.1-only WebSocket app (the frame relay finds it does not answer
/// HTTP/2 and hands the connection to the h2 path before anything reached
/// Envoy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_over_http2_extended_connect_end_with_1012() {
    drain_ends_every_websocket_with_1012(ws_app().await).await;
}

/// The same through an application that speaks HTTP/2 (gRPC) and serves
/// WebSockets over HTTP/1.1 on the same port, as `drainshim bench app` does:
/// the frame relay carries the connection, and each WebSocket goes to the
/// app over HTTP/1.1 beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_over_http2_beside_grpc_on_an_http2_app_end_with_1012() {
    drain_ends_every_websocket_with_1012(mixed_app().await).await;
}

/// Four WebSockets over Envoy's HTTP/2-only upstream to the guard, then a
/// drain: each ends with 1012, gapless, with the app's last tick.
async fn drain_ends_every_websocket_with_1012(app: WsApp) {
    const N: usize = 4;
    // Envoy's upstream to the guard is HTTP/2 only: every WebSocket reaches
    // the guard as an extended CONNECT.
    let (envoy, shim, _) = guard_bin_pod(app.addr, WS_TIMERS, |o| o.extended_connect = true).await;
    let mut clients = Vec::new();
    for i in 0..N {
        clients.push(ws_ticker(envoy.inbound, &format!("h2ws{i}"), 100, 2_000).await);
    }
    let run = prestop(shim.addr).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let report = run.report();
    for (task, _) in clients {
        let end = tokio::time::timeout(WAIT, task)
            .await
            .expect("client finished in time")
            .expect("client task");
        assert_eq!(end.close_code, Some(1012), "{}: {end:?}", end.id);
        assert!(end.gapless(), "{}: gaps in {:?}", end.id, end.seqs);
        let written = app.ledger.last_written(&end.id).expect("ledger entry");
        assert_eq!(
            end.seqs.last().copied(),
            Some(written),
            "{}: lost ticks",
            end.id
        );
    }
    assert_eq!(
        (report.streams.cut, report.streams.terminated),
        (0, N as u64),
        "{report:?}"
    );
    let log = shim.log();
    assert!(!log.contains("WebSocket (HTTP/2) upgrade"), "{log}");
}
