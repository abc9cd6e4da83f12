//! The drain core against real Envoy (no guard yet): honest counting,
//! early exit, unreachable admin, idempotent triggers.

use crate::support;

use std::time::Duration;

use drainshim::drain::{Outcome, Phase, Trigger};
use support::proc::metrics_showing_cut;
use support::*;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Long-lived streams through Envoy, no guard: the drain reaches the deadline
/// and says every stream is cut. This is what makes the counting honest.
async fn long_streams_are_cut_at_the_deadline(version: &str) {
    const N: usize = 5;
    let backend = backend().await;
    let envoy = envoy(version, backend.addr).await;
    let streams = open_streams(envoy.inbound, N, "long").await;
    wait_for("envoy sees every stream", WAIT, || async {
        envoy_streams(&envoy).await == N as u64
    })
    .await;

    let (shim, _drain, _sig, _task) = start_sidecar(&envoy.admin_url(), short_timers).await;
    let run = prestop(shim).await;
    assert_eq!(run.code, Some(0), "prestop stderr: {}", run.stderr);
    let r = run.report();
    assert_eq!(r.outcome, Outcome::Deadline);
    assert_eq!(r.trigger, Trigger::Prestop);
    assert_eq!(r.envoy.version, version);
    assert!(r.envoy.reachable);
    assert_eq!(
        (r.streams.at_start, r.streams.cut, r.streams.terminated),
        (N as u64, N as u64, 0)
    );
    // One connection per stream, each still carrying it.
    assert_eq!(
        (
            r.connections.at_start,
            r.connections.cut,
            r.connections.idle_at_exit
        ),
        (N as u64, N as u64, 0)
    );
    assert!(
        run.stderr.contains("drainshim prestop: drain"),
        "no progress lines: {}",
        run.stderr
    );

    // Envoy really did keep the streams: nothing was ended behind our back.
    assert_eq!(envoy_streams(&envoy).await, N as u64);
    let metrics = metrics_showing_cut(shim, N).await;
    assert!(
        metrics.contains("drainshim_drains_total{outcome=\"deadline\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("drainshim_draining 0"), "{metrics}");
    drop(envoy);
    for s in streams {
        let end = tokio::time::timeout(WAIT, s)
            .await
            .expect("stream ends")
            .expect("join");
        assert!(end.gapless(), "{}: gaps in {:?}", end.id, end.seqs);
    }
}

#[tokio::test]
async fn long_streams_are_cut_at_the_deadline_envoy_1_40() {
    long_streams_are_cut_at_the_deadline("1.40.0").await;
}

#[tokio::test]
async fn long_streams_are_cut_at_the_deadline_envoy_1_38() {
    long_streams_are_cut_at_the_deadline("1.38.3").await;
}

/// Short requests only: callers stop sending during the deregistration delay,
/// the last request in flight finishes on its own, and the drain ends at the
/// next poll, long before the drain time, with nothing cut.
#[tokio::test]
async fn short_requests_only_quiesce_early() {
    const POLL: Duration = Duration::from_millis(300);
    let backend = backend().await;
    let envoy = envoy_with("1.40.0", backend.addr, |o| {
        o.drain_time = Duration::from_secs(20)
    })
    .await;
    let (shim, drain, _sig, _task) = start_sidecar(&envoy.admin_url(), |s| {
        s.budget.timers = timers(ms(500), secs(20), secs(30), ms(300))
    })
    .await;
    let stop = CancellationToken::new();
    let traffic = tokio::spawn(unary_until(envoy.inbound, stop.clone(), 2_000));
    // The last request: a short stream of 40 messages, 40 ms apart (~1.6 s),
    // that outlives the deregistration delay and then completes by itself.
    let last = tokio::spawn(finite_request(envoy.inbound, 40, 40));
    wait_for("envoy sees the traffic", WAIT, || async {
        envoy_streams(&envoy).await >= 1
    })
    .await;

    let (code, body) = http(shim, "POST", "/drain").await;
    assert_eq!(code, 202, "{body}");
    let status: drainshim::drain::Status = serde_json::from_str(&body).expect("status JSON");
    assert_eq!(status.phase, Phase::Deregistering);
    assert_eq!(status.trigger, Some(Trigger::Api));
    // Unary requests keep landing while endpoints deregister; then callers stop.
    let mut status_rx = drain.subscribe();
    status_rx
        .wait_for(|s| s.elapsed_seconds >= 0.3 || s.report.is_some())
        .await
        .expect("driver alive");
    stop.cancel();
    let (ok, _) = traffic.await.expect("traffic task");
    assert!(ok >= 5, "only {ok} unary calls succeeded");
    assert!(
        drain.status().report.is_none(),
        "ended while a request was still in flight"
    );

    let (messages, last_done) = last.await.expect("last request");
    assert_eq!(messages, 40, "the last request was not served in full");
    let report = tokio::time::timeout(WAIT, drain.report())
        .await
        .expect("report in time")
        .expect("report");
    let done = Instant::now();
    assert_eq!(report.outcome, Outcome::Quiesced);
    assert_eq!((report.streams.cut, report.connections.cut), (0, 0));
    assert!(report.streams.completed >= 2, "{report:?}");
    assert!(
        report.duration_seconds < 20.0,
        "did not end early: {report:?}"
    );
    // The exit comes at the first poll after the last request ends: at most
    // about one interval. Bounded loosely so a loaded CI machine does not flake.
    let latency = done.saturating_duration_since(last_done);
    eprintln!(
        "drain exit latency after the last request: {latency:?} = {:.2} x poll interval",
        latency.as_secs_f64() / POLL.as_secs_f64()
    );
    assert!(
        latency < POLL + Duration::from_secs(2),
        "exit latency {latency:?}"
    );
}

/// Envoy's admin refuses connections: the drain still ends by its deadline,
/// names the cause, and `prestop` exits 0.
#[tokio::test]
async fn admin_refusing_connections_ends_by_the_deadline() {
    let gone = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = gone.local_addr().expect("addr");
    drop(gone);
    let (shim, _drain, _sig, _task) = start_sidecar(&format!("http://{addr}"), short_timers).await;
    let run = prestop(shim).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let r = run.report();
    assert_eq!(r.outcome, Outcome::EnvoyUnreachable);
    assert!(!r.envoy.reachable);
    assert!(r.duration_seconds < 10.0, "{r:?}");
    assert!(
        run.stderr.contains("unreachable"),
        "progress should say why: {}",
        run.stderr
    );
}

// The hung admin is in the fault matrix, tests/faults_envoy.rs.

/// Concurrent preStop hooks, POSTs and waits: one drain, one report for all.
#[tokio::test]
async fn concurrent_triggers_share_one_drain() {
    let backend = backend().await;
    let envoy = envoy("1.40.0", backend.addr).await;
    let _streams = open_streams(envoy.inbound, 2, "shared").await;
    let (shim, _drain, _sig, _task) = start_sidecar(&envoy.admin_url(), short_timers).await;

    let prestops: Vec<_> = (0..3).map(|_| tokio::spawn(prestop(shim))).collect();
    let waits: Vec<_> = (0..2)
        .map(|_| tokio::spawn(http(shim, "GET", "/drain?wait=true")))
        .collect();
    let posts: Vec<_> = (0..3)
        .map(|_| tokio::spawn(http(shim, "POST", "/drain")))
        .collect();

    let mut reports = Vec::new();
    for p in prestops {
        let run = p.await.expect("prestop task");
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        reports.push(run.report());
    }
    for w in waits {
        let (code, body) = w.await.expect("wait task");
        assert_eq!(code, 200, "{body}");
        reports.push(serde_json::from_str(&body).expect("report JSON"));
    }
    for p in posts {
        let (code, body) = p.await.expect("post task");
        assert_eq!(code, 202, "{body}");
    }
    assert!(
        reports.windows(2).all(|w| w[0] == w[1]),
        "reports differ: {reports:#?}"
    );
    assert_eq!(reports[0].streams.cut, 2);
    // A trigger after the end returns the same report again.
    let (code, body) = http(shim, "POST", "/drain?wait=true").await;
    assert_eq!(code, 200);
    assert_eq!(
        serde_json::from_str::<drainshim::drain::Report>(&body).expect("report"),
        reports[0]
    );
    let (_, metrics) = http(shim, "GET", "/metrics").await;
    assert!(
        metrics.contains("drainshim_drains_total{outcome=\"deadline\"} 1\n"),
        "{metrics}"
    );
}

/// A SIGTERM joins a running preStop drain rather than starting another, and
/// the sidecar returns the same report.
#[tokio::test]
async fn sigterm_joins_a_prestop_drain() {
    let backend = backend().await;
    let envoy = envoy("1.40.0", backend.addr).await;
    let (shim, drain, sig, task) = start_sidecar(&envoy.admin_url(), short_timers).await;
    let first = drain.trigger(Trigger::Prestop).await;
    assert_eq!(first.trigger, Some(Trigger::Prestop));
    sig.send(()).expect("sidecar alive");
    let report = tokio::time::timeout(WAIT, task)
        .await
        .expect("sidecar exits")
        .expect("join");
    assert_eq!(report.trigger, Trigger::Prestop);
    assert_eq!(report.outcome, Outcome::Quiesced);
    // The control endpoint is closed once the sidecar returns.
    assert!(tokio::net::TcpStream::connect(shim).await.is_err());
}
