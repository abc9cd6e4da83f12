//! What a connection driver may use of the guard: the wings (`relay/`,
//! `h1/`) and the WebSocket relay are given a [`Handle`], never the guard's
//! whole state. Through it they read the configuration, reach the
//! application, register streams and read their connection's, spawn
//! tasks, watch the drain, and count what they did. Nothing here starts or
//! ends a drain or hands out the task tracker: the stream registry, the
//! accept loop's counters, the shutdown token and the metrics registry stay
//! behind it (`tests/it/layering.rs` holds what a driver may call).

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::WaitForCancellationFuture;

use super::conn::ConnInfo;
use super::registry::{EndQueue, Refused, Registered, StreamCtl};
use super::schedule::jittered_age;
use super::upstream::{connect_tcp, Connector, UpstreamError};
use super::{lifecycle, signals, GuardConfig, Inner};
use crate::metrics::{
    Dropped, DroppedLabels, Limit, Reason, ReasonLabels, StreamProtocol, TerminatedLabels,
};

/// A driver's view of the guard. Cheap to clone; every clone is the same
/// guard.
#[derive(Clone, Debug)]
pub(crate) struct Handle {
    /// Private: a driver sees only the methods below.
    inner: Arc<Inner>,
}

impl Handle {
    /// The handle the accept loop gives each connection it serves.
    pub(super) fn new(inner: Arc<Inner>) -> Self {
        Self { inner }
    }

    /// What to proxy to and the limits.
    pub fn config(&self) -> &GuardConfig {
        &self.inner.config
    }

    /// A new TCP connection to the application, within the connect timeout.
    pub async fn connect_app(&self) -> Result<TcpStream, UpstreamError> {
        let c = &self.inner.config;
        connect_tcp(
            &self.inner.connector,
            c.upstream,
            c.limits.upstream_connect_timeout,
        )
        .await
    }

    /// How the application is reached (the HTTP/1.1 wing's own pool).
    pub fn connector(&self) -> &Connector {
        &self.inner.connector
    }

    /// Registers a stream of connection `conn`; `None` once the drain
    /// refuses new streams.
    pub fn register(&self, conn: u64, grpc: bool) -> Option<Registered> {
        self.inner.registry.register(conn, grpc)
    }

    /// Registers a stream of connection `conn`, or says why not (draining,
    /// or the process-wide stream cap).
    pub fn try_register(&self, conn: u64, grpc: bool) -> Result<Registered, Refused> {
        self.inner.registry.try_register(conn, grpc)
    }

    /// As [`Handle::try_register`], for a stream of the HTTP/2 relay: its
    /// end is asked through the connection's `queue`, as stream `id`.
    pub fn try_register_relayed(
        &self,
        conn: u64,
        grpc: bool,
        queue: &Arc<EndQueue>,
        id: u32,
    ) -> Result<Registered, Refused> {
        self.inner
            .registry
            .try_register_relayed(conn, grpc, queue, id)
    }

    /// The open streams of connection `conn`, long-lived ones first (by
    /// `long_after`).
    pub fn connection_streams(
        &self,
        conn: u64,
        now: Instant,
        long_after: Duration,
    ) -> Vec<Arc<StreamCtl>> {
        self.inner
            .registry
            .connection_streams(conn, now, long_after)
    }

    /// Every open stream, for the relay's unit tests.
    #[cfg(test)]
    pub fn open_streams(&self) -> Vec<Arc<StreamCtl>> {
        self.inner.registry.open_streams()
    }

    /// How many streams are registered, those being ended included: what
    /// a drain waits for. For the relay's unit tests.
    #[cfg(test)]
    pub fn registered(&self) -> usize {
        self.inner.registry.len()
    }

    /// The per-request signals.
    pub fn signals(&self) -> &signals::Signals {
        &self.inner.signals
    }

    /// Runs `task` on the tracker shutdown waits on.
    pub fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.inner.tasks.spawn(task);
    }

    /// Counts a connection in `active_connections` while the value lives.
    pub fn count_connection(&self) -> Live {
        self.inner.connections.fetch_add(1, Ordering::Relaxed);
        Live(self.clone())
    }

    /// Resolves once the drain asked every connection to go away.
    pub fn goaway_all(&self) -> WaitForCancellationFuture<'_> {
        self.inner.goaway.cancelled()
    }

    /// Resolves once the drain began ending every stream.
    pub fn terminate_all(&self) -> WaitForCancellationFuture<'_> {
        self.inner.terminate.cancelled()
    }

    /// Resolves once a `serve` loop shuts down: end what is left now.
    pub fn closing(&self) -> WaitForCancellationFuture<'_> {
        self.inner.closing.cancelled()
    }

    /// Whether the drain already asked connections to go away.
    pub fn goaway_all_asked(&self) -> bool {
        self.inner.goaway.is_cancelled()
    }

    /// Whether the drain already began ending every stream.
    pub fn terminating(&self) -> bool {
        self.inner.terminate.is_cancelled()
    }

    /// When a connection accepted at `accepted_at` reaches its max age,
    /// jittered ±10% per connection (every path, HTTP/1.1 included).
    fn age_at(&self, accepted_at: Instant) -> Option<Instant> {
        self.inner
            .config
            .max_connection_age
            .map(|age| accepted_at + jittered_age(age, fastrand::f64()))
    }

    /// A new HTTP/1.1 connection's max-age deadlines: when it stops taking
    /// requests (its jittered age) and when what is still open is ended
    /// (the grace counts from the age, as it does in [`lifecycle`]), so
    /// age × (1 ± 10%) + grace + the close bounds its life on either path.
    pub fn max_age(&self, accepted_at: Instant) -> Option<MaxAge> {
        let grace = self.inner.config.max_connection_age_grace;
        self.age_at(accepted_at).map(|at| MaxAge {
            at,
            grace_end: at + grace,
        })
    }

    /// A new HTTP/2 connection's lifecycle: its jittered max age, the grace
    /// and spread, the limits' timers, and whether a drain already began
    /// when it was accepted.
    pub fn lifecycle(&self, info: &ConnInfo) -> lifecycle::Lifecycle {
        let c = &self.inner.config;
        let l = c.limits;
        lifecycle::Lifecycle::new(
            lifecycle::LifecycleTerms {
                age_at: self.age_at(info.accepted_at),
                grace: c.max_connection_age_grace,
                spread: c.max_connection_age_spread,
                ack_timeout: l.goaway_ack_timeout,
                idle_timeout: l.idle_timeout,
                end_timeout: l.end_timeout,
                shutdown_timeout: l.shutdown_timeout,
                first_stream_by: info.accepted_at + l.header_read_timeout,
                watch_goaway: !self.goaway_all_asked(),
                defer_goaway: self.terminating(),
            },
            Instant::now(),
        )
    }

    /// Counts one graceful stream end, once its goodbye was written.
    pub fn record_termination(&self, reason: Reason, protocol: StreamProtocol) {
        self.inner
            .metrics
            .streams_terminated
            .get_or_create(&TerminatedLabels { reason, protocol })
            .inc();
        if reason == Reason::drain {
            self.inner
                .terminated_by_drain
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one stream the guard closed without an in-protocol goodbye
    /// (the caller logs why).
    pub fn record_ungraceful(&self, reason: Reason, protocol: StreamProtocol) {
        self.inner
            .metrics
            .streams_ungraceful
            .get_or_create(&TerminatedLabels { reason, protocol })
            .inc();
        self.count_failed();
    }

    /// Counts one ending begun at a moment no write of the application
    /// timed (see `Limits::end_settle`).
    pub fn record_blind_ending(&self, reason: Reason, protocol: StreamProtocol) {
        self.inner
            .metrics
            .streams_blind_ended
            .get_or_create(&TerminatedLabels { reason, protocol })
            .inc();
    }

    /// Counts one DATA frame of the application's, of `bytes`, that the
    /// guard dropped (the caller logs it at WARN, with its stream).
    pub fn record_dropped(&self, reason: Dropped, bytes: usize) {
        let labels = DroppedLabels { reason };
        let m = &self.inner.metrics;
        m.stream_data_dropped.get_or_create(&labels).inc();
        m.stream_data_dropped_bytes
            .get_or_create(&labels)
            .inc_by(bytes as u64);
    }

    /// Counts one stream the guard had to end because the connection to
    /// the application was lost (its client got UNAVAILABLE or a reset).
    pub fn record_app_lost(&self) {
        self.count_failed();
    }

    /// A stream without the guard's graceful end: a drain's report counts
    /// it `failed`, not `completed`.
    fn count_failed(&self) {
        self.inner.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one GOAWAY sequence started.
    pub fn record_goaway(&self, reason: Reason) {
        self.inner
            .metrics
            .goaways
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts one GOAWAY frame from an application, by its error code.
    pub fn record_app_goaway(&self, code: u32) {
        self.inner.metrics.guard_app_goaway(code).inc();
    }

    /// The counter of what `limit` refused or closed.
    pub fn limited(&self, limit: Limit) -> prometheus_client::metrics::counter::Counter {
        self.inner.metrics.guard_limited(limit)
    }
}

/// An HTTP/1.1 connection's max-age deadlines (see [`Handle::max_age`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MaxAge {
    /// No new request after this; the connection winds down.
    pub at: Instant,
    /// The streams still open are ended here.
    pub grace_end: Instant,
}

/// Keeps `active_connections` right however a connection ends.
pub(crate) struct Live(Handle);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.inner.connections.fetch_sub(1, Ordering::Relaxed);
    }
}
