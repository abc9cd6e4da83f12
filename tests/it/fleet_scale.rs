//! The fleet tools on a simulated fleet's ten weeks of history, on a real
//! Prometheus (promtool's backfill) and a real VictoriaMetrics (its
//! import): `bench fleet`'s harness at a size `make test` affords (the full
//! 2,400 pods run in `make bench-fleet`). The commands are the real binary.
//!
//! What it holds:
//! - `plan` names the stalled wave at day 26, the control plane's point of
//!   no return next at day 36, and the failed verify at the end, with the
//!   control plane row done and its rollback gone; a wave whose window
//!   holds a shim's counter reset still passes;
//! - every command's JSON is the same on both stores;
//! - every figure the bench prints was measured (queries, bytes, RSS).

use std::time::Duration;

use serde_json::Value;

use drainshim_bench::fleet::store::StoreKind;
use drainshim_bench::fleet::{run, FleetBenchOptions, Run};

fn output<'a>(runs: &'a [Run], command: &str, store: StoreKind) -> &'a Run {
    runs.iter()
        .find(|r| r.command.starts_with(command) && r.store == store)
        .unwrap_or_else(|| panic!("no run of {command} on {store:?}"))
}

fn next_row(plan: &Value) -> &Value {
    let k = plan["next"]["row"].as_u64().expect("a next row") as usize;
    &plan["rows"][k]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_reads_ten_weeks_alike_on_prometheus_and_victoria_metrics() {
    let report = run(FleetBenchOptions {
        pods: 120,
        services: 40,
        namespaces: 12,
        interval: Duration::from_secs(600),
        stores: vec![StoreKind::Prometheus, StoreKind::VictoriaMetrics],
        binary: crate::support::drainshim_bin(),
        keep: None,
        compare: None,
    })
    .await
    .expect("the bench runs (make tools fetches both stores; no skip)");
    println!("{}", report.render());

    for store in [StoreKind::Prometheus, StoreKind::VictoriaMetrics] {
        // Day 26: the main tier's restart to 1.39 stopped half-way.
        let r = output(&report.runs, "plan (day 26", store);
        let row = next_row(&r.output);
        assert_eq!(r.exit_code, 1, "{store:?}: {}", r.output);
        assert_eq!(r.output["verdict"], "stop");
        assert_eq!(
            (row["step"].as_u64(), row["tier"].as_str()),
            (Some(3), Some("main"))
        );
        assert_eq!(row["state"], "stalled");
        assert!(
            r.output["next"]["action"]
                .as_str()
                .is_some_and(|a| a.contains("tier main is stalled")),
            "{}",
            r.output["next"]
        );

        // Day 26: the tiers whose lifetime soaked are judged on the calls
        // around the waves: within their recommendation (calls of at most
        // 2.5 s against the sidecar's default 60 s / 90 s).
        let judged: Vec<&str> = r.output["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .filter(|x| x["kind"] == "drain_timers")
            .filter_map(|x| x["detail"].as_str())
            .collect();
        println!("{store:?} day 26 drain timers: {judged:?}");
        assert!(
            judged
                .iter()
                .any(|d| d.contains("within their recommendation")),
            "{judged:?}"
        );

        // Day 36: every tier on 1.39 and soaked; the control plane is next.
        let r = output(&report.runs, "plan (day 36", store);
        let row = next_row(&r.output);
        assert_eq!(r.exit_code, 0, "{store:?}: {}", r.output["next"]);
        assert_eq!(r.output["verdict"], "go");
        assert_eq!(
            (row["step"].as_u64(), row["kind"].as_str()),
            (Some(4), Some("control_plane"))
        );
        assert!(r.output["next"]["action"]
            .as_str()
            .is_some_and(|a| a.contains("point of no return")));
        let first_restart: Vec<&Value> = r.output["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .filter(|x| x["step"] == 3)
            .collect();
        assert_eq!(first_restart.len(), 4);
        assert!(
            first_restart.iter().all(|x| x["state"] == "verified"),
            "every wave to 1.39 verified: {first_restart:?}"
        );

        // Day 70: the late tier's wave to 1.40 cut streams on its drains.
        let r = output(&report.runs, "plan (day 70", store);
        let row = next_row(&r.output);
        assert_eq!(r.exit_code, 1);
        assert_eq!(
            (row["step"].as_u64(), row["tier"].as_str()),
            (Some(5), Some("late"))
        );
        assert_eq!(row["verify"]["failed"], true);
        let why = row["verify"]["detail"].as_str().unwrap_or_default();
        assert!(why.contains("no stream cut by a drain"), "{why}");
        let cp = r.output["rows"]
            .as_array()
            .and_then(|rows| rows.iter().find(|x| x["kind"] == "control_plane"))
            .expect("a control plane row");
        assert_eq!(cp["state"], "done");
        assert_eq!(cp["rollback"]["possible"], false);
        // The other waves to 1.40 passed, the main tier's too, although one
        // of its shims restarted in its pod inside the wave's window (its
        // counters reset: read with the reset-aware form, not as a jump).
        let passed = r.output["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .filter(|x| x["step"] == 5 && x["tier"] != "late" && x["state"] == "verified")
            .count();
        assert_eq!(passed, 3, "{}", r.output["rows"]);
        // The drain-timers step judged every tier on the shims' own
        // timers (the sidecar's defaults, 60 s / 90 s) against calls of at
        // most 2.5 s: every service within its recommendation, or said to
        // have had no traffic in the window; none short, none unknown.
        let timers: Vec<&Value> = r.output["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .filter(|x| x["kind"] == "drain_timers")
            .collect();
        assert_eq!(timers.len(), 4, "{}", r.output["rows"]);
        for t in &timers {
            assert_eq!(t["state"], "done", "{t}");
            assert_eq!(t["gate"]["failed"], false, "{t}");
            let d = t["detail"].as_str().unwrap_or_default();
            assert!(
                d.contains("within their recommendation") || d.contains("no traffic"),
                "{t}"
            );
        }
        let details: Vec<&str> = timers.iter().filter_map(|t| t["detail"].as_str()).collect();
        println!("{store:?} day 70 drain timers: {details:?}");

        // verify of the late wave fails on the cut streams only.
        let v = output(&report.runs, "verify late", store);
        assert_eq!(v.exit_code, 1);
        let failed: Vec<&str> = v
            .output
            .as_array()
            .expect("verify -o json: the checks")
            .iter()
            .filter(|c| c["ok"] == false)
            .filter_map(|c| c["check"].as_str())
            .collect();
        assert_eq!(failed, ["no stream cut by a drain"], "{}", v.output);

        // inventory and skew now: every proxy on 1.40, within skew.
        let inv = output(&report.runs, "inventory", store);
        assert_eq!(inv.exit_code, 0);
        let skew = output(&report.runs, "skew", store);
        assert_eq!(skew.exit_code, 0, "{}", skew.output);
        assert_eq!(skew.output["proxies"], 120);
    }

    for j in &report.judgements {
        assert!(j.ok, "{}: {}", j.what, j.detail);
    }
    let agreed = report
        .judgements
        .iter()
        .filter(|j| j.what.contains("the same JSON"))
        .count();
    assert_eq!(agreed, 6, "every command compared");
    for r in &report.runs {
        assert!(
            r.queries > 0 && r.bytes > 0,
            "{} measured: {r:?}",
            r.command
        );
        assert!(r.peak_rss_mib > 1.0, "{} measured: {r:?}", r.command);
    }
}
