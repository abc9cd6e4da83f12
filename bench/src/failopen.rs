//! Fail-open measurement: steady unary gRPC load through Envoy while the
//! shim is killed and started again, and what Envoy says about where each
//! request went. Shared by `benches/failopen.rs` (the figures) and
//! `tests/it/failopen.rs` (the property).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::proto::bench::stream_client::StreamClient;
use crate::proto::bench::EchoRequest;

/// A call slower than this counts as failed (a hang). The load is unary Echo
/// on loopback, which answers in well under a millisecond; the bound is wide
/// so that a loaded machine is slow, not failing.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// One unary call, as the client saw it.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub start: Instant,
    pub end: Instant,
    pub ok: bool,
}

/// Steady unary load: `workers` clients, each on its own HTTP/2 connection,
/// each sending one Echo after another with `pause` between them.
pub struct Load {
    stop: CancellationToken,
    workers: Vec<JoinHandle<Vec<Call>>>,
}

impl Load {
    pub fn start(addr: SocketAddr, workers: usize, pause: Duration, max_calls: usize) -> Self {
        let stop = CancellationToken::new();
        let workers = (0..workers)
            .map(|w| {
                let stop = stop.clone();
                tokio::spawn(async move { worker(addr, w, pause, max_calls, stop).await })
            })
            .collect();
        Self { stop, workers }
    }

    /// Stops the load and returns every call, in order of start.
    pub async fn finish(self) -> Vec<Call> {
        self.stop.cancel();
        let mut calls = Vec::new();
        for w in self.workers {
            calls.extend(w.await.unwrap_or_default());
        }
        calls.sort_by_key(|c| c.start);
        calls
    }
}

async fn worker(
    addr: SocketAddr,
    w: usize,
    pause: Duration,
    max_calls: usize,
    stop: CancellationToken,
) -> Vec<Call> {
    let mut calls = Vec::new();
    let Ok(endpoint) = tonic::transport::Endpoint::from_shared(format!("http://{addr}")) else {
        return calls;
    };
    // Lazy: the channel reconnects by itself after a failure.
    let mut client = StreamClient::new(endpoint.connect_lazy());
    for i in 0..max_calls {
        if stop.is_cancelled() {
            break;
        }
        let start = Instant::now();
        let call = client.echo(EchoRequest {
            body: format!("w{w}-{i}"),
            ..Default::default()
        });
        let ok = matches!(tokio::time::timeout(CALL_TIMEOUT, call).await, Ok(Ok(_)));
        calls.push(Call {
            start,
            end: Instant::now(),
            ok,
        });
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
    }
    calls
}

/// What one run of the load saw around a kill of the shim at `killed`.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub calls: usize,
    pub failed: usize,
    /// From the kill until the last failed call ended: after that every call
    /// succeeded. Zero when none failed.
    pub recovered_after: Duration,
}

impl Summary {
    pub fn of(calls: &[Call], killed: Instant) -> Self {
        let failed: Vec<&Call> = calls.iter().filter(|c| !c.ok).collect();
        let recovered_after = failed
            .iter()
            .map(|c| c.end.saturating_duration_since(killed))
            .max()
            .unwrap_or_default();
        Self {
            calls: calls.len(),
            failed: failed.len(),
            recovered_after,
        }
    }

    /// Failed calls as a share of all calls (0 for no calls).
    pub fn failed_share(&self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            self.failed as f64 / self.calls as f64
        }
    }
}

/// Requests Envoy has sent to `host` in cluster `app` (`rq_total` in the
/// admin's `/clusters`), or `None` if the admin did not answer or does not
/// list the host. This is where traffic goes, as Envoy itself counts it.
pub async fn host_requests(admin: SocketAddr, host: SocketAddr) -> Option<u64> {
    let tcp = tokio::time::timeout(
        Duration::from_secs(1),
        tokio::net::TcpStream::connect(admin),
    )
    .await
    .ok()?
    .ok()?;
    let (status, body) = tokio::time::timeout(
        Duration::from_secs(2),
        drainshim::http::request(tcp, &admin.to_string(), http::Method::GET, "/clusters"),
    )
    .await
    .ok()?
    .ok()?;
    if !status.is_success() {
        return None;
    }
    let want = format!("app::{host}::rq_total::");
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix(&want)?.trim().parse().ok())
}

/// Polls [`host_requests`] until it grows past `before`, up to `limit`;
/// returns when it did.
pub async fn wait_host_traffic(
    admin: SocketAddr,
    host: SocketAddr,
    before: u64,
    limit: Duration,
) -> Option<Instant> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if host_requests(admin, host).await.is_some_and(|n| n > before) {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}
