//! The connection's life on the relay: the lifecycle machine's inputs and
//! actions, the GOAWAY sequence to the client (the application never sees
//! it), the application's own GOAWAY, the timers, and how the connection
//! fails or closes.

use std::sync::Arc;

use tokio::time::Instant;

use super::blocks::{trailers_only, unavailable_block};
use super::ending::StreamOutcome;
use super::ends::Ends;
use super::failure::Failure;
use super::ids::StreamIds;
use super::life::Life;
use super::local::Locals;
use super::sides::AppHandshake;
use super::streams::Stream;
use super::wire;
use crate::guard::body::End;
use crate::guard::grpc;
use crate::guard::lifecycle::{Cause, ConnAction, Input};
use crate::guard::registry::StreamCtl;
use crate::metrics::Reason;

/// The parts of the relay the connection's life, the application's
/// frames (`app.rs`) and the work on a client frame's stream
/// (`client/streams.rs`) work on, borrowed from it for one step
/// (`Relay::conn`): what an ending works on, the lifecycle, the client's
/// stream ids (for the GOAWAYs' last-stream id and the streams reset
/// lately; the client's frames open and close them), the application's
/// handshake (a GOAWAY waits for its SETTINGS) and the local WebSockets
/// (the application's INITIAL_WINDOW_SIZE is theirs too). The client's
/// defences, its preface and what goes with each forwarded request are
/// not among them (the client's frames get those beside it, in `Kept`).
pub(super) struct Conn<'a> {
    pub(super) ends: Ends<'a>,
    pub(super) life: &'a mut Life,
    pub(super) ids: &'a mut StreamIds,
    pub(super) handshake: &'a mut AppHandshake,
    pub(super) locals: &'a mut Locals,
}

impl Conn<'_> {
    /// The first timers: streams the client took no data on past
    /// `write_stall_timeout`.
    pub(super) fn stall_timers(&mut self, now: Instant) {
        let l = self.ends.guard.config().limits;
        for id in std::mem::take(&mut self.ends.endings.stalled) {
            match self.ends.streams.get(&id).and_then(Stream::shut_since) {
                Some(at) if now >= at + l.write_stall_timeout => {
                    tracing::info!(peer = %self.ends.info.peer, stream = id, timeout = ?l.write_stall_timeout,
                        "guard: the client took no data; resetting its stream");
                    wire::rst(&mut self.ends.client.write, id, wire::CANCEL);
                    if !self.ends.streams.app_cancelled(id) {
                        wire::rst(&mut self.ends.app.write, id, wire::CANCEL);
                    }
                    // The guard cuts it: a message held after its cancel is
                    // dropped and counted.
                    self.ends.drop_held(
                        id,
                        "the client took no data; a message begun after the guard's cancel is dropped with its stream",
                    );
                    if let Some(s) = self.ends.streams.remove(&id) {
                        // One being ended is cut: counted as such, and what
                        // the app still sends on it counted as dropped.
                        if let (Some(reason), Some(_)) = (s.end_reason(), s.ending()) {
                            self.ends.guard.record_ungraceful(reason, s.protocol());
                            if !s.resp_done() {
                                self.ends.remember_ended(id);
                            }
                        }
                        self.ends.finish(s, StreamOutcome::ClientGone);
                    }
                }
                Some(_) => {
                    self.ends.endings.stalled.insert(id);
                }
                None => {}
            }
        }
    }

    /// The other timers: endings past their bounds, planned ends, and the
    /// lifecycle's.
    pub(super) fn bound_timers(&mut self, now: Instant) {
        for id in self.ends.endings.asked.clone() {
            self.ends.ending_bound(id, now);
        }
        self.ask_planned(now);
        self.ends.check_endings(now);
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

    /// The application's connection is gone: every open stream gets the
    /// retryable end it can still get, and the client a GOAWAY.
    pub(super) fn app_lost(&mut self, clean: bool) {
        // Only a clean close with no frame left half read follows all the
        // application wrote.
        let clean = clean && self.ends.app.read.is_empty();
        tracing::debug!(peer = %self.ends.info.peer, conn = self.ends.info.id, streams = self.ends.streams.len(), "guard: the application closed its connection");
        let ids: Vec<u32> = self.ends.streams.keys().copied().collect();
        for id in ids {
            // Being ended, its cancel sent: an app in its graceful stop
            // closes once its last stream is cancelled, without acking the
            // barrier. Its close follows everything it wrote.
            if clean && self.ends.end_on_app_close(id) {
                continue;
            }
            // A message begun after the cancel never finished: dropped and
            // counted, the stream back at the boundary before it.
            self.ends.drop_held(
                id,
                "the application's connection closed in a message begun after the guard's cancel; its start is dropped",
            );
            let Some(s) = self.ends.streams.get(&id) else {
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
                Some(b) => self.ends.own_block(id, &b, true),
                None => wire::rst(
                    &mut self.ends.client.write,
                    id,
                    if grpc {
                        wire::REFUSED_STREAM
                    } else {
                        wire::CANCEL
                    },
                ),
            }
            if let Some(mut s) = self.ends.streams.remove(&id) {
                s.record(&StreamOutcome::UpstreamFailed);
                self.ends.guard.record_app_lost();
            }
        }
        self.ends.app.write.clear();
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
        let ids: Vec<u32> = self.ends.streams.keys().copied().collect();
        for id in ids {
            if let Some(s) = self.ends.streams.remove(&id) {
                self.ends.finish(s, StreamOutcome::ClientGone);
            }
        }
        self.close_with(code);
    }

    pub(super) fn close_with(&mut self, code: u32) {
        if self.life.closing() {
            return;
        }
        if self.handshake.pending {
            // Nothing from the application yet: the guard's own (empty)
            // SETTINGS are the server's preface before its GOAWAY.
            wire::put(&mut self.ends.client.write, wire::SETTINGS, 0, 0, &[]);
            self.ends.settings.tell_streams(None);
            self.handshake.replay = None;
        }
        self.life
            .goaway(&mut self.ends.client.write, self.ids.last(), code);
        self.life
            .close_by(Instant::now() + self.ends.guard.config().limits.shutdown_timeout);
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
            .ends
            .streams
            .keys()
            .copied()
            .filter(|&id| id > last)
            .collect();
        above.sort_unstable();
        for id in above {
            // The application never processed it: safe to retry anywhere.
            wire::rst(&mut self.ends.client.write, id, wire::REFUSED_STREAM);
            if let Some(s) = self.ends.streams.remove(&id) {
                self.ends.finish(s, StreamOutcome::Refused);
            }
        }
        if !first {
            return;
        }
        let guard = self.ends.guard;
        tracing::info!(peer = %self.ends.info.peer, conn = self.ends.info.id, last, code,
            "guard: the application sent GOAWAY; ending this connection's long-lived streams gracefully");
        self.step(Input::AppGoaway, now);
        self.end_long_lived(guard.config().app_shutdown_spread, now);
    }

    pub(super) fn step(&mut self, input: Input, now: Instant) {
        if matches!(input, Input::Acked) {
            // The client has the first GOAWAY: the final one names the last
            // stream the application will see.
            self.life
                .goaway(&mut self.ends.client.write, self.ids.last(), wire::NO_ERROR);
        }
        if matches!(input, Input::AckTimedOut) {
            tracing::info!(peer = %self.ends.info.peer, conn = self.ends.info.id,
                "guard: no PING ack after GOAWAY; refusing new streams and sending the final GOAWAY once idle");
        }
        match self.life.step(input, now) {
            None => {}
            Some(ConnAction::Goaway(cause)) => {
                tracing::debug!(peer = %self.ends.info.peer, conn = self.ends.info.id, ?cause, "guard: GOAWAY");
                if self.handshake.pending {
                    // The server's SETTINGS come first: after the application's.
                    self.handshake.goaway_held = true;
                } else {
                    self.life.first_goaway(&mut self.ends.client.write);
                }
                if let Some(reason) = metric_reason(cause) {
                    self.ends.guard.record_goaway(reason);
                }
            }
            Some(ConnAction::EndStreams) => {
                let guard = self.ends.guard;
                let streams = guard.connection_streams(
                    self.ends.info.id,
                    now,
                    guard.config().long_stream_age,
                );
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
        let guard = self.ends.guard;
        let long_after = guard.config().long_stream_age;
        let long: Vec<_> = guard
            .connection_streams(self.ends.info.id, now, long_after)
            .into_iter()
            .filter(|s| s.is_long_lived_at(now, long_after))
            .collect();
        self.plan_ends(long, spread, Reason::app_shutdown, now);
        let period = guard
            .config()
            .app_shutdown_spread
            .max(std::time::Duration::from_secs(1));
        self.life
            .sweep((!self.ends.streams.is_empty()).then_some(now + period));
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
        self.ends.endings.plan(streams, window, reason, now);
        self.ask_planned(now);
    }

    /// The planned ends that are due: asked, and begun.
    fn ask_planned(&mut self, now: Instant) {
        self.ends.endings.ask_due(now);
        for id in self.ends.endings.queue.take() {
            self.ends.begin_end(id, now);
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
