//! The stream ids the client has used, as far as RFC 9113 §5.1 needs them
//! once a stream is no longer in the relay's table: which ids are idle,
//! which it skipped (closed unused), which it ended or reset lately.

use std::collections::VecDeque;

/// Streams the client ended (END_STREAM or RST_STREAM) remembered: its DATA
/// or HEADERS on one is STREAM_CLOSED (RFC 9113 §5.1), and HEADERS on one it
/// ended with END_STREAM, once the stream is closed, is a connection error.
/// On a stream it ended longer ago they are dropped like those for a stream
/// the guard reset.
pub(super) const CLOSED_KEPT: usize = 128;
/// Ranges of stream ids the client skipped remembered: HEADERS on one is
/// a stream id lower than one it opened (RFC 9113 §5.1.1).
const SKIPS_KEPT: usize = 16;
/// Streams the client reset remembered (see [`StreamIds::reset_lately`]).
const RESETS_KEPT: usize = 64;

/// The client's stream ids: the highest it opened, and the recent past.
#[derive(Debug, Default)]
pub(super) struct StreamIds {
    /// Highest stream id the client opened.
    last: u32,
    /// Streams the client ended lately, whether or not they are still open,
    /// each with whether it ended them with RST_STREAM.
    closed: VecDeque<(u32, bool)>,
    /// Ranges of ids it skipped, the last `SKIPS_KEPT`.
    skipped: VecDeque<(u32, u32)>,
    /// Streams it reset lately.
    reset: VecDeque<u32>,
}

impl StreamIds {
    /// The highest stream id the client opened (0: none yet).
    pub(super) fn last(&self) -> u32 {
        self.last
    }

    /// Whether stream `id` is idle for the client (RFC 9113 §5.1): one it
    /// has not opened, or an even one, which only a server opens and the
    /// guard never does.
    pub(super) fn idle(&self, id: u32) -> bool {
        id.is_multiple_of(2) || id > self.last
    }

    /// The client opens stream `id`, above `last`: the ids it skipped are
    /// closed unused (RFC 9113 §5.1), and remembered.
    pub(super) fn opened(&mut self, id: u32) {
        let first = if self.last == 0 { 1 } else { self.last + 2 };
        if id > first {
            push_bounded(&mut self.skipped, (first, id - 2), SKIPS_KEPT);
        }
        self.last = id;
    }

    /// Whether stream `id` is one the client skipped (never opened).
    pub(super) fn skipped(&self, id: u32) -> bool {
        self.skipped.iter().any(|&(a, b)| (a..=b).contains(&id))
    }

    /// The client ended its side of stream `id` with END_STREAM.
    pub(super) fn closed(&mut self, id: u32) {
        push_bounded(&mut self.closed, (id, false), CLOSED_KEPT);
    }

    /// The client reset stream `id` (RST_STREAM), relayed or not.
    pub(super) fn cancelled(&mut self, id: u32) {
        push_bounded(&mut self.closed, (id, true), CLOSED_KEPT);
    }

    /// Whether the client ended stream `id` (lately), or never opened it:
    /// its DATA or HEADERS there is STREAM_CLOSED (RFC 9113 §5.1, §6.1).
    pub(super) fn ended(&self, id: u32) -> bool {
        self.closed.iter().any(|&(c, _)| c == id) || self.skipped(id)
    }

    /// Whether the client sent END_STREAM on stream `id` (lately): nothing
    /// but PRIORITY, RST_STREAM and WINDOW_UPDATE may follow it, and on a
    /// stream that is closed HEADERS is a connection error STREAM_CLOSED
    /// (RFC 9113 §5.1, "closed").
    pub(super) fn finished(&self, id: u32) -> bool {
        self.closed.contains(&(id, false))
    }

    /// The client reset relayed stream `id`.
    pub(super) fn reset(&mut self, id: u32) {
        push_bounded(&mut self.reset, id, RESETS_KEPT);
    }

    /// Whether the client reset stream `id` lately: the application's
    /// header blocks for it still go on (the client must decode them for
    /// its table, RFC 9113 §5.1), so dropping them needs no re-encoding.
    pub(super) fn reset_lately(&self, id: u32) -> bool {
        self.reset.contains(&id)
    }

    /// For tests: as if the client had opened streams up to `id`.
    #[cfg(test)]
    pub(super) fn set_last(&mut self, id: u32) {
        self.last = id;
    }
}

fn push_bounded<T>(q: &mut VecDeque<T>, v: T, max: usize) {
    if q.len() >= max {
        q.pop_front();
    }
    q.push_back(v);
}
