//! The one task that drives a drain: it feeds the pure machine with triggers,
//! timer ticks and Envoy observations, and carries out every action the
//! machine emits, so a test of the machine is a test of the drain.
//!
//! Envoy is talked to from a separate task, so a hung admin API delays only
//! the next observation, never the deadline. The machine's Envoy actions
//! (fail the health check, drain the listeners) are handed to that task,
//! which carries them out at once and again on an Envoy that restarted or
//! passes its health check again, until they hold on the Envoy it counts.

use crate::timer::sleep_until_opt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::machine::{Action, Event, Machine, Outcome, Phase, State, Trigger};
use super::report::{Accounting, Active, EnvoyReport, EnvoyStatus, Report, Status};
use crate::config::Timers;
use crate::envoy::{AdminClient, AdminError, Counts, FailOpen, InboundScope};
use crate::metrics::Metrics;
use envoy_types::pb::envoy::admin::v3::server_info::State as ServerState;

/// What the drain needs from the stream guard; the guard knows nothing of Envoy.
pub trait StreamGuard: Send + Sync + 'static {
    /// GOAWAY on every connection; keep accepting new ones.
    fn goaway_all(&self);
    /// End every open stream gracefully, spread evenly over `window`, and
    /// refuse new streams (retryably) from now on.
    fn terminate_all(&self, window: Duration);
    /// The drain's form: end long-lived streams gracefully, spread over
    /// `window`; let short calls in flight finish until shortly before
    /// `deadline` (both from now), then end what is left; refuse new streams.
    fn terminate_within(&self, window: Duration, deadline: Duration) {
        let _ = deadline;
        self.terminate_all(window);
    }
    /// Envoy drains a listener (or some of its filter chains) after a
    /// config update: end the streams of the connections it drains
    /// gracefully before it closes them, spread over the window left. New
    /// streams are still admitted; newer connections' are left alone.
    fn end_config_push(&self, push: &PushDrain) {
        let _ = push;
    }
    /// Streams open through the guard right now.
    fn active_streams(&self) -> u64;
    /// Streams the guard ended gracefully because of the drain.
    fn terminated_by_drain(&self) -> u64;
    /// Streams the guard has ended without its graceful end since it
    /// started (the application's connection lost, or no message boundary
    /// in time). The drain reports those since its trigger.
    fn failed_total(&self) -> u64;
}

/// A listener drain Envoy began after a config update, as the guard is
/// asked to end its streams (`control::listener_drains` sees it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushDrain {
    /// The listener that drains.
    pub listener: String,
    /// When Envoy began it (its `last_updated`, the host clock).
    pub started: std::time::SystemTime,
    /// Envoy's `--drain-time-s`: it closes what is left at `started` + this.
    pub drain_time: Duration,
    /// Only these filter chains drain (an in-place update); None: the
    /// whole listener, or the chains could not be told.
    pub chains: Option<Vec<String>>,
    /// How late the drain may have been seen (the watcher's look interval):
    /// a stream without Envoy's origin header opened this long after the
    /// start may still ride a drained connection.
    pub seen_within: Duration,
}

/// Everything one drain needs.
#[derive(Clone)]
pub struct DrainSettings {
    /// When each phase ends.
    pub timers: Timers,
    /// The Envoy being drained: health check, listeners, live counters.
    pub admin: AdminClient,
    /// The stream guard in front of the app, when the pod has one: the only
    /// way long-lived streams end gracefully.
    pub guard: Option<Arc<dyn StreamGuard>>,
}

/// What the handle asks of the driver task.
#[derive(Debug)]
enum DriverCommand {
    /// Start the drain, or join the one running.
    Trigger(Trigger),
    /// A second SIGTERM: go to the deadline now.
    Hurry,
}

/// A handle on the drain driver. Cheap to clone; every caller sees the same drain.
#[derive(Clone, Debug)]
pub struct DrainHandle {
    /// Commands to the one driver task.
    tx: mpsc::UnboundedSender<DriverCommand>,
    /// The driver's latest status; the report appears in it once done.
    status: watch::Receiver<Status>,
}

// === impl DrainHandle ===

impl DrainHandle {
    /// Starts the drain, or joins the one running, and returns the status once
    /// the drain has begun.
    pub async fn trigger(&self, trigger: Trigger) -> Status {
        let _ = self.tx.send(DriverCommand::Trigger(trigger));
        let mut rx = self.status.clone();
        let _ = rx.wait_for(|s| s.phase != Phase::Serving).await;
        let status = rx.borrow().clone();
        status
    }

    /// Go to the deadline now (a second SIGTERM).
    pub fn hurry(&self) {
        let _ = self.tx.send(DriverCommand::Hurry);
    }

    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    /// Waits for the report. None only if the driver is gone.
    pub async fn report(&self) -> Option<Report> {
        let mut rx = self.status.clone();
        let status = rx.wait_for(|s| s.report.is_some()).await.ok()?;
        status.report.clone()
    }
}

/// Starts the driver task. It waits for a trigger, runs one drain, publishes
/// the report and ends.
pub fn spawn(settings: DrainSettings, metrics: Metrics) -> (DrainHandle, JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (status_tx, status) = watch::channel(Status::serving());
    let task = tokio::spawn(run(settings, metrics, rx, status_tx));
    (DrainHandle { tx, status }, task)
}

/// What the Envoy side reports to the driver.
enum EnvoyMsg {
    /// A poll's counts, sent after the drain's steps were tried on the Envoy
    /// that was counted. `restarted`: this is a new Envoy process.
    /// `steps_done`: the health check is failed and the listeners drain; until
    /// then the counts are accounted but cannot end the drain.
    Counts {
        counts: Counts,
        /// The fail-open path at the same moment; None when `/clusters` did
        /// not answer (the last reading stands).
        failopen: Option<FailOpen>,
        restarted: bool,
        steps_done: bool,
    },
    Version(String),
    Failed(AdminError),
}

async fn run(
    settings: DrainSettings,
    metrics: Metrics,
    mut rx: mpsc::UnboundedReceiver<DriverCommand>,
    status_tx: watch::Sender<Status>,
) {
    let trigger = loop {
        match rx.recv().await {
            Some(DriverCommand::Trigger(t)) => break t,
            // "Hurry" means nothing before a drain has started.
            Some(DriverCommand::Hurry) => continue,
            None => return,
        }
    };
    let t0 = Instant::now();
    let machine = Machine::new(settings.timers);
    tracing::info!(?trigger, timers = ?settings.timers, "drain started");
    metrics.drain.draining.set(1);

    let (envoy_tx, mut envoy_rx) = mpsc::channel(16);
    let (wanted, wanted_rx) = watch::channel(Wanted::default());
    let (admin, poll) = (settings.admin.clone(), settings.timers.poll_interval);

    let mut d = Drive {
        machine,
        settings,
        metrics,
        status_tx,
        t0,
        state: State::default(),
        acc: Accounting::default(),
        envoy: EnvoyStatus::default(),
        failed_before: 0,
        wanted,
    };
    d.failed_before = d.settings.guard.as_ref().map_or(0, |g| g.failed_total());
    // The trigger's actions first: the Envoy task's first round carries out
    // the Envoy steps they ask for.
    d.apply(Event::Trigger(trigger));
    let envoy_task = tokio::spawn(envoy_side(admin, poll, envoy_tx, wanted_rx));

    let mut commands_open = true;
    let mut envoy_open = true;
    while d.state.phase != Phase::Done {
        let next = d.machine.next_deadline(&d.state).map(|at| t0 + at);
        let event = tokio::select! {
            cmd = rx.recv(), if commands_open => match cmd {
                Some(DriverCommand::Hurry) => {
                    tracing::warn!("asked to hurry: going to the deadline now");
                    Event::Hurry
                }
                // Later triggers join this drain.
                Some(DriverCommand::Trigger(_)) => continue,
                None => {
                    commands_open = false;
                    continue;
                }
            },
            _ = sleep_until_opt(next) => Event::Tick { elapsed: t0.elapsed() },
            msg = envoy_rx.recv(), if envoy_open => match msg {
                Some(msg) => d.envoy_event(msg),
                // The Envoy task never ends on its own (a panic would end
                // it): treat Envoy as unreachable from now on, once, and
                // stop listening so a closed channel cannot spin this loop.
                None => {
                    envoy_open = false;
                    tracing::error!("the envoy poller stopped; finishing the drain at its deadline");
                    d.envoy.reachable = false;
                    d.envoy.error = Some("the envoy poller stopped".into());
                    Event::Observed {
                        elapsed: t0.elapsed(),
                        envoy_streams: None,
                        envoy_connections: None,
                        guard_streams: d.guard_streams(),
                    }
                }
            },
        };
        d.apply(event);
    }
    envoy_task.abort();
}

/// The driver's mutable state, kept together so `apply` reads plainly.
struct Drive {
    /// The pure transition function and its timers.
    machine: Machine,
    /// Envoy, the guard, the timers.
    settings: DrainSettings,
    /// Where the drain's gauges and the final counts go.
    metrics: Metrics,
    /// Publishes each status to every handle.
    status_tx: watch::Sender<Status>,
    /// When the trigger came: every elapsed time counts from here.
    t0: Instant,
    /// The machine's state (phase, outcome, the trigger).
    state: State,
    /// Counts seen so far: at start, last poll, what the guard ended.
    acc: Accounting,
    /// What Envoy last said of itself (reachable, version, restarts).
    envoy: EnvoyStatus,
    /// The guard's failed streams at the trigger.
    failed_before: u64,
    /// The Envoy steps the machine asked for, for the Envoy task.
    wanted: watch::Sender<Wanted>,
}

/// The Envoy steps the machine has asked for so far.
#[derive(Clone, Copy, Debug, Default)]
struct Wanted {
    fail_healthcheck: bool,
    drain_listeners: bool,
}

// === impl Drive ===

impl Drive {
    fn guard_streams(&self) -> u64 {
        self.settings
            .guard
            .as_ref()
            .map_or(0, |g| g.active_streams())
    }

    /// Turns an Envoy message into a machine event.
    fn envoy_event(&mut self, msg: EnvoyMsg) -> Event {
        let elapsed = self.t0.elapsed();
        let guard_streams = self.guard_streams();
        match msg {
            EnvoyMsg::Counts {
                counts: c,
                failopen,
                restarted,
                steps_done,
            } => {
                self.acc.observe(c, restarted);
                if let Some(f) = failopen {
                    self.acc.observe_failopen(f);
                    self.metrics
                        .set_failopen(f.requests, f.connections, f.paths);
                }
                if self.acc.restarts() > self.envoy.restarts {
                    tracing::warn!(
                        restarts = self.acc.restarts(),
                        "envoy restarted under the drain: the old process's streams are counted as cut"
                    );
                }
                self.envoy.restarts = self.acc.restarts();
                self.envoy.last_seen_seconds = Some(elapsed.as_secs_f64());
                self.metrics
                    .envoy
                    .active_connections
                    .set(c.cx_active as i64);
                self.metrics.envoy.active_streams.set(c.rq_active as i64);
                // A step that failed was reported just before, with its error:
                // Envoy answers but does not do what the drain needs.
                if steps_done {
                    self.envoy.reachable = true;
                    self.envoy.error = None;
                }
                Event::Observed {
                    elapsed,
                    envoy_streams: steps_done.then_some(c.rq_active),
                    envoy_connections: steps_done.then_some(c.cx_active),
                    guard_streams,
                }
            }
            EnvoyMsg::Version(v) => {
                self.envoy.version = v;
                Event::Tick { elapsed }
            }
            EnvoyMsg::Failed(e) => {
                tracing::warn!(error = %e, "envoy admin call failed during drain");
                self.envoy.reachable = false;
                self.envoy.error = Some(e.to_string());
                Event::Observed {
                    elapsed,
                    envoy_streams: None,
                    envoy_connections: None,
                    guard_streams,
                }
            }
        }
    }

    fn apply(&mut self, event: Event) {
        let (next, actions) = self.machine.step(self.state, event);
        if next.phase != self.state.phase {
            tracing::info!(phase = ?next.phase, elapsed = ?self.t0.elapsed(), "drain phase");
        }
        self.state = next;
        let mut report = None;
        for action in actions {
            match action {
                // Admin calls, made by the Envoy task (so a hung admin API
                // never holds the deadline), which retries them each round.
                Action::FailHealthcheck => self.wanted.send_modify(|w| w.fail_healthcheck = true),
                Action::DrainListeners => self.wanted.send_modify(|w| w.drain_listeners = true),
                Action::GoawayAll => {
                    if let Some(g) = &self.settings.guard {
                        g.goaway_all();
                    }
                }
                Action::TerminateStreams { window, deadline } => {
                    if let Some(g) = &self.settings.guard {
                        tracing::info!(?window, ?deadline, "ending guard streams gracefully");
                        g.terminate_within(window, deadline);
                    }
                }
                Action::Finish(outcome) => report = Some(self.report(outcome)),
            }
        }
        let last = self.acc.last().unwrap_or_default();
        let status = Status {
            phase: self.state.phase,
            trigger: self.state.trigger,
            elapsed_seconds: self.t0.elapsed().as_secs_f64(),
            active: Active {
                connections: last.cx_active,
                streams: last.rq_active,
                guard_streams: self.guard_streams(),
                failopen_streams: self.acc.failopen().requests,
            },
            envoy: self.envoy.clone(),
            report: report.clone(),
        };
        if let Some(r) = &report {
            self.metrics.record_drain(&r.counts());
            self.metrics.drain.draining.set(0);
            tracing::info!(report = %serde_json::to_string(r).unwrap_or_default(), "drain done");
        }
        self.status_tx.send_replace(status);
    }

    fn report(&self, outcome: Outcome) -> Report {
        let guard = self.settings.guard.as_ref();
        let terminated = guard.map_or(0, |g| g.terminated_by_drain());
        // (A node agent's guard can be replaced meanwhile: never below 0.)
        let failed = guard
            .map_or(0, |g| g.failed_total())
            .saturating_sub(self.failed_before);
        let (connections, streams) = self.acc.outcomes(outcome, terminated, failed);
        Report {
            phase: Phase::Done,
            outcome,
            // The machine always records the trigger before it can finish.
            trigger: self.state.trigger.unwrap_or(super::Trigger::Api),
            duration_seconds: self.t0.elapsed().as_secs_f64(),
            connections,
            streams,
            envoy: EnvoyReport {
                version: self.envoy.version.clone(),
                reachable: self.envoy.reachable,
                // Only an unreachable end needs its cause in the report.
                error: if self.envoy.reachable {
                    None
                } else {
                    self.envoy.error.clone()
                },
                last_seen_seconds: self.envoy.last_seen_seconds,
                restarts: self.envoy.restarts,
            },
        }
    }
}

/// Envoy's uptime comes in whole seconds, and the estimate of its start
/// moves by up to that plus a call's latency; a start that moved later by
/// more than this is a new process.
const RESTART_SLACK: Duration = Duration::from_secs(2);

/// The drain's steps on one Envoy process; a new process needs them again.
#[derive(Debug, Default)]
struct Steps {
    /// `POST /healthcheck/fail` succeeded.
    healthcheck_failed: bool,
    /// `POST /drain_listeners?graceful[&inboundonly]` succeeded.
    listeners_drained: bool,
}

/// Talks to Envoy for the drain. Each round reads `/server_info` (version,
/// state, uptime), counts the inbound listeners' connections and streams
/// (the first round is the baseline), carries out the steps the machine
/// asked for (`wanted`) and not yet done on this Envoy (fail the health
/// check, drain the inbound listeners), and only then reports the counts,
/// so the drain never ends before its steps reached the Envoy it counted.
/// A step asked for between rounds starts the next round at once.
///
/// A failed step is retried next round. An Envoy that restarted under the
/// drain (its uptime went back), or whose health check passes again, gets
/// the steps again: the new process is drained too.
async fn envoy_side(
    admin: AdminClient,
    poll: Duration,
    tx: mpsc::Sender<EnvoyMsg>,
    mut wanted: watch::Receiver<Wanted>,
) {
    let mut scope: Option<InboundScope> = None;
    let mut steps = Steps::default();
    // (version, estimated start) of the Envoy process last seen.
    let mut seen: Option<(String, Instant)> = None;
    let mut next = Instant::now();
    loop {
        let want = *wanted.borrow_and_update();
        let round = envoy_round(&admin, want, &mut scope, &mut steps, &mut seen).await;
        let msgs = match round {
            Ok(msgs) => msgs,
            Err(e) => {
                // The listeners may differ when Envoy comes back.
                scope = None;
                vec![EnvoyMsg::Failed(e)]
            }
        };
        for msg in msgs {
            if tx.send(msg).await.is_err() {
                return;
            }
        }
        next += poll;
        let now = Instant::now();
        if next < now {
            // A slow admin call, or the clock jumped: skip the missed slots
            // rather than burst.
            next = now + poll;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            // A closed channel (the drive is gone) waits for the sleep.
            Ok(()) = wanted.changed() => next = Instant::now(),
        }
    }
}

/// One poll round; the messages to send, in order.
async fn envoy_round(
    admin: &AdminClient,
    want: Wanted,
    scope: &mut Option<InboundScope>,
    steps: &mut Steps,
    seen: &mut Option<(String, Instant)>,
) -> Result<Vec<EnvoyMsg>, AdminError> {
    let mut msgs = Vec::new();
    let info = admin.server_info().await?;
    let version = info.release().to_string();
    let started = Instant::now()
        .checked_sub(info.uptime().unwrap_or_default())
        .unwrap_or_else(Instant::now);
    let restarted = match seen.as_ref() {
        None => false,
        Some((v, s)) => *v != version || started > *s + RESTART_SLACK,
    };
    if restarted {
        tracing::warn!(%version, "envoy restarted under the drain: draining the new process");
        *steps = Steps::default();
        *scope = None;
    } else if steps.healthcheck_failed && info.state() == Some(ServerState::Live) {
        tracing::warn!("envoy's health check passes again during the drain: failing it again");
        *steps = Steps::default();
    }
    if seen.as_ref().is_none_or(|(v, _)| *v != version) {
        msgs.push(EnvoyMsg::Version(version.clone()));
    }
    // The earliest estimate of this process's start is the closest.
    let started = match seen.as_ref() {
        Some((_, s)) if !restarted => started.min(*s),
        _ => started,
    };
    *seen = Some((version, started));

    let s = match scope.as_ref() {
        Some(s) => s.clone(),
        None => {
            let s = admin.inbound_scope().await?;
            if s.all_listeners {
                tracing::warn!(
                    "no listener is marked INBOUND: counting and draining all listeners"
                );
            }
            scope.insert(s).clone()
        }
    };
    // Count first, so the baseline is taken before anything changes.
    let counts = admin.counts(&s).await?;
    // Read beside the counts; a failure here only leaves the last reading.
    let failopen = match admin.failopen().await {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::debug!(error = %e, "drain: cannot read the fail-open path");
            None
        }
    };
    if want.fail_healthcheck && !steps.healthcheck_failed {
        match admin.healthcheck_fail().await {
            Ok(()) => steps.healthcheck_failed = true,
            Err(e) => msgs.push(EnvoyMsg::Failed(e)),
        }
    }
    if want.drain_listeners && steps.healthcheck_failed && !steps.listeners_drained {
        // A second graceful drain on the same Envoy is ignored by Envoy.
        match admin.drain_listeners(true, !s.all_listeners).await {
            Ok(()) => steps.listeners_drained = true,
            Err(e) => msgs.push(EnvoyMsg::Failed(e)),
        }
    }
    msgs.push(EnvoyMsg::Counts {
        counts,
        failopen,
        restarted,
        steps_done: steps.healthcheck_failed && steps.listeners_drained,
    });
    Ok(msgs)
}
