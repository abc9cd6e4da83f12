//! Node mode's stream guard, against real Envoys (1.39 and 1.40, running
//! the shipped bootstrap) in real network namespaces: each pod that opts in
//! with node metadata `DRAINSHIM_GUARD` gets a guard served by the agent,
//! inside the pod; a pod's preStop drain ends that pod's guarded streams
//! gracefully, spread over its window, and leaves the other pod's alone;
//! and a SIGKILL of the agent leaves the pods' traffic flowing (fail open).
//!
//! Needs root; fails (never skips) without it or without the cached Envoys.

use crate::support;
use crate::support::node as node_support;
use crate::support::podapp;

use std::time::Duration;

use drainshim::drain::{Outcome, Report};
use drainshim_bench::client::{open_streams, Ending};
use drainshim_bench::failopen::{Load, Summary};
use node_support::*;
use podapp::*;
use tokio::time::Instant;

/// Long-lived streams per pod.
const STREAMS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_drain_ends_its_guarded_streams_and_leaves_the_other_pod_alone() {
    let lab = Lab::new("g");
    let a = guarded_pod(&lab, "web-a", "1.39.3", Some(GUARD_SPEC)).await;
    // web-b has no key: the node default (--guard) gives it the same guard.
    let b = guarded_pod(&lab, "web-b", "1.40.0", None).await;
    let agent = start_agent(&lab, "127.0.0.1:0", |s| {
        s.guard.default = Some(GUARD_SPEC.parse().expect("guard spec"));
    })
    .await;
    let api = agent.local_addr();
    wait_guards(api, &["web-a", "web-b"]).await;
    // Envoy's health check sees the guard within a second; wait for it to
    // route through the guard before the streams open.
    for p in [&a, &b] {
        let before = pod_host_requests(p, GUARD_LISTEN).await.unwrap_or(0);
        let probe = Load::start(p.inbound(), 1, Duration::from_millis(20), 500);
        wait_pod_host(p, GUARD_LISTEN, before).await;
        let calls = probe.finish().await;
        assert!(
            calls.iter().all(|c| c.ok),
            "{}: a unary call failed",
            p.name
        );
    }
    let limit = Duration::from_secs(60);
    let a_streams = open_streams(a.inbound(), STREAMS, "a", limit)
        .await
        .expect("web-a streams");
    let b_streams = open_streams(b.inbound(), STREAMS, "b", limit)
        .await
        .expect("web-b streams");

    // The kubelet's preStop for web-a, to its pod IP.
    let started = Instant::now();
    let (code, body) = http_in(None, a.prestop(), "GET", "/drain?wait=true")
        .await
        .expect("preStop reaches web-a's listener");
    assert_eq!(code, 200, "{body}");
    let report: Report = serde_json::from_str(&body).expect("a drain report");
    assert_eq!(report.outcome, Outcome::Quiesced, "{body}");
    assert_eq!(report.streams.cut, 0, "{body}");
    assert_eq!(
        report.streams.terminated, STREAMS as u64,
        "every guarded stream of web-a ended by the guard: {body}"
    );

    let mut ends = Vec::new();
    for h in a_streams {
        ends.push(h.await.expect("stream task"));
    }
    for e in &ends {
        assert_eq!(
            e.ending(),
            Ending::Graceful,
            "{}: {:?} after {} messages",
            e.id,
            e.status,
            e.seqs.len()
        );
        assert!(e.gapless(), "{}: a message was lost", e.id);
    }
    // Spread over the drain window (1 s here), not all at once.
    let first = ends.iter().map(|e| e.ended_at).min().expect("ends");
    let last = ends.iter().map(|e| e.ended_at).max().expect("ends");
    eprintln!(
        "web-a: {} streams ended gracefully over {:?}, report after {:?}",
        ends.len(),
        last - first,
        started.elapsed()
    );
    assert!(
        last - first >= Duration::from_millis(300),
        "endings not spread: all within {:?}",
        last - first
    );

    // web-b: untouched, its streams still flowing, its Envoy LIVE.
    assert!(
        b_streams.iter().all(|h| !h.is_finished()),
        "a web-b stream ended"
    );
    assert_eq!(
        b.envoy.admin.server_info().await.expect("web-b").state,
        "LIVE"
    );
    let pods = agent_pods(api).await;
    assert_eq!(pods["web-b"]["drain"]["phase"], "serving", "{pods:?}");
    for h in b_streams {
        h.abort();
    }
    agent.stop().await;
}

/// The agent is killed with SIGKILL under steady unary load through a pod's
/// Envoy: the guard's listener dies with it, and Envoy fails open to the
/// app (the shipped bootstrap's priority 1), as with a sidecar guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_survive_a_sigkill_of_the_agent() {
    let lab = Lab::new("c");
    let pod = guarded_pod(&lab, "web-c", "1.40.0", Some(GUARD_SPEC)).await;
    let listen = std::net::SocketAddr::from(([127, 0, 0, 1], support::free_port()));
    let mut agent = agent_bin(&lab, listen, &[]).await;
    wait_guards(listen, &["web-c"]).await;
    let load = Load::start(pod.inbound(), 4, Duration::from_millis(5), 1_000_000);
    let through_guard = pod_host_requests(&pod, GUARD_LISTEN).await.unwrap_or(0);
    wait_pod_host(&pod, GUARD_LISTEN, through_guard + 50).await;
    let direct_before = pod_host_requests(&pod, APP).await.unwrap_or(0);

    let killed = support::proc::sigkill(&mut agent.child, "the agent", NODE_WAIT).await;
    // Envoy sends the calls to the app directly now.
    wait_pod_host(&pod, APP, direct_before + 200).await;
    let calls = load.finish().await;
    let s = Summary::of(&calls, killed);
    let after = calls.iter().filter(|c| c.start >= killed).count();
    eprintln!(
        "fail-open (node): {} calls, {} after the kill, {} failed, all succeeding {:?} after it",
        s.calls, after, s.failed, s.recovered_after
    );
    assert!(after >= 100, "only {after} calls after the kill");
    // The sidecar fail-open test's tolerance (tests/failopen.rs).
    assert!(s.failed <= 1, "{} of {} calls failed", s.failed, s.calls);
}

/// A pod whose guard is missing (no `DRAINSHIM_GUARD`, no node default):
/// its Envoy fails open to the app. The agent shows, for that pod, what goes
/// around the guard, and the pod's drain counts it bypassed, not cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_around_a_missing_guard_are_shown_per_pod_and_counted_bypassed() {
    let lab = Lab::new("fo");
    let pod = guarded_pod(&lab, "web-f", "1.40.0", None).await;
    let listen = std::net::SocketAddr::from(([127, 0, 0, 1], support::free_port()));
    let mut agent = agent_bin(&lab, listen, &[]).await;
    let streams = open_streams(pod.inbound(), 3, "f", Duration::from_secs(60))
        .await
        .expect("web-f streams");
    assert_eq!(pod_host_requests(&pod, GUARD_LISTEN).await, Some(0));

    let series = r#"drainshim_failopen_active{namespace="shop",pod="web-f",kind="requests"} 3"#;
    let deadline = Instant::now() + NODE_WAIT;
    let mut text = agent_metrics(listen).await;
    while !text.contains(series) {
        assert!(Instant::now() < deadline, "no {series} in\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        text = agent_metrics(listen).await;
    }

    let (code, body) = http_in(None, pod.prestop(), "GET", "/drain?wait=true")
        .await
        .expect("preStop reaches web-f's listener");
    assert_eq!(code, 200, "{body}");
    let report: Report = serde_json::from_str(&body).expect("a drain report");
    eprintln!("node fail-open drain: {body}");
    assert_eq!(report.outcome, Outcome::Deadline, "{body}");
    assert_eq!(
        (report.streams.bypassed, report.streams.cut),
        (3, 0),
        "{body}"
    );
    let text = agent_metrics(listen).await;
    assert!(
        text.contains(
            r#"drainshim_drained_streams_total{namespace="shop",pod="web-f",outcome="bypassed"} 3"#
        ),
        "{text}"
    );
    for h in streams {
        h.abort();
    }
    agent.child.start_kill().expect("stop the agent");
    tokio::time::timeout(NODE_WAIT, agent.child.wait())
        .await
        .expect("the agent exits")
        .expect("reap the agent");
}
