//! A population of long-lived streams that behaves like real clients: each
//! holds one gRPC Subscribe stream or one WebSocket (tick stream of the
//! bench app, see [`super::ws`]) and, when it ends, reconnects to a live
//! endpoint with jittered exponential backoff. Everything is recorded from
//! the client side, outside the mesh.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::client::{classify, Ending};
use crate::proto::bench::stream_client::StreamClient;
use crate::proto::bench::SubscribeRequest;

/// gRPC-style reconnect backoff: 100 ms initial, x1.6, ±20% jitter, 2 s cap.
const BACKOFF_INITIAL: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Any single connect or first message must come within this, or it failed.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Which kind of long-lived stream a population holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// gRPC server streams (Subscribe).
    Grpc,
    /// WebSockets (HTTP/1.1 Upgrade) with server ticks.
    Websocket,
    /// Half of each (clients alternate in pairs, so that each kind is on
    /// both pods: endpoints are picked by client parity).
    Mixed,
}

/// One stream's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamKind {
    Grpc,
    Websocket,
}

// === impl StreamKind ===

impl StreamKind {
    pub fn name(self) -> &'static str {
        match self {
            StreamKind::Grpc => "grpc",
            StreamKind::Websocket => "websocket",
        }
    }
}

// === impl Protocol ===

impl Protocol {
    /// The kind of stream client `c` holds.
    pub fn kind_of(self, c: usize) -> StreamKind {
        match self {
            Protocol::Grpc => StreamKind::Grpc,
            Protocol::Websocket => StreamKind::Websocket,
            Protocol::Mixed if (c / 2).is_multiple_of(2) => StreamKind::Grpc,
            Protocol::Mixed => StreamKind::Websocket,
        }
    }

    /// The kinds present.
    pub fn kinds(self) -> Vec<StreamKind> {
        match self {
            Protocol::Grpc => vec![StreamKind::Grpc],
            Protocol::Websocket => vec![StreamKind::Websocket],
            Protocol::Mixed => vec![StreamKind::Grpc, StreamKind::Websocket],
        }
    }
}

/// One stream's life on one endpoint.
#[derive(Clone, Debug)]
pub struct Session {
    pub client: usize,
    /// gRPC stream or WebSocket.
    pub kind: StreamKind,
    /// Index into the endpoint list.
    pub endpoint: usize,
    pub stream_id: String,
    /// When the first message arrived.
    pub started: Instant,
    pub ended: Instant,
    pub ending: Ending,
    /// The last sequence number received.
    pub last_seq: u64,
    /// A sequence number was skipped (never expected: TCP is ordered).
    pub gap: bool,
    /// From the previous session's end to this one's first message.
    pub reconnect: Option<Duration>,
}

/// The live endpoint set, as a load balancer would see it after endpoint
/// removal. Clients pick among the endpoints marked live.
#[derive(Clone, Debug)]
pub struct Endpoints {
    addrs: Vec<SocketAddr>,
    live: watch::Sender<Vec<bool>>,
}

// === impl Endpoints ===

impl Endpoints {
    pub fn new(addrs: Vec<SocketAddr>) -> Self {
        let live = vec![true; addrs.len()];
        Self {
            addrs,
            live: watch::channel(live).0,
        }
    }

    /// Takes an endpoint out of rotation (deregistration).
    pub fn remove(&self, i: usize) {
        self.live.send_modify(|l| l[i] = false);
    }

    /// Puts an endpoint back into rotation (a new pod at its address).
    pub fn restore(&self, i: usize) {
        self.live.send_modify(|l| l[i] = true);
    }

    /// A live endpoint, spreading clients by their index.
    fn pick(&self, client: usize, attempt: usize) -> Option<(usize, SocketAddr)> {
        let live = self.live.borrow();
        let ids: Vec<usize> = (0..self.addrs.len()).filter(|i| live[*i]).collect();
        if ids.is_empty() {
            return None;
        }
        let i = ids[(client + attempt) % ids.len()];
        Some((i, self.addrs[i]))
    }
}

/// The running population.
pub struct Population {
    pub sessions: Arc<Mutex<Vec<Session>>>,
    /// Subscribe attempts and the ones that got a first message.
    pub attempts: Arc<Mutex<(u64, u64)>>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

// === impl Population ===

impl Population {
    /// Starts `n` clients; returns once every one holds a live stream.
    /// Each stream's server sends a message every `tick`.
    pub async fn start(
        n: usize,
        endpoints: Endpoints,
        prefix: &str,
        protocol: Protocol,
        payload_bytes: &[u32],
        tick: Duration,
    ) -> Result<Self, String> {
        let tick_ms = u32::try_from(tick.as_millis())
            .map_err(|_| format!("a tick of {tick:?} is too long"))?
            .max(1);
        let sessions = Arc::new(Mutex::new(Vec::new()));
        let attempts = Arc::new(Mutex::new((0u64, 0u64)));
        let stop = CancellationToken::new();
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(n.max(1));
        let tasks = (0..n)
            .map(|c| {
                let ctx = ClientCtx {
                    client: c,
                    kind: protocol.kind_of(c),
                    payload: if payload_bytes.is_empty() {
                        64
                    } else {
                        payload_bytes[c % payload_bytes.len()]
                    },
                    tick_ms,
                    prefix: prefix.to_string(),
                    endpoints: endpoints.clone(),
                    sessions: sessions.clone(),
                    attempts: attempts.clone(),
                    stop: stop.clone(),
                    ready: Some(ready_tx.clone()),
                };
                tokio::spawn(ctx.run())
            })
            .collect();
        drop(ready_tx);
        let deadline = Instant::now() + Duration::from_secs(30);
        for i in 0..n {
            match tokio::time::timeout_at(deadline, ready_rx.recv()).await {
                Ok(Some(())) => {}
                _ => return Err(format!("only {i} of {n} streams started within 30 s")),
            }
        }
        Ok(Self {
            sessions,
            attempts,
            stop,
            tasks,
        })
    }

    /// Stops every client and waits for them (bounded).
    pub async fn stop(self) -> Vec<Session> {
        self.stop.cancel();
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        let sessions = self.sessions.lock().map(|s| s.clone()).unwrap_or_default();
        sessions
    }

    /// Sessions recorded so far.
    pub fn snapshot(&self) -> Vec<Session> {
        self.sessions.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

struct ClientCtx {
    client: usize,
    kind: StreamKind,
    /// Bytes of padding per message on this client's streams.
    payload: u32,
    /// Between two of the server's messages on this client's streams.
    tick_ms: u32,
    prefix: String,
    endpoints: Endpoints,
    sessions: Arc<Mutex<Vec<Session>>>,
    attempts: Arc<Mutex<(u64, u64)>>,
    stop: CancellationToken,
    ready: Option<tokio::sync::mpsc::Sender<()>>,
}

// === impl ClientCtx ===

impl ClientCtx {
    async fn run(mut self) {
        let mut attempt = 0usize;
        let mut backoff = BACKOFF_INITIAL;
        let mut last_end: Option<Instant> = None;
        // Bounded: one client makes at most this many attempts in a run.
        for _ in 0..10_000 {
            if self.stop.is_cancelled() {
                return;
            }
            let Some((endpoint, addr)) = self.endpoints.pick(self.client, attempt) else {
                self.sleep(backoff).await;
                continue;
            };
            attempt += 1;
            let stream_id = format!("{}-{}-{attempt}", self.prefix, self.client);
            if let Ok(mut a) = self.attempts.lock() {
                a.0 += 1;
            }
            match self.session(endpoint, addr, &stream_id, last_end).await {
                Some(s) => {
                    if let Ok(mut a) = self.attempts.lock() {
                        a.1 += 1;
                    }
                    backoff = BACKOFF_INITIAL;
                    last_end = Some(s.ended);
                    let graceful = matches!(s.ending, Ending::Graceful | Ending::Completed);
                    if let Ok(mut all) = self.sessions.lock() {
                        all.push(s);
                    }
                    if self.stop.is_cancelled() {
                        return;
                    }
                    // A graceful end means "reconnect now"; a cut waits a little.
                    if !graceful {
                        self.sleep(jitter(backoff)).await;
                    }
                }
                None => {
                    self.sleep(jitter(backoff)).await;
                    backoff = (backoff.mul_f64(1.6)).min(BACKOFF_MAX);
                }
            }
        }
    }

    async fn sleep(&self, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.stop.cancelled() => {}
        }
    }

    /// One stream of this client's kind.
    async fn session(
        &mut self,
        endpoint: usize,
        addr: SocketAddr,
        stream_id: &str,
        last_end: Option<Instant>,
    ) -> Option<Session> {
        match self.kind {
            StreamKind::Grpc => self.grpc_session(endpoint, addr, stream_id, last_end).await,
            StreamKind::Websocket => self.ws_session(endpoint, addr, stream_id, last_end).await,
        }
    }

    /// One WebSocket: connect, read ticks to the end. A Close 1012 or 1001
    /// (the guard's, or a server going away) is graceful; a connection that
    /// ends without a Close frame (1006) is cut.
    async fn ws_session(
        &mut self,
        endpoint: usize,
        addr: SocketAddr,
        stream_id: &str,
        last_end: Option<Instant>,
    ) -> Option<Session> {
        use futures_util::StreamExt;
        use tokio_tungstenite::tungstenite::Message;
        let url = format!(
            "ws://{addr}/tick?id={stream_id}&interval_ms={}&size={}",
            self.tick_ms, self.payload
        );
        let seq_of = |m: &Message| -> Option<u64> {
            let Message::Text(t) = m else { return None };
            t.split(' ').nth(1)?.parse().ok()
        };
        let open = async {
            let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.ok()?;
            loop {
                let m = ws.next().await?.ok()?;
                if let Some(seq) = seq_of(&m) {
                    return Some((ws, seq));
                }
            }
        };
        let (mut ws, first_seq) = tokio::time::timeout(ATTEMPT_TIMEOUT, open).await.ok()??;
        let started = Instant::now();
        if let Some(r) = self.ready.take() {
            let _ = r.send(()).await;
        }
        let mut last_seq = first_seq;
        let mut gap = first_seq != 1;
        let mut close_code = None;
        let ending = loop {
            tokio::select! {
                m = ws.next() => match m {
                    Some(Ok(Message::Close(f))) => {
                        close_code = Some(f.map_or(1005, |f| u16::from(f.code)));
                    }
                    Some(Ok(m)) => {
                        if let Some(seq) = seq_of(&m) {
                            gap |= seq != last_seq + 1;
                            last_seq = seq;
                        }
                    }
                    // tungstenite ends the stream after a completed close handshake.
                    None => break match close_code {
                        Some(1012 | 1001) => Ending::Graceful,
                        Some(_) => Ending::Completed,
                        None => Ending::Cut,
                    },
                    Some(Err(_)) => break if close_code.is_some() { Ending::Graceful } else { Ending::Cut },
                },
                _ = self.stop.cancelled() => {
                    let _ = tokio::time::timeout(ATTEMPT_TIMEOUT, ws.close(None)).await;
                    break Ending::Completed;
                }
            }
        };
        Some(Session {
            client: self.client,
            kind: StreamKind::Websocket,
            endpoint,
            stream_id: stream_id.to_string(),
            started,
            ended: Instant::now(),
            ending,
            last_seq,
            gap,
            reconnect: last_end.map(|e| started.saturating_duration_since(e)),
        })
    }

    /// One gRPC stream: connect, subscribe, read to the end. None if it never
    /// delivered a first message.
    async fn grpc_session(
        &mut self,
        endpoint: usize,
        addr: SocketAddr,
        stream_id: &str,
        last_end: Option<Instant>,
    ) -> Option<Session> {
        let open = async {
            let mut client = StreamClient::connect(format!("http://{addr}")).await.ok()?;
            let req = SubscribeRequest {
                stream_id: stream_id.to_string(),
                count: 0,
                interval_ms: self.tick_ms,
                payload_bytes: self.payload,
                ..Default::default()
            };
            let mut stream = client.subscribe(req).await.ok()?.into_inner();
            let first = stream.message().await.ok()??;
            Some((stream, first.seq))
        };
        let (mut stream, first_seq) = tokio::time::timeout(ATTEMPT_TIMEOUT, open).await.ok()??;
        let started = Instant::now();
        if let Some(r) = self.ready.take() {
            let _ = r.send(()).await;
        }
        let mut last_seq = first_seq;
        let mut gap = first_seq != 1;
        let ending = loop {
            tokio::select! {
                msg = stream.message() => match msg {
                    Ok(Some(t)) => {
                        gap |= t.seq != last_seq + 1;
                        last_seq = t.seq;
                    }
                    Ok(None) => break Ending::Completed,
                    Err(status) => break classify(&status),
                },
                // The run is over: the client hangs up by itself.
                _ = self.stop.cancelled() => break Ending::Completed,
            }
        };
        Some(Session {
            client: self.client,
            kind: StreamKind::Grpc,
            endpoint,
            stream_id: stream_id.to_string(),
            started,
            ended: Instant::now(),
            ending,
            last_seq,
            gap,
            reconnect: last_end.map(|e| started.saturating_duration_since(e)),
        })
    }
}

/// ±20% jitter, so clients cut together do not come back together.
fn jitter(d: Duration) -> Duration {
    d.mul_f64(0.8 + fastrand::f64() * 0.4)
}
