//! `drainshim bench server`: a tonic streaming backend that stamps every
//! message with a sequence number, so a client can count what it lost.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{Stream as FuturesStream, StreamExt};
use tokio::net::TcpListener;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::proto::bench::stream_server::{Stream, StreamServer};
use crate::proto::bench::{EchoReply, EchoRequest, SubscribeRequest, Tick};

/// Largest padding a client may ask for per message; bounds memory per stream.
pub const MAX_PAYLOAD_BYTES: u32 = 1 << 20;
/// Largest burst per tick; bounds the per-stream queue.
pub const MAX_BURST: u32 = 64;
/// Longest work time an Echo may ask for.
pub const MAX_DELAY_MS: u32 = 60_000;

/// Per stream id, the highest sequence number handed to the transport
/// (taken by tonic for encoding).
#[derive(Clone, Debug, Default)]
pub struct Ledger(Arc<Mutex<HashMap<String, u64>>>);

impl Ledger {
    pub(crate) fn record(&self, stream_id: &str, seq: u64) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(stream_id.to_string(), seq);
        }
    }

    /// The last sequence number written on `stream_id`, if any.
    pub fn last_written(&self, stream_id: &str) -> Option<u64> {
        self.0.lock().ok()?.get(stream_id).copied()
    }

    /// Messages the app handed its transport on `sessions`' streams that
    /// their clients never got, plus one for each session that saw a gap.
    pub fn lost<'a>(
        &self,
        sessions: impl IntoIterator<Item = &'a super::population::Session>,
    ) -> u64 {
        sessions
            .into_iter()
            .map(|s| {
                let written = self.last_written(&s.stream_id).unwrap_or(s.last_seq);
                written.saturating_sub(s.last_seq) + u64::from(s.gap)
            })
            .sum()
    }
}

/// The service. `Subscribe` sends `count` ticks (0 = until cancelled).
#[derive(Clone, Debug, Default)]
pub struct BenchService {
    pub ledger: Ledger,
    /// Faults to inject into `Echo`, changeable while serving.
    pub faults: Faults,
}

/// `Echo` faults for tests of what the guard and `verify` see: a fixed
/// share of calls failing with UNAVAILABLE, and extra latency.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Every n-th call fails with UNAVAILABLE (0: none): exactly 1/n of them.
    pub unavailable_every: Arc<AtomicU64>,
    /// Added to every call, milliseconds.
    pub delay_ms: Arc<AtomicU64>,
    /// Calls so far, for `unavailable_every`.
    calls: Arc<AtomicU64>,
}

type TickStream = Pin<Box<dyn FuturesStream<Item = Result<Tick, Status>> + Send>>;

#[tonic::async_trait]
impl Stream for BenchService {
    type SubscribeStream = TickStream;

    async fn subscribe(
        &self,
        req: Request<SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let peer = req.remote_addr();
        let r = req.into_inner();
        if r.payload_bytes > MAX_PAYLOAD_BYTES {
            return Err(Status::invalid_argument(format!(
                "payload_bytes {} exceeds {MAX_PAYLOAD_BYTES}",
                r.payload_bytes
            )));
        }
        // A small buffer (a burst fits whole, so it is taken in one go):
        // backpressure reaches the sender quickly.
        let burst = u64::from(r.burst.clamp(1, MAX_BURST));
        let (tx, rx) = tokio::sync::mpsc::channel(4.max(burst as usize));
        let interval = Duration::from_millis(u64::from(r.interval_ms));
        // A test waits on this line; the peer tells which connection carries it.
        tracing::debug!(stream_id = %r.stream_id, peer = %peer.map_or("unknown".into(), |p| p.to_string()), "bench server: subscribe");
        let note = EndNote {
            ledger: self.ledger.clone(),
            stream_id: r.stream_id.clone(),
        };
        tokio::spawn(async move {
            let payload = vec![0u8; r.payload_bytes as usize];
            let mut seq = 0u64;
            while r.count == 0 || seq < r.count {
                for _ in 0..burst {
                    if r.count != 0 && seq >= r.count {
                        break;
                    }
                    seq += 1;
                    let tick = Tick {
                        stream_id: r.stream_id.clone(),
                        seq,
                        payload: payload.clone(),
                    };
                    if tx.send(Ok(tick)).await.is_err() {
                        // The client went away.
                        return;
                    }
                }
                if !interval.is_zero() {
                    // A quiet stream's pause ends with the call, not minutes later.
                    tokio::select! {
                        _ = tokio::time::sleep(interval) => {}
                        _ = tx.closed() => return,
                    }
                }
            }
        });
        // A message counts as written once tonic takes it for encoding: from
        // then on only the transport can lose it. The note goes with the
        // stream, and speaks when the call is over.
        let stream = ReceiverStream::new(rx).inspect(move |item| {
            if let Ok(tick) = item {
                note.ledger.record(&tick.stream_id, tick.seq);
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn echo(&self, req: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let r = req.into_inner();
        // A test waits on this line to know a call reached the server.
        tracing::debug!(body = %r.body, delay_ms = r.delay_ms, "bench server: echo started");
        let extra = self.faults.delay_ms.load(Ordering::Relaxed);
        if extra > 0 {
            tokio::time::sleep(Duration::from_millis(extra.min(u64::from(MAX_DELAY_MS)))).await;
        }
        let every = self.faults.unavailable_every.load(Ordering::Relaxed);
        let n = self.faults.calls.fetch_add(1, Ordering::Relaxed) + 1;
        if every > 0 && n.is_multiple_of(every) {
            return Err(Status::unavailable("bench: injected failure"));
        }
        if r.delay_ms > 0 {
            let delay = Duration::from_millis(u64::from(r.delay_ms.min(MAX_DELAY_MS)));
            tokio::time::sleep(delay).await;
        }
        Ok(Response::new(EchoReply { body: r.body }))
    }
}

/// Says, when a Subscribe call's response stream is dropped (the call
/// is over: completed, cancelled, or its connection gone), the last message
/// tonic took: a test compares it with what its client received.
struct EndNote {
    ledger: Ledger,
    stream_id: String,
}

impl Drop for EndNote {
    fn drop(&mut self) {
        let last = self.ledger.last_written(&self.stream_id).unwrap_or(0);
        tracing::debug!(stream_id = %self.stream_id, last_written = last, "bench server: stream ended");
    }
}

/// Serves the bench service on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    service: BenchService,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(StreamServer::new(service))
        // gRPC servers run with TCP_NODELAY (grpc-go and tonic's own bind do):
        // without it Nagle holds each small message until the next write.
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}

/// Binds `addr` and serves until `shutdown`; returns the bound address via the log.
pub async fn run(
    addr: SocketAddr,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // The accept queue of a Go or Java server (net.core.somaxconn), not tokio's 128.
    let listener = drainshim::guard::bind_listener(addr)
        .map_err(|e| format!("bench server: bind {addr}: {e}"))?;
    tracing::info!(addr = %listener.local_addr()?, "bench server listening");
    let shutdown = async {
        shutdown.await;
        // tonic's graceful shutdown: GOAWAY on every connection, then it
        // waits for the calls in flight (however long they last).
        tracing::info!("bench server: shutting down gracefully");
    };
    serve(listener, BenchService::default(), shutdown).await?;
    tracing::info!("bench server: stopped");
    Ok(())
}
