//! What Prometheus is asked for the drain timers: four instant queries at
//! the window's end, each per pod (`instance`, and `pod` in node mode),
//! joined to the pod's namespace as `verify` joins a wave's series.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, UNIX_EPOCH};

use super::{Buckets, Current, Le};
use crate::fleet::golden::Queries;
use crate::fleet::prometheus::{PromClient, Sample};
use crate::fleet::FleetError;

/// A pod: its scrape target, and its own name where the series carry one
/// (node mode; a sidecar's guard series carry none).
pub type PodKey = (String, String);

/// One pod as the window saw it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodSeen {
    pub namespace: String,
    /// The services it answered calls of in the window.
    pub services: BTreeSet<String>,
    /// Streams it ended in the window.
    pub streams: u64,
    /// Its longest stream: the bucket edge; `None` past the largest.
    pub longest_stream: Option<f64>,
    /// Its max connection age now (0: none); `None` without a guard gauge.
    pub max_age: Option<f64>,
    /// The timers it runs now; `None` when it exports none.
    pub timers: Option<Current>,
}

/// What the window holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// (namespace, service) -> its calls' buckets over the window, summed
    /// over its pods.
    pub calls: BTreeMap<(String, String), Buckets>,
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
    (s.label("instance").to_string(), s.label("pod").to_string())
}

/// A histogram's bucket growth over the window per pod (and `by`),
/// joined to its namespace.
fn growth(q: &Queries, metric: &str, by: &str) -> String {
    let w = q.w();
    let each = q.in_wave(
        |sel| {
            let r = format!("{metric}_bucket{{{sel}}}[{w}]");
            format!("(max_over_time({r}) - min_over_time({r}))")
        },
        "",
    );
    format!("sum by (instance, pod, namespace, le{by}) ({each})")
}

/// Reads the window `[at - window, at]`. Fails with [`FleetError::Empty`]
/// when no pod exports anything the step reads.
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
    let calls_q = growth(&q, "drainshim_guard_request_duration_seconds", ", service");
    let streams_q = growth(&q, "drainshim_guard_stream_lifetime_seconds", "");
    let age_q = format!(
        "max by (instance, pod, namespace) ({})",
        now.in_fleet(|sel| format!("drainshim_guard_max_connection_age_seconds{{{sel}}}"))
    );
    let timers_q = format!(
        "max by (instance, pod, namespace, timer) ({})",
        now.in_fleet(|sel| format!("drainshim_drain_timer_seconds{{{sel}}}"))
    );
    let prom = prom
        .clone()
        .at(Some(UNIX_EPOCH + Duration::from_secs_f64(at)));
    let (calls, streams, ages, timers) = tokio::join!(
        prom.query(&calls_q),
        prom.query(&streams_q),
        prom.query(&age_q),
        prom.query(&timers_q),
    );
    let observed = observe(&calls?, &streams?, &ages?, &timers?);
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
) -> Observed {
    let mut obs = Observed::default();
    // Per pod and service: its buckets, to tell which services it served.
    let mut served: BTreeMap<(PodKey, String), Buckets> = BTreeMap::new();
    for s in calls {
        let Some(le) = le(s) else { continue };
        let ns = s.label("namespace").to_string();
        let svc = s.label("service").to_string();
        let b = obs.calls.entry((ns.clone(), svc.clone())).or_default();
        *b.entry(le).or_default() += s.value.max(0.0);
        *served
            .entry((key(s), svc))
            .or_default()
            .entry(le)
            .or_default() += s.value.max(0.0);
        obs.pods.entry(key(s)).or_default().namespace = ns;
    }
    for ((pod, svc), b) in &served {
        if b.get(&Le(f64::INFINITY)).is_some_and(|n| *n > 0.0) {
            if let Some(p) = obs.pods.get_mut(pod) {
                p.services.insert(svc.clone());
            }
        }
    }
    // Per pod: its streams' buckets.
    let mut lifetimes: BTreeMap<PodKey, Buckets> = BTreeMap::new();
    for s in streams {
        let Some(le) = le(s) else { continue };
        *lifetimes.entry(key(s)).or_default().entry(le).or_default() += s.value.max(0.0);
        let p = obs.pods.entry(key(s)).or_default();
        p.namespace = s.label("namespace").to_string();
    }
    for (pod, b) in &lifetimes {
        let p = obs.pods.entry(pod.clone()).or_default();
        p.streams = b.get(&Le(f64::INFINITY)).copied().unwrap_or(0.0).round() as u64;
        p.longest_stream = super::highest(b).and_then(|h| h.ok());
    }
    for s in ages {
        let p = obs.pods.entry(key(s)).or_default();
        p.namespace = s.label("namespace").to_string();
        p.max_age = Some(s.value);
    }
    for s in timers {
        let p = obs.pods.entry(key(s)).or_default();
        p.namespace = s.label("namespace").to_string();
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
