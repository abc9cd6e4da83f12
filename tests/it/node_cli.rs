//! The real `drainshim node` binary: help text, validation, SIGTERM.

use crate::support;

use std::process::Stdio;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

#[tokio::test]
async fn help_names_the_privileges_and_exit_codes() {
    let out = Command::new(drainshim_bin())
        .args(["node", "--help"])
        .output()
        .await
        .expect("run");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "hostPID",
        "hostNetwork",
        "CAP_SYS_ADMIN",
        "CAP_SYS_PTRACE",
        "CAP_NET_BIND_SERVICE",
        "Exit codes:",
        "77",
        "--proc-root",
        "--envoy-process-name",
        "--scan-interval",
        "--pod-admin-port",
        "--pod-listen-port",
        "[env: DRAINSHIM_POD_LISTEN_PORT=]",
        "[default: 0.0.0.0:15098]",
    ] {
        assert!(help.contains(needle), "{needle} missing from:\n{help}");
    }
}

#[tokio::test]
async fn every_bad_value_is_reported_at_once() {
    let out = Command::new(drainshim_bin())
        .args(["node", "--drain-time", "100s", "--envoy-process-name", ""])
        .env("DRAINSHIM_SCAN_INTERVAL", "0s")
        .output()
        .await
        .expect("run");
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in ["--drain-time", "--scan-interval", "--envoy-process-name"] {
        assert!(err.contains(needle), "{needle} missing from: {err}");
    }
}

/// The binary starts on an empty /proc view, serves /readyz, and exits 0
/// on SIGTERM.
#[tokio::test]
async fn sigterm_stops_the_agent() {
    let procs = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(drainshim_bin())
        .args(["node", "--listen", "127.0.0.1:0", "--proc-root"])
        .arg(procs.path())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let api: std::net::SocketAddr =
        support::proc::logged_listen_addr(&mut lines, "the agent").await;
    let (code, _) = http(api, "GET", "/readyz").await;
    assert_eq!(code, 200);
    let (code, body) = http(api, "GET", "/status").await;
    assert_eq!(code, 200);
    assert!(body.contains("\"pods\":[]"), "{body}");
    kill(
        Pid::from_raw(child.id().expect("pid") as i32),
        Signal::SIGTERM,
    )
    .expect("signal");
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("exited")
        .expect("wait");
    assert_eq!(status.code(), Some(0));
    // Drain stderr so nothing blocks.
    while let Ok(Some(_)) = lines.next_line().await {}
}
