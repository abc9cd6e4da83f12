//! HTTP/1.1 through real Envoy 1.40 (upstream protocol following the
//! downstream) and the real `drainshim` binary's guard: the peer's address
//! reaches the app in `X-Forwarded-For`, idle keep-alive connections outlive
//! the header read timeout while a trickled head does not, a stale app
//! keep-alive connection is retried when that is safe, long responses follow
//! the drain's spread while short ones finish, and max age bounds a
//! connection's life by age x 1.1 + grace.

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use support::h1::{h1_client, serve_h1, Sender};
use support::ws::WS_TIMERS;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

type AppBody = http_body_util::Either<
    Full<Bytes>,
    StreamBody<tokio_stream::wrappers::ReceiverStream<Result<Frame<Bytes>, Infallible>>>,
>;

/// `/xff`: the X-Forwarded-For it got. `/stream`: a chunk every 50 ms, no
/// length, for up to 2 minutes. `/slow`: "done" after 1.5 s, with a length.
async fn h1_app() -> SocketAddr {
    let (addr, _serving) = serve_h1(|req: Request<Incoming>| async move {
        let body: AppBody = match req.uri().path() {
            "/xff" => {
                let xff = req
                    .headers()
                    .get("x-forwarded-for")
                    .map(|v| v.as_bytes().to_vec())
                    .unwrap_or_default();
                http_body_util::Either::Left(Full::new(Bytes::from(xff)))
            }
            "/stream" => {
                let (tx, rx) = tokio::sync::mpsc::channel(4);
                tokio::spawn(async move {
                    for i in 0..2400u32 {
                        let chunk = Bytes::from(format!("tick {i}\n"));
                        if tx.send(Ok(Frame::data(chunk))).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                });
                http_body_util::Either::Right(StreamBody::new(
                    tokio_stream::wrappers::ReceiverStream::new(rx),
                ))
            }
            _ => {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                http_body_util::Either::Left(Full::new(Bytes::from_static(b"done")))
            }
        };
        Ok::<_, Infallible>(Response::new(body))
    })
    .await;
    addr
}

async fn get(sender: &mut Sender, path: &str, headers: &[(&str, &str)]) -> (u16, Bytes) {
    let mut req = Request::get(path).header("host", "app.test");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::new())).expect("request");
    tokio::time::timeout(WAIT, async {
        sender.ready().await.expect("ready");
        let resp = sender.send_request(req).await.expect("response");
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        (status, body)
    })
    .await
    .expect("answered in time")
}

/// Envoy -> the guard binary -> `app`; returns (Envoy, shim, guard address).
async fn pod(
    app: SocketAddr,
    extra: &[&str],
) -> (drainshim_bench::envoy::EnvoyProcess, SidecarBin, SocketAddr) {
    let admin_port = free_port();
    let admin = format!("http://127.0.0.1:{admin_port}");
    let (g, a) = (ANY_PORT.to_string(), app.to_string());
    let mut args = vec![
        "--envoy-admin",
        admin.as_str(),
        "--guard-listen",
        g.as_str(),
        "--guard-upstream",
        a.as_str(),
    ];
    args.extend_from_slice(extra);
    let shim = sidecar_bin(&args).await;
    let guard = shim.guard();
    let envoy = support::ws::ws_envoy(guard, admin_port).await;
    (envoy, shim, guard)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_gets_the_peer_in_x_forwarded_for() {
    let app = h1_app().await;
    let (envoy, _shim, guard) = pod(app, &[]).await;
    let mut c = h1_client(envoy.inbound).await;
    let (status, xff) = get(&mut c, "/xff", &[("x-forwarded-for", "203.0.113.7")]).await;
    assert_eq!(status, 200);
    // Envoy (not the edge here) keeps the client's header; the guard appends
    // its peer, Envoy's address.
    assert_eq!(xff, Bytes::from_static(b"203.0.113.7, 127.0.0.1"));
    let mut direct = h1_client(guard).await;
    let (_, xff) = get(&mut direct, "/xff", &[]).await;
    assert_eq!(xff, Bytes::from_static(b"127.0.0.1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_outlives_the_header_timeout_but_a_trickled_head_does_not() {
    let app = h1_app().await;
    let (_envoy, _shim, guard) = pod(app, &[]).await;
    let mut idle = h1_client(guard).await;
    assert_eq!(get(&mut idle, "/xff", &[]).await.0, 200);
    let mut slow = TcpStream::connect(guard).await.expect("connect");
    slow.write_all(b"GET /xff HTTP/1.1\r\nhost: x\r\n")
        .await
        .expect("part of a head");
    // The guard's header read timeout is 10 s; its trickled head is closed then.
    let started = Instant::now();
    let mut b = [0u8; 512];
    let closed = tokio::time::timeout(WAIT, slow.read(&mut b))
        .await
        .expect("closed in time");
    assert!(
        matches!(closed, Ok(0) | Err(_))
            || closed
                .as_ref()
                .is_ok_and(|n| b[..*n].starts_with(b"HTTP/1.1 408")),
        "{closed:?}"
    );
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(9), "closed after {waited:?}");
    // The idle kept-alive connection was left alone all that time.
    tokio::time::sleep_until(started + Duration::from_secs(11)).await;
    assert_eq!(
        get(&mut idle, "/xff", &[]).await.0,
        200,
        "the idle connection is still served"
    );
}

/// An app that answers the first request of each connection (keeping it
/// alive), then reads the second one and closes without an answer: a
/// keep-alive connection the app closed just as the request arrived.
async fn stale_keepalive_app() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut b = [0u8; 4096];
                let mut answered = false;
                loop {
                    let n = match tcp.read(&mut b).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    buf.extend_from_slice(&b[..n]);
                    // Wait for a complete head (bodies here are tiny and sent with it).
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    if answered {
                        return; // closes without an answer
                    }
                    buf.drain(..end + 4);
                    buf.clear();
                    answered = true;
                    let _ = tcp
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await;
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_app_keep_alive_is_retried_when_safe() {
    let app = stale_keepalive_app().await;
    let (_envoy, _shim, guard) = pod(app, &[]).await;
    let mut c = h1_client(guard).await;
    assert_eq!(
        get(&mut c, "/a", &[]).await,
        (200, Bytes::from_static(b"ok"))
    );
    // The second request meets the stale connection: a GET is retried.
    assert_eq!(
        get(&mut c, "/b", &[]).await,
        (200, Bytes::from_static(b"ok"))
    );
    // A POST with a body is not replayed: 502.
    let req = Request::post("/c")
        .header("host", "x")
        .body(Full::new(Bytes::from_static(b"payload")))
        .expect("request");
    let status = tokio::time::timeout(WAIT, async {
        c.ready().await.expect("ready");
        c.send_request(req)
            .await
            .expect("response")
            .status()
            .as_u16()
    })
    .await
    .expect("answered");
    assert_eq!(status, 502);
}

/// Reads a streaming response until it ends; returns (bytes, ended cleanly, when).
async fn read_stream(addr: SocketAddr, path: &'static str) -> (usize, bool, Instant) {
    let mut c = h1_client(addr).await;
    let req = Request::get(path)
        .header("host", "x")
        .body(Full::new(Bytes::new()))
        .expect("req");
    c.ready().await.expect("ready");
    let resp = c.send_request(req).await.expect("response head");
    let mut body = resp.into_body();
    let mut n = 0;
    let clean = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match body.frame().await {
                Some(Ok(f)) => n += f.data_ref().map_or(0, |d| d.len()),
                Some(Err(_)) => return false,
                None => return true,
            }
        }
    })
    .await
    .expect("the response ended in time");
    (n, clean, Instant::now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_ends_long_responses_spread_over_its_window_and_lets_short_ones_finish() {
    let app = h1_app().await;
    let (envoy, shim, _guard) = pod(app, WS_TIMERS).await;
    let inbound = envoy.inbound;
    let mut streams = Vec::new();
    for _ in 0..4 {
        streams.push(tokio::spawn(read_stream(inbound, "/stream")));
    }
    let slow = tokio::spawn(read_stream(inbound, "/slow"));
    wait_for("4 streams and a slow call open", WAIT, || async {
        envoy_streams(&envoy).await >= 5
    })
    .await;
    let started = Instant::now();
    let run = prestop(shim.addr).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let report = run.report();
    let (n, clean, _) = slow.await.expect("slow call");
    assert!(
        clean && n == 4,
        "the short call finished whole: {n} bytes, clean {clean}\n{}",
        shim.log()
    );
    let mut ends = Vec::new();
    for s in streams {
        let (n, clean, at) = s.await.expect("stream");
        assert!(
            n > 0 && !clean,
            "a long response is cut short, never made to look complete"
        );
        ends.push(at - started);
    }
    ends.sort();
    // Spread over the 3 s window (after 300 ms of deregistration), not at once.
    let spread = ends[ends.len() - 1] - ends[0];
    assert!(spread >= Duration::from_millis(1000), "ends {ends:?}");
    assert_eq!(report.streams.cut, 0, "{report:?}");
    support::ws::wait_metric(
        &shim,
        "drainshim_streams_ungraceful_total{reason=\"drain\",protocol=\"http\"} 4",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_age_bounds_an_http1_connection_by_age_and_grace() {
    let app = h1_app().await;
    let (_envoy, _shim, guard) = pod(app, MAX_AGE_2S).await;
    let opened = Instant::now();
    let (n, clean, at) = read_stream(guard, "/stream").await;
    let lived = at - opened;
    assert!(n > 0 && !clean);
    let bound =
        Duration::from_secs(2).mul_f64(1.1) + Duration::from_secs(1) + Duration::from_millis(500);
    assert!(lived >= Duration::from_millis(2700), "lived {lived:?}");
    assert!(lived <= bound, "lived {lived:?}, bound {bound:?}");
}
