//! The stream guard's promises, checked on the real `drainshim` binary
//! behind real Envoy 1.40 with real gRPC (tonic) on both ends:
//! - a drain ends long-lived streams gracefully and lets unary calls in
//!   flight finish;
//! - nothing the application sent is lost, whatever the message size;
//! - max connection age bounds a connection's life (gRPC A9);
//! - the application's own stream limit is honoured;
//! - a burst of cancelled calls does not tear down the shared connection;
//! - what is still open when the binary exits ends gracefully.

use crate::support;
use crate::support::guard as guard_support;

use std::net::SocketAddr;
use std::time::Duration;

use drainshim::drain::Outcome;
use drainshim_bench::envoy::EnvoyProcess;
use drainshim_bench::proto::bench::stream_client::StreamClient;
use drainshim_bench::proto::bench::{EchoRequest, SubscribeRequest};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::*;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// A pod whose shim is the real binary: backend <- `drainshim sidecar`
/// (guard) <- Envoy.
struct BinPod {
    backend: Backend,
    envoy: EnvoyProcess,
    shim: SidecarBin,
}

async fn bin_pod(backend: Backend, extra: &[&str]) -> BinPod {
    let (envoy, shim, _) = guard_bin_pod(backend.addr, extra, |_| {}).await;
    BinPod {
        backend,
        envoy,
        shim,
    }
}

async fn client(addr: SocketAddr) -> StreamClient<Channel> {
    let ch = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    StreamClient::new(ch).max_decoding_message_size(4 << 20)
}

/// What one Subscribe stream received, and how it ended.
struct Received {
    id: String,
    seqs: Vec<u64>,
    status: Option<tonic::Status>,
}

/// `n` streams `{prefix}{i}`, one after another, each a message every
/// `interval_ms` of `payload_bytes`.
async fn subscribe_n(
    addr: SocketAddr,
    n: usize,
    prefix: &str,
    (interval_ms, payload_bytes): (u32, u32),
) -> Vec<JoinHandle<Received>> {
    let mut streams = Vec::new();
    for i in 0..n {
        let req = SubscribeRequest {
            stream_id: format!("{prefix}{i}"),
            interval_ms,
            payload_bytes,
            ..Default::default()
        };
        streams.push(subscribe(addr, req).await);
    }
    streams
}

/// Starts a Subscribe stream on its own connection and returns once its
/// first message arrived.
async fn subscribe(addr: SocketAddr, req: SubscribeRequest) -> JoinHandle<Received> {
    let mut c = client(addr).await;
    let id = req.stream_id.clone();
    let mut stream = c.subscribe(req).await.expect("subscribe").into_inner();
    let first = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("first message in time")
        .expect("first message")
        .expect("a message");
    tokio::spawn(async move {
        let _keep = c;
        let mut seqs = vec![first.seq];
        let status = loop {
            match stream.message().await {
                Ok(Some(t)) => seqs.push(t.seq),
                Ok(None) => break None,
                Err(s) => break Some(s),
            }
        };
        Received { id, seqs, status }
    })
}

/// Every stream of `streams` ended (each within [`WAIT`]) gracefully and
/// lossless ([`assert_graceful_and_lossless`]).
async fn all_graceful_and_lossless(
    streams: Vec<JoinHandle<Received>>,
    backend: &Backend,
    what: &str,
) {
    for s in streams {
        let r = tokio::time::timeout(WAIT, s)
            .await
            .expect("ends")
            .expect("join");
        assert_graceful_and_lossless(&r, backend, what);
    }
}

fn assert_graceful_and_lossless(r: &Received, backend: &Backend, reason: &str) {
    assert_graceful(r, reason);
    let written = backend.ledger.last_written(&r.id).expect("ledger entry");
    assert_eq!(
        Some(written),
        r.seqs.last().copied(),
        "{}: the backend wrote {written}, the client got {:?}",
        r.id,
        r.seqs.last()
    );
}

/// Ended by the guard with UNAVAILABLE and its `reason`, without a gap.
fn assert_graceful(r: &Received, reason: &str) {
    let status = r
        .status
        .as_ref()
        .expect("ended by the guard, not completed");
    assert_eq!(
        status.code(),
        tonic::Code::Unavailable,
        "{}: {status:?}",
        r.id
    );
    assert!(
        status.message().contains(reason),
        "{}: {:?}",
        r.id,
        status.message()
    );
    let gapless = r.seqs.iter().enumerate().all(|(i, s)| *s == i as u64 + 1);
    assert!(gapless, "{}: gaps in {:?}", r.id, r.seqs);
}

/// Unary calls in flight when a drain starts all finish with their own
/// answer, while the long-lived streams beside them are ended gracefully:
/// Envoy's drain alone would also let the unary calls finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_ends_streams_and_lets_unary_calls_in_flight_finish() {
    const UNARY: usize = 10;
    const STREAMS: usize = 5;
    let pod = bin_pod(
        backend().await,
        &[
            "--deregistration-delay",
            "1s",
            "--min-drain-time",
            "1s",
            "--drain-time",
            "8s",
            "--parent-shutdown-time",
            "12s",
            "--poll-interval",
            "200ms",
        ],
    )
    .await;
    let addr = pod.envoy.inbound;
    let streams = subscribe_n(addr, STREAMS, "s", (100, 64)).await;
    // Each unary call takes 4 s of work: all are in flight when the drain starts.
    let mut unary = Vec::new();
    for i in 0..UNARY {
        let mut c = client(addr).await;
        unary.push(tokio::spawn(async move {
            c.echo(EchoRequest {
                body: format!("u{i}"),
                delay_ms: 4_000,
            })
            .await
            .map(|r| r.into_inner().body)
        }));
    }
    wait_for("Envoy to carry every call", WAIT, || async {
        envoy_streams(&pod.envoy).await == (UNARY + STREAMS) as u64
    })
    .await;

    let run = prestop(pod.shim.addr).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let report = run.report();
    for (i, u) in unary.into_iter().enumerate() {
        let answer = tokio::time::timeout(WAIT, u)
            .await
            .expect("unary call ends")
            .expect("join");
        assert_eq!(
            answer.as_deref().ok(),
            Some(format!("u{i}").as_str()),
            "unary call {i} in flight was not let finish: {answer:?}"
        );
    }
    all_graceful_and_lossless(streams, &pod.backend, "draining").await;
    assert_eq!(report.outcome, Outcome::Quiesced, "{report:?}");
    assert_eq!(report.streams.cut, 0, "{report:?}");
    assert_eq!(report.streams.terminated, STREAMS as u64, "{report:?}");
}

/// Every byte the application sent reaches the client: messages from 1 B to
/// 1 MiB (a 1 MiB message spans many DATA frames), periodic and in bursts,
/// all ended by one drain; each client's last message is the backend's last
/// written one. A tap between the guard and the backend tells where a
/// message the client never got went: one the backend's own transport took
/// and dropped on reading the guard's cancel (never on the wire, or cut
/// short by the app's stack) is the producer's limit docs/design.md names,
/// as in the peer matrix; one that reached the guard and was not forwarded
/// always fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_the_application_sent_is_lost_at_any_message_size() {
    use crate::peer_matrix::account::{lost_fates, Fate};
    let backend = backend().await;
    let tap = guard_support::Tap::start(backend.addr).await;
    let (envoy, shim, _) = guard_bin_pod(
        tap.addr,
        &[
            "--deregistration-delay",
            "500ms",
            "--min-drain-time",
            "500ms",
            "--drain-time",
            "4s",
            "--parent-shutdown-time",
            "15s",
            "--poll-interval",
            "200ms",
        ],
        |_| {},
    )
    .await;
    let addr = envoy.inbound;
    // (payload bytes, interval ms, burst). The guard ends each stream right
    // after a write; the intervals leave room for a loaded CI machine to
    // deliver that write before the next one.
    let shapes: &[(u32, u32, u32)] = &[
        (1, 100, 1),
        (1_000, 100, 1),
        (16 * 1024 + 1, 100, 1),
        (100_000, 150, 1),
        (1 << 20, 300, 1),
        (10, 300, 16),
        (50_000, 300, 4),
        (1 << 20, 400, 3),
    ];
    let mut streams = Vec::new();
    for (i, &(payload_bytes, interval_ms, burst)) in shapes.iter().enumerate() {
        streams.push(
            subscribe(
                addr,
                SubscribeRequest {
                    stream_id: format!("m{i}-{payload_bytes}B-x{burst}"),
                    interval_ms,
                    payload_bytes,
                    burst,
                    ..Default::default()
                },
            )
            .await,
        );
    }
    let run = prestop(shim.addr).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let report = run.report();
    let mut producer_limit = Vec::new();
    for s in streams {
        let r = tokio::time::timeout(WAIT, s)
            .await
            .expect("ends")
            .expect("join");
        assert!(r.seqs.len() > 1, "{}: {} messages", r.id, r.seqs.len());
        assert_graceful(&r, "draining");
        let written = backend.ledger.last_written(&r.id).expect("ledger entry");
        let got = r.seqs.last().copied().unwrap_or(0);
        if written > got {
            let (fates, ending) = lost_fates(&tap, &r.id, got + 1..=written);
            assert!(
                fates
                    .iter()
                    .all(|f| matches!(f, Fate::NeverSent | Fate::CutByApp)),
                "{}: the backend wrote {written}, the client got {got}: {fates:?}\n{ending}",
                r.id
            );
            producer_limit.push(format!("{}: {fates:?}", r.id));
        }
    }
    if !producer_limit.is_empty() {
        eprintln!("lost in the backend's own transport (the producer's limit): {producer_limit:?}");
    }
    // The guard itself dropped nothing after an end.
    let (_, metrics) = http(shim.addr, "GET", "/metrics").await;
    let after_end = metrics
        .lines()
        .find(|l| l.starts_with("drainshim_stream_data_dropped_total{reason=\"after_end\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert_eq!(after_end, Some(0.0), "{metrics}");
    assert_eq!(
        (report.streams.cut, report.streams.terminated),
        (0, shapes.len() as u64),
        "{report:?}"
    );
    tap.stop();
}

/// gRPC A9 through Envoy: the guard connection Envoy pools its streams on
/// lives at most age x 1.1 + grace (plus the close), with the endings
/// spread inside the grace; every stream ends gracefully and loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connection_age_plus_grace_bounds_a_connection() {
    use guard_support::{accepted_at, eof_at, Dir, Tap};
    let age = Duration::from_secs(2);
    let grace = Duration::from_secs(1);
    let backend = backend().await;
    // Envoy -> tap -> guard, so the guard connection's life is seen on the wire.
    let admin_port = free_port();
    let admin = format!("http://127.0.0.1:{admin_port}");
    let (g, up) = (ANY_PORT.to_string(), backend.addr.to_string());
    let shim = sidecar_bin(&[
        "--envoy-admin",
        &admin,
        "--guard-listen",
        &g,
        "--guard-upstream",
        &up,
        "--max-connection-age",
        "2s",
        "--max-connection-age-grace",
        "1s",
        // Longer than the grace: capped at it.
        "--max-connection-age-spread",
        "10s",
    ])
    .await;
    let tap = Tap::start(shim.guard()).await;
    let envoy = envoy_with("1.40.0", tap.addr, |o| o.admin_port = admin_port).await;
    let streams = subscribe_n(envoy.inbound, 6, "aged", (100, 32)).await;
    for s in streams {
        let r = tokio::time::timeout(WAIT, s)
            .await
            .expect("ends")
            .expect("join");
        assert_graceful_and_lossless(&r, &backend, "max connection age");
    }
    tap.wait_for("the guard to close the first connection", |e| {
        eof_at(e, 0, Dir::Down)
    })
    .await;
    let events = tap.events();
    let lived =
        eof_at(&events, 0, Dir::Down).expect("closed") - accepted_at(&events, 0).expect("accepted");
    let bound = age.mul_f64(1.1) + grace;
    // The close itself (an ending at a message boundary, the flush) takes
    // milliseconds; 2 s covers timers firing late on a loaded machine.
    assert!(
        lived <= bound + Duration::from_secs(2),
        "the connection lived {lived:?}; age x 1.1 + grace = {bound:?}"
    );
    eprintln!("max-age connection lived {lived:?} (age x 1.1 + grace = {bound:?})");
    let (_, metrics) = http(shim.addr, "GET", "/metrics").await;
    assert!(
        metrics
            .contains("drainshim_streams_terminated_total{reason=\"max_age\",protocol=\"grpc\"} 6"),
        "{metrics}"
    );
}

/// An application that allows only 10 concurrent streams per connection
/// (Kestrel allows 100, hyper 200) still gets every stream Envoy sends: the
/// guard opens more application connections instead of queueing streams
/// forever behind long-lived ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_stream_limit_is_honoured() {
    const LIMIT: u32 = 10;
    const N: usize = 35;
    let (addr, _ledger, stop) = app_with(|b| b.max_concurrent_streams(LIMIT)).await;
    let pod = bin_pod_to(addr, &[]).await;
    // All streams share Envoy's one connection to the guard.
    let mut c = client(pod.0.inbound).await;
    let mut open = Vec::new();
    for i in 0..N {
        let mut stream = c
            .subscribe(SubscribeRequest {
                stream_id: format!("lim{i}"),
                interval_ms: 200,
                ..Default::default()
            })
            .await
            .expect("subscribe")
            .into_inner();
        let first = tokio::time::timeout(WAIT, stream.message())
            .await
            .unwrap_or_else(|_| panic!("stream {i} never started: queued behind the app's limit"))
            .expect("message");
        assert!(first.is_some(), "stream {i}");
        open.push(stream);
    }
    // And a unary call still gets through beside them.
    let answer = tokio::time::timeout(
        WAIT,
        c.echo(EchoRequest {
            body: "beside".into(),
            delay_ms: 0,
        }),
    )
    .await
    .expect("unary in time");
    assert!(answer.is_ok(), "{answer:?}");
    stop.cancel();
}

/// The bench application on an ephemeral port, served by a tonic server
/// `tweak` configures; stops when the returned token is cancelled.
async fn app_with(
    tweak: impl FnOnce(tonic::transport::Server) -> tonic::transport::Server,
) -> (
    SocketAddr,
    drainshim_bench::server::Ledger,
    tokio_util::sync::CancellationToken,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let service = drainshim_bench::server::BenchService::default();
    let ledger = service.ledger.clone();
    let stop = tokio_util::sync::CancellationToken::new();
    let s = stop.clone();
    let server = tweak(tonic::transport::Server::builder());
    tokio::spawn(async move {
        let mut server = server;
        server
            .add_service(drainshim_bench::proto::bench::stream_server::StreamServer::new(service))
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                s.cancelled_owned(),
            )
            .await
    });
    (addr, ledger, stop)
}

async fn bin_pod_to(upstream: SocketAddr, extra: &[&str]) -> (EnvoyProcess, SidecarBin) {
    let (envoy, shim, _) = guard_bin_pod(upstream, extra, |_| {}).await;
    (envoy, shim)
}

/// One caller opening and cancelling hundreds of calls at once through Envoy
/// must not make the guard tear down the connection Envoy shares among all
/// callers: the long stream beside it keeps flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_cancelled_calls_leaves_the_shared_connection_alone() {
    // The application itself tolerates the burst (hyper's default of 20
    // pending-accept resets would make it close the connection on Envoy
    // alone just the same): this test is about the guard's side.
    let (app, ledger, _stop) =
        app_with(|b| b.http2_max_pending_accept_reset_streams(Some(10_000))).await;
    let (envoy, shim) = bin_pod_to(app, SHORT_TIMERS).await;
    let addr = envoy.inbound;
    let long = subscribe(
        addr,
        SubscribeRequest {
            stream_id: "bystander".into(),
            interval_ms: 100,
            ..Default::default()
        },
    )
    .await;
    for round in 0..3 {
        let c = client(addr).await;
        let calls: Vec<_> = (0..300)
            .map(|i| {
                let mut c = c.clone();
                tokio::spawn(async move {
                    c.echo(EchoRequest {
                        body: format!("burst{round}-{i}"),
                        delay_ms: 10_000,
                    })
                    .await
                })
            })
            .collect();
        // Cancel them all as soon as they are out.
        wait_for("the burst to reach Envoy", WAIT, || async {
            envoy_streams(&envoy).await >= 250
        })
        .await;
        for call in calls {
            call.abort();
        }
        drop(c);
        wait_for("the cancels to reach the guard", WAIT, || async {
            envoy_streams(&envoy).await <= 1
        })
        .await;
    }
    // The bystander was never cut: a drain now ends it gracefully, with
    // every message the backend wrote.
    let run = prestop(shim.addr).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let r = tokio::time::timeout(WAIT, long)
        .await
        .expect("ends")
        .expect("join");
    let status = r.status.as_ref().expect("ended by the drain");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("draining"),
        "the bystander did not last until the drain: {status:?}\nshim log:\n{}",
        shim.log()
    );
    let gapless = r.seqs.iter().enumerate().all(|(i, s)| *s == i as u64 + 1);
    assert!(gapless, "gaps in {:?}", r.seqs);
    assert_eq!(
        ledger.last_written(&r.id),
        r.seqs.last().copied(),
        "lost messages"
    );
    assert_eq!(run.report().streams.cut, 0);
    let log = shim.log();
    assert!(
        !log.contains("ENHANCE_YOUR_CALM"),
        "the guard called the shared connection abusive: {log}"
    );
}

/// SIGTERM on the real binary with streams open: the drain and the exit
/// path end them gracefully, and the process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_open_streams_gracefully_before_the_binary_exits() {
    let mut pod = bin_pod(backend().await, SHORT_TIMERS).await;
    let addr = pod.envoy.inbound;
    let streams = subscribe_n(addr, 4, "t", (100, 0)).await;
    let pid = pod.shim.child.id().expect("pid");
    kill(Pid::from_raw(pid as i32), Signal::SIGTERM).expect("SIGTERM");
    let status = tokio::time::timeout(WAIT, pod.shim.child.wait())
        .await
        .expect("the binary exits")
        .expect("wait");
    assert_eq!(status.code(), Some(0), "{}", pod.shim.log());
    all_graceful_and_lossless(streams, &pod.backend, "draining").await;
}

/// The application process dies (SIGKILL) with streams open: each client
/// gets a retryable UNAVAILABLE naming the lost connection, at a message
/// boundary, never a cut message or a CANCELLED; unary calls then get a
/// retryable UNAVAILABLE too until the application is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_dying_gives_clients_a_retryable_status() {
    let app: SocketAddr = format!("127.0.0.1:{}", free_port())
        .parse()
        .expect("address");
    let mut server = tokio::process::Command::new(drainshim_bin())
        .args(["bench", "server", "--listen", &app.to_string()])
        .kill_on_drop(true)
        .spawn()
        .expect("start the bench server");
    wait_for("the application listens", WAIT, || async {
        tokio::net::TcpStream::connect(app).await.is_ok()
    })
    .await;
    let (envoy, _shim) = bin_pod_to(app, &[]).await;
    let streams = subscribe_n(envoy.inbound, 4, "d", (20, 100)).await;
    server.start_kill().expect("SIGKILL the application");
    tokio::time::timeout(WAIT, server.wait())
        .await
        .expect("the application exits")
        .expect("wait");
    for s in streams {
        let r = tokio::time::timeout(WAIT, s)
            .await
            .expect("ends")
            .expect("join");
        let status = r.status.as_ref().expect("a status");
        assert_eq!(
            status.code(),
            tonic::Code::Unavailable,
            "{}: {status:?}",
            r.id
        );
        let gapless = r.seqs.iter().enumerate().all(|(i, s)| *s == i as u64 + 1);
        assert!(gapless, "{}: gaps in {:?}", r.id, r.seqs);
    }
    let mut c = client(envoy.inbound).await;
    let answer = c
        .echo(EchoRequest {
            body: "after".into(),
            delay_ms: 0,
        })
        .await;
    let status = answer.expect_err("nobody is there to answer");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
}
