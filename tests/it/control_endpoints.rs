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

/// A request to `addr` from the source address `from` (loopback accepts
/// any 127/8 source on Linux, as Istio's inbound passthrough uses
/// 127.0.0.6); returns (status, body).
async fn http_from(
    from: std::net::Ipv4Addr,
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
) -> (u16, String) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::from((from, 0)))
        .unwrap_or_else(|e| panic!("bind {from}: {e}"));
    let stream = tokio::time::timeout(WAIT, socket.connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    assert_eq!(stream.local_addr().expect("local").ip(), from);
    let method: http::Method = method.parse().expect("method");
    let (status, body) = tokio::time::timeout(
        WAIT,
        drainshim::http::request(stream, &addr.to_string(), method, path),
    )
    .await
    .expect("answer in time")
    .expect("request");
    (status.as_u16(), String::from_utf8_lossy(&body).into_owned())
}

/// The real binary takes drains from 127.0.0.1 (and ::1) only, not from the
/// rest of 127/8: in an Istio pod whose control port is captured, every
/// caller reaching the pod IP arrives from 127.0.0.6 (the inbound
/// passthrough). `--allow-drain-from 127.0.0.6/32` lets that address drain.
#[tokio::test]
async fn drains_come_only_from_127_0_0_1_unless_allowed() {
    let passthrough = std::net::Ipv4Addr::new(127, 0, 0, 6);
    let localhost = std::net::Ipv4Addr::LOCALHOST;
    // No Envoy is needed to judge who asks: the admin address refuses, and
    // a started drain reports envoy_unreachable.
    let admin = format!("http://127.0.0.1:{}", free_port());
    let shim = sidecar_bin(&["--envoy-admin", &admin]).await;

    for (method, path) in [("GET", "/drain?wait=true"), ("POST", "/drain")] {
        let (code, body) = http_from(passthrough, shim.addr, method, path).await;
        assert_eq!(code, 403, "{method} {path} from {passthrough}: {body}");
        assert!(
            body.contains("127.0.0.6") && body.contains("--allow-drain-from"),
            "{body}"
        );
    }
    // Read-only endpoints still answer it; nothing started.
    let (code, body) = http_from(passthrough, shim.addr, "GET", "/status").await;
    assert_eq!(code, 200, "{body}");
    let status: Status = serde_json::from_str(&body).expect("status JSON");
    assert_eq!(status.phase, Phase::Serving);
    shim.wait_log("refused a drain request").await;

    // 127.0.0.1 drains.
    let (code, body) = http_from(localhost, shim.addr, "POST", "/drain").await;
    assert_eq!(code, 202, "{body}");
    let status: Status = serde_json::from_str(&body).expect("status JSON");
    assert_ne!(status.phase, Phase::Serving, "{body}");

    // With --allow-drain-from naming it, 127.0.0.6 drains too.
    let allowed = sidecar_bin(&[
        "--envoy-admin",
        &admin,
        "--allow-drain-from",
        "127.0.0.6/32",
    ])
    .await;
    let (code, body) = http_from(passthrough, allowed.addr, "POST", "/drain").await;
    assert_eq!(code, 202, "{body}");
    let status: Status = serde_json::from_str(&body).expect("status JSON");
    assert_ne!(status.phase, Phase::Serving, "{body}");
    // Only that address: 127.0.0.7 is still refused.
    let (code, body) = http_from(
        std::net::Ipv4Addr::new(127, 0, 0, 7),
        allowed.addr,
        "GET",
        "/drain?wait=true",
    )
    .await;
    assert_eq!(code, 403, "{body}");

    for mut s in [shim, allowed] {
        let _ = s.child.start_kill();
        let _ = tokio::time::timeout(WAIT, s.child.wait()).await;
    }
}

/// A port already taken is named by what could not bind it: the control
/// endpoint or the stream guard, with the address, and the sidecar exits
/// non-zero instead of serving half a pod.
#[tokio::test]
async fn a_taken_port_is_named_by_what_could_not_bind_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let at = taken.local_addr().expect("addr").to_string();
    let run = |listen: &str, guard: &str| {
        let mut cmd = tokio::process::Command::new(drainshim_bin());
        cmd.args(["sidecar", "--listen", listen, "--linger", "0s"])
            .args([
                "--envoy-admin",
                "http://127.0.0.1:9",
                "--guard-listen",
                guard,
            ])
            .args(["--guard-upstream", "127.0.0.1:9"])
            .kill_on_drop(true);
        async move {
            tokio::time::timeout(WAIT, cmd.output())
                .await
                .expect("the sidecar exits on a taken port")
                .expect("run drainshim sidecar")
        }
    };
    for (listen, guard, what) in [
        (at.as_str(), "127.0.0.1:0", "control endpoint"),
        ("127.0.0.1:0", at.as_str(), "stream guard"),
    ] {
        let out = run(listen, guard).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: {err}");
        assert!(
            err.contains(&format!("{what}: bind {at}: ")) && err.contains("in use"),
            "{what} named, with {at}: {err}"
        );
    }
}
