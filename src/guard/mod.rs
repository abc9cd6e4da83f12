//! The stream guard: an HTTP/2 (h2c, prior knowledge) and HTTP/1.1 reverse
//! proxy in front of the application port, and the only component that can
//! end a long-lived gRPC stream cleanly (docs/design.md, "Stream guard").
//!
//! It owns these behaviours:
//! - **Proxying**, full duplex with flow control end to end: each HTTP/2
//!   downstream connection gets one HTTP/2 connection to the application,
//!   its frames relayed; each HTTP/1.1 one, one HTTP/1.1 connection.
//! - **Graceful stream end**: a gRPC stream is ended with trailers
//!   `grpc-status: 14` and a `grpc-message` saying why, after the data the
//!   application already produced is flushed, on a message boundary; the
//!   upstream stream is cancelled afterwards. Non-gRPC streams are let
//!   finish and reset (never truncated with END_STREAM) if they cannot.
//! - **Max connection age** (gRPC A9 with ±10% jitter): GOAWAY(2^31-1),
//!   PING, GOAWAY(last stream) on the ack or after a bounded wait, the
//!   grace, then the graceful end of what is left, then close.
//! - **Drain**: [`StreamGuard::goaway_all`] and [`StreamGuard::terminate_all`]
//!   (endings spread evenly over a window; new streams refused retryably).
//! - **Limits** ([`Limits`]) against greedy or slow clients.
//!
//! Its rooms: two wings around a core. A connection is accepted and sniffed
//! in `accept`, then served by the wing of its protocol; the wings import
//! the core and never each other (`tests/it/layering.rs` holds it).
//!
//! ```text
//!                    accept (sniff: HTTP/2 preface or not)
//!                   /                                     \
//!   relay/  the HTTP/2 path                     h1/  HTTP/1.1 and its
//!   frames relayed to one app connection,            WebSocket upgrades,
//!   or the client served alone; HPACK,               one app connection
//!   admission, graceful ends, GOAWAY,                (hyper)
//!   WebSockets over extended CONNECT
//!                   \                                     /
//!   core: lifecycle (when a connection goes away), registry (every stream,
//!   and the ends a drain asks), push (ending what a config push drains),
//!   body and grpc (message boundaries),
//!   websocket (a WebSocket's two byte streams and their Close), signals, limits,
//!   schedule (spreads, jitter), sniff, upstream (connecting to the app),
//!   conn, headers, keepalive, passthrough; and handle: all a driver is
//!   given of the guard: the config, a way to reach the app, a stream
//!   registered and its connection's streams read, a task spawned that the
//!   shutdown waits for, its connection counted, the drain's signals to
//!   watch, a connection's max age and lifecycle, counters; never the
//!   registry, the task tracker, the metrics registry or a way to start or
//!   end a drain
//! ```
//!
//! Which file serves an HTTP/2 request: `relay/client/` reads it and
//! `relay/admit.rs` lets it through; `relay/app.rs` carries its answer;
//! `relay/ends.rs` ends it gracefully, by the rules of `relay/ending/` (how
//! a stream ends: its rules and outcomes, the cadence, its state; the
//! relay's alone, so it lives there, not in the core).

mod accept;
mod body;
mod conn;
mod grpc;
mod h1;
mod handle;
mod headers;
mod keepalive;
mod lifecycle;
mod limits;
mod passthrough;
mod push;
mod registry;
mod relay;
mod schedule;
mod signals;
mod sniff;
pub mod upstream;
mod websocket;
// Public for the `hpack` fuzz target; nothing outside the guard uses it.
#[doc(hidden)]
pub use relay::feed::FeedStep;
#[doc(hidden)]
pub use relay::wire;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::drain::{PushDrain, StreamGuard};
use crate::metrics::{Metrics, Reason};

pub use accept::{bind_listener, LISTEN_BACKLOG};
pub use grpc::{end_message, Framer, REFUSED_MESSAGE};
pub use limits::{BufferLimits, FloodLimits, Rate};
pub use limits::{Limits, DEFAULT_END_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_STREAMS};
pub use schedule::{jittered_age, spread_offsets, AGE_JITTER};
pub use signals::{grpc_service, SignalSettings, DEFAULT_MAX_SERVICES};
pub use sniff::H2_PREFACE;
pub use upstream::{Connect, Connector};

/// What the guard proxies to and when it ends connections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardConfig {
    /// The application's port; every request is forwarded there.
    pub upstream: SocketAddr,
    /// Connections are told to go away after about this long (±10% jitter);
    /// None (the default) lets connections live as long as their clients want.
    pub max_connection_age: Option<Duration>,
    /// After max age, how long streams may still run before they are ended.
    pub max_connection_age_grace: Duration,
    /// After the grace, the connection's remaining streams are ended spread
    /// over this window: behind Envoy one pooled connection carries many
    /// streams, and ending them at once would be a reconnect storm.
    pub max_connection_age_spread: Duration,
    /// An answered stream open this long counts as long-lived even if it
    /// carried fewer than two response messages: a drain ends long-lived
    /// streams early, spread over its window, and leaves the rest (unary
    /// calls, calls the application has not answered) to finish.
    pub long_stream_age: Duration,
    /// When the application sends GOAWAY on a connection (its own graceful
    /// stop), that connection's long-lived streams are ended spread over
    /// this window (frame relay): the app's grace would otherwise cut them.
    pub app_shutdown_spread: Duration,
    /// Resource limits per connection.
    pub limits: Limits,
    /// The per-request golden signals (see [`signals`]).
    pub signals: SignalSettings,
}

impl GuardConfig {
    /// Defaults for everything but the upstream: no max age, the gRPC A9
    /// default grace, default limits.
    pub fn new(upstream: SocketAddr) -> Self {
        Self {
            upstream,
            max_connection_age: None,
            max_connection_age_grace: crate::config::DEFAULT_MAX_CONNECTION_AGE_GRACE.get(),
            max_connection_age_spread: crate::config::DEFAULT_MAX_CONNECTION_AGE_SPREAD.get(),
            app_shutdown_spread: crate::config::DEFAULT_APP_SHUTDOWN_SPREAD.get(),
            long_stream_age: crate::config::DEFAULT_LONG_STREAM_AGE.get(),
            limits: Limits::default(),
            signals: SignalSettings::default(),
        }
    }
}

/// The stream guard. Cheap to clone; every clone is the same guard.
#[derive(Clone, Debug)]
pub struct Guard {
    /// Shared with every connection and stream task.
    inner: Arc<Inner>,
}

/// State shared by the accept loop, connections, streams and the drain.
#[derive(Debug)]
struct Inner {
    /// What to proxy to and the limits.
    config: GuardConfig,
    /// How to reach `config.upstream` (None: a plain connect).
    connector: Connector,
    /// `goaways_total` and `streams_terminated_total` live here.
    metrics: Metrics,
    /// Every open stream, and whether new ones are admitted.
    registry: Arc<registry::Registry>,
    /// Cancelled by `goaway_all`: connections open at that moment go away.
    goaway: CancellationToken,
    /// Cancelled by `terminate_all`: every connection goes away and closes
    /// once its streams have ended.
    terminate: CancellationToken,
    /// Cancelled when a `serve` loop shuts down: pending spread schedules end
    /// their remaining streams at once.
    closing: CancellationToken,
    /// Every connection, stream and schedule task, so shutdown can wait for them.
    tasks: TaskTracker,
    /// Downstream connections open right now.
    connections: AtomicU64,
    /// Next connection id (for logs and the registry).
    next_connection: AtomicU64,
    /// Streams ended gracefully because of the drain.
    terminated_by_drain: AtomicU64,
    /// Streams ended without the guard's graceful end (the drain report's `failed`).
    failed: AtomicU64,
    /// Per-request signals: outcome, latency and streams per service.
    signals: signals::Signals,
}

/// How often a drain looks for streams that became long-lived since it
/// began (a server stream whose second message arrived, say).
const RECHECK: Duration = Duration::from_millis(250);

/// Slack before the drain's deadline: the sweep of short calls ends them
/// this long before `deadline - end_timeout`, for the trailers to flush.
/// (An ending cancelled at the end of its `end_settle` gets at least 2 s
/// for the app's ack: if it takes them all, that ends at the deadline.)
pub const SWEEP_MARGIN: Duration = Duration::from_secs(1);

/// How long a short call still open at the end of a hand-off's window may
/// go on before it is ended: a unary call the application is still working
/// on has nothing graceful to end it with (an answer of the guard's own
/// fails it), so it is left to finish, as in a drain, up to its deadline.
pub const HAND_OFF_CALL_GRACE: Duration = Duration::from_secs(30);

/// The drain's stream endings. Long-lived streams are ended one by one,
/// evenly over `window` (streams that become long-lived later join the rest
/// of the window); everything else is left to finish on its own until
/// `deadline - end_timeout - SWEEP_MARGIN` (never before the window's end),
/// when whatever is still open is ended. Returns once no stream is left, or
/// at once when the guard shuts down.
async fn terminator(inner: Arc<Inner>, window: Duration, deadline: Duration) {
    let start = Instant::now();
    let window_end = start + window;
    let l = &inner.config.limits;
    let sweep_at = start
        + deadline
            .saturating_sub(l.end_timeout + SWEEP_MARGIN)
            .max(window);
    let long_after = inner.config.long_stream_age;
    // Due endings, in time order.
    let mut due: schedule::Due<Arc<registry::StreamCtl>> = schedule::Due::new();
    // The window's end was logged (the calls left open then).
    let mut window_over = false;
    loop {
        let now = Instant::now();
        if !window_over && now >= window_end && now < sweep_at {
            window_over = true;
            let open = inner.registry.len();
            if open > 0 {
                tracing::info!(
                    streams = open,
                    left = ?sweep_at.saturating_duration_since(now),
                    "guard: window over; the calls still open are left to finish"
                );
            }
        }
        if now >= sweep_at {
            let rest = inner.registry.open_streams();
            if !rest.is_empty() {
                tracing::info!(
                    streams = rest.len(),
                    "guard: drain deadline near; ending the calls still open"
                );
            }
            rest.into_iter().for_each(|s| s.end(Reason::drain));
            return;
        }
        let fresh = inner.registry.take_long_lived(now, long_after);
        schedule::spread_into(
            &mut due,
            fresh,
            now,
            window_end.saturating_duration_since(now),
        );
        while due.front().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, s)) = due.pop_front() {
                s.end(Reason::drain);
            }
        }
        if inner.registry.len() == 0 {
            return;
        }
        let next = due
            .front()
            .map_or(sweep_at, |(at, _)| *at)
            .min(now + RECHECK)
            .min(sweep_at);
        tokio::select! {
            biased;
            // Shutdown: no more pacing, end everything now.
            _ = inner.closing.cancelled() => {
                inner.registry.open_streams().into_iter().for_each(|s| s.end(Reason::drain));
                return;
            }
            _ = tokio::time::sleep_until(next) => {}
        }
    }
}

impl Guard {
    /// A guard proxying to `config.upstream`; nothing runs until [`Guard::serve`].
    pub fn new(config: GuardConfig, metrics: Metrics) -> Self {
        Self::with_connector(config, metrics, None)
    }

    /// A guard that reaches the application through `connector` (the node
    /// agent's: from inside a pod's network namespace).
    pub fn with_connector(config: GuardConfig, metrics: Metrics, connector: Connector) -> Self {
        let registry = Arc::new(registry::Registry::with_limit(
            config.limits.max_streams,
            metrics.guard_limited(crate::metrics::Limit::streams),
        ));
        let signals =
            signals::Signals::new(config.signals, config.long_stream_age, metrics.clone());
        let age = config.max_connection_age.map_or(0, |a| a.as_secs().max(1));
        metrics
            .guard_max_connection_age
            .get_or_create(&Vec::new())
            .set(i64::try_from(age).unwrap_or(i64::MAX));
        metrics
            .guard_request_metrics
            .get_or_create(&Vec::new())
            .set(i64::from(config.signals.enabled));
        Self {
            inner: Arc::new(Inner {
                config,
                connector,
                metrics,
                signals,
                registry,
                goaway: CancellationToken::new(),
                terminate: CancellationToken::new(),
                closing: CancellationToken::new(),
                tasks: TaskTracker::new(),
                connections: AtomicU64::new(0),
                next_connection: AtomicU64::new(0),
                terminated_by_drain: AtomicU64::new(0),
                failed: AtomicU64::new(0),
            }),
        }
    }

    /// Accepts connections on `listener` until `shutdown` is cancelled. Then
    /// it stops accepting, ends every open stream gracefully at once, and
    /// waits (bounded by the limits) for the connections to close.
    pub async fn serve(&self, listener: TcpListener, shutdown: CancellationToken) {
        accept::serve(self.clone(), listener, shutdown.clone(), shutdown).await;
    }

    /// [`Guard::serve`], but accepting stops as soon as `accepting` is
    /// cancelled while the connections open then keep being served until
    /// `shutdown`: the node agent hands its listener to its successor, then
    /// ends the streams it still carries over a window of its own.
    pub async fn serve_until(
        &self,
        listener: TcpListener,
        accepting: CancellationToken,
        shutdown: CancellationToken,
    ) {
        accept::serve(self.clone(), listener, accepting, shutdown).await;
    }

    /// The HTTP/2 frame relay fed `steps` without sockets (reads from
    /// either peer, a drain's ask to end every stream, the clock moved on;
    /// `alone`: with no application, whose reads are then dropped), for the
    /// fuzz target. Call it inside a tokio runtime.
    #[doc(hidden)]
    pub fn fuzz_frame_relay(&self, steps: &[FeedStep<'_>], alone: bool) {
        relay::feed::feed(&self.handle(), steps, alone);
    }

    /// What a connection driver is given of this guard.
    fn handle(&self) -> handle::Handle {
        handle::Handle::new(self.inner.clone())
    }

    /// Downstream connections open right now.
    pub fn active_connections(&self) -> u64 {
        self.inner.connections.load(Ordering::Relaxed)
    }

    /// The configuration the guard runs with.
    pub fn config(&self) -> &GuardConfig {
        &self.inner.config
    }

    /// Ends every stream the way a drain does (long-lived ones spread over
    /// `window`, short calls left to finish until [`HAND_OFF_CALL_GRACE`]
    /// after it, then swept) and closes the connections, while the listener
    /// is served by another process: new streams on these connections are
    /// refused with REFUSED_STREAM after the GOAWAY, which a client retries
    /// on a new connection, never with the drain's UNAVAILABLE, which fails
    /// the call.
    pub fn hand_off(&self, window: Duration) {
        self.inner.terminate.cancel();
        tracing::info!(
            streams = self.inner.registry.len(),
            ?window,
            "guard: handed off; ending the streams still here gracefully over the window"
        );
        let inner = self.inner.clone();
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            let deadline = self.hand_off_deadline(window);
            self.inner
                .tasks
                .spawn_on(terminator(inner, window, deadline), &h);
        }
    }

    /// How long after [`Guard::hand_off`] its last stream has ended at the
    /// latest: the short calls' grace after the window, then one ending.
    pub fn hand_off_deadline(&self, window: Duration) -> Duration {
        window + HAND_OFF_CALL_GRACE + self.inner.config.limits.end_timeout + SWEEP_MARGIN
    }
}

/// How long before Envoy closes a drained listener's connections a push's
/// sweep comes: an ending's own bound (`end_timeout`), the sweep's slack and
/// a WebSocket's delayed close. (Envoy's close is computed from the start
/// Envoy stamped, so a drain seen late does not move it; a removed
/// listener's start is taken early.)
fn push_margin(config: &GuardConfig) -> Duration {
    config.limits.end_timeout + SWEEP_MARGIN + Duration::from_secs(1)
}

impl StreamGuard for Guard {
    fn goaway_all(&self) {
        if !self.inner.goaway.is_cancelled() {
            tracing::info!(
                connections = self.active_connections(),
                "guard: GOAWAY on every connection; still accepting new ones"
            );
        }
        self.inner.goaway.cancel();
    }

    fn terminate_all(&self, window: Duration) {
        self.terminate_within(window, window);
    }

    fn terminate_within(&self, window: Duration, deadline: Duration) {
        self.inner.registry.begin_terminating();
        self.inner.terminate.cancel();
        tracing::info!(
            streams = self.inner.registry.len(),
            ?window,
            ?deadline,
            "guard: ending long-lived streams gracefully, spread over the window; short calls finish until the deadline; refusing new streams"
        );
        let inner = self.inner.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                self.inner
                    .tasks
                    .spawn_on(terminator(inner, window, deadline), &h);
            }
            // No runtime to pace with: end everything now.
            Err(_) => inner
                .registry
                .open_streams()
                .into_iter()
                .for_each(|s| s.end(Reason::drain)),
        }
    }

    fn end_config_push(&self, push: &PushDrain) {
        let now = Instant::now();
        let wall = std::time::SystemTime::now();
        // Envoy's wall-clock times on the guard's clock.
        let on_clock = |t: std::time::SystemTime| match t.duration_since(wall) {
            Ok(ahead) => now + ahead,
            Err(e) => now.checked_sub(e.duration()).unwrap_or(now),
        };
        let started = on_clock(push.started);
        let ends = on_clock(push.started + push.drain_time);
        let margin = push_margin(&self.inner.config);
        let timeline = push::Timeline::new(now, ends, margin);
        let scope = registry::PushScope {
            started,
            unsure_after: push.seen_within,
            chains: push.chains.clone(),
            listener: push.listener.clone(),
        };
        tracing::info!(
            streams = self.inner.registry.len(),
            listener = %push.listener,
            chains = ?push.chains,
            spread = ?timeline.sweep_at.saturating_duration_since(now),
            envoy_closes_in = ?ends.saturating_duration_since(now),
            "guard: envoy drains a listener after a config update; ending its connections' streams gracefully, spread over the window"
        );
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            let inner = self.inner.clone();
            self.inner
                .tasks
                .spawn_on(push::terminator(inner, scope, timeline), &h);
        }
    }

    fn active_streams(&self) -> u64 {
        self.inner.registry.len() as u64
    }

    fn terminated_by_drain(&self) -> u64 {
        self.inner.terminated_by_drain.load(Ordering::Relaxed)
    }

    fn failed_total(&self) -> u64 {
        self.inner.failed.load(Ordering::Relaxed)
    }
}
