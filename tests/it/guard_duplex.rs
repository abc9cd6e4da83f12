//! Full duplex HTTP/2 through the guard with plain h2 on both ends, request
//! and response trailers, and how non-gRPC streams are treated by a drain:
//! let finish if they can, reset (never a clean-looking END_STREAM) if not.

use crate::support::guard as guard_support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use drainshim::drain::StreamGuard;
use drainshim::guard::{GuardConfig, Limits};
use guard_support::*;
use http::{HeaderMap, HeaderValue, Request, Response};
use tokio::net::{TcpListener, TcpStream};

/// An HTTP/2 application that echoes every request chunk as it arrives and
/// answers the request trailers with the same response trailers.
async fn start_echo_app() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind app");
    let addr = listener.local_addr().expect("app addr");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(tcp).await else {
                    return;
                };
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    tokio::spawn(async move {
                        let mut body = req.into_body();
                        let mut send = respond.send_response(Response::new(()), false)?;
                        while let Some(chunk) = body.data().await {
                            let chunk = chunk?;
                            let n = chunk.len();
                            send.send_data(chunk, false)?;
                            let _ = body.flow_control().release_capacity(n);
                        }
                        match body.trailers().await? {
                            Some(t) => send.send_trailers(t)?,
                            None => send.send_data(Bytes::new(), true)?,
                        }
                        Ok::<_, h2::Error>(())
                    });
                }
            });
        }
    });
    addr
}

struct Call {
    send: h2::SendStream<Bytes>,
    body: h2::RecvStream,
}

/// A call on `addr` that sent `first` (5 bytes) and read its echo.
async fn echoed(addr: SocketAddr, first: &'static [u8; 5]) -> Call {
    let mut call = open(addr).await;
    call.send
        .send_data(Bytes::from_static(first), false)
        .expect("send");
    assert_eq!(call.read(5).await, first);
    call
}

async fn open(addr: SocketAddr) -> Call {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(conn);
    let mut sender = within("ready", sender.ready()).await.expect("ready");
    let req = Request::post("http://guard.test/echo")
        .header("content-type", "application/octet-stream")
        .body(())
        .expect("request");
    let (response, send) = sender.send_request(req, false).expect("send request");
    let response = within("response head", response).await.expect("response");
    assert_eq!(response.status(), 200);
    Call {
        send,
        body: response.into_body(),
    }
}

impl Call {
    /// Reads exactly `n` bytes of echo.
    async fn read(&mut self, n: usize) -> Vec<u8> {
        let mut got = Vec::new();
        while got.len() < n {
            let chunk = within("echo", self.body.data())
                .await
                .expect("body open")
                .expect("data");
            let _ = self.body.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        got
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_duplex_with_trailers_both_ways() {
    let app = start_echo_app().await;
    let g = start_guard(GuardConfig::new(app)).await;
    let mut call = open(g.addr).await;
    // Each chunk's echo comes back before the next chunk is sent: the two
    // directions are independent.
    for i in 0..50u32 {
        let chunk = format!("chunk {i} ").repeat(100);
        call.send
            .send_data(Bytes::from(chunk.clone()), false)
            .expect("send");
        assert_eq!(call.read(chunk.len()).await, chunk.into_bytes());
    }
    let mut trailers = HeaderMap::new();
    trailers.insert("x-checksum", HeaderValue::from_static("42"));
    call.send.send_trailers(trailers).expect("trailers");
    assert!(within("end", call.body.data()).await.is_none());
    let t = within("trailers", call.body.trailers())
        .await
        .expect("trailers")
        .expect("some trailers");
    assert_eq!(t.get("x-checksum").map(|v| v.as_bytes()), Some(&b"42"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_grpc_stream_that_finishes_in_time_completes() {
    let app = start_echo_app().await;
    let g = start_guard(GuardConfig::new(app)).await;
    let mut call = echoed(g.addr, b"first").await;
    g.guard.terminate_all(Duration::ZERO);
    // Within `end_timeout` (5 s by default) the client finishes normally.
    call.send
        .send_data(Bytes::from_static(b"last"), true)
        .expect("send");
    assert_eq!(call.read(4).await, b"last");
    // The end may come as an empty DATA frame with END_STREAM.
    while let Some(chunk) = within("end", call.body.data()).await {
        assert_eq!(chunk.expect("a clean end"), Bytes::new());
    }
    assert_eq!(
        g.guard.terminated_by_drain(),
        0,
        "it completed, nothing was ended"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_grpc_stream_that_cannot_finish_is_reset_not_truncated() {
    let app = start_echo_app().await;
    let mut config = GuardConfig::new(app);
    config.limits = Limits {
        end_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let g = start_guard(config).await;
    let mut call = echoed(g.addr, b"hello").await;
    g.guard.terminate_all(Duration::ZERO);
    // The client never finishes its request: after `end_timeout` the guard
    // resets the stream. A clean END_STREAM would pass a cut body as whole.
    match within("the reset", call.body.data()).await {
        Some(Err(e)) => assert_eq!(e.reason(), Some(h2::Reason::CANCEL), "{e:?}"),
        other => panic!("expected a reset, got {other:?}"),
    }
}
