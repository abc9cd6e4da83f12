//! The life of one HTTP/2 connection through the guard, as a pure state
//! machine: which deadline is next, and what the connection loop must do
//! when something happens. No I/O; the time is passed in.
//!
//! Serving ──(max age | goaway_all | terminate_all | idle)──▶ AwaitingAck
//!   ──(PING ack | ack timeout)──▶ Closing ──(no stream left)──▶ closed.
//!
//! The max-age grace runs from the (jittered) age itself, whatever the ack
//! does, and the endings of the connection's streams are spread over the
//! last `spread` of it (`spread` is capped at the grace): every stream is
//! asked to end by age + grace, which with the bounded ending and close
//! makes gRPC A9's age × (1 ± 10%) + grace a bound on the connection's life.
//! A stream that arrives once the endings began (sent before the client read
//! the GOAWAY) is ended too, when the ack (or its timeout) closes the door,
//! over what is left of the grace.
//! Once no stream is left the final GOAWAY is sent and the connection
//! closes, within `shutdown_timeout`.

use std::time::Duration;

use tokio::time::Instant;

/// How long a connection accepted while terminating stays idle after its
/// last answer before its GOAWAY. Its streams are all refused (the drain's
/// retryable UNAVAILABLE); a GOAWAY right behind the answer raced the
/// client's own bookkeeping: hyper fails a request it has just sent when a
/// GOAWAY(2^31-1) lands before it looks at the connection again, with
/// `GoAway(NO_ERROR)` instead of the answer the guard sent
/// (hyperium/hyper#2500).
pub const TERMINATING_IDLE: Duration = Duration::from_secs(1);

/// Why a connection is going away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    MaxAge,
    Drain,
    Idle,
    /// The application sent GOAWAY on its connection (frame relay).
    App,
}

/// Where the connection is in its shutdown sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnPhase {
    /// Accepting streams.
    Serving,
    /// GOAWAY(2^31-1) and PING sent; waiting for the ack until `until`.
    AwaitingAck { until: Instant },
    /// No new stream should arrive; open ones run on, and the connection
    /// closes once they are done. `acked`: the PING was acked, and the
    /// connection's driver, the HTTP/2 relay (`relay/goaway.rs`, not the h2
    /// crate), sent the final GOAWAY (the last stream id the application
    /// will see) on that ack.
    Closing { acked: bool },
}

/// What happened to the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// A stream was accepted (admitted or refused).
    StreamAccepted,
    /// The number of streams the guard proxies on this connection changed.
    Streams(usize),
    /// `goaway_all` was called.
    GoawayAll,
    /// `terminate_all` was called (or the guard shuts down).
    Terminate,
    /// The application sent GOAWAY: no new stream can reach it.
    AppGoaway,
    /// The connection's jittered max age passed.
    AgeReached,
    /// The PING after GOAWAY(2^31-1) was acked.
    Acked,
    /// The ack did not come in time.
    AckTimedOut,
    /// The max-age grace is over.
    GraceOver,
    /// No request head arrived in time.
    HeaderTimedOut,
    /// No stream for `idle_timeout`.
    IdleTimedOut,
    /// Closing, and the relay holds no stream either: nothing is left to flush.
    Quiet,
}

/// What the connection loop must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnAction {
    /// GOAWAY(2^31-1) + PING (and count the GOAWAY when the cause is counted).
    Goaway(Cause),
    /// End this connection's streams not yet asked, gracefully, over
    /// [`Lifecycle::end_window`]: the max-age endings begin, or streams
    /// arrived after they began.
    EndStreams,
    /// Send GOAWAY(last processed stream) and close after flushing.
    Close,
}

/// The fixed inputs of one connection's life.
#[derive(Clone, Copy, Debug)]
pub struct LifecycleTerms {
    /// When the jittered max age passes, if there is one.
    pub age_at: Option<Instant>,
    /// Streams still open this long after the max age are ended.
    pub grace: Duration,
    /// The endings at the grace's end are spread over this long, inside
    /// the grace (a longer spread is capped at the grace).
    pub spread: Duration,
    /// Bound on the wait for the PING ack.
    pub ack_timeout: Duration,
    /// A connection without streams this long goes away.
    pub idle_timeout: Duration,
    /// How long ending streams may take; part of the close backstop.
    pub end_timeout: Duration,
    /// How long a connection with nothing left is still polled.
    pub shutdown_timeout: Duration,
    /// The first request head must arrive by then.
    pub first_stream_by: Instant,
    /// False for connections accepted after `goaway_all`: they serve the
    /// short requests that still arrive and go away with `terminate_all`.
    pub watch_goaway: bool,
    /// True for connections accepted while terminating: they go away once
    /// idle for [`TERMINATING_IDLE`] after their first stream was answered,
    /// not at once, so the GOAWAY races neither the client's first request
    /// nor its reading of the answer.
    pub defer_goaway: bool,
}

/// Every deadline the connection loop waits on; None means not armed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deadlines {
    /// Stop polling and drop the connection.
    pub close_by: Option<Instant>,
    pub age: Option<Instant>,
    pub ack: Option<Instant>,
    /// When the max-age endings begin: the grace's end minus the spread.
    pub grace: Option<Instant>,
    pub first_stream: Option<Instant>,
    pub idle: Option<Instant>,
}

/// One connection's state.
#[derive(Clone, Debug)]
pub struct Lifecycle {
    /// Fixed at accept.
    terms: LifecycleTerms,
    /// See [`ConnPhase`].
    phase: ConnPhase,
    /// Why the GOAWAY was sent, once it was.
    cause: Option<Cause>,
    /// The age passed, even if a drain GOAWAY came first: the grace applies.
    max_age_reached: bool,
    /// When the max-age grace ends.
    grace_until: Option<Instant>,
    /// The grace ended and the streams were asked to end.
    grace_done: bool,
    /// A stream arrived after that (sent before the client read the GOAWAY).
    late_stream: bool,
    /// Until a request head arrives: the slowloris bound.
    first_stream_by: Option<Instant>,
    /// Since when no stream has been open (None while some are).
    idle_since: Option<Instant>,
    /// Streams the guard proxies on this connection.
    streams: usize,
    /// `terminate_all` was seen.
    terminate_seen: bool,
    /// The final GOAWAY was requested by us.
    close_sent: bool,
    /// Stop polling and drop the connection at this point.
    close_by: Option<Instant>,
}

impl Lifecycle {
    pub fn new(terms: LifecycleTerms, now: Instant) -> Self {
        Self {
            terms,
            phase: ConnPhase::Serving,
            cause: None,
            max_age_reached: false,
            grace_until: None,
            grace_done: false,
            late_stream: false,
            first_stream_by: Some(terms.first_stream_by),
            idle_since: Some(now),
            streams: 0,
            terminate_seen: false,
            close_sent: false,
            close_by: None,
        }
    }

    #[cfg(test)]
    pub fn phase(&self) -> ConnPhase {
        self.phase
    }

    /// Whether the machine was last told the connection has no streams
    /// (its own count, so a relay need not mirror it).
    pub fn told_empty(&self) -> bool {
        self.streams == 0
    }

    /// The deadlines armed right now.
    pub fn deadlines(&self) -> Deadlines {
        Deadlines {
            close_by: self.close_by,
            age: self.terms.age_at.filter(|_| !self.max_age_reached),
            ack: match self.phase {
                ConnPhase::AwaitingAck { until } => Some(until),
                _ => None,
            },
            grace: self
                .grace_until
                .filter(|_| !self.grace_done)
                .map(|until| until.checked_sub(self.spread()).unwrap_or(until)),
            first_stream: self.first_stream_by,
            idle: match self.phase {
                ConnPhase::Serving => self.idle_since.map(|t| t + self.idle_timeout()),
                _ => None,
            },
        }
    }

    /// How long the connection may be idle before its GOAWAY: shorter once a
    /// stream was answered while terminating (it will be refused every
    /// stream from now on).
    fn idle_timeout(&self) -> Duration {
        let refusing = self.terms.defer_goaway
            && self.terminate_seen
            && self.cause.is_none()
            && self.first_stream_by.is_none();
        if refusing {
            TERMINATING_IDLE.min(self.terms.idle_timeout)
        } else {
            self.terms.idle_timeout
        }
    }

    /// How long the max-age endings are spread over: inside the grace.
    pub fn spread(&self) -> Duration {
        self.terms.spread.min(self.terms.grace)
    }

    /// The window the max-age endings asked at `now` are spread over: what
    /// is left of the grace, at most the spread, so every stream is asked to
    /// end by age + grace however late the timer or the ack.
    pub fn end_window(&self, now: Instant) -> Duration {
        self.grace_until
            .map_or(Duration::ZERO, |until| until.saturating_duration_since(now))
            .min(self.spread())
    }

    /// Whether `goaway_all` still matters to this connection.
    pub fn watches_goaway(&self) -> bool {
        self.terms.watch_goaway && self.cause.is_none()
    }

    /// Whether `terminate_all` still matters to this connection.
    pub fn watches_terminate(&self) -> bool {
        !self.terminate_seen
    }

    /// Whether the PING ack is awaited.
    pub fn awaits_ack(&self) -> bool {
        matches!(self.phase, ConnPhase::AwaitingAck { .. })
    }

    /// New streams are refused with REFUSED_STREAM: the client ignored
    /// GOAWAY(2^31-1) and no final GOAWAY told it where the cut is.
    pub fn refuses_streams(&self) -> bool {
        self.phase == (ConnPhase::Closing { acked: false })
    }

    /// Whether the loop should report [`Input::Quiet`] when it holds no stream.
    pub fn wants_quiet(&self) -> bool {
        matches!(self.phase, ConnPhase::Closing { .. }) && !self.close_sent && self.streams == 0
    }

    /// Advances the machine.
    pub fn step(&mut self, input: Input, now: Instant) -> Option<ConnAction> {
        let action = self.transition(input, now);
        if matches!(self.phase, ConnPhase::Closing { .. }) && self.streams == 0 {
            // Nothing left to serve: flush and close within the bound.
            self.close_by_at_most(now + self.terms.shutdown_timeout);
        }
        action
    }

    fn transition(&mut self, input: Input, now: Instant) -> Option<ConnAction> {
        match input {
            Input::StreamAccepted => {
                self.first_stream_by = None;
                self.late_stream |= self.grace_done;
                // Accepted while terminating: once idle (`idle_timeout`).
                (self.terminate_seen && self.cause.is_none() && !self.terms.defer_goaway)
                    .then(|| self.start_goaway(Cause::Drain, now))
            }
            Input::Streams(n) => {
                self.streams = n;
                self.idle_since = (n == 0).then_some(now);
                None
            }
            Input::GoawayAll => {
                (self.watches_goaway()).then(|| self.start_goaway(Cause::Drain, now))
            }
            Input::Terminate => {
                self.terminate_seen = true;
                (self.cause.is_none() && !self.terms.defer_goaway)
                    .then(|| self.start_goaway(Cause::Drain, now))
            }
            Input::AppGoaway => (self.cause.is_none()).then(|| self.start_goaway(Cause::App, now)),
            Input::IdleTimedOut => {
                let cause = if self.terminate_seen {
                    Cause::Drain
                } else {
                    Cause::Idle
                };
                (self.cause.is_none()).then(|| self.start_goaway(cause, now))
            }
            Input::AgeReached => {
                self.max_age_reached = true;
                self.start_grace(now);
                (self.cause.is_none()).then(|| self.start_goaway(Cause::MaxAge, now))
            }
            Input::Acked => self.enter_closing(true),
            Input::AckTimedOut => self.enter_closing(false),
            Input::GraceOver => {
                self.grace_done = true;
                // Every stream bounds its own ending; this is the backstop,
                // counted from the grace's end, not from now.
                let s = self.terms;
                let until = self.grace_until.unwrap_or(now).max(now);
                self.close_by_at_most(until + s.end_timeout + s.shutdown_timeout);
                Some(ConnAction::EndStreams)
            }
            Input::HeaderTimedOut => {
                self.first_stream_by = None;
                self.phase = ConnPhase::Closing { acked: false };
                self.close_sent = true;
                Some(ConnAction::Close)
            }
            Input::Quiet => {
                self.close_sent = true;
                Some(ConnAction::Close)
            }
        }
    }

    fn start_goaway(&mut self, cause: Cause, now: Instant) -> ConnAction {
        self.cause = Some(cause);
        self.phase = ConnPhase::AwaitingAck {
            until: now + self.terms.ack_timeout,
        };
        ConnAction::Goaway(cause)
    }

    /// No new stream is admitted from here on (the final GOAWAY names the
    /// last one, or new ones are refused). If streams arrived after the
    /// max-age endings began (sent before the client read the first
    /// GOAWAY), they were not among them: they are ended too.
    fn enter_closing(&mut self, acked: bool) -> Option<ConnAction> {
        if !self.awaits_ack() {
            return None;
        }
        self.phase = ConnPhase::Closing { acked };
        self.late_stream.then_some(ConnAction::EndStreams)
    }

    /// The grace counts from the age itself (a late timer does not stretch it).
    fn start_grace(&mut self, now: Instant) {
        if self.grace_until.is_none() {
            let from = self.terms.age_at.map_or(now, |at| at.min(now));
            self.grace_until = Some(from + self.terms.grace);
        }
    }

    fn close_by_at_most(&mut self, bound: Instant) {
        self.close_by = Some(self.close_by.map_or(bound, |c| c.min(bound)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn terms(t0: Instant) -> LifecycleTerms {
        LifecycleTerms {
            age_at: Some(t0 + s(100)),
            grace: s(30),
            spread: s(10),
            ack_timeout: s(5),
            idle_timeout: s(300),
            end_timeout: s(5),
            shutdown_timeout: s(10),
            first_stream_by: t0 + s(10),
            watch_goaway: true,
            defer_goaway: false,
        }
    }

    /// Runs `(at, input, expected action)` steps and returns the machine.
    fn run(
        terms: LifecycleTerms,
        t0: Instant,
        steps: &[(u64, Input, Option<ConnAction>)],
    ) -> Lifecycle {
        let mut m = Lifecycle::new(terms, t0);
        for (i, (at, input, expected)) in steps.iter().enumerate() {
            let got = m.step(*input, t0 + s(*at));
            assert_eq!(got, *expected, "step {i}: {input:?} at {at}s");
        }
        m
    }

    #[test]
    fn max_age_goaway_ack_grace_end_close() {
        let t0 = Instant::now();
        let m = run(
            terms(t0),
            t0,
            &[
                (1, Input::StreamAccepted, None),
                (1, Input::Streams(1), None),
                (
                    100,
                    Input::AgeReached,
                    Some(ConnAction::Goaway(Cause::MaxAge)),
                ),
                (101, Input::Acked, None),
            ],
        );
        assert_eq!(m.phase(), ConnPhase::Closing { acked: true });
        assert_eq!(
            m.deadlines().grace,
            Some(t0 + s(120)),
            "the endings start one spread before age + grace"
        );
        assert!(!m.refuses_streams());
        assert!(!m.wants_quiet(), "a stream is still open");
        let mut m = m;
        assert_eq!(
            m.step(Input::GraceOver, t0 + s(120)),
            Some(ConnAction::EndStreams)
        );
        assert_eq!(
            m.deadlines().close_by,
            Some(t0 + s(145)),
            "backstop: age + grace + end + shutdown"
        );
        assert_eq!(m.step(Input::Streams(0), t0 + s(132)), None);
        assert_eq!(m.deadlines().close_by, Some(t0 + s(142)));
        assert!(m.wants_quiet());
        assert_eq!(m.step(Input::Quiet, t0 + s(132)), Some(ConnAction::Close));
        assert!(!m.wants_quiet());
    }

    #[test]
    fn a_spread_longer_than_the_grace_is_capped_and_a_late_timer_does_not_stretch_it() {
        let t0 = Instant::now();
        let st = LifecycleTerms {
            grace: s(1),
            spread: s(3600),
            ..terms(t0)
        };
        let mut m = run(
            st,
            t0,
            &[
                (1, Input::Streams(2), None),
                // The age timer fires late (a loaded machine): still age + grace.
                (
                    103,
                    Input::AgeReached,
                    Some(ConnAction::Goaway(Cause::MaxAge)),
                ),
            ],
        );
        assert_eq!(m.spread(), s(1));
        assert_eq!(m.deadlines().grace, Some(t0 + s(100)), "(age + 1s) - 1s");
        assert_eq!(
            m.step(Input::GraceOver, t0 + s(103)),
            Some(ConnAction::EndStreams)
        );
        assert_eq!(
            m.deadlines().close_by,
            Some(t0 + s(118)),
            "now + end + shutdown"
        );
    }

    #[test]
    fn no_ack_means_refusing_and_the_grace_still_runs() {
        let t0 = Instant::now();
        let m = run(
            terms(t0),
            t0,
            &[
                (1, Input::StreamAccepted, None),
                (1, Input::Streams(1), None),
                (
                    100,
                    Input::AgeReached,
                    Some(ConnAction::Goaway(Cause::MaxAge)),
                ),
                (105, Input::AckTimedOut, None),
                // A late ack changes nothing.
                (106, Input::Acked, None),
            ],
        );
        assert_eq!(m.phase(), ConnPhase::Closing { acked: false });
        assert!(m.refuses_streams());
        assert_eq!(
            m.deadlines().grace,
            Some(t0 + s(120)),
            "the grace counts from the age, not the ack"
        );
    }

    /// A grace no longer than the spread starts the endings at the age
    /// itself, with the first GOAWAY: a stream the client sent before it
    /// read that GOAWAY arrives after the endings began. Once no stream can
    /// arrive any more (the ack, or its timeout), the machine asks for the
    /// endings again, over what is left of the grace.
    #[test]
    fn streams_that_arrive_after_the_endings_began_are_ended_too() {
        let t0 = Instant::now();
        let st = LifecycleTerms {
            grace: s(2),
            spread: s(2),
            ..terms(t0)
        };
        // The age: the GOAWAY, and the endings at once.
        let aged = [
            (1, Input::Streams(1), None),
            (
                100,
                Input::AgeReached,
                Some(ConnAction::Goaway(Cause::MaxAge)),
            ),
            (100, Input::GraceOver, Some(ConnAction::EndStreams)),
        ];
        let late = [aged.as_slice(), &[(100, Input::StreamAccepted, None)]].concat();
        for (ack, closing) in [
            (Input::Acked, ConnPhase::Closing { acked: true }),
            (Input::AckTimedOut, ConnPhase::Closing { acked: false }),
        ] {
            let mut m = run(st, t0, &late);
            assert_eq!(m.end_window(t0 + s(100)), s(2), "the whole spread");
            let late = t0 + s(100) + Duration::from_millis(500);
            assert_eq!(m.step(ack, late), Some(ConnAction::EndStreams), "{ack:?}");
            assert_eq!(m.phase(), closing);
            assert_eq!(
                m.end_window(late),
                Duration::from_millis(1_500),
                "what is left of the grace"
            );
            assert_eq!(m.step(ack, late), None, "once");
        }
        // No stream came after the endings began: the ack asks for nothing.
        let mut m = run(st, t0, &aged);
        assert_eq!(m.step(Input::Acked, t0 + s(100)), None);
        // Before the grace's end, the ack asks for nothing: the endings to
        // come take every stream.
        let mut m = run(
            terms(t0),
            t0,
            &[(
                100,
                Input::AgeReached,
                Some(ConnAction::Goaway(Cause::MaxAge)),
            )],
        );
        assert_eq!(m.step(Input::Acked, t0 + s(101)), None);
        assert_eq!(m.end_window(t0 + s(200)), Duration::ZERO, "past the grace");
    }

    #[test]
    fn a_drain_goaway_first_still_gets_the_max_age_grace() {
        let t0 = Instant::now();
        let m = run(
            terms(t0),
            t0,
            &[
                (1, Input::Streams(1), None),
                (50, Input::GoawayAll, Some(ConnAction::Goaway(Cause::Drain))),
                (51, Input::Acked, None),
                (60, Input::GoawayAll, None),
                (100, Input::AgeReached, None),
            ],
        );
        assert_eq!(m.deadlines().grace, Some(t0 + s(120)));
        assert_eq!(m.deadlines().age, None);
    }

    #[test]
    fn terminate_goes_away_at_once_unless_accepted_while_terminating() {
        let t0 = Instant::now();
        run(
            terms(t0),
            t0,
            &[(1, Input::Terminate, Some(ConnAction::Goaway(Cause::Drain)))],
        );
        let late = LifecycleTerms {
            defer_goaway: true,
            watch_goaway: false,
            ..terms(t0)
        };
        let mut m = run(
            late,
            t0,
            &[
                (0, Input::Terminate, None),
                (0, Input::GoawayAll, None),
                (1, Input::StreamAccepted, None),
                (1, Input::Streams(1), None),
                (1, Input::Streams(0), None),
            ],
        );
        assert_eq!(
            m.deadlines().first_stream,
            None,
            "its first stream was answered"
        );
        assert_eq!(
            m.deadlines().idle,
            Some(t0 + s(1) + TERMINATING_IDLE),
            "away once idle a moment after the answer, not right behind it"
        );
        // Another request in the meantime starts the idle time again.
        let later = t0 + s(1) + TERMINATING_IDLE / 2;
        assert_eq!(m.step(Input::StreamAccepted, later), None);
        assert_eq!(m.step(Input::Streams(1), later), None);
        assert_eq!(m.step(Input::Streams(0), later), None);
        assert_eq!(m.deadlines().idle, Some(later + TERMINATING_IDLE));
        assert_eq!(
            m.step(Input::IdleTimedOut, later + TERMINATING_IDLE),
            Some(ConnAction::Goaway(Cause::Drain))
        );
        assert!(m.awaits_ack());
        // Before any request, only the header timeout bounds it.
        let m = run(late, t0, &[(0, Input::Terminate, None)]);
        assert_eq!(m.deadlines().idle, Some(t0 + s(300)));
        assert_eq!(m.deadlines().first_stream, Some(t0 + s(10)));
    }

    #[test]
    fn slow_first_request_closes_and_idle_goes_away() {
        let t0 = Instant::now();
        let m = run(
            terms(t0),
            t0,
            &[(10, Input::HeaderTimedOut, Some(ConnAction::Close))],
        );
        assert_eq!(m.deadlines().close_by, Some(t0 + s(20)));
        assert!(!m.wants_quiet(), "the close was already asked");

        let m = run(
            terms(t0),
            t0,
            &[
                (1, Input::StreamAccepted, None),
                (1, Input::Streams(1), None),
                (2, Input::Streams(0), None),
            ],
        );
        assert_eq!(m.deadlines().first_stream, None);
        assert_eq!(m.deadlines().idle, Some(t0 + s(302)));
        let mut m = m;
        assert_eq!(
            m.step(Input::IdleTimedOut, t0 + s(302)),
            Some(ConnAction::Goaway(Cause::Idle))
        );
        assert_eq!(m.deadlines().idle, None);
        m.step(Input::Acked, t0 + s(303));
        assert!(m.wants_quiet());
        assert_eq!(m.deadlines().close_by, Some(t0 + s(313)));
        assert_eq!(m.deadlines().grace, None, "no max age, no grace");
    }
}
