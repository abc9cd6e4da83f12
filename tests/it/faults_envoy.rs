//! The fault matrix (issue 8, item 1): for every fault the drain ends by its
//! deadline, the report says what happened, `drainshim prestop` exits 0 and
//! nothing hangs.
//!
//! | fault | how it is made |
//! |---|---|
//! | Envoy killed mid-drain, streams open | real Envoy, SIGKILL |
//! | Envoy restarted under the drain | real Envoy, SIGKILL, a new one on the same admin port |
//! | admin hung | a relay to the real Envoy's admin that stops answering: accepts and never replies |
//! | admin garbage, truncated or wrong JSON, HTTP errors, an endless body | a small fault-injecting HTTP server (real Envoy cannot be made to do this) |
//! | the application dies mid-stream behind the guard | real Envoy, the real bench server binary, SIGKILL |
//!
//! The clock jumping is in `faults_clock.rs` (paused tokio time).
//! Each test prints one `FAULT` line: the table in the report is made of them.
//! Where a real Envoy serves, unary calls run through it across the fault
//! (`support::load`), and the line says what those callers saw.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use drainshim::drain::{Outcome, Report, Status, Trigger};
use drainshim_bench::client::classify;
use drainshim_bench::proto::bench::stream_client::StreamClient;
use drainshim_bench::proto::bench::EchoRequest;
use support::load::{Seen, Unary, CALLS_IN_A_DRAIN, CALLS_PER_STEP, SLOW_MS};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

/// The hard deadline used with `SHORT_TIMERS`.
const SHORT_DEADLINE: f64 = 2.0;
/// Room above a deadline for the last poll and a loaded CI machine: the
/// drain must end *by its deadline*, not a poll or two later than a stopwatch.
const SLACK: f64 = 5.0;

fn table_line(fault: &str, r: &Report) {
    eprintln!("FAULT | {fault} | {}", report_line(r));
}

/// The report's figures, on one line.
fn report_line(r: &Report) -> String {
    format!(
        "outcome={:?} streams(at_start={} completed={} terminated={} failed={} cut={}) \
         connections(cut={}) envoy(reachable={} restarts={} error={:?}) duration={:.2}s",
        r.outcome,
        r.streams.at_start,
        r.streams.completed,
        r.streams.terminated,
        r.streams.failed,
        r.streams.cut,
        r.connections.cut,
        r.envoy.reachable,
        r.envoy.restarts,
        r.envoy.error,
        r.duration_seconds
    )
}

async fn status(shim: SocketAddr) -> Option<Status> {
    let (_, body) = http(shim, "GET", "/status").await;
    serde_json::from_str(&body).ok()
}

/// Envoy is SIGKILLed while the drain waits on open streams, unary calls
/// running through it all along: Envoy cannot be asked any more, so the
/// drain runs to its deadline, says `envoy_unreachable` with the admin
/// error, and counts what Envoy last had open as cut (the kill closed those
/// connections without a goodbye). The report says when the counts were
/// last read. No call fails before the kill, but for those the client
/// itself failed as Envoy's own drain shut their connection down
/// (`support::load::Outcome::Unsent`); after it, with nothing to restart
/// Envoy, the calls fail (counted and printed, not asserted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_killed_mid_drain() {
    const N: usize = 3;
    let backend = backend().await;
    let mut envoy = envoy("1.40.0", backend.addr).await;
    let streams = open_streams(envoy.inbound, N, "killed").await;
    wait_for("envoy sees every stream", WAIT, || async {
        envoy_streams(&envoy).await == N as u64
    })
    .await;
    let load = Unary::start(envoy.inbound, SLOW_MS);
    let workers = load.workers();
    load.wait_more(CALLS_PER_STEP, "before the drain").await;
    // A deadline long enough that the kill surely comes before it on a
    // loaded machine.
    const DEADLINE: f64 = 5.0;
    let (shim, drain, _sig, _task) = start_sidecar(&envoy.admin_url(), |s| {
        s.budget.timers = timers(ms(200), secs(3), secs(5), ms(100));
        s.budget.admin_timeout = ms(500);
    })
    .await;
    let run = tokio::spawn(prestop(shim));
    // Each worker has at most one call open: Envoy counts those beside
    // the streams.
    wait_for("the drain has counted the streams", WAIT, || async {
        status(shim)
            .await
            .is_some_and(|s| s.active.streams >= N as u64 && s.envoy.reachable)
    })
    .await;
    load.wait_more(CALLS_IN_A_DRAIN, "the drain running, before the kill")
        .await;
    assert!(drain.status().report.is_none(), "ended too early");
    let fault = Instant::now();
    envoy.kill().await;
    let gone = Instant::now();
    load.wait_more(CALLS_PER_STEP, "after the kill").await;
    let calls = load.finish().await;
    let seen = Seen::of(&calls, workers, fault);
    let sent_after: Vec<_> = calls.iter().filter(|c| c.start >= gone).collect();
    let answered_after = sent_after
        .iter()
        .filter(|c| matches!(c.outcome, support::load::Outcome::Ok))
        .count();

    let run = run.await.expect("prestop task");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let r = run.report();
    let cut = r.streams.cut;
    seen.table_line(
        "envoy killed mid-drain",
        &format!("{N} of {N} long streams (the report's {cut} include the calls open at its last poll)"),
        &format!(
            "never in the test (nothing restarts Envoy): {answered_after} of {} calls sent once it was gone answered; \
             the drain ends at its deadline, {:.2} s",
            sent_after.len(),
            r.duration_seconds
        ),
        &report_line(&r),
    );
    seen.assert_none_failed_before(&run.stderr);
    assert_eq!(r.outcome, Outcome::EnvoyUnreachable, "{r:?}");
    assert!(r.duration_seconds >= DEADLINE, "{r:?}");
    assert!(r.duration_seconds < DEADLINE + SLACK, "{r:?}");
    // Every long stream was open at the start and cut; so was each call
    // open at the last poll (at most one per worker). The calls that ended
    // during the drain are its completed streams.
    let (n, most) = (N as u64, (N + workers) as u64);
    assert!((n..=most).contains(&r.streams.at_start), "{r:?}");
    assert!((n..=most).contains(&r.streams.cut), "{r:?}");
    assert!((n..=r.streams.cut).contains(&r.connections.cut), "{r:?}");
    assert!(!r.envoy.reachable);
    let err = r.envoy.error.as_deref().unwrap_or_default();
    assert!(err.contains("connect"), "the report names the cause: {r:?}");
    let seen_at = r.envoy.last_seen_seconds.expect("counts were read once");
    assert!(seen_at < r.duration_seconds, "{r:?}");
    assert!(
        run.stderr.contains("unreachable"),
        "progress says why: {}",
        run.stderr
    );
    // The clients do not hang: the kill ended their streams with a status.
    for s in streams {
        let end = tokio::time::timeout(WAIT, s)
            .await
            .expect("stream ends, no hang")
            .expect("join");
        assert!(end.status.is_some(), "{}: ended OK?", end.id);
    }
}

/// Envoy is killed and a new Envoy takes the same admin port during the
/// drain. The new process is drained too (health check failed again, its
/// inbound listener drained and stopped), the old one's streams are counted
/// as cut, the restart is counted, and the drain then quiesces on the new
/// Envoy, which has nothing open.
#[tokio::test]
async fn envoy_restarted_under_the_drain() {
    const N: usize = 3;
    let backend = backend().await;
    let admin_port = free_port();
    let tweak = |o: &mut drainshim_bench::envoy::EnvoyOptions| {
        o.admin_port = admin_port;
        o.drain_time = Duration::from_secs(1);
    };
    let mut old = envoy_with("1.40.0", backend.addr, tweak).await;
    let streams = open_streams(old.inbound, N, "restarted").await;
    wait_for("envoy sees every stream", WAIT, || async {
        envoy_streams(&old).await == N as u64
    })
    .await;
    let (shim, _drain, _sig, _task) = start_sidecar(&old.admin_url(), |s| {
        s.budget.timers = timers(ms(200), secs(15), secs(20), ms(100));
        s.budget.admin_timeout = ms(500);
    })
    .await;
    let run = tokio::spawn(prestop(shim));
    wait_for("the old envoy is drained and counted", WAIT, || async {
        status(shim).await.is_some_and(|s| {
            s.active.streams == N as u64 && s.envoy.reachable && s.envoy.error.is_none()
        }) && old.admin_client().ready().await.ok() == Some(false)
    })
    .await;
    old.kill().await;
    let new = envoy_with("1.40.0", backend.addr, tweak).await;
    assert_eq!(
        new.admin, old.admin,
        "the new envoy took the same admin port"
    );

    let run = run.await.expect("prestop task");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let r = run.report();
    table_line("envoy restarted under the drain", &r);
    assert_eq!(r.outcome, Outcome::Quiesced, "{r:?}");
    assert!(r.duration_seconds < 20.0 + SLACK, "{r:?}");
    assert_eq!(r.envoy.restarts, 1, "{r:?}");
    assert!(r.envoy.reachable, "{r:?}");
    assert_eq!(
        (r.streams.at_start, r.streams.completed, r.streams.cut),
        (N as u64, 0, N as u64),
        "the old process's streams were lost with it: {r:?}"
    );
    assert_eq!(r.connections.cut, N as u64, "{r:?}");
    // The new Envoy was drained as well: health check failed, inbound stopped.
    let admin = new.admin_client();
    assert_eq!(
        admin.ready().await.ok(),
        Some(false),
        "health check failed again"
    );
    let info = admin.server_info().await.expect("server_info");
    assert_eq!(info.state, "DRAINING");
    wait_for(
        "the new envoy's inbound listener stops after its drain time",
        WAIT,
        || async { admin.listeners_stopped().await.unwrap_or(0) >= 1 },
    )
    .await;
    for s in streams {
        let end = tokio::time::timeout(WAIT, s)
            .await
            .expect("stream ends, no hang")
            .expect("join");
        assert!(end.status.is_some(), "{}", end.id);
    }
}

/// A relay to a real Envoy's admin that, once told to hang, stops
/// answering: connections open then stall, new ones are accepted and held
/// without a byte in reply. Stops when dropped.
struct HangingAdmin {
    addr: SocketAddr,
    hang: CancellationToken,
    _stop: DropGuard,
}

async fn hanging_admin(admin: SocketAddr) -> HangingAdmin {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (hang, stop) = (CancellationToken::new(), CancellationToken::new());
    let (h, s) = (hang.clone(), stop.clone());
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = tokio::select! {
                _ = s.cancelled() => return,
                a = listener.accept() => match a { Ok(a) => a, Err(_) => return },
            };
            let (h, s) = (h.clone(), s.clone());
            tokio::spawn(async move {
                let relay = async {
                    if h.is_cancelled() {
                        return std::future::pending().await;
                    }
                    if let Ok(mut up) = TcpStream::connect(admin).await {
                        let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
                    }
                };
                tokio::select! {
                    _ = relay => {}
                    // The relay is dropped; `conn` is held, silent.
                    _ = h.cancelled() => s.cancelled().await,
                    _ = s.cancelled() => {}
                }
            });
        }
    });
    HangingAdmin {
        addr,
        hang,
        _stop: stop.drop_guard(),
    }
}

/// Envoy's admin stops answering (accepts, never replies) while unary calls
/// run through Envoy: every admin call has a deadline and the drain's
/// deadline does not wait on them. The shim cannot fail Envoy's health
/// check, and the data path is Envoy's alone: not one call fails or hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_hung() {
    let backend = backend().await;
    let envoy = envoy("1.40.0", backend.addr).await;
    let admin = hanging_admin(envoy.admin).await;
    let (shim, _drain, _sig, _task) =
        start_sidecar(&format!("http://{}", admin.addr), short_timers).await;
    let load = Unary::start(envoy.inbound, SLOW_MS);
    let workers = load.workers();
    load.wait_more(CALLS_PER_STEP, "before the hang").await;
    let fault = Instant::now();
    admin.hang.cancel();
    load.wait_more(CALLS_PER_STEP, "the admin hung, before the drain")
        .await;
    let run = prestop(shim).await;
    load.wait_more(CALLS_PER_STEP, "after the drain").await;
    let calls = load.finish().await;
    let seen = Seen::of(&calls, workers, fault);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let r = run.report();
    seen.table_line(
        "admin hung",
        "0 (none held)",
        &format!(
            "no outage; the drain ends at its deadline, {:.2} s",
            r.duration_seconds
        ),
        &report_line(&r),
    );
    seen.assert_none_failed(&run.stderr);
    assert_eq!(r.outcome, Outcome::EnvoyUnreachable);
    assert!(r.duration_seconds < SHORT_DEADLINE + SLACK, "{r:?}");
    let err = r.envoy.error.as_deref().unwrap_or_default();
    assert!(err.contains("no answer within"), "{r:?}");
    assert_eq!(r.envoy.last_seen_seconds, None, "{r:?}");
    // Why nothing failed: Envoy never heard of the drain.
    assert_eq!(envoy.admin_client().ready().await.ok(), Some(true));
}

/// What the fault-injecting admin answers, to every request.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Bytes that are not HTTP at all, then close.
    Garbage,
    /// A 200 whose JSON stops half way.
    TruncatedJson,
    /// A 200 that promises more body than it sends, then closes.
    ShortBody,
    /// A 200 with well-formed JSON of the wrong shape.
    WrongJson,
    /// A 500 for everything.
    ServerError,
    /// A 200 with a chunked body that never ends.
    EndlessBody,
}

impl Fault {
    /// What the report's error must mention.
    fn names(self) -> &'static [&'static str] {
        match self {
            Fault::Garbage => &["http"],
            Fault::TruncatedJson | Fault::WrongJson => &["bad JSON"],
            Fault::ShortBody => &["http"],
            Fault::ServerError => &["status 500"],
            Fault::EndlessBody => &["larger than", "no answer within"],
        }
    }
}

/// A fault-injecting admin server on loopback; stops when dropped.
struct FaultyAdmin {
    addr: SocketAddr,
    _stop: DropGuard,
}

async fn faulty_admin(fault: Fault) -> FaultyAdmin {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = tokio::select! {
                _ = s.cancelled() => return,
                a = listener.accept() => match a { Ok(a) => a, Err(_) => return },
            };
            let s = s.clone();
            tokio::spawn(async move {
                // Read the request head (bounded), whatever it is.
                let mut buf = vec![0u8; 4096];
                let _ = tokio::time::timeout(Duration::from_secs(2), conn.read(&mut buf)).await;
                let head = |status: &str, len: usize| {
                    format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
                    )
                };
                match fault {
                    Fault::Garbage => {
                        let _ = conn
                            .write_all(b"\x00\x01SSH-2.0-nope\r\n\xff\xfe\r\n\r\n")
                            .await;
                    }
                    Fault::TruncatedJson => {
                        let body =
                            r#"{"stats":[{"name":"listener.127.0.0.1_1.downstream_cx_active","val"#;
                        let _ = conn.write_all(head("200 OK", body.len()).as_bytes()).await;
                        let _ = conn.write_all(body.as_bytes()).await;
                    }
                    Fault::ShortBody => {
                        let body = r#"{"configs":[{"listener":"#;
                        let _ = conn.write_all(head("200 OK", 4096).as_bytes()).await;
                        let _ = conn.write_all(body.as_bytes()).await;
                    }
                    Fault::WrongJson => {
                        let body = r#"{"configs":7,"stats":{"a":1},"version":[],"state":42}"#;
                        let _ = conn.write_all(head("200 OK", body.len()).as_bytes()).await;
                        let _ = conn.write_all(body.as_bytes()).await;
                    }
                    Fault::ServerError => {
                        let body = "boom";
                        let _ = conn
                            .write_all(head("500 Internal Server Error", body.len()).as_bytes())
                            .await;
                        let _ = conn.write_all(body.as_bytes()).await;
                    }
                    Fault::EndlessBody => {
                        let _ = conn
                            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                            .await;
                        let chunk = format!("10000\r\n{}\r\n", "[".repeat(0x10000));
                        loop {
                            tokio::select! {
                                _ = s.cancelled() => break,
                                w = conn.write_all(chunk.as_bytes()) => if w.is_err() { break },
                            }
                        }
                    }
                }
                let _ = conn.shutdown().await;
            });
        }
    });
    FaultyAdmin {
        addr,
        _stop: stop.drop_guard(),
    }
}

async fn admin_fault(fault: Fault) {
    let admin = faulty_admin(fault).await;
    let (shim, _drain, _sig, _task) =
        start_sidecar(&format!("http://{}", admin.addr), short_timers).await;
    let run = prestop(shim).await;
    assert_eq!(run.code, Some(0), "{fault:?}: {}", run.stderr);
    let r = run.report();
    table_line(&format!("admin {fault:?}"), &r);
    assert_eq!(r.outcome, Outcome::EnvoyUnreachable, "{fault:?}: {r:?}");
    assert_eq!(r.trigger, Trigger::Prestop);
    assert!(r.duration_seconds >= SHORT_DEADLINE, "{fault:?}: {r:?}");
    assert!(
        r.duration_seconds < SHORT_DEADLINE + SLACK,
        "{fault:?}: {r:?}"
    );
    assert!(!r.envoy.reachable);
    let err = r.envoy.error.clone().unwrap_or_default();
    assert!(
        fault.names().iter().any(|n| err.contains(n)),
        "{fault:?}: the report should name the fault ({:?}): {err:?}",
        fault.names()
    );
    // Nothing was read, so nothing is claimed.
    assert_eq!(r.envoy.last_seen_seconds, None);
    assert_eq!((r.streams.at_start, r.streams.cut), (0, 0));
    // The shim is still healthy and serving.
    assert_eq!(http(shim, "GET", "/healthz").await.0, 200);
    let (code, body) = http(shim, "GET", "/readyz").await;
    assert_eq!(code, 503, "{body}");
}

#[tokio::test]
async fn admin_answers_garbage() {
    admin_fault(Fault::Garbage).await;
}

#[tokio::test]
async fn admin_answers_truncated_json() {
    admin_fault(Fault::TruncatedJson).await;
}

#[tokio::test]
async fn admin_answers_a_short_body() {
    admin_fault(Fault::ShortBody).await;
}

#[tokio::test]
async fn admin_answers_json_of_the_wrong_shape() {
    admin_fault(Fault::WrongJson).await;
}

#[tokio::test]
async fn admin_answers_500() {
    admin_fault(Fault::ServerError).await;
}

#[tokio::test]
async fn admin_answers_an_endless_body() {
    admin_fault(Fault::EndlessBody).await;
}

/// The real bench server binary as the application, killable for real.
struct App {
    child: tokio::process::Child,
    addr: SocketAddr,
}

async fn app_process() -> App {
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let child = tokio::process::Command::new(drainshim_bin())
        .args(["bench", "server", "--listen", &addr.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the bench server");
    wait_for("the application listens", WAIT, || async {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await;
    App { child, addr }
}

/// The application behind the guard dies (SIGKILL) with streams open, during
/// a drain, unary calls running through Envoy and the guard all along: each
/// client gets a clean, retryable gRPC status from the guard (UNAVAILABLE in
/// trailers, the stream ended between messages), not a hang; a new call
/// fails fast with UNAVAILABLE; no call fails before the kill (but for
/// those whose connection Envoy's own drain closed before they were sent),
/// none hangs after it; the drain still completes, with nothing cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_dies_behind_the_guard() {
    const N: usize = 4;
    let mut app = app_process().await;
    // Deregistration outlasts the kill on a loaded machine: the guard must
    // not have started ending streams itself.
    let pod = guard_in_front_of("1.40.0", app.addr, |s| {
        s.budget.timers = timers(secs(3), secs(5), secs(8), ms(100))
    })
    .await;
    let streams = open_streams(pod.envoy.inbound, N, "orphan").await;
    wait_for("envoy sees every stream", WAIT, || async {
        envoy_streams(&pod.envoy).await == N as u64
    })
    .await;
    let load = Unary::start(pod.envoy.inbound, SLOW_MS);
    let workers = load.workers();
    load.wait_more(CALLS_PER_STEP, "before the drain").await;
    let run = tokio::spawn(prestop(pod.shim));
    // Each worker has at most one call open: Envoy counts those beside
    // the streams.
    wait_for("the drain has counted the streams", WAIT, || async {
        status(pod.shim)
            .await
            .is_some_and(|s| s.active.streams >= N as u64 && s.envoy.reachable)
    })
    .await;
    load.wait_more(CALLS_IN_A_DRAIN, "the drain running, before the kill")
        .await;
    let fault = Instant::now();
    app.child.kill().await.expect("kill the application");

    for s in streams {
        let end = tokio::time::timeout(WAIT, s)
            .await
            .expect("the stream ends, no hang")
            .expect("join");
        let st = end.status.as_ref().expect("a gRPC status");
        assert_eq!(st.code(), tonic::Code::Unavailable, "{}: {st:?}", end.id);
        assert_eq!(
            classify(st),
            Ending::Graceful,
            "{}: trailers, not a broken connection: {st:?}",
            end.id
        );
        assert!(end.gapless(), "{}: gaps in {:?}", end.id, end.seqs);
    }
    let streams_ended = fault.elapsed();
    load.wait_more(CALLS_PER_STEP, "after the kill").await;
    let calls = load.finish().await;
    let seen = Seen::of(&calls, workers, fault);
    // A new call through the whole chain fails fast and cleanly.
    let mut client = StreamClient::connect(format!("http://{}", pod.envoy.inbound))
        .await
        .expect("connect to envoy");
    let call = tokio::time::timeout(
        WAIT,
        client.echo(EchoRequest {
            body: "anyone?".into(),
            ..Default::default()
        }),
    )
    .await
    .expect("a new call does not hang");
    let st = call.expect_err("the application is gone");
    assert_eq!(st.code(), tonic::Code::Unavailable, "{st:?}");

    let run = run.await.expect("prestop task");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let r = run.report();
    seen.table_line(
        "application killed behind the guard",
        &format!("0 ({N} long streams and the calls open ended UNAVAILABLE, retryable)"),
        &format!(
            "never in the test (nothing restarts the app); every stream ended {:.2} s after the kill, \
             the drain quiesced at {:.2} s",
            streams_ended.as_secs_f64(),
            r.duration_seconds
        ),
        &report_line(&r),
    );
    seen.assert_none_failed_before(&run.stderr);
    assert!(
        seen.after.hung.is_empty(),
        "calls hung after the kill: {:?}",
        seen.after.hung
    );
    assert_eq!(r.outcome, Outcome::Quiesced, "{r:?}");
    assert_eq!(r.streams.cut, 0, "{r:?}");
    let (n, most) = (N as u64, (N + workers) as u64);
    assert!((n..=most).contains(&r.streams.at_start), "{r:?}");
    assert!(r.duration_seconds < 8.0 + SLACK, "{r:?}");
    // The guard's drain had nothing left to end: the streams ended when the
    // app died, and the report says so (failed), not completed, with the
    // calls it had under way to the app then (each one a call that failed
    // after the kill). The calls answered UNAVAILABLE at once after it
    // never reached an application, so nothing of them was under way to
    // fail: they are completed, with the new call and those answered
    // before the kill.
    assert_eq!(r.streams.terminated, 0, "{r:?}");
    let failed_calls = (seen.after.failed.len() + seen.after.unsent.len()) as u64;
    assert!((n..=n + failed_calls).contains(&r.streams.failed), "{r:?}");
    assert!(r.streams.completed >= 1, "{r:?}");
}
