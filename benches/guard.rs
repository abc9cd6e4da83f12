//! The stream guard's cost, against the baselines measured in the same run:
//!
//! 1. Unary gRPC under h2load (`-c 10 -m 10`): direct to the backend, through
//!    the guard, and through an Envoy hop (concurrency 1). Requests per second
//!    and p99, as ratios. The guard runs twice, with its per-request golden
//!    signals on (the default) and off (`--guard-request-metrics false`):
//!    their cost is the ratio of the two (goal: within 3%).
//! 2. RSS with 10,000 open streams: the guard against Envoy.
//!
//! Every process is real: the tonic bench backend (`drainshim bench server`),
//! the guard (`drainshim sidecar --guard-listen`), Envoy 1.40, and h2load.
//! Run with `cargo bench --bench guard`; `make bench` does.

mod common;
use common::*;

use std::net::SocketAddr;
use std::time::Duration;

use drainshim::bench::envoy::{self, EnvoyOptions, EnvoyProcess};
use drainshim::proto::bench::stream_client::StreamClient;
use drainshim::proto::bench::SubscribeRequest;
use tokio::process::Command;

/// Seconds of load per path (after a 1 s warm-up).
const LOAD_SECONDS: u32 = 5;
/// Streams held open for the memory comparison, and over how many connections.
const STREAMS: usize = 10_000;
const CONNECTIONS: usize = 100;

struct Load {
    rps: f64,
    p99_ms: f64,
}

/// h2load against `addr` with gRPC unary Echo calls.
async fn h2load(addr: SocketAddr, dir: &std::path::Path, name: &str) -> Load {
    // A gRPC frame: uncompressed, length 3, EchoRequest { body: "x", ..Default::default() }.
    let body = dir.join("echo.bin");
    std::fs::write(&body, [0u8, 0, 0, 0, 3, 0x0a, 0x01, b'x']).expect("body");
    let log = dir.join(format!("{name}.log"));
    let out = Command::new("h2load")
        .args(["-c", "10", "-m", "10", "-t", "1", "--warm-up-time", "1"])
        .args(["-D", &LOAD_SECONDS.to_string()])
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .arg("-d")
        .arg(&body)
        .arg("--log-file")
        .arg(&log)
        .arg(format!("http://{addr}/drainshim.bench.v1.Stream/Echo"))
        .output()
        .await
        .expect("h2load: install it with `make tools` (Debian nghttp2-client)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "h2load failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("finished in "))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no req/s in h2load output: {text}"));
    let ok = text
        .lines()
        .find(|l| l.starts_with("status codes:"))
        .unwrap_or("");
    assert!(text.contains(" 0 failed"), "h2load saw failures: {text}");
    // Each log line: start time, status, duration in microseconds.
    let mut lat: Vec<f64> = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split('\t').nth(2)?.parse::<f64>().ok())
        .map(|us| us / 1000.0)
        .collect();
    lat.sort_by(f64::total_cmp);
    let p99 = drainshim::bench::measure::percentile(&lat, 0.99);
    eprintln!("  {name}: {rps:.0} req/s, p99 {p99:.2} ms ({ok})");
    Load { rps, p99_ms: p99 }
}

/// Opens `STREAMS` slow Subscribe streams over `CONNECTIONS` connections to
/// `addr` and returns their tasks once every one has received a message.
async fn hold_streams(addr: SocketAddr) -> Vec<tokio::task::JoinHandle<()>> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1024);
    let mut tasks = Vec::with_capacity(STREAMS);
    for c in 0..CONNECTIONS {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        for s in 0..STREAMS / CONNECTIONS {
            let mut client = StreamClient::new(channel.clone());
            let tx = tx.clone();
            tasks.push(tokio::spawn(async move {
                let req = SubscribeRequest {
                    stream_id: format!("rss-{c}-{s}"),
                    count: 0,
                    interval_ms: 1000,
                    payload_bytes: 16,
                    ..Default::default()
                };
                let Ok(resp) = client.subscribe(req).await else {
                    return;
                };
                let mut stream = resp.into_inner();
                let mut first = Some(tx);
                while let Ok(Some(_)) = stream.message().await {
                    if let Some(t) = first.take() {
                        let _ = t.send(()).await;
                    }
                }
            }));
        }
    }
    drop(tx);
    for i in 0..STREAMS {
        tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("only {i} of {STREAMS} streams started"));
    }
    tasks
}

#[tokio::main]
async fn main() {
    let binary = envoy::default_binary().expect("Envoy: run `make envoy`");
    let dir = tempfile::tempdir().expect("tempdir");
    let (_backend, backend_addr) = bench_process("server").await;
    let (guard_proc, guard_addr) = guard(backend_addr).await;
    let (_quiet_proc, quiet_addr) =
        guard_with(backend_addr, &["--guard-request-metrics", "false"]).await;
    let envoy = EnvoyProcess::start(&EnvoyOptions::new(binary, backend_addr))
        .await
        .expect("envoy");

    eprintln!("guard bench 1/2: unary gRPC, h2load -c 10 -m 10, {LOAD_SECONDS} s per path");
    let direct = h2load(backend_addr, dir.path(), "direct").await;
    let via_guard = h2load(guard_addr, dir.path(), "guard").await;
    let via_quiet = h2load(quiet_addr, dir.path(), "guard-nometrics").await;
    let via_envoy = h2load(envoy.inbound, dir.path(), "envoy").await;

    eprintln!("guard bench 2/2: RSS with {STREAMS} open streams over {CONNECTIONS} connections");
    let guard_pid = guard_proc.id().expect("pid");
    let envoy_pid = envoy.pid().expect("pid");
    let guard_idle = rss_mib(guard_pid);
    let envoy_idle = rss_mib(envoy_pid);
    let held = hold_streams(guard_addr).await;
    let guard_loaded = rss_mib(guard_pid);
    for t in held {
        t.abort();
    }
    let held = hold_streams(envoy.inbound).await;
    let envoy_loaded = rss_mib(envoy_pid);
    for t in held {
        t.abort();
    }

    println!("guard: unary gRPC (h2load -c 10 -m 10, Envoy --concurrency 1), {LOAD_SECONDS} s each, same run");
    println!(
        "{:<10} {:>10} {:>9} {:>10} {:>10} {:>12}",
        "path", "req/s", "p99 ms", "vs direct", "vs envoy", "p99 added ms"
    );
    for (name, l) in [
        ("direct", &direct),
        ("guard", &via_guard),
        ("guard-off", &via_quiet),
        ("envoy", &via_envoy),
    ] {
        println!(
            "{name:<10} {:>10.0} {:>9.2} {:>10.2} {:>10.2} {:>12.2}",
            l.rps,
            l.p99_ms,
            l.rps / direct.rps,
            l.rps / via_envoy.rps,
            l.p99_ms - direct.p99_ms
        );
    }
    println!(
        "guard request metrics on/off: req/s ratio {:.3}, p99 ratio {:.3} (goal: req/s within 3%)",
        via_guard.rps / via_quiet.rps,
        via_guard.p99_ms / via_quiet.p99_ms
    );
    println!("guard: RSS with {STREAMS} open streams ({CONNECTIONS} connections)");
    println!(
        "{:<10} {:>10} {:>12} {:>14}",
        "process", "idle MiB", "loaded MiB", "per stream KiB"
    );
    for (name, idle, loaded) in [
        ("guard", guard_idle, guard_loaded),
        ("envoy", envoy_idle, envoy_loaded),
    ] {
        println!(
            "{name:<10} {idle:>10.1} {loaded:>12.1} {:>14.2}",
            (loaded - idle) * 1024.0 / STREAMS as f64
        );
    }
    println!(
        "guard/envoy loaded RSS ratio: {:.2}",
        guard_loaded / envoy_loaded
    );
}
