//! The drain state machine: a pure function (state, event) -> (state, actions).
//!
//! Phases, per docs/design.md:
//! - `Serving`: nothing is happening.
//! - `Deregistering`: triggered; health check failed, listeners draining,
//!   GOAWAY sent; short requests still land while endpoints are removed.
//! - `Draining`: the guard ends open streams, spread over a window; Envoy's
//!   counters are polled and the drain exits early once streams reach zero
//!   and inbound connections have stopped closing (none for
//!   [`SETTLE_QUIET`], at most [`SETTLE_MAX`] longer).
//! - `Terminating`: past the drain time, waiting for the last streams until
//!   the hard deadline (`parent-shutdown-time`).
//! - `Done`: the report is final.
//!
//! It does no I/O and reads no clock: every event carries the time since the
//! trigger. A second trigger joins the first drain.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::Timers;

/// Once streams reach zero, how long the drain may still wait for inbound
/// connections that are closing. A WebSocket the guard ended leaves Envoy's
/// downstream connection in its delayed close (`delayed_close_timeout`, 1 s
/// by default: Envoy waits for the client to close, and the client waits
/// for the server's FIN), so the client sees its connection end up to 1 s
/// after the guard's Close. A drain that finished at once would leave the
/// endings of its last second to Envoy's exit, which closes them all at
/// one instant: a reconnect burst. Connections that stay open (idle
/// keep-alives) do not fall, so they never hold a drain: only a falling
/// count does, and only this long.
pub const SETTLE_MAX: Duration = Duration::from_secs(2);

/// Connections have stopped closing once no poll has seen their count fall
/// for this long (Envoy's default delayed close; closes can be further
/// apart than a short poll interval while they last).
pub const SETTLE_QUIET: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Serving,
    Deregistering,
    Draining,
    Terminating,
    Done,
}

// === impl Phase ===

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Serving => "serving",
            Phase::Deregistering => "deregistering",
            Phase::Draining => "draining",
            Phase::Terminating => "terminating",
            Phase::Done => "done",
        }
    }
}

/// What started the drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Trigger {
    /// The preStop hook (`/drain?wait=true` or `drainshim prestop`).
    Prestop,
    /// The container got SIGTERM.
    Sigterm,
    /// `POST /drain` or the one-shot `drainshim drain`.
    Api,
}

/// How a drain ended. The JSON strings (`quiesced`, `deadline`,
/// `envoy_unreachable`) are part of the report's contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Active streams reached zero after the minimum drain time (also when
    /// the deadline came while closing connections were settling).
    Quiesced,
    /// The hard deadline (or a second SIGTERM) came first.
    Deadline,
    /// Envoy's admin API did not answer at the end; its counts are unknown.
    EnvoyUnreachable,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Trigger(Trigger),
    /// A second SIGTERM: go to the deadline now.
    Hurry,
    /// Time passed; `elapsed` is measured from the trigger.
    Tick {
        elapsed: Duration,
    },
    /// A poll finished. `envoy_streams` is None when the admin API did not
    /// answer; `envoy_connections` (inbound, open) too.
    Observed {
        elapsed: Duration,
        envoy_streams: Option<u64>,
        envoy_connections: Option<u64>,
        guard_streams: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// `POST /healthcheck/fail` and stop answering the shim's `/readyz`.
    FailHealthcheck,
    /// `POST /drain_listeners?graceful&inboundonly`.
    DrainListeners,
    /// GOAWAY on every guard connection; new connections are still accepted.
    GoawayAll,
    /// End every open guard stream gracefully, spread evenly over `window`.
    /// `deadline` is the time left until the hard deadline: short calls in
    /// flight may run until shortly before it.
    TerminateStreams {
        window: Duration,
        deadline: Duration,
    },
    /// Publish the report.
    Finish(Outcome),
}

/// The machine's whole state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State {
    pub phase: Phase,
    pub trigger: Option<Trigger>,
    pub outcome: Option<Outcome>,
    /// Whether the last poll reached Envoy; decides `deadline` vs `envoy_unreachable`.
    pub envoy_reachable: bool,
    /// Inbound connections at the last poll that counted them.
    pub last_connections: Option<u64>,
    /// Since when (elapsed) every poll has seen zero streams; None while
    /// streams are open. Bounds the wait for closing connections.
    pub idle_since: Option<Duration>,
    /// When (elapsed) a poll last saw inbound connections fall.
    pub last_fall: Option<Duration>,
}

// === impl State ===

impl Default for State {
    fn default() -> Self {
        Self {
            phase: Phase::Serving,
            trigger: None,
            outcome: None,
            // Optimistic until a poll says otherwise.
            envoy_reachable: true,
            last_connections: None,
            idle_since: None,
            last_fall: None,
        }
    }
}

/// The transition function, bound to one set of timers.
#[derive(Clone, Copy, Debug)]
pub struct Machine {
    pub timers: Timers,
}

// === impl Machine ===

impl Machine {
    pub fn new(timers: Timers) -> Self {
        Self { timers }
    }

    /// The earliest a drain may quiesce: never before deregistration is over.
    pub fn quiesce_after(&self) -> Duration {
        self.timers
            .min_drain_time
            .max(self.timers.deregistration_delay)
    }

    /// The window over which the guard spreads stream terminations: from the
    /// end of deregistration to 90% of the drain time, leaving the last
    /// tenth for the final streams to flush and for a poll to see zero.
    pub fn termination_window(&self) -> Duration {
        let t = &self.timers;
        t.drain_time.saturating_sub(t.deregistration_delay) * 9 / 10
    }

    /// The next instant (since the trigger) at which a `Tick` changes something.
    pub fn next_deadline(&self, s: &State) -> Option<Duration> {
        let t = &self.timers;
        match s.phase {
            Phase::Serving | Phase::Done => None,
            Phase::Deregistering => Some(t.deregistration_delay),
            Phase::Draining => Some(t.drain_time),
            Phase::Terminating => Some(t.parent_shutdown_time),
        }
    }

    pub fn step(&self, s: State, event: Event) -> (State, Vec<Action>) {
        let mut s = s;
        let mut actions = Vec::new();
        if s.phase == Phase::Done {
            return (s, actions);
        }
        match event {
            Event::Trigger(trigger) => {
                if s.phase == Phase::Serving {
                    s.phase = Phase::Deregistering;
                    s.trigger = Some(trigger);
                    actions.extend([
                        Action::FailHealthcheck,
                        Action::DrainListeners,
                        Action::GoawayAll,
                    ]);
                    // Zero timers move on at once.
                    self.advance(&mut s, Duration::ZERO, &mut actions);
                }
            }
            _ if s.phase == Phase::Serving => {}
            Event::Hurry => self.finish_at_deadline(&mut s, &mut actions),
            Event::Tick { elapsed } => self.advance(&mut s, elapsed, &mut actions),
            Event::Observed {
                elapsed,
                envoy_streams,
                envoy_connections,
                guard_streams,
            } => {
                s.envoy_reachable = envoy_streams.is_some();
                self.advance(&mut s, elapsed, &mut actions);
                // Connections closed since the last poll that counted them.
                if matches!(
                    (s.last_connections, envoy_connections),
                    (Some(before), Some(now)) if now < before
                ) {
                    s.last_fall = Some(elapsed);
                }
                if envoy_connections.is_some() {
                    s.last_connections = envoy_connections;
                }
                let idle = envoy_streams == Some(0) && guard_streams == 0;
                if !idle {
                    s.idle_since = None;
                } else if elapsed >= self.quiesce_after() && s.phase != Phase::Done {
                    let since = *s.idle_since.get_or_insert(elapsed);
                    let quiet = s
                        .last_fall
                        .is_none_or(|t| elapsed.saturating_sub(t) >= SETTLE_QUIET);
                    if quiet || elapsed.saturating_sub(since) >= SETTLE_MAX {
                        self.finish(&mut s, Outcome::Quiesced, &mut actions);
                    }
                }
            }
        }
        (s, actions)
    }

    /// Moves through every phase whose start time has passed.
    fn advance(&self, s: &mut State, elapsed: Duration, actions: &mut Vec<Action>) {
        let t = &self.timers;
        if elapsed >= t.parent_shutdown_time {
            return self.finish_at_deadline(s, actions);
        }
        if s.phase == Phase::Deregistering && elapsed >= t.deregistration_delay {
            s.phase = Phase::Draining;
            actions.push(Action::TerminateStreams {
                window: self.termination_window(),
                deadline: t.parent_shutdown_time.saturating_sub(elapsed),
            });
        }
        if s.phase == Phase::Draining && elapsed >= t.drain_time {
            s.phase = Phase::Terminating;
        }
    }

    fn finish_at_deadline(&self, s: &mut State, actions: &mut Vec<Action>) {
        // Streams were already zero and the drain was only letting closing
        // connections settle: nothing was open, so it quiesced.
        let outcome = if s.idle_since.is_some() {
            Outcome::Quiesced
        } else if s.envoy_reachable {
            Outcome::Deadline
        } else {
            Outcome::EnvoyUnreachable
        };
        self.finish(s, outcome, actions);
    }

    fn finish(&self, s: &mut State, outcome: Outcome, actions: &mut Vec<Action>) {
        s.phase = Phase::Done;
        s.outcome = Some(outcome);
        actions.push(Action::Finish(outcome));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::*;
    use Event::{Hurry, Observed, Tick};
    use Phase::*;
    use Trigger as T;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// dereg 5 s, min 5 s, drain 60 s, deadline 90 s.
    fn machine() -> Machine {
        Machine::new(Timers::default())
    }

    fn obs(t: u64, envoy: Option<u64>, guard: u64) -> Event {
        obs_cx(t, envoy, envoy.map(|_| 0), guard)
    }

    /// A poll that also counted `cx` inbound connections.
    fn obs_cx(t: u64, envoy: Option<u64>, cx: Option<u64>, guard: u64) -> Event {
        Observed {
            elapsed: secs(t),
            envoy_streams: envoy,
            envoy_connections: cx,
            guard_streams: guard,
        }
    }

    fn tick(t: u64) -> Event {
        Tick { elapsed: secs(t) }
    }

    /// Runs events from Serving; returns the phase after each and all actions.
    fn run(m: Machine, events: &[Event]) -> (Vec<Phase>, Vec<Action>, State) {
        let mut s = State::default();
        let mut phases = Vec::new();
        let mut all = Vec::new();
        for e in events {
            let (next, actions) = m.step(s, *e);
            s = next;
            phases.push(s.phase);
            all.extend(actions);
        }
        (phases, all, s)
    }

    /// (name, events, phase after each event, all actions).
    type Case = (&'static str, Vec<Event>, Vec<Phase>, Vec<Action>);

    #[test]
    fn table() {
        let window = machine().termination_window();
        assert_eq!(window, secs(55) * 9 / 10);
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            ("events before a trigger do nothing",
             vec![tick(100), obs(100, Some(0), 0), Hurry],
             vec![Serving, Serving, Serving], vec![]),
            ("a trigger fails the health check, drains listeners and sends GOAWAY",
             vec![Event::Trigger(T::Prestop)],
             vec![Deregistering], vec![FailHealthcheck, DrainListeners, GoawayAll]),
            ("a second trigger joins the first",
             vec![Event::Trigger(T::Prestop), Event::Trigger(T::Sigterm), Event::Trigger(T::Api)],
             vec![Deregistering, Deregistering, Deregistering],
             vec![FailHealthcheck, DrainListeners, GoawayAll]),
            ("zero streams during deregistration do not end the drain",
             vec![Event::Trigger(T::Api), obs(1, Some(0), 0), obs(4, Some(0), 0)],
             vec![Deregistering, Deregistering, Deregistering],
             vec![FailHealthcheck, DrainListeners, GoawayAll]),
            ("after deregistration the guard ends streams; zero streams quiesce",
             vec![Event::Trigger(T::Api), tick(5), obs(6, Some(3), 1), obs(7, Some(0), 1), obs(8, Some(0), 0)],
             vec![Deregistering, Draining, Draining, Draining, Done],
             vec![FailHealthcheck, DrainListeners, GoawayAll, TerminateStreams { window, deadline: secs(85) },
                  Finish(Outcome::Quiesced)]),
            ("zero streams while connections are still closing: one poll more",
             vec![Event::Trigger(T::Api), tick(5), obs_cx(6, Some(2), Some(9), 2), obs_cx(7, Some(0), Some(5), 0),
                  obs_cx(8, Some(0), Some(5), 0)],
             vec![Deregistering, Draining, Draining, Draining, Done],
             vec![FailHealthcheck, DrainListeners, GoawayAll, TerminateStreams { window, deadline: secs(85) },
                  Finish(Outcome::Quiesced)]),
            ("connections that stay open (idle keep-alives) do not hold the drain",
             vec![Event::Trigger(T::Api), tick(5), obs_cx(6, Some(1), Some(4), 1), obs_cx(7, Some(0), Some(4), 0)],
             vec![Deregistering, Draining, Draining, Done],
             vec![FailHealthcheck, DrainListeners, GoawayAll, TerminateStreams { window, deadline: secs(85) },
                  Finish(Outcome::Quiesced)]),
            ("connections that keep closing hold the drain at most SETTLE_MAX",
             vec![Event::Trigger(T::Api), tick(5), obs_cx(6, Some(1), Some(25), 1), obs_cx(7, Some(0), Some(20), 0),
                  obs_cx(8, Some(0), Some(15), 0), obs_cx(9, Some(0), Some(10), 0)],
             vec![Deregistering, Draining, Draining, Draining, Draining, Done],
             vec![FailHealthcheck, DrainListeners, GoawayAll, TerminateStreams { window, deadline: secs(85) },
                  Finish(Outcome::Quiesced)]),
            ("a stream that reopens restarts the settle bound",
             vec![Event::Trigger(T::Api), tick(5), obs_cx(6, Some(1), Some(25), 1), obs_cx(7, Some(0), Some(20), 0),
                  obs_cx(8, Some(1), Some(19), 0), obs_cx(9, Some(0), Some(15), 0), obs_cx(10, Some(0), Some(12), 0),
                  obs_cx(11, Some(0), Some(9), 0)],
             vec![Deregistering, Draining, Draining, Draining, Draining, Draining, Draining, Done],
             vec![FailHealthcheck, DrainListeners, GoawayAll, TerminateStreams { window, deadline: secs(85) },
                  Finish(Outcome::Quiesced)]),
            ("still settling at the deadline: nothing was open, so it quiesced",
             vec![Event::Trigger(T::Api), tick(5), obs_cx(6, Some(1), Some(25), 1), obs_cx(88, Some(0), Some(20), 0),
                  tick(90)],
             vec![Deregistering, Draining, Draining, Terminating, Done],
             vec![FailHealthcheck, DrainListeners, GoawayAll, TerminateStreams { window, deadline: secs(85) },
                  Finish(Outcome::Quiesced)]),
            ("a second SIGTERM while settling: quiesced too",
             vec![Event::Trigger(T::Api), tick(5), obs_cx(6, Some(1), Some(25), 1), obs_cx(7, Some(0), Some(20), 0),
                  Hurry],
             vec![Deregistering, Draining, Draining, Draining, Done],
             vec![FailHealthcheck, DrainListeners, GoawayAll, TerminateStreams { window, deadline: secs(85) },
                  Finish(Outcome::Quiesced)]),
            ("a poll without a connection count does not count as closing",
             vec![Event::Trigger(T::Api), tick(5), obs_cx(6, Some(1), Some(3), 0), obs_cx(7, Some(0), None, 0)],
             vec![Deregistering, Draining, Draining, Done],
             vec![FailHealthcheck, DrainListeners, GoawayAll, TerminateStreams { window, deadline: secs(85) },
                  Finish(Outcome::Quiesced)]),
            ("a late poll moves through every passed phase at once",
             vec![Event::Trigger(T::Api), obs(61, Some(2), 0)],
             vec![Deregistering, Terminating],
             vec![FailHealthcheck, DrainListeners, GoawayAll, TerminateStreams { window, deadline: secs(29) }]),
            ("streams still open at the deadline: outcome deadline",
             vec![Event::Trigger(T::Sigterm), tick(5), tick(60), obs(89, Some(4), 0), tick(90)],
             vec![Deregistering, Draining, Terminating, Terminating, Done],
             vec![FailHealthcheck, DrainListeners, GoawayAll, TerminateStreams { window, deadline: secs(85) },
                  Finish(Outcome::Deadline)]),
            ("admin unreachable at the deadline: outcome envoy_unreachable",
             vec![Event::Trigger(T::Prestop), obs(1, None, 0), obs(60, None, 0), tick(90)],
             vec![Deregistering, Deregistering, Terminating, Done],
             vec![FailHealthcheck, DrainListeners, GoawayAll, TerminateStreams { window, deadline: secs(30) },
                  Finish(Outcome::EnvoyUnreachable)]),
            ("unreachable never quiesces, even with the guard idle",
             vec![Event::Trigger(T::Api), obs(30, None, 0)],
             vec![Deregistering, Draining],
             vec![FailHealthcheck, DrainListeners, GoawayAll, TerminateStreams { window, deadline: secs(60) }]),
            ("a second SIGTERM goes to the deadline now",
             vec![Event::Trigger(T::Sigterm), obs(1, Some(9), 0), Hurry],
             vec![Deregistering, Deregistering, Done],
             vec![FailHealthcheck, DrainListeners, GoawayAll, Finish(Outcome::Deadline)]),
            ("Done absorbs everything",
             vec![Event::Trigger(T::Api), Hurry, Hurry, tick(200), Event::Trigger(T::Api)],
             vec![Deregistering, Done, Done, Done, Done],
             vec![FailHealthcheck, DrainListeners, GoawayAll, Finish(Outcome::Deadline)]),
        ];
        for (name, events, phases, actions) in cases {
            let (got_phases, got_actions, _) = run(machine(), &events);
            assert_eq!(got_phases, phases, "{name}: phases");
            assert_eq!(got_actions, actions, "{name}: actions");
        }
    }

    #[test]
    fn zero_timers_drain_at_once() {
        let m = Machine::new(Timers {
            deregistration_delay: Duration::ZERO,
            min_drain_time: Duration::ZERO,
            drain_time: secs(1),
            parent_shutdown_time: secs(2),
            poll_interval: secs(1),
        });
        let (phases, actions, s) = run(m, &[Event::Trigger(T::Api), obs(0, Some(0), 0)]);
        assert_eq!(phases, vec![Draining, Done]);
        assert_eq!(actions.last(), Some(&Finish(Outcome::Quiesced)));
        assert_eq!(s.trigger, Some(Trigger::Api));
    }

    #[test]
    fn next_deadline_follows_the_phase() {
        let m = machine();
        let mut s = State::default();
        assert_eq!(m.next_deadline(&s), None);
        s = m.step(s, Event::Trigger(T::Api)).0;
        assert_eq!(m.next_deadline(&s), Some(secs(5)));
        s = m.step(s, tick(5)).0;
        assert_eq!(m.next_deadline(&s), Some(secs(60)));
        s = m.step(s, tick(60)).0;
        assert_eq!(m.next_deadline(&s), Some(secs(90)));
    }

    #[test]
    fn outcomes_serialize_as_the_contract_says() {
        let j = serde_json::to_string(&[
            Outcome::Quiesced,
            Outcome::Deadline,
            Outcome::EnvoyUnreachable,
        ])
        .unwrap();
        assert_eq!(j, r#"["quiesced","deadline","envoy_unreachable"]"#);
        assert_eq!(serde_json::to_string(&T::Prestop).unwrap(), r#""prestop""#);
    }
}
