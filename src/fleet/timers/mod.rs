//! Drain timers from the fleet's own data: per service, what its calls and
//! streams need, against what its pods run.
//!
//! [`read`] asks Prometheus for a window's request durations, stream
//! lifetimes, max connection ages and the timers each pod exports
//! (`drainshim_drain_timer_seconds`); [`judge`] is a pure function of those
//! and holds the formula (docs/design.md §5, "Drain timers"):
//!
//! ```text
//! calls   = the largest unary duration seen (the histogram's bucket edge)
//! longest = the longest stream it may have: min(the longest seen, the max age in force)
//! window  = max(calls, min(longest, --stream-spread))   [streams only when it has some]
//! drain   = its pods' deregistration delay + window      (whole seconds, up)
//! parent  = drain + --timer-margin
//! grace   > parent + --linger                            (when the grace is known)
//! ```

mod read;
mod render;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

pub use read::{read, Observed, PodSeen, TimersRead};
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

/// The timers a service's pods run: the smallest of each over its pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Current {
    pub deregistration_delay: f64,
    pub min_drain_time: f64,
    pub drain_time: f64,
    pub parent_shutdown_time: f64,
    /// Known on every pod, or absent.
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
pub enum Verdict {
    /// Every pod runs at least the recommendation.
    Ok,
    /// Some pod runs less: the step stops.
    Short,
    /// Pods with no request in the window: nothing to recommend from.
    NoTraffic,
    /// Its pods export no drain timers (shims older than the gauge).
    Unknown,
}

/// One row of the table: a service (or, without traffic, a namespace's
/// idle pods).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServiceTimers {
    pub namespace: String,
    /// `package.Service`, as the guard labels it; `-` for idle pods.
    pub service: String,
    pub pods: usize,
    /// p99 of its calls over the window, seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calls_p99: Option<f64>,
    /// Its longest call: the upper edge of the highest bucket with calls;
    /// absent when calls went past the largest bucket (`calls_over`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calls_max: Option<f64>,
    /// Calls went past the histogram's largest bucket: at least this long.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calls_over: Option<f64>,
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
    pub verdict: Verdict,
    /// Why, in words.
    pub detail: String,
    /// The manifest change that sets the recommendation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
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

/// The largest finite bucket edge of the request histogram.
const CALLS_LARGEST: f64 = 10.0;

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
/// `histogram_quantile` computes it (linear within a bucket; the largest
/// finite edge when it falls in +Inf); `None` without observations.
pub fn quantile(q: f64, b: &Buckets) -> Option<f64> {
    let total = *b.get(&Le(f64::INFINITY))?;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for (le, count) in b {
        if *count >= rank {
            if le.0.is_infinite() {
                return Some(lower.0);
            }
            let share = (rank - lower.1) / (count - lower.1).max(f64::MIN_POSITIVE);
            return Some(lower.0 + (le.0 - lower.0) * share.clamp(0.0, 1.0));
        }
        lower = (le.0, *count);
    }
    Some(lower.0)
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

/// Seconds as the flags write them ("1m30s", "500ms").
pub fn flag(secs: f64) -> String {
    // A foreign exporter's NaN or infinity (remote-written data, a recording
    // rule) is said, never a panic of from_secs_f64.
    match Duration::try_from_secs_f64(secs.max(0.0)) {
        Ok(d) => crate::config::Span::from(d).to_string(),
        Err(_) => format!("{secs}s"),
    }
}

/// Judges every service the window saw, and every namespace's pods that
/// had no request in it. `namespaces`: the tiers' namespaces (sorted).
pub fn judge(obs: &Observed, rules: &TimerRules, namespaces: &[String]) -> Vec<ServiceTimers> {
    let mut out = Vec::new();
    let in_scope = |ns: &str| namespaces.binary_search_by(|n| n.as_str().cmp(ns)).is_ok();
    // The pods of each service: those with its calls in the window.
    let mut services: BTreeMap<(String, String), Vec<&PodSeen>> = BTreeMap::new();
    let mut idle: BTreeMap<String, Vec<&PodSeen>> = BTreeMap::new();
    for p in obs.pods.values().filter(|p| in_scope(&p.namespace)) {
        if p.services.is_empty() {
            if p.timers.is_some() {
                idle.entry(p.namespace.clone()).or_default().push(p);
            }
            continue;
        }
        for s in &p.services {
            services
                .entry((p.namespace.clone(), s.clone()))
                .or_default()
                .push(p);
        }
    }
    for ((ns, service), pods) in &services {
        let calls = obs.calls.get(&(ns.clone(), service.clone()));
        out.push(one(ns, service, pods, calls, rules));
    }
    for (ns, pods) in idle {
        // An idle pod of a namespace whose services are judged is one more
        // replica of them, not an unjudged service.
        if services.keys().any(|(n, _)| *n == ns) {
            continue;
        }
        out.push(ServiceTimers {
            namespace: ns,
            service: "-".into(),
            pods: pods.len(),
            calls_p99: None,
            calls_max: None,
            calls_over: None,
            streams: 0,
            longest_stream: None,
            max_age: None,
            current: current(&pods),
            recommended: None,
            verdict: Verdict::NoTraffic,
            detail: "no traffic in the window: cannot recommend".into(),
            fix: None,
        });
    }
    out
}

/// The smallest of each timer over pods that export them.
fn current(pods: &[&PodSeen]) -> Option<Current> {
    let known: Vec<&Current> = pods.iter().filter_map(|p| p.timers.as_ref()).collect();
    let first = known.first()?;
    let min = |f: fn(&Current) -> f64| known.iter().map(|c| f(c)).fold(f64::INFINITY, f64::min);
    let grace = known
        .iter()
        .map(|c| c.termination_grace_period)
        .try_fold(f64::INFINITY, |m, g| g.map(|g| m.min(g)));
    Some(Current {
        deregistration_delay: known
            .iter()
            .map(|c| c.deregistration_delay)
            .fold(first.deregistration_delay, f64::max),
        min_drain_time: min(|c| c.min_drain_time),
        drain_time: min(|c| c.drain_time),
        parent_shutdown_time: min(|c| c.parent_shutdown_time),
        termination_grace_period: grace,
    })
}

fn one(
    ns: &str,
    service: &str,
    pods: &[&PodSeen],
    calls: Option<&Buckets>,
    rules: &TimerRules,
) -> ServiceTimers {
    let streams: u64 = pods.iter().map(|p| p.streams).sum();
    // The longest stream seen on any of its pods (None: past the largest
    // bucket), and the largest max age they run (0: none).
    let seen = pods
        .iter()
        .filter(|p| p.streams > 0)
        .map(|p| p.longest_stream)
        .try_fold(0.0, |m, l| l.map(|l| f64::max(m, l)));
    let max_age = pods
        .iter()
        .filter_map(|p| p.max_age)
        .fold(None, |m: Option<f64>, a| Some(m.map_or(a, |m| m.max(a))));
    let bounded_by_age =
        max_age.filter(|a| *a > 0.0 && pods.iter().all(|p| p.max_age.is_some_and(|a| a > 0.0)));
    let longest = match (streams, seen, bounded_by_age) {
        (0, _, _) => Some(0.0),
        (_, Some(s), Some(a)) => Some(s.min(a)),
        (_, Some(s), None) => Some(s),
        (_, None, a) => a,
    };
    let (p99, high) = match calls {
        Some(b) => (quantile(0.99, b), highest(b)),
        None => (None, None),
    };
    // The pods it runs on now: those that export their timers (a pod
    // replaced in the window still counts for its calls and streams).
    let live: Vec<&PodSeen> = pods
        .iter()
        .copied()
        .filter(|p| p.timers.is_some())
        .collect();
    let mut row = ServiceTimers {
        namespace: ns.to_string(),
        service: service.to_string(),
        pods: live.len(),
        calls_p99: p99,
        calls_max: high.and_then(|h| h.ok()),
        calls_over: high.and_then(|h| h.err()),
        streams,
        longest_stream: longest,
        max_age,
        current: current(&live),
        recommended: None,
        verdict: Verdict::Ok,
        detail: String::new(),
        fix: None,
    };
    let Some(high) = high else {
        row.verdict = Verdict::NoTraffic;
        row.detail = "no traffic in the window: cannot recommend".into();
        return row;
    };
    let Some(cur) = row.current.clone() else {
        row.verdict = Verdict::Unknown;
        row.detail = "no pod of it exports its drain timers now (drainshim_drain_timer_seconds): \
                      upgrade the shims to judge it"
            .into();
        return row;
    };
    // A call past the largest bucket is at least that long.
    let calls_need = match high {
        Ok(edge) | Err(edge) => edge.max(if high.is_err() { CALLS_LARGEST } else { 0.0 }),
    };
    let spread = rules.stream_spread.as_secs_f64();
    let streams_need = match longest {
        _ if streams == 0 => 0.0,
        Some(l) => l.min(spread),
        None => spread,
    };
    let window = calls_need.max(streams_need);
    let drain = (cur.deregistration_delay + window).ceil();
    let parent = drain + rules.margin.as_secs_f64();
    let rec = Recommended {
        drain_time: drain,
        parent_shutdown_time: parent,
        termination_grace_period_above: parent + rules.linger.as_secs_f64(),
    };
    let mut short = Vec::new();
    if cur.drain_time + 1e-9 < rec.drain_time {
        short.push(format!(
            "drain time {} < {}",
            flag(cur.drain_time),
            flag(rec.drain_time)
        ));
    }
    if cur.parent_shutdown_time + 1e-9 < rec.parent_shutdown_time {
        short.push(format!(
            "parent shutdown {} < {}",
            flag(cur.parent_shutdown_time),
            flag(rec.parent_shutdown_time)
        ));
    }
    if let Some(g) = cur.termination_grace_period {
        if g <= rec.termination_grace_period_above {
            short.push(format!(
                "grace period {} not above {} (parent shutdown plus linger)",
                flag(g),
                flag(rec.termination_grace_period_above)
            ));
        }
    }
    let why = if streams_need > calls_need {
        format!(
            "dereg {} + stream spread {}",
            flag(cur.deregistration_delay),
            flag(streams_need)
        )
    } else {
        format!(
            "dereg {} + calls {}{}",
            flag(cur.deregistration_delay),
            if row.calls_over.is_some() {
                "over "
            } else {
                ""
            },
            flag(calls_need)
        )
    };
    if short.is_empty() {
        row.detail = format!("within the recommendation ({why})");
    } else {
        row.verdict = Verdict::Short;
        row.detail = format!("{} ({why})", short.join(", "));
        // The pod template's annotations (the webhook and `inject` turn them
        // into the shim's timers, checked against the grace period), and
        // the grace period itself when it is too short.
        let grace = cur
            .termination_grace_period
            .filter(|g| *g <= rec.termination_grace_period_above)
            .map(|_| {
                format!(
                    r#","spec":{{"terminationGracePeriodSeconds":{}}}"#,
                    rec.termination_grace_period_above as u64 + 1
                )
            })
            .unwrap_or_default();
        row.fix = Some(format!(
            r#"kubectl -n {ns} patch deployment/<the workload of {service}> -p '{{"spec":{{"template":{{"metadata":{{"annotations":{{"drainshim.io/drain-time":"{}","drainshim.io/parent-shutdown-time":"{}"}}}}{grace}}}}}}}'"#,
            flag(rec.drain_time),
            flag(rec.parent_shutdown_time),
        ));
    }
    row.recommended = Some(rec);
    row
}

#[cfg(test)]
mod tests;
