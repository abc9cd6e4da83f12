//! `verify` gating on the stream guard's golden signals, with everything
//! real: tonic backends (one failing every 4th call with UNAVAILABLE), the
//! sidecar's guard in front of each, Envoy in front of the guard, and a
//! Prometheus scraping the shims every second.
//!
//! Three namespaces, one pod each, each with a steady unary load, go through
//! a wave at the same moment:
//! - `retrying`: Envoy 1.39.3 is replaced by 1.40.0 whose route retries on
//!   `unavailable`: the guard sees more requests per caller request, and
//!   `verify` must flag it (by the guard's count, not Envoy's);
//! - `steady`: 1.38.3 is replaced by 1.39.3 without retries: it passes;
//! - `slow`: Envoy stays, the application gets 40 ms slower: the p99 gate
//!   flags it.

use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use drainshim_bench::envoy::EnvoyProcess;
use drainshim_bench::proto::bench::stream_client::StreamClient;
use drainshim_bench::proto::bench::EchoRequest;
use support::prom::{self, check, passed_but_resets, wait_for_scrape_past};
use support::*;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The route retry of the "new" Envoy: a changed retry default in effect.
const RETRY_ON_UNAVAILABLE: &str = "retry_on: unavailable, num_retries: 2, \
    retry_back_off: { base_interval: 0.001s, max_interval: 0.005s }";

/// The gate's window in seconds; the test needs two of them plus the wave.
const WINDOW_SECS: u64 = 10;

struct Pod {
    ns: &'static str,
    /// The backend, the sidecar and its guard.
    sidecar: prom::Sidecar,
    envoy: Option<EnvoyProcess>,
    /// Where the load goes: Envoy's inbound address, changed on a restart.
    target: watch::Sender<SocketAddr>,
}

async fn start_envoy(pod: &Pod, version: &str, retry: Option<&str>) -> EnvoyProcess {
    prom::envoy(&pod.sidecar, pod.ns, version, retry).await
}

async fn pod(ns: &'static str, version: &str) -> Pod {
    let backend = backend().await;
    backend.faults.unavailable_every.store(4, Ordering::Relaxed);
    let sidecar = prom::sidecar(backend, |_| {}).await;
    let mut p = Pod {
        ns,
        target: watch::channel(sidecar.guard).0,
        sidecar,
        envoy: None,
    };
    let envoy = start_envoy(&p, version, None).await;
    p.target.send_replace(envoy.inbound);
    p.envoy = Some(envoy);
    p
}

/// Unary Echo calls through Envoy, one after another with a short pause,
/// following the target across Envoy restarts, until `stop`.
fn load(mut target: watch::Receiver<SocketAddr>, stop: CancellationToken) {
    tokio::spawn(async move {
        while !stop.is_cancelled() {
            let addr = *target.borrow_and_update();
            let Ok(mut client) = StreamClient::connect(format!("http://{addr}")).await else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            while !stop.is_cancelled() && !target.has_changed().unwrap_or(true) {
                let _ = client
                    .echo(EchoRequest {
                        body: "x".into(),
                        ..Default::default()
                    })
                    .await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
}

async fn verify(
    url: &str,
    ns: &str,
    version: &str,
    at: SystemTime,
    extra: &[&str],
) -> (i32, Vec<serde_json::Value>) {
    prom::verify(url, (ns, version), (WINDOW_SECS, at), extra).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_flags_retries_and_latency_by_the_guards_count() {
    let mut retrying = pod("retrying", "1.39.3").await;
    let mut steady = pod("steady", "1.38.3").await;
    let slow = pod("slow", "1.40.0").await;
    let stop = CancellationToken::new();
    for p in [&retrying, &steady, &slow] {
        load(p.target.subscribe(), stop.clone());
    }
    // Two windows of history before the wave: the "before" window must be
    // whole (the guard's requests and Envoy's inbound count in each pod).
    let (prom, client) = prom::with_history(
        &[
            retrying.sidecar.shim,
            steady.sidecar.shim,
            slow.sidecar.shim,
        ],
        "two windows of guard and Envoy history",
        Duration::from_secs(60),
        ("count(drainshim_guard_requests_total{code=\"OK\"})", 3.0),
    )
    .await;
    let url = prom.url();

    // The wave. Each namespace's windows are pinned to the moment its
    // change took effect (`verify --at`), so how late `verify` runs on a
    // loaded machine does not move the boundary between them.
    drop(retrying.envoy.take());
    let envoy = start_envoy(&retrying, "1.40.0", Some(RETRY_ON_UNAVAILABLE)).await;
    retrying.target.send_replace(envoy.inbound);
    retrying.envoy = Some(envoy);
    let retrying_at = SystemTime::now();
    drop(steady.envoy.take());
    let envoy = start_envoy(&steady, "1.39.3", None).await;
    steady.target.send_replace(envoy.inbound);
    steady.envoy = Some(envoy);
    let steady_at = SystemTime::now();
    let slow_at = SystemTime::now();
    slow.sidecar
        .backend
        .faults
        .delay_ms
        .store(40, Ordering::Relaxed);
    let ends = |from: SystemTime| from + Duration::from_secs(WINDOW_SECS);
    let last = ends(retrying_at).max(ends(steady_at)).max(ends(slow_at));

    // Prometheus has scraped every shim past the last window's end.
    wait_for_scrape_past(&client, "every shim scraped past the windows' end", last).await;

    let (code, checks) = verify(&url, "retrying", "1.40.0", ends(retrying_at), &[]).await;
    let retries = check(&checks, "guard requests per caller request");
    assert_eq!(retries["ok"], false, "{checks:#?}");
    let moved = &retries["services"][0];
    assert_eq!(moved["service"], "drainshim.bench.v1.Stream", "{retries}");
    let (before, now) = (
        moved["before"].as_f64().expect("before"),
        moved["now"].as_f64().expect("now"),
    );
    // 1 in 4 calls fails: with two retries a call takes 1 + 1/4 + 1/16 tries.
    // The window before ends when the new Envoy took the load.
    assert!((0.9..1.2).contains(&before), "{retries}");
    assert!((1.2..1.45).contains(&now), "{retries}");
    assert_eq!(code, 1, "{checks:#?}");

    // The same wave without the retry default passes. The p99 is given room:
    // a millisecond-scale p99 on a loaded 2-core machine is noise here.
    let (code, checks) = verify(
        &url,
        "steady",
        "1.39.3",
        ends(steady_at),
        &["--max-p99-increase", "3"],
    )
    .await;
    let retries = check(&checks, "guard requests per caller request");
    assert_eq!(retries["ok"], true, "{checks:#?}");
    let success = check(&checks, "guard success rate");
    assert_eq!(
        success["ok"], true,
        "exactly 1 in 4 fails in both windows: {success}"
    );
    assert!(passed_but_resets(&checks), "{checks:#?}");
    assert!(
        code == 0 || check(&checks, "reset rate")["ok"] == false,
        "{checks:#?}"
    );

    // The application got slower: p99 flagged, retries not.
    let (code, checks) = verify(&url, "slow", "1.40.0", ends(slow_at), &[]).await;
    let p99 = check(&checks, "guard p99");
    assert_eq!(p99["ok"], false, "{checks:#?}");
    let now = p99["services"][0]["now"].as_f64().expect("now");
    assert!(now >= 0.04, "the p99 includes the 40 ms: {p99}");
    assert_eq!(
        check(&checks, "guard requests per caller request")["ok"],
        true
    );
    assert_eq!(code, 1);

    stop.cancel();
    prom.stop().await;
}
