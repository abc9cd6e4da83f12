//! WebSocket through real Envoy 1.40 and the real `drainshim` binary with a
//! client nobody here wrote: Python's `websockets` (PyPI, installed by
//! `scripts/fetch-pytools.sh` into the cache; missing means failing). A drain
//! ends every connection with a Close 1012, without a gap or a lost tick;
//! plain Envoy SIGTERM, the baseline, ends them all without a Close (1006).

use crate::support;

use std::path::PathBuf;
use std::process::Stdio;

use support::ws::*;
use support::*;
use tokio::io::{AsyncBufReadExt, BufReader};

const N: usize = 10;

#[derive(serde::Deserialize, Debug)]
struct PyConn {
    id: String,
    seqs: Vec<u64>,
    close_code: Option<u16>,
    error: Option<String>,
}

#[derive(serde::Deserialize, Debug)]
struct PyRun {
    connections: Vec<PyConn>,
    unfinished: usize,
}

/// Starts the Python client against `addr`; returns once every connection
/// had its first tick, with a handle that yields its report.
async fn python_clients(
    addr: std::net::SocketAddr,
    prefix: &str,
) -> tokio::task::JoinHandle<PyRun> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/ws_client.py");
    let mut child = tokio::process::Command::new(python())
        .arg(script)
        .args(["--base", &format!("ws://{addr}"), "--n", &N.to_string()])
        .args(["--prefix", prefix, "--limit", "60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("run the Python client");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let ready = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("ready in time")
        .expect("read");
    assert_eq!(ready.as_deref(), Some("ready"));
    tokio::spawn(async move {
        let line = tokio::time::timeout(std::time::Duration::from_secs(90), lines.next_line())
            .await
            .expect("the Python client finished in time")
            .expect("read")
            .expect("a report line");
        let _ = child.wait().await;
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad report {line:?}: {e}"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_websockets_clients_get_1012_and_every_tick_on_a_drain() {
    let pod = ws_pod(WS_TIMERS).await;
    let clients = python_clients(pod.envoy.inbound, "py").await;
    let run = prestop(pod.shim.addr).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let report = run.report();
    let py = tokio::time::timeout(WAIT, clients)
        .await
        .expect("in time")
        .expect("client task");
    assert_eq!(py.unfinished, 0, "{py:?}");
    assert_eq!(py.connections.len(), N);
    for c in &py.connections {
        assert_eq!(c.close_code, Some(1012), "{c:?}");
        let gapless = c.seqs.iter().zip(1u64..).all(|(s, want)| *s == want);
        assert!(gapless, "{}: gaps in {:?}", c.id, c.seqs);
        assert_eq!(
            c.seqs.last().copied(),
            pod.app.ledger.last_written(&c.id),
            "{}: lost ticks",
            c.id
        );
    }
    assert_eq!(report.streams.cut, 0, "{report:?}");
    assert_eq!(report.streams.terminated, N as u64, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_websockets_clients_see_1006_when_plain_envoy_gets_sigterm() {
    let app = ws_app().await;
    let mut envoy = ws_envoy(app.addr, 0).await;
    let clients = python_clients(envoy.inbound, "base").await;
    envoy.sigterm();
    assert!(envoy.wait_exit(WAIT).await.is_some(), "envoy exited");
    let py = tokio::time::timeout(WAIT, clients)
        .await
        .expect("in time")
        .expect("client task");
    assert_eq!(py.connections.len(), N);
    for c in &py.connections {
        assert_eq!(c.close_code, None, "no Close frame: {c:?}");
        let err = c.error.as_deref().unwrap_or_default();
        assert!(
            err.contains("1006") || err.contains("no close frame"),
            "{c:?}"
        );
    }
}
