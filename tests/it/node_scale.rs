//! The node-scale benchmark runs end to end (few pods, so CI stays quick):
//! every pod is inventoried and the figures are reported. No speed is
//! asserted; the figures for 100 pods are in docs/benchmarks.md.

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

/// The guarded variant, with few pods and short phases: every pod gets its
/// guard from the agent, then from a sidecar, and calls go through both.
#[tokio::test]
async fn node_scale_with_guards_serves_every_pod_through_agent_and_sidecars() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the node-scale benchmark needs root (network namespaces); it never skips"
    );
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(180),
        tokio::process::Command::new(drainshim_bin())
            .args(["bench", "node-scale", "--guards", "--pods", "4"])
            .args([
                "--idle-window",
                "1s",
                "--load-duration",
                "2s",
                "--rate",
                "200",
            ])
            .args(["--format", "json"])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("node-scale --guards finished")
    .expect("run node-scale --guards");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "node-scale --guards failed: {stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("one JSON report on stdout");
    assert_eq!(report["pods"], 4, "{report}");
    assert_eq!(report["agent_guards"], 4, "{report}");
    for path in ["direct", "agent", "sidecars"] {
        // Calls went through (no speed is asserted, only that each path served).
        assert!(
            report[path]["completed_per_second"]
                .as_f64()
                .is_some_and(|v| v > 0.0),
            "{path}: {report}"
        );
    }
    assert!(
        report["agent_rss_mib"].as_f64().is_some_and(|v| v > 0.0),
        "{report}"
    );
}
