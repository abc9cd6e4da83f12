//! The ends a connection plans for its own streams: at its max age (over
//! the grace less the spread) and after the application's GOAWAY (over
//! `app_shutdown_spread`). Spread evenly, asked by the relay's own timer
//! when due ([`super::state::Planned`]), never by a task of their own.

use std::sync::Arc;

use tokio::time::Instant;

use super::state::{Endings, Planned};
use crate::guard::registry::StreamCtl;
use crate::guard::schedule::spread_offsets;
use crate::metrics::Reason;

impl Endings {
    /// Plans the ends of `streams` of this connection, one by one, evenly
    /// over `window` from `now` (at once when it is zero), for the relay's
    /// own timer ([`Endings::ask_due`]).
    pub(in crate::guard::relay) fn plan(
        &mut self,
        streams: Vec<Arc<StreamCtl>>,
        window: std::time::Duration,
        reason: Reason,
        now: Instant,
    ) {
        let n = streams.len();
        for (ctl, offset) in streams.into_iter().zip(spread_offsets(n, window)) {
            self.planned.push_back(Planned {
                at: if window.is_zero() { now } else { now + offset },
                ctl,
                reason,
            });
        }
        // Two plans (the app's GOAWAY, then the max age) interleave.
        self.planned.make_contiguous().sort_by_key(|p| p.at);
    }

    /// The planned ends that are due are asked (the first reason asked
    /// wins, so a stream a drain already ends keeps the drain's): their
    /// ids come back through `queue`.
    pub(in crate::guard::relay) fn ask_due(&mut self, now: Instant) {
        while self.planned.front().is_some_and(|p| p.at <= now) {
            if let Some(p) = self.planned.pop_front() {
                p.ctl.end(p.reason);
            }
        }
    }
}
