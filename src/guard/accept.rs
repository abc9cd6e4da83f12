//! The accept loop, raced against shutdown, and the hand-off of each
//! connection to the HTTP/2 or HTTP/1.1 driver.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::conn::ConnInfo;
use super::handle::Handle;
use super::sniff::{refuse_preface, sniff, Protocol, MAX_LINGER};
use super::{h1, relay, Guard};
use crate::drain::StreamGuard;
use crate::metrics::Limit;

/// Pause after a failed accept (typically EMFILE), so the loop does not spin
/// while descriptors are exhausted.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Pending connections on a guard listener. Envoy opens one upstream
/// connection per WebSocket (and per HTTP/1.1 request in flight), so a
/// burst of reconnects arrives as hundreds of connects at once. Where the
/// accept queue is full the kernel drops the SYN, the client's retry comes
/// a second later, the connect misses Envoy's `connect_timeout` (1 s), and
/// the route's retry fails open: the stream goes around the guard. tokio's
/// default is 128, which a burst of 500 WebSockets overflowed (`bench
/// reconnect --protocol websocket`). The kernel caps this at
/// `net.core.somaxconn` (4,096 by default since Linux 5.4), as it does for
/// Go's and Envoy's listeners.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds a listener for the guard (or an application standing in for one,
/// in the benches) with [`LISTEN_BACKLOG`] and SO_REUSEADDR, as
/// `TcpListener::bind` does but for the backlog. Needs a tokio runtime.
pub fn bind_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv6() {
        tokio::net::TcpSocket::new_v6()?
    } else {
        tokio::net::TcpSocket::new_v4()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Accepts until `accepting` is cancelled; then, once `shutdown` is (at
/// once when both are the same token), ends what is left and waits for it.
pub async fn serve(
    guard: Guard,
    listener: TcpListener,
    accepting: CancellationToken,
    shutdown: CancellationToken,
) {
    let inner = guard.inner.clone();
    let local = listener.local_addr().ok();
    tracing::info!(listen = ?local, upstream = %inner.config.upstream, "guard: serving");
    // Connections closed at the cap so far (for the log).
    let mut refused = 0u64;
    loop {
        let accepted = tokio::select! {
            biased;
            _ = accepting.cancelled() => break,
            _ = shutdown.cancelled() => break,
            r = listener.accept() => r,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(listen = ?local, error = %e, "guard: accept failed; backing off");
                tokio::select! {
                    _ = accepting.cancelled() => break,
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        // The process-wide cap: close at once, before any byte is read. The
        // peer sees a closed connection (Envoy: a connect failure, which it
        // retries, on the app when it fails open).
        let open = inner.connections.load(Ordering::Relaxed);
        if open >= inner.config.limits.max_connections as u64 {
            refused += 1;
            inner.metrics.guard_limited(Limit::connections).inc();
            if refused == 1 || refused.is_multiple_of(1_000) {
                tracing::warn!(%peer, open, refused, max = inner.config.limits.max_connections,
                    "guard: connection limit reached; closing new connections: Envoy retries them on the app directly (fail open), so their streams are not guarded and a restart will cut them; raise --guard-max-connections");
            }
            drop(tcp);
            continue;
        }
        let info = ConnInfo {
            id: inner.next_connection.fetch_add(1, Ordering::Relaxed),
            peer,
            accepted_at: Instant::now(),
        };
        let handle = guard.handle();
        let live = handle.count_connection();
        inner.tasks.spawn(async move {
            connection(handle, tcp, info).await;
            drop(live);
        });
    }
    drop(listener);
    shutdown.cancelled().await;

    // Shutdown: end what is left gracefully, at once, and wait for the
    // connections to flush and close. Every connection bounds its own close,
    // so this wait is bounded too; the timeout is a second line of defence.
    inner.closing.cancel();
    guard.terminate_all(Duration::ZERO);
    inner.tasks.close();
    let l = &inner.config.limits;
    // Ack wait, ending, flush, then the lingering close.
    let bound =
        l.goaway_ack_timeout + l.end_timeout + l.shutdown_timeout + MAX_LINGER + ACCEPT_BACKOFF;
    if tokio::time::timeout(bound, inner.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            connections = guard.active_connections(),
            ?bound,
            "guard: connections still open after shutdown; leaving them"
        );
    }
    tracing::info!(listen = ?local, "guard: stopped");
}

/// Serves one connection with the protocol its first bytes announce.
async fn connection(handle: Handle, tcp: TcpStream, info: ConnInfo) {
    // gRPC messages are small and latency matters more than packet count.
    let _ = tcp.set_nodelay(true);
    let deadline = info.accepted_at + handle.config().limits.header_read_timeout;
    match sniff(tcp, deadline).await {
        Ok((Protocol::Http2, io)) => relay::serve(handle, io, info).await,
        Ok((Protocol::Http1, io)) => h1::serve(handle, io, info).await,
        Ok((Protocol::BadPreface, io)) => {
            tracing::debug!(peer = %info.peer, "guard: an invalid HTTP/2 preface; GOAWAY(PROTOCOL_ERROR)");
            refuse_preface(io, handle.config().limits.shutdown_timeout).await
        }
        Err(e) => {
            tracing::debug!(peer = %info.peer, error = %e, "guard: connection closed before a request")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst of connects to a guard listener nobody accepts from yet (its
    /// accept loop starved by the burst itself) all complete: with tokio's
    /// default backlog of 128 the ones past it wait for a SYN retry, which
    /// misses Envoy's 1 s connect timeout.
    #[tokio::test]
    async fn a_burst_of_connects_waits_in_the_backlog() {
        let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(4096);
        let burst = 1_000.min(somaxconn);
        let listener = bind_listener(SocketAddr::from(([127, 0, 0, 1], 0))).expect("bind");
        let addr = listener.local_addr().expect("address");
        let mut open = Vec::with_capacity(burst);
        for i in 0..burst {
            let tcp = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
                .await
                .unwrap_or_else(|_| panic!("connect {i} of {burst} waited past 5 s"))
                .expect("connect");
            open.push(tcp);
        }
        assert_eq!(open.len(), burst);
        drop(listener);
    }
}
