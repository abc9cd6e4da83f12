//! The shim's idle footprint next to the Envoy it serves: RSS and CPU over
//! a quiet period, then with a Prometheus-like scrape every second. The shim
//! is the production binary the image ships (`target/shipped/drainshim`,
//! scripts/build-shipped.sh); the backend runs in this process.
//! Run with `cargo bench -p drainshim-bench --bench footprint` (release build); `make bench` does.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use drainshim_bench::envoy::{self, EnvoyOptions, EnvoyProcess};
use drainshim_bench::server::{serve, BenchService};
use tokio::io::{AsyncBufReadExt, BufReader};

/// How long each phase is sampled.
const PHASE: Duration = Duration::from_secs(10);

/// (RSS in KiB, CPU ticks user+system) of a process.
fn sample(pid: u32) -> Result<(u64, u64), String> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or("no VmRSS")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| e.to_string())?;
    // Fields after the parenthesised command name; utime and stime are 14th and 15th.
    let after = stat.rsplit_once(") ").ok_or("bad stat")?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = f[11].parse::<u64>().map_err(|e| e.to_string())?
        + f[12].parse::<u64>().map_err(|e| e.to_string())?;
    Ok((rss, ticks))
}

fn ticks_per_sec() -> f64 {
    // CLK_TCK is 100 on Linux for every architecture this runs on.
    100.0
}

struct Phase {
    rss_kib: u64,
    cpu_pct: f64,
}

async fn measure(pid: u32, during: impl std::future::Future<Output = ()>) -> Phase {
    let (_, t0) = sample(pid).expect("sample");
    let start = Instant::now();
    during.await;
    let (rss, t1) = sample(pid).expect("sample");
    let secs = start.elapsed().as_secs_f64();
    Phase {
        rss_kib: rss,
        cpu_pct: (t1 - t0) as f64 / ticks_per_sec() / secs * 100.0,
    }
}

#[tokio::main]
async fn main() {
    let binary = envoy::default_binary().expect("Envoy: run `make envoy`");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let backend = listener.local_addr().expect("addr");
    tokio::spawn(serve(
        listener,
        BenchService::default(),
        std::future::pending(),
    ));
    let envoy = EnvoyProcess::start(&EnvoyOptions::new(binary, backend))
        .await
        .expect("envoy");
    let measured = common::announce_measured();
    let mut shim = tokio::process::Command::new(measured)
        .args([
            "sidecar",
            "--listen",
            "127.0.0.1:0",
            "--envoy-admin",
            &envoy.admin_url(),
        ])
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("shim");
    let mut lines = BufReader::new(shim.stderr.take().expect("stderr")).lines();
    let addr: std::net::SocketAddr = loop {
        let line = lines
            .next_line()
            .await
            .expect("read")
            .expect("shim exited early");
        if let Some(rest) = line.split("listen=").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .expect("addr")
                .parse()
                .expect("addr");
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let shim_pid = shim.id().expect("pid");
    let envoy_pid = envoy.pid().expect("pid");

    let quiet = || tokio::time::sleep(PHASE);
    let scraping = || async {
        let end = Instant::now() + PHASE;
        while Instant::now() < end {
            let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let _ =
                drainshim::http::request(s, &addr.to_string(), http::Method::GET, "/metrics").await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    let (shim_idle, envoy_idle) =
        tokio::join!(measure(shim_pid, quiet()), measure(envoy_pid, quiet()));
    let (shim_scr, envoy_scr) =
        tokio::join!(measure(shim_pid, scraping()), measure(envoy_pid, quiet()));

    println!(
        "footprint: drainshim sidecar beside Envoy {} ({}s per phase)",
        envoy::ENVOY_VERSIONS[0],
        PHASE.as_secs()
    );
    println!(
        "{:<28} {:>10} {:>10} {:>8}",
        "phase", "shim", "envoy", "ratio"
    );
    let row = |name: &str, a: f64, b: f64, unit: &str| {
        println!(
            "{name:<28} {:>8.1}{unit} {:>8.1}{unit} {:>8.3}",
            a,
            b,
            if b > 0.0 { a / b } else { f64::NAN }
        );
    };
    row(
        "RSS idle (MiB)",
        shim_idle.rss_kib as f64 / 1024.0,
        envoy_idle.rss_kib as f64 / 1024.0,
        "",
    );
    row(
        "CPU idle (% of a core)",
        shim_idle.cpu_pct,
        envoy_idle.cpu_pct,
        "",
    );
    row(
        "RSS, 1 scrape/s (MiB)",
        shim_scr.rss_kib as f64 / 1024.0,
        envoy_scr.rss_kib as f64 / 1024.0,
        "",
    );
    row(
        "CPU, 1 scrape/s (% core)",
        shim_scr.cpu_pct,
        envoy_scr.cpu_pct,
        "",
    );
    let _ = shim.kill().await;
}
