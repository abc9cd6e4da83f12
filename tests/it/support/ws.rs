//! WebSocket pieces shared by the WebSocket tests: the bench WebSocket app
//! in-process, a real Envoy 1.40 with WebSocket upgrades on and the upstream
//! protocol following the downstream, the real `drainshim sidecar` binary as
//! the guard between them, and tokio-tungstenite clients that record every
//! tick and the Close they got.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use drainshim_bench::envoy::EnvoyProcess;
use drainshim_bench::ws::WsLedger;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use super::{envoy_with, free_port, sidecar_bin, wait_for, SidecarBin, ANY_PORT, WAIT};

/// The bench WebSocket app on an ephemeral port; stops on drop.
pub struct WsApp {
    pub addr: SocketAddr,
    pub ledger: WsLedger,
    stop: CancellationToken,
}

impl Drop for WsApp {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub async fn ws_app() -> WsApp {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind ws app");
    let addr = listener.local_addr().expect("ws app addr");
    let ledger = WsLedger::default();
    let stop = CancellationToken::new();
    let (l, s) = (ledger.clone(), stop.clone());
    tokio::spawn(async move { drainshim_bench::ws::serve(listener, l, s.cancelled_owned()).await });
    WsApp { addr, ledger, stop }
}

/// The bench app that serves gRPC over HTTP/2 and WebSockets over
/// HTTP/1.1 on one port (`drainshim bench app`): a guard's HTTP/2
/// connection to it is an HTTP/2 one, so an extended CONNECT has to be
/// served beside it.
pub async fn mixed_app() -> WsApp {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind mixed app");
    let addr = listener.local_addr().expect("mixed app addr");
    let ledger = WsLedger::default();
    let stop = CancellationToken::new();
    let (l, s) = (ledger.clone(), stop.clone());
    tokio::spawn(async move {
        drainshim_bench::ws::serve_mixed(listener, l, s.cancelled_owned()).await
    });
    WsApp { addr, ledger, stop }
}

/// A real Envoy 1.40 in front of `upstream`, WebSocket upgrades on, the
/// upstream protocol following the downstream (HTTP/1.1 here).
pub async fn ws_envoy(upstream: SocketAddr, admin_port: u16) -> EnvoyProcess {
    envoy_with("1.40.0", upstream, |o| {
        o.admin_port = admin_port;
        o.upstream_follows_downstream = true;
    })
    .await
}

/// Envoy -> the real `drainshim sidecar` guard -> the WebSocket app.
pub struct WsPod {
    pub app: WsApp,
    pub shim: SidecarBin,
    pub guard: SocketAddr,
    pub envoy: EnvoyProcess,
}

/// Timers for a short drain: 3 s window, deadline at 8 s.
pub const WS_TIMERS: &[&str] = &[
    "--deregistration-delay",
    "300ms",
    "--min-drain-time",
    "300ms",
    "--drain-time",
    "3s",
    "--parent-shutdown-time",
    "8s",
    "--poll-interval",
    "100ms",
];

pub async fn ws_pod(extra: &[&str]) -> WsPod {
    let app = ws_app().await;
    let admin_port = free_port();
    let admin = format!("http://127.0.0.1:{admin_port}");
    let (guard_s, app_s) = (ANY_PORT.to_string(), app.addr.to_string());
    let mut args = vec![
        "--envoy-admin",
        &admin,
        "--guard-listen",
        &guard_s,
        "--guard-upstream",
        &app_s,
    ];
    args.extend_from_slice(extra);
    let shim = sidecar_bin(&args).await;
    let guard = shim.guard();
    let envoy = ws_envoy(guard, admin_port).await;
    WsPod {
        app,
        shim,
        guard,
        envoy,
    }
}

/// What one client saw.
#[derive(Debug, Default)]
pub struct WsEnd {
    pub id: String,
    /// Tick sequence numbers, in arrival order.
    pub seqs: Vec<u64>,
    /// The Close frame's code, if one arrived.
    pub close_code: Option<u16>,
    /// Set if the connection ended without a Close frame (1006).
    pub error: Option<String>,
    /// When the Close frame (or the error) arrived.
    pub closed_at: Option<tokio::time::Instant>,
    /// When the connection was over (the server closed it).
    pub ended_at: Option<tokio::time::Instant>,
}

impl WsEnd {
    pub fn gapless(&self) -> bool {
        self.seqs.iter().zip(1u64..).all(|(s, want)| *s == want)
    }
}

/// Opens a WebSocket to `addr` ticking every `interval_ms` with `size`
/// bytes of padding, and returns once the first tick arrived; the task
/// records every tick until the connection ends.
pub async fn ws_ticker(
    addr: SocketAddr,
    id: &str,
    interval_ms: u64,
    size: usize,
) -> (JoinHandle<WsEnd>, tokio::sync::watch::Receiver<usize>) {
    let url = format!("ws://{addr}/tick?id={id}&interval_ms={interval_ms}&size={size}");
    let (mut ws, resp) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(&url))
        .await
        .expect("connect in time")
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    assert_eq!(resp.status(), 101);
    let (count_tx, count_rx) = tokio::sync::watch::channel(0usize);
    let id = id.to_string();
    let task = tokio::spawn(async move {
        let mut end = WsEnd {
            id: id.clone(),
            ..WsEnd::default()
        };
        // Bounded: the test's drain ends every connection well within this.
        let _ = tokio::time::timeout(Duration::from_secs(120), async {
            while let Some(m) = ws.next().await {
                match m {
                    Ok(Message::Text(t)) => {
                        let mut parts = t.split(' ');
                        if parts.next() == Some(id.as_str()) {
                            if let Some(seq) = parts.next().and_then(|s| s.parse().ok()) {
                                end.seqs.push(seq);
                                count_tx.send_replace(end.seqs.len());
                            }
                        }
                    }
                    Ok(Message::Close(frame)) => {
                        end.close_code = Some(frame.map_or(1005, |f| u16::from(f.code)));
                        end.closed_at = Some(tokio::time::Instant::now());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        end.error = Some(e.to_string());
                        end.closed_at.get_or_insert_with(tokio::time::Instant::now);
                        break;
                    }
                }
            }
        })
        .await;
        end.ended_at = Some(tokio::time::Instant::now());
        let _ = ws.close(None).await;
        end
    });
    let mut rx = count_rx.clone();
    tokio::time::timeout(WAIT, rx.wait_for(|n| *n >= 1))
        .await
        .expect("a first tick in time")
        .expect("ticker alive");
    (task, count_rx)
}

/// Waits until the shim's `/metrics` contains `needle`, and returns them.
pub async fn wait_metric(shim: &SidecarBin, needle: &str) -> String {
    let addr = shim.addr;
    wait_for(&format!("metric {needle}"), WAIT, || async move {
        super::http(addr, "GET", "/metrics")
            .await
            .1
            .contains(needle)
    })
    .await;
    super::http(addr, "GET", "/metrics").await.1
}

/// The guard's ending is not the app's outcome: once the one `protocol`
/// request's signals are recorded (its lifetime), it is in no request
/// series of `shim`.
pub async fn assert_ended_in_no_request_series(shim: &SidecarBin, protocol: &str) {
    let lifetime =
        format!("drainshim_guard_stream_lifetime_seconds_count{{protocol=\"{protocol}\"}} 1");
    let text = wait_metric(shim, &lifetime).await;
    let label = format!("protocol=\"{protocol}\"");
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("drainshim_guard_requests_total{") && l.contains(&label)),
        "{text}"
    );
}

/// Sends `msg` and returns the echo (ticks in between are passed over).
pub async fn echo<S>(ws: &mut S, msg: Message) -> Message
where
    S: futures_util::Sink<Message>
        + futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>>
        + Unpin,
    <S as futures_util::Sink<Message>>::Error: std::fmt::Debug,
{
    ws.send(msg).await.expect("send");
    tokio::time::timeout(WAIT, async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) if t.starts_with("tick ") => continue,
                Some(Ok(m @ (Message::Text(_) | Message::Binary(_)))) => return m,
                Some(Ok(_)) => continue,
                other => panic!("no echo: {other:?}"),
            }
        }
    })
    .await
    .expect("echo in time")
}
