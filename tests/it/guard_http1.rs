//! HTTP/1.1 through the guard: proxied to an HTTP/1.1 application, and
//! `Connection: close` while draining.

use crate::support::guard as guard_support;

use std::net::SocketAddr;

use crate::support::h1::{h1_client, serve_h1, Sender};
use bytes::Bytes;
use drainshim::drain::StreamGuard;
use drainshim::guard::GuardConfig;
use guard_support::*;
use http::header::CONNECTION;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

/// An HTTP/1.1-only application: answers `<method> <path> <body>`.
async fn start_h1_app() -> SocketAddr {
    let (addr, _serving) = serve_h1(|req: Request<Incoming>| async move {
        let head = format!("{} {} ", req.method(), req.uri().path());
        let body = req.into_body().collect().await?.to_bytes();
        let mut out = head.into_bytes();
        out.extend_from_slice(&body);
        Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(out))))
    })
    .await;
    addr
}

async fn call(sender: &mut Sender, path: &str, body: &str) -> Response<Bytes> {
    let req = Request::post(path)
        .header("host", "guard.test")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    within("a response", async {
        sender.ready().await.expect("ready");
        let resp = sender.send_request(req).await.expect("response");
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Response::from_parts(parts, body)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_is_proxied_and_closed_while_draining() {
    let app = start_h1_app().await;
    let g = start_guard(GuardConfig::new(app)).await;
    let mut c = h1_client(g.addr).await;

    // Keep-alive: two requests on one connection.
    for (path, body) in [("/one", "a"), ("/two", "bb")] {
        let resp = call(&mut c, path, body).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.body(), &Bytes::from(format!("POST {path} {body}")));
        assert!(resp.headers().get(CONNECTION).is_none());
    }
    assert_eq!(g.guard.active_connections(), 1);

    // Draining: the idle keep-alive connection is closed, and a new
    // connection gets its answer with `Connection: close`.
    g.guard.goaway_all();
    wait_until("the idle connection to close", || {
        g.guard.active_connections() == 0
    })
    .await;
    let mut c = h1_client(g.addr).await;
    let resp = call(&mut c, "/three", "ccc").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.body(), &Bytes::from("POST /three ccc"));
    assert_eq!(
        resp.headers().get(CONNECTION).map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    wait_until("the drained connection to close", || {
        g.guard.active_connections() == 0
    })
    .await;

    // Terminating: requests are refused before reaching the application.
    g.guard.terminate_all(std::time::Duration::ZERO);
    let mut c = h1_client(g.addr).await;
    let resp = call(&mut c, "/four", "d").await;
    assert_eq!(resp.status(), 503);
    assert_eq!(g.guard.active_streams(), 0);
}
