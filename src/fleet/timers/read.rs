//! What Prometheus is asked for the drain timers: instant queries at the
//! window's end, each per pod (its namespace, `instance`, and `pod` in node
//! mode), joined to the pod's namespace as `verify` joins a wave's series.
//!
//! Round one, at once: the growth of each request-duration and
//! stream-lifetime bucket over the window (the highest sample less the
//! lowest, which both stores answer alike), the pods whose histograms reset
//! in the window (a shim restarted in its pod), the max connection age, the
//! timers each pod runs, and which pods run now. Round two, only when some
//! pod's histograms reset: those pods' buckets again with the store's own
//! `increase()`, which counts both sides of a reset, where the highest less
//! the lowest would read the shim's whole earlier life.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, UNIX_EPOCH};

use super::{Buckets, Current, Le};
use crate::fleet::golden::Queries;
use crate::fleet::prometheus::{regex_alternation, PromClient, Sample};
use crate::fleet::FleetError;

/// A pod: its namespace, its scrape target, and its own name where the
/// series carry one (node mode; a sidecar's guard series carry none). The
/// namespace is part of it: a node agent holds pods of one name in two
/// namespaces (`web-0` of two StatefulSets), and an address reused in the
/// window by a pod of another namespace is another pod.
pub type PodKey = (String, String, String);

/// One pod as the window saw it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodSeen {
    /// Its calls in the window by service, each its buckets' growth (only
    /// services it answered a call of).
    pub calls: BTreeMap<String, Buckets>,
    /// Streams it ended in the window.
    pub streams: u64,
    /// Its longest stream: the bucket edge; `None` past the largest.
    pub longest_stream: Option<f64>,
    /// Its max connection age now (0: none); `None` without a guard gauge.
    pub max_age: Option<f64>,
    /// The timers it runs now; `None` when it exports none.
    pub timers: Option<Current>,
    /// Its shim is scraped at the window's end: it runs now, whatever it
    /// exports (an old shim, or a scrape that drops the timers' family).
    pub live: bool,
    /// Requests its Envoy's inbound listeners took in the window
    /// (`drainshim_envoy_downstream_requests_total`, which no guard setting
    /// turns off); `None` when that series is not scraped. Calls Envoy
    /// counted that the guard's histogram does not show are traffic the
    /// step cannot see (request metrics off, or `_bucket` series dropped).
    pub requests: Option<f64>,
    /// Its guard's `drainshim_guard_request_metrics` now: `Some(false)`
    /// when it records no request (its calls cannot be seen).
    pub request_metrics: Option<bool>,
    /// Calls its histogram's `_count` grew by in the window: more than
    /// `calls` shows when the scrape drops the `_bucket` series.
    pub counted: f64,
}

/// What the window holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub pods: BTreeMap<PodKey, PodSeen>,
}

/// What [`read`] returns: the observations and the window they cover.
#[derive(Clone, Debug)]
pub struct TimersRead {
    pub observed: Observed,
    pub window: Duration,
    /// The window's end, Unix seconds.
    pub at: f64,
}

fn le(s: &Sample) -> Option<Le> {
    match s.label("le") {
        "+Inf" => Some(Le(f64::INFINITY)),
        v => v.parse().ok().map(Le),
    }
}

fn key(s: &Sample) -> PodKey {
    (
        s.label("namespace").to_string(),
        s.label("instance").to_string(),
        s.label("pod").to_string(),
    )
}

/// The two histograms the step reads, each with the labels it is summed
/// by beside the pod's.
const CALLS: (&str, &str) = ("drainshim_guard_request_duration_seconds", ", service");
const STREAMS: (&str, &str) = ("drainshim_guard_stream_lifetime_seconds", "");

/// A histogram's buckets per pod (and `by`), each read by `read` over the
/// range `r`, joined to its namespace; a bucket that did not grow is left
/// out of the answer (most of a histogram, most of a fleet's idle pods).
/// `only`: more matchers (the pods of round two).
fn buckets(
    q: &Queries,
    (metric, by): (&str, &str),
    read: fn(&str) -> String,
    only: &str,
) -> String {
    let w = q.w();
    let each = q.in_wave(
        |sel| read(&format!("{metric}_bucket{{{sel}{only}}}[{w}]")),
        "",
    );
    format!("sum by (namespace, instance, pod, le{by}) ({each}) > 0")
}

fn highest_less_lowest(r: &str) -> String {
    format!("(max_over_time({r}) - min_over_time({r}))")
}

fn increase(r: &str) -> String {
    format!("increase({r})")
}

/// Reads the window `[at - window, at]`.
pub async fn read(prom: &PromClient, window: Duration, at: f64) -> Result<TimersRead, FleetError> {
    let q = Queries {
        ns: ".+",
        secs: window.as_secs().max(1),
        resets: false,
    };
    let now = Queries {
        ns: ".+",
        secs: 0,
        resets: false,
    };
    let w = q.w();
    let calls_q = buckets(&q, CALLS, highest_less_lowest, "");
    let streams_q = buckets(&q, STREAMS, highest_less_lowest, "");
    // A restart resets every series of the shim: its histograms' counts
    // tell (one series per service, not one per bucket).
    let resets_q = format!(
        "max by (namespace, instance, pod) ({}) > 0",
        q.in_wave(
            |sel| format!(
                "(resets({}_count{{{sel}}}[{w}]) or resets({}_count{{{sel}}}[{w}]))",
                CALLS.0, STREAMS.0
            ),
            ""
        )
    );
    let age_q = format!(
        "max by (namespace, instance, pod) ({})",
        now.in_fleet(|sel| format!("drainshim_guard_max_connection_age_seconds{{{sel}}}"))
    );
    let timers_q = format!(
        "max by (namespace, instance, pod, timer) ({})",
        now.in_fleet(|sel| format!("drainshim_drain_timer_seconds{{{sel}}}"))
    );
    // Every shim, of any version, sidecar or node agent's pod, exports
    // `drainshim_draining` (0 or 1) while it runs: present at the end, the
    // pod runs now.
    let live_q = format!(
        "max by (namespace, instance, pod) ({})",
        now.in_fleet(|sel| format!("drainshim_draining{{{sel}}}"))
    );
    // Envoy's own count of the requests it took, per pod: only "some or
    // none" is asked of it, so `increase()`, which counts across a reset
    // (the highest less the lowest would read a restarted shim's earlier
    // life as new).
    let requests_q = format!(
        "sum by (namespace, instance, pod) ({})",
        q.in_wave(
            |sel| increase(&format!(
                "drainshim_envoy_downstream_requests_total{{{sel}}}[{w}]"
            )),
            ""
        )
    );
    let metrics_on_q = format!(
        "max by (namespace, instance, pod) ({})",
        now.in_fleet(|sel| format!("drainshim_guard_request_metrics{{{sel}}}"))
    );
    // The calls the histogram's `_count` says, read as its `_bucket`s are
    // (so a series that first appears already holding its calls reads 0 in
    // both), which a scrape that drops `_bucket` still has.
    let counted_by = |read: fn(&str) -> String, only: &str| {
        format!(
            "sum by (namespace, instance, pod) ({}) > 0",
            q.in_wave(
                |sel| read(&format!("{}_count{{{sel}{only}}}[{w}]", CALLS.0)),
                ""
            )
        )
    };
    let counted_q = counted_by(highest_less_lowest, "");
    let prom = prom
        .clone()
        .at(Some(UNIX_EPOCH + Duration::from_secs_f64(at)));
    let (calls, streams, resets, ages, timers, live, requests, metrics_on, counted) = tokio::join!(
        prom.query(&calls_q),
        prom.query(&streams_q),
        prom.query(&resets_q),
        prom.query(&age_q),
        prom.query(&timers_q),
        prom.query(&live_q),
        prom.query(&requests_q),
        prom.query(&metrics_on_q),
        prom.query(&counted_q),
    );
    let mut observed = observe(&calls?, &streams?, &ages?, &timers?, &live?);
    envoy_requests(&mut observed, &requests?);
    visibility(&mut observed, &metrics_on?, &counted?);
    let reset: BTreeSet<PodKey> = resets?.iter().map(key).collect();
    if !reset.is_empty() {
        let instances: Vec<String> = reset
            .iter()
            .map(|(_, i, _)| i.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let only = format!(",instance=~\"{}\"", regex_alternation(&instances));
        let (calls_q, streams_q) = (
            buckets(&q, CALLS, increase, &only),
            buckets(&q, STREAMS, increase, &only),
        );
        let counted_q = counted_by(increase, &only);
        let (calls, streams, counted_again) = tokio::join!(
            prom.query(&calls_q),
            prom.query(&streams_q),
            prom.query(&counted_q)
        );
        recount(&mut observed, &reset, &calls?, &streams?);
        for k in &reset {
            if let Some(p) = observed.pods.get_mut(k) {
                p.counted = 0.0;
            }
        }
        visibility(&mut observed, &[], &counted_again?);
    }
    Ok(TimersRead {
        observed,
        window,
        at,
    })
}

/// The answers, pod by pod. Pure: the unit tests feed it samples.
pub fn observe(
    calls: &[Sample],
    streams: &[Sample],
    ages: &[Sample],
    timers: &[Sample],
    live: &[Sample],
) -> Observed {
    let mut obs = Observed::default();
    histograms(&mut obs, calls, streams);
    for s in ages {
        obs.pods.entry(key(s)).or_default().max_age = Some(s.value);
    }
    for s in live {
        obs.pods.entry(key(s)).or_default().live = true;
    }
    for s in timers {
        let p = obs.pods.entry(key(s)).or_default();
        // Exporting its timers now, it runs now.
        p.live = true;
        let t = p.timers.get_or_insert(Current {
            deregistration_delay: f64::NAN,
            min_drain_time: f64::NAN,
            drain_time: f64::NAN,
            parent_shutdown_time: f64::NAN,
            termination_grace_period: None,
        });
        match s.label("timer") {
            "deregistration_delay" => t.deregistration_delay = s.value,
            "min_drain_time" => t.min_drain_time = s.value,
            "drain_time" => t.drain_time = s.value,
            "parent_shutdown_time" => t.parent_shutdown_time = s.value,
            "termination_grace_period" => t.termination_grace_period = Some(s.value),
            _ => {}
        }
    }
    // A pod that exports only some of the timers is not judged on guesses.
    for p in obs.pods.values_mut() {
        if p.timers.as_ref().is_some_and(|t| {
            [
                t.deregistration_delay,
                t.min_drain_time,
                t.drain_time,
                t.parent_shutdown_time,
            ]
            .iter()
            .any(|v| v.is_nan())
        }) {
            p.timers = None;
        }
    }
    obs
}

/// Each pod's requests as its Envoy counted them over the window. Only
/// pods the other answers know are noted: a pod whose shim exports nothing
/// else in the window is not one the step judges.
pub fn envoy_requests(obs: &mut Observed, requests: &[Sample]) {
    for s in requests {
        if let Some(p) = obs.pods.get_mut(&key(s)) {
            p.requests = Some(s.value.max(0.0).round());
        }
    }
}

/// Whether each pod's calls can be seen: its guard's request metrics on
/// or off now, and how many calls its histogram's `_count` says (which a
/// scrape that drops `_bucket` still has). Only pods already known.
pub fn visibility(obs: &mut Observed, metrics_on: &[Sample], counted: &[Sample]) {
    for s in metrics_on {
        if let Some(p) = obs.pods.get_mut(&key(s)) {
            p.request_metrics = Some(s.value > 0.0);
        }
    }
    for s in counted {
        if let Some(p) = obs.pods.get_mut(&key(s)) {
            p.counted += s.value.max(0.0).round();
        }
    }
}

/// The pods of `reset` read again over the window with `increase()`: their
/// calls and streams replaced by these.
pub fn recount(obs: &mut Observed, reset: &BTreeSet<PodKey>, calls: &[Sample], streams: &[Sample]) {
    let mut again = Observed::default();
    histograms(&mut again, calls, streams);
    for k in reset {
        let p = obs.pods.entry(k.clone()).or_default();
        let new = again.pods.remove(k).unwrap_or_default();
        (p.calls, p.streams, p.longest_stream) = (new.calls, new.streams, new.longest_stream);
    }
}

/// The histograms' answers into each pod's calls and streams. A count is
/// whole: `increase()` extrapolates to the window's edges, which the
/// rounding takes back (a bucket's calls, not a share of one).
fn histograms(obs: &mut Observed, calls: &[Sample], streams: &[Sample]) {
    let count = |s: &Sample| s.value.max(0.0).round();
    for s in calls {
        let Some(le) = le(s) else { continue };
        let svc = s.label("service").to_string();
        let p = obs.pods.entry(key(s)).or_default();
        *p.calls.entry(svc).or_default().entry(le).or_default() += count(s);
    }
    // A service it answered no call of (every bucket back to 0 when
    // rounded) is not one it served.
    for p in obs.pods.values_mut() {
        p.calls
            .retain(|_, b| b.get(&Le(f64::INFINITY)).is_some_and(|n| *n > 0.0));
        p.calls.values_mut().for_each(super::with_lower_edges);
    }
    let mut lifetimes: BTreeMap<PodKey, Buckets> = BTreeMap::new();
    for s in streams {
        let Some(le) = le(s) else { continue };
        *lifetimes.entry(key(s)).or_default().entry(le).or_default() += count(s);
    }
    for (pod, b) in &lifetimes {
        let p = obs.pods.entry(pod.clone()).or_default();
        p.streams = b.get(&Le(f64::INFINITY)).copied().unwrap_or(0.0) as u64;
        p.longest_stream = super::highest(b).and_then(|h| h.ok());
    }
}
