//! The node agent's own rolling update, as the DaemonSet does it
//! (`maxSurge: 1`): the real `drainshim node` binary serves four pods (real
//! Envoy 1.39 and 1.40 in real network namespaces, the shipped bootstrap,
//! the guard opted in by node metadata) carrying 100 live gRPC streams; a
//! second agent starts on the same hand-over socket and takes every listener
//! (the node API, each pod's preStop and guard listener); the old one gets
//! SIGTERM, ends the streams it carries gracefully over its window, and
//! exits. New connections are attempted all along, to every listener
//! handed over: none is refused, no stream is cut, and the new agent then
//! carries the pods' guarded traffic and drains.
//!
//! That bootstrap retries refused and reset requests, which would hide a
//! failure: `no_retry::` runs the update again through an Envoy with no
//! retry policy and no fallback, unary calls at full speed throughout; and a SIGTERM with no successor must leave no call
//! hanging in a listener nobody accepts on.
//!
//! Needs root; fails (never skips) without it or without the cached Envoys.

use crate::support;
use crate::support::load::{
    assert_no_failed_or_hung, at, outcomes, outcomes_of, Call, Outcome, Unary, DEADLINE,
};
use crate::support::node as node_support;
use crate::support::podapp;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use drainshim::drain::Report;
use drainshim::node::netns::Netns;
use drainshim_bench::client::{open_streams, Ending};
use drainshim_bench::failopen::Load;
use drainshim_bench::proto::bench::stream_client::StreamClient;
use drainshim_bench::proto::bench::EchoRequest;
use node_support::*;
use podapp::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Live streams over all pods (the figure).
const STREAMS: usize = 100;
/// Pause between two connection attempts of one prober.
const PROBE_PAUSE: Duration = Duration::from_millis(10);
/// Most attempts one prober makes (bounds the loop in count).
const MAX_PROBES: u64 = 20_000;

/// Connection attempts to one listener: made and failed, and the failures' reasons.
#[derive(Default)]
struct Probes {
    made: AtomicU64,
    failed: AtomicU64,
    errors: std::sync::Mutex<Vec<String>>,
}

/// One HTTP/2 exchange with a guard inside the pod: preface and SETTINGS
/// out, the guard's SETTINGS back. Refused, reset or silent is a failure.
async fn guard_exchange(ns: &Netns) -> Result<(), String> {
    let addr: SocketAddr = GUARD_LISTEN.parse().expect("guard address");
    let mut tcp = ns
        .connect(addr, Duration::from_secs(2))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut hello = drainshim::guard::H2_PREFACE.to_vec();
    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    tcp.write_all(&hello)
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut head = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(5), tcp.read_exact(&mut head))
        .await
        .map_err(|_| "no SETTINGS within 5 s".to_string())?
        .map_err(|e| format!("read: {e}"))?;
    if head[3] != 4 {
        return Err(format!("first frame is type {}, not SETTINGS", head[3]));
    }
    Ok(())
}

/// Attempts connections to `what` every PROBE_PAUSE until `stop`.
fn probe<F, Fut>(stop: CancellationToken, what: String, attempt: F) -> Arc<Probes>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let p = Arc::new(Probes::default());
    let out = p.clone();
    tokio::spawn(async move {
        for _ in 0..MAX_PROBES {
            if stop.is_cancelled() {
                break;
            }
            let r = attempt().await;
            p.made.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = r {
                p.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut errs) = p.errors.lock() {
                    errs.push(format!("{what}: {e}"));
                }
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(PROBE_PAUSE) => {}
            }
        }
    });
    out
}

fn made(all: &[Arc<Probes>]) -> u64 {
    all.iter()
        .map(|p| p.made.load(Ordering::Relaxed))
        .min()
        .unwrap_or(0)
}

async fn wait_probes(all: &[Arc<Probes>], at_least: u64, what: &str) {
    let deadline = Instant::now() + NODE_WAIT;
    while made(all) < at_least {
        assert!(Instant::now() < deadline, "probes stalled: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_hands_over_without_a_cut_stream_or_a_refused_connection() {
    let lab = Lab::new("h");
    let mut pods = Vec::new();
    for (i, version) in ["1.39.3", "1.40.0", "1.39.3", "1.40.0"].iter().enumerate() {
        pods.push(guarded_pod(&lab, &format!("web-{i}"), version, Some(GUARD_SPEC)).await);
    }
    let names: Vec<String> = pods.iter().map(|p| p.name.clone()).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let (_dir, socket_s, listen) = handover_setup();
    let flags = ["--handover-socket", &socket_s, "--handover-window", "3s"];

    let mut old = agent_bin(&lab, listen, &flags).await;
    wait_guards(listen, &names).await;
    for p in &pods {
        let before = pod_host_requests(p, GUARD_LISTEN).await.unwrap_or(0);
        let warm = Load::start(p.inbound(), 1, Duration::from_millis(20), 500);
        wait_pod_host(p, GUARD_LISTEN, before).await;
        warm.finish().await;
    }
    let per_pod = STREAMS / pods.len();
    let mut streams = Vec::new();
    for p in &pods {
        streams.extend(
            open_streams(p.inbound(), per_pod, &p.name, Duration::from_secs(120))
                .await
                .expect("streams open"),
        );
    }

    // New connections all along: to each guard (inside the pod), each
    // preStop listener (from the host, as the kubelet), and the agent API.
    let stop = CancellationToken::new();
    let mut probes = Vec::new();
    for p in &pods {
        let ns = p.ns.handle();
        probes.push(probe(
            stop.clone(),
            format!("{} guard", p.name),
            move || {
                let ns = ns.clone();
                async move { guard_exchange(&ns).await }
            },
        ));
        let prestop = p.prestop();
        probes.push(probe(
            stop.clone(),
            format!("{} preStop", p.name),
            move || async move {
                match http_in(None, prestop, "GET", "/healthz").await {
                    Ok((200, _)) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        ));
    }
    probes.push(probe(
        stop.clone(),
        "agent API".into(),
        move || async move {
            match http_in(None, listen, "GET", "/healthz").await {
                Ok((200, _)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    ));
    let unary: Vec<Load> = pods
        .iter()
        .map(|p| Load::start(p.inbound(), 1, Duration::from_millis(10), 100_000))
        .collect();
    wait_probes(&probes, 20, "before the hand-over").await;

    // The rolling update: the new agent starts beside the old one...
    let started = Instant::now();
    let new = agent_bin(&lab, listen, &flags).await;
    old.wait_log("the new agent serves every listener now")
        .await;
    new.wait_log("received every listener from the old agent")
        .await;
    let handed = started.elapsed();
    let during = made(&probes);
    // ...and once it is ready, the old one gets SIGTERM and exits.
    nix::sys::signal::kill(old.pid(), nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    reap(&mut old, "the old agent").await;
    let exited = started.elapsed();
    wait_probes(&probes, during + 20, "after the old agent exited").await;
    stop.cancel();

    // Every stream the old agent carried ended gracefully; none was cut.
    let (graceful, cut) = stream_ends(streams).await;
    let mut failed_calls = 0;
    let mut calls = 0;
    for l in unary {
        let c = l.finish().await;
        calls += c.len();
        failed_calls += c.iter().filter(|c| !c.ok).count();
    }
    let attempts: u64 = probes.iter().map(|p| p.made.load(Ordering::Relaxed)).sum();
    let refused: u64 = probes
        .iter()
        .map(|p| p.failed.load(Ordering::Relaxed))
        .sum();
    let errors: Vec<String> = probes
        .iter()
        .flat_map(|p| p.errors.lock().map(|e| e.clone()).unwrap_or_default())
        .collect();
    eprintln!(
        "hand-over: listeners taken {handed:?} after the new agent started, old agent gone at {exited:?}; \
         {graceful} of {STREAMS} streams ended gracefully, {} cut; {attempts} new connections, {refused} refused; \
         {calls} unary calls through Envoy, {failed_calls} failed",
        cut.len()
    );
    assert!(
        cut.is_empty(),
        "cut streams: {cut:?}\nold agent:\n{}",
        old.log()
    );
    assert_eq!(graceful, per_pod * pods.len());
    assert_eq!(refused, 0, "refused or failed connections: {errors:?}");
    assert_eq!(failed_calls, 0, "unary calls failed through Envoy");

    // The new agent carries the guarded traffic now, and drains with it.
    new_agent_drains(listen, &names, &pods[0], &new, "hand-over").await;
}

/// Long streams through the pod (the figure).
const LONG: usize = 10;
/// Calls made between two steps of the test (the overlap of both agents,
/// the old one's exit, after it): a count, so the load is seen flowing.
const CALLS_PER_STEP: u64 = 400;

/// Waits (bounded) until `agent`, sent SIGTERM, has exited, and exited 0.
async fn reap(agent: &mut AgentBin, what: &str) {
    let status = tokio::time::timeout(NODE_WAIT, agent.child.wait())
        .await
        .unwrap_or_else(|_| panic!("{what} did not exit:\n{}", agent.log()))
        .expect("reap the agent");
    assert!(status.success(), "{what}: {status}\n{}", agent.log());
}

/// How each long stream ended (each waited for, bounded): how many ended
/// gracefully, and the others described. A lost message fails at once.
async fn stream_ends(
    streams: Vec<tokio::task::JoinHandle<drainshim_bench::client::StreamEnd>>,
) -> (usize, Vec<String>) {
    let mut graceful = 0;
    let mut cut = Vec::new();
    for h in streams {
        let e = tokio::time::timeout(NODE_WAIT, h)
            .await
            .expect("stream ended")
            .expect("stream task");
        match e.ending() {
            Ending::Graceful => graceful += 1,
            other => cut.push(format!("{}: {other:?} {:?}", e.id, e.status)),
        }
        assert!(e.gapless(), "{}: a message was lost", e.id);
    }
    (graceful, cut)
}

/// Once the new agent (`listen`) guards `names`, it drains 4 fresh streams
/// through `pod` on its preStop: every one ended gracefully, none cut.
async fn new_agent_drains(
    listen: SocketAddr,
    names: &[&str],
    pod: &GuardedNodePod,
    new: &AgentBin,
    what: &str,
) {
    wait_guards(listen, names).await;
    let fresh = open_streams(pod.inbound(), 4, "after", Duration::from_secs(60))
        .await
        .expect("streams after the hand-over");
    let (code, body) = http_in(None, pod.prestop(), "GET", "/drain?wait=true")
        .await
        .expect("preStop to the new agent");
    assert_eq!(code, 200, "{body}");
    let report: Report = serde_json::from_str(&body).expect("report");
    eprintln!(
        "{what}: the new agent's drain: {} terminated, {} cut",
        report.streams.terminated, report.streams.cut
    );
    assert_eq!(report.streams.cut, 0, "{body}");
    assert_eq!(
        report.streams.terminated,
        4,
        "{body}\nnew agent:\n{}",
        new.log()
    );
    for h in fresh {
        let e = h.await.expect("stream task");
        assert_eq!(e.ending(), Ending::Graceful, "{}: {:?}", e.id, e.status);
    }
}

/// A hand-over socket in a fresh directory (kept while the `TempDir`
/// lives), and a free loopback address for the agents' API.
fn handover_setup() -> (tempfile::TempDir, String, SocketAddr) {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("handover.sock");
    let socket = socket.to_string_lossy().into_owned();
    let listen = SocketAddr::from(([127, 0, 0, 1], support::free_port()));
    (dir, socket, listen)
}

/// The rolling update through an Envoy with no retry policy, at load.
mod no_retry;

/// One unary call on a channel of its own, answered by the app after
/// `delay`, with a deadline a little later.
async fn one_call(addr: SocketAddr, delay: Duration) -> Call {
    let endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://{addr}")).expect("endpoint");
    let mut client = StreamClient::new(endpoint.connect_lazy());
    let mut req = tonic::Request::new(EchoRequest {
        body: "outlasting".into(),
        delay_ms: u32::try_from(delay.as_millis()).expect("delay in ms"),
    });
    let deadline = delay + DEADLINE;
    req.set_timeout(deadline);
    let start = Instant::now();
    let outcome = match tokio::time::timeout(deadline, client.echo(req)).await {
        Ok(Ok(_)) => Outcome::Ok,
        Ok(Err(s)) => Outcome::Failed(format!("outlasting call: {:?} {:?}", s.code(), s.message())),
        Err(_) => Outcome::Hung("outlasting call: no answer by the deadline".into()),
    };
    Call {
        start,
        end: Instant::now(),
        outcome,
    }
}

/// SIGTERM with no successor (the DaemonSet deleted, or the next agent
/// not there yet): the agent stops accepting and ends its streams over the
/// window, and its guard listener is closed then, not left listening with
/// nobody accepting: Envoy's new connections are refused and the shipped
/// bootstrap sends the calls to the app (fail open). A listener left open
/// would queue them in its backlog, where every call hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_without_a_successor_closes_the_guard_listener() {
    let lab = Lab::new("t");
    let pod = guarded_pod(&lab, "alone", "1.40.0", Some(GUARD_SPEC)).await;
    let (_dir, socket_s, listen) = handover_setup();
    let flags = ["--handover-socket", &socket_s, "--handover-window", "3s"];
    let mut agent = agent_bin(&lab, listen, &flags).await;
    wait_guards(listen, &[&pod.name]).await;
    let before = pod_host_requests(&pod, GUARD_LISTEN).await.unwrap_or(0);
    let load = Unary::start(pod.inbound(), 200);
    wait_pod_host(&pod, GUARD_LISTEN, before).await;
    let streams = open_streams(pod.inbound(), 4, "alone", Duration::from_secs(60))
        .await
        .expect("streams open");
    load.wait_more(CALLS_PER_STEP, "before SIGTERM").await;

    let sigterm = Instant::now();
    nix::sys::signal::kill(agent.pid(), nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let status = tokio::time::timeout(NODE_WAIT, agent.child.wait())
        .await
        .unwrap_or_else(|_| panic!("the agent did not exit:\n{}", agent.log()))
        .expect("reap the agent");
    assert!(status.success(), "agent: {status}\n{}", agent.log());
    let exited = sigterm.elapsed();
    load.wait_more(CALLS_PER_STEP, "after the agent exited")
        .await;
    let calls = load.finish().await;
    let (failed, hung) = outcomes(&calls, sigterm, "SIGTERM");
    let mut cut = Vec::new();
    for h in streams {
        let e = tokio::time::timeout(NODE_WAIT, h)
            .await
            .expect("stream ended")
            .expect("stream task");
        if e.ending() != Ending::Graceful {
            cut.push(format!("{}: {:?}", e.id, e.status));
        }
    }
    eprintln!(
        "SIGTERM without a successor: {} unary calls, {} failed, {} hung; {} of 4 long streams cut; agent exited after {exited:?}",
        calls.len(),
        failed.len(),
        hung.len(),
        cut.len()
    );
    let logs = format!("agent:\n{}", agent.log());
    assert_no_failed_or_hung(calls.len(), (&failed, &hung), &logs);
    assert!(cut.is_empty(), "cut streams: {cut:?}");
}
