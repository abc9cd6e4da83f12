//! A byte-copy TCP relay: the least a proxy that reads one socket and writes
//! another can cost. The guard benchmark runs it as a path of its own, so a
//! hop's throughput against direct can be read against the floor of any hop
//! on the same machine in the same run. It understands nothing: each
//! accepted connection gets one connection to the upstream, and bytes are
//! copied both ways until either side closes.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::task::TaskTracker;

/// After a failed accept (out of descriptors, say), wait this long before
/// the next, rather than spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Relays every connection accepted on `listener` to `upstream` until
/// `shutdown`; the relayed connections are then dropped.
pub async fn serve(
    listener: TcpListener,
    upstream: SocketAddr,
    shutdown: impl Future<Output = ()>,
) {
    each_pair(
        listener,
        upstream,
        "relay",
        shutdown,
        |mut down, mut up| async move {
            let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
        },
    )
    .await;
}

/// The relays' accept loop: each connection accepted on `listener` gets its
/// own connection to `upstream` (both with TCP_NODELAY), and `relay` runs
/// on the pair in a task of its own, until `shutdown`. `what` names the
/// relay in log lines.
async fn each_pair<F, Fut>(
    listener: TcpListener,
    upstream: SocketAddr,
    what: &'static str,
    shutdown: impl Future<Output = ()>,
    relay: F,
) where
    F: Fn(TcpStream, TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let relay = std::sync::Arc::new(relay);
    let tasks = TaskTracker::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            r = listener.accept() => r,
        };
        let down = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "bench {what}: accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let relay = relay.clone();
        tasks.spawn(async move {
            let up = match TcpStream::connect(upstream).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(%upstream, error = %e, "bench {what}: connect failed");
                    return;
                }
            };
            let _ = down.set_nodelay(true);
            let _ = up.set_nodelay(true);
            relay(down, up).await;
        });
    }
    tasks.close();
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_go_both_ways_unchanged() {
        // An echo upstream.
        let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let echo_addr = echo.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.expect("accept");
            let (mut r, mut w) = s.split();
            let _ = tokio::io::copy(&mut r, &mut w).await;
        });
        let relay = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let relay_addr = relay.local_addr().expect("addr");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(serve(relay, echo_addr, async {
            let _ = stop_rx.await;
        }));
        let mut c = TcpStream::connect(relay_addr).await.expect("connect");
        let sent: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let (mut r, mut w) = c.split();
        let write = async {
            w.write_all(&sent).await.expect("write");
            w.shutdown().await.expect("shutdown");
        };
        let mut got = Vec::new();
        let read = async {
            tokio::time::timeout(Duration::from_secs(10), r.read_to_end(&mut got))
                .await
                .expect("echoed in time")
                .expect("read");
        };
        tokio::join!(write, read);
        assert_eq!(got, sent);
        stop_tx.send(()).expect("stop");
        tokio::time::timeout(Duration::from_secs(10), served)
            .await
            .expect("serve returns on shutdown")
            .expect("serve task");
    }
}
