//! The application side of one HTTP/1.1 downstream connection: the wing's
//! HTTP/1.1 client to the application, over one HTTP/1.1 connection
//! (opened by [`crate::guard::upstream`]), so an application that only
//! speaks HTTP/1.1 keeps working and HTTP/1.1 semantics (framing, trailers,
//! `Expect`) pass through untouched. It connects lazily and reconnects when the
//! application closed the previous connection.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body::Body as _;
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::guard::handle::Handle;
use crate::guard::limits::Limits;
use crate::guard::upstream::{connect_tcp, Connector, UpstreamError};

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
    /// Where the driver task runs: the guard's tracker, through its handle.
    guard: Handle,
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
    pub fn new(addr: SocketAddr, via: Connector, limits: Limits, guard: Handle) -> Self {
        Self {
            addr,
            via,
            limits,
            sender: Mutex::new(None),
            closed: CancellationToken::new(),
            guard,
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
            .max_buf_size(self.limits.buffers.max_h1_buf_size.max(MIN_H1_BUF_SIZE))
            .handshake(TokioIo::new(tcp))
            .await
            .map_err(|source| UpstreamError::H1Handshake { addr, source })?;
        if upgrade {
            self.guard.spawn(async move {
                if let Err(e) = conn.with_upgrades().await {
                    tracing::debug!(upstream = %addr, error = %e, "upstream HTTP/1.1 upgrade connection ended");
                }
            });
            return Ok(sender);
        }
        let closed = self.closed.clone();
        self.guard.spawn(async move {
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
