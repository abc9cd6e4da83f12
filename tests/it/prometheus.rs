//! `verify`, `inventory` and `skew` against a real Prometheus scraping real
//! shims beside real Envoys.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use drainshim::fleet::prometheus::PromClient;
use support::prom::wait_for_scalar;
use support::*;

/// `verify` on namespace `ns` expecting 1.40.0, then `extra`.
async fn verify(url: &str, ns: &str, extra: &[&str]) -> (Option<i32>, String, String) {
    support::prom::run_verify(url, ns, "1.40.0", extra).await
}

#[tokio::test]
async fn verify_passes_and_fails_on_the_right_conditions() {
    let backend = backend().await;
    let mut envoys = Vec::new();
    let mut shims = Vec::new();
    // (namespace, pod, version): a good wave, a pod left on the old version,
    // and a pod whose drain cuts streams.
    for (ns, pod, version) in [
        ("wave", "a", "1.40.0"),
        ("wave", "b", "1.40.0"),
        ("mixed", "c", "1.39.3"),
        ("cutns", "d", "1.40.0"),
    ] {
        let envoy = envoy_with(version, backend.addr, |o| {
            o.metadata =
                BTreeMap::from([("NAMESPACE".into(), ns.into()), ("NAME".into(), pod.into())]);
        })
        .await;
        let (shim, _drain, sig, task) = start_sidecar(&envoy.admin_url(), short_timers).await;
        shims.push((shim, sig, task));
        envoys.push(envoy);
    }
    let cut_streams = open_streams(envoys[3].inbound, 2, "cut").await;
    let run_prestop = prestop(shims[3].0).await;
    assert_eq!(run_prestop.report().streams.cut, 2);

    let targets: Vec<_> = shims.iter().map(|s| s.0).collect();
    let prom = prometheus(&targets).await;
    let client = PromClient::new(&prom.url(), Duration::from_secs(5)).expect("client");
    wait_for_scalar(
        &client,
        "prometheus has scraped every shim",
        WAIT,
        "count(drainshim_proxy_info == 1)",
        |n| n == 4.0,
    )
    .await;
    let url = prom.url();

    // The good wave passes.
    let (code, out, err) = verify(&url, "wave", &["--window", "1m"]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("2 of 2 proxies on 1.40.0"), "{out}");
    assert!(out.contains("verify: PASS"), "{out}");

    // A pod on the wrong version fails, and is named.
    let (code, out, _) = verify(&url, "mixed", &["--window", "1m"]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("mixed/c on 1.39.3"), "{out}");

    // A cut stream fails the wave.
    let (code, out, _) = verify(&url, "cutns", &["--window", "1m"]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("no stream cut by a drain") && out.contains("2 streams cut"),
        "{out}"
    );

    // Several namespaces at once: both failures show.
    let (code, out, _) = verify(&url, "wave,mixed,cutns", &["--window", "1m"]).await;
    assert_eq!(code, Some(1), "{out}");

    // The rate checks judge once there is a window before to compare with.
    wait_for_scalar(
        &client,
        "12 s of history",
        Duration::from_secs(40),
        "count_over_time(drainshim_proxy_info{namespace=\"wave\",pod=\"a\"}[12s])",
        |n| n >= 10.0,
    )
    .await;
    let (code, out, err) = verify(&url, "wave", &["--window", "5s", "--format", "json"]).await;
    let checks: Vec<serde_json::Value> =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    let retry = checks
        .iter()
        .find(|c| c["check"] == "retry volume within threshold")
        .expect("retry check");
    assert_eq!(retry["ok"], true, "{retry}");
    let reset = checks
        .iter()
        .find(|c| c["check"] == "reset rate within threshold")
        .expect("reset check");
    assert!(
        reset["ok"].is_boolean(),
        "the reset check should judge: {reset}"
    );
    // Host-wide kernel counters move with other tests, so only retries decide here.
    assert!(code == Some(0) || reset["ok"] == false, "{out}");

    // Inventory and skew read the same Prometheus.
    let (code, out, err) = run_bin(&["inventory", "--prometheus", &url, "--format", "json"]).await;
    assert_eq!(code, Some(0), "{err}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).expect("json");
    assert_eq!(rows.len(), 4, "{out}");
    assert!(rows
        .iter()
        .any(|r| r["namespace"] == "mixed" && r["version"] == "1.39.3" && r["state"] == "LIVE"));
    let (code, out, _) = run_bin(&["skew", "--prometheus", &url, "--control-plane", "1.41"]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("mixed") && out.contains("2 minor versions behind 1.41"),
        "{out}"
    );

    // Scraping the shims directly gives the same verdicts where it can judge.
    let t = |i: usize| format!("http://{}", shims[i].0);
    let (code, out, _) = run_bin(&[
        "verify",
        "--targets",
        &t(0),
        "--targets",
        &t(1),
        "--expect-version",
        "1.40.0",
    ])
    .await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("n/a"), "{out}");
    let (code, out, _) =
        run_bin(&["verify", "--targets", &t(3), "--expect-version", "1.40.0"]).await;
    assert_eq!(code, Some(1), "{out}");

    // An unreachable Prometheus is a clear error, not a pass. Wait for the
    // process to be gone first: while it exits it may still accept.
    prom.stop().await;
    let (code, _, err) = verify(&url, "wave", &[]).await;
    assert_eq!(code, Some(69), "{err}");
    assert!(
        err.contains("prometheus") && err.contains("connect"),
        "{err}"
    );
    drop(envoys);
    for s in cut_streams {
        let _ = tokio::time::timeout(WAIT, s).await;
    }
}
