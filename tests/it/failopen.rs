//! Fail open: real Envoy 1.40 runs the shipped bootstrap
//! (`deploy/components/envoy/envoy.yaml`, ports moved to ephemeral ones), the
//! real `drainshim` binary is the guard, and it is killed with SIGKILL under
//! steady unary gRPC load. Requests keep succeeding while it is dead (Envoy
//! goes to the app directly), and come back through the guard once it is
//! started again. Where each call went is what Envoy itself counts per
//! upstream host (`/clusters`): the shim only counts streams during a drain.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use drainshim::bench::envoy::shipped_bootstrap;
use drainshim::bench::failopen::{host_requests, wait_host_traffic, Load, Summary};
use support::*;
use tokio::time::Instant;

async fn shim(admin_port: u16, guard: SocketAddr, app: SocketAddr) -> SidecarBin {
    sidecar_bin(&[
        "--envoy-admin",
        &format!("http://127.0.0.1:{admin_port}"),
        "--guard-listen",
        &guard.to_string(),
        "--guard-upstream",
        &app.to_string(),
    ])
    .await
}

#[tokio::test]
async fn requests_survive_a_sigkill_of_the_shim_and_return_to_the_guard() {
    let app = backend().await;
    let guard: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let admin_port = free_port();
    let mut first = shim(admin_port, guard, app.addr).await;
    let bootstrap = shipped_bootstrap(guard, app.addr, admin_port).expect("shipped bootstrap");
    let envoy = envoy_with("1.40.0", guard, |o| {
        o.admin_port = admin_port;
        o.custom_bootstrap = Some(bootstrap);
    })
    .await;

    let load = Load::start(envoy.inbound, 4, Duration::from_millis(5), 1_000_000);
    // Steady state: traffic goes through the guard.
    wait_host_traffic(envoy.admin, guard, 50, WAIT)
        .await
        .expect("traffic flows through the guard before the kill");
    let direct_before = host_requests(envoy.admin, app.addr).await.unwrap_or(0);

    // SIGKILL the real binary, and wait until it is gone.
    first.child.start_kill().expect("SIGKILL the shim");
    let killed = Instant::now();
    tokio::time::timeout(WAIT, first.child.wait())
        .await
        .expect("the shim exits after SIGKILL")
        .expect("reap the shim");

    // While it is dead, Envoy sends the calls to the app directly.
    wait_host_traffic(envoy.admin, app.addr, direct_before + 200, WAIT)
        .await
        .expect("Envoy falls back to the app while the guard is dead");
    let guard_while_dead = host_requests(envoy.admin, guard)
        .await
        .expect("guard host stats");

    // Started again: traffic returns to the guard.
    let _second = shim(admin_port, guard, app.addr).await;
    let restarted = Instant::now();
    let back = wait_host_traffic(envoy.admin, guard, guard_while_dead, WAIT)
        .await
        .expect("traffic returns to the guard after the restart");
    // Some calls after the return, then the verdict.
    wait_host_traffic(envoy.admin, guard, guard_while_dead + 100, WAIT)
        .await
        .expect("calls keep flowing through the guard");
    let calls = load.finish().await;
    let s = Summary::of(&calls, killed);
    eprintln!(
        "fail-open: {} calls, {} failed ({:.4}%), all succeeding {:?} after the kill, \
         back through the guard {:?} after the restart",
        s.calls,
        s.failed,
        100.0 * s.failed_share(),
        s.recovered_after,
        back - restarted
    );
    let during = calls
        .iter()
        .filter(|c| c.start >= killed && c.end <= restarted)
        .count();
    assert!(
        during >= 100,
        "only {during} calls ran while the shim was dead"
    );
    // A call in flight at the kill is reset before any response, one that
    // finds the port closed gets connect-failure; the shipped retry policy
    // replays both on priority 1, the app, which answers on loopback. Only if
    // both tries failed would a call fail: measured 0 of ~900 in most runs
    // and 1 of 757 once (the share against the 0.1% goal is measured over
    // ~6,000 calls by `cargo bench --bench failopen`). Without the fallback
    // about a third of the calls fail.
    assert!(
        s.failed <= 1,
        "{} of {} calls failed across the kill",
        s.failed,
        s.calls
    );
}
