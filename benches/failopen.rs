//! Fail open, measured: what callers see when the shim dies.
//!
//! One real `drainshim sidecar` (the guard) in front of the real bench
//! backend, and three real Envoy 1.40s side by side in front of it, all under
//! the same steady unary gRPC load. The shim is killed with SIGKILL, stays
//! down for `DOWN`, and is started again on the same port. The Envoys:
//!
//! - `shipped`: `deploy/components/envoy/envoy.yaml` itself, ports moved to
//!   ephemeral ones: guard priority 0 with a TCP health check and outlier
//!   ejection, the app priority 1, and the retry to the other priority;
//! - `no-retry`: the same cluster without the route's retry policy (health
//!   check and outlier ejection alone), to show what the retry is for;
//! - `no-fallback`: the guard as the only endpoint (the bootstrap before
//!   fail open): the baseline.
//!
//! For each: the share of calls that failed, the time from the kill until
//! every call succeeds again, and the time from the restart until Envoy sends
//! traffic through the guard again (Envoy's own per-host `rq_total`). Figures
//! and ratios against the baseline; nothing is asserted about them (the
//! property is asserted in tests/failopen.rs). `cargo bench -p drainshim-bench --bench failopen`;
//! `make bench` runs it.

mod common;
use common::*;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use drainshim_bench::envoy::{self, shipped_bootstrap, EnvoyOptions, EnvoyProcess};
use drainshim_bench::failopen::{host_requests, wait_host_traffic, Load, Summary};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// Load before the kill.
const WARM: Duration = Duration::from_secs(3);
/// How long the shim stays dead (a container restart takes about this long
/// before the kubelet's back-off grows).
const DOWN: Duration = Duration::from_secs(3);
/// Load after the restart.
const AFTER: Duration = Duration::from_secs(4);
/// Concurrent callers per Envoy, each on its own connection.
const WORKERS: usize = 4;
/// Pause between one caller's calls.
const PAUSE: Duration = Duration::from_millis(2);

/// The real shim with its guard on `guard`; returns once it logged that it is ready.
async fn shim(admin_port: u16, guard: SocketAddr, app: SocketAddr) -> Child {
    let mut child = Command::new(drainshim())
        .args(["sidecar", "--listen", "127.0.0.1:0", "--linger", "0s"])
        .args(["--envoy-admin", &format!("http://127.0.0.1:{admin_port}")])
        .args(["--guard-listen", &guard.to_string()])
        .args(["--guard-upstream", &app.to_string()])
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("shim");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("sidecar ready") {
                return;
            }
        }
        panic!("the shim exited before it was ready");
    })
    .await
    .expect("the shim is ready in time");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

struct Variant {
    name: &'static str,
    envoy: EnvoyProcess,
    load: Option<Load>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let binary = envoy::default_binary().expect("envoy: run `make envoy`");
    let (_backend, app) = bench_process("server").await;
    let guard = free_addr();
    let admin_port = free_addr().port();
    let mut first = shim(admin_port, guard, app).await;

    let mut shipped = EnvoyOptions::new(binary.clone(), guard);
    shipped.admin_port = admin_port;
    shipped.custom_bootstrap =
        Some(shipped_bootstrap(guard, app, admin_port).expect("the shipped bootstrap"));
    let mut no_retry = EnvoyOptions::new(binary.clone(), guard);
    no_retry.fallback = Some(app);
    no_retry.custom_bootstrap = Some(no_retry.bootstrap().replace(envoy::FAILOPEN_RETRY, ""));
    let baseline = EnvoyOptions::new(binary, guard);
    let mut variants = Vec::new();
    for (name, opts) in [
        ("shipped", shipped),
        ("no-retry", no_retry),
        ("no-fallback", baseline),
    ] {
        let envoy = EnvoyProcess::start(&opts)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        variants.push(Variant {
            name,
            envoy,
            load: None,
        });
    }
    for v in &mut variants {
        v.load = Some(Load::start(v.envoy.inbound, WORKERS, PAUSE, usize::MAX));
    }
    eprintln!(
        "fail-open: {} Envoys x {WORKERS} callers of unary Echo; SIGKILL the shim after {WARM:?}, restart after {DOWN:?}",
        variants.len()
    );
    tokio::time::sleep(WARM).await;

    first.start_kill().expect("SIGKILL the shim");
    let killed = Instant::now();
    tokio::time::timeout(Duration::from_secs(30), first.wait())
        .await
        .expect("the shim exits after SIGKILL")
        .expect("reap");
    tokio::time::sleep(DOWN).await;
    let mut before = Vec::new();
    for v in &variants {
        before.push(host_requests(v.envoy.admin, guard).await.unwrap_or(0));
    }
    let _second = shim(admin_port, guard, app).await;
    let restarted = Instant::now();
    // Watched side by side, so one Envoy's wait does not delay another's.
    let back: Vec<Option<Duration>> =
        futures_util::future::join_all(variants.iter().zip(&before).map(|(v, b)| async move {
            wait_host_traffic(v.envoy.admin, guard, *b, AFTER + Duration::from_secs(10))
                .await
                .map(|t| t - restarted)
        }))
        .await;
    tokio::time::sleep_until(restarted + AFTER).await;

    let mut rows = Vec::new();
    for v in &mut variants {
        let calls = v.load.take().expect("load").finish().await;
        rows.push((v.name, Summary::of(&calls, killed)));
    }
    let base = rows.last().map(|r| r.1).expect("baseline row");
    println!(
        "\n{:<12} {:>7} {:>7} {:>9} {:>12} {:>14} {:>16}",
        "bootstrap",
        "calls",
        "failed",
        "failed %",
        "vs baseline",
        "all ok after",
        "via guard after"
    );
    for ((name, s), b) in rows.iter().zip(&back) {
        let ratio = if base.failed_share() > 0.0 {
            format!("{:.4}x", s.failed_share() / base.failed_share())
        } else {
            "-".into()
        };
        println!(
            "{:<12} {:>7} {:>7} {:>8.3}% {:>12} {:>13.2}s {:>16}",
            name,
            s.calls,
            s.failed,
            100.0 * s.failed_share(),
            ratio,
            s.recovered_after.as_secs_f64(),
            b.map_or("never".to_string(), |d| format!("{:.2}s", d.as_secs_f64())),
        );
    }
    println!(
        "(kill at t=0, shim down {:.1}s; 'all ok after' is from the kill, 'via guard after' from the restart)",
        DOWN.as_secs_f64()
    );
}
