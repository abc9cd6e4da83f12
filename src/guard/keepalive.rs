//! HTTP/1.1 keep-alive without the idle-close race.
//!
//! hyper's `header_read_timeout` starts whenever the server waits for a
//! request head, so with the guard's slowloris bound (10 s) every idle
//! kept-alive connection was closed after 10 s. Envoy keeps pooled upstream
//! connections for an hour by default and may pick one just as the guard
//! closes it: the request then fails (HTTP/1.1 has no GOAWAY to say "not
//! this one"). This timer tells the two apart:
//!
//! - once a byte of a new request head has arrived, the head must complete
//!   within the header read timeout (slowloris);
//! - while nothing has arrived, the connection is idle and may stay so for
//!   [`H1_IDLE_TIMEOUT`], longer than Envoy's default upstream idle timeout
//!   (1 h), so Envoy, which knows when it will reuse a connection, is the
//!   one that closes it. A cluster with a longer `idle_timeout` should stay
//!   below this.
//!
//! A drain and max connection age still close idle connections (the
//! connection driver does that, not this timer).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::rt::{Sleep, Timer};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::Instant;

/// How long an idle HTTP/1.1 keep-alive connection is kept: Envoy's default
/// upstream `idle_timeout` (1 h) plus a minute, so Envoy closes first.
pub const H1_IDLE_TIMEOUT: Duration = Duration::from_secs(3660);

/// Bytes read from the client so far, shared by the connection's I/O and its
/// head timer.
#[derive(Debug, Default)]
pub struct Activity(AtomicU64);

impl Activity {
    fn bytes(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The client connection, counting what it reads into [`Activity`].
#[derive(Debug)]
pub struct Counted<T> {
    /// The connection.
    inner: T,
    /// Where the count goes.
    activity: Arc<Activity>,
}

impl<T> Counted<T> {
    pub fn new(inner: T, activity: Arc<Activity>) -> Self {
        Self { inner, activity }
    }

    pub fn into_inner(self) -> T {
        self.inner
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before) as u64;
        if n > 0 {
            self.activity.0.fetch_add(n, Ordering::Relaxed);
        }
        r
    }
}

super::passthrough::write_through!(Counted);

/// hyper's timer for one connection: head reads get the head timeout from
/// their first byte, and the idle timeout while no byte came.
#[derive(Clone, Debug)]
pub struct HeadTimer {
    /// The connection's read count.
    pub activity: Arc<Activity>,
    /// From the first byte of a head to its end.
    pub head_timeout: Duration,
    /// With no byte of a new head.
    pub idle_timeout: Duration,
}

impl Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        Box::pin(Plain(Box::pin(tokio::time::sleep(duration))))
    }

    /// hyper asks for one of these each time it starts waiting for a
    /// request head.
    fn sleep_until(&self, _deadline: std::time::Instant) -> Pin<Box<dyn Sleep>> {
        let now = Instant::now();
        Box::pin(HeadSleep {
            activity: self.activity.clone(),
            bytes_at_start: self.activity.bytes(),
            started: now,
            first_byte: None,
            head_timeout: self.head_timeout,
            idle_timeout: self.idle_timeout,
            sleep: Box::pin(tokio::time::sleep_until(now + self.idle_timeout)),
        })
    }
}

/// A plain tokio sleep as a hyper [`Sleep`].
struct Plain(Pin<Box<tokio::time::Sleep>>);

impl Future for Plain {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.get_mut().0.as_mut().poll(cx)
    }
}

impl Sleep for Plain {}

/// The head-read deadline: idle until a byte of a head arrives, then the
/// head timeout from that byte.
struct HeadSleep {
    activity: Arc<Activity>,
    bytes_at_start: u64,
    started: Instant,
    first_byte: Option<Instant>,
    head_timeout: Duration,
    idle_timeout: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl Future for HeadSleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.first_byte.is_none() && this.activity.bytes() != this.bytes_at_start {
            // hyper polls this whenever bytes arrived and the head is not
            // complete yet: the head started now (or a moment ago).
            let now = Instant::now();
            this.first_byte = Some(now);
            let by = (now + this.head_timeout).min(this.started + this.idle_timeout);
            this.sleep.as_mut().reset(by);
        }
        this.sleep.as_mut().poll(cx)
    }
}

impl Sleep for HeadSleep {}
