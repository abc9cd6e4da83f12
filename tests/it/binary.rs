//! The real `drainshim` binary: signals, budget validation, help text.

use crate::support;

use drainshim::drain::{Outcome, Phase, Report, Status, Trigger};
use nix::sys::signal::{kill, Signal};
use support::load::{Seen, Unary, CALLS_PER_STEP, SLOW_MS};
use support::proc::metrics_showing_cut;
use support::*;
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio::time::Instant;

/// The real binary gets SIGTERM: it drains; a second SIGTERM skips to the
/// deadline, and the report (all streams cut, no guard) is printed on exit.
/// Unary calls run through Envoy all along. The shim never stops Envoy: no
/// call fails before the second SIGTERM (but for those whose connection
/// Envoy's own drain closed before they were sent), and Envoy answers on
/// after it, while the shim lingers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_a_second_sigterm_skips_to_the_deadline() {
    const N: usize = 3;
    let backend = backend().await;
    let envoy = envoy("1.40.0", backend.addr).await;
    let streams = open_streams(envoy.inbound, N, "sig").await;
    let admin = envoy.admin_url();
    let (mut child, pid, mut stderr) = support::proc::spawn_bin(&[
        "sidecar",
        "--listen",
        "127.0.0.1:0",
        "--envoy-admin",
        &admin,
        "--drain-time",
        "40s",
        "--parent-shutdown-time",
        "60s",
        "--poll-interval",
        "200ms",
        "--linger",
        "50s",
    ]);

    // Learn the bound address from the startup log line.
    let shim: std::net::SocketAddr =
        support::proc::logged_listen_addr(&mut stderr, "the sidecar").await;
    let log = tokio::spawn(async move {
        let mut all = String::new();
        while let Ok(Some(line)) = stderr.next_line().await {
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    assert_eq!(http(shim, "GET", "/healthz").await.0, 200);
    assert_eq!(http(shim, "GET", "/readyz").await.0, 200);
    let load = Unary::start(envoy.inbound, SLOW_MS);
    let workers = load.workers();
    load.wait_more(CALLS_PER_STEP, "before SIGTERM").await;

    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    wait_for("the drain starts on SIGTERM", WAIT, || async {
        let (_, body) = http(shim, "GET", "/status").await;
        serde_json::from_str::<Status>(&body)
            .is_ok_and(|s| s.phase != Phase::Serving && s.trigger == Some(Trigger::Sigterm))
    })
    .await;
    assert_eq!(http(shim, "GET", "/readyz").await.0, 503);
    // Still draining: the first SIGTERM alone waits for streams (and
    // Envoy counts each worker's open call beside them).
    wait_for("envoy counters observed", WAIT, || async {
        let (_, body) = http(shim, "GET", "/status").await;
        serde_json::from_str::<Status>(&body).is_ok_and(|s| s.active.streams >= N as u64)
    })
    .await;
    load.wait_more(CALLS_PER_STEP, "draining, before the second SIGTERM")
        .await;

    let fault = Instant::now();
    kill(pid, Signal::SIGTERM).expect("second SIGTERM");
    // The drain ends now, well before its 60 s deadline; the sidecar lingers
    // so Prometheus can scrape the final counts.
    let reported = wait_for_ok("the report after the second SIGTERM", WAIT, || async {
        let (_, body) = http(shim, "GET", "/status").await;
        serde_json::from_str::<Status>(&body)
            .map_err(|e| e.to_string())?
            .report
            .ok_or_else(|| "no report yet".to_string())
    })
    .await;
    let report_after = fault.elapsed();
    load.wait_more(CALLS_PER_STEP, "after the second SIGTERM")
        .await;
    let calls = load.finish().await;
    let seen = Seen::of(&calls, workers, fault);
    // The streams, and each call open at the last poll (at most one per
    // worker), are cut.
    let cut = reported.streams.cut;
    assert!(
        (N as u64..=(N + workers) as u64).contains(&cut),
        "{reported:?}"
    );
    metrics_showing_cut(shim, cut as usize).await;
    // A third SIGTERM ends the linger.
    kill(pid, Signal::SIGTERM).expect("third SIGTERM");
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("exits at once")
        .expect("wait");
    assert!(status.success(), "exit status {status}");
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .await
        .expect("read stdout");
    let report: Report = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("report on stdout ({e}): {out:?}"));
    let log = log.await.expect("log");
    seen.table_line(
        "SIGTERM twice",
        &format!("{N} of {N} long streams (the report's {cut} include the calls open at its last poll)"),
        &format!(
            "the drain ends at the second SIGTERM: report {:.2} s after it ({:.2} s into the drain); \
             Envoy is never stopped by the shim",
            report_after.as_secs_f64(),
            report.duration_seconds
        ),
        &format!("outcome={:?}", report.outcome),
    );
    seen.assert_none_failed_before(&log);
    assert_eq!(report.trigger, Trigger::Sigterm);
    assert_eq!(report.outcome, Outcome::Deadline);
    assert_eq!(report.streams.cut, cut);
    assert!(report.duration_seconds < 40.0, "{report:?}");
    assert!(log.contains("second SIGTERM"), "{log}");
    assert!(log.contains("SIGTERM: exiting now"), "{log}");
    drop(envoy);
    for s in streams {
        let _ = tokio::time::timeout(WAIT, s).await;
    }
}

/// An inconsistent budget is refused before anything runs, naming every flag.
#[tokio::test]
async fn an_inconsistent_budget_is_refused_at_start() {
    let (code, _, err) = run_bin(&[
        "sidecar",
        "--listen",
        "127.0.0.1:0",
        "--drain-time",
        "90s",
        "--parent-shutdown-time",
        "60s",
        "--termination-grace-period",
        "30s",
    ])
    .await;
    assert_eq!(code, Some(64), "{err}");
    for needle in [
        "--drain-time (90s) must be less than --parent-shutdown-time (60s)",
        "--termination-grace-period (30s) must exceed",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in: {err}");
    }
    let (code, _, err) = run_bin(&[
        "sidecar",
        "--termination-grace-period",
        "95s",
        "--linger",
        "10s",
    ])
    .await;
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("plus --linger (10s) must stay below --termination-grace-period (95s)"),
        "{err}"
    );
    // The environment works the same way.
    let out = Command::new(drainshim_bin())
        .args(["drain"])
        .env("DRAINSHIM_MIN_DRAIN_TIME", "2m")
        .output()
        .await
        .expect("runs");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("--min-drain-time (120s) must not exceed --drain-time (60s)"));

    let (code, _, err) = run_bin(&["sidecar", "--drain-time", "soon"]).await;
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("invalid value 'soon'"), "{err}");
    let (code, _, err) = run_bin(&["drain", "--envoy-admin", "localhost:15000"]).await;
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("invalid URL"), "{err}");
}

/// `prestop` with no shim exits non-zero and says why.
#[tokio::test]
async fn prestop_without_a_shim_fails_clearly() {
    let gone = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = gone.local_addr().expect("addr");
    drop(gone);
    let (code, out, err) = run_bin(&["prestop", "--shim", &format!("http://{addr}")]).await;
    assert_eq!(code, Some(69), "{err}");
    assert!(out.is_empty());
    assert!(err.contains("connect"), "{err}");
}

/// `install` copies the binary so a shell-less Envoy image can exec `prestop`.
#[tokio::test]
async fn install_copies_a_working_binary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (code, _, err) =
        run_bin(&["install", "--to", dir.path().to_str().expect("utf-8 path")]).await;
    assert_eq!(code, Some(0), "{err}");
    let copied = dir.path().join("drainshim");
    let out = Command::new(&copied)
        .arg("--version")
        .output()
        .await
        .expect("run the copy");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("drainshim "));
    let (code, _, err) = run_bin(&["install", "--to", "/nonexistent/dir"]).await;
    assert_eq!(code, Some(69));
    assert!(err.contains("/nonexistent/dir"), "{err}");
}

/// Every subcommand's help explains itself and its exit codes.
#[tokio::test]
async fn help_explains_exit_codes() {
    for args in [
        &["--help"][..],
        &["sidecar", "--help"],
        &["prestop", "--help"],
        &["drain", "--help"],
        &["bench", "server", "--help"],
    ] {
        let (code, out, _) = run_bin(args).await;
        assert_eq!(code, Some(0), "{args:?}");
        assert!(out.contains("Exit codes:"), "{args:?}: {out}");
    }
    let (_, out, _) = run_bin(&["sidecar", "--help"]).await;
    for flag in [
        "--drain-time",
        "--parent-shutdown-time",
        "--allow-drain-from",
        "DRAINSHIM_DRAIN_TIME",
        "[default: 60s]",
    ] {
        assert!(out.contains(flag), "sidecar --help lacks {flag}");
    }
}

/// `--check` validates exactly as a start would, prints the effective
/// settings (what `make deploy-check` reads for each manifest), binds nothing.
#[tokio::test]
async fn check_prints_the_effective_settings_or_every_violation() {
    let (code, out, err) = run_bin(&[
        "sidecar",
        "--check",
        "--guard-listen",
        "127.0.0.1:15097",
        "--guard-upstream",
        "127.0.0.1:8080",
        "--termination-grace-period",
        "120s",
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(v["budget"]["drain_time"], "60s");
    assert_eq!(v["budget"]["termination_grace_period"], "120s");
    assert_eq!(v["linger"], "10s");
    assert_eq!(v["worker_threads"], 1);
    assert_eq!(v["guard"]["upstream"], "127.0.0.1:8080");
    assert_eq!(v["guard"]["max_connection_age"], serde_json::Value::Null);

    // The linger counts against the grace period too; all at once.
    let (code, out, err) = run_bin(&[
        "sidecar",
        "--check",
        "--termination-grace-period",
        "95s",
        "--guard-upstream",
        "127.0.0.1:8080",
    ])
    .await;
    assert_eq!(code, Some(64), "{err}");
    assert!(out.is_empty(), "{out}");
    for needle in [
        "plus --linger (10s)",
        "--guard-upstream needs --guard-listen",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in: {err}");
    }

    let (code, out, err) = run_bin(&["node", "--check", "--scan-interval", "0s"]).await;
    assert_eq!(code, Some(64), "{err}");
    assert!(out.is_empty() && err.contains("--scan-interval must be greater than zero"));
    let (code, out, err) = run_bin(&["node", "--check"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(r#""pod_listen_port":15099"#), "{out}");
}

/// `--guard-http2` (which chose between two HTTP/2 paths) is gone: the flag
/// is refused with exit 64, and a manifest that still sets its variable is
/// told, once, that it does nothing.
#[tokio::test]
async fn the_retired_guard_http2_flag_is_refused_and_its_variable_named() {
    let (code, _, err) = run_bin(&["sidecar", "--check", "--guard-http2", "stack"]).await;
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("'--guard-http2'"), "{err}");
    let out = Command::new(drainshim_bin())
        .args(["sidecar", "--check", "--guard-listen", "127.0.0.1:15097"])
        .args(["--guard-upstream", "127.0.0.1:8080"])
        .env("DRAINSHIM_GUARD_HTTP2", "stack")
        .output()
        .await
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(
        err.matches("DRAINSHIM_GUARD_HTTP2 is set but no longer read")
            .count(),
        1,
        "{err}"
    );
}
