//! Honest readiness, with the real binary: `/readyz` follows the data path
//! (the guard accepts, the app answers) by the `--ready-failures` rule.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use drainshim_bench::envoy::shipped_bootstrap;
use drainshim_bench::server::{serve, BenchService};
use support::*;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const INTERVAL: Duration = Duration::from_millis(100);

async fn readyz(shim: SocketAddr) -> (u16, String) {
    http(shim, "GET", "/readyz").await
}

#[tokio::test]
async fn readyz_follows_the_app_behind_the_guard() {
    let app = backend().await;
    let app_addr = app.addr;
    let admin_port = free_port();
    let shim = sidecar_bin(&[
        "--envoy-admin",
        &format!("http://127.0.0.1:{admin_port}"),
        "--guard-listen",
        &ANY_PORT.to_string(),
        "--guard-upstream",
        &app_addr.to_string(),
        "--ready-interval",
        "100ms",
        "--ready-failures",
        "3",
    ])
    .await;
    let guard = shim.guard();
    let bootstrap = shipped_bootstrap(guard, app_addr, admin_port).expect("bootstrap");
    let _envoy = envoy_with("1.40.0", guard, |o| {
        o.admin_port = admin_port;
        o.custom_bootstrap = Some(bootstrap);
    })
    .await;
    wait_for(
        "ready with Envoy, the guard and the app up",
        WAIT,
        || async { readyz(shim.addr).await.0 == 200 },
    )
    .await;

    // The app goes away: not ready, but only after three failed checks.
    drop(app);
    let gone = Instant::now();
    wait_for("the app is gone", WAIT, || async {
        tokio::net::TcpStream::connect(app_addr).await.is_err()
    })
    .await;
    wait_for("503 once the app does not answer", WAIT, || async {
        let (code, body) = readyz(shim.addr).await;
        code == 503 && body.contains("does not answer")
    })
    .await;
    // Three failed checks at least INTERVAL apart take at least two
    // intervals from the first failure, which cannot come much before `gone`
    // (a connect racing the close): well over one interval.
    assert!(
        gone.elapsed() >= INTERVAL * 3 / 2,
        "unready after {:?}: one or two failed checks must not flip /readyz",
        gone.elapsed()
    );

    // The app is back on its port: one passing check makes the pod ready.
    let listener = tokio::net::TcpListener::bind(app_addr)
        .await
        .expect("rebind the app's port");
    let stop = CancellationToken::new();
    tokio::spawn(serve(
        listener,
        BenchService::default(),
        stop.clone().cancelled_owned(),
    ));
    wait_for("200 once the app answers again", WAIT, || async {
        readyz(shim.addr).await.0 == 200
    })
    .await;
    stop.cancel();
}
