//! Rate limits on the HTTP/2 control frames a client can make the guard and
//! the application process for free: PING, SETTINGS and RST_STREAM. Each is
//! answered (or walks the open streams, for a SETTINGS that changes the
//! initial window) whatever it costs, so their cost grows with the open
//! streams.
//!
//! The frame relay takes a token from a per-connection bucket ([`Buckets`])
//! for each such frame of the client's. When a bucket is empty it stops
//! reading the client until the next token is due: a flooder is slowed to
//! the rate by TCP backpressure. Nothing is closed or reset, so a false
//! positive costs latency on that one connection, never its streams; and
//! everything else (DATA, HEADERS, WINDOW_UPDATE) passes as it comes until a
//! limited frame is next in line.
//!
//! The rates ([`FloodLimits`], set in [`crate::guard::limits`]) are far above what Envoy sends on one
//! upstream connection, which carries a whole Envoy worker's streams:
//! - PING: Envoy sends PINGs only for its connection keepalive (off by
//!   default; intervals of seconds when on) and acks the guard's own (two per
//!   GOAWAY sequence). Limit 100/s, burst 1,000.
//! - SETTINGS: Envoy sends one at the start and acks each of the guard's
//!   (one per connection). Limit 10/s, burst 100.
//! - RST_STREAM: Envoy resets an upstream stream when its downstream caller
//!   cancels or times out, at most once per request. Limit 1,000/s with a
//!   burst of 10,000: a mass cancellation of 10,000 streams passes at once.
//!   The rapid-reset rule ([`super::rapid`]) still applies on top.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

use super::wire::{PING, RST_STREAM, SETTINGS};
use crate::guard::limits::{FloodLimits, Rate};
use crate::metrics::Limit;

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
    pub fn new(limits: FloodLimits, counter: impl Fn(Limit) -> Counter, now: Instant) -> Self {
        Self {
            ping: Bucket::new(limits.ping, now, counter(Limit::ping)),
            settings: Bucket::new(limits.settings, now, counter(Limit::settings)),
            rst_stream: Bucket::new(limits.rst_stream, now, counter(Limit::rst_stream)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::limits::DEFAULT_FLOOD_LIMITS;
    use crate::metrics::Metrics;

    fn slow_pings() -> FloodLimits {
        FloodLimits {
            ping: Rate {
                per_second: 10,
                burst: 5,
            },
            ..DEFAULT_FLOOD_LIMITS
        }
    }

    #[test]
    fn pings_past_the_burst_wait_for_their_tokens() {
        let metrics = Metrics::new();
        let start = Instant::now();
        let mut b = Buckets::new(slow_pings(), |k| metrics.guard_limited(k), start);
        for _ in 0..5 {
            assert_eq!(b.take(PING, start), Ok(()));
        }
        // The sixth waits a tenth of a second, and is let through then.
        let due = b.take(PING, start).expect_err("the burst is spent");
        assert_eq!(due, start + Duration::from_millis(100));
        assert_eq!(b.take(PING, due), Ok(()));
        assert!(b.take(PING, due).is_err());
        // Two seconds refill at most the burst, not twenty tokens.
        let later = due + Duration::from_secs(2);
        for _ in 0..5 {
            assert_eq!(b.take(PING, later), Ok(()));
        }
        assert!(b.take(PING, later).is_err());
    }

    #[test]
    fn other_frames_are_not_held_by_an_empty_bucket() {
        let metrics = Metrics::new();
        let now = Instant::now();
        let mut b = Buckets::new(slow_pings(), |k| metrics.guard_limited(k), now);
        while b.take(PING, now).is_ok() {}
        for kind in [0x0, 0x1, 0x8, SETTINGS, RST_STREAM] {
            assert_eq!(b.take(kind, now), Ok(()), "frame type {kind}");
        }
    }

    #[test]
    fn a_zero_rate_waits_an_hour_not_forever() {
        let metrics = Metrics::new();
        let now = Instant::now();
        let limits = FloodLimits {
            settings: Rate {
                per_second: 0,
                burst: 1,
            },
            ..DEFAULT_FLOOD_LIMITS
        };
        let mut b = Buckets::new(limits, |k| metrics.guard_limited(k), now);
        assert_eq!(b.take(SETTINGS, now), Ok(()));
        assert_eq!(b.take(SETTINGS, now), Err(now + Duration::from_secs(3600)));
    }
}
