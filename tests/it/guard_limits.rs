//! Greedy and slow clients are bounded or refused, and the guard keeps
//! serving a legitimate client meanwhile.

use crate::support::guard as guard_support;

use std::time::Duration;

use drainshim::guard::Limits;
use drainshim::metrics::Limit;
use drainshim_bench::proto::bench::stream_client::StreamClient;
use guard_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tonic::transport::Channel;

const MAX_STREAMS: u32 = 4;
const HEADER_READ_TIMEOUT: Duration = Duration::from_millis(500);
/// How often the slow clients send a byte or a header: well inside the
/// header read timeout, so only the total time can stop them.
const TRICKLE: Duration = Duration::from_millis(100);
const SUBSCRIBE: &str = "/drainshim.bench.v1.Stream/Subscribe";

struct Setup {
    _backend: Backend,
    g: RunningGuard,
    /// A legitimate stream, flowing the whole time.
    legit: Sub,
}

async fn setup() -> Setup {
    let (backend, g) = guarded(|config| {
        config.limits = Limits {
            max_concurrent_streams: MAX_STREAMS,
            max_header_list_size: 8 * 1024,
            header_read_timeout: HEADER_READ_TIMEOUT,
            ..Limits::default()
        };
    })
    .await;
    let client = connect_client(g.addr).await;
    let legit = subscribe(&client, "legit", 10, 0);
    wait_until("the legitimate stream to flow", || legit.received() > 0).await;
    Setup {
        _backend: backend,
        g,
        legit,
    }
}

impl Setup {
    /// The legitimate client still gets messages, and a new one is served.
    async fn assert_still_serving(&self) {
        let before = self.legit.received();
        wait_until("the legitimate stream to keep flowing", || {
            self.legit.received() > before
        })
        .await;
        let mut c = connect_client(self.g.addr).await;
        let answer = within("echo", echo(&mut c, "legit")).await;
        assert_eq!(answer.expect("echo"), "legit");
        self.legit.assert_no_gaps();
    }
}

/// `c` echoes `body` within [`PATIENCE`] (`what` names the call).
async fn echoes(c: &mut StreamClient<Channel>, what: &str, body: &str) {
    assert_eq!(within(what, echo(c, body)).await.expect("echo"), body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_beyond_the_limit_are_refused() {
    let s = setup().await;
    let mut raw = RawH2::connect(s.g.addr).await;
    let block = grpc_request_block(SUBSCRIBE, &[]);
    let opened = 2 * MAX_STREAMS;
    for i in 0..opened {
        // HEADERS without END_STREAM: every stream stays open.
        raw.send(&encode_frame(HEADERS, END_HEADERS, 2 * i + 1, &block))
            .await
            .expect("send HEADERS");
    }
    let mut refused = Vec::new();
    while refused.len() < (opened - MAX_STREAMS) as usize {
        let f = within(
            "REFUSED_STREAM",
            raw.until(|f| f.ty == RST_STREAM || f.ty == GOAWAY),
        )
        .await
        .expect("connection open");
        assert_eq!(f.ty, RST_STREAM, "{f:?}");
        assert_eq!(f.rst, Some(REFUSED_STREAM), "{f:?}");
        refused.push(f.stream);
    }
    refused.sort_unstable();
    let expected: Vec<u32> = (MAX_STREAMS..opened).map(|i| 2 * i + 1).collect();
    assert_eq!(
        refused, expected,
        "the first {MAX_STREAMS} streams are served"
    );
    s.assert_still_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_headers_are_refused() {
    let s = setup().await;
    let mut raw = RawH2::connect(s.g.addr).await;
    let big = "x".repeat(20 * 1024);
    let block = grpc_request_block(SUBSCRIBE, &[("x-big", &big)]);
    // Split into HEADERS + CONTINUATION frames of at most 16 KiB (the default
    // SETTINGS_MAX_FRAME_SIZE).
    let chunks: Vec<&[u8]> = block.chunks(16 * 1024).collect();
    for (i, c) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        let (ty, base) = if i == 0 {
            (HEADERS, END_STREAM)
        } else {
            (CONTINUATION, 0)
        };
        let flags = base | if last { END_HEADERS } else { 0 };
        raw.send(&encode_frame(ty, flags, 1, c))
            .await
            .expect("send");
    }
    // h2 answers 431 (HEADERS with END_STREAM) and never forwards the request.
    let f = within("the 431 answer", raw.until(|f| f.stream == 1))
        .await
        .expect("an answer on stream 1");
    assert_eq!((f.ty, f.flags & END_STREAM), (HEADERS, END_STREAM), "{f:?}");
    assert_eq!(
        drainshim::drain::StreamGuard::active_streams(&s.g.guard),
        1,
        "only the legitimate stream is open"
    );
    s.assert_still_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_preface_is_cut() {
    let s = setup().await;
    // Before the connect: the guard's timer starts at its accept, which may
    // come before the connect returns here on a loaded machine.
    let start = Instant::now();
    let mut tcp = TcpStream::connect(s.g.addr).await.expect("connect");
    let closed_at = within("the guard to close the slow connection", async {
        for b in PREFACE.iter().cycle() {
            if tcp.write_all(&[*b]).await.is_err() {
                return Instant::now();
            }
            let mut buf = [0u8; 64];
            if let Ok(r) = tokio::time::timeout(TRICKLE, tcp.read(&mut buf)).await {
                if matches!(r, Ok(0) | Err(_)) {
                    return Instant::now();
                }
            }
        }
        unreachable!("cycle never ends")
    })
    .await;
    assert!(closed_at - start >= HEADER_READ_TIMEOUT);
    s.assert_still_serving().await;
}

/// Trickles `bytes` one per tick, reading what the guard sends meanwhile,
/// until the guard closes the connection. Returns the frames received.
async fn trickle(raw: &mut RawH2, bytes: &[u8]) -> Vec<Frame> {
    let mut received = Vec::new();
    within("the guard to close the connection", async {
        for b in bytes {
            if raw.send(std::slice::from_ref(b)).await.is_err() {
                return;
            }
            loop {
                match tokio::time::timeout(TRICKLE, raw.next_frame()).await {
                    Ok(Some(f)) => received.push(f),
                    // EOF or reset: the guard closed the connection.
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
        }
        panic!("the guard let a trickled request head through");
    })
    .await;
    received
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickled_http2_headers_are_cut() {
    let s = setup().await;
    let start = Instant::now();
    let mut raw = RawH2::connect(s.g.addr).await;
    // One HEADERS frame, a byte per tick: h2 waits for the whole frame, so
    // only the guard's first-request deadline can stop it.
    let block = grpc_request_block(SUBSCRIBE, &[("x-pad", &"p".repeat(200))]);
    let frame = encode_frame(HEADERS, END_HEADERS | END_STREAM, 1, &block);
    let received = trickle(&mut raw, &frame).await;
    assert!(Instant::now() - start >= HEADER_READ_TIMEOUT);
    let goaway = received.iter().find_map(|f| f.goaway);
    assert_eq!(goaway, Some((0, 0)), "GOAWAY(0, NO_ERROR) before the close");
    s.assert_still_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuation_floods_are_cut() {
    let s = setup().await;
    let mut raw = RawH2::connect(s.g.addr).await;
    // A header block that never ends: h2's CONTINUATION limit cuts it.
    let block = grpc_request_block(SUBSCRIBE, &[]);
    raw.send(&encode_frame(HEADERS, 0, 1, &block))
        .await
        .expect("send");
    let mut saw_goaway = false;
    within("the guard to close the connection", async {
        for i in 0.. {
            let mut more = Vec::new();
            hpack_literal(&mut more, &format!("x-more-{i}"), "1");
            if raw
                .send(&encode_frame(CONTINUATION, 0, 1, &more))
                .await
                .is_err()
            {
                break;
            }
            match tokio::time::timeout(TRICKLE, raw.next_frame()).await {
                Ok(Some(f)) => saw_goaway |= f.ty == GOAWAY,
                Ok(None) => break,
                Err(_) => {}
            }
        }
    })
    .await;
    assert!(saw_goaway, "the guard says why with a GOAWAY");
    s.assert_still_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_http1_head_is_cut() {
    let s = setup().await;
    let mut tcp = TcpStream::connect(s.g.addr).await.expect("connect");
    tcp.write_all(b"GET / HTTP/1.1\r\nhost: guard.test\r\n")
        .await
        .expect("request line");
    let start = Instant::now();
    let closed_at = within("the guard to close the slow connection", async {
        for i in 0.. {
            if tcp
                .write_all(format!("x-slow-{i}: 1\r\n").as_bytes())
                .await
                .is_err()
            {
                break;
            }
            let mut buf = [0u8; 1024];
            if let Ok(r) = tokio::time::timeout(TRICKLE, tcp.read(&mut buf)).await {
                if matches!(r, Ok(0) | Err(_)) {
                    break;
                }
            }
        }
        Instant::now()
    })
    .await;
    assert!(closed_at - start >= HEADER_READ_TIMEOUT - TRICKLE);
    s.assert_still_serving().await;
}

/// A guard whose process-wide caps are small enough to reach.
async fn capped(max_connections: usize, max_streams: usize) -> (Backend, RunningGuard) {
    guarded(|config| {
        config.limits = Limits {
            max_connections,
            max_streams,
            ..Limits::default()
        };
    })
    .await
}

/// Streams over all connections are capped: the one past the cap is refused
/// with REFUSED_STREAM (never processed, safe to retry), on whichever
/// connection it comes; once a stream ends, a new one is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_past_the_process_cap_are_refused_retryably() {
    const CAP: usize = 3;
    let (_backend, g) = capped(100, CAP).await;
    let client = connect_client(g.addr).await;
    let held: Vec<Sub> = (0..CAP)
        .map(|i| subscribe(&client, &format!("held-{i}"), 20, 0))
        .collect();
    wait_until("the streams under the cap to flow", || {
        held.iter().all(|s| s.received() > 0)
    })
    .await;

    // Another connection, another stream: refused by the process-wide cap
    // (its own connection allows 1,000).
    let mut raw = RawH2::connect(g.addr).await;
    let block = grpc_request_block(SUBSCRIBE, &[]);
    raw.send(&encode_frame(HEADERS, END_HEADERS, 1, &block))
        .await
        .expect("send HEADERS");
    let f = within("REFUSED_STREAM", raw.until(|f| f.stream == 1))
        .await
        .expect("connection open");
    assert_eq!((f.ty, f.rst), (RST_STREAM, Some(REFUSED_STREAM)), "{f:?}");

    // HTTP/1.1 past the cap: 503 with Retry-After, nothing reaches the app.
    let mut h1 = TcpStream::connect(g.addr).await.expect("connect");
    h1.write_all(b"GET /x HTTP/1.1\r\nhost: guard.test\r\n\r\n")
        .await
        .expect("write");
    let mut answer = Vec::new();
    within("the 503", async {
        let mut chunk = [0u8; 1024];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            match h1.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    let head = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 503"), "{head}");
    assert!(head.contains("retry-after: 0"), "{head}");
    assert_eq!(
        g.metrics.guard_limited(Limit::streams).get(),
        2,
        "both refusals counted"
    );

    // One stream ends: a new one is admitted again.
    held[0].done.abort();
    let mut c = connect_client(g.addr).await;
    let mut admitted = false;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !admitted && Instant::now() < deadline {
        admitted = echo(&mut c, "again").await.is_ok();
        if !admitted {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(admitted, "no stream admitted after one of the capped ended");
}

/// Connections past the process-wide cap are closed at once; the ones
/// under it are served, and a freed slot is taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_are_closed() {
    const CAP: usize = 2;
    let (_backend, g) = capped(CAP, 100).await;
    let mut first = connect_client(g.addr).await;
    let mut second = connect_client(g.addr).await;
    echoes(&mut first, "echo 1", "a").await;
    echoes(&mut second, "echo 2", "b").await;
    wait_until("both connections counted", || {
        g.guard.active_connections() == CAP as u64
    })
    .await;

    let mut third = TcpStream::connect(g.addr)
        .await
        .expect("the kernel accepts");
    let mut byte = [0u8; 1];
    let read = within("the third connection closed", third.read(&mut byte)).await;
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "the connection past the cap was not closed: {read:?}"
    );
    echoes(&mut first, "echo 1 again", "c").await;
    assert!(g.metrics.guard_limited(Limit::connections).get() >= 1);

    drop(second);
    wait_until("a slot frees up", || {
        g.guard.active_connections() < CAP as u64
    })
    .await;
    let mut fourth = connect_client(g.addr).await;
    echoes(&mut fourth, "echo 4", "d").await;
}
