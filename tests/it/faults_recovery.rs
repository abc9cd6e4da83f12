//! No pod left stuck DRAINING silently (issue 8 item 2; Contour #4851,
//! Envoy Gateway #5832): a fresh `drainshim sidecar` (the real binary)
//! started beside a real Envoy 1.40 that an earlier drain left behind.
//!
//! - health check failed, listeners up: recovered after Envoy's drain time;
//! - a graceful drain still running when the shim starts: never undone, and
//!   once its listeners stop the pod is flagged, not recovered;
//! - listeners stopped (non-graceful `/drain_listeners`): `/readyz` 503 with
//!   the reason, `drainshim_envoy_stuck_draining 1`, and a log line saying
//!   to replace the pod.

use crate::support;

use std::time::Duration;

use drainshim::drain::Outcome;
use drainshim::envoy::AdminClient;
use drainshim_bench::envoy::EnvoyProcess;
use support::load::{at, Seen, Unary, CALLS_PER_STEP, SLOW_MS};
use support::*;
use tokio::time::Instant;

/// Envoy's `--drain-time-s` in these tests: the shim waits this (+2 s)
/// before it restores a failed health check.
const ENVOY_DRAIN_TIME: Duration = Duration::from_secs(1);
/// Envoy's `--drain-time-s` for the drain the shim restarts into: long
/// enough that calls are seen flowing on both sides of the restart.
const RUNNING_DRAIN_TIME: Duration = Duration::from_secs(4);

async fn envoy_1_40() -> (Backend, EnvoyProcess) {
    let backend = backend().await;
    let envoy = envoy_with("1.40.0", backend.addr, |o| o.drain_time = ENVOY_DRAIN_TIME).await;
    (backend, envoy)
}

/// Envoy 1.40 with its health check failed, and its admin client.
async fn envoy_failing_its_health_check() -> (Backend, EnvoyProcess, AdminClient) {
    let (backend, envoy) = envoy_1_40().await;
    let admin = envoy.admin_client();
    admin
        .healthcheck_fail()
        .await
        .expect("fail the health check");
    (backend, envoy, admin)
}

async fn metric(shim: std::net::SocketAddr, name: &str) -> Option<f64> {
    let (_, body) = http(shim, "GET", "/metrics").await;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The real shim binary for `envoy`, polling every 100 ms, with `extra`
/// flags.
async fn shim_for(envoy: &EnvoyProcess, extra: &[&str]) -> SidecarBin {
    let admin = envoy.admin_url();
    let mut args = vec!["--envoy-admin", &admin, "--poll-interval", "100ms"];
    args.extend_from_slice(extra);
    sidecar_bin(&args).await
}

/// The shim's recoveries and its stuck-draining flag read these.
async fn assert_recoveries_and_stuck(shim: &SidecarBin, recoveries: f64, stuck: f64) {
    assert_eq!(
        metric(shim.addr, "drainshim_envoy_recoveries_total").await,
        Some(recoveries)
    );
    assert_eq!(
        metric(shim.addr, "drainshim_envoy_stuck_draining").await,
        Some(stuck)
    );
}

/// (a) The health check was failed (an earlier drain that died before it
/// drained the listeners, or a shim restarted in that window) and nothing
/// stopped the listeners: the fresh shim says why it is not ready, waits out
/// Envoy's drain time in case a graceful drain is running, then restores the
/// health check, logs and counts it. Envoy is LIVE and ready again, and a
/// drain afterwards works as usual.
#[tokio::test]
async fn a_failed_health_check_with_listeners_up_is_recovered() {
    let (_backend, envoy, admin) = envoy_failing_its_health_check().await;
    assert_eq!(admin.ready().await.ok(), Some(false));

    let shim = shim_for(&envoy, &[]).await;
    // First the wait, with its reason.
    wait_for("/readyz explains the wait", WAIT, || async {
        let (code, body) = http(shim.addr, "GET", "/readyz").await;
        code == 503 && body.contains("restoring it in") || admin.ready().await.ok() == Some(true)
    })
    .await;
    // Then the recovery.
    wait_for("envoy is ready again", WAIT, || async {
        admin.ready().await.ok() == Some(true)
    })
    .await;
    let info = admin.server_info().await.expect("server_info");
    assert_eq!(info.state, "LIVE");
    assert_eq!(admin.listeners_stopped().await.expect("stats"), 0);
    wait_for("the shim is ready", WAIT, || async {
        http(shim.addr, "GET", "/readyz").await.0 == 200
    })
    .await;
    assert_recoveries_and_stuck(&shim, 1.0, 0.0).await;
    shim.wait_log("recovered envoy from an earlier drain").await;
    assert!(
        shim.log().contains("POST /healthcheck/ok"),
        "{}",
        shim.log()
    );

    // The pod drains normally afterwards.
    let (code, body) = http(shim.addr, "POST", "/drain?wait=true").await;
    assert_eq!(code, 200, "{body}");
    let report: drainshim::drain::Report = serde_json::from_str(&body).expect("report");
    assert_eq!(report.outcome, Outcome::Quiesced, "{report:?}");
    assert_eq!(admin.ready().await.ok(), Some(false), "drained again");
}

/// A shim that starts while a graceful drain runs (its container restarted
/// during preStop, say) must not undo it. The drain is made the way a shim
/// makes it: health check failed, then `drain_listeners?graceful&inboundonly`.
/// The fresh shim waits; the listeners stop at Envoy's drain time, before the
/// shim would restore anything; from then on the pod is flagged as stuck and
/// Envoy's health check is never restored. Unary calls run through Envoy
/// from before the drain: the shim's restart touches nothing of the data
/// path, and no call fails or hangs while Envoy's inbound listener is up,
/// but for those the client itself failed as Envoy's own drain shut their
/// connection down (`support::load::Outcome::Unsent`). Once the drain has stopped the
/// listener, new calls are refused (counted and printed, not asserted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_running_at_start_is_never_undone() {
    let backend = backend().await;
    let envoy = envoy_with("1.40.0", backend.addr, |o| {
        o.drain_time = RUNNING_DRAIN_TIME
    })
    .await;
    let admin = envoy.admin_client();
    let load = Unary::start(envoy.inbound, SLOW_MS);
    let workers = load.workers();
    load.wait_more(CALLS_PER_STEP, "before the drain").await;
    admin
        .healthcheck_fail()
        .await
        .expect("fail the health check");
    admin
        .drain_listeners(true, true)
        .await
        .expect("graceful inbound drain");
    // Envoy's inbound listener is up at least until now; each poll that
    // finds it up moves this on (it stops once, at Envoy's drain time).
    let mut up_until = Instant::now();
    load.wait_more(CALLS_PER_STEP, "the drain running").await;

    let fault = Instant::now();
    let shim = shim_for(&envoy, &[]).await;
    let started = fault.elapsed();
    load.wait_more(CALLS_PER_STEP, "after the shim restarted")
        .await;
    // Watch Envoy's health check until the shim has reached its verdict: it
    // must stay failed the whole time.
    let deadline = Instant::now() + WAIT;
    loop {
        let asked = Instant::now();
        if admin.listeners_stopped().await.ok() == Some(0) {
            up_until = asked;
        }
        assert_eq!(
            admin.ready().await.ok(),
            Some(false),
            "the shim undid a running drain:\n{}",
            shim.log()
        );
        let (code, body) = http(shim.addr, "GET", "/readyz").await;
        assert_eq!(code, 503, "{body}");
        if body.contains("cannot serve again") {
            break;
        }
        assert!(Instant::now() < deadline, "no verdict: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let verdict = fault.elapsed();
    load.wait_more(CALLS_PER_STEP, "after the verdict").await;
    let calls = load.finish().await;
    let seen = Seen::of(&calls, workers, fault);
    // The same calls against the end of Envoy's drain: its listener stopped.
    let up = Seen::of(&calls, workers, up_until);
    seen.table_line(
        "the shim restarted mid-drain",
        "0 (none held)",
        &format!(
            "nothing to recover from: the new shim was up {:.2} s after it started, its verdict at {:.2} s",
            started.as_secs_f64(),
            verdict.as_secs_f64()
        ),
        &format!(
            "Envoy's listener up until {}: {} before it stopped, {} after",
            at(up_until, fault),
            up.before.line(),
            up.after.line(),
        ),
    );
    up.assert_none_failed_before(&shim.log());
    assert_recoveries_and_stuck(&shim, 0.0, 1.0).await;
    // Stopped listeners never reopen, so this verdict is final: the health
    // check stays failed, as the drain left it.
    shim.wait_log("replace the pod").await;
    assert_eq!(admin.ready().await.ok(), Some(false), "{}", shim.log());
    assert!(!shim.log().contains("recovered envoy"), "{}", shim.log());
}

/// (b) `POST /drain_listeners` (not graceful) stopped every listener at
/// once; the health check still passes, so Envoy's own `/ready` says 200
/// while nothing can reach the app. A fresh shim is not ready, says why,
/// sets `drainshim_envoy_stuck_draining` to 1 and logs what to do.
#[tokio::test]
async fn stopped_listeners_are_made_loud() {
    let (_backend, envoy) = envoy_1_40().await;
    let admin = envoy.admin_client();
    admin
        .drain_listeners(false, false)
        .await
        .expect("non-graceful drain");
    wait_for("envoy stopped its listeners", WAIT, || async {
        admin.listeners_stopped().await.unwrap_or(0) >= 1
    })
    .await;
    assert_eq!(
        admin.ready().await.ok(),
        Some(true),
        "Envoy itself still says ready"
    );
    assert!(
        tokio::net::TcpStream::connect(envoy.inbound).await.is_err(),
        "the inbound listener is closed"
    );

    let shim = shim_for(&envoy, &["--pod-namespace", "shop", "--pod-name", "web-a"]).await;
    wait_for("/readyz says the pod is stuck", WAIT, || async {
        let (code, body) = http(shim.addr, "GET", "/readyz").await;
        code == 503 && body.contains("stopped") && body.contains("replace it")
    })
    .await;
    assert_eq!(
        metric(shim.addr, "drainshim_envoy_stuck_draining").await,
        Some(1.0)
    );
    shim.wait_log("replace the pod").await;
    let log = shim.log();
    let line = log
        .lines()
        .find(|l| l.contains("replace the pod"))
        .expect("the log line");
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains("shop/web-a"), "names the pod: {line}");
    // Nothing was changed on Envoy.
    assert_eq!(admin.ready().await.ok(), Some(true));
}
