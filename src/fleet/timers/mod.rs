//! Drain timers from the fleet's own data: per service, what its calls and
//! streams need, against what its pods run.
//!
//! [`read`] asks Prometheus for a window's request durations, stream
//! lifetimes, max connection ages, the timers each pod exports
//! (`drainshim_drain_timer_seconds`) and which pods run now; [`judge`] is a
//! pure function of those and holds the formula (docs/design.md §5, "Drain
//! timers"):
//!
//! ```text
//! calls   = the largest unary duration seen (the histogram's bucket edge;
//!           past its largest bucket, at least that)
//! longest = the longest stream it may have: min(the longest seen, the max age in force)
//! window  = max(calls, min(longest, --stream-spread))   [streams only when it has some]
//! drain   = its pods' deregistration delay + window      (whole seconds, up)
//! parent  = drain + --timer-margin
//! grace   > parent + --linger                            (on every pod: unknown is said)
//! ```

mod judge;
mod read;
mod render;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

pub use judge::judge;
pub use read::{
    envoy_requests, observe, read, recount, visibility, Observed, PodKey, PodSeen, TimersRead,
};
pub use render::{render, short_detail};

/// What the recommendation is built with: the flags of `plan`.
#[derive(Clone, Debug, PartialEq)]
pub struct TimerRules {
    /// The window the fleet's figures are read over; `None`: the lifetime
    /// soak (what step 2 just watched).
    pub window: Option<Duration>,
    /// Parent shutdown above the drain time by this much.
    pub margin: Duration,
    /// The most of the drain window the long streams' endings are spread
    /// over: what the guard's max-age spread does for one connection.
    pub stream_spread: Duration,
    /// The sidecar's linger after its report, which the grace must cover.
    pub linger: Duration,
}

impl Default for TimerRules {
    fn default() -> Self {
        Self {
            window: None,
            margin: Duration::from_secs(10),
            stream_spread: Duration::from_secs(30),
            linger: crate::config::DEFAULT_LINGER.get(),
        }
    }
}

/// The least `--timer-margin`: the guard's sweep ends what is still open
/// an ending's bound plus its slack before the parent shutdown.
pub const MIN_MARGIN: Duration =
    crate::guard::DEFAULT_END_TIMEOUT.saturating_add(crate::guard::SWEEP_MARGIN);

/// The timers a service's pods run: the smallest of each over its pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Current {
    pub deregistration_delay: f64,
    pub min_drain_time: f64,
    pub drain_time: f64,
    pub parent_shutdown_time: f64,
    /// The smallest over the pods that know theirs; absent when none does
    /// (the pods that do not are named: [`ServiceTimers::grace_unknown`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination_grace_period: Option<f64>,
}

/// The timers a service needs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recommended {
    pub drain_time: f64,
    pub parent_shutdown_time: f64,
    /// The grace period must be more than this (parent shutdown plus linger).
    pub termination_grace_period_above: f64,
}

/// A service's judgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimerFit {
    /// Every pod runs at least the recommendation.
    Ok,
    /// Some pod runs less: the step stops.
    Short,
    /// Pods with no request in the window: nothing to recommend from.
    NoTraffic,
    /// Some pod that runs now exports no drain timers (a shim older than
    /// the gauge, or a scrape that drops its family), or no grace period:
    /// not judged on a guess, the step stops.
    Unknown,
    /// Calls in the window, but none of its pods runs now (scaled to zero,
    /// or replaced by pods that took no call yet): nothing to judge.
    Gone,
}

/// One row of the table: a service (or a namespace's pods without a call
/// in the window).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServiceTimers {
    pub namespace: String,
    /// `package.Service`, as the guard labels it; `-` for idle pods.
    pub service: String,
    /// Its pods that run now.
    pub pods: usize,
    /// Its calls' figures over the window.
    #[serde(flatten)]
    pub calls: Calls,
    /// Streams its pods ended in the window.
    pub streams: u64,
    /// The longest stream its pods may hold: seconds, or absent when
    /// nothing bounds it (no max age, streams past the largest bucket).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub longest_stream: Option<f64>,
    /// The largest max connection age its pods run (0: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_age: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<Current>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recommended: Option<Recommended>,
    /// Pods that run now and export no drain timers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub without_timers: Vec<String>,
    /// Pods whose timers come without their grace period.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub grace_unknown: Vec<String>,
    pub verdict: TimerFit,
    /// Why, in words.
    pub detail: String,
    /// The manifest change that sets the recommendation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// What its calls and streams need of a drain after the deregistration
    /// delay, seconds (the formula's `window`); also for a service none of
    /// whose pods runs now, so the pods beside it are compared with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub needs: Option<f64>,
}

/// A service's calls over the window, each figure a bucket edge or an
/// interpolation between two (the JSON keys are the row's `calls_*`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Calls {
    /// p99 of its calls, seconds; absent when it fell past the largest
    /// bucket (`over_p99`).
    #[serde(rename = "calls_p99", skip_serializing_if = "Option::is_none")]
    pub p99: Option<f64>,
    /// The p99 fell past the histogram's largest bucket: at least this.
    #[serde(rename = "calls_p99_over", skip_serializing_if = "Option::is_none")]
    pub p99_over: Option<f64>,
    /// Its longest call: the upper edge of the highest bucket with calls;
    /// absent when calls went past the largest bucket (`over`).
    #[serde(rename = "calls_max", skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// Calls went past the histogram's largest bucket: at least this long.
    #[serde(rename = "calls_over", skip_serializing_if = "Option::is_none")]
    pub over: Option<f64>,
}

/// Every service's judgement, and the window it was read over.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TimersReport {
    /// The window, seconds, ending at `at`.
    pub window_seconds: f64,
    /// Unix seconds.
    pub at: f64,
    pub services: Vec<ServiceTimers>,
}

impl TimersReport {
    /// The rows of these namespaces.
    pub fn of<'a>(&'a self, namespaces: &'a [String]) -> impl Iterator<Item = &'a ServiceTimers> {
        self.services
            .iter()
            .filter(move |s| namespaces.binary_search(&s.namespace).is_ok())
    }
}

/// The largest finite bucket edge of the request histogram
/// (`RPC_LATENCY_BUCKETS`): a call past it is at least this long, and a
/// drain below it is never passed for such calls.
pub const CALLS_LARGEST: f64 =
    crate::metrics::RPC_LATENCY_BUCKETS[crate::metrics::RPC_LATENCY_BUCKETS.len() - 1];

/// Cumulative buckets `(le, count)` summed, by edge.
pub type Buckets = BTreeMap<Le, f64>;

/// A bucket edge that orders (`+Inf` last).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Le(pub f64);
impl Eq for Le {}
impl Ord for Le {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}
impl PartialOrd for Le {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// The q-quantile of cumulative buckets as Prometheus'
/// `histogram_quantile` computes it (counts made monotonic; linear within
/// a bucket): `Ok(seconds)`, or `Err(the largest finite edge)` when it
/// falls in +Inf (at least that); `None` without observations.
pub fn quantile(q: f64, b: &Buckets) -> Option<Result<f64, f64>> {
    let total = *b.get(&Le(f64::INFINITY))?;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for (le, count) in b {
        let count = count.max(lower.1);
        if count >= rank {
            if le.0.is_infinite() {
                return Some(Err(lower.0));
            }
            let share = (rank - lower.1) / (count - lower.1).max(f64::MIN_POSITIVE);
            return Some(Ok(lower.0 + (le.0 - lower.0) * share.clamp(0.0, 1.0)));
        }
        lower = (le.0, count);
    }
    Some(Err(lower.0))
}

/// The upper edge of the highest bucket with observations (the smallest
/// edge that holds them all): `Ok(edge)`, `Err(largest finite edge)` when
/// some went past it, `None` without observations.
pub fn highest(b: &Buckets) -> Option<Result<f64, f64>> {
    let total = *b.get(&Le(f64::INFINITY))?;
    if total <= 0.0 {
        return None;
    }
    let largest = b
        .keys()
        .map(|l| l.0)
        .filter(|l| l.is_finite())
        .fold(0.0, f64::max);
    b.iter()
        .find(|(_, c)| **c >= total - 1e-9)
        .map(|(le, _)| match le.0.is_finite() {
            true => Ok(le.0),
            false => Err(largest),
        })
}

/// A pod's call buckets as the shim has them: the read leaves out buckets
/// that did not grow, which are the ones below its fastest call (the
/// buckets are cumulative); they are put back at 0 (the quantile's
/// interpolation starts from the edge below). Every shim's edges are
/// those of `RPC_LATENCY_BUCKETS` up to its own largest; one with only
/// +Inf left had every call past its largest, taken as the current one.
pub fn with_lower_edges(b: &mut Buckets) {
    let lowest = b
        .keys()
        .map(|l| l.0)
        .find(|l| l.is_finite())
        .unwrap_or(f64::INFINITY);
    for edge in crate::metrics::RPC_LATENCY_BUCKETS {
        if edge < lowest {
            b.entry(Le(edge)).or_insert(0.0);
        }
    }
}

/// Seconds as the flags write them ("1m30s", "500ms").
pub fn flag(secs: f64) -> String {
    // A foreign exporter's NaN or infinity (remote-written data, a recording
    // rule) is said, never a panic of from_secs_f64.
    match Duration::try_from_secs_f64(secs.max(0.0)) {
        Ok(d) => crate::config::Span::from(d).to_string(),
        Err(_) => format!("{secs}s"),
    }
}

#[cfg(test)]
mod tests;
