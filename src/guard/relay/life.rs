//! The connection's life ([`Life`]): when it goes away (the lifecycle
//! machine), what the GOAWAYs each way said, the probe PING, and the close.
//! The relay's steps over it are `goaway.rs`'s.

use bytes::BytesMut;
use tokio::time::Instant;

use super::wire;
use crate::guard::lifecycle::{ConnAction, Input, Lifecycle};

/// The connection's life: when it goes away (the lifecycle machine), what
/// the GOAWAYs each way said, and the close.
#[derive(Debug)]
pub(super) struct Life {
    /// When the connection goes away (max age, drain, idle): a pure machine.
    machine: Lifecycle,
    /// Lowest last-stream id the client was sent in a GOAWAY: newer streams
    /// are refused, and no later GOAWAY may name a higher one (RFC 9113
    /// §6.8: a peer treats a growing last-stream id as a connection error).
    sent_last: Option<u32>,
    /// Lowest last-stream id the application sent in a GOAWAY: it will
    /// never process a stream above it, so those are refused retryably.
    app_last: Option<u32>,
    /// The error code of the application's last GOAWAY: the client's
    /// GOAWAY when the application's connection then closes.
    app_code: u32,
    /// The GOAWAY probe PING went to the client and is not acked yet.
    probe_out: bool,
    /// The probe's opaque data: random per connection, so no PING of the
    /// application's that the client acks is ever taken for it.
    probe: [u8; 8],
    /// After the application's GOAWAY: when streams that have become
    /// long-lived since are looked for next (a stream young at the GOAWAY
    /// would otherwise run into the application's grace).
    app_sweep_at: Option<Instant>,
    /// The connection is closing: stop reading, flush (until the instant
    /// at most), then close.
    closing: bool,
    closing_by: Option<Instant>,
}

impl Life {
    pub(super) fn new(machine: Lifecycle, probe: [u8; 8]) -> Self {
        Self {
            machine,
            sent_last: None,
            app_last: None,
            app_code: wire::NO_ERROR,
            probe_out: false,
            probe,
            app_sweep_at: None,
            closing: false,
            closing_by: None,
        }
    }

    /// The lifecycle machine, to read.
    pub(super) fn machine(&self) -> &Lifecycle {
        &self.machine
    }

    /// An input to the lifecycle machine: what the connection does next.
    pub(super) fn step(&mut self, input: Input, now: Instant) -> Option<ConnAction> {
        self.machine.step(input, now)
    }

    /// The connection now has `n` streams: whether the machine must hear of
    /// it (it is told only when the count goes to or from zero).
    pub(super) fn count_changed(&self, n: usize) -> bool {
        self.machine.told_empty() != (n == 0)
    }

    /// A stream opened: whether the machine must hear the connection is
    /// busy again (the idle timer stops), even if the stream ends in this
    /// same batch: the next turn reports "none" afresh.
    pub(super) fn busy_again(&self) -> bool {
        self.machine.told_empty()
    }

    /// A GOAWAY to the client naming `last`, or the lowest id named before
    /// (and never above the application's): a last-stream id never grows.
    pub(super) fn goaway(&mut self, to_client: &mut BytesMut, last: u32, code: u32) {
        let last = [Some(last), self.sent_last, self.app_last]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(last);
        wire::goaway(to_client, last, code);
        self.sent_last = Some(last);
    }

    /// The first GOAWAY of the guard's sequence: every stream id (once
    /// nothing lower was sent), and the PING whose ack sends the final one.
    pub(super) fn first_goaway(&mut self, to_client: &mut BytesMut) {
        self.goaway(to_client, wire::MAX_STREAM_ID, wire::NO_ERROR);
        wire::ping(to_client, false, self.probe);
        self.probe_out = true;
    }

    /// A PING ack from the client: whether it acks the probe.
    pub(super) fn probe_acked(&mut self, opaque: &[u8]) -> bool {
        let acked = self.probe_out && opaque == self.probe;
        if acked {
            self.probe_out = false;
        }
        acked
    }

    /// Whether a stream `id` is past a GOAWAY either way.
    pub(super) fn refuses(&self, id: u32) -> bool {
        let beyond = |last: Option<u32>| last.is_some_and(|last| id > last);
        beyond(self.sent_last) || beyond(self.app_last)
    }

    /// The application sent GOAWAY(`last`, `code`): the lowest last-stream
    /// id it named, and whether this is its first.
    pub(super) fn app_goaway(&mut self, last: u32, code: u32) -> (u32, bool) {
        let first = self.app_last.is_none();
        let last = self.app_last.map_or(last, |l| l.min(last));
        self.app_last = Some(last);
        self.app_code = code;
        (last, first)
    }

    /// The error code of the application's last GOAWAY (NO_ERROR if none).
    pub(super) fn app_code(&self) -> u32 {
        self.app_code
    }

    pub(super) fn closing(&self) -> bool {
        self.closing
    }

    /// The connection closes: flushed until `by` at most.
    pub(super) fn close_by(&mut self, by: Instant) {
        self.closing = true;
        self.closing_by = Some(by);
    }

    /// When the connection is dropped whatever is still open: the
    /// lifecycle's backstop, or the flush bound once it closes, the earlier.
    pub(super) fn close_deadline(&self) -> Option<Instant> {
        [self.machine.deadlines().close_by, self.closing_by]
            .into_iter()
            .flatten()
            .min()
    }

    pub(super) fn sweep_at(&self) -> Option<Instant> {
        self.app_sweep_at
    }

    pub(super) fn sweep(&mut self, at: Option<Instant>) {
        self.app_sweep_at = at;
    }

    /// A fixed probe, for the fuzz target, which must be able to ack it.
    pub(super) fn set_probe(&mut self, probe: [u8; 8]) {
        self.probe = probe;
    }

    #[cfg(test)]
    pub(super) fn probe(&self) -> ([u8; 8], bool) {
        (self.probe, self.probe_out)
    }
}
