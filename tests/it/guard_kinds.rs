//! Long-lived stream kinds besides gRPC, ended by a drain through real Envoy
//! 1.40 and the real `drainshim` binary, read by clients nobody here wrote
//! (curl):
//! - Server-Sent Events end between two events, never mid-event, with
//!   everything the application wrote;
//! - gRPC-Web streams end with the trailer frame `grpc-status:14` in the body.

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use drainshim_bench::envoy::EnvoyProcess;
use http_body_util::StreamBody;
use hyper::body::Frame;
use prost::Message;
use support::guard::{
    connect_client, encode_frame, grpc_request_block, start_backend, subscribe, wait_until, within,
    RawH2, END_HEADERS, HEADERS, RST_STREAM,
};
use support::*;
use tokio::io::AsyncReadExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

/// Drain timers: endings spread over about 1.8 s after a 0.5 s deregistration.
const TIMERS: &[&str] = QUICK_DRAIN_TIMERS;

async fn pod_in_front_of(app: SocketAddr) -> (EnvoyProcess, SidecarBin) {
    let (envoy, shim, _) = guard_bin_pod(app, TIMERS, |_| {}).await;
    (envoy, shim)
}

/// An h2c application serving `GET /events` as Server-Sent Events: event n
/// every 100 ms, each written whole; `written` is the last event handed to
/// the transport.
async fn sse_app() -> (SocketAddr, Arc<Mutex<u64>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let written = Arc::new(Mutex::new(0u64));
    let w = written.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = tcp.set_nodelay(true);
            let w = w.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req| {
                    let w = w.clone();
                    async move {
                        let (tx, rx) = tokio::sync::mpsc::channel::<u64>(1);
                        tokio::spawn(async move {
                            for n in 1..=10_000u64 {
                                if tx.send(n).await.is_err() {
                                    return;
                                }
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        });
                        let body = StreamBody::new(ReceiverStream::new(rx).map(move |n| {
                            if let Ok(mut last) = w.lock() {
                                *last = n;
                            }
                            // A multi-line event, so a cut mid-event would show.
                            let event =
                                format!("id: {n}\nevent: tick\ndata: tick {n}\ndata: more\n\n");
                            Ok::<_, Infallible>(Frame::data(Bytes::from(event)))
                        }));
                        let mut resp = hyper::Response::new(body);
                        resp.headers_mut().insert(
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static("text/event-stream"),
                        );
                        Ok::<_, Infallible>(resp)
                    }
                });
                // HTTP/1.1 and h2c, as the guard's upstream speaks either.
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                .await;
            });
        }
    });
    (addr, written)
}

/// Runs curl (an independent HTTP client) against `url` with extra args,
/// and collects its stdout as it comes. Returns the child and the buffer.
fn curl(args: &[&str]) -> (tokio::process::Child, Arc<Mutex<Vec<u8>>>) {
    let mut child = tokio::process::Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "60"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("curl is needed for these tests (Debian's curl); it never skips");
    let out = Arc::new(Mutex::new(Vec::new()));
    let sink = out.clone();
    let mut stdout = child.stdout.take().expect("stdout");
    tokio::spawn(async move {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n) = stdout.read(&mut buf).await {
            if n == 0 {
                break;
            }
            if let Ok(mut o) = sink.lock() {
                o.extend_from_slice(&buf[..n]);
            }
        }
    });
    (child, out)
}

fn taken(out: &Arc<Mutex<Vec<u8>>>) -> Vec<u8> {
    out.lock().map(|o| o.clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_sent_events_end_between_events_with_nothing_lost() {
    sse_drain(false).await;
}

/// The same over HTTP/1.1 end to end (Envoy's upstream follows the client's
/// protocol): the guard ends the chunked body between two events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_sent_events_over_http1_end_between_events() {
    sse_drain(true).await;
}

async fn sse_drain(http1_upstream: bool) {
    let (app, written) = sse_app().await;
    let (envoy, shim, _) = guard_bin_pod(app, TIMERS, |o| {
        o.upstream_follows_downstream = http1_upstream;
    })
    .await;
    let url = format!("http://{}/events", envoy.inbound);
    let (mut child, out) = curl(&["--no-buffer", "--http1.1", &url]);
    wait_for("three events through Envoy and the guard", WAIT, || async {
        String::from_utf8_lossy(&taken(&out))
            .matches("\n\n")
            .count()
            >= 3
    })
    .await;

    let run = prestop(shim.addr).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("curl ends when the stream does")
        .expect("wait");
    // 0: the body ended cleanly (curl reports a cut transfer as 18 or 56).
    assert_eq!(status.code(), Some(0), "curl: {status:?}");
    let text = String::from_utf8(taken(&out)).expect("utf-8");
    assert!(
        text.ends_with("\n\n"),
        "the stream ended mid-event: {text:?}"
    );
    let ids: Vec<u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .map(|n| n.parse().expect("an id"))
        .collect();
    assert!(
        ids.iter().enumerate().all(|(i, n)| *n == i as u64 + 1),
        "gaps: {ids:?}"
    );
    assert_eq!(
        text.matches("data: more\n\n").count(),
        ids.len(),
        "whole events only"
    );
    let last_written = *written.lock().expect("ledger");
    assert_eq!(ids.last().copied(), Some(last_written), "lost events");
    let report = run.report();
    assert_eq!(
        (report.streams.cut, report.streams.terminated),
        (0, 1),
        "{report:?}"
    );
    support::ws::assert_ended_in_no_request_series(&shim, "http").await;
}

/// The bench service, also speaking gRPC-Web (tonic-web), on an h2c port.
async fn grpc_web_app() -> (SocketAddr, drainshim_bench::server::Ledger) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let service = drainshim_bench::server::BenchService::default();
    let ledger = service.ledger.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .accept_http1(true)
            .layer(tonic_web::GrpcWebLayer::new())
            .add_service(drainshim_bench::proto::bench::stream_server::StreamServer::new(service))
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            )
            .await
    });
    (addr, ledger)
}

/// Splits a gRPC-Web body into (flag, payload) frames.
fn web_frames(mut body: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut frames = Vec::new();
    while body.len() >= 5 {
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        if body.len() < 5 + len {
            break;
        }
        frames.push((body[0], body[5..5 + len].to_vec()));
        body = &body[5 + len..];
    }
    assert!(
        body.is_empty(),
        "a partial frame at the end: {} bytes",
        body.len()
    );
    frames
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_web_streams_end_with_the_trailer_frame() {
    let (app, ledger) = grpc_web_app().await;
    let (envoy, shim) = pod_in_front_of(app).await;
    let req = drainshim_bench::proto::bench::SubscribeRequest {
        stream_id: "web".into(),
        interval_ms: 100,
        payload_bytes: 300,
        ..Default::default()
    }
    .encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(req.len() as u32).to_be_bytes());
    framed.extend_from_slice(&req);
    let dir = tempfile::tempdir().expect("tempdir");
    let body = dir.path().join("request.bin");
    std::fs::write(&body, &framed).expect("request body");
    let url = format!(
        "http://{}/drainshim.bench.v1.Stream/Subscribe",
        envoy.inbound
    );
    let at = format!("@{}", body.display());
    let (mut child, out) = curl(&[
        "--no-buffer",
        "--http1.1",
        "-H",
        "content-type: application/grpc-web+proto",
        "-H",
        "x-grpc-web: 1",
        "--data-binary",
        &at,
        &url,
    ]);
    wait_for(
        "three messages through Envoy and the guard",
        WAIT,
        || async { taken(&out).len() > 3 * 300 },
    )
    .await;
    let run = prestop(shim.addr).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("curl ends")
        .expect("wait");
    assert_eq!(status.code(), Some(0), "curl: {status:?}");
    let frames = web_frames(&taken(&out));
    let (last_flag, trailers) = frames.last().expect("frames");
    assert_eq!(*last_flag, 0x80, "the body ends with the trailer frame");
    let trailers = String::from_utf8_lossy(trailers);
    assert!(trailers.contains("grpc-status:14"), "{trailers}");
    assert!(trailers.contains("draining"), "{trailers}");
    let seqs: Vec<u64> = frames[..frames.len() - 1]
        .iter()
        .map(|(flag, m)| {
            assert_eq!(*flag, 0, "a data frame");
            drainshim_bench::proto::bench::Tick::decode(m.as_slice())
                .expect("a whole Tick")
                .seq
        })
        .collect();
    assert!(
        seqs.iter().enumerate().all(|(i, s)| *s == i as u64 + 1),
        "gaps: {seqs:?}"
    );
    assert_eq!(
        ledger.last_written("web"),
        seqs.last().copied(),
        "lost messages"
    );
    let report = run.report();
    assert_eq!(
        (report.streams.cut, report.streams.terminated),
        (0, 1),
        "{report:?}"
    );
}

/// A sample's value in a Prometheus text page: the line starting with
/// `series` (name and labels, exactly), or 0 when there is none.
fn sample(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// A watch that answers and then has nothing to say is a stream, not a slow
/// call: `plan` reads the guard's request durations as the service's call
/// latency, and a quiet watch's hours there would ask for a drain time no
/// grace period fits. Through real Envoy and the real binary, with a 1 s
/// long-stream age: a stream with one message, then quiet for 1.5 s, is
/// counted as an opened stream whose latency is the time to its message;
/// a slow call (1.5 s of work, then its answer) stays a call.
#[tokio::test]
async fn a_quiet_watch_is_counted_as_a_stream_not_as_a_slow_call() {
    let backend = start_backend().await;
    let (envoy, shim, _) = guard_bin_pod(backend.addr, &["--long-stream-age", "1s"], |_| {}).await;
    let client = connect_client(envoy.inbound).await;
    const SERVICE: &str = "{service=\"drainshim.bench.v1.Stream\"}";
    let opened = "drainshim_guard_streams_opened_total{service=\"drainshim.bench.v1.Stream\",protocol=\"grpc\"}";

    // The watch: its first tick at once, the next in an hour.
    let asked = std::time::Instant::now();
    let watch = subscribe(&client, "quiet-watch", 3_600_000, 0);
    wait_until("the watch's first message", || watch.received() == 1).await;
    let to_first = asked.elapsed().as_secs_f64();
    let quiet = Duration::from_millis(1500);
    tokio::time::sleep(quiet).await; // the subject: 1.5 s of silence
    watch.done.abort();
    let page = wait_for_metrics(shim.addr, |p| sample(p, opened) >= 1.0).await;
    assert_eq!(sample(&page, opened), 1.0, "{page}");
    assert_eq!(
        sample(
            &page,
            &format!("drainshim_guard_request_duration_seconds_count{SERVICE}")
        ),
        1.0,
        "{page}"
    );
    let latency = sample(
        &page,
        &format!("drainshim_guard_request_duration_seconds_sum{SERVICE}"),
    );
    assert!(
        latency <= to_first,
        "the watch's latency is the time to its first message ({to_first:.3} s at the client), \
         not its life: {latency}\n{page}"
    );

    // The slow call: 1.5 s of work, then its answer, its message and its
    // trailers together.
    let mut c = client.clone();
    let called = std::time::Instant::now();
    c.echo(drainshim_bench::proto::bench::EchoRequest {
        body: "slow".into(),
        delay_ms: 1500,
    })
    .await
    .expect("the slow call");
    let took = called.elapsed().as_secs_f64();
    let page = wait_for_metrics(shim.addr, |p| {
        sample(
            p,
            &format!("drainshim_guard_request_duration_seconds_count{SERVICE}"),
        ) >= 2.0
    })
    .await;
    assert_eq!(
        sample(&page, opened),
        1.0,
        "the call is not a stream\n{page}"
    );
    let both = sample(
        &page,
        &format!("drainshim_guard_request_duration_seconds_sum{SERVICE}"),
    );
    assert!(
        both - latency >= 1.5 && both - latency <= took,
        "the call's latency is its whole 1.5 s of work: {}\n{page}",
        both - latency
    );
    drop(envoy);
}

/// A pod whose shim runs with `args` (its app, Envoy and shim, kept alive
/// by the caller), and a raw client's gRPC Subscribe on stream 1 whose
/// request message is never sent (the app waits for it).
async fn a_stream_waiting_on_its_client(
    args: &[&str],
) -> (support::guard::Backend, EnvoyProcess, SidecarBin, RawH2) {
    let backend = start_backend().await;
    let (envoy, shim, _) = guard_bin_pod(backend.addr, args, |_| {}).await;
    let mut raw = RawH2::connect(envoy.inbound).await;
    let block = grpc_request_block("/drainshim.bench.v1.Stream/Subscribe", &[]);
    raw.send(&encode_frame(HEADERS, END_HEADERS, 1, &block))
        .await
        .expect("the request's headers");
    (backend, envoy, shim, raw)
}

/// Once its end is counted: one opened stream, and no latency.
async fn counted_as_a_stream_without_a_latency(shim: &SidecarBin) {
    let opened = "drainshim_guard_streams_opened_total{service=\"drainshim.bench.v1.Stream\",protocol=\"grpc\"}";
    let lifetimes = "drainshim_guard_stream_lifetime_seconds_count{protocol=\"grpc\"}";
    let durations =
        "drainshim_guard_request_duration_seconds_count{service=\"drainshim.bench.v1.Stream\"}";
    let page = wait_for_metrics(shim.addr, |p| sample(p, lifetimes) >= 1.0).await;
    assert_eq!(sample(&page, opened), 1.0, "{page}");
    assert_eq!(
        sample(&page, durations),
        0.0,
        "no answer, no latency:\n{page}"
    );
}

/// A stream that never answered while its client never ended its request
/// (a bidi stream waiting on its client; grpc-go and grpc-java send no
/// headers before their first message) is a stream too once it waited the
/// long-stream age, with no latency: through real Envoy and the binary, a
/// raw client opens a Subscribe and never sends its message, then cancels
/// after 1.5 s.
#[tokio::test]
async fn a_stream_waiting_on_its_client_is_a_stream_without_a_latency() {
    let (_app, envoy, shim, mut raw) =
        a_stream_waiting_on_its_client(&["--long-stream-age", "1s"]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await; // the subject: its wait
    raw.send(&encode_frame(RST_STREAM, 0, 1, &8u32.to_be_bytes()))
        .await
        .expect("the client's cancel");
    counted_as_a_stream_without_a_latency(&shim).await;
    drop(envoy);
}

/// The same stream ended by the guard itself (its max connection age), not
/// by its client: a stream, no latency.
#[tokio::test]
async fn a_stream_waiting_on_its_client_ended_by_max_age_is_a_stream() {
    let args = [
        "--long-stream-age",
        "1s",
        "--max-connection-age",
        "2s",
        "--max-connection-age-grace",
        "1s",
    ];
    let (_app, envoy, shim, mut raw) = a_stream_waiting_on_its_client(&args).await;
    // The client reads (acking SETTINGS) until the guard's ending reaches
    // it through Envoy: the stream's end.
    let ended = within(
        "the guard's ending",
        raw.until(|f| {
            f.stream == 1 && (f.ty == RST_STREAM || (f.ty == HEADERS && f.flags & 1 != 0))
        }),
    )
    .await;
    assert!(ended.is_some(), "the stream ended");
    counted_as_a_stream_without_a_latency(&shim).await;
    drop(envoy);
}

/// The shim's `/metrics` once `ready` holds of it (a deadline, not a sleep).
async fn wait_for_metrics(shim: SocketAddr, ready: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (code, page) = http(shim, "GET", "/metrics").await;
        if code == 200 && ready(&page) {
            return page;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the shim's metrics never showed it:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
