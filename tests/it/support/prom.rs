//! Around the Prometheus fixture (`super::prometheus`): waits on its
//! queries, `drainshim verify` against it and its checks, and the pod the
//! golden-signal tests have it scrape (backend, in-process sidecar with its
//! guard, Envoy named for its namespace).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use drainshim::fleet::prometheus::PromClient;
use drainshim::settings::GuardSettings;
use drainshim_bench::envoy::EnvoyProcess;

use super::{
    envoy_with, free_port, prometheus, run_bin, sidecar_settings, wait_for, Backend, Prometheus,
};

/// A backend behind an in-process sidecar whose guard `configure` sets.
pub struct Sidecar {
    pub backend: Backend,
    pub shim: SocketAddr,
    pub guard: SocketAddr,
    pub admin_port: u16,
    pub sigterm: tokio::sync::mpsc::UnboundedSender<()>,
}

pub async fn sidecar(backend: Backend, configure: impl FnOnce(&mut GuardSettings)) -> Sidecar {
    let admin_port = free_port();
    let admin = format!("http://127.0.0.1:{admin_port}");
    let upstream = backend.addr;
    let settings = sidecar_settings(&admin, |s| {
        let mut g = GuardSettings::new("127.0.0.1:0".parse().expect("address"), upstream);
        configure(&mut g);
        s.guard = Some(g);
    });
    let s = drainshim::sidecar::start(settings)
        .await
        .expect("start sidecar");
    let (shim, guard) = (s.local_addr(), s.guard_addr().expect("guard"));
    let (sigterm, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(s.run(rx));
    Sidecar {
        backend,
        shim,
        guard,
        admin_port,
        sigterm,
    }
}

/// Envoy `version` in front of the guard, its node metadata naming the
/// namespace `ns` (pod `{ns}-0`), with the route retry `retry`.
pub async fn envoy(s: &Sidecar, ns: &str, version: &str, retry: Option<&str>) -> EnvoyProcess {
    envoy_with(version, s.guard, |o| {
        o.admin_port = s.admin_port;
        o.metadata = BTreeMap::from([
            ("NAMESPACE".into(), ns.into()),
            ("NAME".into(), format!("{ns}-0")),
        ]);
        o.route_retry = retry.map(str::to_string);
    })
    .await
}

/// `drainshim verify --prometheus url --namespace ns --expect-version
/// version`, then `extra`.
pub async fn run_verify(
    url: &str,
    ns: &str,
    version: &str,
    extra: &[&str],
) -> (Option<i32>, String, String) {
    let mut args = vec![
        "verify",
        "--prometheus",
        url,
        "--namespace",
        ns,
        "--expect-version",
        version,
    ];
    args.extend_from_slice(extra);
    run_bin(&args).await
}

/// `drainshim verify` on namespace `ns` with `window_secs` windows ending at
/// `at`, and `extra` arguments: its exit code and checks.
pub async fn verify(
    url: &str,
    (ns, version): (&str, &str),
    (window_secs, at): (u64, SystemTime),
    extra: &[&str],
) -> (i32, Vec<serde_json::Value>) {
    let at = format!(
        "{:.3}",
        at.duration_since(UNIX_EPOCH).expect("clock").as_secs_f64()
    );
    let window = format!("{window_secs}s");
    let mut args = vec!["--window", &window, "--at", &at, "--format", "json"];
    args.extend_from_slice(extra);
    let (code, out, err) = run_verify(url, ns, version, &args).await;
    let checks: Vec<serde_json::Value> =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    (code.expect("exit code"), checks)
}

pub fn check<'a>(checks: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    checks
        .iter()
        .find(|c| c["check"].as_str().is_some_and(|n| n.starts_with(name)))
        .unwrap_or_else(|| panic!("no check {name:?} in {checks:?}"))
}

/// Every check passed, except the kernel reset rate: the in-process shims
/// read the host's counters, which other tests move.
pub fn passed_but_resets(checks: &[serde_json::Value]) -> bool {
    checks
        .iter()
        .filter(|c| c["check"] != "reset rate within threshold")
        .all(|c| c["ok"] != false)
}

/// A Prometheus scraping `targets` and its client, once it holds two
/// windows (21 s) of history of the guard's OK requests and Envoy's inbound
/// ones in every pod and `query` reads `expected` (waiting up to `limit`).
pub async fn with_history(
    targets: &[SocketAddr],
    what: &str,
    limit: Duration,
    (query, expected): (&str, f64),
) -> (Prometheus, PromClient) {
    let prom = prometheus(targets).await;
    let client = PromClient::new(&prom.url(), Duration::from_secs(5)).expect("client");
    wait_for(what, limit, || async {
        let q = |m: &str| format!("min(count_over_time({m}[21s]))");
        let ok = |v: Result<f64, _>| v.is_ok_and(|n| n >= 20.0);
        ok(client
            .scalar(&q("drainshim_guard_requests_total{code=\"OK\"}"))
            .await)
            && ok(client
                .scalar(&q("drainshim_envoy_downstream_requests_total"))
                .await)
            && client.scalar(query).await.is_ok_and(|n| n == expected)
    })
    .await;
    (prom, client)
}

/// Waits up to 60 s for every target to be scraped past `end` (by a second).
pub async fn wait_for_scrape_past(client: &PromClient, what: &str, end: SystemTime) {
    let end = end.duration_since(UNIX_EPOCH).expect("clock").as_secs_f64();
    let limit = Duration::from_secs(60);
    wait_for_scalar(client, what, limit, "min(timestamp(up))", |t| t > end + 1.0).await;
}

/// Waits up to `limit` for `query` to read a value that `holds`.
pub async fn wait_for_scalar(
    client: &PromClient,
    what: &str,
    limit: Duration,
    query: &str,
    holds: impl Fn(f64) -> bool,
) {
    wait_for(what, limit, || async {
        client.scalar(query).await.is_ok_and(&holds)
    })
    .await;
}
