//! The node-scale benchmark runs end to end (few pods, so CI stays quick):
//! every pod is inventoried and the figures are reported. No speed is
//! asserted; the figures for 100 pods are in the README.

use crate::support;

use support::drainshim_bin;

#[tokio::test]
async fn node_scale_bench_inventories_every_pod() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the node-scale benchmark needs root (network namespaces); it never skips"
    );
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        tokio::process::Command::new(drainshim_bin())
            .args(["bench", "node-scale", "--pods", "10", "--idle-window", "1s"])
            .args(["--format", "json"])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("node-scale finished")
    .expect("run node-scale");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "node-scale failed: {stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("one JSON report on stdout");
    assert_eq!(report["pods"], 10, "{report}");
    assert_eq!(report["discovered"], 10, "{report}");
    for field in [
        "discovery_seconds",
        "rss_mib_after_discovery",
        "scrape_seconds",
        "idle_cpu_percent",
    ] {
        assert!(
            report[field].as_f64().is_some_and(|v| v >= 0.0),
            "{field}: {report}"
        );
    }
}
