//! Rate limits on the HTTP/2 control frames a peer can make the guard
//! process for free: PING, SETTINGS and RST_STREAM. h2 answers every PING
//! and SETTINGS and walks every open stream for a SETTINGS that changes the
//! initial window, so their CPU cost grows with the open streams; h2 exposes
//! none of these frames to count them.
//!
//! [`Flood`] wraps a connection's byte stream below h2: it parses the frame
//! headers of what the peer sends (after the 24-byte preface) and takes a
//! token for each PING, SETTINGS and RST_STREAM frame from a per-connection
//! bucket. When a bucket is empty it hands h2 nothing more until the next
//! token is due, and stops reading the socket meanwhile: a flooder is slowed
//! to the rate by TCP backpressure. Nothing is closed or reset, so a false
//! positive costs latency on that one connection, never its streams; and
//! everything else (DATA, HEADERS, WINDOW_UPDATE) passes as it comes until a
//! limited frame is next in line.
//!
//! The rates ([`FloodLimits`]) are far above what Envoy sends on one
//! upstream connection, which carries a whole Envoy worker's streams:
//! - PING: Envoy sends PINGs only for its connection keepalive (off by
//!   default; intervals of seconds when on) and acks the guard's own (two per
//!   GOAWAY sequence). Limit 100/s, burst 1,000.
//! - SETTINGS: Envoy sends one at the start and acks each of the guard's
//!   (one per connection). Limit 10/s, burst 100.
//! - RST_STREAM: Envoy resets an upstream stream when its downstream caller
//!   cancels or times out, at most once per request. Limit 1,000/s with a
//!   burst of 10,000: a mass cancellation of 10,000 streams passes at once.
//!   h2's own rapid-reset protection (max_pending_accept_reset_streams)
//!   still applies on top.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::sniff::H2_PREFACE;
use super::wire::{FRAME_HEADER, PING, RST_STREAM, SETTINGS};
use crate::metrics::{Limit, Metrics};
/// Bytes read from the socket at a time, and most held back while throttled.
const READ_CHUNK: usize = 16 * 1024;

/// A token bucket: `rate` per second, up to `burst` saved up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub per_second: u32,
    pub burst: u32,
}

/// Per-connection rates of the frames h2 processes without a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FloodLimits {
    pub ping: Rate,
    pub settings: Rate,
    pub rst_stream: Rate,
}

/// The defaults, and why they never trip for Envoy: see the module docs.
pub const DEFAULT_FLOOD_LIMITS: FloodLimits = FloodLimits {
    ping: Rate {
        per_second: 100,
        burst: 1_000,
    },
    settings: Rate {
        per_second: 10,
        burst: 100,
    },
    rst_stream: Rate {
        per_second: 1_000,
        burst: 10_000,
    },
};

#[derive(Debug)]
struct Bucket {
    rate: Rate,
    tokens: f64,
    at: Instant,
    /// Counts the pauses this bucket caused.
    paused: Counter,
}

impl Bucket {
    fn new(rate: Rate, now: Instant, paused: Counter) -> Self {
        Self {
            rate,
            tokens: f64::from(rate.burst),
            at: now,
            paused,
        }
    }

    /// Takes one token, or says when the next one is due.
    fn take(&mut self, now: Instant) -> Result<(), Instant> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        let per_second = f64::from(self.rate.per_second);
        self.tokens = (self.tokens + elapsed * per_second).min(f64::from(self.rate.burst));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        self.paused.inc();
        if self.rate.per_second == 0 {
            // A zero rate never refills: wait a long time, not forever.
            return Err(now + Duration::from_secs(3600));
        }
        let wait = (1.0 - self.tokens) / per_second;
        Err(now + Duration::from_secs_f64(wait))
    }
}

/// One connection's buckets, one per limited frame type.
#[derive(Debug)]
pub struct Buckets {
    ping: Bucket,
    settings: Bucket,
    rst_stream: Bucket,
}

impl Buckets {
    /// Full buckets; each pause is counted in `metrics`.
    pub fn new(limits: FloodLimits, metrics: &Metrics, now: Instant) -> Self {
        Self {
            ping: Bucket::new(limits.ping, now, metrics.guard_limited(Limit::ping)),
            settings: Bucket::new(limits.settings, now, metrics.guard_limited(Limit::settings)),
            rst_stream: Bucket::new(
                limits.rst_stream,
                now,
                metrics.guard_limited(Limit::rst_stream),
            ),
        }
    }

    /// Takes a token for a frame of type `kind` (frames of other types need
    /// none), or says when the next one is due.
    pub fn take(&mut self, kind: u8, now: Instant) -> Result<(), Instant> {
        match kind {
            PING => self.ping.take(now),
            SETTINGS => self.settings.take(now),
            RST_STREAM => self.rst_stream.take(now),
            _ => Ok(()),
        }
    }
}

/// What the parser could do with the bytes held.
enum Step {
    /// Released more bytes to the reader.
    Progress,
    /// Needs more bytes from the socket.
    NeedMore,
    /// A limited frame is next and its bucket is empty until then.
    Throttled(Instant),
}

/// The byte stream of one HTTP/2 connection, with its control frames rate-limited.
pub struct Flood<T> {
    inner: T,
    /// Read from the socket; `buf[..released]` may be handed to h2.
    buf: BytesMut,
    released: usize,
    /// Bytes still to pass before the next frame header (the preface, then
    /// each frame's payload).
    skip: usize,
    buckets: Buckets,
    /// Set while throttled.
    sleep: Option<Pin<Box<Sleep>>>,
    /// The socket reported end of stream.
    eof: bool,
}

impl<T> Flood<T> {
    /// Wraps the byte stream of a connection that starts with the HTTP/2
    /// preface (as every sniffed HTTP/2 connection does); each pause is
    /// counted in `metrics` (`drainshim_guard_limited_total`).
    pub fn new(inner: T, limits: FloodLimits, metrics: &Metrics) -> Self {
        let now = Instant::now();
        Self {
            inner,
            buf: BytesMut::with_capacity(READ_CHUNK),
            released: 0,
            skip: H2_PREFACE.len(),
            buckets: Buckets::new(limits, metrics, now),
            sleep: None,
            eof: false,
        }
    }

    fn step(&mut self, now: Instant) -> Step {
        let avail = self.buf.len() - self.released;
        if self.skip > 0 {
            let n = self.skip.min(avail);
            if n == 0 {
                return Step::NeedMore;
            }
            self.released += n;
            self.skip -= n;
            return Step::Progress;
        }
        if avail < FRAME_HEADER {
            return Step::NeedMore;
        }
        let h = &self.buf[self.released..self.released + FRAME_HEADER];
        let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
        if let Err(until) = self.buckets.take(h[3], now) {
            return Step::Throttled(until);
        }
        self.released += FRAME_HEADER;
        self.skip = len;
        Step::Progress
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Flood<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // Bounded: each pass releases bytes, reads bytes, or returns.
        loop {
            if this.released > 0 {
                let n = this.released.min(out.remaining());
                out.put_slice(&this.buf[..n]);
                this.buf.advance(n);
                this.released -= n;
                return Poll::Ready(Ok(()));
            }
            if let Some(sleep) = this.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.sleep = None;
            }
            match this.step(Instant::now()) {
                Step::Progress => continue,
                Step::Throttled(until) => {
                    this.sleep = Some(Box::pin(tokio::time::sleep_until(until)));
                    continue;
                }
                Step::NeedMore if this.eof => {
                    // A truncated frame at the end: hand over what is left,
                    // h2 reports it.
                    this.released = this.buf.len();
                    if this.released == 0 {
                        return Poll::Ready(Ok(()));
                    }
                    continue;
                }
                Step::NeedMore => {
                    let mut chunk = [0u8; READ_CHUNK];
                    let mut rb = ReadBuf::new(&mut chunk);
                    match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Ready(Ok(())) if rb.filled().is_empty() => this.eof = true,
                        Poll::Ready(Ok(())) => this.buf.extend_from_slice(rb.filled()),
                    }
                }
            }
        }
    }
}

super::passthrough::write_through!(Flood);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn frame(ty: u8, payload: usize) -> Vec<u8> {
        let mut f = vec![
            (payload >> 16) as u8,
            (payload >> 8) as u8,
            payload as u8,
            ty,
            0,
            0,
            0,
            0,
            0,
        ];
        f.resize(FRAME_HEADER + payload, 0xab);
        f
    }

    fn slow_pings() -> FloodLimits {
        FloodLimits {
            ping: Rate {
                per_second: 10,
                burst: 5,
            },
            ..DEFAULT_FLOOD_LIMITS
        }
    }

    /// Reads exactly `n` bytes through the wrapper, or what came by `limit`.
    async fn read_for<T: AsyncRead + Unpin>(f: &mut Flood<T>, n: usize) -> Vec<u8> {
        let mut got = vec![0u8; n];
        f.read_exact(&mut got).await.expect("read");
        got
    }

    #[tokio::test(start_paused = true)]
    async fn passes_every_byte_unchanged() {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let mut bytes = H2_PREFACE.to_vec();
        for (ty, len) in [
            (SETTINGS, 6),
            (0x1, 40),
            (0x0, 70_000),
            (PING, 8),
            (RST_STREAM, 4),
        ] {
            bytes.extend(frame(ty, len));
        }
        client.write_all(&bytes).await.expect("write");
        let mut f = Flood::new(server, DEFAULT_FLOOD_LIMITS, &Metrics::new());
        assert_eq!(read_for(&mut f, bytes.len()).await, bytes);
    }

    #[tokio::test(start_paused = true)]
    async fn pings_past_the_burst_wait_for_their_tokens() {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let mut bytes = H2_PREFACE.to_vec();
        for _ in 0..25 {
            bytes.extend(frame(PING, 8));
        }
        client.write_all(&bytes).await.expect("write");
        let mut f = Flood::new(server, slow_pings(), &Metrics::new());
        let start = Instant::now();
        assert_eq!(read_for(&mut f, bytes.len()).await, bytes);
        // 5 at once, then 20 at 10/s.
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(1_900) && took <= Duration::from_millis(2_100),
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn data_is_not_held_by_an_unrelated_bucket() {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let mut bytes = H2_PREFACE.to_vec();
        for _ in 0..5 {
            bytes.extend(frame(PING, 8));
        }
        bytes.extend(frame(0x0, 1_000));
        client.write_all(&bytes).await.expect("write");
        let mut f = Flood::new(server, slow_pings(), &Metrics::new());
        let start = Instant::now();
        assert_eq!(read_for(&mut f, bytes.len()).await, bytes);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_header_split_across_reads_is_parsed() {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let mut f = Flood::new(server, slow_pings(), &Metrics::new());
        let mut bytes = H2_PREFACE.to_vec();
        for _ in 0..6 {
            bytes.extend(frame(PING, 8));
        }
        let writer = tokio::spawn(async move {
            for b in bytes.chunks(5) {
                client.write_all(b).await.expect("write");
                tokio::task::yield_now().await;
            }
            client
        });
        let start = Instant::now();
        let got = read_for(&mut f, H2_PREFACE.len() + 6 * 17).await;
        assert_eq!(got.len(), 24 + 6 * 17);
        // The sixth PING waited for a token.
        assert!(
            start.elapsed() >= Duration::from_millis(100),
            "{:?}",
            start.elapsed()
        );
        drop(writer.await);
    }
}
