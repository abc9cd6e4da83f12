//! A pod's own drain timers, by annotation: what `plan`'s drain-timers step
//! recommends per workload. Validated as `drainshim sidecar --check`
//! validates the flags (the timeline's order, and the deadline plus the
//! shim's linger inside the pod's grace period), every bad value named in
//! one refusal; valid ones become the shim's environment
//! (`DRAINSHIM_DRAIN_TIME`, ...) and, for plain Envoy, its own drain window
//! (`--drain-time-s`).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, EnvVar};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{patch, refuse, PodRefusal};
use crate::config::{Span, Timer, Timers, DEFAULT_LINGER};

/// The annotations, each a timer of the sidecar.
pub const DEREGISTRATION_DELAY: &str = "drainshim.io/deregistration-delay";
pub const MIN_DRAIN_TIME: &str = "drainshim.io/min-drain-time";
pub const DRAIN_TIME: &str = "drainshim.io/drain-time";
pub const PARENT_SHUTDOWN_TIME: &str = "drainshim.io/parent-shutdown-time";

const ANNOTATIONS: [(&str, Timer); 4] = [
    (DEREGISTRATION_DELAY, Timer::DeregistrationDelay),
    (MIN_DRAIN_TIME, Timer::MinDrainTime),
    (DRAIN_TIME, Timer::DrainTime),
    (PARENT_SHUTDOWN_TIME, Timer::ParentShutdownTime),
];

/// Envoy's flag for its own drain window, which equals the shim's drain
/// time in the plain modes' patch.
const ENVOY_DRAIN_FLAG: &str = "--drain-time-s";

/// The timers a pod's annotations set, validated.
#[derive(Debug, Default)]
pub struct AnnotatedTimers {
    /// Each annotated timer and its value, in the annotations' order.
    set: Vec<(Timer, Duration)>,
    /// The drain time the timers run with (the annotation's or the default).
    drain_time: Option<Duration>,
}

impl AnnotatedTimers {
    /// Reads the annotations and checks the whole budget against `grace`
    /// (the pod's terminationGracePeriodSeconds as injected): every bad
    /// value and every broken rule in one refusal.
    pub fn read(meta: &ObjectMeta, grace: i64) -> Result<Self, PodRefusal> {
        let mut bad = Vec::new();
        let mut timers = Timers::default();
        let mut set = Vec::new();
        for (key, timer) in ANNOTATIONS {
            let Some(v) = meta.annotations.as_ref().and_then(|a| a.get(key)) else {
                continue;
            };
            match v.trim().parse::<Span>() {
                Ok(d) => {
                    let d = d.get();
                    match timer {
                        Timer::DeregistrationDelay => timers.deregistration_delay = d,
                        Timer::MinDrainTime => timers.min_drain_time = d,
                        Timer::DrainTime => timers.drain_time = d,
                        _ => timers.parent_shutdown_time = d,
                    }
                    set.push((timer, d));
                }
                Err(e) => bad.push(format!(
                    "{key}: {v:?} is not a duration such as \"30s\" or \"1m30s\": {e}"
                )),
            }
        }
        if set.is_empty() && bad.is_empty() {
            return Ok(Self::default());
        }
        let name = |t: Timer| {
            ANNOTATIONS
                .iter()
                .find(|(_, a)| *a == t)
                .filter(|(_, a)| set.iter().any(|(s, _)| s == a))
                .map_or_else(
                    || match t {
                        Timer::TerminationGracePeriod => "terminationGracePeriodSeconds".into(),
                        t => format!("the default {}", t.flag()),
                    },
                    |(k, _)| k.to_string(),
                )
        };
        let grace = Duration::from_secs(grace.max(0) as u64);
        if bad.is_empty() {
            bad.extend(
                timers
                    .violations(Some(grace), name)
                    .into_iter()
                    .map(|v| v.message),
            );
            // As `--check`: the deadline and the shim's linger after it end
            // before the kubelet's SIGKILL.
            let end = timers
                .parent_shutdown_time
                .saturating_add(DEFAULT_LINGER.get());
            // The preStop hooks (the app's, the proxy's) give up after
            // their own timeout, the default: past it the container is
            // stopped mid-drain whatever the grace period says.
            let prestop = crate::config::DEFAULT_PRESTOP_TIMEOUT.get();
            if timers.parent_shutdown_time >= prestop {
                bad.push(format!(
                    "{} ({}) must stay below the preStop hooks' timeout ({prestop}), past which the \
                     kubelet stops the containers mid-drain",
                    name(Timer::ParentShutdownTime),
                    Span::from(timers.parent_shutdown_time),
                    prestop = crate::config::DEFAULT_PRESTOP_TIMEOUT,
                ));
            }
            if timers.parent_shutdown_time < grace && end >= grace {
                bad.push(format!(
                    "{} ({}) plus the shim's linger ({}) must stay below terminationGracePeriodSeconds ({}s): raise it",
                    name(Timer::ParentShutdownTime),
                    Span::from(timers.parent_shutdown_time),
                    DEFAULT_LINGER,
                    grace.as_secs()
                ));
            }
        }
        if !bad.is_empty() {
            return refuse(format!("its drain-timer annotations: {}", bad.join("; ")));
        }
        Ok(Self {
            set,
            drain_time: Some(timers.drain_time),
        })
    }

    /// The drain time the annotations set, if they set any timer: Envoy's
    /// own drain window follows it (`--drain-time-s`, or under Istio the
    /// ProxyConfig's `drainDuration`).
    pub fn drain_time(&self) -> Option<Duration> {
        self.drain_time
    }

    /// Sets the annotated timers on the shim (its environment) and Envoy's
    /// own drain window to the drain time.
    pub fn apply(&self, c: &mut Container) {
        if c.name == patch::DRAINSHIM {
            let env = c.env.get_or_insert_with(Vec::new);
            for (timer, d) in &self.set {
                env.retain(|e| e.name != timer.env());
                env.push(EnvVar {
                    name: timer.env().to_string(),
                    value: Some(Span::from(*d).to_string()),
                    value_from: None,
                });
            }
        }
        if let (Some(drain), true) = (self.drain_time, c.name == patch::ENVOY) {
            let mut args = c.args.iter_mut().flatten();
            while let Some(a) = args.next() {
                if a == ENVOY_DRAIN_FLAG {
                    if let Some(v) = args.next() {
                        *v = envoy_drain_secs(drain).to_string();
                    }
                }
            }
        }
    }
}

/// Envoy's drain window for a drain time: whole seconds, rounded up (never
/// shorter than the shim's drain), at least one.
pub(super) fn envoy_drain_secs(drain: Duration) -> u128 {
    drain.as_millis().div_ceil(1000).max(1)
}
