//! Rapid reset (CVE-2023-44487) caught by what the guard did, not by when
//! it ran.
//!
//! A defence that counts streams the peer reset while they wait to be
//! accepted (h2's `max_pending_accept_reset_streams`) depends on
//! scheduling: on one worker thread (a pod with one CPU) the streams are
//! accepted before their RST_STREAM is read, and a HEADERS+RST_STREAM loop
//! never trips it.
//!
//! [`PrematureResets`] counts, per connection, streams the peer reset
//! prematurely, against all the streams the guard accepted on it. Premature
//! is: before the application's answer reached the client, and within
//! [`PREMATURE_LIFETIME`] of the stream's start (or before it was
//! forwarded at all). A connection where at
//! least `min` streams ended that way, and more than half of all its
//! streams, is an attack: it gets GOAWAY(ENHANCE_YOUR_CALM) and is closed.
//! Whether the guard happened to forward a stream before its RST_STREAM was
//! read does not matter.
//!
//! This is the shape of Envoy's own rule for its downstream connections
//! (`premature_reset_min_stream_lifetime_seconds`, 1 s, and
//! `premature_reset_total_stream_count`). Envoy in front of the guard
//! applies it to callers already; the guard's connection from Envoy carries
//! many callers, so its minimum is higher (the guard's
//! `max_pending_accept_reset_streams`, 1,000) and a burst of callers
//! cancelling at once is far from half of a busy connection's streams.

use std::time::Duration;

/// A stream reset by the peer sooner than this after it started, and before
/// it was answered, was reset prematurely.
pub const PREMATURE_LIFETIME: Duration = Duration::from_secs(1);

/// One connection's count of streams reset prematurely.
#[derive(Debug)]
pub struct PrematureResets {
    /// How many premature resets a connection may see before the share counts.
    min: u64,
    /// Streams the guard accepted on the connection.
    accepted: u64,
    /// Streams the peer reset prematurely.
    premature: u64,
}

impl PrematureResets {
    pub fn new(min: usize) -> Self {
        Self {
            min: u64::try_from(min).unwrap_or(u64::MAX).max(1),
            accepted: 0,
            premature: 0,
        }
    }

    /// Counts a stream the guard accepted.
    pub fn accepted(&mut self) {
        self.accepted += 1;
    }

    /// Counts a stream the peer reset prematurely.
    pub fn premature(&mut self) {
        self.premature += 1;
    }

    /// Whether the connection is an attack: at least `min` premature
    /// resets, and more than half of its streams.
    pub fn is_tripped(&self) -> bool {
        self.premature >= self.min && self.premature * 2 > self.accepted
    }

    /// Streams reset prematurely, so far.
    pub fn count(&self) -> u64 {
        self.premature
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trips_on_a_share_of_resets_past_the_minimum() {
        let mut r = PrematureResets::new(10);
        for _ in 0..15 {
            r.accepted();
            r.premature();
        }
        assert!(r.is_tripped());
        assert_eq!(r.count(), 15);
    }

    #[test]
    fn a_busy_connection_with_a_few_cancellations_never_trips() {
        let mut r = PrematureResets::new(10);
        // 1,000 streams, then a burst of 400 cancelled at once: 400 of 1,400.
        for _ in 0..1_000 {
            r.accepted();
        }
        for _ in 0..400 {
            r.accepted();
            r.premature();
        }
        // Below the minimum, however high the share.
        let mut fresh = PrematureResets::new(10);
        for _ in 0..9 {
            fresh.accepted();
            fresh.premature();
        }
        for conn in [&r, &fresh] {
            assert!(
                !conn.is_tripped(),
                "tripped after {} of its streams",
                conn.count()
            );
        }
    }
}
