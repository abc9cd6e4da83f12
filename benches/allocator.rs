//! Which global allocator the production binary gets, by measurement: the
//! same production build (scripts/build-shipped.sh) with the system
//! allocator, glibc's malloc (`target/shipped/drainshim`), and with mimalloc
//! (`--allocator mimalloc`: `target/shipped-mimalloc/drainshim`), each run as
//! the guard in front of one backend, beside direct and an Envoy hop
//! (`--concurrency 1`), under the guard bench's unary gRPC load at
//! saturation (h2load `-c 10 -m 10 -t 1`).
//!
//! `ROUNDS` rounds; in each every path runs once, the order rotated from
//! round to round, so the machine's drift falls on every path alike. Per
//! round: each guard's req/s and CPU µs per request (utime + stime from
//! `/proc/PID/stat` over the load), each ÷ direct's and ÷ Envoy's of the same
//! round, and mimalloc ÷ system; then median [min..max] over the rounds, and
//! each proxy's RSS after the load. It asserts nothing about speed.
//! Run with `make bench-allocator`, which builds both binaries first.

mod common;
use common::load::*;
use common::*;

use drainshim_bench::envoy::{self, EnvoyOptions, EnvoyProcess};

/// Rounds, and seconds of load per path and round (after a 1 s warm-up).
const ROUNDS: usize = 6;
const SECONDS: u32 = 5;

/// The candidates: a name, where scripts/build-shipped.sh puts that build,
/// and the flag that builds it.
const CANDIDATES: [(&str, &str, &str); 2] = [
    ("system", "target/shipped/drainshim", ""),
    (
        "mimalloc",
        "target/shipped-mimalloc/drainshim",
        " --allocator mimalloc",
    ),
];

/// Where each path sits in `paths`: direct, Envoy, then the candidates.
const DIRECT: usize = 0;
const ENVOY: usize = 1;
const SYSTEM: usize = 2;
const MIMALLOC: usize = 3;

#[tokio::main]
async fn main() {
    let envoy_binary = envoy::default_binary().expect("Envoy: run `make envoy`");
    let dir = tempfile::tempdir().expect("tempdir");
    let (_backend, backend_addr) = bench_process("server").await;
    let envoy = EnvoyProcess::start(&EnvoyOptions::new(envoy_binary, backend_addr))
        .await
        .expect("envoy");
    let mut paths = vec![
        Path {
            name: "direct",
            addr: backend_addr,
            pid: None,
        },
        Path {
            name: "envoy",
            addr: envoy.inbound,
            pid: Some(envoy.pid().expect("pid")),
        },
    ];
    // The guards' processes live until the end of main.
    let mut guards = Vec::new();
    for (name, relative, flag) in CANDIDATES {
        let binary = drainshim_bench::source_root().join(relative);
        assert!(
            binary.is_file(),
            "{}: missing; build it with scripts/build-shipped.sh{flag} (make bench-allocator does)",
            binary.display()
        );
        println!("{name}: {} ({})", binary.display(), version(&binary));
        let (child, addr) = guard_from(&binary, backend_addr, &[]).await;
        paths.push(Path {
            name,
            addr,
            pid: Some(child.id().expect("pid")),
        });
        guards.push(child);
    }

    eprintln!("allocator bench: unary gRPC at saturation, {SECONDS} s per path, {ROUNDS} rounds");
    for p in &paths {
        // Warm-up: connections, and each process's first allocations.
        h2load(p, dir.path(), "warmup", None, 1).await;
    }
    let mut runs: Vec<Vec<Load>> = paths.iter().map(|_| Vec::new()).collect();
    for round in 0..ROUNDS {
        for j in 0..paths.len() {
            let i = (j + round) % paths.len();
            let tag = format!("round{round}");
            runs[i].push(h2load(&paths[i], dir.path(), &tag, None, SECONDS).await);
        }
    }

    // Per round, f(path a) ÷ f(path b).
    let ratio = |a: usize, b: usize, f: fn(&Load) -> f64| -> Vec<f64> {
        runs[a]
            .iter()
            .zip(&runs[b])
            .map(|(x, y)| f(x) / f(y))
            .collect()
    };
    let rps: fn(&Load) -> f64 = |l| l.rps;
    let cpu: fn(&Load) -> f64 = |l| l.cpu_us.unwrap_or(f64::NAN);

    println!(
        "allocator: unary gRPC Echo at saturation, h2load -c 10 -m 10 -t 1, Envoy --concurrency 1, {SECONDS} s per run, {ROUNDS} rounds; median [min..max] over rounds"
    );
    println!(
        "{:<9} {:>24} {:>18} {:>18} {:>18} {:>18} {:>9}",
        "path", "req/s", "req/s ÷ direct", "req/s ÷ envoy", "CPU µs/req", "CPU ÷ envoy", "RSS MiB"
    );
    for (i, p) in paths.iter().enumerate() {
        let dash = || "-".to_string();
        let per_request = |i: usize| fmt_spread(runs[i].iter().map(cpu).collect(), 1);
        let (vs_direct, vs_envoy, cpu_us, cpu_vs_envoy) = match i {
            DIRECT => (dash(), dash(), dash(), dash()),
            ENVOY => (
                fmt_spread(ratio(i, DIRECT, rps), 2),
                dash(),
                per_request(i),
                dash(),
            ),
            _ => (
                fmt_spread(ratio(i, DIRECT, rps), 2),
                fmt_spread(ratio(i, ENVOY, rps), 2),
                per_request(i),
                fmt_spread(ratio(i, ENVOY, cpu), 2),
            ),
        };
        let rss = p.pid.map_or(dash(), |pid| format!("{:.1}", rss_mib(pid)));
        println!(
            "{:<9} {:>24} {:>18} {:>18} {:>18} {:>18} {:>9}",
            p.name,
            fmt_spread(runs[i].iter().map(rps).collect(), 0),
            vs_direct,
            vs_envoy,
            cpu_us,
            cpu_vs_envoy,
            rss
        );
    }
    println!(
        "  mimalloc ÷ system, same round: req/s {}, CPU per request {}",
        fmt_spread(ratio(MIMALLOC, SYSTEM, rps), 3),
        fmt_spread(ratio(MIMALLOC, SYSTEM, cpu), 3)
    );
    drop(guards);
}
