//! The graceful end of a relayed stream, by the rules in
//! [`crate::guard::ending`]: at a message boundary, in the application's
//! first pause, its stream is cancelled (RST_STREAM(CANCEL)) and the
//! barrier started behind the cancel (two SETTINGS round trips, see
//! [`Barrier`]); what the application wrote before it read the cancel is
//! forwarded, then trailers `grpc-status: 14` (or the kind's own end) to
//! the client. And how a stream is counted once it is over.

use std::sync::Arc;

use tokio::time::Instant;

use super::blocks::trailers_only;
use super::cadence::Cadence;
use super::settings::Unacked;
use super::window::put_data;
use super::wire;
use super::Relay;
use crate::guard::body::{BodyKind, Boundaries, End};
use crate::guard::ending::{record_outcome, StreamOutcome, BARRIER_WAIT, BURST_GAP};
use crate::guard::grpc;
use crate::guard::registry::{EndQueue, Registered};
use crate::guard::signals;
use crate::metrics::{Reason, StreamProtocol};

/// One relayed stream.
pub(super) struct Stream {
    /// Its entry in the guard's registry (dropped: removed).
    pub(super) reg: Registered,
    /// The request's kind, by its content type.
    pub(super) kind: BodyKind,
    /// The response's boundaries, once its head arrived.
    pub(super) bounds: Option<Boundaries>,
    /// The client ended its request (END_STREAM).
    pub(super) req_done: bool,
    /// The application ended its response (END_STREAM).
    pub(super) resp_done: bool,
    pub(super) started: Instant,
    /// Response messages (or events) so far.
    pub(super) messages: u64,
    /// When the application sends data on it.
    pub(super) cadence: Cadence,
    pub(super) ending: Option<Ending>,
    pub(super) sig: Option<signals::Request>,
    /// The client's window for this stream's response data, and since when
    /// it has been shut (the client takes nothing: `write_stall_timeout`).
    pub(super) window: i64,
    pub(super) shut_since: Option<Instant>,
    /// A message of its response spanned DATA frames: one could be half
    /// on its way when the application reads a cancel.
    pub(super) split: bool,
    /// With a content-length, the bytes of the request still to come: its
    /// DATA must add up to it (RFC 9113 §8.1.1).
    pub(super) body_left: Option<u64>,
}

impl Stream {
    pub(super) fn answered(&self) -> bool {
        self.bounds.is_some()
    }

    pub(super) fn at_boundary(&self) -> bool {
        self.bounds.as_ref().is_some_and(Boundaries::at_boundary)
    }

    pub(super) fn endable(&self) -> bool {
        self.bounds.as_ref().is_some_and(Boundaries::endable)
    }

    pub(super) fn grpc(&self) -> bool {
        self.reg.ctl.grpc
    }

    pub(super) fn protocol(&self) -> StreamProtocol {
        if self.grpc() {
            StreamProtocol::grpc
        } else {
            StreamProtocol::http
        }
    }
}

/// A stream being ended, and how far it got.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ending {
    pub(super) reason: Reason,
    /// When the end was asked: `end_timeout` counts from here.
    pub(super) asked: Instant,
    /// At a boundary: the barrier starts then, unless data comes first.
    pub(super) quiet_at: Option<Instant>,
    /// Waiting for the ack of this barrier round trip, at most until the instant.
    pub(super) barrier: Option<(u64, Instant)>,
    /// Past `end_timeout` mid-message: the next boundary ends it, but no
    /// later than this.
    pub(super) forced_by: Option<Instant>,
    /// The stream was quiet when asked (and, its messages spanning frames,
    /// wrote nothing during its `end_settle`): its end may meet its next
    /// message at any moment.
    pub(super) quiet: bool,
    /// Waiting `end_settle` for a write that would time the end: if none
    /// comes, the end begins at a moment nothing timed (counted).
    pub(super) settling: bool,
    /// RST_STREAM(CANCEL) went to the application, ahead of the barrier:
    /// what it wrote before it read the cancel is still forwarded, and the
    /// client's end comes once the barrier is acked.
    pub(super) cancelled: bool,
}

/// The streams of a connection being ended, and what their ends wait for.
#[derive(Debug, Default)]
pub(super) struct Endings {
    /// Where the registry puts the ids of this connection's streams a
    /// drain or the max age asks to end.
    pub(super) queue: Arc<EndQueue>,
    /// Streams being ended.
    pub(super) asked: Vec<u32>,
    /// Streams whose client window was shut (some may have opened since).
    pub(super) stalled: Vec<u32>,
    /// The barrier on the application connection (SETTINGS round trips).
    pub(super) barrier: Barrier,
}

/// The barrier on the application connection: round trips of empty
/// SETTINGS frames, one in flight at a time, shared by every stream waiting
/// for one. A SETTINGS ack, like a PING ack, follows what the application
/// had written before it, but an application's HTTP/2 stack may write an
/// ack ahead of DATA it already queued (h2 does, so a tonic app under load
/// did, and a message was lost); it writes that DATA before it has even
/// read the next frame. So a stream waits for two round trips, the second
/// sent on the first one's ack.
///
/// SETTINGS, not PING: every gRPC server counts a PING that comes less than
/// five minutes after the last one, with no DATA or HEADERS written since,
/// as a strike, and closes the connection at the third (grpc-go, grpc-java,
/// C-core: GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings")). A quiet stream's
/// ending would spend that budget at once. No server limits SETTINGS so
/// (RFC 9113 §6.5: an empty SETTINGS frame changes nothing and must be
/// acked), and the acks come in order, in the queue of what the relay sent
/// (`Settings::sent`). The guard sends no PING to the application.
#[derive(Debug, Default)]
pub(super) struct Barrier {
    /// Round trips started, and the highest one acked.
    pub(super) sent: u64,
    pub(super) acked: u64,
    /// The highest round trip a waiting stream needs acked; another is
    /// started on each ack until it has been.
    pub(super) wanted: u64,
    /// When the last one started: one started in the same turn as a
    /// stream's ask counts as started after it.
    pub(super) started_at: Option<Instant>,
    /// An ack came in the read being handled: the endings move on once all
    /// of that read is (a frame behind the ack is forwarded first).
    pub(super) moved: bool,
}

impl Relay<'_> {
    /// Stream `id` was asked to end (by a drain, or its connection's age).
    pub(super) fn begin_end(&mut self, id: u32, now: Instant) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let Some(reason) = s.reg.ctl.reason() else {
            return;
        };
        if s.ending.is_some() || s.resp_done {
            return;
        }
        s.ending = Some(Ending {
            reason,
            asked: now,
            quiet_at: None,
            barrier: None,
            forced_by: None,
            quiet: false,
            settling: false,
            cancelled: false,
        });
        self.endings.asked.push(id);
        self.advance(id, now);
    }

    /// Moves stream `id`'s ending on as far as it can go now.
    pub(super) fn advance(&mut self, id: u32, now: Instant) {
        let l = self.guard.config().limits;
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let Some(mut e) = s.ending else {
            return;
        };
        if !s.answered() {
            // Nothing of the response went out: a retryable answer of the
            // guard's own, for the kinds that have one.
            if let Some(block) = trailers_only(s.kind, grpc::end_message(e.reason)) {
                self.own_block(id, &block, true);
                self.end_here(id, StreamOutcome::Ended(e.reason));
            }
            return;
        }
        if !s.endable() {
            // Left to finish until the bound (`timers`).
            return;
        }
        // Nothing the application writes for it waits for window.
        let open = s.window > 0 && s.shut_since.is_none() && self.window.available() > 0;
        let split = s.split;
        let protocol = s.protocol();
        if e.cancelled {
            // The application was told to stop; what it wrote before it read
            // that arrives before the barrier's acks, and is forwarded. Then
            // the client's end: graceful at a boundary (or, waiting for the
            // client's window, within `timers`' bound), or, a message its
            // transport cut short, a retryable reset.
            let at_boundary = s.at_boundary();
            let acked = e
                .barrier
                .is_some_and(|(seq, by)| self.endings.barrier.acked >= seq || now >= by);
            if acked && at_boundary {
                let _ = self.end_gracefully(id, e.reason);
            } else if acked {
                self.reset_here(id);
            }
            return;
        }
        if !s.at_boundary() {
            e.quiet_at = None;
            e.barrier = None;
        } else if let Some((seq, by)) = e.barrier {
            if (self.endings.barrier.acked >= seq || now >= by) && self.end_gracefully(id, e.reason)
            {
                return;
            }
        } else if e.quiet_at.is_none() {
            e.quiet_at = Some(match s.cadence.last() {
                // It just wrote: end in its pause.
                Some(t) if now.saturating_duration_since(t) < BURST_GAP => t + BURST_GAP,
                // Between two writes of a steady producer, the next one well
                // off: end now, on the schedule.
                _ if !split && s.cadence.far_from_next(now) => {
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
        if e.quiet_at.is_some_and(|at| now >= at) {
            e.quiet_at = None;
            if std::mem::take(&mut e.settling) {
                // No write came to time it by.
                self.guard.record_blind_ending(e.reason, protocol);
            }
            if open && (e.quiet || !split) {
                // The application is told to stop the stream first, then the
                // barrier, whose round trips start after the cancel, so their
                // acks follow everything it wrote before it read it: a
                // message on its way (the next tick of a quiet stream, or a
                // producer's write right after its pause) is still forwarded.
                e.cancelled = true;
                wire::rst(&mut self.app.write, id, wire::CANCEL);
            }
            // (A producer whose messages span frames, and one held back by
            // the client's window, may have a message half sent: for those
            // the barrier goes first, and the cancel with the trailers.)
            e.barrier = Some((self.barrier_target(now), now + BARRIER_WAIT));
        }
        if let Some(s) = self.streams.get_mut(&id) {
            s.ending = Some(e);
        }
    }

    /// Whether the guard cancelled the application's side of stream `id`
    /// while it ends it (its client's frames no longer go there).
    pub(super) fn app_cancelled(&self, id: u32) -> bool {
        self.streams
            .get(&id)
            .and_then(|s| s.ending)
            .is_some_and(|e| e.cancelled)
    }

    /// Data arrived on a stream being ended: its pause starts again.
    pub(super) fn data_while_ending(&mut self, id: u32, now: Instant) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let at_boundary = s.at_boundary();
        let Some(e) = s.ending.as_mut() else {
            return;
        };
        if e.cancelled {
            // Written before the application read the cancel: forwarded; the
            // barrier already under way collects the rest.
            return;
        }
        // It writes: no longer a quiet stream, it ends in its next pause.
        e.quiet = false;
        e.settling = false;
        e.barrier = None;
        e.quiet_at = at_boundary.then_some(now + BURST_GAP);
        if e.forced_by.is_some() && at_boundary {
            // Forced: this data completed a message; end right after it.
            let reason = e.reason;
            // If it must wait for the client's window, the forced bound holds.
            let _ = self.end_gracefully(id, reason);
        }
    }

    /// The barrier round trip a stream asking now must wait for: the second
    /// one started from now on (see [`Barrier`]).
    pub(super) fn barrier_target(&mut self, now: Instant) -> u64 {
        let target = if self.endings.barrier.acked >= self.endings.barrier.sent {
            self.send_barrier(now);
            self.endings.barrier.sent + 1
        } else if self.endings.barrier.started_at == Some(now) {
            // The one in flight started in this turn, after the ask.
            self.endings.barrier.sent + 1
        } else {
            // One is in flight: the next two count.
            self.endings.barrier.sent + 2
        };
        self.endings.barrier.wanted = self.endings.barrier.wanted.max(target);
        target
    }

    /// Starts a barrier round trip: an empty SETTINGS frame to the application.
    pub(super) fn send_barrier(&mut self, now: Instant) {
        self.endings.barrier.sent += 1;
        self.endings.barrier.started_at = Some(now);
        wire::put(&mut self.app.write, wire::SETTINGS, 0, 0, &[]);
        self.settings
            .sent(Unacked::Barrier(self.endings.barrier.sent));
    }

    /// The application acked barrier round trip `seq`: the next one starts
    /// if a stream still waits for a later one, and endings move on once
    /// the whole read is handled (`app_frames`).
    pub(super) fn barrier_acked(&mut self, seq: u64, now: Instant) {
        self.endings.barrier.acked = self.endings.barrier.acked.max(seq);
        if self.endings.barrier.wanted > self.endings.barrier.sent
            && self.endings.barrier.acked >= self.endings.barrier.sent
        {
            self.send_barrier(now);
        }
        self.endings.barrier.moved = true;
    }

    pub(super) fn check_endings(&mut self, now: Instant) {
        for id in self.endings.asked.clone() {
            self.advance(id, now);
        }
        self.endings
            .asked
            .retain(|id| self.streams.get(id).is_some_and(|s| s.ending.is_some()));
    }

    /// The guard's own end at a boundary: trailers for gRPC, the trailer
    /// frame for gRPC-Web, the body's end for SSE. False when it has to wait
    /// for the client's stream window (gRPC-Web's trailer frame is DATA).
    pub(super) fn end_gracefully(&mut self, id: u32, reason: Reason) -> bool {
        let Some(s) = self.streams.get(&id) else {
            return true;
        };
        match s
            .bounds
            .as_ref()
            .and_then(|b| b.ending(grpc::end_message(reason)))
        {
            Some(End::Trailers(t)) => {
                let fields: Vec<(&str, &str)> = t
                    .iter()
                    .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)))
                    .collect();
                let block = wire::literal_block(&fields);
                self.own_block(id, &block, true);
            }
            Some(End::Last(data)) => {
                if data.len() as i64 > s.window {
                    // The client's window for this stream cannot take it yet:
                    // its WINDOW_UPDATE moves the end on; the bound resets it.
                    return false;
                }
                if let Some(s) = self.streams.get_mut(&id) {
                    s.window -= data.len() as i64;
                }
                self.own_data(id, &data, true);
            }
            None => {
                self.reset_here(id);
                return true;
            }
        }
        self.end_here(id, StreamOutcome::Ended(reason));
        true
    }

    /// No safe end point in time: REFUSED_STREAM for gRPC (retryable),
    /// CANCEL otherwise (an aborted response, never one that looks whole).
    pub(super) fn reset_here(&mut self, id: u32) {
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
        wire::rst(&mut self.client.write, id, code);
        self.end_here(id, StreamOutcome::Reset);
    }

    /// The client got the guard's end of stream `id`: the application's
    /// stream is cancelled, and the client's request stopped if unfinished.
    pub(super) fn end_here(&mut self, id: u32, outcome: StreamOutcome) {
        let Some(s) = self.streams.remove(&id) else {
            return;
        };
        let cancelled = s.ending.is_some_and(|e| e.cancelled);
        if !s.resp_done && !cancelled {
            wire::rst(&mut self.app.write, id, wire::CANCEL);
        }
        if !s.req_done && outcome != StreamOutcome::Reset {
            wire::rst(&mut self.client.write, id, wire::NO_ERROR);
        }
        self.finish(s, outcome);
    }

    /// A stream is over for the guard: metrics, signals, registry.
    pub(super) fn finish(&mut self, mut s: Stream, outcome: StreamOutcome) {
        let guard = self.guard;
        let protocol = s.protocol();
        match outcome {
            StreamOutcome::Ended(reason) => guard.record_termination(reason, protocol),
            StreamOutcome::Reset => {
                if let Some(reason) = s.reg.ctl.reason() {
                    guard.record_ungraceful(reason, protocol);
                }
            }
            _ => {}
        }
        let grpc = s.grpc();
        if let Some(sig) = s.sig.as_mut() {
            record_outcome(sig, grpc, &outcome);
        }
    }

    /// DATA of the guard's own to the client, in frames the client takes;
    /// the application's view of the connection window does not know of it.
    pub(super) fn own_data(&mut self, id: u32, data: &[u8], end_stream: bool) {
        put_data(
            &mut self.client.write,
            id,
            data,
            end_stream,
            self.client.frame,
        );
        self.window.owe(data.len());
    }

    /// Removes stream `id` once both its directions are over.
    pub(super) fn maybe_done(&mut self, id: u32) {
        if self
            .streams
            .get(&id)
            .is_some_and(|s| s.req_done && s.resp_done)
        {
            if let Some(s) = self.streams.remove(&id) {
                self.finish(s, StreamOutcome::Completed);
            }
        }
    }
}
