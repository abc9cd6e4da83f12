//! The ends a connection plans for its own streams: at its max age (over
//! the grace less the spread) and after the application's GOAWAY (over
//! `app_shutdown_spread`). Spread evenly, asked by the relay's own timer
//! when due ([`super::state::Planned`]), never by a task of their own.

use std::sync::Arc;

use tokio::time::Instant;

use super::state::Planned;
use crate::guard::registry::StreamCtl;
use crate::guard::relay::Relay;
use crate::guard::schedule::spread_offsets;
use crate::metrics::Reason;

impl Relay<'_> {
    /// After the application's GOAWAY: the streams long-lived by now (and
    /// not already asked to end) are ended over `spread`; the next look is
    /// one spread later, for as long as streams are open.
    pub(in crate::guard::relay) fn end_long_lived(
        &mut self,
        spread: std::time::Duration,
        now: Instant,
    ) {
        let guard = self.guard;
        let long_after = guard.config().long_stream_age;
        let long: Vec<_> = guard
            .connection_streams(self.info.id, now, long_after)
            .into_iter()
            .filter(|s| s.is_long_lived_at(now, long_after))
            .collect();
        self.plan_ends(long, spread, Reason::app_shutdown, now);
        let period = guard
            .config()
            .app_shutdown_spread
            .max(std::time::Duration::from_secs(1));
        self.life
            .sweep((!self.streams.is_empty()).then_some(now + period));
    }

    /// Ends `streams` of this connection one by one, evenly over `window`
    /// from `now` (at once when it is zero), by the relay's own timer.
    pub(in crate::guard::relay) fn plan_ends(
        &mut self,
        streams: Vec<Arc<StreamCtl>>,
        window: std::time::Duration,
        reason: Reason,
        now: Instant,
    ) {
        let n = streams.len();
        for (ctl, offset) in streams.into_iter().zip(spread_offsets(n, window)) {
            self.endings.planned.push_back(Planned {
                at: if window.is_zero() { now } else { now + offset },
                ctl,
                reason,
            });
        }
        // Two plans (the app's GOAWAY, then the max age) interleave.
        self.endings.planned.make_contiguous().sort_by_key(|p| p.at);
        self.ask_planned(now);
    }

    /// The planned ends that are due: asked (the first reason asked wins,
    /// so a stream a drain already ends keeps the drain's), and begun.
    pub(in crate::guard::relay) fn ask_planned(&mut self, now: Instant) {
        while self.endings.planned.front().is_some_and(|p| p.at <= now) {
            if let Some(p) = self.endings.planned.pop_front() {
                p.ctl.end(p.reason);
            }
        }
        for id in self.endings.queue.take() {
            self.begin_end(id, now);
        }
    }
}
