//! The connection's life on the relay: the lifecycle machine's inputs and
//! actions, the GOAWAY sequence to the client (the application never sees
//! it), the application's own GOAWAY, the timers, and how the connection
//! fails or closes.

use std::sync::Arc;

use tokio::time::Instant;

use super::blocks::{trailers_only, unavailable_block};
use super::ending::StreamOutcome;
use super::failure::Failure;
use super::next::Next;
use super::streams::Stream;
use super::wire;
use super::Relay;
use crate::guard::body::End;
use crate::guard::grpc;
use crate::guard::lifecycle::{Cause, ConnAction, Input};
use crate::guard::registry::StreamCtl;
use crate::metrics::Reason;

impl Relay<'_> {
    /// The first timers: streams the client took no data on past
    /// `write_stall_timeout`, and the end of a flood pause (the client's
    /// frames already read go on next, before the other timers).
    pub(super) fn stall_timers(&mut self, now: Instant) -> Next {
        let l = self.guard.config().limits;
        for id in std::mem::take(&mut self.endings.stalled) {
            match self.streams.get(&id).and_then(Stream::shut_since) {
                Some(at) if now >= at + l.write_stall_timeout => {
                    tracing::info!(peer = %self.info.peer, stream = id, timeout = ?l.write_stall_timeout,
                        "guard: the client took no data; resetting its stream");
                    wire::rst(&mut self.client.write, id, wire::CANCEL);
                    wire::rst(&mut self.app.write, id, wire::CANCEL);
                    // The guard cuts it: a message held after its cancel is
                    // dropped and counted.
                    self.drop_held(
                        id,
                        "the client took no data; a message begun after the guard's cancel is dropped with its stream",
                    );
                    if let Some(s) = self.streams.remove(&id) {
                        // One being ended is cut: counted as such, and what
                        // the app still sends on it counted as dropped.
                        if let (Some(reason), Some(_)) = (s.end_reason(), s.ending()) {
                            self.guard.record_ungraceful(reason, s.protocol());
                            if !s.resp_done() {
                                self.remember_ended(id);
                            }
                        }
                        self.finish(s, StreamOutcome::ClientGone);
                    }
                }
                Some(_) => {
                    self.endings.stalled.insert(id);
                }
                None => {}
            }
        }
        if self.defences.resume(now) {
            return Next::ClientFrames;
        }
        Next::Done
    }

    /// The other timers: endings past their bounds, planned ends, and the
    /// lifecycle's.
    pub(super) fn bound_timers(&mut self, now: Instant) {
        for id in self.endings.asked.clone() {
            self.ending_bound(id, now);
        }
        self.ask_planned(now);
        self.check_endings(now);
        if self.life.sweep_at().is_some_and(|at| now >= at) {
            // Those grown long-lived since the application's GOAWAY: now.
            self.end_long_lived(std::time::Duration::ZERO, now);
        }
        let d = self.life.machine().deadlines();
        for (at, input) in [
            (d.age, Input::AgeReached),
            (d.ack, Input::AckTimedOut),
            (d.grace, Input::GraceOver),
            (d.first_stream, Input::HeaderTimedOut),
            (d.idle, Input::IdleTimedOut),
        ] {
            if at.is_some_and(|at| now >= at) {
                self.step(input, now);
            }
        }
    }

    /// Only streams still open and still shut keep a stall timer: the set
    /// never outgrows the table, whether or not a timer ran since.
    pub(super) fn prune_stalled(&mut self) {
        let streams = &self.streams;
        self.endings
            .stalled
            .retain(|id| streams.get(id).is_some_and(|s| s.shut_since().is_some()));
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let l = self.guard.config().limits;
        let d = self.life.machine().deadlines();
        let mut next = [
            self.defences.paused_until(),
            self.endings.planned.front().map(|p| p.at),
            self.life.sweep_at(),
            self.life.close_deadline(),
            d.age,
            d.ack,
            d.grace,
            d.first_stream,
            d.idle,
        ]
        .into_iter()
        .flatten()
        .min();
        for id in &self.endings.stalled {
            if let Some(at) = self.streams.get(id).and_then(Stream::shut_since) {
                next = next.into_iter().chain([at + l.write_stall_timeout]).min();
            }
        }
        for &id in &self.endings.asked {
            next = next.into_iter().chain(self.ending_due(id)).min();
        }
        next
    }

    /// The application's connection is gone: every open stream gets the
    /// retryable end it can still get, and the client a GOAWAY.
    pub(super) fn app_lost(&mut self, clean: bool) {
        // Only a clean close with no frame left half read follows all the
        // application wrote.
        let clean = clean && self.app.read.is_empty();
        tracing::debug!(peer = %self.info.peer, conn = self.info.id, streams = self.streams.len(), "guard: the application closed its connection");
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            // Being ended, its cancel sent: an app in its graceful stop
            // closes once its last stream is cancelled, without acking the
            // barrier. Its close follows everything it wrote.
            if clean && self.end_on_app_close(id) {
                continue;
            }
            // A message begun after the cancel never finished: dropped and
            // counted, the stream back at the boundary before it.
            self.drop_held(
                id,
                "the application's connection closed in a message begun after the guard's cancel; its start is dropped",
            );
            let Some(s) = self.streams.get(&id) else {
                continue;
            };
            let block = if !s.answered() {
                trailers_only(s.kind(), grpc::UPSTREAM_LOST_MESSAGE)
            } else if s.endable() && s.at_boundary() {
                match s
                    .bounds()
                    .and_then(|b| b.ending(grpc::UPSTREAM_LOST_MESSAGE))
                {
                    Some(End::Trailers(_)) => Some(unavailable_block(grpc::UPSTREAM_LOST_MESSAGE)),
                    _ => None,
                }
            } else {
                None
            };
            let grpc = s.grpc();
            match block {
                Some(b) => self.own_block(id, &b, true),
                None => wire::rst(
                    &mut self.client.write,
                    id,
                    if grpc {
                        wire::REFUSED_STREAM
                    } else {
                        wire::CANCEL
                    },
                ),
            }
            if let Some(mut s) = self.streams.remove(&id) {
                s.record(&StreamOutcome::UpstreamFailed);
                self.guard.record_app_lost();
            }
        }
        self.app.write.clear();
        self.close_with(self.life.app_code());
    }

    /// A connection error: GOAWAY with its code, then close.
    pub(super) fn fail(&mut self, f: Failure) {
        let code = match f {
            Failure::Protocol(_) => wire::PROTOCOL_ERROR,
            Failure::Compression => wire::COMPRESSION_ERROR,
            Failure::Calm => wire::ENHANCE_YOUR_CALM,
            Failure::FrameSize(_) => wire::FRAME_SIZE_ERROR,
            Failure::FlowControl => wire::FLOW_CONTROL_ERROR,
            Failure::StreamClosed(_) => wire::STREAM_CLOSED,
            Failure::AppProtocol | Failure::NotHttp2 => {
                // The application broke the protocol: like losing it.
                return self.app_lost(false);
            }
        };
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            if let Some(s) = self.streams.remove(&id) {
                self.finish(s, StreamOutcome::ClientGone);
            }
        }
        self.close_with(code);
    }

    pub(super) fn close_with(&mut self, code: u32) {
        if self.life.closing() {
            return;
        }
        if self.handshake.app_pending {
            // Nothing from the application yet: the guard's own (empty)
            // SETTINGS are the server's preface before its GOAWAY.
            wire::put(&mut self.client.write, wire::SETTINGS, 0, 0, &[]);
            self.settings.tell_streams(None);
            self.handshake.replay = None;
        }
        self.life
            .goaway(&mut self.client.write, self.ids.last(), code);
        self.life
            .close_by(Instant::now() + self.guard.config().limits.shutdown_timeout);
    }

    /// The application sent GOAWAY: no stream above `last` reaches it, and
    /// it is on its way out (a graceful stop, as gRPC servers do on
    /// SIGTERM: GOAWAY(2^31-1), PING, GOAWAY(last), then the grace). Never
    /// relayed as it is: the client gets the guard's own sequence, whose
    /// last-stream ids never grow. Streams above `last` are refused
    /// retryably; the long-lived ones are ended gracefully over
    /// `app_shutdown_spread`, before the application's grace cuts them;
    /// short calls finish.
    pub(super) fn app_goaway(&mut self, last: u32, code: u32, now: Instant) {
        let (last, first) = self.life.app_goaway(last, code);
        let mut above: Vec<u32> = self
            .streams
            .keys()
            .copied()
            .filter(|&id| id > last)
            .collect();
        above.sort_unstable();
        for id in above {
            // The application never processed it: safe to retry anywhere.
            wire::rst(&mut self.client.write, id, wire::REFUSED_STREAM);
            if let Some(s) = self.streams.remove(&id) {
                self.finish(s, StreamOutcome::Refused);
            }
        }
        if !first {
            return;
        }
        let guard = self.guard;
        tracing::info!(peer = %self.info.peer, conn = self.info.id, last, code,
            "guard: the application sent GOAWAY; ending this connection's long-lived streams gracefully");
        self.step(Input::AppGoaway, now);
        self.end_long_lived(guard.config().app_shutdown_spread, now);
    }

    pub(super) fn count_changed(&mut self, now: Instant) {
        let n = self.streams.len() + self.locals.len();
        if self.life.count_changed(n) {
            self.step(Input::Streams(n), now);
        }
    }

    pub(super) fn step(&mut self, input: Input, now: Instant) {
        if matches!(input, Input::Acked) {
            // The client has the first GOAWAY: the final one names the last
            // stream the application will see.
            self.life
                .goaway(&mut self.client.write, self.ids.last(), wire::NO_ERROR);
        }
        if matches!(input, Input::AckTimedOut) {
            tracing::info!(peer = %self.info.peer, conn = self.info.id,
                "guard: no PING ack after GOAWAY; refusing new streams and sending the final GOAWAY once idle");
        }
        match self.life.step(input, now) {
            None => {}
            Some(ConnAction::Goaway(cause)) => {
                tracing::debug!(peer = %self.info.peer, conn = self.info.id, ?cause, "guard: GOAWAY");
                if self.handshake.app_pending {
                    // The server's SETTINGS come first: after the application's.
                    self.handshake.goaway_held = true;
                } else {
                    self.life.first_goaway(&mut self.client.write);
                }
                if let Some(reason) = metric_reason(cause) {
                    self.guard.record_goaway(reason);
                }
            }
            Some(ConnAction::EndStreams) => {
                let guard = self.guard;
                let streams =
                    guard.connection_streams(self.info.id, now, guard.config().long_stream_age);
                let window = self.life.machine().end_window(now);
                self.plan_ends(streams, window, Reason::max_age, now);
            }
            Some(ConnAction::Close) => self.close_with(wire::NO_ERROR),
        }
    }

    /// After the application's GOAWAY: the streams long-lived by now (and
    /// not already asked to end) are ended over `spread`; the next look is
    /// one spread later, for as long as streams are open.
    pub(super) fn end_long_lived(&mut self, spread: std::time::Duration, now: Instant) {
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
    fn plan_ends(
        &mut self,
        streams: Vec<Arc<StreamCtl>>,
        window: std::time::Duration,
        reason: Reason,
        now: Instant,
    ) {
        self.endings.plan(streams, window, reason, now);
        self.ask_planned(now);
    }

    /// The planned ends that are due: asked, and begun.
    fn ask_planned(&mut self, now: Instant) {
        self.endings.ask_due(now);
        for id in self.endings.queue.take() {
            self.begin_end(id, now);
        }
    }
}

/// The metrics label, for the causes the contract counts.
pub(super) fn metric_reason(cause: Cause) -> Option<Reason> {
    match cause {
        Cause::MaxAge => Some(Reason::max_age),
        Cause::Drain => Some(Reason::drain),
        Cause::App => Some(Reason::app_shutdown),
        Cause::Idle => None,
    }
}
