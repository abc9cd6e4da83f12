//! Client side of the bench protocol: long-lived Subscribe streams that
//! record every sequence number and how they ended, seen from outside the mesh.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::proto::bench::stream_client::StreamClient;
use crate::proto::bench::SubscribeRequest;

/// Messages are sent this often on each stream: a subscription-like
/// cadence. The guard ends a stream right after a write; a pause this long
/// lets that write arrive even on a loaded machine, so nothing is lost.
pub const TICK_INTERVAL_MS: u32 = 100;

/// How a stream ended, as a gRPC client sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The server finished it (status OK).
    Completed,
    /// Ended with trailers carrying UNAVAILABLE: retryable, nothing lost in transit.
    Graceful,
    /// The connection broke or the stream was reset: a transport error.
    Cut,
    /// Any other gRPC status.
    Other(tonic::Code),
}

/// One finished client stream.
#[derive(Debug)]
pub struct StreamEnd {
    pub id: String,
    /// Every sequence number received, in order.
    pub seqs: Vec<u64>,
    /// None: status OK.
    pub status: Option<tonic::Status>,
    pub ended_at: Instant,
}

impl StreamEnd {
    /// Received 1..=n without a gap.
    pub fn gapless(&self) -> bool {
        self.seqs
            .iter()
            .enumerate()
            .all(|(i, s)| *s == i as u64 + 1)
    }

    pub fn ending(&self) -> Ending {
        match &self.status {
            None => Ending::Completed,
            Some(s) => classify(s),
        }
    }
}

/// A status that came from trailers has no transport error behind it; tonic
/// attaches the hyper/h2 error as the source when the connection broke.
pub fn classify(s: &tonic::Status) -> Ending {
    use std::error::Error;
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Internal
            if s.source().is_some() =>
        {
            Ending::Cut
        }
        tonic::Code::Unavailable => Ending::Graceful,
        tonic::Code::Ok => Ending::Completed,
        code => Ending::Other(code),
    }
}

/// Opens `n` long-lived Subscribe streams to `addr`, each on its own
/// connection, and returns once every one has received its first message.
/// Streams end when the server ends them or their connection breaks; a
/// stream still open after `limit` is dropped (bounded in time).
pub async fn open_streams(
    addr: SocketAddr,
    n: usize,
    prefix: &str,
    limit: Duration,
) -> Result<Vec<JoinHandle<StreamEnd>>, String> {
    let (ready_tx, mut ready_rx) = mpsc::channel::<Result<(), String>>(n.max(1));
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("{prefix}-{i}");
        let ready = ready_tx.clone();
        handles.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            let status = tokio::time::timeout(limit, async {
                let mut client = match StreamClient::connect(format!("http://{addr}")).await {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready.send(Err(format!("{id}: connect: {e}"))).await;
                        return Some(tonic::Status::unavailable(e.to_string()));
                    }
                };
                let req = SubscribeRequest {
                    stream_id: id.clone(),
                    count: 0,
                    interval_ms: TICK_INTERVAL_MS,
                    payload_bytes: 64,
                    ..Default::default()
                };
                let mut stream = match client.subscribe(req).await {
                    Ok(r) => r.into_inner(),
                    Err(s) => {
                        let _ = ready.send(Err(format!("{id}: subscribe: {s}"))).await;
                        return Some(s);
                    }
                };
                let mut ready = Some(ready);
                loop {
                    match stream.message().await {
                        Ok(Some(tick)) => {
                            seqs.push(tick.seq);
                            if let Some(r) = ready.take() {
                                let _ = r.send(Ok(())).await;
                            }
                        }
                        Ok(None) => return None,
                        Err(status) => return Some(status),
                    }
                }
            })
            .await
            .unwrap_or_else(|_| {
                Some(tonic::Status::deadline_exceeded(
                    "stream outlived the test limit",
                ))
            });
            StreamEnd {
                id,
                seqs,
                status,
                ended_at: Instant::now(),
            }
        }));
    }
    drop(ready_tx);
    for _ in 0..n {
        match tokio::time::timeout(limit, ready_rx.recv()).await {
            Ok(Some(Ok(()))) => {}
            Ok(Some(Err(e))) => return Err(e),
            Ok(None) | Err(_) => return Err("streams did not all start in time".into()),
        }
    }
    Ok(handles)
}
