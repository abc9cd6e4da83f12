//! The peer matrix (issue 39): real gRPC servers, each with its own HTTP/2
//! stack and that stack's DEFAULT keepalive enforcement, behind real Envoy
//! 1.40 and the real `drainshim` binary's guard:
//!
//! ```text
//! tonic clients ──> Envoy 1.40 ──> drainshim guard ──> tap ──> app (a process)
//!                   (one worker: one connection       (records the frames
//!                    to the guard, so one app          between the guard
//!                    connection per case)              and the app)
//! ```
//!
//! Every gRPC server counts a "ping strike" when a PING arrives less than
//! 5 minutes after the previous one with no DATA or HEADERS written since;
//! the third strike is GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings") and the
//! connection closes (grpc-go `maxPingStrikes = 2`, C-core
//! `grpc.http2.max_ping_strikes = 2`, Netty's `KeepAliveEnforcer`). The
//! guard carries every stream of an Envoy connection on one app connection,
//! so what it sends the app while ending quiet streams must never look like
//! a ping flood: a server that closes the connection cuts every stream on it.
//!
//! For each server (grpc-go, grpc-java on Netty, grpcio, tonic, and a raw
//! HTTP/2 app of python-h2's that reads its socket only every 100 ms, or
//! every 500 ms: `tests/py/slow_app.py`; `support::peers`), 20 streams per case on one guard -> app connection:
//!
//! | case | streams | how they end |
//! |---|---|---|
//! | chatty | a message every 50 ms | a drain (`drainshim prestop`) |
//! | quiet | a message every 3 s | a drain |
//! | silent | one message, then nothing | a drain |
//! | quiet, shipped bootstrap | a message every 3 s | a drain, through the shipped Envoy bootstrap (fail-open retries) |
//! | max age | a message every 3 s, opened again after each end | the guard's max connection age (3 s, grace 2 s), 3 cycles |
//! | app stop | a message every 3 s | a drain, with SIGTERM to the app at its start (the app's graceful stop) |
//! | throttled, chatty | a message every 50 ms, the app frozen 70 ms of every 100 ms | a drain |
//! | throttled, quiet | a message every 3 s, the app frozen 70 ms of every 100 ms | a drain |
//! | 64 KiB at full speed | 5 streams of 64 KiB messages, as fast as flow control lets the app write | a drain |
//! | slow client | 5 streams of 16 KiB every 10 ms; the clients read nothing for 4 s from the drain's start | a drain |
//!
//! The throttled cases are an app under a CPU limit (the kernel's CFS quota
//! freezes a container for the rest of each period once it spent its
//! quota) or in GC pauses: SIGSTOP and SIGCONT, 70 ms and 30 ms, for as long
//! as the two cases run, side by side after the others. The app reads its
//! socket late, so the guard's cancel and its barrier wait for it.
//!
//! The drains end long-lived streams spread over their window; the guard
//! takes a stream as long-lived after 2 messages or `--long-stream-age`
//! (1 s here), and the quiet and silent streams are older than that at the
//! trigger, so the drain's spread ends them, not its deadline sweep (which
//! would come about 9 s after the trigger; the guard must never log it).
//!
//! Asserted for every stream: it ends with `grpc-status: 14` and the
//! guard's message for the case (drain, max age; in the app-stop case also
//! the app's own end), with sequence numbers 1..n and nothing lost (n is at
//! least the last sequence number the app says it handed its transport).
//! For every case: the streams shared one app connection, and the app never
//! sent GOAWAY(ENHANCE_YOUR_CALM), seen three ways: on the wire (the tap),
//! in the guard's `drainshim_guard_app_goaways_total{code}` (the sidecar's
//! /metrics; wherever the app sent GOAWAY(NO_ERROR), in the app-stop case,
//! it must count it, so a counter that never counts cannot pass), and by the
//! clients, none of which may see the guard's "connection to the
//! application was lost" or a "too many pings". A drain's report must say
//! it terminated every stream and cut none, and the guard must have dropped
//! no DATA of the app's (`drainshim_stream_data_dropped_total` 0), but for
//! the start of a message the app's own stack cut short on reading the
//! cancel, which the tap must see as such (the design's named limit).
//!
//! The cases of one server run side by side, each with its own Envoy, guard
//! and tap (so its own app connection), against the one app process, as a
//! real app serves many connections; the app-stop case runs last, alone.
//! The case through the shipped bootstrap has its twin with no retry policy
//! (the same case, `no retry`), which shows what the guard itself does: a
//! retry must never hide a failure. Every case prints its row.
//!
//! Fails (never skips) without the cached Envoy, the Python venv or the
//! built peers (`make envoy pytools peers`).

pub mod account;
pub mod clients;

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use account::{
    app_goaways_metric, lost_fates, series_sum, series_sum_where, Fate, Row, Wire, APP_GOAWAYS,
    BLIND_ENDED, DATA_DROPPED,
};
use clients::{classify, client, describe, End, Shape, Sub};
use drainshim::drain::Report;
use drainshim::guard::end_message;
use drainshim::metrics::Reason;
use drainshim_bench::envoy::{shipped_bootstrap, EnvoyProcess};
use support::guard::Tap;
use support::peers::{tail, AppStream, PeerApp, Server};
use support::{guard_bin_pod, http, prestop, SidecarBin, WAIT};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::Endpoint;

/// Streams per case, all on one guard -> app connection.
const STREAMS: usize = 20;
/// Streams of the cases that move data at full speed: fewer, so the
/// machine (Envoy, the guard, the app and the clients on two cores) is not
/// what is measured.
const BULK_STREAMS: usize = 5;
/// Streams of the gapped case: one per gap from 3 to 10 ms.
const GAPPED_STREAMS: usize = 8;
/// How long the slow client reads nothing, from the drain's start: longer
/// than the drain's spread (2 s), so every ending meets a shut window.
const SLOW_CLIENT_HOLD: Duration = Duration::from_secs(4);
/// The chatty cadence.
const CHATTY_MS: u32 = 50;
/// The quiet cadence: far apart next to the drain's endings (one every
/// ~100 ms), so between two endings the app mostly wrote nothing.
const QUIET_MS: u32 = 3_000;
/// "One message, then silence": the next would come after the test.
const SILENT_MS: u32 = 600_000;
/// Max-age cycles each client goes through (ended, opened again, ...).
const CYCLES: usize = 3;
/// The guard's `--long-stream-age` (in [`DRAIN_FLAGS`]): a stream answered
/// this long ago is long-lived, so one that had a single message is ended
/// by the drain's spread.
const LONG_STREAM_AGE: Duration = Duration::from_secs(1);
/// The app's graceful stop must be over within this (grpc-go, grpc-java and
/// grpcio give up on their calls after 20 s; tonic waits for them).
const APP_EXIT: Duration = Duration::from_secs(30);
/// Longest a case's clients run; every client loop is bounded by it.
const CLIENT_LIMIT: Duration = Duration::from_secs(90);
/// How long the app gets to say a call ended once its client saw the end.
const APP_ACCOUNT: Duration = Duration::from_secs(10);

/// The sidecar's flags for the drain cases: a 0.5 s deregistration, the
/// long-lived streams ended over the next 2 s, and a deadline far enough
/// (15 s: the sweep of what is not long-lived would come at about 9 s) that
/// an ending by the sweep cannot pass for one by the spread. The drain
/// exits as soon as the streams are gone.
const DRAIN_FLAGS: &[&str] = &[
    "--deregistration-delay",
    "500ms",
    "--min-drain-time",
    "500ms",
    "--drain-time",
    "2500ms",
    "--parent-shutdown-time",
    "15s",
    "--poll-interval",
    "100ms",
    "--long-stream-age",
    "1s",
];

/// Max connection age: each guard connection lives 3 s (±10%), then its
/// streams are ended over the 2 s grace.
const MAX_AGE_FLAGS: &[&str] = &[
    "--max-connection-age",
    "3s",
    "--max-connection-age-grace",
    "2s",
];

/// The throttled app: stopped this long of every [`THROTTLE_PERIOD`].
const THROTTLE_STOPPED: Duration = Duration::from_millis(70);
const THROTTLE_PERIOD: Duration = Duration::from_millis(100);

/// The guard's log line when a drain's deadline sweep ends what is left.
const SWEEP_LOG: &str = "drain deadline near";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Chatty,
    Quiet,
    Silent,
    MaxAge,
    AppStop,
    ThrottledChatty,
    ThrottledQuiet,
    Bulk,
    SlowClient,
    Gapped,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Chatty => "chatty (50 ms), drain",
            Scenario::Quiet => "quiet (3 s), drain",
            Scenario::Silent => "silent (1 msg), drain",
            Scenario::MaxAge => "quiet (3 s), max age",
            Scenario::AppStop => "quiet (3 s), drain + app stop",
            Scenario::ThrottledChatty => "chatty (50 ms), throttled app, drain",
            Scenario::ThrottledQuiet => "quiet (3 s), throttled app, drain",
            Scenario::Bulk => "64 KiB at full speed, drain",
            Scenario::SlowClient => "16 KiB / 10 ms, slow client, drain",
            Scenario::Gapped => "64 KiB / 3-10 ms gaps, drain",
        }
    }

    /// The start of its stream ids.
    fn tag(self) -> &'static str {
        match self {
            Scenario::Chatty => "chatty",
            Scenario::Quiet => "quiet",
            Scenario::Silent => "silent",
            Scenario::MaxAge => "aged",
            Scenario::AppStop => "stop",
            Scenario::ThrottledChatty => "tchatty",
            Scenario::ThrottledQuiet => "tquiet",
            Scenario::Bulk => "bulk",
            Scenario::SlowClient => "slowc",
            Scenario::Gapped => "gapped",
        }
    }

    /// The app's cadence on the case's stream `i`.
    fn interval_ms(self, i: usize) -> u32 {
        match self {
            // 3, 4, ... 10 ms: gaps longer than the guard's burst gap, yet
            // short enough that an ending lands between two messages.
            Scenario::Gapped => 3 + (i % 8) as u32,
            Scenario::Chatty | Scenario::ThrottledChatty => CHATTY_MS,
            Scenario::Bulk => 1,
            Scenario::SlowClient => 10,
            Scenario::Silent => SILENT_MS,
            Scenario::Quiet | Scenario::MaxAge | Scenario::AppStop | Scenario::ThrottledQuiet => {
                QUIET_MS
            }
        }
    }

    /// Calls each client makes: max age ends them again and again.
    fn cycles(self) -> usize {
        if self == Scenario::MaxAge {
            CYCLES
        } else {
            1
        }
    }

    /// Whether its app is throttled while it runs.
    fn throttled(self) -> bool {
        matches!(self, Scenario::ThrottledChatty | Scenario::ThrottledQuiet)
    }

    /// Whether its streams write often (long-lived by messages): a
    /// producer, whose transport may take a message it then drops when it
    /// reads the cancel.
    fn chatty(self) -> bool {
        matches!(
            self,
            Scenario::Chatty
                | Scenario::ThrottledChatty
                | Scenario::Bulk
                | Scenario::SlowClient
                | Scenario::Gapped
        )
    }

    /// Streams per call of the case.
    fn streams(self) -> usize {
        match self {
            Scenario::Bulk | Scenario::SlowClient => BULK_STREAMS,
            Scenario::Gapped => GAPPED_STREAMS,
            _ => STREAMS,
        }
    }

    fn payload_bytes(self) -> u32 {
        match self {
            Scenario::Bulk | Scenario::Gapped => 64 * 1024,
            Scenario::SlowClient => 16 * 1024,
            _ => 64,
        }
    }

    /// Whether a drain ends it (else the guard's max age does).
    fn drained(self) -> bool {
        self != Scenario::MaxAge
    }

    /// The guard's messages a stream may end with.
    fn graceful(self) -> Vec<&'static str> {
        match self {
            Scenario::MaxAge => vec![end_message(Reason::max_age)],
            Scenario::AppStop => vec![
                end_message(Reason::drain),
                end_message(Reason::app_shutdown),
            ],
            _ => vec![end_message(Reason::drain)],
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boot {
    /// `deploy/components/envoy/envoy.yaml`: fail-open retries, the app at priority 1.
    Shipped,
    /// One endpoint (the guard), no retry policy.
    NoRetry,
}

impl Boot {
    fn name(self) -> &'static str {
        match self {
            Boot::Shipped => "shipped (retry)",
            Boot::NoRetry => "no retry",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Case {
    server: Server,
    scenario: Scenario,
    boot: Boot,
}

impl Case {
    /// Stream ids start with this; unique among the cases of one app.
    fn prefix(self) -> String {
        let boot = match self.boot {
            Boot::Shipped => "s",
            Boot::NoRetry => "n",
        };
        format!("{}-{boot}", self.scenario.tag())
    }

    fn name(self) -> String {
        format!(
            "{} / {} / {}",
            self.server.name(),
            self.scenario.name(),
            self.boot.name()
        )
    }
}

/// A guarded pod in front of the shared app: Envoy -> the real sidecar's
/// guard -> a tap -> the app.
struct Pod {
    envoy: EnvoyProcess,
    shim: SidecarBin,
    tap: Tap,
}

impl Pod {
    async fn start(case: Case, app: SocketAddr) -> Pod {
        let tap = Tap::start(app).await;
        let flags = if case.scenario.drained() {
            DRAIN_FLAGS
        } else {
            MAX_AGE_FLAGS
        };
        let (envoy, shim, _guard) = guard_bin_pod(tap.addr, flags, |o| match case.boot {
            // Fail open straight to the app, as in a pod.
            Boot::Shipped => {
                o.custom_bootstrap = Some(
                    shipped_bootstrap(o.upstream, app, o.admin_port).expect("shipped bootstrap"),
                );
            }
            Boot::NoRetry => {
                assert!(o.fallback.is_none() && o.route_retry.is_none());
                assert!(!o.bootstrap().contains("retry_policy"), "{}", o.bootstrap());
            }
        })
        .await;
        Pod { envoy, shim, tap }
    }

    /// Ends the pod and waits until its processes are gone.
    async fn stop(mut self) {
        let _ = self.shim.child.start_kill();
        let _ = tokio::time::timeout(WAIT, self.shim.child.wait()).await;
        self.envoy.kill().await;
        self.tap.stop();
    }
}

/// Everything seen while one case ran, before it is judged.
struct Run {
    case: Case,
    /// Every call, every cycle's.
    subs: Vec<Sub>,
    /// The app's own account of each call, by stream id.
    told: BTreeMap<String, AppStream>,
    /// The drain's report, when a drain ran and reported.
    report: Option<Report>,
    /// What passed between the guard and the app.
    tap: Tap,
    metric: Option<BTreeMap<String, u64>>,
    /// Endings the guard begun at a moment no write timed (its metric;
    /// None: the family is missing from /metrics).
    blind: Option<u64>,
    /// Application DATA frames the guard dropped (likewise).
    dropped: Option<u64>,
    /// Of those, the starts of messages the app's stack cut short.
    partial: u64,
    shim_log: String,
    /// The drain's start (or, for max age, the case's).
    trigger: Instant,
    /// From the pod's start to its stop.
    took: Duration,
    /// What went wrong on the way (a client that never ended, ...).
    failures: Vec<String>,
}

/// Polls `cond` until it holds or `limit` passes; false then. For what a
/// case counts as a failure rather than a reason to stop the matrix.
async fn settle(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Runs one case against the shared app. In the app-stop case the app gets
/// SIGTERM at the trigger; the caller waits for its exit.
async fn drive(case: Case, app: &PeerApp) -> Run {
    let begun = Instant::now();
    let pod = Pod::start(case, app.addr).await;
    let channel = Endpoint::from_shared(format!("http://{}", pod.envoy.inbound))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect to Envoy");
    let deadline = begun + CLIENT_LIMIT;
    let counts: Vec<Arc<AtomicUsize>> = (0..case.scenario.streams())
        .map(|_| Arc::default())
        .collect();
    // The slow client's reads, held from the drain's start.
    let (hold, held) = tokio::sync::watch::channel(false);
    let shape = Shape {
        interval_ms: 0,
        payload_bytes: case.scenario.payload_bytes(),
        hold: (case.scenario == Scenario::SlowClient).then_some(held),
    };
    let clients: Vec<JoinHandle<Vec<Sub>>> = counts
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let shape = Shape {
                interval_ms: case.scenario.interval_ms(i),
                ..shape.clone()
            };
            tokio::spawn(client(
                channel.clone(),
                format!("{}-{i}", case.prefix()),
                shape,
                case.scenario.cycles(),
                n.clone(),
                deadline,
            ))
        })
        .collect();
    let mut failures = Vec::new();

    let mut trigger = begun;
    let mut drain = None;
    if case.scenario.drained() {
        // Long-lived by messages (chatty: two), or by age: every stream had
        // its first message, then the guard's long-stream age passes (the
        // clock is the condition: the age counts from the app's answer,
        // which came before the client's first message).
        let want = if case.scenario.chatty() { 2 } else { 1 };
        let what = format!("{}: every stream flows", case.name());
        support::wait_for_ok(&what, WAIT, || {
            let c: Vec<usize> = counts.iter().map(|n| n.load(Ordering::Relaxed)).collect();
            let last = format!(
                "messages per stream: {c:?}\n--- app log ---\n{}\n--- drainshim log ---\n{}",
                tail(&app.log(), 20),
                tail(&pod.shim.log(), 20)
            );
            std::future::ready(c.iter().all(|n| *n >= want).then_some(()).ok_or(last))
        })
        .await;
        if want == 1 {
            tokio::time::sleep(LONG_STREAM_AGE + Duration::from_millis(200)).await;
        }
        trigger = Instant::now();
        if case.scenario == Scenario::SlowClient {
            let _ = hold.send(true);
        }
        drain = Some(tokio::spawn(prestop(pod.shim.addr)));
        if case.scenario == Scenario::SlowClient {
            tokio::time::sleep(SLOW_CLIENT_HOLD).await;
            let _ = hold.send(false);
        }
        if case.scenario == Scenario::AppStop {
            app.sigterm();
        }
    }

    // Every call's end: by the clients' deadline (max age), or WAIT after
    // the trigger.
    let until = if case.scenario.drained() {
        trigger + WAIT
    } else {
        deadline + Duration::from_secs(1)
    };
    let mut subs = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let abort = c.abort_handle();
        match tokio::time::timeout_at(until, c).await {
            Ok(Ok(s)) => subs.extend(s),
            Ok(Err(e)) => failures.push(format!("client {i}: {e}")),
            Err(_) => {
                abort.abort();
                failures.push(format!("client {i} was still open at the case's limit"));
            }
        }
    }
    let mut report = None;
    if let Some(h) = drain {
        let run = tokio::time::timeout(WAIT, h)
            .await
            .expect("prestop finished")
            .expect("prestop task");
        match run.code {
            Some(0) => report = Some(run.report()),
            code => failures.push(format!("prestop exited {code:?}: {}", run.stderr)),
        }
    }

    // The app's own account of every call.
    let ids: Vec<&str> = subs.iter().map(|s| s.id.as_str()).collect();
    let said = |told: &BTreeMap<String, AppStream>, id: &str| {
        told.get(id).is_some_and(|a| a.ended.is_some())
    };
    settle(APP_ACCOUNT, || {
        let told = app.streams();
        ids.iter().all(|id| said(&told, id))
    })
    .await;
    let told = app.streams();
    let unsaid: Vec<&&str> = ids.iter().filter(|id| !said(&told, id)).collect();
    if !unsaid.is_empty() {
        failures.push(format!(
            "the app never said how {} call(s) ended (still open at the app?): {unsaid:?}",
            unsaid.len()
        ));
    }

    let (_, metrics) = http(pod.shim.addr, "GET", "/metrics").await;
    let tap = pod.tap.clone();
    let shim_log = pod.shim.log();
    pod.stop().await;
    Run {
        case,
        subs,
        told,
        report,
        tap,
        metric: app_goaways_metric(&metrics),
        blind: metrics
            .contains(BLIND_ENDED)
            .then(|| series_sum(&metrics, BLIND_ENDED)),
        dropped: metrics
            .contains(DATA_DROPPED)
            .then(|| series_sum(&metrics, DATA_DROPPED)),
        partial: series_sum_where(&metrics, DATA_DROPPED, "reason=\"partial_message\""),
        shim_log,
        trigger,
        took: begun.elapsed(),
        failures,
    }
}

/// Every call: how it ended, that it has every message, nothing lost.
fn judge_calls(run: &Run, row: &mut Row) {
    let graceful = run.case.scenario.graceful();
    // Calls that broke the promise, by what happened: their ids.
    let mut broken = BTreeMap::<String, Vec<&str>>::new();
    let mut first_end: Option<Duration> = None;
    let mut last_end = Duration::ZERO;
    for s in &run.subs {
        let end = classify(s, &graceful);
        *row.ends.entry(end).or_default() += 1;
        *row.endings.entry(describe(&s.status)).or_default() += 1;
        let after = s.ended_at.saturating_duration_since(run.trigger);
        first_end = Some(first_end.map_or(after, |f| f.min(after)));
        last_end = last_end.max(after);
        let allowed =
            end == End::Graceful || (end == End::AppOwn && run.case.scenario == Scenario::AppStop);
        if !allowed {
            let what = format!("{end:?} {}", describe(&s.status));
            broken.entry(what).or_default().push(&s.id);
        }
        if !s.gapless() {
            let what = format!("a gap or no message: {:?}", s.seqs);
            broken.entry(what).or_default().push(&s.id);
        }
        let got = s.seqs.last().copied().unwrap_or(0);
        if let Some((written, _)) = run.told.get(&s.id).and_then(|a| a.ended.clone()) {
            if written > got {
                row.lost += written - got;
                let (fates, ending) = lost_fates(&run.tap, &s.id, got + 1..=written);
                // A chatty producer's stream is cancelled in its pause, and
                // what it wrote before it read the cancel is forwarded. A
                // message its own transport took and then dropped on reading
                // the cancel never reached the wire (NeverSent): the limit
                // design §3 names for producers, shown in the table, not
                // failed. Anything that reached the guard and was not
                // forwarded always fails, and so does any loss on the
                // quiet, silent, max-age and app-stop streams.
                // So is a message its transport was writing when it read
                // the cancel and cut short (CutByApp): its start reached the
                // guard, which drops it whole and counts it (judge_dropped).
                let producer_race = run.case.scenario.chatty()
                    && fates
                        .iter()
                        .all(|f| matches!(f, Fate::NeverSent | Fate::CutByApp));
                for f in fates {
                    *row.lost_fates.entry(f).or_default() += 1;
                }
                if !producer_race {
                    let what = format!(
                        "lost: the app handed its transport {written}, the client got {got}"
                    );
                    broken.entry(what).or_default().push(&s.id);
                    row.failures.push(ending);
                }
            }
        }
    }
    for (what, ids) in &broken {
        row.failures
            .push(format!("{} call(s): {what}: {ids:?}", ids.len()));
    }
    if let Some(n) = row.ends.get(&End::Calm) {
        row.failures
            .push(format!("{n} client(s) were told about too many pings"));
    }
    row.ends_after = first_end.map(|f| (f, last_end));
    let spread = matches!(
        run.case.scenario,
        Scenario::Chatty
            | Scenario::Quiet
            | Scenario::Silent
            | Scenario::ThrottledChatty
            | Scenario::ThrottledQuiet
            | Scenario::Bulk
            | Scenario::Gapped
    );
    let span = last_end.saturating_sub(first_end.unwrap_or_default());
    if spread && span < Duration::from_secs(1) {
        row.failures.push(format!(
            "the calls ended within {span:?}: not spread over the drain's window"
        ));
    }
    if run.case.scenario == Scenario::MaxAge {
        // The fewest graceful endings one client went through.
        let fewest = (0..run.case.scenario.streams())
            .map(|i| {
                let mine = format!("{}-{i}-", run.case.prefix());
                run.subs
                    .iter()
                    .filter(|s| s.id.starts_with(&mine) && classify(s, &graceful) == End::Graceful)
                    .count()
            })
            .min()
            .unwrap_or(0);
        row.cycles = Some(fewest);
        if fewest < CYCLES {
            row.failures.push(format!(
                "a client went through {fewest} max-age cycles, want {CYCLES}"
            ));
        }
    }
}

/// The case's streams shared one app connection (max age: each cycle
/// another), by the app's view of its peers and by the tap.
fn judge_connections(run: &Run, row: &mut Row) {
    let peer = |s: &Sub| run.told.get(&s.id).and_then(|a| a.peer.clone());
    let mut by_peer = BTreeMap::<String, usize>::new();
    for s in &run.subs {
        match peer(s) {
            Some(p) => *by_peer.entry(p).or_default() += 1,
            None => row
                .failures
                .push(format!("{}: the app never said it started it", s.id)),
        }
    }
    row.per_conn = by_peer.values().copied().collect();
    row.per_conn.sort_unstable_by(|a, b| b.cmp(a));
    if run.case.scenario.drained() {
        if by_peer.len() != 1 || row.wire.h2_conns != 1 {
            row.failures.push(format!(
                "the {} streams came over {} app connection(s) (the tap saw {} HTTP/2 connections), want one",
                run.case.scenario.streams(),
                by_peer.len(),
                row.wire.h2_conns
            ));
        }
        return;
    }
    let first: BTreeSet<Option<String>> = run
        .subs
        .iter()
        .filter(|s| s.id.ends_with("-c0"))
        .map(peer)
        .collect();
    if first.len() != 1 {
        row.failures.push(format!(
            "the first cycle's {} streams came over {} app connections, want one: {first:?}",
            run.case.scenario.streams(),
            first.len()
        ));
    }
    if by_peer.len() < CYCLES {
        row.failures.push(format!(
            "{} app connection(s) for {CYCLES} max-age cycles",
            by_peer.len()
        ));
    }
}

/// The drain's own account: every stream ended by its spread, none cut.
fn judge_drain(run: &Run, row: &mut Row) {
    let Some(r) = &run.report else {
        return;
    };
    let s = &r.streams;
    row.report = Some(format!("{} / {} / {}", s.terminated, s.completed, s.cut));
    if s.cut != 0 || s.failed != 0 {
        row.failures.push(format!(
            "the drain report says cut {}, failed {}: {s:?}",
            s.cut, s.failed
        ));
    }
    // In the app-stop case the app's own GOAWAY ends some (completed).
    let want = run.case.scenario.streams() as u64;
    if run.case.scenario != Scenario::AppStop && s.terminated != want {
        row.failures.push(format!(
            "the drain report says terminated {}, want {want}: {s:?}",
            s.terminated
        ));
    }
    blind_endings(run, row);
    if run.shim_log.contains(SWEEP_LOG) {
        row.failures.push(
            "the drain's deadline sweep ended streams: they were not ended as long-lived".into(),
        );
    }
}

/// Streams writing at least every `end_settle` (4 s) end right after a
/// write, never at a moment no write timed, where a message on its way
/// could be lost (too rare to show as a loss; counted instead). Silent
/// streams never write again, and a stopping app stops writing.
fn blind_endings(run: &Run, row: &mut Row) {
    let timed = matches!(
        run.case.scenario,
        Scenario::Chatty
            | Scenario::Quiet
            | Scenario::MaxAge
            | Scenario::ThrottledChatty
            | Scenario::ThrottledQuiet
            | Scenario::Bulk
            | Scenario::SlowClient
            | Scenario::Gapped
    );
    match run.blind {
        None => row
            .failures
            .push(format!("{BLIND_ENDED}_total is missing from /metrics")),
        Some(n) if timed && n != 0 => row.failures.push(format!(
            "{BLIND_ENDED}_total is {n}: an ending began at a moment no write timed"
        )),
        Some(_) => {}
    }
}

/// The guard dropped none of the app's DATA (a message the client would
/// never get), by its own count, which must be exported; the only drops it
/// may count are `reason="partial_message"`, one per message the tap saw the
/// app's stack cut short (Fate::CutByApp).
fn judge_dropped(run: &Run, row: &mut Row) {
    let Some(n) = run.dropped else {
        return row
            .failures
            .push(format!("{DATA_DROPPED}_total is missing from /metrics"));
    };
    // The starts of messages the app's own stack cut short, each one a
    // CutByApp loss the tap saw: the guard's drop of half a message.
    let cut = row.lost_fates.get(&Fate::CutByApp).copied().unwrap_or(0);
    if n != run.partial || run.partial != cut {
        row.failures.push(format!(
            "{DATA_DROPPED}_total is {n} ({} partial messages; the tap saw {cut} cut short by the app): the guard dropped DATA the app sent",
            run.partial
        ));
    }
}

/// The app never sent GOAWAY(ENHANCE_YOUR_CALM): on the wire, and by the
/// guard's count, which must also count the GOAWAYs the app did send.
fn judge_goaways(run: &Run, row: &mut Row) {
    let wire = &row.wire.app_goaways;
    if let Some(n) = wire.get("ENHANCE_YOUR_CALM") {
        row.failures.push(format!(
            "the app sent GOAWAY(ENHANCE_YOUR_CALM) {n} time(s): too many pings"
        ));
    }
    // A series appears with its first GOAWAY: no family is no GOAWAY.
    let metric = run.metric.clone().unwrap_or_default();
    if let Some(n) = metric.get("ENHANCE_YOUR_CALM").filter(|n| **n > 0) {
        row.failures.push(format!(
            "{APP_GOAWAYS}_total{{code=\"ENHANCE_YOUR_CALM\"}} is {n}"
        ));
    }
    // Where the app did send GOAWAYs, the guard counted each.
    for (code, n) in wire {
        let counted = metric.get(code).copied().unwrap_or(0);
        if counted != *n {
            row.failures.push(format!(
                "the app sent {n} GOAWAY({code}), {APP_GOAWAYS}_total counts {counted}"
            ));
        }
    }
    if run.case.scenario == Scenario::AppStop && !wire.contains_key("NO_ERROR") {
        row.failures
            .push("the app's graceful stop sent no GOAWAY(NO_ERROR)".into());
    }
}

fn judge(run: Run) -> Row {
    let mut row = Row {
        case: run.case,
        calls: run.subs.len(),
        ends: BTreeMap::new(),
        lost: 0,
        lost_fates: BTreeMap::new(),
        per_conn: Vec::new(),
        wire: Wire::default(),
        metric: run.metric.clone(),
        cycles: None,
        ends_after: None,
        endings: BTreeMap::new(),
        report: None,
        blind: run.blind,
        dropped: run.dropped,
        time: run.took,
        failures: run.failures.clone(),
    };
    row.wire = Wire::of(&run.tap);
    judge_calls(&run, &mut row);
    judge_connections(&run, &mut row);
    judge_drain(&run, &mut row);
    judge_goaways(&run, &mut row);
    judge_dropped(&run, &mut row);
    if !row.failures.is_empty() {
        row.failures.push(format!(
            "--- drainshim log (tail) ---\n{}",
            tail(&run.shim_log, 12)
        ));
    }
    row
}

/// The matrix for one server: the cases side by side against one app, then
/// the app's own stop; prints the table, then fails on any broken promise.
async fn matrix(server: Server) {
    let begun = Instant::now();
    let mut app = PeerApp::start(server).await;
    let side_by_side = [
        (Scenario::Chatty, Boot::NoRetry),
        (Scenario::Quiet, Boot::NoRetry),
        (Scenario::Silent, Boot::NoRetry),
        (Scenario::Quiet, Boot::Shipped),
        (Scenario::MaxAge, Boot::NoRetry),
    ];
    let runs = futures_util::future::join_all(side_by_side.iter().map(|(scenario, boot)| {
        let case = Case {
            server,
            scenario: *scenario,
            boot: *boot,
        };
        drive(case, &app)
    }))
    .await;
    let mut rows: Vec<Row> = runs.into_iter().map(judge).collect();
    // The app under a CPU limit: frozen 70 ms of every 100 ms while the
    // throttled cases run, side by side.
    let throttled = [Scenario::ThrottledChatty, Scenario::ThrottledQuiet];
    let throttle = app.throttle(THROTTLE_STOPPED, THROTTLE_PERIOD, CLIENT_LIMIT + WAIT);
    let runs = futures_util::future::join_all(throttled.iter().map(|scenario| {
        let case = Case {
            server,
            scenario: *scenario,
            boot: Boot::NoRetry,
        };
        assert!(scenario.throttled());
        drive(case, &app)
    }))
    .await;
    let cycles = throttle.stop();
    rows.extend(runs.into_iter().map(|run| {
        let mut row = judge(run);
        if cycles == 0 {
            row.failures.push("the app was never frozen".into());
        }
        row
    }));
    // Data at full speed, and a client that stops reading: side by side,
    // after the others, so their load times none of them.
    let bulk = [Scenario::Bulk, Scenario::SlowClient, Scenario::Gapped];
    let runs = futures_util::future::join_all(bulk.iter().map(|scenario| {
        let case = Case {
            server,
            scenario: *scenario,
            boot: Boot::NoRetry,
        };
        drive(case, &app)
    }))
    .await;
    rows.extend(runs.into_iter().map(judge));
    let stop = Case {
        server,
        scenario: Scenario::AppStop,
        boot: Boot::NoRetry,
    };
    let run = drive(stop, &app).await;
    let limit = APP_EXIT.saturating_sub(run.trigger.elapsed());
    let mut row = judge(run);
    match app.wait_exit(limit).await {
        Some(status) if status.success() => {}
        Some(status) => row.failures.push(format!("the app exited with {status}")),
        None => {
            row.failures.push(format!(
                "the app's graceful stop did not finish within {APP_EXIT:?}: something held it open"
            ));
            app.kill().await;
        }
    }
    rows.push(row);

    let mut out = format!("\n{}\n", Row::HEADER);
    for r in &rows {
        out.push_str(&r.line());
        out.push('\n');
    }
    for r in &rows {
        out.push_str(&r.notes());
    }
    out.push_str(&format!(
        "  {} matrix: {:.1} s\n",
        server.name(),
        begun.elapsed().as_secs_f64()
    ));
    eprintln!("{out}");
    // Kept for `make test`, which prints every server's table at its end
    // (cargo hides a passing test's output).
    let tables = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("peer-matrix");
    let written = std::fs::create_dir_all(&tables).and_then(|()| {
        let file: String = server
            .name()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        std::fs::write(tables.join(format!("{file}.md")), &out)
    });
    if let Err(e) = written {
        eprintln!(
            "peer matrix: could not keep the table in {}: {e}",
            tables.display()
        );
    }
    let failures: Vec<String> = rows
        .iter()
        .filter(|r| !r.failures.is_empty())
        .map(|r| format!("{}:\n  - {}", r.case.name(), r.failures.join("\n  - ")))
        .collect();
    assert!(
        failures.is_empty(),
        "the promise was broken:\n{}\n--- app log (tail) ---\n{}",
        failures.join("\n"),
        tail(&app.log(), 40)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_go() {
    matrix(Server::GrpcGo).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_java() {
    matrix(Server::GrpcJava).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio() {
    matrix(Server::Grpcio).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic() {
    matrix(Server::Tonic).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_app_100ms() {
    matrix(Server::Slow100).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_app_500ms() {
    matrix(Server::Slow500).await
}
