//! A pod's own drain timers, and the drain that runs with them.
//!
//! A pod may carry any of the sidecar's drain timers as Envoy node metadata,
//! under the names of the sidecar's environment variables, with the flags'
//! values (`30s`, `1m30s`):
//!
//! | key | the sidecar's flag |
//! |---|---|
//! | `DRAINSHIM_DEREGISTRATION_DELAY` | `--deregistration-delay` |
//! | `DRAINSHIM_MIN_DRAIN_TIME` | `--min-drain-time` |
//! | `DRAINSHIM_DRAIN_TIME` | `--drain-time` |
//! | `DRAINSHIM_PARENT_SHUTDOWN_TIME` | `--parent-shutdown-time` |
//! | `DRAINSHIM_POLL_INTERVAL` | `--poll-interval` |
//! | `DRAINSHIM_TERMINATION_GRACE_PERIOD` | `--termination-grace-period` |
//!
//! Keys a pod leaves out keep the agent's values. The result is held to the
//! sidecar's rules (`Timers::violations`, what `--check` applies). A pod
//! whose values do not parse, or whose timers break a rule, drains with the
//! agent's timers, and every violation is named: one warn line per pod, its
//! `/status`, and `drainshim_node_pod_timers_invalid{reason}`.
//!
//! The timers come from `/server_info`, after the pod was found; a drain may
//! be asked before that. So the pod's driver starts at its first trigger,
//! with the timers known then ([`PodDrain`]); once started they stay.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};
use tokio::sync::watch;

use crate::config::{Span, Timer, Timers};
use crate::drain::{self, DrainHandle, DrainSettings, Report, Status};
use crate::metrics::Metrics;
use crate::settings::Budget;

/// Where a pod's drain timers come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimerSource {
    /// The agent's flags: the pod set no key, or its keys were refused.
    Agent,
    /// At least one key of the pod's own, all valid.
    Pod,
}

/// One thing wrong with a pod's timers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// A closed set (`Rule::reason`, or `unparsable_<timer>`): the metric label.
    pub reason: &'static str,
    /// The keys and values involved, and why it matters.
    pub message: String,
}

/// The timers a pod drains with, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodTimers {
    /// What its drain runs with.
    pub timers: Timers,
    /// The grace period they were checked against, when known.
    pub grace: Option<Duration>,
    /// The pod's own, or the agent's.
    pub source: TimerSource,
    /// Why the pod's own were refused (empty when they were not).
    pub problems: Vec<Problem>,
}

/// `unparsable_<timer>`: a key whose value is not a duration.
const fn unparsable(t: Timer) -> &'static str {
    match t {
        Timer::DeregistrationDelay => "unparsable_deregistration_delay",
        Timer::MinDrainTime => "unparsable_min_drain_time",
        Timer::DrainTime => "unparsable_drain_time",
        Timer::ParentShutdownTime => "unparsable_parent_shutdown_time",
        Timer::PollInterval => "unparsable_poll_interval",
        Timer::TerminationGracePeriod => "unparsable_termination_grace_period",
    }
}

/// Every `reason` a [`Problem`] can carry.
pub fn reasons() -> impl Iterator<Item = &'static str> {
    let rules = crate::config::Rule::ALL.into_iter().map(|r| r.reason());
    rules.chain(Timer::ALL.into_iter().map(unparsable))
}

// === impl PodTimers ===

impl PodTimers {
    /// The agent's own budget, for a pod that set nothing (or before its
    /// Envoy answered).
    pub fn agent(budget: &Budget) -> Self {
        Self {
            timers: budget.timers,
            grace: budget.termination_grace_period,
            source: TimerSource::Agent,
            problems: Vec::new(),
        }
    }

    /// The timers a pod's node metadata asks for, over the agent's `budget`.
    pub fn from_metadata(metadata: &Map<String, Value>, budget: &Budget) -> Self {
        let agent = Self::agent(budget);
        let mut problems = Vec::new();
        let mut set = Vec::new();
        let mut timers = budget.timers;
        let mut grace = budget.termination_grace_period;
        for t in Timer::ALL {
            let value = match metadata.get(t.env()) {
                None => continue,
                Some(Value::String(s)) if s.trim().is_empty() => continue,
                Some(Value::String(s)) => s.trim().parse::<Span>().map_err(|e| {
                    format!("{} ({s:?}) is not a duration such as \"30s\": {e}", t.env())
                }),
                Some(other) => Err(format!(
                    "{} ({other}) must be a string duration such as \"30s\"",
                    t.env()
                )),
            };
            let d = match value {
                Ok(d) => d.get(),
                Err(message) => {
                    problems.push(Problem {
                        reason: unparsable(t),
                        message,
                    });
                    continue;
                }
            };
            set.push(t);
            match t {
                Timer::DeregistrationDelay => timers.deregistration_delay = d,
                Timer::MinDrainTime => timers.min_drain_time = d,
                Timer::DrainTime => timers.drain_time = d,
                Timer::ParentShutdownTime => timers.parent_shutdown_time = d,
                Timer::PollInterval => timers.poll_interval = d,
                Timer::TerminationGracePeriod => grace = Some(d),
            }
        }
        if set.is_empty() && problems.is_empty() {
            return agent;
        }
        // A value the pod did not set is the agent's, and named so.
        let name = |t: Timer| match set.contains(&t) {
            true => t.env().to_string(),
            false => format!("the agent's {}", t.flag()),
        };
        problems.extend(timers.violations(grace, name).into_iter().map(|v| Problem {
            reason: v.rule.reason(),
            message: v.message,
        }));
        if problems.is_empty() {
            Self {
                timers,
                grace,
                source: TimerSource::Pod,
                problems,
            }
        } else {
            Self { problems, ..agent }
        }
    }

    /// The `reason` of each problem.
    pub fn reasons(&self) -> Vec<&'static str> {
        self.problems.iter().map(|p| p.reason).collect()
    }

    /// The pod's `/status` entry.
    pub fn status(&self) -> TimersStatus {
        let t = &self.timers;
        let h = |d: Duration| Span::from(d).to_string();
        TimersStatus {
            source: self.source,
            deregistration_delay: h(t.deregistration_delay),
            min_drain_time: h(t.min_drain_time),
            drain_time: h(t.drain_time),
            parent_shutdown_time: h(t.parent_shutdown_time),
            poll_interval: h(t.poll_interval),
            termination_grace_period: self.grace.map(h),
            invalid: self.problems.clone(),
        }
    }
}

/// A pod's drain timers in `GET /status`, durations as the flags take them.
#[derive(Clone, Debug, Serialize)]
pub struct TimersStatus {
    /// The pod's own (node metadata) or the agent's.
    pub source: TimerSource,
    pub deregistration_delay: String,
    pub min_drain_time: String,
    pub drain_time: String,
    pub parent_shutdown_time: String,
    pub poll_interval: String,
    pub termination_grace_period: Option<String>,
    /// Why the pod's own were refused: every violation.
    pub invalid: Vec<Problem>,
}

/// A pod's drain: its driver starts at the first trigger, with the pod's
/// timers as known then. Cheap to clone; every clone is the same drain.
#[derive(Clone)]
pub struct PodDrain(Arc<Inner>);

struct Inner {
    /// Until the driver starts: its settings (the timers change as the pod's
    /// metadata is read); afterwards what it started with.
    pending: Mutex<Pending>,
    /// The driver's handle once started; waited on for the report.
    started: watch::Sender<Option<DrainHandle>>,
}

struct Pending {
    /// Envoy, the guard and the timers; `settings.timers` is `timers.timers`.
    settings: DrainSettings,
    /// The pod's timers and where they come from.
    timers: PodTimers,
    /// Where the driver writes.
    metrics: Metrics,
    /// The driver task once started, aborted when the pod goes.
    driver: Option<tokio::task::AbortHandle>,
}

// === impl PodDrain ===

impl PodDrain {
    /// A drain of the pod's Envoy through `settings.admin`, not started.
    pub fn new(settings: DrainSettings, timers: PodTimers, metrics: Metrics) -> Self {
        let settings = DrainSettings {
            timers: timers.timers,
            ..settings
        };
        metrics.set_drain_timers(&timers.timers, timers.grace);
        Self(Arc::new(Inner {
            pending: Mutex::new(Pending {
                settings,
                timers,
                metrics,
                driver: None,
            }),
            started: watch::channel(None).0,
        }))
    }

    /// The driver, started now if it was not: triggers go to this handle.
    pub fn start(&self) -> DrainHandle {
        let mut p = self.0.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(handle) = self.0.started.borrow().clone() {
            return handle;
        }
        let (handle, task) = drain::spawn(p.settings.clone(), p.metrics.clone());
        p.driver = Some(task.abort_handle());
        self.0.started.send_replace(Some(handle.clone()));
        handle
    }

    /// Sets the timers of a drain not started yet. False when it has
    /// started (it keeps its own) or nothing changed.
    pub fn set_timers(&self, timers: PodTimers) -> bool {
        let mut p = self.0.pending.lock().unwrap_or_else(|e| e.into_inner());
        if self.0.started.borrow().is_some() || p.timers == timers {
            return false;
        }
        p.settings.timers = timers.timers;
        p.metrics.set_drain_timers(&timers.timers, timers.grace);
        p.timers = timers;
        true
    }

    /// What the drain runs (or will run) with.
    pub fn timers(&self) -> PodTimers {
        self.0
            .pending
            .lock()
            .map(|p| p.timers.clone())
            .unwrap_or_else(|e| e.into_inner().timers.clone())
    }

    /// The handle of a started drain.
    pub fn running(&self) -> Option<DrainHandle> {
        self.0.started.borrow().clone()
    }

    pub fn status(&self) -> Status {
        match self.running() {
            Some(h) => h.status(),
            None => Status::serving(),
        }
    }

    /// Waits for a drain to start and end. None only if the driver is gone.
    pub async fn report(&self) -> Option<Report> {
        let mut rx = self.0.started.subscribe();
        let handle = rx.wait_for(Option::is_some).await.ok()?.clone()?;
        handle.report().await
    }

    /// Stops the driver (the pod is gone).
    pub fn abort(&self) {
        if let Ok(p) = self.0.pending.lock() {
            if let Some(d) = &p.driver {
                d.abort();
            }
        }
    }
}

impl std::fmt::Debug for PodDrain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodDrain")
            .field("started", &self.running().is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn meta(pairs: &[(&str, Value)]) -> Map<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    fn text(v: &str) -> Value {
        Value::String(v.into())
    }

    #[test]
    fn no_key_is_the_agents_budget() {
        let budget = Budget::default();
        let other = meta(&[("DRAINSHIM_GUARD", text("127.0.0.1:1=127.0.0.1:2"))]);
        for m in [
            Map::new(),
            other,
            meta(&[("DRAINSHIM_DRAIN_TIME", text(" "))]),
        ] {
            assert_eq!(
                PodTimers::from_metadata(&m, &budget),
                PodTimers::agent(&budget)
            );
        }
    }

    #[test]
    fn the_pods_keys_override_the_agents_values_one_by_one() {
        let budget = Budget {
            termination_grace_period: Some(s(120)),
            ..Budget::default()
        };
        let m = meta(&[
            ("DRAINSHIM_DRAIN_TIME", text("20s")),
            ("DRAINSHIM_PARENT_SHUTDOWN_TIME", text("30s")),
            ("DRAINSHIM_POLL_INTERVAL", text(" 250ms ")),
            ("DRAINSHIM_TERMINATION_GRACE_PERIOD", text("45s")),
        ]);
        let p = PodTimers::from_metadata(&m, &budget);
        assert_eq!(p.problems, vec![]);
        assert_eq!(p.source, TimerSource::Pod);
        assert_eq!(
            p.timers,
            Timers {
                drain_time: s(20),
                parent_shutdown_time: s(30),
                poll_interval: Duration::from_millis(250),
                // Not set by the pod: the agent's.
                ..budget.timers
            }
        );
        assert_eq!(p.grace, Some(s(45)));
        let st = p.status();
        assert_eq!(
            (
                st.drain_time.as_str(),
                st.termination_grace_period.as_deref()
            ),
            ("20s", Some("45s"))
        );
    }

    #[test]
    fn every_violation_is_named_and_the_agents_timers_are_kept() {
        let budget = Budget {
            termination_grace_period: Some(s(120)),
            ..Budget::default()
        };
        let m = meta(&[
            ("DRAINSHIM_MIN_DRAIN_TIME", text("20s")),
            ("DRAINSHIM_DRAIN_TIME", text("10s")),
            ("DRAINSHIM_PARENT_SHUTDOWN_TIME", text("10s")),
            ("DRAINSHIM_POLL_INTERVAL", text("often")),
            ("DRAINSHIM_DEREGISTRATION_DELAY", Value::from(5)),
            ("DRAINSHIM_TERMINATION_GRACE_PERIOD", text("101y")),
        ]);
        let p = PodTimers::from_metadata(&m, &budget);
        assert_eq!(p.source, TimerSource::Agent);
        assert_eq!(p.timers, budget.timers);
        assert_eq!(p.grace, Some(s(120)));
        let reasons: Vec<&str> = p.problems.iter().map(|p| p.reason).collect();
        assert_eq!(
            reasons,
            vec![
                "unparsable_deregistration_delay",
                "unparsable_poll_interval",
                "unparsable_termination_grace_period",
                "min_drain_time_above_drain_time",
                "drain_time_not_below_parent_shutdown_time",
            ],
            "{p:?}"
        );
        let all: Vec<&str> = p.problems.iter().map(|p| p.message.as_str()).collect();
        assert_eq!(
            all[1],
            "DRAINSHIM_POLL_INTERVAL (\"often\") is not a duration such as \"30s\": expected number at 0",
        );
        assert!(all[0].contains("DRAINSHIM_DEREGISTRATION_DELAY (5) must be a string"));
        assert!(all[2].contains("at most 100years"), "{}", all[2]);
        assert_eq!(
            all[3],
            "DRAINSHIM_MIN_DRAIN_TIME (20s) must not exceed DRAINSHIM_DRAIN_TIME (10s)"
        );
        assert!(all[4].starts_with(
            "DRAINSHIM_DRAIN_TIME (10s) must be less than DRAINSHIM_PARENT_SHUTDOWN_TIME (10s)"
        ));
        assert!(p
            .problems
            .iter()
            .all(|x| super::reasons().any(|r| r == x.reason)));
    }

    /// The rules are the sidecar's, the grace period included; a value the
    /// pod did not set is named as the agent's flag.
    #[test]
    fn the_budget_is_the_sidecars_rule_with_the_agents_values_named() {
        let budget = Budget {
            termination_grace_period: Some(s(120)),
            ..Budget::default()
        };
        let p = PodTimers::from_metadata(
            &meta(&[("DRAINSHIM_PARENT_SHUTDOWN_TIME", text("2m"))]),
            &budget,
        );
        assert_eq!(p.source, TimerSource::Agent);
        assert_eq!(
            p.problems,
            vec![Problem {
                reason: "grace_not_above_parent_shutdown_time",
                message: "the agent's --termination-grace-period (120s) must exceed \
                          DRAINSHIM_PARENT_SHUTDOWN_TIME (120s): otherwise the kubelet \
                          sends SIGKILL before the drain deadline"
                    .into(),
            }]
        );
        // The pod's own grace period makes room for its own deadline.
        let p = PodTimers::from_metadata(
            &meta(&[
                ("DRAINSHIM_PARENT_SHUTDOWN_TIME", text("2m")),
                ("DRAINSHIM_TERMINATION_GRACE_PERIOD", text("150s")),
            ]),
            &budget,
        );
        assert_eq!((p.source, p.problems.len()), (TimerSource::Pod, 0), "{p:?}");
        let p = PodTimers::from_metadata(&meta(&[("DRAINSHIM_DRAIN_TIME", text("95s"))]), &budget);
        assert_eq!(
            p.problems[0].message,
            "DRAINSHIM_DRAIN_TIME (95s) must be less than the agent's --parent-shutdown-time \
             (90s): the deadline must leave room for the drain"
        );
    }

    fn drain_of(timers: PodTimers) -> PodDrain {
        let admin = crate::envoy::AdminClient::new("http://127.0.0.1:9", Duration::from_secs(1))
            .expect("admin url");
        let settings = DrainSettings {
            timers: Timers::default(),
            admin,
            guard: None,
        };
        PodDrain::new(settings, timers, Metrics::new())
    }

    #[tokio::test(start_paused = true)]
    async fn timers_change_until_the_drain_starts_and_stay_after() {
        let budget = Budget::default();
        let d = drain_of(PodTimers::agent(&budget));
        assert_eq!(d.status().phase, drain::Phase::Serving);
        assert!(d.running().is_none());
        let own =
            PodTimers::from_metadata(&meta(&[("DRAINSHIM_DRAIN_TIME", text("20s"))]), &budget);
        assert!(d.set_timers(own.clone()));
        assert!(!d.set_timers(own.clone()), "nothing changed");
        let h = d.start();
        h.trigger(drain::Trigger::Api).await;
        assert!(d.running().is_some());
        assert_ne!(d.status().phase, drain::Phase::Serving);
        assert!(!d.set_timers(PodTimers::agent(&budget)));
        assert_eq!(d.timers(), own);
        // The second start joins the first driver.
        let again = d.start();
        assert_ne!(again.status().phase, drain::Phase::Serving);
        d.abort();
    }
}
