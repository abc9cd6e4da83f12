//! Rapid reset (CVE-2023-44487) caught by what the guard did, not by when
//! it ran.
//!
//! h2's own defence counts streams the peer reset while they wait to be
//! accepted (`max_pending_accept_reset_streams`). Whether a reset stream is
//! still waiting depends on scheduling: on one worker thread (a pod with one
//! CPU) the guard accepts between reads, the streams are accepted before
//! their RST_STREAM is read, and a HEADERS+RST_STREAM loop never trips it.
//!
//! [`PrematureResets`] counts, per connection, streams the peer reset
//! prematurely, against all the streams the guard accepted on it. Premature
//! is: before the application's answer reached the client, and within
//! [`PREMATURE_LIFETIME`] of the stream's start (or before the stream task
//! even started, when it is not forwarded at all). A connection where at
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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// A stream reset by the peer sooner than this after it started, and before
/// it was answered, was reset prematurely.
pub const PREMATURE_LIFETIME: Duration = Duration::from_secs(1);

/// One connection's count of streams reset prematurely.
#[derive(Debug)]
pub struct PrematureResets {
    /// How many premature resets a connection may see before the share counts.
    min: u64,
    /// Streams the guard accepted on the connection.
    accepted: AtomicU64,
    /// Streams the peer reset prematurely.
    premature: AtomicU64,
    /// Set once the rule tripped.
    tripped: AtomicBool,
    /// Wakes the connection task when the rule trips.
    notify: Notify,
}

impl PrematureResets {
    pub fn new(min: usize) -> Self {
        Self {
            min: u64::try_from(min).unwrap_or(u64::MAX).max(1),
            accepted: AtomicU64::new(0),
            premature: AtomicU64::new(0),
            tripped: AtomicBool::new(false),
            notify: Notify::new(),
        }
    }

    /// Counts a stream the guard accepted.
    pub fn accepted(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a stream the peer reset prematurely; trips the rule (once)
    /// when the connection is an attack.
    pub fn premature(&self) {
        let premature = self.premature.fetch_add(1, Ordering::Relaxed) + 1;
        let accepted = self.accepted.load(Ordering::Relaxed);
        if premature >= self.min
            && premature * 2 > accepted
            && !self.tripped.swap(true, Ordering::AcqRel)
        {
            // A stored permit if the connection task is busy right now.
            self.notify.notify_one();
        }
    }

    /// Resolves once the rule has tripped.
    pub async fn tripped(&self) {
        if self.tripped.load(Ordering::Acquire) {
            return;
        }
        self.notify.notified().await;
    }

    /// Whether the rule has tripped.
    pub fn is_tripped(&self) -> bool {
        self.tripped.load(Ordering::Acquire)
    }

    /// Streams reset prematurely, so far.
    pub fn count(&self) -> u64 {
        self.premature.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn trips_on_a_share_of_resets_past_the_minimum() {
        let r = PrematureResets::new(10);
        for _ in 0..15 {
            r.accepted();
            r.premature();
        }
        tokio::time::timeout(Duration::from_secs(5), r.tripped())
            .await
            .expect("tripped");
        assert_eq!(r.count(), 15);
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_connection_with_a_few_cancellations_never_trips() {
        let r = PrematureResets::new(10);
        // 1,000 streams, then a burst of 400 cancelled at once: 400 of 1,400.
        for _ in 0..1_000 {
            r.accepted();
        }
        for _ in 0..400 {
            r.accepted();
            r.premature();
        }
        // Below the minimum, however high the share.
        let fresh = PrematureResets::new(10);
        for _ in 0..9 {
            fresh.accepted();
            fresh.premature();
        }
        for conn in [&r, &fresh] {
            assert!(
                tokio::time::timeout(Duration::from_secs(60), conn.tripped())
                    .await
                    .is_err(),
                "tripped after {} of its streams",
                conn.count()
            );
        }
    }
}
