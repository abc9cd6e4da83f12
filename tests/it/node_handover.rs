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
use crate::support::node as node_support;
use crate::support::podapp;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use drainshim::bench::client::{open_streams, Ending};
use drainshim::bench::failopen::Load;
use drainshim::drain::Report;
use drainshim::node::netns::Netns;
use drainshim::proto::bench::stream_client::StreamClient;
use drainshim::proto::bench::EchoRequest;
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
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("handover.sock");
    let socket_s = socket.to_string_lossy().into_owned();
    let listen = SocketAddr::from(([127, 0, 0, 1], support::free_port()));
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
    let status = tokio::time::timeout(NODE_WAIT, old.child.wait())
        .await
        .unwrap_or_else(|_| panic!("the old agent did not exit:\n{}", old.log()))
        .expect("reap the old agent");
    assert!(status.success(), "old agent: {status}\n{}", old.log());
    let exited = started.elapsed();
    wait_probes(&probes, during + 20, "after the old agent exited").await;
    stop.cancel();

    // Every stream the old agent carried ended gracefully; none was cut.
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
    wait_guards(listen, &names).await;
    let p = &pods[0];
    let fresh = open_streams(p.inbound(), 4, "after", Duration::from_secs(60))
        .await
        .expect("streams after the hand-over");
    let (code, body) = http_in(None, p.prestop(), "GET", "/drain?wait=true")
        .await
        .expect("preStop to the new agent");
    assert_eq!(code, 200, "{body}");
    let report: Report = serde_json::from_str(&body).expect("report");
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

/// Long streams through the pod (the figure).
const LONG: usize = 10;
/// Workers of back-to-back unary calls, each on its own channel.
const WORKERS: usize = 4;
/// Each call's deadline: later than this is a hung call.
const DEADLINE: Duration = Duration::from_secs(2);
/// Calls made between two steps of the test (the overlap of both agents,
/// the old one's exit, after it): a count, so the load is seen flowing.
const CALLS_PER_STEP: u64 = 400;
/// Most calls one worker makes (bounds its loop in count).
const MAX_CALLS: u64 = 200_000;

/// How one unary call ended.
enum Outcome {
    Ok,
    Failed(String),
    Hung(String),
}

struct Call {
    start: Instant,
    outcome: Outcome,
}

/// Back-to-back unary calls through Envoy.
struct Unary {
    stop: CancellationToken,
    done: Arc<AtomicU64>,
    workers: Vec<tokio::task::JoinHandle<Vec<Call>>>,
}

impl Unary {
    /// Worker 0's calls take `slow_ms` in the app, the others' 1 ms.
    fn start(addr: SocketAddr, slow_ms: u32) -> Self {
        Self::with_workers(addr, WORKERS, slow_ms)
    }

    /// [`Unary::start`] with `workers` workers.
    fn with_workers(addr: SocketAddr, workers: usize, slow_ms: u32) -> Self {
        let stop = CancellationToken::new();
        let done = Arc::new(AtomicU64::new(0));
        let workers = (0..workers)
            .map(|w| {
                let (stop, done) = (stop.clone(), done.clone());
                tokio::spawn(async move {
                    let mut calls = Vec::new();
                    let endpoint =
                        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                            .expect("endpoint");
                    let mut client = StreamClient::new(endpoint.connect_lazy());
                    for i in 0..MAX_CALLS {
                        if stop.is_cancelled() {
                            break;
                        }
                        let mut req = tonic::Request::new(EchoRequest {
                            body: format!("w{w}-{i}"),
                            // One worker's calls take a while: one is
                            // always in flight when a GOAWAY goes out.
                            delay_ms: if w == 0 { slow_ms } else { 1 },
                        });
                        req.set_timeout(DEADLINE);
                        let start = Instant::now();
                        let outcome = match tokio::time::timeout(DEADLINE, client.echo(req)).await {
                            Ok(Ok(_)) => Outcome::Ok,
                            // The deadline passed: the server's DEADLINE_EXCEEDED,
                            // or tonic's own timer (CANCELLED "Timeout expired").
                            Ok(Err(s))
                                if s.code() == tonic::Code::DeadlineExceeded
                                    || (s.code() == tonic::Code::Cancelled
                                        && s.message().contains("Timeout expired")) =>
                            {
                                Outcome::Hung(format!("{:?} {:?}", s.code(), s.message()))
                            }
                            Ok(Err(s)) => Outcome::Failed(format!(
                                "{:?} {:?} ({:?})",
                                s.code(),
                                s.message(),
                                std::error::Error::source(&s).map(|e| e.to_string())
                            )),
                            Err(_) => Outcome::Hung("no answer by the deadline".into()),
                        };
                        calls.push(Call { start, outcome });
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    calls
                })
            })
            .collect();
        Self {
            stop,
            done,
            workers,
        }
    }

    fn made(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Waits (bounded) until `n` more calls ended, whatever their outcome.
    async fn wait_more(&self, n: u64, what: &str) {
        let want = self.made() + n;
        let deadline = Instant::now() + NODE_WAIT;
        while self.made() < want {
            assert!(
                Instant::now() < deadline,
                "unary calls stalled ({} of {want}): {what}",
                self.made()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn finish(self) -> Vec<Call> {
        self.stop.cancel();
        let mut all = Vec::new();
        for w in self.workers {
            all.extend(w.await.expect("unary worker"));
        }
        all.sort_by_key(|c| c.start);
        all
    }
}

fn at(t: Instant, since: Instant) -> String {
    let (a, b) = (t.max(since), t.min(since));
    let sign = if t >= since { "+" } else { "-" };
    format!("{sign}{:.2} s", (a - b).as_secs_f64())
}

/// The rolling update again, through a user's own Envoy bootstrap with NO
/// retry policy and no fallback (`no_retry_pod`): nothing hides what the
/// guard does. Unary calls run at full speed all along (back to back, a 2 s
/// deadline each) beside long streams; not one call may fail or hang, no
/// stream may be cut, and the new agent's drain afterwards cuts nothing.
mod no_retry {
    use super::*;

    /// One run: the old agent's window, and how long one worker's calls
    /// take in the app.
    struct Case {
        window: &'static str,
        slow_ms: u32,
        /// The old agent gets SIGTERM while it gives the new one the
        /// listeners (the rollout's readiness probe on the shared node port
        /// may be answered by the old agent), not once the new one is ready.
        early_sigterm: bool,
        /// One more call, sent to the old agent before the new one starts,
        /// that the app answers after this long: still in flight when the
        /// old agent's window ends (the slow worker's calls may or may not
        /// be, by chance).
        outlasting_call: Option<Duration>,
    }

    async fn run(case: Case) {
        let lab = Lab::new("n");
        let pod = no_retry_pod(&lab, "solo", "1.40.0").await;
        let name = pod.name.clone();
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("handover.sock");
        let socket_s = socket.to_string_lossy().into_owned();
        let listen = SocketAddr::from(([127, 0, 0, 1], support::free_port()));
        let flags = [
            "--handover-socket",
            &socket_s,
            "--handover-window",
            case.window,
        ];

        let mut old = agent_bin(&lab, listen, &flags).await;
        wait_guards(listen, &[&name]).await;
        // Envoy sends to the guard now (no fallback: it has nothing else).
        let before = pod_host_requests(&pod, GUARD_LISTEN).await.unwrap_or(0);
        let outlasting = case.outlasting_call.map(|delay| {
            let call = tokio::spawn(one_call(pod.inbound(), delay));
            (call, before)
        });
        if let Some((_, before)) = outlasting {
            // The only call yet: through the old agent's guard, before a new
            // agent exists.
            wait_pod_host(&pod, GUARD_LISTEN, before).await;
        }
        let before = pod_host_requests(&pod, GUARD_LISTEN).await.unwrap_or(0);
        let load = Unary::start(pod.inbound(), case.slow_ms);
        wait_pod_host(&pod, GUARD_LISTEN, before).await;
        let streams = open_streams(pod.inbound(), LONG, &name, Duration::from_secs(120))
            .await
            .expect("streams open");
        load.wait_more(CALLS_PER_STEP, "before the hand-over").await;

        // The rolling update: the new agent starts beside the old one, takes
        // the listeners; calls go on through both for a while...
        let new = agent_bin_started(&lab, listen, &flags);
        let (adopted, sigterm) = if case.early_sigterm {
            // ...the old one gets SIGTERM as the new one asks for them...
            old.wait_log("a new agent asks for the listeners").await;
            let sigterm = Instant::now();
            nix::sys::signal::kill(old.pid(), nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
            // ...and hands them over all the same.
            old.wait_log("the new agent serves every listener now")
                .await;
            (Instant::now(), sigterm)
        } else {
            old.wait_log("the new agent serves every listener now")
                .await;
            let adopted = Instant::now();
            load.wait_more(CALLS_PER_STEP, "while both agents run")
                .await;
            // ...then the old one gets SIGTERM and exits.
            let sigterm = Instant::now();
            nix::sys::signal::kill(old.pid(), nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
            (adopted, sigterm)
        };
        new.wait_log("node agent ready").await;
        if case.early_sigterm {
            // Whether the SIGTERM was seen before `adopted` (a race: either
            // way nothing may fail).
            eprintln!(
                "early SIGTERM: the old agent waited for the hand-over: {}",
                old.log().contains("SIGTERM during a hand-over")
            );
        }
        let status = tokio::time::timeout(NODE_WAIT, old.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the old agent did not exit:\n{}", old.log()))
            .expect("reap the old agent");
        assert!(status.success(), "old agent: {status}\n{}", old.log());
        let exited = Instant::now();
        load.wait_more(CALLS_PER_STEP, "after the old agent exited")
            .await;
        let mut calls = load.finish().await;
        let outlasted = outlasting.is_some();
        if let Some((call, _)) = outlasting {
            calls.push(call.await.expect("outlasting call"));
        }

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
        let (failed, hung) = outcomes(&calls, sigterm, "SIGTERM");
        eprintln!(
            "hand-over without retries (window {}, slow calls {} ms): {} unary calls, {} failed, {} hung; \
             {graceful} of {LONG} long streams ended gracefully, {} cut; \
             old agent exited {} after SIGTERM ({} after adoption)",
            case.window,
            case.slow_ms,
            calls.len(),
            failed.len(),
            hung.len(),
            cut.len(),
            at(exited, sigterm),
            at(exited, adopted),
        );
        for f in failed.iter().chain(hung.iter()).take(30) {
            eprintln!("  {f}");
        }
        assert!(
            failed.is_empty() && hung.is_empty(),
            "{} failed, {} hung of {} calls: {:?}\n{:?}\nold agent:\n{}",
            failed.len(),
            hung.len(),
            calls.len(),
            failed.iter().take(10).collect::<Vec<_>>(),
            hung.iter().take(10).collect::<Vec<_>>(),
            old.log()
        );
        assert!(
            cut.is_empty(),
            "cut streams: {cut:?}\nold agent:\n{}",
            old.log()
        );
        // The outlasting call finished (above), and was open at the old
        // agent's window's end.
        assert!(
            !outlasted
                || old
                    .log()
                    .contains("window over; the calls still open are left to finish"),
            "the outlasting call was not open at the window's end:\n{}",
            old.log()
        );
        assert_eq!(graceful, LONG);

        // The new agent carries the pod's guarded traffic, and drains with it.
        wait_guards(listen, &[&name]).await;
        let fresh = open_streams(pod.inbound(), 4, "after", Duration::from_secs(60))
            .await
            .expect("streams after the hand-over");
        let (code, body) = http_in(None, pod.prestop(), "GET", "/drain?wait=true")
            .await
            .expect("preStop to the new agent");
        assert_eq!(code, 200, "{body}");
        let report: Report = serde_json::from_str(&body).expect("report");
        eprintln!(
            "hand-over without retries: the new agent's drain: {} terminated, {} cut",
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

    /// The setup: long streams over a 5 s window, calls of
    /// 1 ms and 200 ms.
    fn steady() -> Case {
        Case {
            window: "5s",
            slow_ms: 200,
            early_sigterm: false,
            outlasting_call: None,
        }
    }

    /// A call that outlasts the window: in flight when the old agent hands
    /// over, still running when its window ends. A short call finishes.
    fn outlasting() -> Case {
        Case {
            window: "1s",
            slow_ms: 1_500,
            early_sigterm: false,
            // Sent before the streams open and the calls flow: well past
            // that, the new agent's start and the window, on a loaded machine.
            outlasting_call: Some(Duration::from_secs(15)),
        }
    }

    /// SIGTERM in the middle of the hand-over: the old agent finishes it
    /// before it stops accepting.
    fn early() -> Case {
        Case {
            early_sigterm: true,
            ..steady()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_agent_hands_over_without_a_failed_or_hung_call() {
        run(steady()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sigterm_during_the_hand_over_fails_nothing() {
        run(early()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_that_outlasts_the_window_finishes() {
        run(outlasting()).await;
    }

    /// Hand-overs in a row, each agent handing to the next.
    const ROUNDS: usize = 5;
    /// Workers of the heavy load, back to back: as many calls as the
    /// machine carries through Envoy and the guard.
    const HEAVY_WORKERS: usize = 16;
    /// Calls between two steps of a hand-over under the heavy load: about
    /// 10 s of calls over the five at the 1,000 calls/s and more.
    const HEAVY_STEP: u64 = 2_500;

    /// When an old agent gets its SIGTERM, round by round.
    #[derive(Clone, Copy, Debug)]
    enum Sigterm {
        /// While the new agent asks for the listeners.
        Asking,
        /// The moment it handed them over.
        Adopted,
        /// After `HEAVY_STEP` more calls.
        Later,
    }
    const SIGTERMS: [Sigterm; ROUNDS] = [
        Sigterm::Later,
        Sigterm::Adopted,
        Sigterm::Asking,
        Sigterm::Later,
        Sigterm::Adopted,
    ];

    /// Five hand-overs in a row under the heaviest load the test makes:
    /// every agent takes the listeners from the one before, which gets
    /// SIGTERM (while it hands them over, the moment it did, or later) and
    /// exits, while calls go on at full speed: not one fails or hangs. The
    /// rate is printed (never asserted: `bench` holds speed).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn five_hand_overs_in_a_row_at_load_fail_nothing() {
        let lab = Lab::new("f");
        let pod = no_retry_pod(&lab, "solo", "1.40.0").await;
        let name = pod.name.clone();
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("handover.sock");
        let socket_s = socket.to_string_lossy().into_owned();
        let listen = SocketAddr::from(([127, 0, 0, 1], support::free_port()));
        let flags = ["--handover-socket", &socket_s, "--handover-window", "2s"];

        let mut old = agent_bin(&lab, listen, &flags).await;
        wait_guards(listen, &[&name]).await;
        let before = pod_host_requests(&pod, GUARD_LISTEN).await.unwrap_or(0);
        let load = Unary::with_workers(pod.inbound(), HEAVY_WORKERS, 200);
        wait_pod_host(&pod, GUARD_LISTEN, before).await;
        let streams = open_streams(pod.inbound(), LONG, &name, Duration::from_secs(120))
            .await
            .expect("streams open");
        load.wait_more(CALLS_PER_STEP, "before the hand-overs")
            .await;

        let (start, made) = (Instant::now(), load.made());
        let mut sigterms = Vec::new();
        let mut logs = Vec::new();
        for (round, when) in (1..=ROUNDS).zip(SIGTERMS) {
            let new = agent_bin_started(&lab, listen, &flags);
            let sigterm = |old: &AgentBin| {
                nix::sys::signal::kill(old.pid(), nix::sys::signal::Signal::SIGTERM)
                    .expect("SIGTERM");
                Instant::now()
            };
            if let Sigterm::Asking = when {
                old.wait_log("a new agent asks for the listeners").await;
                sigterms.push(sigterm(&old));
            }
            old.wait_log("the new agent serves every listener now")
                .await;
            match when {
                Sigterm::Asking => {}
                Sigterm::Adopted => sigterms.push(sigterm(&old)),
                Sigterm::Later => {
                    load.wait_more(HEAVY_STEP, &format!("hand-over {round}: both agents run"))
                        .await;
                    sigterms.push(sigterm(&old));
                }
            }
            let status = tokio::time::timeout(NODE_WAIT, old.child.wait())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "hand-over {round}: the old agent did not exit:\n{}",
                        old.log()
                    )
                })
                .expect("reap the old agent");
            assert!(
                status.success(),
                "hand-over {round}: old agent: {status}\n{}",
                old.log()
            );
            new.wait_log("node agent ready").await;
            load.wait_more(
                HEAVY_STEP,
                &format!("hand-over {round}: after the old agent exited"),
            )
            .await;
            logs.push(old.log());
            old = new;
        }
        let (took, n) = (start.elapsed(), load.made() - made);
        let calls = load.finish().await;

        let mut cut = Vec::new();
        for h in streams {
            let e = tokio::time::timeout(NODE_WAIT, h)
                .await
                .expect("stream ended")
                .expect("stream task");
            if e.ending() != Ending::Graceful {
                cut.push(format!("{}: {:?} {:?}", e.id, e.ending(), e.status));
            }
            assert!(e.gapless(), "{}: a message was lost", e.id);
        }
        // Each call against the SIGTERM nearest to it.
        let mut failed = Vec::new();
        let mut hung = Vec::new();
        for (i, t) in sigterms.iter().enumerate() {
            let mine: Vec<&Call> = calls
                .iter()
                .filter(|c| {
                    let nearest = sigterms
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, s)| {
                            if c.start >= **s {
                                c.start - **s
                            } else {
                                **s - c.start
                            }
                        })
                        .map(|(j, _)| j);
                    nearest == Some(i)
                })
                .collect();
            let (f, h) = outcomes_of(&mine, *t, &format!("SIGTERM {}", i + 1));
            failed.extend(f);
            hung.extend(h);
        }
        eprintln!(
            "{ROUNDS} hand-overs in a row without retries ({HEAVY_WORKERS} workers): {} unary calls, \
             {n} in {:.1} s of hand-overs ({:.0} calls/s), {} failed, {} hung; {} of {LONG} long streams cut",
            calls.len(),
            took.as_secs_f64(),
            n as f64 / took.as_secs_f64().max(0.001),
            failed.len(),
            hung.len(),
            cut.len(),
        );
        for f in failed.iter().chain(hung.iter()).take(30) {
            eprintln!("  {f}");
        }
        assert!(
            failed.is_empty() && hung.is_empty(),
            "{} failed, {} hung of {} calls: {:?}\n{:?}\nthe old agents' logs:\n{}",
            failed.len(),
            hung.len(),
            calls.len(),
            failed.iter().take(10).collect::<Vec<_>>(),
            hung.iter().take(10).collect::<Vec<_>>(),
            logs.join("\n-----\n")
        );
        assert!(cut.is_empty(), "cut streams: {cut:?}");
    }
}

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
    Call { start, outcome }
}

/// Failed and hung calls, each with when it was sent (from `t0`).
fn outcomes(calls: &[Call], t0: Instant, what: &str) -> (Vec<String>, Vec<String>) {
    outcomes_of(&calls.iter().collect::<Vec<_>>(), t0, what)
}

/// [`outcomes`] of some of the calls.
fn outcomes_of(calls: &[&Call], t0: Instant, what: &str) -> (Vec<String>, Vec<String>) {
    let mut failed = Vec::new();
    let mut hung = Vec::new();
    for c in calls {
        let when = format!("sent {} from {what}", at(c.start, t0));
        match &c.outcome {
            Outcome::Ok => {}
            Outcome::Failed(e) => failed.push(format!("{when}: {e}")),
            Outcome::Hung(e) => hung.push(format!("{when}: {e}")),
        }
    }
    (failed, hung)
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
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("handover.sock");
    let socket_s = socket.to_string_lossy().into_owned();
    let listen = SocketAddr::from(([127, 0, 0, 1], support::free_port()));
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
    for f in failed.iter().chain(hung.iter()).take(20) {
        eprintln!("  {f}");
    }
    assert!(
        failed.is_empty() && hung.is_empty(),
        "{} failed, {} hung\nagent:\n{}",
        failed.len(),
        hung.len(),
        agent.log()
    );
    assert!(cut.is_empty(), "cut streams: {cut:?}");
}
