//! The real binary's processes: killed and reaped within a deadline, the
//! address they log, what their metrics count.

use std::net::SocketAddr;
use std::time::Duration;

use std::process::Stdio;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, BufReader, Lines};
use tokio::time::Instant;

/// SIGKILLs `child` (`what`: "the shim") and reaps it within `limit`; when
/// it was killed.
pub async fn sigkill(child: &mut tokio::process::Child, what: &str, limit: Duration) -> Instant {
    child
        .start_kill()
        .unwrap_or_else(|e| panic!("SIGKILL {what}: {e}"));
    let killed = Instant::now();
    tokio::time::timeout(limit, child.wait())
        .await
        .unwrap_or_else(|_| panic!("{what} exits after SIGKILL"))
        .unwrap_or_else(|e| panic!("reap {what}: {e}"));
    killed
}

/// The address a `drainshim` process (`what`: "the agent") logged after
/// `listen=` on its stderr `lines`, read within [`super::WAIT`].
pub async fn logged_listen_addr<R: AsyncBufRead + Unpin>(
    lines: &mut Lines<R>,
    what: &str,
) -> SocketAddr {
    tokio::time::timeout(super::WAIT, async {
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            if let Some(rest) = line.split("listen=").nth(1) {
                return rest
                    .split_whitespace()
                    .next()
                    .expect("addr")
                    .parse()
                    .expect("socket addr");
            }
        }
        panic!("{what} exited before it was ready");
    })
    .await
    .unwrap_or_else(|_| panic!("{what} ready in time"))
}

/// The shim's `/metrics` (answered 200), which count `n` cut streams.
pub async fn metrics_showing_cut(shim: SocketAddr, n: usize) -> String {
    let (code, metrics) = super::http(shim, "GET", "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        metrics.contains(&format!(
            "drainshim_drained_streams_total{{outcome=\"cut\"}} {n}"
        )),
        "{metrics}"
    );
    metrics
}

/// The real binary with `args`, its stdout and stderr piped, killed on
/// drop: the child, its pid, and its stderr line by line.
pub fn spawn_bin(
    args: &[&str],
) -> (
    tokio::process::Child,
    nix::unistd::Pid,
    Lines<BufReader<tokio::process::ChildStderr>>,
) {
    let mut child = tokio::process::Command::new(super::drainshim_bin())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn drainshim");
    let pid = nix::unistd::Pid::from_raw(child.id().expect("pid") as i32);
    let stderr = BufReader::new(child.stderr.take().expect("stderr")).lines();
    (child, pid, stderr)
}
