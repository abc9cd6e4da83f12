//! Connections to the application, one per downstream connection.
//!
//! HTTP/2 downstream connections get one HTTP/2 (prior knowledge) upstream
//! connection; HTTP/1.1 downstream connections get one HTTP/1.1 upstream
//! connection, so an application that only speaks HTTP/1.1 keeps working and
//! HTTP/1.1 semantics (framing, trailers, `Expect`) pass through untouched.
//! Both connect lazily and reconnect when the application closed the
//! previous connection. Upstream connections belong to one downstream
//! connection, which keeps flow control end to end: nothing is shared across
//! downstream connections, so one slow client never stalls another's
//! streams. HTTP/2 upstreams are a small pool that honours the
//! application's own stream limit (see [`H2Upstream`]).

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body::Body as _;
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{watch, Mutex, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::limits::Limits;

/// Why the application could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream {addr}: connect: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("upstream {addr}: no connection after {after:?}")]
    ConnectTimeout { addr: SocketAddr, after: Duration },
    #[error("upstream {addr}: HTTP/2 handshake: {source}")]
    H2Handshake {
        addr: SocketAddr,
        #[source]
        source: h2::Error,
    },
    #[error("upstream {addr}: HTTP/2: {source}")]
    H2 {
        addr: SocketAddr,
        #[source]
        source: h2::Error,
    },
    #[error("upstream {addr}: HTTP/1.1 handshake: {source}")]
    H1Handshake {
        addr: SocketAddr,
        #[source]
        source: hyper::Error,
    },
}

/// Largest window h2 accepts (2^31-1); larger configured values are clamped.
const MAX_WINDOW: u32 = (1 << 31) - 1;

/// Opens TCP connections to the application. Without one the guard connects
/// from its own network namespace; the node agent's guards connect from
/// inside a pod's.
pub trait Connect: Send + Sync + std::fmt::Debug + 'static {
    fn connect(
        &self,
        addr: SocketAddr,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<TcpStream>> + Send>>;
}

/// How a guard reaches the application: `None` is a plain connect.
pub type Connector = Option<Arc<dyn Connect>>;

pub(crate) async fn connect_tcp(
    via: &Connector,
    addr: SocketAddr,
    after: Duration,
) -> Result<TcpStream, UpstreamError> {
    let connect = async {
        match via {
            Some(c) => c.connect(addr).await,
            None => TcpStream::connect(addr).await,
        }
    };
    let tcp = tokio::time::timeout(after, connect)
        .await
        .map_err(|_| UpstreamError::ConnectTimeout { addr, after })?
        .map_err(|source| UpstreamError::Connect { addr, source })?;
    // gRPC messages are small and latency matters more than packet count.
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}

/// Streams assumed allowed on a new application connection until its
/// SETTINGS arrive (RFC 9113 recommends at least 100): h2 would otherwise
/// assume no limit and queue streams the application then refuses to open.
const INITIAL_MAX_SEND_STREAMS: usize = 100;

/// Most application connections one downstream connection may open. Envoy
/// carries a whole worker's streams on one connection; an application that
/// allows 100 streams per connection then needs several.
pub const MAX_UPSTREAM_CONNECTIONS: usize = 64;

/// A PING round trip on one application connection, shared by the streams
/// on it: "everything the application wrote before it saw this PING has
/// arrived". The application's HTTP/2 stack writes the PING's ack together
/// with (ahead of, in the same flush) whatever data it had queued, so once
/// the ack is in, data the application's transport accepted before then is
/// in the guard's receive buffers. A stream about to be ended waits for one
/// such round trip, so a message already on its way is not lost.
#[derive(Debug)]
pub struct Barrier {
    /// Round trips asked for so far (a count, so concurrent askers share one).
    requested: AtomicU64,
    /// Round trips completed: every request up to this number is satisfied.
    done: watch::Sender<u64>,
    /// Wakes the connection's driver to send a PING.
    wake: Notify,
}

impl Barrier {
    fn new() -> Self {
        Self {
            requested: AtomicU64::new(0),
            done: watch::channel(0).0,
            wake: Notify::new(),
        }
    }

    /// Resolves once a PING sent after this call was acknowledged (or the
    /// connection is gone: then nothing more can arrive anyway).
    pub async fn round_trip(&self) {
        let want = self.requested.fetch_add(1, Ordering::Relaxed) + 1;
        let mut rx = self.done.subscribe();
        self.wake.notify_one();
        let _ = rx.wait_for(|done| *done >= want).await;
    }

    /// Marks every request so far as satisfied (the connection is gone).
    fn release_all(&self) {
        let n = self.requested.load(Ordering::Relaxed);
        self.done.send_replace(n.max(u64::MAX / 2));
    }
}

/// Serves [`Barrier`] round trips and drives the connection until it ends
/// or `closed` is cancelled.
async fn drive<F>(
    conn: F,
    mut pings: Option<h2::PingPong>,
    barrier: Arc<Barrier>,
    closed: CancellationToken,
    addr: SocketAddr,
) where
    F: std::future::Future<Output = Result<(), h2::Error>>,
{
    // Created once: the connection is polled on every frame, and a turn of
    // the loop should not register and drop waiters each time.
    let closing = closed.cancelled();
    let wake = barrier.wake.notified();
    tokio::pin!(conn, closing, wake);
    // The request count the PING in flight answers.
    let mut in_flight: Option<u64> = None;
    loop {
        tokio::select! {
            biased;
            r = &mut conn => {
                if let Err(e) = r {
                    tracing::debug!(upstream = %addr, error = %e, "upstream connection ended");
                }
                break;
            }
            _ = &mut closing => break,
            _ = &mut wake, if in_flight.is_none() => {
                // Re-armed for the next request.
                wake.set(barrier.wake.notified());
                let target = barrier.requested.load(Ordering::Relaxed);
                if target <= *barrier.done.borrow() {
                    continue;
                }
                match pings.as_mut().map(|p| p.send_ping(h2::Ping::opaque())) {
                    Some(Ok(())) => in_flight = Some(target),
                    // No PING possible: answer at once rather than hang.
                    _ => {
                        barrier.done.send_replace(target);
                    }
                }
            }
            pong = std::future::poll_fn(|cx| match pings.as_mut() {
                Some(p) => p.poll_pong(cx),
                None => std::task::Poll::Pending,
            }), if in_flight.is_some() => {
                if pong.is_err() {
                    pings = None;
                }
                if let Some(target) = in_flight.take() {
                    barrier.done.send_replace(target);
                }
                if barrier.requested.load(Ordering::Relaxed) > *barrier.done.borrow() {
                    barrier.wake.notify_one();
                }
            }
        }
    }
    barrier.release_all();
}

/// A live HTTP/2 upstream connection.
#[derive(Clone, Debug)]
struct H2Conn {
    /// Opens streams on it.
    sender: h2::client::SendRequest<Bytes>,
    /// Set by the driver task once the connection ended (an atomic, not a
    /// token: it is cloned and read once per request).
    dead: Arc<AtomicBool>,
    /// PING round trips on this connection.
    barrier: Arc<Barrier>,
    /// Streams the guard has open on it (leases not yet dropped): compared
    /// with the application's SETTINGS_MAX_CONCURRENT_STREAMS.
    active: Arc<AtomicUsize>,
}

impl H2Conn {
    fn has_room(&self) -> bool {
        self.active.load(Ordering::Relaxed) < self.sender.current_max_send_streams()
    }
}

/// One stream's slot on an application connection; dropping it frees the
/// slot. Held by the stream task until the stream is over.
#[derive(Debug)]
pub struct Lease {
    /// The sender, ready for one request.
    pub sender: h2::client::SendRequest<Bytes>,
    /// PING round trips on the stream's connection.
    pub barrier: Arc<Barrier>,
    /// The connection's count of open streams.
    active: Arc<AtomicUsize>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The HTTP/2 upstream of one downstream connection: a small pool of
/// application connections. A stream goes on the first connection with room
/// under the application's own SETTINGS_MAX_CONCURRENT_STREAMS; when all are
/// full a new connection is opened (up to [`MAX_UPSTREAM_CONNECTIONS`]), so
/// streams beyond the application's limit never wait for a slot that a
/// long-lived stream holds for hours. Envoy alone would do the same.
#[derive(Debug)]
pub struct H2Upstream {
    /// The application.
    addr: SocketAddr,
    /// How to reach it.
    via: Connector,
    /// Windows, buffers and timeouts, shared with the downstream side.
    limits: Limits,
    /// The live connections; a lock so concurrent streams connect once.
    pool: Mutex<Vec<H2Conn>>,
    /// Cancelled when the downstream connection ends; stops the driver tasks.
    closed: CancellationToken,
    /// Where the driver tasks run, so the guard's shutdown waits for them.
    tasks: TaskTracker,
}

impl H2Upstream {
    pub fn new(addr: SocketAddr, via: Connector, limits: Limits, tasks: TaskTracker) -> Self {
        Self {
            addr,
            via,
            limits,
            pool: Mutex::new(Vec::new()),
            closed: CancellationToken::new(),
            tasks,
        }
    }

    /// A slot for one more stream, on a connection the application allows
    /// it on. Waits only when every allowed connection is full; the caller
    /// bounds the wait.
    pub async fn ready(&self) -> Result<Lease, UpstreamError> {
        // One retry: a connection found dead is replaced once.
        let mut retried = false;
        loop {
            let conn = self.slot().await?;
            match conn.sender.clone().ready().await {
                Ok(sender) => {
                    return Ok(Lease {
                        sender,
                        barrier: conn.barrier,
                        active: conn.active,
                    })
                }
                Err(source) => {
                    conn.active.fetch_sub(1, Ordering::Relaxed);
                    conn.dead.store(true, Ordering::Relaxed);
                    if retried {
                        return Err(UpstreamError::H2 {
                            addr: self.addr,
                            source,
                        });
                    }
                    tracing::debug!(upstream = %self.addr, error = %source, "upstream connection unusable; reconnecting");
                    retried = true;
                }
            }
        }
    }

    /// Application connections open right now.
    pub async fn connections(&self) -> usize {
        let mut pool = self.pool.lock().await;
        pool.retain(|c| !c.dead.load(Ordering::Relaxed));
        pool.len()
    }

    /// Stops the connection drivers; streams still open on them fail.
    pub fn close(&self) {
        self.closed.cancel();
    }

    /// Picks a connection with room (or opens one) and counts the stream on
    /// it, under the lock so concurrent streams do not overfill one.
    async fn slot(&self) -> Result<H2Conn, UpstreamError> {
        let mut pool = self.pool.lock().await;
        pool.retain(|c| !c.dead.load(Ordering::Relaxed));
        let conn = match pool.iter().find(|c| c.has_room()) {
            Some(c) => c.clone(),
            // Connecting is boxed: it is rare, and its state would otherwise
            // be part of every stream's.
            None if pool.len() < MAX_UPSTREAM_CONNECTIONS => {
                let c = Box::pin(self.connect()).await?;
                pool.push(c.clone());
                c
            }
            // At the cap: queue on the least busy connection (h2 waits for a
            // slot there).
            None => match pool.iter().min_by_key(|c| c.active.load(Ordering::Relaxed)) {
                Some(c) => c.clone(),
                None => Box::pin(self.connect()).await?,
            },
        };
        conn.active.fetch_add(1, Ordering::Relaxed);
        Ok(conn)
    }

    async fn connect(&self) -> Result<H2Conn, UpstreamError> {
        let addr = self.addr;
        let after = self.limits.upstream_connect_timeout;
        let tcp = connect_tcp(&self.via, addr, after).await?;
        let l = &self.limits;
        let handshake = h2::client::Builder::new()
            .initial_window_size(l.stream_window.min(MAX_WINDOW))
            .initial_connection_window_size(l.connection_window.min(MAX_WINDOW))
            .initial_max_send_streams(INITIAL_MAX_SEND_STREAMS)
            .max_send_buffer_size(l.max_send_buffer_size)
            .max_header_list_size(l.max_header_list_size)
            .max_pending_accept_reset_streams(l.max_pending_accept_reset_streams)
            .max_local_error_reset_streams(Some(l.max_local_error_reset_streams))
            .enable_push(false)
            .handshake::<_, Bytes>(tcp);
        let (sender, mut conn) = tokio::time::timeout(after, handshake)
            .await
            .map_err(|_| UpstreamError::ConnectTimeout { addr, after })?
            .map_err(|source| UpstreamError::H2Handshake { addr, source })?;
        let dead = Arc::new(AtomicBool::new(false));
        let closed = self.closed.clone();
        let done = dead.clone();
        let barrier = Arc::new(Barrier::new());
        let pings = conn.ping_pong();
        let b = barrier.clone();
        self.tasks.spawn(async move {
            drive(conn, pings, b, closed, addr).await;
            done.store(true, Ordering::Relaxed);
        });
        Ok(H2Conn {
            sender,
            dead,
            barrier,
            active: Arc::new(AtomicUsize::new(0)),
        })
    }
}

impl Drop for H2Upstream {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

/// A request body to the application: the client's, or empty for a retry
/// of a bodiless request (the client's body was consumed by the first try).
pub type H1ReqBody = Either<Incoming, Empty<Bytes>>;

/// The HTTP/1.1 upstream of one downstream connection. HTTP/1.1 carries one
/// request at a time, so one connection serves the whole downstream one.
///
/// Keep-alive race: the application may close an idle kept-alive connection
/// just as the guard sends the next request on it. hyper then hands the
/// request back unsent, and it is retried once on a fresh connection; a
/// request that was written but got no answer (the connection closed before
/// a response began) is retried once if it is idempotent and had no body,
/// as browsers and Go's HTTP client do. Anything else is a 502.
#[derive(Debug)]
pub struct H1Upstream {
    /// The application.
    addr: SocketAddr,
    /// How to reach it.
    via: Connector,
    /// Timeouts and buffer sizes.
    limits: Limits,
    /// The current connection, replaced when the application closed it.
    sender: Mutex<Option<H1Sender>>,
    /// Cancelled when the downstream connection ends; stops the driver task.
    closed: CancellationToken,
    /// Where the driver task runs.
    tasks: TaskTracker,
}

type H1Sender = hyper::client::conn::http1::SendRequest<H1ReqBody>;

/// Methods a request of which may be sent twice (RFC 9110 §9.2.2).
fn idempotent(m: &http::Method) -> bool {
    use http::Method;
    [
        Method::GET,
        Method::HEAD,
        Method::OPTIONS,
        Method::TRACE,
        Method::PUT,
        Method::DELETE,
    ]
    .contains(m)
}

impl H1Upstream {
    pub fn new(addr: SocketAddr, via: Connector, limits: Limits, tasks: TaskTracker) -> Self {
        Self {
            addr,
            via,
            limits,
            sender: Mutex::new(None),
            closed: CancellationToken::new(),
            tasks,
        }
    }

    /// Sends one request and returns the response head and body.
    pub async fn send(
        &self,
        req: http::Request<Incoming>,
    ) -> Result<http::Response<Incoming>, H1SendError> {
        // A bodiless idempotent request can be rebuilt for a retry.
        let replay = (idempotent(req.method()) && req.body().is_end_stream()).then(|| {
            let mut head = http::Request::new(());
            *head.method_mut() = req.method().clone();
            *head.uri_mut() = req.uri().clone();
            *head.version_mut() = req.version();
            *head.headers_mut() = req.headers().clone();
            head
        });
        let (fut, reused) = {
            let mut slot = self.sender.lock().await;
            let (mut sender, reused) = match slot.take() {
                Some(s) if !s.is_closed() => (s, true),
                _ => (self.connect(false).await?, false),
            };
            // A kept-alive connection is ready because the previous response
            // finished (HTTP/1.1 is sequential); a fresh one at once.
            let reused = if sender.ready().await.is_err() {
                sender = self.connect(false).await?;
                self.ready(&mut sender).await?;
                false
            } else {
                reused
            };
            let fut = sender.try_send_request(req.map(Either::Left));
            *slot = Some(sender);
            (fut, reused)
        };
        let err = match fut.await {
            Ok(r) => return Ok(r),
            Err(e) => e,
        };
        let mut err = err;
        let retry = match (err.take_message(), replay) {
            // Never written: the connection was found closed first.
            (Some(unsent), _) if reused => Some(unsent),
            // Written, but the connection closed before any response.
            (_, Some(head)) if reused && err.error().is_incomplete_message() => {
                Some(head.map(|()| Either::Right(Empty::new())))
            }
            _ => None,
        };
        let Some(req) = retry else {
            return Err(H1SendError::Request {
                addr: self.addr,
                source: err.into_error(),
            });
        };
        tracing::debug!(upstream = %self.addr, error = %err.error(), "upstream keep-alive connection closed under a request; retrying it once on a new connection");
        let fut = {
            let mut slot = self.sender.lock().await;
            let mut sender = self.connect(false).await?;
            self.ready(&mut sender).await?;
            let fut = sender.send_request(req);
            *slot = Some(sender);
            fut
        };
        fut.await.map_err(|source| H1SendError::Request {
            addr: self.addr,
            source,
        })
    }

    /// Sends an upgrade request (a WebSocket handshake) on a connection of
    /// its own, which hyper hands over on a 101. The connection is not tied
    /// to the downstream connection's lifetime: after the 101 both are
    /// relayed by the upgrade's own task.
    pub async fn send_upgrade(
        &self,
        req: http::Request<Incoming>,
    ) -> Result<http::Response<Incoming>, H1SendError> {
        let mut sender = self.connect(true).await?;
        self.ready(&mut sender).await?;
        sender
            .send_request(req.map(Either::Left))
            .await
            .map_err(|source| H1SendError::Request {
                addr: self.addr,
                source,
            })
    }

    async fn ready(&self, sender: &mut H1Sender) -> Result<(), H1SendError> {
        sender.ready().await.map_err(|source| H1SendError::Request {
            addr: self.addr,
            source,
        })
    }

    /// Stops the connection driver.
    pub fn close(&self) {
        self.closed.cancel();
    }

    /// A new connection. `upgrade`: driven with upgrades on and detached
    /// from `closed`, so the 101's connection outlives this upstream.
    async fn connect(&self, upgrade: bool) -> Result<H1Sender, UpstreamError> {
        let addr = self.addr;
        let tcp = connect_tcp(&self.via, addr, self.limits.upstream_connect_timeout).await?;
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .max_buf_size(self.limits.max_h1_buf_size.max(MIN_H1_BUF_SIZE))
            .handshake(TokioIo::new(tcp))
            .await
            .map_err(|source| UpstreamError::H1Handshake { addr, source })?;
        if upgrade {
            self.tasks.spawn(async move {
                if let Err(e) = conn.with_upgrades().await {
                    tracing::debug!(upstream = %addr, error = %e, "upstream HTTP/1.1 upgrade connection ended");
                }
            });
            return Ok(sender);
        }
        let closed = self.closed.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                r = conn => if let Err(e) = r {
                    tracing::debug!(upstream = %addr, error = %e, "upstream HTTP/1.1 connection ended");
                },
                _ = closed.cancelled() => {}
            }
        });
        Ok(sender)
    }
}

impl Drop for H1Upstream {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

/// hyper refuses HTTP/1.1 buffers smaller than this.
pub const MIN_H1_BUF_SIZE: usize = 8192;

/// Why an HTTP/1.1 request could not be forwarded.
#[derive(Debug, thiserror::Error)]
pub enum H1SendError {
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error("upstream {addr}: HTTP/1.1: {source}")]
    Request {
        addr: SocketAddr,
        #[source]
        source: hyper::Error,
    },
}
