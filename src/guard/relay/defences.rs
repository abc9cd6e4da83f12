//! What one connection keeps to defend the guard and the application
//! against a client that floods them: the control-frame buckets
//! ([`super::flood`]), and the count of streams it reset before they were
//! answered ([`super::rapid`]).

use tokio::time::Instant;

use super::flood::Buckets;
use super::rapid::PrematureResets;

#[derive(Debug)]
pub(super) struct Defences {
    buckets: Buckets,
    /// Until when reading the client is paused (a bucket ran out, or its
    /// SETTINGS wait for acks).
    paused_until: Option<Instant>,
    resets: PrematureResets,
    /// GOAWAY(ENHANCE_YOUR_CALM) was sent for rapid reset (once).
    calmed: bool,
}

impl Defences {
    pub(super) fn new(buckets: Buckets, resets: PrematureResets) -> Self {
        Self {
            buckets,
            paused_until: None,
            resets,
            calmed: false,
        }
    }

    /// Takes a token for a client frame of type `kind`: false (and reading
    /// pauses until the next one is due) when its bucket is empty.
    pub(super) fn take(&mut self, kind: u8, now: Instant) -> bool {
        match self.buckets.take(kind, now) {
            Ok(()) => true,
            Err(until) => {
                self.paused_until = Some(until);
                false
            }
        }
    }

    /// Reading the client pauses until `at`.
    pub(super) fn pause_until(&mut self, at: Instant) {
        self.paused_until = Some(at);
    }

    /// Until when reading the client is paused, if it is.
    pub(super) fn paused_until(&self) -> Option<Instant> {
        self.paused_until
    }

    /// Whether a pause is over at `now` (it is then lifted).
    pub(super) fn resume(&mut self, now: Instant) -> bool {
        let over = self.paused_until.is_some_and(|at| now >= at);
        if over {
            self.paused_until = None;
        }
        over
    }

    /// A stream was accepted.
    pub(super) fn accepted(&mut self) {
        self.resets.accepted();
    }

    /// The client reset a stream before it was answered.
    pub(super) fn premature(&mut self) {
        self.resets.premature();
    }

    /// The connection just became a rapid-reset attack: how many streams
    /// were reset prematurely (once; `None` after, or while it is not).
    pub(super) fn calm_now(&mut self) -> Option<u64> {
        (self.resets.is_tripped() && !std::mem::replace(&mut self.calmed, true))
            .then(|| self.resets.count())
    }

    #[cfg(test)]
    pub(super) fn lift_pause(&mut self) -> bool {
        self.paused_until.take().is_some()
    }
}
