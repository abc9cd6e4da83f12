//! The accept loop, raced against shutdown, and the hand-off of each
//! connection to the HTTP/2 or HTTP/1.1 driver.

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
                    "guard: connection limit reached; closing new connections");
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
