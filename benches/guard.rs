//! The stream guard's cost, against the baselines measured in the same run:
//!
//! 1. Unary gRPC under h2load (`-c 10 -m 10`), at a fixed offered load
//!    (`--rps 500` per client: 5,000 req/s) and at saturation, three
//!    repetitions each: direct to the backend, through the guard, through
//!    an Envoy hop (concurrency 1), and through a byte-copy TCP relay on one
//!    thread (`drainshim bench relay`: the floor under any hop); and, when
//!    `DRAINSHIM_BENCH_BEFORE` names another build of the production binary
//!    (say, the last release), through that build's guard as "before", so
//!    a change to the guard is judged against its predecessor in the same
//!    run. Requests per second, p99, the p99
//!    a hop adds over direct (same repetition), and the proxy's CPU time per
//!    request (utime + stime from `/proc/PID/stat` over the load). Spreads
//!    are min / median / max over the repetitions, never the best one.
//!    The guard's per-request golden signals: a second guard runs with them
//!    off (`--guard-request-metrics false`), and the two take turns at
//!    saturation in `PAIRS` back-to-back pairs; each pair's on/off ratio
//!    cancels the machine's drift between pairs (goal: within 3%).
//! 2. Messages per second through a server-streaming call (10 streams on
//!    one connection, the backend sending as fast as flow control lets it),
//!    and the proxy's CPU time per message.
//! 3. RSS with 10,000 open streams: the guard against Envoy (and "before").
//!
//! Every process is real: the tonic bench backend (`drainshim bench server`),
//! the guard (`drainshim sidecar --guard-listen`, run as the production
//! binary the image ships, `target/shipped/drainshim`: see
//! scripts/build-shipped.sh), Envoy 1.40, and h2load.
//! It asserts nothing about speed: it prints ratios against the baselines.
//! Run with `cargo bench -p drainshim-bench --bench guard`; `make bench` does.

mod common;
use common::load::*;
use common::*;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use drainshim_bench::envoy::{self, EnvoyOptions, EnvoyProcess};
use drainshim_bench::proto::bench::stream_client::StreamClient;
use drainshim_bench::proto::bench::SubscribeRequest;

/// Seconds of measured load per path and repetition (after a 1 s warm-up run).
const LOAD_SECONDS: u32 = 5;
/// Repetitions of each load; the spread over them is reported.
const REPS: usize = 3;
/// The request metrics' cost: back-to-back on/off pairs at saturation, and
/// seconds per load (after a 1 s warm-up of each guard).
const PAIRS: usize = 10;
const PAIR_SECONDS: u32 = 2;
/// The fixed offered load: requests per second per h2load client (10 clients).
const RPS_PER_CLIENT: u32 = 500;
/// Streams held open for the memory comparison, and over how many connections.
const STREAMS: usize = 10_000;
const CONNECTIONS: usize = 100;
/// The streaming comparison: concurrent server streams on one connection,
/// payload per message, seconds per path and repetition.
const FLOW_STREAMS: usize = 10;
const FLOW_PAYLOAD: u32 = 64;
const FLOW_SECONDS: u64 = 3;

/// Streams `FLOW_STREAMS` endless Subscribe calls on one connection to `addr`
/// for `FLOW_SECONDS`; returns messages per second and the proxy's CPU µs
/// per message.
async fn flow(addr: SocketAddr, pid: Option<u32>) -> (f64, Option<f64>) {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let received = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for s in 0..FLOW_STREAMS {
        let mut client = StreamClient::new(channel.clone());
        let received = received.clone();
        tasks.push(tokio::spawn(async move {
            let req = SubscribeRequest {
                stream_id: format!("flow-{s}"),
                count: 0,
                interval_ms: 0,
                payload_bytes: FLOW_PAYLOAD,
                burst: 64,
            };
            let mut stream = client.subscribe(req).await.expect("subscribe").into_inner();
            while let Ok(Some(_)) = stream.message().await {
                received.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // Half a second to get going, then the measured window.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (n0, c0) = (received.load(Ordering::Relaxed), pid.map(cpu_seconds));
    let start = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(FLOW_SECONDS)).await;
    let (n1, c1) = (received.load(Ordering::Relaxed), pid.map(cpu_seconds));
    let secs = start.elapsed().as_secs_f64();
    for t in tasks {
        t.abort();
    }
    let msgs = (n1 - n0) as f64;
    let cpu = c0.zip(c1).map(|(a, b)| (b - a) * 1e6 / msgs.max(1.0));
    (msgs / secs, cpu)
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

/// RSS of the proxy `pid` in MiB before and while `STREAMS` streams are
/// held open through it at `addr`; the streams are dropped afterwards.
async fn rss_holding_streams(addr: SocketAddr, pid: u32) -> (f64, f64) {
    let idle = rss_mib(pid);
    let held = hold_streams(addr).await;
    let loaded = rss_mib(pid);
    for t in held {
        t.abort();
    }
    (idle, loaded)
}

/// The runs of one load, per path, in repetition order.
struct Runs {
    /// `[path][rep]`, paths in the order of `paths`.
    loads: Vec<Vec<Load>>,
}

impl Runs {
    fn col(&self, path: usize, f: impl Fn(&Load) -> f64) -> Vec<f64> {
        self.loads[path].iter().map(f).collect()
    }

    /// Per repetition, `f(path a) / f(path b)`.
    fn ratio(&self, a: usize, b: usize, f: impl Fn(&Load) -> f64) -> Vec<f64> {
        self.loads[a]
            .iter()
            .zip(&self.loads[b])
            .map(|(x, y)| f(x) / f(y))
            .collect()
    }

    /// Per repetition, p99 of `path` minus p99 of direct (path 0).
    fn added(&self, path: usize) -> Vec<f64> {
        self.loads[path]
            .iter()
            .zip(&self.loads[0])
            .map(|(x, d)| x.p99_ms - d.p99_ms)
            .collect()
    }
}

const DIRECT: usize = 0;
const GUARD: usize = 1;
const ENVOY: usize = 2;
const RELAY: usize = 3;
/// Measured only with `DRAINSHIM_BENCH_BEFORE`.
const BEFORE: usize = 4;

fn print_load(title: &str, paths: &[Path], runs: &Runs) {
    println!("{title}; {REPS} repetitions, median [min..max]");
    println!(
        "{:<10} {:>26} {:>24} {:>24} {:>24}",
        "path", "req/s", "p99 ms", "p99 added ms", "proxy CPU µs/req"
    );
    for (i, p) in paths.iter().enumerate() {
        let cpu = if p.pid.is_some() {
            fmt_spread(runs.col(i, |l| l.cpu_us.unwrap_or(0.0)), 1)
        } else {
            "-".into()
        };
        let added = if i == DIRECT {
            "-".into()
        } else {
            fmt_spread(runs.added(i), 2)
        };
        println!(
            "{:<10} {:>26} {:>24} {:>24} {:>24}",
            p.name,
            fmt_spread(runs.col(i, |l| l.rps), 0),
            fmt_spread(runs.col(i, |l| l.p99_ms), 2),
            added,
            cpu
        );
    }
    let cpu = |l: &Load| l.cpu_us.unwrap_or(f64::NAN);
    println!(
        "  guard/envoy CPU per request: {} (goal <= 0.5)",
        fmt_spread(runs.ratio(GUARD, ENVOY, cpu), 2)
    );
    let added_ratio: Vec<f64> = runs
        .added(GUARD)
        .iter()
        .zip(runs.added(ENVOY))
        .map(|(g, e)| g / e)
        .collect();
    println!(
        "  guard/envoy p99 added: {} (goal <= 0.5)",
        fmt_spread(added_ratio, 2)
    );
    println!(
        "  req/s guard/envoy: {}; guard/direct: {}",
        fmt_spread(runs.ratio(GUARD, ENVOY, |l| l.rps), 2),
        fmt_spread(runs.ratio(GUARD, DIRECT, |l| l.rps), 2)
    );
    println!(
        "  the floor, a byte-copy relay: req/s relay/direct {}, guard/relay {}; CPU per request guard/relay {}",
        fmt_spread(runs.ratio(RELAY, DIRECT, |l| l.rps), 2),
        fmt_spread(runs.ratio(GUARD, RELAY, |l| l.rps), 2),
        fmt_spread(runs.ratio(GUARD, RELAY, cpu), 2)
    );
    if paths.len() > BEFORE {
        println!(
            "  against the build before: req/s guard/before {}; CPU per request guard/before {}; p99 added guard-before {} ms",
            fmt_spread(runs.ratio(GUARD, BEFORE, |l| l.rps), 2),
            fmt_spread(runs.ratio(GUARD, BEFORE, cpu), 2),
            fmt_spread(
                runs.added(GUARD)
                    .iter()
                    .zip(runs.added(BEFORE))
                    .map(|(g, b)| g - b)
                    .collect(),
                2
            )
        );
    }
}

/// The guard with its request metrics on (`on`) and off (`off`), in
/// `PAIRS` back-to-back saturated loads, the order swapped every pair:
/// `(on, off)` per pair.
async fn metrics_pairs(on: &Path, off: &Path, dir: &std::path::Path) -> Vec<(Load, Load)> {
    let mut pairs = Vec::with_capacity(PAIRS);
    for k in 0..PAIRS {
        let tag = format!("pair{k}");
        let (a, b) = if k % 2 == 0 { (off, on) } else { (on, off) };
        let first = h2load(a, dir, &tag, None, PAIR_SECONDS).await;
        let second = h2load(b, dir, &tag, None, PAIR_SECONDS).await;
        pairs.push(if k % 2 == 0 {
            (second, first)
        } else {
            (first, second)
        });
    }
    pairs
}

/// The request metrics' cost: per pair, on ÷ off.
fn print_metrics_cost(pairs: &[(Load, Load)]) {
    let ratio = |f: fn(&Load) -> f64| -> Vec<f64> {
        pairs.iter().map(|(on, off)| f(on) / f(off)).collect()
    };
    println!(
        "guard: request metrics on/off, {PAIRS} back-to-back pairs at saturation, {PAIR_SECONDS} s each; median [min..max]"
    );
    println!(
        "  req/s {} (goal >= 0.97), CPU per request {}, p99 {}",
        fmt_spread(ratio(|l| l.rps), 3),
        fmt_spread(ratio(|l| l.cpu_us.unwrap_or(f64::NAN)), 3),
        fmt_spread(ratio(|l| l.p99_ms), 3)
    );
    // Every pair together (each side ran the same total time): requests
    // served, and CPU over those requests.
    let total = |side: fn(&(Load, Load)) -> &Load| -> (f64, f64) {
        let requests: f64 = pairs.iter().map(|p| side(p).rps).sum();
        let cpu: f64 = pairs
            .iter()
            .map(|p| side(p).rps * side(p).cpu_us.unwrap_or(f64::NAN))
            .sum();
        (requests, cpu / requests)
    };
    let ((on_req, on_cpu), (off_req, off_cpu)) = (total(|p| &p.0), total(|p| &p.1));
    println!(
        "  all pairs together: requests {:.3}, CPU per request {:.3}",
        on_req / off_req,
        on_cpu / off_cpu
    );
}

#[tokio::main]
async fn main() {
    let binary = envoy::default_binary().expect("Envoy: run `make envoy`");
    announce_measured();
    let dir = tempfile::tempdir().expect("tempdir");
    let (_backend, backend_addr) = bench_process("server").await;
    let (guard_proc, guard_addr) = guard_with(backend_addr, &[]).await;
    let (quiet_proc, quiet_addr) =
        guard_with(backend_addr, &["--guard-request-metrics", "false"]).await;
    let quiet = Path {
        name: "guard-off",
        addr: quiet_addr,
        pid: quiet_proc.id(),
    };
    let envoy = EnvoyProcess::start(&EnvoyOptions::new(binary, backend_addr))
        .await
        .expect("envoy");
    let (relay_proc, relay_addr) =
        bench_process_with("relay", &["--upstream", &backend_addr.to_string()]).await;
    // Another build's guard, to compare a change with ("before").
    let before_bin = std::env::var_os("DRAINSHIM_BENCH_BEFORE").map(std::path::PathBuf::from);
    let mut before = None;
    if let Some(bin) = &before_bin {
        let (proc_, addr) = guard_from(bin, backend_addr, &[]).await;
        eprintln!("guard bench: \"before\" is {}", bin.display());
        before = Some((proc_, addr));
    }
    let guard_pid = guard_proc.id().expect("pid");
    let envoy_pid = envoy.pid().expect("pid");
    let mut paths = vec![
        Path {
            name: "direct",
            addr: backend_addr,
            pid: None,
        },
        Path {
            name: "guard",
            addr: guard_addr,
            pid: Some(guard_pid),
        },
        Path {
            name: "envoy",
            addr: envoy.inbound,
            pid: Some(envoy_pid),
        },
        Path {
            name: "relay",
            addr: relay_addr,
            pid: Some(relay_proc.id().expect("pid")),
        },
    ];
    if let Some((proc_, addr)) = &before {
        paths.push(Path {
            name: "before",
            addr: *addr,
            pid: proc_.id(),
        });
    }

    let fixed_rps = RPS_PER_CLIENT * 10;
    eprintln!(
        "guard bench 1/4: unary gRPC, h2load -c 10 -m 10, fixed {fixed_rps} req/s and saturated, {LOAD_SECONDS} s per path, {REPS} repetitions"
    );
    for p in &paths {
        // Warm-up: connections, the backend's and the proxies' first allocations.
        h2load(p, dir.path(), "warmup", None, 1).await;
    }
    let mut fixed = Runs {
        loads: paths.iter().map(|_| Vec::new()).collect(),
    };
    let mut saturated = Runs {
        loads: paths.iter().map(|_| Vec::new()).collect(),
    };
    for rep in 0..REPS {
        // Paths interleaved within each repetition, so a noisy moment on the
        // shared machine hits one repetition of every path, not one path;
        // and their order rotated between repetitions, so no path always
        // runs right after the same neighbour.
        for j in 0..paths.len() {
            let i = (j + rep) % paths.len();
            let p = &paths[i];
            let tag = format!("fixed{rep}");
            fixed.loads[i]
                .push(h2load(p, dir.path(), &tag, Some(RPS_PER_CLIENT), LOAD_SECONDS).await);
            let tag = format!("sat{rep}");
            saturated.loads[i].push(h2load(p, dir.path(), &tag, None, LOAD_SECONDS).await);
        }
    }

    eprintln!(
        "guard bench 2/4: request metrics on/off, {PAIRS} back-to-back pairs at saturation, {PAIR_SECONDS} s each"
    );
    h2load(&quiet, dir.path(), "warmup", None, 1).await;
    let pairs = metrics_pairs(&paths[GUARD], &quiet, dir.path()).await;

    eprintln!(
        "guard bench 3/4: server streaming, {FLOW_STREAMS} streams on one connection, {FLOW_PAYLOAD} B messages, {FLOW_SECONDS} s per path, {REPS} repetitions"
    );
    let flow_paths: Vec<usize> = [DIRECT, GUARD, ENVOY, BEFORE]
        .into_iter()
        .filter(|&i| i < paths.len())
        .collect();
    let mut flows: Vec<Vec<(f64, Option<f64>)>> = flow_paths.iter().map(|_| Vec::new()).collect();
    for _ in 0..REPS {
        for (k, &i) in flow_paths.iter().enumerate() {
            let r = flow(paths[i].addr, paths[i].pid).await;
            eprintln!("  {}: {:.0} messages/s", paths[i].name, r.0);
            flows[k].push(r);
        }
    }

    eprintln!("guard bench 4/4: RSS with {STREAMS} open streams over {CONNECTIONS} connections");
    let (guard_idle, guard_loaded) = rss_holding_streams(guard_addr, guard_pid).await;
    let (envoy_idle, envoy_loaded) = rss_holding_streams(envoy.inbound, envoy_pid).await;
    let mut rss = vec![
        ("guard", guard_idle, guard_loaded),
        ("envoy", envoy_idle, envoy_loaded),
    ];
    if let Some(p) = paths.get(BEFORE) {
        if let Some(pid) = p.pid {
            let (idle, loaded) = rss_holding_streams(p.addr, pid).await;
            rss.push(("before", idle, loaded));
        }
    }

    println!("guard: unary gRPC Echo, h2load -c 10 -m 10 -t 1, Envoy --concurrency 1, {LOAD_SECONDS} s per run, same run");
    print_load(
        &format!("fixed load {fixed_rps} req/s (--rps {RPS_PER_CLIENT})"),
        &paths,
        &fixed,
    );
    print_load("saturated", &paths, &saturated);
    print_metrics_cost(&pairs);
    println!(
        "guard: server streaming, {FLOW_STREAMS} streams on one connection, {FLOW_PAYLOAD} B messages; median [min..max]"
    );
    println!(
        "{:<10} {:>30} {:>26}",
        "path", "messages/s", "proxy CPU µs/message"
    );
    for (k, &i) in flow_paths.iter().enumerate() {
        let cpu = if paths[i].pid.is_some() {
            fmt_spread(flows[k].iter().map(|r| r.1.unwrap_or(0.0)).collect(), 2)
        } else {
            "-".into()
        };
        println!(
            "{:<10} {:>30} {:>26}",
            paths[i].name,
            fmt_spread(flows[k].iter().map(|r| r.0).collect(), 0),
            cpu
        );
    }
    let per_rep = |a: usize, b: usize| -> Vec<f64> {
        flows[a]
            .iter()
            .zip(&flows[b])
            .map(|(x, y)| x.0 / y.0)
            .collect()
    };
    println!(
        "  messages/s guard/envoy: {}; guard/direct: {}",
        fmt_spread(per_rep(1, 2), 2),
        fmt_spread(per_rep(1, 0), 2)
    );
    if flow_paths.len() > 3 {
        println!(
            "  messages/s guard/before: {}",
            fmt_spread(per_rep(1, 3), 2)
        );
    }
    println!("guard: RSS with {STREAMS} open streams ({CONNECTIONS} connections)");
    println!(
        "{:<10} {:>10} {:>12} {:>14}",
        "process", "idle MiB", "loaded MiB", "per stream KiB"
    );
    for (name, idle, loaded) in rss {
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
