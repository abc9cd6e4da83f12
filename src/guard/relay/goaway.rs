//! The connection's life on the relay: the lifecycle machine's inputs and
//! actions, the GOAWAY sequence to the client (the application never sees
//! it), the application's own GOAWAY, the timers, and how the connection
//! fails or closes.

use std::sync::Arc;

use bytes::BytesMut;
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
use crate::guard::lifecycle::{Cause, ConnAction, Input, Lifecycle};
use crate::guard::registry::StreamCtl;
use crate::metrics::Reason;

/// The connection's life: when it goes away (the lifecycle machine), what
/// the GOAWAYs each way said, and the close.
#[derive(Debug)]
pub(super) struct Life {
    /// When the connection goes away (max age, drain, idle): a pure machine.
    machine: Lifecycle,
    /// The machine was last told the connection has no streams.
    told_empty: bool,
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
            told_empty: true,
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
    pub(super) fn count_changed(&mut self, n: usize) -> bool {
        let changed = self.told_empty != (n == 0);
        self.told_empty = n == 0;
        changed
    }

    /// A stream opened: whether the machine must hear the connection is
    /// busy again (the idle timer stops), even if the stream ends in this
    /// same batch: the next turn reports "none" afresh.
    pub(super) fn busy_again(&mut self) -> bool {
        std::mem::replace(&mut self.told_empty, false)
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
