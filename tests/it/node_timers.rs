//! Per-pod drain timers in node mode, against the real `drainshim node`
//! binary and real Envoys in real network namespaces: each pod's own timers
//! (Envoy node metadata `DRAINSHIM_DRAIN_TIME`, ...) govern its drain, and
//! a pod whose timers break the sidecar's rules is named (one warn line
//! with every violation, `/status`, `drainshim_node_pod_timers_invalid`)
//! and drained with the agent's timers.
//!
//! Needs root; fails (never skips) without it or without the cached Envoys.

use crate::support;
use crate::support::node as node_support;
use crate::support::podapp::agent_bin;

use std::net::SocketAddr;

use drainshim::drain::{Outcome, Report, Trigger};
use node_support::*;

/// web-a's own timers: it may not quiesce before 2.5 s, where the agent's
/// (`AGENT_FLAGS`: deadline 2 s) end every drain.
const WEB_A: &[(&str, &str)] = &[
    ("DRAINSHIM_MIN_DRAIN_TIME", "2500ms"),
    ("DRAINSHIM_DRAIN_TIME", "3s"),
    ("DRAINSHIM_PARENT_SHUTDOWN_TIME", "4s"),
];
/// web-b's: deregistration alone lasts 4 s, past web-a's whole budget.
const WEB_B: &[(&str, &str)] = &[
    ("DRAINSHIM_DEREGISTRATION_DELAY", "4s"),
    ("DRAINSHIM_DRAIN_TIME", "5s"),
    ("DRAINSHIM_PARENT_SHUTDOWN_TIME", "6s"),
    ("DRAINSHIM_TERMINATION_GRACE_PERIOD", "10s"),
];
/// web-c's break three rules. Were they applied, its drain could not
/// quiesce before its deadline (min 20 s, deadline 10 s): `deadline`.
const WEB_C: &[(&str, &str)] = &[
    ("DRAINSHIM_MIN_DRAIN_TIME", "20s"),
    ("DRAINSHIM_DRAIN_TIME", "10s"),
    ("DRAINSHIM_PARENT_SHUTDOWN_TIME", "10s"),
    ("DRAINSHIM_POLL_INTERVAL", "often"),
];
/// The reasons web-c is reported with.
const WEB_C_REASONS: [&str; 3] = [
    "unparsable_poll_interval",
    "min_drain_time_above_drain_time",
    "drain_time_not_below_parent_shutdown_time",
];

/// A pod with its own timers, reachable from the host (its preStop).
async fn pod(lab: &Lab, name: &str, timers: &[(&str, &str)]) -> (PodEnvoy, SocketAddr) {
    let ns = lab.netns(name);
    let (_host, ip) = lab.link_host(&ns);
    let envoy = lab
        .envoy(&ns, "1.40.0", |o| {
            o.metadata.insert("NAMESPACE".into(), "shop".into());
            o.metadata.insert("NAME".into(), name.into());
            for (k, v) in timers {
                o.metadata.insert(k.to_string(), v.to_string());
            }
        })
        .await;
    (envoy, SocketAddr::from((ip, POD_LISTEN_PORT)))
}

async fn prestop(pod: SocketAddr) -> Report {
    let (code, body) = http_in(None, pod, "GET", "/drain?wait=true")
        .await
        .expect("preStop reaches the pod listener");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("a drain report")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pod_drains_with_its_own_timers_and_invalid_ones_are_named() {
    let lab = Lab::new("t");
    let (a, a_addr) = pod(&lab, "web-a", WEB_A).await;
    let (b, b_addr) = pod(&lab, "web-b", WEB_B).await;
    let (c, c_addr) = pod(&lab, "web-c", WEB_C).await;
    let listen = SocketAddr::from(([127, 0, 0, 1], support::free_port()));
    let agent = agent_bin(&lab, listen, &[]).await;

    // The agent read every pod's metadata: /status shows what each drain
    // will run with, and why.
    let pods = support::wait_for_ok("every pod's timers are read", NODE_WAIT, || async {
        let pods = agent_pods(listen).await;
        let read = ["web-a", "web-b", "web-c"].iter().all(|p| {
            pods.get(*p)
                .is_some_and(|s| s["listener"].get("listening").is_some())
        }) && pods["web-a"]["timers"]["source"] == "pod"
            && pods["web-b"]["timers"]["source"] == "pod"
            && pods["web-c"]["timers"]["invalid"]
                .as_array()
                .is_some_and(|v| !v.is_empty());
        match read {
            true => Ok(pods),
            false => Err(format!("{pods:?}")),
        }
    })
    .await;
    let timers = |p: &str| {
        let t = &pods[p]["timers"];
        [
            "deregistration_delay",
            "min_drain_time",
            "drain_time",
            "parent_shutdown_time",
            "poll_interval",
        ]
        .map(|k| t[k].as_str().unwrap_or_default().to_string())
    };
    // Keys a pod leaves out are the agent's (AGENT_FLAGS).
    assert_eq!(timers("web-a"), ["200ms", "2500ms", "3s", "4s", "100ms"]);
    assert_eq!(timers("web-b"), ["4s", "200ms", "5s", "6s", "100ms"]);
    assert_eq!(pods["web-b"]["timers"]["termination_grace_period"], "10s");
    assert_eq!(pods["web-c"]["timers"]["source"], "agent");
    assert_eq!(timers("web-c"), ["200ms", "200ms", "1s", "2s", "100ms"]);
    let invalid: Vec<&str> = pods["web-c"]["timers"]["invalid"]
        .as_array()
        .expect("invalid")
        .iter()
        .map(|v| v["reason"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(invalid, WEB_C_REASONS, "{pods:?}");

    // One warn line for web-c, naming every violation; none for the others.
    agent
        .wait_log("the pod's drain timers (node metadata) are invalid")
        .await;
    let log = agent.log();
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("the pod's drain timers (node metadata) are invalid"))
        .collect();
    assert_eq!(warned.len(), 1, "{log}");
    for needle in [
        "web-c",
        "WARN",
        r#"DRAINSHIM_POLL_INTERVAL ("often") is not a duration"#,
        "DRAINSHIM_MIN_DRAIN_TIME (20s) must not exceed DRAINSHIM_DRAIN_TIME (10s)",
        "DRAINSHIM_DRAIN_TIME (10s) must be less than DRAINSHIM_PARENT_SHUTDOWN_TIME (10s)",
    ] {
        assert!(
            warned[0].contains(needle),
            "{needle:?} not in {}",
            warned[0]
        );
    }

    // The metric: one series per violation of web-c, none for the others.
    let m = agent_metrics(listen).await;
    for reason in WEB_C_REASONS {
        let line = format!(
            r#"drainshim_node_pod_timers_invalid{{namespace="shop",pod="web-c",reason="{reason}"}} 1"#
        );
        assert!(m.contains(&line), "{line} missing:\n{m}");
    }
    assert_eq!(
        m.matches("drainshim_node_pod_timers_invalid{").count(),
        3,
        "{m}"
    );
    // The timers each pod drains with, as `plan`'s drain-timers step reads
    // them: the pod's own where valid, with its grace period.
    for line in [
        r#"drainshim_drain_timer_seconds{namespace="shop",pod="web-a",timer="drain_time"} 3.0"#,
        r#"drainshim_drain_timer_seconds{namespace="shop",pod="web-b",timer="deregistration_delay"} 4.0"#,
        r#"drainshim_drain_timer_seconds{namespace="shop",pod="web-b",timer="parent_shutdown_time"} 6.0"#,
        r#"drainshim_drain_timer_seconds{namespace="shop",pod="web-b",timer="termination_grace_period"} 10.0"#,
    ] {
        assert!(m.contains(line), "{line} missing:\n{m}");
    }

    // The kubelet's preStop for all three at once.
    let (ra, rb, rc) = tokio::join!(prestop(a_addr), prestop(b_addr), prestop(c_addr));
    eprintln!(
        "drains: web-a {:.2} s, web-b {:.2} s, web-c {:.2} s",
        ra.duration_seconds, rb.duration_seconds, rc.duration_seconds
    );
    // web-c's own timers could not have quiesced (min 20 s, deadline 10 s).
    for (name, r) in [("web-a", &ra), ("web-b", &rb), ("web-c", &rc)] {
        assert_eq!(r.trigger, Trigger::Prestop, "{name}");
        assert_eq!(r.outcome, Outcome::Quiesced, "{name}: {r:?}");
        assert_eq!(r.streams.cut, 0, "{name}: {r:?}");
    }
    // Nothing was open: each drain lasted as long as its own timers hold a
    // drain at the least, longer than the agent's whole budget (2 s).
    assert!(ra.duration_seconds >= 2.5, "web-a: {ra:?}");
    assert!(rb.duration_seconds >= 4.0, "web-b: {rb:?}");
    for p in [&a, &b, &c] {
        assert!(
            !p.admin.ready().await.expect("admin"),
            "a health check passes"
        );
    }
    // Every scan since (200 ms apart, over web-b's 4 s) read the same
    // metadata: still the one warn line.
    let log = agent.log();
    let warned = log
        .lines()
        .filter(|l| l.contains("the pod's drain timers (node metadata) are invalid"))
        .count();
    assert_eq!(warned, 1, "{log}");

    nix::sys::signal::kill(agent.pid(), nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let mut child = agent.child;
    let status = tokio::time::timeout(NODE_WAIT, child.wait())
        .await
        .expect("the agent exits after SIGTERM")
        .expect("reap the agent");
    assert!(status.success(), "{status}");
}
