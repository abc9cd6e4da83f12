//! WebSocket through the stream guard, against the baselines measured in the
//! same run:
//!
//! 1. Echo: `CLIENTS` WebSockets each send a 64-byte text message and wait
//!    for its echo, for `LOAD_SECONDS`: messages per second and p99 round
//!    trip, direct to the app, through the guard, and through an Envoy hop
//!    (Envoy 1.40, `--concurrency 1`, `upgrade_configs: websocket`).
//! 2. RSS with `OPEN` open (idle) WebSockets: the guard against Envoy.
//!
//! Every process is real: the bench app (`drainshim bench app`), the guard
//! (`drainshim sidecar --guard-listen`, the production binary the image
//! ships: scripts/build-shipped.sh), Envoy, and tokio-tungstenite
//! clients. `OPEN` is 9,000, not 10,000: each proxied WebSocket holds two
//! descriptors in the proxy (client and app side), and this machine's hard
//! limit is 20,000 per process. Run with `cargo bench -p drainshim-bench --bench websocket`;
//! `make bench` does.

mod common;
use common::*;

use std::net::SocketAddr;
use std::time::Duration;

use drainshim_bench::envoy::{self, EnvoyOptions, EnvoyProcess};
use futures_util::{SinkExt, StreamExt};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

/// Seconds of echo load per path (after a short warm-up).
const LOAD_SECONDS: u64 = 5;
/// Concurrent echo clients per path.
const CLIENTS: usize = 10;
/// WebSockets held open for the memory comparison.
const OPEN: usize = 9_000;

struct Load {
    msgs_per_s: f64,
    p99_ms: f64,
}

/// `CLIENTS` echo loops against `addr` for `LOAD_SECONDS`.
async fn echo_load(addr: SocketAddr) -> Load {
    let url = format!("ws://{addr}/tick?id=echo");
    let warmup = Duration::from_millis(500);
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + Duration::from_secs(LOAD_SECONDS);
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let (mut ws, _) = tokio_tungstenite::connect_async(&url)
                .await
                .expect("connect");
            let payload = "x".repeat(64);
            let mut rtts = Vec::new();
            // Bounded by `end`; each round trip by 5 s.
            while Instant::now() < end {
                let t = Instant::now();
                ws.send(Message::text(payload.clone())).await.expect("send");
                let echoed = tokio::time::timeout(Duration::from_secs(5), ws.next())
                    .await
                    .expect("echo in time");
                assert!(matches!(echoed, Some(Ok(Message::Text(_)))), "{echoed:?}");
                if t >= measure_from {
                    rtts.push(t.elapsed().as_secs_f64() * 1000.0);
                }
            }
            let _ = ws.close(None).await;
            rtts
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("client"));
    }
    all.sort_by(f64::total_cmp);
    let p99 = all
        .get(((all.len() as f64 * 0.99).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or(0.0);
    Load {
        msgs_per_s: all.len() as f64 / LOAD_SECONDS as f64,
        p99_ms: p99,
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens `OPEN` idle WebSockets to `addr` (64 at a time) and returns them.
async fn hold(addr: SocketAddr) -> Vec<Ws> {
    let url = format!("ws://{addr}/tick?id=rss");
    let mut held = Vec::with_capacity(OPEN);
    while held.len() < OPEN {
        let batch = (OPEN - held.len()).min(64);
        let opened = futures_util::future::join_all((0..batch).map(|_| {
            let url = url.clone();
            async move {
                tokio::time::timeout(
                    Duration::from_secs(30),
                    tokio_tungstenite::connect_async(url),
                )
                .await
                .expect("connect in time")
                .expect("connect")
                .0
            }
        }))
        .await;
        held.extend(opened);
        if held.len() % 1000 < 64 {
            eprintln!("  {} open", held.len());
        }
    }
    held
}

async fn release(held: Vec<Ws>) {
    futures_util::future::join_all(held.into_iter().map(|mut ws| async move {
        let _ = tokio::time::timeout(Duration::from_secs(5), ws.close(None)).await;
    }))
    .await;
}

#[tokio::main]
async fn main() {
    let binary = envoy::default_binary().expect("Envoy: run `make envoy`");
    announce_measured();
    let (_app, app_addr) = bench_process("app").await;
    let (guard_proc, guard_addr) = guard(app_addr).await;
    let mut eo = EnvoyOptions::new(binary, app_addr);
    eo.upstream_follows_downstream = true;
    let envoy = EnvoyProcess::start(&eo).await.expect("envoy");

    eprintln!("websocket bench 1/2: echo, {CLIENTS} clients, {LOAD_SECONDS} s per path");
    let direct = echo_load(app_addr).await;
    let via_guard = echo_load(guard_addr).await;
    let via_envoy = echo_load(envoy.inbound).await;

    eprintln!("websocket bench 2/2: RSS with {OPEN} open WebSockets");
    let guard_pid = guard_proc.id().expect("pid");
    let envoy_pid = envoy.pid().expect("pid");
    let guard_idle = rss_mib(guard_pid);
    let envoy_idle = rss_mib(envoy_pid);
    let held = hold(guard_addr).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let guard_loaded = rss_mib(guard_pid);
    release(held).await;
    let held = hold(envoy.inbound).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let envoy_loaded = rss_mib(envoy_pid);
    release(held).await;

    println!("websocket: echo of 64-byte messages, {CLIENTS} clients, {LOAD_SECONDS} s each, same run (Envoy --concurrency 1)");
    println!(
        "{:<10} {:>10} {:>9} {:>10} {:>10} {:>12}",
        "path", "msgs/s", "p99 ms", "vs direct", "vs envoy", "p99 added ms"
    );
    for (name, l) in [
        ("direct", &direct),
        ("guard", &via_guard),
        ("envoy", &via_envoy),
    ] {
        println!(
            "{name:<10} {:>10.0} {:>9.2} {:>10.2} {:>10.2} {:>12.2}",
            l.msgs_per_s,
            l.p99_ms,
            l.msgs_per_s / direct.msgs_per_s,
            l.msgs_per_s / via_envoy.msgs_per_s,
            l.p99_ms - direct.p99_ms
        );
    }
    println!("websocket: RSS with {OPEN} open WebSockets");
    println!(
        "{:<10} {:>10} {:>12} {:>17}",
        "process", "idle MiB", "loaded MiB", "per WebSocket KiB"
    );
    for (name, idle, loaded) in [
        ("guard", guard_idle, guard_loaded),
        ("envoy", envoy_idle, envoy_loaded),
    ] {
        println!(
            "{name:<10} {idle:>10.1} {loaded:>12.1} {:>17.2}",
            (loaded - idle) * 1024.0 / OPEN as f64
        );
    }
    println!(
        "guard/envoy loaded RSS ratio: {:.2}",
        guard_loaded / envoy_loaded
    );
}
