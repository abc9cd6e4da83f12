//! No pod left stuck DRAINING silently (Contour #4851, Envoy Gateway #5832).
//!
//! A sidecar that starts (or restarts) inspects Envoy before anything
//! drains, and keeps watching it until a drain of its own
//! begins (every poll interval while unsettled, every 5 s once healthy or
//! stuck). It reads `/server_info` `state` (DRAINING means the health check
//! is failed) and the counter `listener_manager.listener_stopped` (Envoy
//! 1.40 still lists a stopped listener in `/listeners` and in
//! `total_listeners_active`; this counter is the only trace it leaves).
//!
//! | Envoy | verdict | what the shim does |
//! |---|---|---|
//! | LIVE, no listener stopped | healthy | nothing |
//! | health check failed, no listener stopped | pending | waits Envoy's `--drain-time-s` (+2 s), then `POST /healthcheck/ok` if still so: recovered |
//! | a listener stopped (health check failed or not) | stuck | `/readyz` 503 with the reason, `drainshim_envoy_stuck_draining` 1, an error log saying to replace the pod |
//! | unreachable, initializing | unknown | looks again next interval |
//!
//! **Why the recovery is safe.** A drain that is legitimately running (this
//! shim's container restarted during preStop, say) must not be undone. Such
//! a drain has called `POST /drain_listeners?graceful`, and Envoy stops the
//! listeners exactly `--drain-time-s` after that call; no admin endpoint
//! shows the drain sequence before then. So the shim waits that long from
//! the moment it first saw the failed health check: any graceful drain
//! started before that moment has stopped its listeners by then, and the
//! verdict turns to *stuck* (not ready: right for a terminating pod too),
//! never to a recovery. Only a failed health check with listeners still up
//! after that wait, with no drain of this shim running, is undone: nothing
//! can stop those listeners any more, so the pod is healthy but for the
//! health check an earlier drain left behind. During the wait `/readyz` is
//! 503, as Envoy's own `/ready` is.
//!
//! The same looks watch for listener drains a config push began (see
//! `listener_drains`), and that part keeps looking through the pod's own
//! drain.
//!
//! Stopped listeners are never recoverable through the admin API; only a new
//! Envoy process (a new pod) serves again, so that case is made loud.
//!
//! The rule assumes drainshim is the only one failing this Envoy's health
//! check: one failed by hand is restored after the drain time. Take a pod
//! out by hand with the shim's `POST /drain` instead.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::admin::v3::server_info::State as ServerState;
use tokio::sync::watch;
use tokio::time::Instant;

use super::listener_drains::{self, Tracker};
use crate::drain::{DrainHandle, Phase, StreamGuard};
use crate::envoy::{AdminClient, ListenerManagerStats};
use crate::metrics::{Metrics, SidecarMetrics};

/// Envoy's own default `--drain-time-s`, used when `/server_info` does not say.
pub const ENVOY_DEFAULT_DRAIN_TIME: Duration = Duration::from_secs(600);
/// How often a settled Envoy (healthy, or stuck for good) is looked at: a
/// kubelet probes readiness every 10 s by default, and every look opens two
/// admin connections.
pub const SETTLED_INTERVAL: Duration = Duration::from_secs(5);
/// Envoy stops the listeners when its drain timer fires; this covers the
/// timer, the counter update and one slow admin call on our side.
pub const RECOVERY_MARGIN: Duration = Duration::from_secs(2);

/// What one look at Envoy found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    /// `/server_info` `state`.
    pub state: ServerState,
    /// `listener_manager.listener_stopped`.
    pub listeners_stopped: u64,
}

/// What the shim makes of Envoy's state; `/readyz` serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryVerdict {
    /// Not looked yet, Envoy unreachable, or still initializing.
    Unknown(String),
    /// LIVE with every listener up.
    Healthy,
    /// Health check failed, listeners up: restored at `due` unless the
    /// listeners stop first.
    Pending { due: Instant },
    /// Listeners stopped: this Envoy can never serve again.
    Stuck(String),
}

/// The pure part of the rule: one observation, judged on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Judgement {
    Healthy,
    HealthCheckFailed,
    Stuck(String),
    NotYet(String),
}

pub fn judge(o: Observation) -> Judgement {
    let hc_failed = o.state == ServerState::Draining;
    match (o.state, o.listeners_stopped) {
        (ServerState::PreInitializing | ServerState::Initializing, _) => {
            Judgement::NotYet(format!("envoy is {}", o.state.as_str_name()))
        }
        (_, stopped) if stopped > 0 => Judgement::Stuck(format!(
            "envoy has stopped {stopped} listener(s){}; stopped listeners never reopen",
            if hc_failed {
                " and its health check is failed (a drain ran)"
            } else {
                " while its health check passes"
            }
        )),
        (ServerState::Draining, _) => Judgement::HealthCheckFailed,
        (ServerState::Live, _) => Judgement::Healthy,
    }
}

/// Reads Envoy once: its state and drain time, and the `listener_manager`
/// stats both this rule and the listener-drain watch read (one call).
async fn observe(
    admin: &AdminClient,
) -> Result<(Observation, Duration, ListenerManagerStats), String> {
    let info = admin.server_info().await.map_err(|e| e.to_string())?;
    let state = info
        .state()
        .ok_or_else(|| format!("envoy reports an unknown state {:?}", info.state))?;
    let lm = admin.listener_manager().await.map_err(|e| e.to_string())?;
    let drain_time = info.drain_time().unwrap_or(ENVOY_DEFAULT_DRAIN_TIME);
    Ok((
        Observation {
            state,
            listeners_stopped: lm.stopped,
        },
        drain_time,
        lm,
    ))
}

/// The watcher's handle: the current verdict.
#[derive(Clone, Debug)]
pub struct EnvoyHealth {
    verdict: watch::Receiver<RecoveryVerdict>,
}

// === impl EnvoyHealth ===

impl EnvoyHealth {
    pub fn verdict(&self) -> RecoveryVerdict {
        self.verdict.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<RecoveryVerdict> {
        self.verdict.clone()
    }

    /// Why the pod must not be ready, if the verdict says so.
    pub fn not_ready_reason(&self) -> Option<String> {
        match self.verdict() {
            RecoveryVerdict::Stuck(reason) => Some(format!(
                "{reason}: this pod cannot serve again; replace it (delete the pod)"
            )),
            RecoveryVerdict::Pending { due } => Some(format!(
                "envoy's health check is failed and its listeners are up (left by an earlier drain?); \
                 restoring it in {:.0}s unless its listeners stop first",
                due.saturating_duration_since(Instant::now()).as_secs_f64()
            )),
            RecoveryVerdict::Unknown(_) | RecoveryVerdict::Healthy => None,
        }
    }
}

/// Starts the watcher. Its health-check rule ends when a drain starts (the
/// drain owns Envoy then); its watch for listener drains goes on.
/// `pod` names the pod in the log lines, when known.
pub fn spawn(
    admin: AdminClient,
    drain: DrainHandle,
    every: Duration,
    metrics: SidecarMetrics,
    drain_metrics: Metrics,
    pod: String,
    guard: Option<Arc<dyn StreamGuard>>,
) -> EnvoyHealth {
    let (tx, verdict) = watch::channel(RecoveryVerdict::Unknown("not looked yet".into()));
    tokio::spawn(watch_envoy(
        admin,
        drain,
        every,
        (metrics, drain_metrics),
        (pod, guard),
        tx,
    ));
    EnvoyHealth { verdict }
}

async fn watch_envoy(
    admin: AdminClient,
    drain: DrainHandle,
    every: Duration,
    (metrics, drain_metrics): (SidecarMetrics, Metrics),
    (pod, guard): (String, Option<Arc<dyn StreamGuard>>),
    tx: watch::Sender<RecoveryVerdict>,
) {
    let mut drain_status = drain.subscribe();
    let draining = |s: &crate::drain::Status| s.phase != Phase::Serving;
    let mut next = Instant::now();
    let mut tracker = Tracker::default();
    let mut drain_time = ENVOY_DEFAULT_DRAIN_TIME;
    loop {
        if draining(&drain_status.borrow()) {
            // The drain owns Envoy now: only listener drains are watched.
            tracing::debug!(
                "a drain started: the envoy watcher only looks for listener drains now"
            );
            watch_listener_drains(
                &admin,
                &mut tracker,
                drain_time,
                every,
                &drain_metrics,
                (&pod, guard.as_deref()),
            )
            .await;
            return;
        }
        let previous = tx.borrow().clone();
        let observed = observe(&admin).await;
        if let Ok((_, dt, lm)) = &observed {
            drain_time = *dt;
            let drains = listener_drains::look(
                &admin,
                &mut tracker,
                *lm,
                drain_time,
                &drain_metrics,
                &pod,
                false,
            )
            .await;
            if let Some(g) = &guard {
                listener_drains::end_streams(&**g, &drains, drain_time, every);
            }
        }
        let listener_drain_running = tracker_draining(&observed);
        let verdict = match observed {
            Err(e) => RecoveryVerdict::Unknown(e),
            Ok((o, drain_time, _)) => match judge(o) {
                Judgement::NotYet(why) => RecoveryVerdict::Unknown(why),
                Judgement::Healthy => RecoveryVerdict::Healthy,
                Judgement::Stuck(reason) => RecoveryVerdict::Stuck(reason),
                Judgement::HealthCheckFailed => match previous.clone() {
                    RecoveryVerdict::Pending { due } if Instant::now() >= due => {
                        if draining(&drain_status.borrow()) {
                            return;
                        }
                        match admin.healthcheck_ok().await {
                            Ok(()) => {
                                metrics.envoy_recoveries.inc();
                                tracing::warn!(%pod, ?drain_time,
                                    "recovered envoy from an earlier drain: its health check was failed \
                                     with every listener still up for longer than its drain time; \
                                     POST /healthcheck/ok sent");
                                RecoveryVerdict::Unknown("recovered; looking again".into())
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "could not restore envoy's health check; retrying");
                                previous.clone()
                            }
                        }
                    }
                    RecoveryVerdict::Pending { due } => RecoveryVerdict::Pending { due },
                    _ => {
                        let due = Instant::now() + drain_time + RECOVERY_MARGIN;
                        tracing::warn!(%pod, wait = ?(drain_time + RECOVERY_MARGIN),
                            "envoy's health check is failed but its listeners are up: \
                             waiting out its drain time before restoring it, in case a drain is running");
                        RecoveryVerdict::Pending { due }
                    }
                },
            },
        };
        match (&previous, &verdict) {
            (RecoveryVerdict::Stuck(_), RecoveryVerdict::Stuck(_)) => {}
            (_, RecoveryVerdict::Stuck(reason)) => tracing::error!(%pod,
                "{reason}. This pod can no longer serve inbound traffic and nothing will bring the \
                 listeners back: replace the pod (kubectl delete pod). drainshim /readyz answers 503 \
                 and drainshim_envoy_stuck_draining is 1 until then"),
            (RecoveryVerdict::Stuck(_), _) => {
                tracing::info!(%pod, "envoy is no longer stuck (a new process?)")
            }
            _ => {}
        }
        metrics
            .envoy_stuck_draining
            .set(i64::from(matches!(verdict, RecoveryVerdict::Stuck(_))));
        // Pending and unknown states are looked at every poll; settled ones less often.
        // With a guard, every poll: a push's drain seen late eats the
        // window its streams are spread over.
        let step = match verdict {
            _ if listener_drain_running || guard.is_some() => every,
            RecoveryVerdict::Healthy | RecoveryVerdict::Stuck(_) => every.max(SETTLED_INTERVAL),
            RecoveryVerdict::Pending { .. } | RecoveryVerdict::Unknown(_) => every,
        };
        tx.send_replace(verdict);

        next += step;
        let now = Instant::now();
        if next < now {
            next = now + step;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            // Stop at once when a drain starts.
            _ = drain_status.wait_for(draining) => {}
        }
    }
}

/// Envoy drains listeners after a config update right now.
fn tracker_draining<O, D>(observed: &Result<(O, D, ListenerManagerStats), String>) -> bool {
    observed
        .as_ref()
        .is_ok_and(|(_, _, lm)| lm.listeners_draining + lm.filter_chains_draining > 0)
}

/// During the pod's own drain: listener drains only, at the same bounds (a
/// look every settled interval, every poll while one runs), until the
/// process ends. The drain's own `/drain_listeners` never counts here.
async fn watch_listener_drains(
    admin: &AdminClient,
    tracker: &mut Tracker,
    mut drain_time: Duration,
    every: Duration,
    metrics: &Metrics,
    (pod, guard): (&str, Option<&dyn StreamGuard>),
) {
    let mut next = Instant::now();
    loop {
        let mut running = false;
        match admin.listener_manager().await {
            Ok(lm) => {
                running = lm.listeners_draining + lm.filter_chains_draining > 0;
                if tracker.needs_listeners(&lm) {
                    if let Some(dt) = admin.server_info().await.ok().and_then(|i| i.drain_time()) {
                        drain_time = dt;
                    }
                }
                let drains =
                    listener_drains::look(admin, tracker, lm, drain_time, metrics, pod, true).await;
                if let Some(g) = guard {
                    listener_drains::end_streams(g, &drains, drain_time, every);
                }
            }
            Err(e) => tracing::debug!(error = %e, "listener drains: envoy not reachable"),
        }
        let step = if running || guard.is_some() {
            every
        } else {
            every.max(SETTLED_INTERVAL)
        };
        next += step;
        let now = Instant::now();
        if next < now {
            next = now + step;
        }
        tokio::time::sleep_until(next).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ServerState::*;

    fn o(state: ServerState, listeners_stopped: u64) -> Observation {
        Observation {
            state,
            listeners_stopped,
        }
    }

    #[test]
    fn table() {
        #[rustfmt::skip]
        let cases = [
            ("live, listeners up", o(Live, 0), "healthy"),
            ("health check failed, listeners up", o(Draining, 0), "hc"),
            ("health check failed, listeners stopped", o(Draining, 1), "stuck"),
            ("live but listeners stopped (non-graceful drain)", o(Live, 2), "stuck"),
            ("initializing", o(Initializing, 0), "notyet"),
            ("pre-initializing, even with a stop", o(PreInitializing, 1), "notyet"),
        ];
        for (name, obs, want) in cases {
            let got = match judge(obs) {
                Judgement::Healthy => "healthy",
                Judgement::HealthCheckFailed => "hc",
                Judgement::Stuck(_) => "stuck",
                Judgement::NotYet(_) => "notyet",
            };
            assert_eq!(got, want, "{name}");
        }
        let Judgement::Stuck(reason) = judge(o(Draining, 1)) else {
            panic!("not stuck")
        };
        assert!(reason.contains("health check is failed"), "{reason}");
    }
}
