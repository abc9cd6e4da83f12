//! The application shuts ITSELF down gracefully while traffic flows through
//! real Envoy 1.40 -> the real `drainshim` binary's guard -> the app, a
//! separate process:
//! - grpcio (Python, PyPI; `tests/py/grpc_app.py`): `server.stop(grace=20)`;
//! - tonic: the real `drainshim bench server`, whose SIGTERM resolves
//!   `serve_with_shutdown`'s future (GOAWAY, then it waits for its calls).
//!
//! 8 long server streams (a message every 100 ms, numbered) and 5 unary calls
//! that answer after 3 s are open through Envoy's inbound listener when the
//! app gets SIGTERM, either
//! - at the moment the drain starts (the real `drainshim prestop` runs
//!   beside it: in Kubernetes the app container gets SIGTERM while the
//!   sidecar's preStop runs), or
//! - with no drain at all.
//!
//! What the product promises, asserted in every case: no stream is cut
//! (each ends with `grpc-status: 14` at a message boundary, or OK, with no
//! gap in its sequence numbers), every unary call in flight succeeds, the
//! app's graceful stop finishes by itself (no stream holds it until a
//! SIGKILL), and a drain reports nothing cut.
//!
//! Each case runs through the shipped bootstrap (its fail-open retry policy
//! and the app as priority 1) and through a twin with NO retry policy and no
//! fallback, which shows what the guard itself does: a retry must never hide
//! a failure. Every case prints its row of the table.
//!
//! Fails (never skips) without the cached Envoy or the Python venv
//! (`make envoy pytools`).

use crate::support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drainshim_bench::envoy::shipped_bootstrap;
use drainshim_bench::proto::bench::stream_client::StreamClient;
use drainshim_bench::proto::bench::{EchoRequest, SubscribeRequest};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::peers::collect;
use support::*;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Long server streams open at the trigger.
const STREAMS: usize = 8;
/// Unary calls in flight at the trigger.
const UNARY: usize = 5;
/// Messages every long stream has received before the trigger: from two on,
/// the guard counts a stream as long-lived (`--long-stream-age` help).
const FLOWING: usize = 3;
/// The young variant: one message each at the trigger, so the streams only
/// become long-lived after the app's GOAWAY (the relay must look again).
const YOUNG: usize = 1;
/// How long each unary call works before it answers.
const UNARY_DELAY_MS: u32 = 3_000;
/// The app's graceful stop must be over within this (grpcio's grace is
/// 20 s; tonic waits for its calls however long they last). Past it the app
/// gets SIGKILL, as the kubelet does at the end of the grace period.
const APP_EXIT: Duration = Duration::from_secs(30);

/// Drain timers: streams ended over 0.5 s .. 2.5 s after the trigger; what
/// is not long-lived (the unary calls) may finish until the 10 s deadline.
const TIMERS: &[&str] = QUICK_DRAIN_TIMERS;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum App {
    Grpcio,
    Tonic,
}

impl App {
    fn name(self) -> &'static str {
        match self {
            App::Grpcio => "grpcio",
            App::Tonic => "tonic",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Boot {
    /// `deploy/components/envoy/envoy.yaml`: fail-open retries, app at priority 1.
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    /// SIGTERM to the app at the moment the preStop drain starts.
    DrainAtStop,
    /// SIGTERM to the app, no drain.
    NoDrain,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::DrainAtStop => "drain + app stop",
            Scenario::NoDrain => "app stop, no drain",
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Case {
    app: App,
    boot: Boot,
    scenario: Scenario,
    /// Messages each long stream has had at the trigger.
    flowing: usize,
}

/// The application: a separate process, its stdout and stderr collected.
struct AppProc {
    child: tokio::process::Child,
    addr: SocketAddr,
    log: Arc<Mutex<String>>,
    /// Held open: the Python app stops when its stdin closes.
    _stdin: Option<tokio::process::ChildStdin>,
    /// The readers of stdout and stderr; they end at the pipes' EOF.
    readers: Vec<JoinHandle<()>>,
}

impl AppProc {
    async fn start(app: App) -> Self {
        let mut cmd = match app {
            App::Grpcio => {
                let mut c = tokio::process::Command::new(python());
                c.arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/grpc_app.py"));
                c
            }
            App::Tonic => {
                let mut c = tokio::process::Command::new(drainshim_bin());
                c.args(["bench", "server", "--listen", "127.0.0.1:0"])
                    .args(["--log", "info,drainshim_bench::server=debug"]);
                c
            }
        };
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start the {} app: {e}", app.name()));
        let log = Arc::new(Mutex::new(String::new()));
        let readers = vec![
            collect(child.stdout.take().expect("stdout"), log.clone()),
            collect(child.stderr.take().expect("stderr"), log.clone()),
        ];
        let stdin = child.stdin.take();
        let text = || log.lock().map(|l| l.clone()).unwrap_or_default();
        let addr = wait_for_ok(&format!("the {} app listens", app.name()), WAIT, || {
            let text = text();
            async move {
                // grpcio: `listening 127.0.0.1:PORT`; tonic: `... addr=127.0.0.1:PORT`.
                let found = text.lines().find_map(|l| match app {
                    App::Grpcio => l.strip_prefix("listening ").map(str::to_string),
                    App::Tonic if l.contains("bench server listening") => l
                        .split("addr=")
                        .nth(1)
                        .and_then(|r| r.split_whitespace().next())
                        .map(str::to_string),
                    App::Tonic => None,
                });
                found
                    .and_then(|a| a.trim().parse::<SocketAddr>().ok())
                    .ok_or(text)
            }
        })
        .await;
        AppProc {
            child,
            addr,
            log,
            _stdin: stdin,
            readers,
        }
    }

    /// Waits until everything the exited app wrote has been read.
    async fn read_to_end(&mut self) {
        for r in self.readers.drain(..) {
            let _ = tokio::time::timeout(WAIT, r).await;
        }
    }

    fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Unary calls the app has started working on.
    fn echoes_started(&self, app: App) -> usize {
        let marker = match app {
            App::Grpcio => "echo u-",
            App::Tonic => "bench server: echo started",
        };
        self.log().matches(marker).count()
    }

    fn sigterm(&self) {
        let pid = self.child.id().expect("the app is running");
        kill(Pid::from_raw(pid as i32), Signal::SIGTERM).expect("SIGTERM the app");
    }
}

/// One long server stream on its own connection: its messages counted as
/// they arrive; ends when the server ends it, its connection breaks, or
/// after two minutes (bounded).
struct LongStream {
    received: Arc<AtomicUsize>,
    task: JoinHandle<StreamEnd>,
}

fn long_stream(addr: SocketAddr, id: String) -> LongStream {
    let received = Arc::new(AtomicUsize::new(0));
    let counter = received.clone();
    let task = tokio::spawn(async move {
        let mut seqs = Vec::new();
        let status = tokio::time::timeout(Duration::from_secs(120), async {
            let mut client = StreamClient::connect(format!("http://{addr}"))
                .await
                .map_err(|e| tonic::Status::unavailable(format!("connect: {e}")))?;
            let mut stream = client
                .subscribe(SubscribeRequest {
                    stream_id: id.clone(),
                    count: 0,
                    interval_ms: drainshim_bench::client::TICK_INTERVAL_MS,
                    payload_bytes: 64,
                    ..Default::default()
                })
                .await?
                .into_inner();
            while let Some(tick) = stream.message().await? {
                seqs.push(tick.seq);
                counter.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), tonic::Status>(())
        })
        .await
        .unwrap_or_else(|_| {
            Err(tonic::Status::deadline_exceeded(
                "stream outlived the test limit",
            ))
        })
        .err();
        StreamEnd {
            id,
            seqs,
            status,
            ended_at: Instant::now(),
        }
    });
    LongStream { received, task }
}

/// One unary call on its own connection: the reply's body, or the status.
async fn unary_call(addr: SocketAddr, body: String) -> Result<String, tonic::Status> {
    let mut client = StreamClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connect: {e}")))?;
    let reply = client
        .echo(EchoRequest {
            body,
            delay_ms: UNARY_DELAY_MS,
        })
        .await?;
    Ok(reply.into_inner().body)
}

fn describe(s: &tonic::Status) -> String {
    use std::error::Error;
    let mut d = format!("{:?} {:?}", s.code(), s.message());
    let mut source = s.source();
    while let Some(e) = source {
        d.push_str(&format!(" <- {e}"));
        source = e.source();
    }
    d
}

fn secs_f(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

async fn run(case: Case) {
    let begun = Instant::now();
    let mut app = AppProc::start(case.app).await;
    let extra = TIMERS.to_vec();
    let app_addr = app.addr;
    let (mut envoy, mut shim, _guard) = guard_bin_pod(app_addr, &extra, |o| match case.boot {
        Boot::Shipped => {
            o.custom_bootstrap = Some(
                shipped_bootstrap(o.upstream, app_addr, o.admin_port).expect("shipped bootstrap"),
            );
        }
        Boot::NoRetry => {
            // The twin: the guard is the only endpoint and nothing is retried.
            assert!(o.fallback.is_none() && o.route_retry.is_none());
            assert!(!o.bootstrap().contains("retry_policy"), "{}", o.bootstrap());
        }
    })
    .await;

    // The traffic, all through Envoy's inbound listener: long streams,
    // flowing once each has `case.flowing` messages, then the unary calls, in
    // flight once the app has started each (its own log says so).
    let streams: Vec<LongStream> = (0..STREAMS)
        .map(|i| long_stream(envoy.inbound, format!("long-{i}")))
        .collect();
    wait_for_ok("every long stream flows", WAIT, || {
        let counts: Vec<usize> = streams
            .iter()
            .map(|s| s.received.load(Ordering::Relaxed))
            .collect();
        let flowing = counts.iter().all(|n| *n >= case.flowing);
        let ended: Vec<usize> = (0..STREAMS).filter(|i| streams[*i].task.is_finished()).collect();
        std::future::ready(flowing.then_some(()).ok_or(format!(
            "messages per stream: {counts:?}; ended already: {ended:?}\n--- app log ---\n{}\n--- drainshim log ---\n{}",
            tail(&app.log(), 30),
            tail(&shim.log(), 30)
        )))
    })
    .await;
    let calls: Vec<JoinHandle<Result<String, tonic::Status>>> = (0..UNARY)
        .map(|i| tokio::spawn(unary_call(envoy.inbound, format!("u-{i}"))))
        .collect();
    wait_for_ok("every unary call reached the app", WAIT, || {
        let started = app.echoes_started(case.app);
        let done: Vec<usize> = (0..UNARY).filter(|i| calls[*i].is_finished()).collect();
        let last = format!(
            "{started} of {UNARY} started in the app; calls already over: {done:?}\n--- app log ---\n{}\n--- drainshim log ---\n{}",
            tail(&app.log(), 30),
            tail(&shim.log(), 30)
        );
        std::future::ready((started == UNARY).then_some(()).ok_or(last))
    })
    .await;
    let setup = begun.elapsed();

    // The trigger.
    let trigger = Instant::now();
    let drain = match case.scenario {
        Scenario::DrainAtStop => Some(tokio::spawn(prestop(shim.addr))),
        Scenario::NoDrain => None,
    };
    app.sigterm();

    let mut failures = Vec::new();
    let app_exit = match tokio::time::timeout(APP_EXIT, app.child.wait()).await {
        Ok(status) => {
            let status = status.expect("reap the app");
            if !status.success() {
                failures.push(format!("the app exited with {status}"));
            }
            format!("{} by itself", secs_f(trigger.elapsed()))
        }
        Err(_) => {
            failures.push(format!(
                "the app's graceful stop did not finish within {APP_EXIT:?}: something held it open; SIGKILLed"
            ));
            app.child.kill().await.expect("SIGKILL the app and reap it");
            format!("killed at {}", secs_f(trigger.elapsed()))
        }
    };

    app.read_to_end().await;

    // How every long stream ended.
    let (mut graceful, mut completed, mut cut) = (0, 0, 0);
    let mut last_end = Duration::ZERO;
    // grpcio's own account: per stream, the last message handed to grpcio.
    let written: Option<serde_json::Value> = app
        .log()
        .lines()
        .find_map(|l| l.strip_prefix("report "))
        .and_then(|r| serde_json::from_str(r).ok());
    let mut lost = 0u64;
    // How the streams ended (status and message), with how many each.
    let mut endings = std::collections::BTreeMap::<String, usize>::new();
    for s in streams {
        let Ok(end) = tokio::time::timeout(WAIT, s.task).await else {
            cut += 1;
            failures.push(format!(
                "a stream was still open {WAIT:?} after the app was gone"
            ));
            continue;
        };
        let end = end.expect("stream task");
        last_end = last_end.max(end.ended_at.saturating_duration_since(trigger));
        if let Some(w) = written
            .as_ref()
            .and_then(|w| w["streams"][&end.id]["last_written"].as_u64())
        {
            lost += w.saturating_sub(end.seqs.last().copied().unwrap_or(0));
        }
        let status = end.status.as_ref().map(describe);
        *endings
            .entry(status.clone().unwrap_or_else(|| "OK".into()))
            .or_insert(0) += 1;
        let ok = end.gapless() && !end.seqs.is_empty();
        match end.ending() {
            Ending::Graceful if ok => graceful += 1,
            Ending::Completed if ok => completed += 1,
            ending => {
                cut += 1;
                failures.push(format!(
                    "stream {}: {ending:?} {status:?} after {} messages (gapless: {}), {} after the trigger",
                    end.id,
                    end.seqs.len(),
                    end.gapless(),
                    secs_f(end.ended_at.saturating_duration_since(trigger)),
                ));
            }
        }
    }
    let (mut unary_ok, mut unary_failed) = (0, 0);
    for (i, h) in calls.into_iter().enumerate() {
        let r = match tokio::time::timeout(WAIT, h).await {
            Ok(r) => r.expect("unary task"),
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "no answer {WAIT:?} after the app was gone"
            ))),
        };
        match r {
            Ok(body) if body == format!("u-{i}") => unary_ok += 1,
            other => {
                unary_failed += 1;
                failures.push(format!(
                    "unary u-{i}: {:?}",
                    other.map_err(|s| describe(&s))
                ));
            }
        }
    }
    let drain_cut = match drain {
        None => "-".to_string(),
        Some(h) => {
            let run = tokio::time::timeout(WAIT, h)
                .await
                .expect("prestop finished")
                .expect("prestop task");
            if run.code != Some(0) {
                failures.push(format!("prestop exited {:?}: {}", run.code, run.stderr));
            }
            let r = run.report();
            if r.streams.cut != 0 {
                failures.push(format!(
                    "the drain report says cut {}: {r:?}",
                    r.streams.cut
                ));
            }
            format!("{} (terminated {})", r.streams.cut, r.streams.terminated)
        }
    };
    let total = begun.elapsed();

    eprintln!(
        "\n| app | bootstrap | scenario | streams graceful / ok / cut | unary ok / failed | app exit | drain cut | last stream end | case time (setup) |\n\
         |---|---|---|---|---|---|---|---|---|\n\
         | {} | {} | {} | {graceful} / {completed} / {cut} | {unary_ok} / {unary_failed} | {app_exit} | {drain_cut} | {} | {} ({}) |",
        case.app.name(),
        case.boot.name(),
        case.scenario.name(),
        secs_f(last_end),
        secs_f(total),
        secs_f(setup),
    );
    for (how, n) in &endings {
        eprintln!("  {n} stream(s) ended: {how}");
    }
    for f in &failures {
        eprintln!("  - {f}");
    }
    if written.is_some() {
        // Informational: messages grpcio took after the client's last one
        // (the app's own cancel at its grace can lose what it wrote last).
        eprintln!("  grpcio wrote {lost} message(s) the clients never received");
    }

    // Ends what the test started, and waits for it to be gone.
    let _ = shim.child.start_kill();
    let _ = tokio::time::timeout(WAIT, shim.child.wait()).await;
    envoy.kill().await;

    assert!(
        failures.is_empty(),
        "{case:?}: the promise was broken:\n  {}\n--- app log (tail) ---\n{}\n--- drainshim log (tail) ---\n{}",
        failures.join("\n  "),
        tail(&app.log(), 60),
        tail(&shim.log(), 60),
    );
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

macro_rules! case {
    ($name:ident, $app:ident, $boot:ident, $scenario:ident) => {
        case!($name, $app, $boot, $scenario, FLOWING);
    };
    ($name:ident, $app:ident, $boot:ident, $scenario:ident, $flowing:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            run(Case {
                app: App::$app,
                boot: Boot::$boot,
                scenario: Scenario::$scenario,
                flowing: $flowing,
            })
            .await
        }
    };
}

/// Every case, and streams still young at the app's GOAWAY.
mod cases {
    use super::*;

    case!(grpcio_shipped_drain, Grpcio, Shipped, DrainAtStop);
    case!(grpcio_shipped_no_drain, Grpcio, Shipped, NoDrain);
    case!(grpcio_no_retry_drain, Grpcio, NoRetry, DrainAtStop);
    case!(grpcio_no_retry_no_drain, Grpcio, NoRetry, NoDrain);
    case!(tonic_shipped_drain, Tonic, Shipped, DrainAtStop);
    case!(tonic_shipped_no_drain, Tonic, Shipped, NoDrain);
    case!(tonic_no_retry_drain, Tonic, NoRetry, DrainAtStop);
    case!(tonic_no_retry_no_drain, Tonic, NoRetry, NoDrain);
    case!(
        tonic_no_retry_no_drain_young,
        Tonic,
        NoRetry,
        NoDrain,
        YOUNG
    );
    case!(
        grpcio_no_retry_no_drain_young,
        Grpcio,
        NoRetry,
        NoDrain,
        YOUNG
    );
}
