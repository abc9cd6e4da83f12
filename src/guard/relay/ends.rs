//! The end of a relayed stream the guard decides (by the rules in
//! [`ending`](super::ending), whose state it works on), and how a stream is
//! counted once it is over. It stands above the stream store, which keeps
//! each stream's ending state (`ending::state`) and knows nothing of this
//! protocol.
//!
//! One protocol on every path that ends a stream: a drain, the max age, the
//! application's GOAWAY, `end_timeout`, and a forced end alike.
//! 1. At a message boundary, in the application's first pause (at once for
//!    a stream with no response yet), RST_STREAM(CANCEL) to the application.
//! 2. The barrier right behind the cancel: SETTINGS round trips
//!    ([`super::ending::state::Barrier`]), whose acks follow everything the application's
//!    transport wrote before it read the cancel.
//! 3. Every DATA frame that arrives before the ack is forwarded. A message
//!    begun after the cancel is held until it is whole ([`Held`]): the
//!    application's stack may cut it short when it reads the cancel, and
//!    the client never gets half a message.
//! 4. Once the ack is read (or the application's connection closed, which
//!    follows all it wrote), the client's end: trailers `grpc-status: 14`
//!    (or the kind's own end).
//!
//! No clock cuts the wait short but the ending's own bound, `end_timeout`
//! from the ask (never less than [`ACK_MIN`] from the cancel): past it the
//! end goes out unconfirmed, counted in `streams_ungraceful`, never as
//! graceful. A graceful end counts once its last frame has been written to
//! the client (the stream store keeps it
//! [`Unwritten`](crate::guard::relay::streams::Unwritten) until then); one
//! the connection's close drops is a cut. DATA of the application's that the
//! guard drops is counted in `stream_data_dropped_total` and logged.

use bytes::BytesMut;
use tokio::time::Instant;

use super::ending::state::{ends_in, Cancelled, ClosingEnds, Endings, Held, ACK_MIN, ENDED_KEPT};
use super::ending::{StreamOutcome, BURST_GAP};
use crate::guard::body::End;
use crate::guard::conn::ConnInfo;
use crate::guard::grpc;
use crate::guard::handle::Handle;
use crate::guard::relay::blocks::trailers_only;
use crate::guard::relay::peer::Peer;
use crate::guard::relay::settings::PeerSettings;
use crate::guard::relay::settings::Unacked;
use crate::guard::relay::streams::{Stream, Streams};
use crate::guard::relay::window::Window;
use crate::guard::relay::wire::{self, Head};
use crate::metrics::Dropped;

/// The parts of the relay a stream's end works on, borrowed from it for
/// one step (`Relay::ends`): the open streams, the endings and their
/// barrier, both peers, the client's connection window and the SETTINGS.
/// The connection's lifecycle, its ids and defences are not among them: an
/// ending never calls back into the rest of the relay.
pub(in crate::guard::relay) struct Ends<'a> {
    /// The guard's settings and counters.
    pub(in crate::guard::relay) guard: &'a Handle,
    /// Who the client is, for logs.
    pub(in crate::guard::relay) info: &'a ConnInfo,
    pub(in crate::guard::relay) streams: &'a mut Streams,
    pub(in crate::guard::relay) endings: &'a mut Endings,
    /// The client's peer: the ends written to it.
    pub(in crate::guard::relay) client: &'a mut Peer,
    /// The application's peer: the cancels and the barrier written to it.
    pub(in crate::guard::relay) app: &'a mut Peer,
    pub(in crate::guard::relay) window: &'a mut Window,
    pub(in crate::guard::relay) settings: &'a mut PeerSettings,
}

/// When stream `id`'s ending must be looked at next, `end_timeout` its
/// bound from the ask.
pub(in crate::guard::relay) fn ending_due(
    streams: &Streams,
    end_timeout: std::time::Duration,
    id: u32,
) -> Option<Instant> {
    let e = streams.get(&id).and_then(Stream::ending)?;
    if let Some(c) = e.cancelled {
        return Some(c.by);
    }
    [
        e.quiet_at,
        Some(e.forced_by.unwrap_or(e.asked + end_timeout)),
    ]
    .into_iter()
    .flatten()
    .min()
}

impl Ends<'_> {
    /// A header block the guard encoded to the client, after the table
    /// size update that is due, if one is.
    pub(in crate::guard::relay) fn own_block(&mut self, id: u32, block: &[u8], end_stream: bool) {
        let due = self.settings.take_update_due();
        self.client.put_own_block(id, block, end_stream, due);
    }

    /// Stream `id` was asked to end (by a drain, its connection's age, or
    /// the application's GOAWAY).
    pub(in crate::guard::relay) fn begin_end(&mut self, id: u32, now: Instant) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let Some(reason) = s.end_reason() else {
            return;
        };
        if s.ending().is_some() || s.resp_done() {
            return;
        }
        s.begin_ending(reason, now);
        self.endings.asked.push(id);
        self.advance(id, now);
    }

    /// Moves stream `id`'s ending on as far as it can go now.
    pub(in crate::guard::relay) fn advance(&mut self, id: u32, now: Instant) {
        let l = self.guard.config().limits;
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let Some(e) = s.ending() else {
            return;
        };
        if let Some(c) = e.cancelled {
            // What the application wrote before it read the cancel arrives
            // before the barrier's ack, and is forwarded; then the end.
            if c.acked || self.endings.barrier.acked >= c.barrier {
                self.close_ending(id, true);
            }
            return;
        }
        if !s.answered() {
            // Nothing of the response went out: cancelled at once, for the
            // kinds with a retryable answer of the guard's own (others are
            // left to answer until the bound). A head it wrote meanwhile
            // still goes on, and the stream ends at its boundary.
            if trailers_only(s.kind(), "").is_some() {
                self.cancel(id, now);
            }
            return;
        }
        if !s.endable() {
            // Left to finish until the bound (`timers`).
            return;
        }
        let (at_boundary, split, cadence, protocol) =
            (s.at_boundary(), s.split(), s.cadence(), s.protocol());
        let Some(e) = s.ending_mut() else {
            return;
        };
        if !at_boundary {
            e.quiet_at = None;
            return;
        }
        if e.forced_by.is_some() {
            // Past `end_timeout`, a producer that never pauses: at this boundary.
            self.cancel(id, now);
            return;
        }
        if e.quiet_at.is_none() {
            e.quiet_at = Some(match cadence.last() {
                // It just wrote: end in its pause.
                Some(t) if now.saturating_duration_since(t) < BURST_GAP => t + BURST_GAP,
                // Between two writes of a steady producer, the next one well
                // off: end now, on the schedule.
                _ if !split && cadence.far_from_next(now) => {
                    e.quiet = true;
                    now
                }
                // Quiet already: give it a moment to write once more.
                _ => {
                    e.quiet = true;
                    e.settling = true;
                    now + l.end_settle
                }
            });
        }
        let due = e.quiet_at.is_some_and(|at| now >= at);
        if due {
            e.quiet_at = None;
            if std::mem::take(&mut e.settling) {
                // No write came to time it by.
                self.guard.record_blind_ending(e.reason, protocol);
            }
        }
        if due {
            self.cancel(id, now);
        }
    }

    /// The ending's cancel: RST_STREAM(CANCEL) to the application, then the
    /// barrier, whose round trips start after it, so their acks follow
    /// everything the application wrote before it read the cancel.
    fn cancel(&mut self, id: u32, now: Instant) {
        let end_timeout = self.guard.config().limits.end_timeout;
        wire::rst(&mut self.app.write, id, wire::CANCEL);
        let barrier = self.barrier_target();
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        s.app_reset_sent();
        if let Some(e) = s.ending_mut() {
            e.quiet_at = None;
            // The ending's own bound (`end_timeout` from the ask, or the
            // forced end's), but never less than ACK_MIN for the ack.
            let bound = e.forced_by.unwrap_or(e.asked + end_timeout);
            e.cancelled = Some(Cancelled {
                barrier,
                by: bound.max(now + ACK_MIN),
                acked: false,
            });
        }
    }

    /// The client's end of stream `id`, its cancel `confirmed` by the
    /// barrier's ack (or the application's close), or not (its bound).
    pub(in crate::guard::relay) fn close_ending(&mut self, id: u32, confirmed: bool) {
        let Some(e) = self.streams.get(&id).and_then(Stream::ending) else {
            return;
        };
        // The application's stack cut this message short once it read the
        // cancel: the client never gets half of it.
        self.drop_held(id, "the application cut a message short after the guard's cancel; its start is dropped and the stream ends at the boundary before it");
        let reason = e.reason;
        let outcome = if confirmed {
            StreamOutcome::Ended(reason)
        } else {
            tracing::warn!(peer = %self.info.peer, conn = self.info.id, stream = id,
                "guard: the application did not acknowledge the cancel within end_timeout; ending the stream without its confirmation that nothing was still on its way");
            StreamOutcome::Unconfirmed(reason)
        };
        let Some(s) = self.streams.get(&id) else {
            return;
        };
        if !s.answered() {
            match trailers_only(s.kind(), grpc::end_message(reason)) {
                Some(block) => {
                    self.own_block(id, &block, true);
                    self.end_here(id, outcome);
                }
                None => self.reset_here(id),
            }
            return;
        }
        if !(s.endable() && s.at_boundary()) {
            // A message its transport cut short, past what could be held.
            self.reset_here(id);
            return;
        }
        if !self.end_gracefully(id, outcome) {
            if !confirmed {
                // Past the bound, and the client's stream window still
                // cannot take the end (gRPC-Web's trailer frame is DATA).
                self.reset_here(id);
                return;
            }
            // Waiting for the client's stream window, within the bound.
            let ending = self.streams.get_mut(&id).and_then(Stream::ending_mut);
            if let Some(c) = ending.and_then(|e| e.cancelled.as_mut()) {
                c.acked = true;
            }
        }
    }

    /// DATA on stream `id`, which is open, from the application (`frame`,
    /// its head `h`, its content `data`): on to the client, or, a message
    /// begun after the guard's cancel, held until it is whole.
    pub(in crate::guard::relay) fn app_data(
        &mut self,
        id: u32,
        h: Head,
        frame: &[u8],
        data: &[u8],
        now: Instant,
    ) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if s.sent(h.len, !data.is_empty(), now) {
            self.endings.stalled.insert(id);
        }
        let cancelled = s.app_cancelled();
        let end_stream = h.flags & wire::END_STREAM != 0;
        // After the cancel, a message not whole yet is held: the whole
        // messages of this frame go on, the start of the next waits.
        let hold = s.count_messages(data, cancelled && !end_stream);
        // A message is held (and whether that one is full).
        let holding = s.held().map(Held::full);
        match hold {
            None if data.is_empty() && !end_stream && holding.is_some() => {
                // Nothing of the message, but in its order: held with it.
                self.streams.hold_more(id, h.len, frame);
            }
            Some((0, from)) if holding != Some(true) => {
                // No boundary in it: all of it is the message being held.
                self.streams.hold(id, from, h.len, frame);
            }
            Some((whole, from)) if whole > 0 => {
                // Whole messages, then the start of one: split, the
                // padding given back (the client never counts it).
                self.release_held(id);
                wire::put(&mut self.client.write, wire::DATA, 0, id, &data[..whole]);
                let mut tail = BytesMut::new();
                wire::put(&mut tail, wire::DATA, 0, id, &data[whole..]);
                self.streams.hold(id, from, data.len() - whole, &tail);
                let padding = (h.len - data.len()) as u32;
                wire::window_update(&mut self.app.write, 0, padding);
                wire::window_update(&mut self.app.write, id, padding);
                if let Some(s) = self.streams.get_mut(&id) {
                    s.grow_window(i64::from(padding));
                }
            }
            _ => {
                // Whole (or past what may be held, or the app's own end).
                self.release_held(id);
                self.client.write.extend_from_slice(frame);
            }
        }
        if self.streams.holds_too_much() {
            self.relieve_holds();
        }
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if end_stream {
            self.app_ended(id);
        } else if s.ending().is_some() {
            self.data_while_ending(id, now);
        }
    }

    /// Frames of the application's other than DATA on stream `id` go on
    /// behind what was held of it, in order.
    pub(in crate::guard::relay) fn release_held(&mut self, id: u32) {
        if let Some(held) = self.streams.take_held(id) {
            self.client.write.extend_from_slice(&held.frames);
        }
    }

    /// The connection holds [`HOLD_MAX`](super::ending::state::HOLD_MAX) in
    /// messages begun after a cancel: the largest goes on as it is, so the
    /// app is read on and each can still finish (one its stack cuts short
    /// is then reset, never ended as if whole).
    fn relieve_holds(&mut self) {
        while self.streams.holds_too_much() {
            let Some(id) = self.streams.largest_held() else {
                return;
            };
            self.release_held(id);
        }
    }

    /// A held message the application's stack cut short: dropped whole,
    /// counted, its connection window given back; the stream is back at
    /// the boundary before it.
    pub(in crate::guard::relay) fn drop_held(&mut self, id: u32, why: &'static str) {
        let Some(window) = self.streams.drop_held(id) else {
            return;
        };
        tracing::warn!(peer = %self.info.peer, conn = self.info.id, stream = id, bytes = window, "guard: {why}");
        self.guard.record_dropped(Dropped::partial_message, window);
        wire::window_update(&mut self.app.write, 0, window as u32);
    }

    /// DATA for a stream no longer open (`h` its head): the connection
    /// window it took goes back to the application; on a stream the guard
    /// ended, it is a message the client never gets, so it is counted.
    pub(in crate::guard::relay) fn app_data_after_end(&mut self, h: Head) {
        wire::window_update(&mut self.app.write, 0, h.len as u32);
        if h.len > 0 && self.endings.ended.contains(&h.id) {
            tracing::warn!(peer = %self.info.peer, conn = self.info.id, stream = h.id, bytes = h.len,
                "guard: the application sent DATA on a stream the guard had already ended; dropped");
            self.guard.record_dropped(Dropped::after_end, h.len);
        }
    }

    /// Data arrived on a stream being ended: its pause starts again.
    fn data_while_ending(&mut self, id: u32, now: Instant) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let at_boundary = s.at_boundary();
        let Some(e) = s.ending_mut() else {
            return;
        };
        if e.cancelled.is_some() {
            // Written before the application read the cancel: forwarded; the
            // barrier already under way collects the rest.
            return;
        }
        // It writes: no longer a quiet stream, it ends in its next pause.
        e.quiet = false;
        e.settling = false;
        e.quiet_at = at_boundary.then_some(now + BURST_GAP);
        if e.forced_by.is_some() && at_boundary {
            // Forced: this data completed a message; the cancel right after it.
            self.cancel(id, now);
        }
    }

    /// The bound of stream `id`'s ending, at `now` (`timers`): past
    /// `end_timeout` a stream at a boundary is cancelled there, one
    /// mid-message gets one more bound to reach the next; past that, or
    /// past the cancel's own bound, it ends as it can.
    pub(in crate::guard::relay) fn ending_bound(&mut self, id: u32, now: Instant) {
        let l = self.guard.config().limits;
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let Some(e) = s.ending() else {
            return;
        };
        if let Some(c) = e.cancelled {
            if now >= c.by {
                if c.acked {
                    // Acked, but the client's stream window never opened.
                    self.reset_here(id);
                } else {
                    self.close_ending(id, false);
                }
            }
            return;
        }
        if let Some(by) = e.forced_by {
            if now >= by {
                self.reset_here(id);
            }
            return;
        }
        if now < e.asked + l.end_timeout {
            return;
        }
        if !s.endable() && s.answered() {
            self.reset_here(id);
            return;
        }
        if let Some(e) = s.ending_mut() {
            e.forced_by = Some(now + l.end_timeout);
        }
        if !s.answered() {
            // No answer in time (a kind without the guard's own).
            self.reset_here(id);
        } else if s.at_boundary() {
            // A producer that never paused: the cancel at this boundary.
            self.cancel(id, now);
        }
    }

    /// The barrier round trip a stream asking now must wait for: the second
    /// one started from now on (see [`super::ending::state::Barrier`]).
    pub(in crate::guard::relay) fn barrier_target(&mut self) -> u64 {
        // The caller wrote its cancel just now: only round trips started
        // after it count, whatever turn the one in flight began in.
        let target = if self.endings.barrier.acked >= self.endings.barrier.sent {
            self.send_barrier();
            self.endings.barrier.sent + 1
        } else {
            // One is in flight, sent before the cancel: the next two count.
            self.endings.barrier.sent + 2
        };
        self.endings.barrier.wanted = self.endings.barrier.wanted.max(target);
        target
    }

    /// Starts a barrier round trip: an empty SETTINGS frame to the application.
    pub(in crate::guard::relay) fn send_barrier(&mut self) {
        self.endings.barrier.sent += 1;
        wire::put(&mut self.app.write, wire::SETTINGS, 0, 0, &[]);
        self.settings
            .sent(Unacked::Barrier(self.endings.barrier.sent));
    }

    /// The application acked barrier round trip `seq`: the next one starts
    /// if a stream still waits for a later one, and endings move on once
    /// the whole read is handled (`app_frames`).
    pub(in crate::guard::relay) fn barrier_acked(&mut self, seq: u64) {
        self.endings.barrier.acked = self.endings.barrier.acked.max(seq);
        if self.endings.barrier.wanted > self.endings.barrier.sent
            && self.endings.barrier.acked >= self.endings.barrier.sent
        {
            self.send_barrier();
        }
        self.endings.barrier.moved = true;
    }

    pub(in crate::guard::relay) fn check_endings(&mut self, now: Instant) {
        for id in self.endings.asked.clone() {
            self.advance(id, now);
        }
        self.endings
            .asked
            .retain(|id| self.streams.get(id).is_some_and(|s| s.ending().is_some()));
    }

    /// The guard's own end at a boundary: trailers for gRPC, the trailer
    /// frame for gRPC-Web, the body's end for SSE. False when it has to wait
    /// for the client's stream window (gRPC-Web's trailer frame is DATA).
    fn end_gracefully(&mut self, id: u32, outcome: StreamOutcome) -> bool {
        let Some(s) = self.streams.get(&id) else {
            return true;
        };
        let message = match outcome {
            StreamOutcome::Ended(r) | StreamOutcome::Unconfirmed(r) => grpc::end_message(r),
            _ => grpc::UPSTREAM_LOST_MESSAGE,
        };
        match s.bounds().and_then(|b| b.ending(message)) {
            Some(End::Trailers(t)) => {
                let fields: Vec<(&str, &str)> = t
                    .iter()
                    .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)))
                    .collect();
                let block = wire::literal_block(&fields);
                self.own_block(id, &block, true);
            }
            Some(End::Last(data)) => {
                if data.len() as i64 > s.window() {
                    // The client's window for this stream cannot take it yet:
                    // its WINDOW_UPDATE moves the end on; the bound resets it.
                    return false;
                }
                if let Some(s) = self.streams.get_mut(&id) {
                    s.spend(data.len());
                }
                self.own_data(id, &data, true);
            }
            None => {
                self.reset_here(id);
                return true;
            }
        }
        self.end_here(id, outcome);
        true
    }

    /// The application's connection closed cleanly (its end of file read,
    /// nothing of a frame left unread) while stream `id` was being ended,
    /// its cancel sent: its close follows everything it wrote, so at a
    /// boundary this is the guard's graceful end after all. False if the
    /// stream still needs the end of a lost connection.
    pub(in crate::guard::relay) fn end_on_app_close(&mut self, id: u32) -> bool {
        let Some(s) = self.streams.get_mut(&id) else {
            return true;
        };
        let Some(e) = s.ending().filter(|e| e.cancelled.is_some()) else {
            return false;
        };
        self.drop_held(
            id,
            "the application closed its connection with a message cut short; its start is dropped",
        );
        let Some(s) = self.streams.get(&id) else {
            return true;
        };
        if !s.answered() {
            // Never answered: the guard's own retryable answer, as at the ack.
            let Some(block) = trailers_only(s.kind(), grpc::end_message(e.reason)) else {
                return false;
            };
            self.own_block(id, &block, true);
            self.end_here(id, StreamOutcome::Ended(e.reason));
            return true;
        }
        s.endable() && s.at_boundary() && self.end_gracefully(id, StreamOutcome::Ended(e.reason))
    }

    /// No safe end point in time: REFUSED_STREAM for gRPC (retryable),
    /// CANCEL otherwise (an aborted response, never one that looks whole).
    pub(in crate::guard::relay) fn reset_here(&mut self, id: u32) {
        let Some(s) = self.streams.get(&id) else {
            return;
        };
        let code = if s.grpc() {
            wire::REFUSED_STREAM
        } else {
            wire::CANCEL
        };
        tracing::warn!(peer = %self.info.peer, stream = id,
            "guard: stream could not reach a safe end point in time; reset (REFUSED_STREAM for gRPC: retryable)");
        // What it held goes on as it came: the reset says it is not whole.
        self.release_held(id);
        wire::rst(&mut self.client.write, id, code);
        self.end_here(id, StreamOutcome::Reset);
    }

    /// Stream `id`, whose application side was open, was ended by the
    /// guard: DATA the application still sends on it is counted as dropped.
    pub(in crate::guard::relay) fn remember_ended(&mut self, id: u32) {
        if self.endings.ended.len() >= ENDED_KEPT {
            self.endings.ended.pop_front();
        }
        self.endings.ended.push_back(id);
    }

    /// The client got the guard's end of stream `id`: the application's
    /// stream is cancelled, and the client's request stopped if unfinished.
    pub(in crate::guard::relay) fn end_here(&mut self, id: u32, outcome: StreamOutcome) {
        let Some(mut s) = self.streams.remove(&id) else {
            return;
        };
        let cancelled = s.app_cancelled();
        if !s.resp_done() {
            if !cancelled {
                wire::rst(&mut self.app.write, id, wire::CANCEL);
            }
            self.remember_ended(id);
        }
        if !s.req_done() && outcome != StreamOutcome::Reset {
            wire::rst(&mut self.client.write, id, wire::NO_ERROR);
        }
        if let StreamOutcome::Ended(reason) = outcome {
            // Counted once written (`settle_written`).
            s.record(&outcome);
            self.streams.end_unwritten(id, reason, s);
            return;
        }
        self.finish(s, outcome);
    }

    /// A stream is over for the guard: metrics, signals, registry.
    pub(in crate::guard::relay) fn finish(&mut self, mut s: Stream, outcome: StreamOutcome) {
        let guard = self.guard;
        let protocol = s.protocol();
        if let Some(held) = s.take_held() {
            // A message begun after the cancel, never whole: dropped with
            // the stream, its connection window given back. Counted unless
            // the client itself gave up the stream.
            wire::window_update(&mut self.app.write, 0, held.window as u32);
            if outcome != StreamOutcome::ClientGone {
                tracing::warn!(peer = %self.info.peer, conn = self.info.id, bytes = held.window,
                    "guard: a stream closed with a message begun after the guard's cancel still incomplete; its start is dropped");
                guard.record_dropped(Dropped::partial_message, held.window);
            }
        }
        match outcome {
            StreamOutcome::Ended(reason) => guard.record_termination(reason, protocol),
            StreamOutcome::Unconfirmed(reason) => guard.record_ungraceful(reason, protocol),
            StreamOutcome::Reset => {
                if let Some(reason) = s.end_reason() {
                    guard.record_ungraceful(reason, protocol);
                }
            }
            _ => {}
        }
        s.record(&outcome);
    }

    /// Graceful ends whose last frame has left the client's write buffer
    /// are counted; with `cut` (the connection closes: the ids whose end
    /// never left), those are counted as cut, and every other as written.
    pub(in crate::guard::relay) fn settle_written(
        &mut self,
        cut: Option<&std::collections::HashSet<u32>>,
    ) {
        if !self.streams.has_unwritten() {
            return;
        }
        // Nothing left the buffer since the last look: nothing more to count.
        if cut.is_none() && self.endings.settled == Some(self.window.drained()) {
            return;
        }
        self.endings.settled = Some(self.window.drained());
        // Ends still queued, and one a write stopped inside.
        let queued: std::collections::HashSet<u32> =
            ends_in(&self.client.write[self.window.front()..])
                .into_iter()
                .map(|(id, _)| id)
                .chain(self.window.partial_end())
                .collect();
        let guard = self.guard;
        let info = self.info;
        self.streams.retain_unwritten(|u| {
            let protocol = u.stream.protocol();
            match cut {
                Some(cut) if cut.contains(&u.id) => {
                    tracing::warn!(peer = %info.peer, conn = info.id, stream = u.id,
                        "guard: the connection closed before the stream's graceful end was written; it is cut");
                    guard.record_ungraceful(u.reason, protocol);
                    false
                }
                None if queued.contains(&u.id) => true,
                _ => {
                    guard.record_termination(u.reason, protocol);
                    false
                }
            }
        });
    }

    /// The connection closes: where each end still queued lies, found
    /// before the window's cut, which then drops what it never cleared (an
    /// end behind it is cut with it).
    pub(in crate::guard::relay) fn closing_ends(&mut self) -> ClosingEnds {
        let front = self.window.front();
        let ends = ClosingEnds {
            front,
            ends: ends_in(&self.client.write[front..]),
            partial: self.window.partial_end(),
        };
        self.window.drop_uncleared(&mut self.client.write);
        ends
    }

    /// The last flush wrote `written` bytes of the client's write buffer:
    /// the ends it got out are written, every other is cut.
    pub(in crate::guard::relay) fn settle_closed(&mut self, c: &ClosingEnds, written: usize) {
        let cut = c
            .ends
            .iter()
            .filter(|&&(_, end)| c.front + end > written)
            .map(|&(id, _)| id)
            .chain(c.partial.filter(|_| written < c.front))
            .collect();
        self.settle_written(Some(&cut));
    }

    /// The connection closes with streams still open: each the guard was
    /// asked to end is cut, and counted (the run loop logged how many).
    pub(in crate::guard::relay) fn cut_open(&mut self) {
        for s in self.streams.drain() {
            if let Some(reason) = s.end_reason() {
                self.guard.record_ungraceful(reason, s.protocol());
            }
        }
    }

    /// DATA of the guard's own to the client, in frames the client takes;
    /// the application's view of the connection window does not know of it.
    pub(in crate::guard::relay) fn own_data(&mut self, id: u32, data: &[u8], end_stream: bool) {
        self.client.put_data(id, data, end_stream);
        self.window.owe(data.len());
    }

    /// Removes stream `id` once both its directions are over.
    /// The application's END_STREAM on stream `id`: its answer is whole,
    /// and wins over an ending of the guard's. If the guard had already
    /// reset the application's side (the ending's cancel), the rest of the
    /// request has nowhere to go: the client is asked to stop sending it
    /// (RST_STREAM(NO_ERROR) behind the answer, RFC 9113 §8.1), as after the
    /// guard's own end, and the stream is over, completed.
    pub(in crate::guard::relay) fn app_ended(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        s.response_ended();
        if s.app_cancelled() && !s.req_done() {
            wire::rst(&mut self.client.write, id, wire::NO_ERROR);
            if let Some(s) = self.streams.remove(&id) {
                self.finish(s, StreamOutcome::Completed);
            }
            return;
        }
        self.maybe_done(id);
    }

    pub(in crate::guard::relay) fn maybe_done(&mut self, id: u32) {
        if self
            .streams
            .get(&id)
            .is_some_and(|s| s.req_done() && s.resp_done())
        {
            if let Some(s) = self.streams.remove(&id) {
                self.finish(s, StreamOutcome::Completed);
            }
        }
    }
}
