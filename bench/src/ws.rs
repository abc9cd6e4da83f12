//! A WebSocket application for the tests and benchmarks (tokio-tungstenite):
//! `GET /tick?id=ID&interval_ms=N&size=B` upgrades, then sends text ticks
//! `ID SEQ <B bytes of padding>`, the first at once and then every N ms
//! (N = 0: no ticks), and echoes every message the client sends. The send ledger records, per id, the last
//! tick the server's transport accepted, so a client can prove nothing was
//! lost. On a Close (from the client, or the guard's 1001) it stops ticking
//! and answers it, as a well-behaved server does.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::Message;

/// Largest tick padding a client may ask for; bounds memory per connection.
pub const MAX_TICK_BYTES: usize = 1 << 20;
/// How long the server waits for the end of a close handshake.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Per connection id, the last tick the transport accepted: the same
/// ledger as the gRPC backend's, so one pod's app serves both kinds.
pub type WsLedger = super::server::Ledger;

/// What a client asked for in its request line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TickParams {
    /// The connection's id, echoed in every tick.
    pub id: String,
    /// Between ticks; None: no ticks, echo only.
    pub interval: Option<Duration>,
    /// Padding bytes per tick.
    pub size: usize,
}

impl TickParams {
    /// Parses `/tick?id=a&interval_ms=20&size=10` (unknown keys ignored).
    pub fn parse(path_and_query: &str) -> Self {
        let mut p = TickParams::default();
        let query = path_and_query.split_once('?').map_or("", |(_, q)| q);
        for pair in query.split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "id" => p.id = v.to_string(),
                "interval_ms" => {
                    p.interval = v
                        .parse::<u64>()
                        .ok()
                        .filter(|ms| *ms > 0)
                        .map(Duration::from_millis)
                }
                "size" => p.size = v.parse::<usize>().unwrap_or(0).min(MAX_TICK_BYTES),
                _ => {}
            }
        }
        p
    }
}

/// One pod's application for both populations: gRPC (h2c, the tonic bench
/// service) and WebSocket (HTTP/1.1) on the same port, told apart by the
/// first bytes (`PRI` is the HTTP/2 preface), sharing one send ledger.
pub async fn serve_mixed(
    listener: TcpListener,
    ledger: WsLedger,
    stop_fut: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let stop = tokio_util::sync::CancellationToken::new();
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<TcpStream>>(64);
    let service = super::server::BenchService {
        ledger: ledger.clone(),
        ..Default::default()
    };
    let grpc_stop = stop.clone();
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::ReceiverStream::new(rx);
        let _ = tonic::transport::Server::builder()
            .add_service(crate::proto::bench::stream_server::StreamServer::new(
                service,
            ))
            .serve_with_incoming_shutdown(incoming, grpc_stop.cancelled_owned())
            .await;
    });
    tokio::pin!(stop_fut);
    loop {
        let (tcp, _) = tokio::select! {
            _ = &mut stop_fut => { stop.cancel(); return }
            r = listener.accept() => match r {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "bench app: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let (tx, ledger) = (tx.clone(), ledger.clone());
        tokio::spawn(async move {
            let mut first = [0u8; 3];
            let peeked = tokio::time::timeout(CLOSE_WAIT, tcp.peek(&mut first)).await;
            if !matches!(peeked, Ok(Ok(3))) {
                return;
            }
            if &first == b"PRI" {
                let _ = tx.send(Ok(tcp)).await;
            } else if let Err(e) = connection(tcp, ledger).await {
                tracing::debug!(error = %e, "ws server: connection ended");
            }
        });
    }
}

/// Serves WebSocket connections on `listener` until `stop` resolves.
pub async fn serve(
    listener: TcpListener,
    ledger: WsLedger,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        let (tcp, _) = tokio::select! {
            _ = &mut stop => return,
            r = listener.accept() => match r {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "ws server: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let ledger = ledger.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(tcp, ledger).await {
                tracing::debug!(error = %e, "ws server: connection ended");
            }
        });
    }
}

async fn connection(
    tcp: TcpStream,
    ledger: WsLedger,
) -> Result<(), tokio_tungstenite::tungstenite::Error> {
    let _ = tcp.set_nodelay(true);
    let mut params = TickParams::default();
    // The callback's signature is tungstenite's (its error is a response).
    #[allow(clippy::result_large_err)]
    let ws = tokio_tungstenite::accept_hdr_async(tcp, |req: &Request, resp: Response| {
        params = TickParams::parse(&req.uri().to_string());
        Ok(resp)
    })
    .await?;
    let (mut tx, mut rx) = ws.split();
    let padding = "x".repeat(params.size);
    let mut seq = 0u64;
    // The first tick goes out at once, as the gRPC backend's first message
    // does: a client's reconnect time ends at its first message, not a tick later.
    let mut next = params.interval.map(|_| tokio::time::Instant::now());
    loop {
        tokio::select! {
            _ = async { match next { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {
                seq += 1;
                tx.send(Message::text(format!("{} {seq} {padding}", params.id))).await?;
                ledger.record(&params.id, seq);
                next = params.interval.map(|i| tokio::time::Instant::now() + i);
            }
            m = rx.next() => match m {
                Some(Ok(Message::Close(_))) | None => break,
                Some(Ok(m @ (Message::Text(_) | Message::Binary(_)))) => tx.send(m).await?,
                // Pings are answered by tungstenite itself.
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
            },
        }
    }
    // The Close was received: tungstenite queued the answer; flush it and
    // wait for the peer to close the connection.
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        let _ = tx.close().await;
        while let Some(Ok(_)) = rx.next().await {}
    })
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_parameters_parse_and_are_bounded() {
        let p = TickParams::parse("/tick?id=ws-1&interval_ms=20&size=99999999&x=1");
        assert_eq!(p.id, "ws-1");
        assert_eq!(p.interval, Some(Duration::from_millis(20)));
        assert_eq!(p.size, MAX_TICK_BYTES);
        assert_eq!(TickParams::parse("/tick?interval_ms=0").interval, None);
    }
}
