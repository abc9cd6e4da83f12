//! Endings for a config push: Envoy drains the listener (or the filter
//! chains) a stream came in on after an LDS update, and closes what is
//! left on it when its `--drain-time-s` ends. The streams of the drained
//! connections end gracefully before that, spread over the window left,
//! by the same ending protocol as a pod drain (reason `config_push`). The
//! guard is not draining: new streams are admitted, and streams of newer
//! connections are left alone (docs/design.md, "Ending a drained
//! listener's streams").
//!
//! Which streams: [`PushScope`] (`registry`). In order of its timeline:
//! - until `sweep_at`, long-lived streams of the selection are ended one
//!   by one, spread evenly over what is left of the window (streams that
//!   become long-lived later join the rest of it); short calls are left to
//!   finish;
//! - at `sweep_at`, whatever of the selection is still open is ended;
//! - until `until` (when Envoy closes the drained connections), a stream a
//!   client opens again on a drained connection is ended once it streams
//!   (long-lived, or answered a second ago; a unary call is left to
//!   finish): Envoy tells such a client to go away only when a response on
//!   that connection begins, and only with a probability that grows over
//!   the drain, so it may come back there more than once.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::registry::{Picked, PushScope, StreamCtl};
use super::schedule::{spread_into, Due};
use super::{Inner, RECHECK};
use crate::metrics::Reason;

/// After the sweep, a stream opened again on a drained connection is ended
/// once answered this long ago (or long-lived by messages).
const AFTER_SWEEP_AGE: Duration = Duration::from_secs(1);

/// When a push's endings happen, on the guard's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeline {
    /// Long-lived streams are spread until here; short calls are ended here.
    pub sweep_at: Instant,
    /// Envoy closes the drained connections here: streams opened again on
    /// them are ended until then.
    pub until: Instant,
}

impl Timeline {
    /// The timeline for a drain that Envoy ends at `ends`, seen at `now`:
    /// the sweep comes `margin` before the end (at once if that is past).
    pub fn new(now: Instant, ends: Instant, margin: Duration) -> Self {
        let sweep_at = ends.checked_sub(margin).unwrap_or(now).max(now);
        Self {
            sweep_at,
            until: ends.max(sweep_at),
        }
    }
}

/// Ends a push's selection along `timeline`. Returns at `timeline.until`,
/// or at once when the guard shuts down (whose own ending covers them).
pub(super) async fn terminator(inner: Arc<Inner>, scope: PushScope, timeline: Timeline) {
    let long_after = inner.config.long_stream_age;
    let mut watermark = None;
    // Streams already scheduled or ended by this push, by registry key
    // (an address would be reused by a stream opened after one ended).
    let mut seen: HashSet<u64> = HashSet::new();
    let mut due: Due<Arc<StreamCtl>> = Due::new();
    let (mut ended, mut unsure) = (0usize, 0usize);
    // The sweep ran (its one turn ends short calls too).
    let mut swept_once = false;
    loop {
        let now = Instant::now();
        let selection = inner.registry.push_selection(&scope, &mut watermark);
        let swept = now >= timeline.sweep_at;
        // After the sweep, only a stream opened again that streams (long-lived
        // by the guard's rule, or answered a second ago): a unary call
        // finishes on its own, and failing it would not be retried.
        let after_sweep = long_after.min(AFTER_SWEEP_AGE);
        let mut fresh = Vec::new();
        for (key, s, picked) in selection {
            if seen.contains(&key) {
                continue;
            }
            let take = match (swept, swept_once) {
                (false, _) => s.is_long_lived_at(now, long_after),
                (true, false) => true,
                (true, true) => s.is_long_lived_at(now, after_sweep),
            };
            if take {
                seen.insert(key);
                if picked == Picked::Unsure {
                    unsure += 1;
                }
                fresh.push(s);
            }
        }
        if swept {
            swept_once = true;
            // Past the spread: end at once whatever is left or came back.
            ended += fresh.len() + due.len();
            for s in due.drain(..).map(|(_, s)| s).chain(fresh) {
                s.end(Reason::config_push);
            }
        } else {
            let remaining = timeline.sweep_at.saturating_duration_since(now);
            spread_into(&mut due, fresh, now, remaining);
        }
        while due.front().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, s)) = due.pop_front() {
                s.end(Reason::config_push);
                ended += 1;
            }
        }
        if now >= timeline.until {
            tracing::info!(
                streams_ended = ended,
                streams_unsure = unsure,
                "guard: the config push's drain window is over"
            );
            return;
        }
        let mut next = (now + RECHECK).min(timeline.until);
        if !swept {
            next = next.min(timeline.sweep_at);
        }
        if let Some((at, _)) = due.front() {
            next = next.min(*at);
        }
        tokio::select! {
            biased;
            _ = inner.closing.cancelled() => return,
            _ = tokio::time::sleep_until(next) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_comes_a_margin_before_the_end_never_before_now() {
        let now = Instant::now();
        let t = Timeline::new(now, now + Duration::from_secs(10), Duration::from_secs(3));
        assert_eq!(t.sweep_at, now + Duration::from_secs(7));
        assert_eq!(t.until, now + Duration::from_secs(10));
        let late = Timeline::new(now, now + Duration::from_secs(1), Duration::from_secs(3));
        assert_eq!(late.sweep_at, now);
        let past = Timeline::new(now + Duration::from_secs(5), now, Duration::from_secs(3));
        assert_eq!(past.sweep_at, now + Duration::from_secs(5));
        assert_eq!(past.until, past.sweep_at);
    }
}
