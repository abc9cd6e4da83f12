//! The one task that drives a drain: it feeds the pure machine with triggers,
//! timer ticks and Envoy observations, and carries out its actions.
//!
//! Envoy is talked to from a separate task, so a hung admin API delays only
//! the next observation, never the deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::machine::{Action, Event, Machine, Outcome, Phase, State, Trigger};
use super::report::{Accounting, Active, EnvoyReport, EnvoyStatus, Report, Status};
use crate::config::Timers;
use crate::envoy::{AdminClient, AdminError, Counts, InboundScope};
use crate::metrics::Metrics;

/// What the drain needs from the stream guard; the guard knows nothing of Envoy.
pub trait StreamGuard: Send + Sync + 'static {
    /// GOAWAY on every connection; keep accepting new ones.
    fn goaway_all(&self);
    /// End every open stream gracefully, spread evenly over `window`, and
    /// refuse new streams (retryably) from now on.
    fn terminate_all(&self, window: Duration);
    /// Streams open through the guard right now.
    fn active_streams(&self) -> u64;
    /// Streams the guard ended because of the drain.
    fn terminated_by_drain(&self) -> u64;
}

/// Everything one drain needs.
#[derive(Clone)]
pub struct DrainSettings {
    pub timers: Timers,
    pub admin: AdminClient,
    pub guard: Option<Arc<dyn StreamGuard>>,
}

#[derive(Debug)]
enum Command {
    Trigger(Trigger),
    Hurry,
}

/// A handle on the drain driver. Cheap to clone; every caller sees the same drain.
#[derive(Clone, Debug)]
pub struct DrainHandle {
    tx: mpsc::UnboundedSender<Command>,
    status: watch::Receiver<Status>,
}

impl DrainHandle {
    /// Starts the drain, or joins the one running, and returns the status once
    /// the drain has begun.
    pub async fn trigger(&self, trigger: Trigger) -> Status {
        let _ = self.tx.send(Command::Trigger(trigger));
        let mut rx = self.status.clone();
        let _ = rx.wait_for(|s| s.phase != Phase::Serving).await;
        let status = rx.borrow().clone();
        status
    }

    /// Go to the deadline now (a second SIGTERM).
    pub fn hurry(&self) {
        let _ = self.tx.send(Command::Hurry);
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
    Counts(Counts),
    Version(String),
    Failed(AdminError),
}

async fn run(
    settings: DrainSettings,
    metrics: Metrics,
    mut rx: mpsc::UnboundedReceiver<Command>,
    status_tx: watch::Sender<Status>,
) {
    let trigger = loop {
        match rx.recv().await {
            Some(Command::Trigger(t)) => break t,
            // "Hurry" means nothing before a drain has started.
            Some(Command::Hurry) => continue,
            None => return,
        }
    };
    let t0 = Instant::now();
    let machine = Machine::new(settings.timers);
    tracing::info!(?trigger, timers = ?settings.timers, "drain started");
    metrics.draining.set(1);

    let (envoy_tx, mut envoy_rx) = mpsc::channel(16);
    let envoy_task = tokio::spawn(envoy_side(
        settings.admin.clone(),
        settings.timers.poll_interval,
        envoy_tx,
    ));

    let mut d = Drive {
        machine,
        settings,
        metrics,
        status_tx,
        t0,
        state: State::default(),
        acc: Accounting::default(),
        envoy: EnvoyStatus::default(),
    };
    d.apply(Event::Trigger(trigger));

    let mut commands_open = true;
    while d.state.phase != Phase::Done {
        let next = d.machine.next_deadline(&d.state).map(|at| t0 + at);
        let event = tokio::select! {
            cmd = rx.recv(), if commands_open => match cmd {
                Some(Command::Hurry) => {
                    tracing::warn!("asked to hurry: going to the deadline now");
                    Event::Hurry
                }
                // Later triggers join this drain.
                Some(Command::Trigger(_)) => continue,
                None => {
                    commands_open = false;
                    continue;
                }
            },
            _ = sleep_until_opt(next) => Event::Tick { elapsed: t0.elapsed() },
            msg = envoy_rx.recv() => match msg {
                Some(msg) => d.envoy_event(msg),
                // The Envoy task never ends on its own; treat it as unreachable.
                None => Event::Observed {
                    elapsed: t0.elapsed(),
                    envoy_streams: None,
                    guard_streams: d.guard_streams(),
                },
            },
        };
        d.apply(event);
    }
    envoy_task.abort();
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The driver's mutable state, kept together so `apply` reads plainly.
struct Drive {
    machine: Machine,
    settings: DrainSettings,
    metrics: Metrics,
    status_tx: watch::Sender<Status>,
    t0: Instant,
    state: State,
    acc: Accounting,
    envoy: EnvoyStatus,
}

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
            EnvoyMsg::Counts(c) => {
                self.acc.observe(c);
                self.envoy.reachable = true;
                self.envoy.error = None;
                self.metrics
                    .envoy_active_connections
                    .set(c.cx_active as i64);
                self.metrics.envoy_active_streams.set(c.rq_active as i64);
                Event::Observed {
                    elapsed,
                    envoy_streams: Some(c.rq_active),
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
                // The Envoy task performs the admin calls.
                Action::FailHealthcheck | Action::DrainListeners => {}
                Action::GoawayAll => {
                    if let Some(g) = &self.settings.guard {
                        g.goaway_all();
                    }
                }
                Action::TerminateStreams { window } => {
                    if let Some(g) = &self.settings.guard {
                        tracing::info!(?window, "ending guard streams gracefully");
                        g.terminate_all(window);
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
            },
            envoy: self.envoy.clone(),
            report: report.clone(),
        };
        if let Some(r) = &report {
            self.metrics.record_report(r);
            self.metrics.draining.set(0);
            tracing::info!(report = %serde_json::to_string(r).unwrap_or_default(), "drain done");
        }
        self.status_tx.send_replace(status);
    }

    fn report(&self, outcome: Outcome) -> Report {
        let terminated = self
            .settings
            .guard
            .as_ref()
            .map_or(0, |g| g.terminated_by_drain());
        let (connections, streams) = self.acc.outcomes(outcome, terminated);
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
            },
        }
    }
}

/// Talks to Envoy for the drain: takes a baseline, fails the health check,
/// drains the inbound listeners, then polls live counters every interval.
/// Steps that failed are retried on the next round, so an Envoy that comes
/// back (or restarts) is still drained.
async fn envoy_side(admin: AdminClient, poll: Duration, tx: mpsc::Sender<EnvoyMsg>) {
    let mut scope: Option<InboundScope> = None;
    let mut healthcheck_failed = false;
    let mut listeners_drained = false;
    let mut version_known = false;
    let mut next = Instant::now();
    loop {
        // Count first, so the baseline is taken before anything changes.
        let result = async {
            let s = match &scope {
                Some(s) => s.clone(),
                None => {
                    let s = admin.inbound_scope().await?;
                    if s.all_listeners {
                        tracing::warn!(
                            "no listener is marked INBOUND: counting and draining all listeners"
                        );
                    }
                    scope = Some(s.clone());
                    s
                }
            };
            admin.counts(&s).await
        }
        .await;
        let ok = result.is_ok();
        let msg = result.map_or_else(EnvoyMsg::Failed, EnvoyMsg::Counts);
        if tx.send(msg).await.is_err() {
            return;
        }
        if !ok {
            // The listeners may differ after Envoy comes back.
            scope = None;
        }
        if ok && !healthcheck_failed {
            match admin.healthcheck_fail().await {
                Ok(()) => healthcheck_failed = true,
                Err(e) => {
                    let _ = tx.send(EnvoyMsg::Failed(e)).await;
                }
            }
        }
        if let (true, false, Some(s)) = (healthcheck_failed, listeners_drained, &scope) {
            match admin.drain_listeners(true, !s.all_listeners).await {
                Ok(()) => listeners_drained = true,
                Err(e) => {
                    let _ = tx.send(EnvoyMsg::Failed(e)).await;
                }
            }
        }
        if ok && !version_known {
            if let Ok(info) = admin.server_info().await {
                version_known = true;
                let _ = tx.send(EnvoyMsg::Version(info.release().to_string())).await;
            }
        }
        next += poll;
        let now = Instant::now();
        if next < now {
            // A slow admin call: skip the missed slots rather than burst.
            next = now + poll;
        }
        tokio::time::sleep_until(next).await;
    }
}
