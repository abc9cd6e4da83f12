//! Bad input on every control endpoint: a 4xx, never a crash, never a drain.

use crate::support;

use drainshim::drain::{Phase, Status};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends raw bytes and returns whatever comes back before the server closes.
async fn raw(addr: std::net::SocketAddr, bytes: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let _ = s.write_all(bytes).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn bad_input_gets_4xx_and_the_shim_keeps_serving() {
    let backend = backend().await;
    let envoy = envoy("1.40.0", backend.addr).await;
    let (shim, drain, _sig, _task) = start_sidecar(&envoy.admin_url(), short_timers).await;

    for (method, path, want) in [
        ("GET", "/nope", 404),
        ("GET", "/", 404),
        ("GET", "/drain", 405),
        ("DELETE", "/drain", 405),
        ("PUT", "/drain?wait=true", 405),
        ("POST", "/drain?wait=maybe", 400),
        ("POST", "/drain?force=1", 400),
        ("GET", "/drain?wait=true&now=1", 400),
        ("POST", "/metrics", 405),
        ("PUT", "/status", 405),
        ("DELETE", "/healthz", 405),
        ("POST", "/readyz", 405),
        ("HEAD", "/metrics", 200),
        ("GET", "/readyz", 200),
    ] {
        let (code, body) = http(shim, method, path).await;
        assert_eq!(code, want, "{method} {path}: {body}");
    }
    let (_, allow) = http(shim, "DELETE", "/drain").await;
    assert!(allow.contains("GET, POST"), "{allow}");

    // Garbage, a TLS hello, an oversized header, an absurd request line.
    let garbage = raw(
        shim,
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n",
    )
    .await;
    assert!(
        garbage.is_empty() || garbage.starts_with("HTTP/1.1 400"),
        "{garbage:?}"
    );
    let huge = format!(
        "GET /status HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let resp = raw(shim, huge.as_bytes()).await;
    assert!(
        resp.is_empty() || resp.starts_with("HTTP/1.1 431"),
        "{resp:?}"
    );
    let resp = raw(shim, b"BREW /pot HTCPCP/1.0\r\n\r\n").await;
    assert!(
        resp.is_empty() || resp.starts_with("HTTP/1.1 4"),
        "{resp:?}"
    );
    let resp = raw(
        shim,
        b"POST /drain?wait=true HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
    )
    .await;
    assert!(
        resp.is_empty() || resp.starts_with("HTTP/1.1 400"),
        "{resp:?}"
    );

    // Still alive, and nothing above started a drain.
    assert_eq!(
        http(shim, "GET", "/healthz").await,
        (200, "ok\n".to_string())
    );
    let (_, body) = http(shim, "GET", "/status").await;
    let status: Status = serde_json::from_str(&body).expect("status JSON");
    assert_eq!(status.phase, Phase::Serving);
    assert_eq!(drain.status().phase, Phase::Serving);
}

/// `/readyz` tells the truth about Envoy: 503 with the reason when its admin is gone.
#[tokio::test]
async fn readyz_follows_envoy() {
    let backend = backend().await;
    let mut envoy = envoy("1.40.0", backend.addr).await;
    let (shim, _drain, _sig, _task) = start_sidecar(&envoy.admin_url(), short_timers).await;
    assert_eq!(http(shim, "GET", "/readyz").await.0, 200);
    envoy.kill().await;
    let (code, body) = http(shim, "GET", "/readyz").await;
    assert_eq!(code, 503);
    assert!(body.contains("connect"), "{body}");
}
