//! The judgement: per (namespace, service), what its calls and streams
//! need against what its pods run now; per namespace, the pods that run
//! without a call in the window.

use std::collections::{BTreeMap, BTreeSet};

use super::read::{Observed, PodKey, PodSeen};
use super::{
    flag, highest, quantile, Buckets, Current, Le, Recommended, ServiceTimers, TimerFit,
    TimerRules, CALLS_LARGEST,
};

type Pod<'a> = (&'a PodKey, &'a PodSeen);

/// The service of a row for pods whose window holds streams and no call:
/// the stream lifetimes carry no service label.
pub const STREAMS_ONLY: &str = "(streams only)";

/// A pod by its own name, or its scrape target when its series carry none.
fn name((k, _): &Pod) -> String {
    match k.2.is_empty() {
        true => k.1.clone(),
        false => k.2.clone(),
    }
}

/// Pods named, the first few, then how many more.
fn names(pods: &[Pod]) -> String {
    const SHOWN: usize = 5;
    let mut out: Vec<String> = pods.iter().take(SHOWN).map(name).collect();
    if pods.len() > SHOWN {
        out.push(format!("and {} more", pods.len() - SHOWN));
    }
    out.join(", ")
}

/// It runs now: scraped at the window's end.
fn live(p: &PodSeen) -> bool {
    p.live || p.timers.is_some()
}

/// Judges every service the window saw, and every namespace's pods that
/// run now without a call in it. `namespaces`: the tiers' namespaces
/// (sorted).
pub fn judge(obs: &Observed, rules: &TimerRules, namespaces: &[String]) -> Vec<ServiceTimers> {
    let in_scope = |ns: &str| namespaces.binary_search_by(|n| n.as_str().cmp(ns)).is_ok();
    // The pods of each (namespace, service): those with its calls in the
    // window; a pod's namespace is its own key's, never another series'.
    let mut services: BTreeMap<(&str, &str), Vec<Pod>> = BTreeMap::new();
    let mut idle: BTreeMap<&str, Vec<Pod>> = BTreeMap::new();
    for pod @ (k, p) in obs.pods.iter().filter(|(k, _)| in_scope(&k.0)) {
        if p.calls.is_empty() && p.streams > 0 {
            // Streams with no call: streams that waited for their first
            // event have no latency, and the lifetimes carry no service.
            services.entry((&k.0, STREAMS_ONLY)).or_default().push(pod);
            continue;
        }
        if p.calls.is_empty() {
            if live(p) {
                idle.entry(&k.0).or_default().push(pod);
            }
            continue;
        }
        for s in p.calls.keys() {
            services.entry((&k.0, s)).or_default().push(pod);
        }
    }
    let mut out: Vec<ServiceTimers> = services
        .iter()
        .map(|((ns, service), pods)| one(ns, service, pods, rules))
        .collect();
    for (ns, pods) in idle {
        let beside: Vec<&ServiceTimers> = out
            .iter()
            .filter(|s| s.namespace == ns && s.service != "-")
            .collect();
        let row = quiet(ns, &pods, &beside, rules);
        out.push(row);
    }
    out
}

/// A row without figures.
fn empty(ns: &str, service: &str, pods: usize) -> ServiceTimers {
    ServiceTimers {
        namespace: ns.to_string(),
        service: service.to_string(),
        pods,
        calls: super::Calls::default(),
        streams: 0,
        longest_stream: None,
        max_age: None,
        current: None,
        recommended: None,
        without_timers: Vec::new(),
        grace_unknown: Vec::new(),
        verdict: TimerFit::Ok,
        detail: String::new(),
        fix: None,
        needs: None,
    }
}

/// What the timers' family missing on pods that run now says.
fn no_timers(pods: &[Pod]) -> String {
    format!(
        "no timers exported by {} of its pods running now ({}): upgrade their shims, or \
         scrape drainshim_drain_timer_seconds",
        pods.len(),
        names(pods)
    )
}

/// A namespace's pods that run now and had no call in the window: one more
/// replica of a judged service, or a service of their own, which the
/// window cannot tell. Named, never counted as a pass, and the row fails
/// for those of them:
/// - without timers, as anywhere;
/// - whose calls cannot be seen: their guard's request metrics are off, or
///   their histogram's `_count` grew while no `_bucket` did (a scrape that
///   drops them);
/// - whose timers are below what a service of their namespace needs (with
///   their own deregistration delay; a known grace period above them; for a
///   service with streams, a parent shutdown at least the sweep's margin
///   after the drain): if they serve it, a restart cuts its calls.
///
/// Requests their Envoy counted that the guard recorded none of are said,
/// not failed: streams still open (recorded at their end), Envoy's own
/// answers and other ports count there too.
fn quiet(ns: &str, pods: &[Pod], beside: &[&ServiceTimers], rules: &TimerRules) -> ServiceTimers {
    let mut row = empty(ns, "-", pods.len());
    let (with, without): (Vec<Pod>, Vec<Pod>) = pods.iter().partition(|(_, p)| p.timers.is_some());
    let known: Vec<&Current> = with.iter().filter_map(|(_, p)| p.timers.as_ref()).collect();
    row.current = current(&known);
    row.max_age = pods
        .iter()
        .filter_map(|(_, p)| p.max_age)
        .fold(None, |m: Option<f64>, a| Some(m.map_or(a, |m| m.max(a))));
    let mut detail = vec![format!(
        "no traffic in the window: cannot recommend ({} {}{})",
        pods.len(),
        if pods.len() == 1 { "pod" } else { "pods" },
        if beside.is_empty() {
            format!(": {}", names(pods))
        } else {
            format!(" beside its judged services: {}", names(pods))
        }
    )];
    row.verdict = TimerFit::NoTraffic;
    let mut unknown = Vec::new();
    if !without.is_empty() {
        row.without_timers = without.iter().map(name).collect();
        unknown.push(no_timers(&without));
    }
    let those = |f: &dyn Fn(&PodSeen) -> bool| -> Vec<Pod> {
        pods.iter().copied().filter(|(_, p)| f(p)).collect()
    };
    let off = those(&|p| p.request_metrics == Some(false));
    if !off.is_empty() {
        unknown.push(format!(
            "the guard's request metrics are off on {} of its pods ({}): their calls cannot \
             be seen; turn --guard-request-metrics on",
            off.len(),
            names(&off)
        ));
    }
    let dropped = those(&|p| p.counted > 0.0);
    if !dropped.is_empty() {
        // No count is printed: the stores' increase() differ in how they
        // extrapolate, and only "some or none" is judged.
        unknown.push(format!(
            "{} of its pods ({}) have calls in drainshim_guard_request_duration_seconds_count \
             but no _bucket series: the scrape drops them, so their durations cannot be judged",
            dropped.len(),
            names(&dropped)
        ));
    }
    for svc in beside {
        let Some(needs) = svc.needs else { continue };
        let under: Vec<Pod> = with
            .iter()
            .copied()
            .filter(|(_, p)| {
                p.timers.as_ref().is_some_and(|t| {
                    let (drain, parent, grace) = recommend(t.deregistration_delay, needs, rules);
                    t.drain_time + 1e-9 < drain
                        || t.parent_shutdown_time + 1e-9 < parent
                        || t.termination_grace_period.is_none_or(|g| g <= grace)
                        || (svc.streams > 0 && tight(t))
                })
            })
            .collect();
        if !under.is_empty() {
            unknown.push(format!(
                "{} of its pods ({}) run drain timers below what {} needs with their own \
                 deregistration delay ({} of calls and streams after it, a parent shutdown \
                 {} later{}, a known grace above that plus the linger): if they serve it, a \
                 restart cuts its calls; raise their timers, or let the window see their calls",
                under.len(),
                names(&under),
                svc.service,
                flag(needs),
                flag(rules.margin.as_secs_f64()),
                if svc.streams > 0 {
                    format!(
                        " and at least {} after the drain",
                        flag(super::MIN_MARGIN.as_secs_f64())
                    )
                } else {
                    String::new()
                },
            ));
        }
    }
    let unseen = those(&|p| p.requests.is_some_and(|n| n > 0.0));
    if !unseen.is_empty() {
        detail.push(format!(
            "Envoy counted requests in the window that the guard recorded none of on {} of them \
             ({}): streams still open (a stream is recorded at its end), Envoy's own answers, \
             or a scrape that drops the guard's request histogram",
            unseen.len(),
            names(&unseen)
        ));
    }
    let blind = those(&|p| p.requests.is_none());
    if !blind.is_empty() {
        detail.push(format!(
            "whether {} took requests is not known (drainshim_envoy_downstream_requests_total \
             is not scraped for them)",
            names(&blind)
        ));
    }
    if !unknown.is_empty() {
        row.verdict = TimerFit::Unknown;
    }
    detail.extend(unknown);
    row.detail = detail.join("; ");
    row
}

/// The drain time, parent shutdown and grace floor a pod with `dereg` of
/// deregistration delay needs for `needs` seconds of calls and streams.
fn recommend(dereg: f64, needs: f64, rules: &TimerRules) -> (f64, f64, f64) {
    let drain = (dereg + needs).ceil();
    let parent = drain + rules.margin.as_secs_f64();
    (drain, parent, parent + rules.linger.as_secs_f64())
}

/// The parent shutdown is less than the sweep's margin after the drain
/// time: the guard's last endings may be cut.
fn tight(t: &Current) -> bool {
    t.parent_shutdown_time - t.drain_time + 1e-9 < super::MIN_MARGIN.as_secs_f64()
}

/// What pods whose parent shutdown is too close to their drain time say.
fn tight_margin(pods: &[Pod]) -> String {
    format!(
        "{} of its pods ({}) end their parent shutdown less than {} after their drain time: the \
         guard ends what is still open that long before the parent shutdown (an ending's bound \
         and its slack), so the parent shutdown may cut those endings",
        pods.len(),
        names(pods),
        flag(super::MIN_MARGIN.as_secs_f64())
    )
}

/// The smallest of each timer over `known` (the largest deregistration
/// delay: the one the drain waits out), the grace over those that know it.
fn current(known: &[&Current]) -> Option<Current> {
    let first = known.first()?;
    let min = |f: fn(&Current) -> f64| known.iter().map(|c| f(c)).fold(f64::INFINITY, f64::min);
    let grace = known
        .iter()
        .filter_map(|c| c.termination_grace_period)
        .fold(None, |m: Option<f64>, g| Some(m.map_or(g, |m| m.min(g))));
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

/// A service's calls over its pods: the p99 of their buckets summed over
/// the edges every pod has (a shim before the longer buckets stops at
/// 10 s), and the longest call as the largest of each pod's own: `Err` when
/// some pod's went past its largest bucket, then at least [`CALLS_LARGEST`]
/// (a call past a shorter histogram's end may have been as long).
type CallFigures = (Option<Result<f64, f64>>, Option<Result<f64, f64>>);
fn calls_of(each: &[&Buckets]) -> CallFigures {
    let mut common: Option<BTreeSet<Le>> = None;
    for b in each {
        let edges: BTreeSet<Le> = b.keys().copied().collect();
        common = Some(match common {
            None => edges,
            Some(c) => c.intersection(&edges).copied().collect(),
        });
    }
    let mut sum = Buckets::new();
    for le in common.unwrap_or_default() {
        sum.insert(le, each.iter().filter_map(|b| b.get(&le)).sum());
    }
    let p99 = quantile(0.99, &sum);
    let high = each
        .iter()
        .filter_map(|b| highest(b))
        .map(|h| h.map_err(|top| top.max(CALLS_LARGEST)))
        .reduce(|a, b| match (a, b) {
            (Err(x), Err(y)) => Err(x.max(y)),
            (Err(x), Ok(_)) | (Ok(_), Err(x)) => Err(x),
            (Ok(x), Ok(y)) => Ok(x.max(y)),
        });
    (p99, high)
}

fn one(ns: &str, service: &str, pods: &[Pod], rules: &TimerRules) -> ServiceTimers {
    let streams: u64 = pods.iter().map(|(_, p)| p.streams).sum();
    // The longest stream seen on any of its pods (None: past the largest
    // bucket), and the largest max age they run (0: none).
    let seen = pods
        .iter()
        .filter(|(_, p)| p.streams > 0)
        .map(|(_, p)| p.longest_stream)
        .try_fold(0.0, |m, l| l.map(|l| f64::max(m, l)));
    let max_age = pods
        .iter()
        .filter_map(|(_, p)| p.max_age)
        .fold(None, |m: Option<f64>, a| Some(m.map_or(a, |m| m.max(a))));
    let bounded_by_age = max_age
        .filter(|a| *a > 0.0 && pods.iter().all(|(_, p)| p.max_age.is_some_and(|a| a > 0.0)));
    let longest = match (streams, seen, bounded_by_age) {
        (0, _, _) => Some(0.0),
        (_, Some(s), Some(a)) => Some(s.min(a)),
        (_, Some(s), None) => Some(s),
        (_, None, a) => a,
    };
    let each: Vec<&Buckets> = pods
        .iter()
        .filter_map(|(_, p)| p.calls.get(service))
        .collect();
    let (p99, high) = calls_of(&each);
    // The pods it runs on now (one replaced in the window still counts for
    // its calls and streams), those that export their timers, and those
    // that do not.
    let now: Vec<Pod> = pods.iter().copied().filter(|(_, p)| live(p)).collect();
    let (with, without): (Vec<Pod>, Vec<Pod>) = now.iter().partition(|(_, p)| p.timers.is_some());
    let known: Vec<&Current> = with.iter().filter_map(|(_, p)| p.timers.as_ref()).collect();
    let grace_unknown: Vec<Pod> = with
        .iter()
        .copied()
        .filter(|(_, p)| {
            p.timers
                .as_ref()
                .is_some_and(|t| t.termination_grace_period.is_none())
        })
        .collect();
    let mut row = ServiceTimers {
        calls: super::Calls {
            p99: p99.and_then(|p| p.ok()),
            p99_over: p99.and_then(|p| p.err()),
            max: high.and_then(|h| h.ok()),
            over: high.and_then(|h| h.err()),
        },
        streams,
        longest_stream: longest,
        max_age,
        current: current(&known),
        without_timers: without.iter().map(name).collect(),
        grace_unknown: grace_unknown.iter().map(name).collect(),
        ..empty(ns, service, now.len())
    };
    if high.is_none() && streams == 0 {
        row.verdict = TimerFit::NoTraffic;
        row.detail = "no traffic in the window: cannot recommend".into();
        return row;
    }
    // A call past the largest bucket is at least that long.
    let calls_need = match high {
        Some(Ok(edge) | Err(edge)) => edge,
        None => 0.0,
    };
    let spread = rules.stream_spread.as_secs_f64();
    let streams_need = match longest {
        _ if streams == 0 => 0.0,
        Some(l) => l.min(spread),
        None => spread,
    };
    let window = calls_need.max(streams_need);
    row.needs = Some(window);
    if now.is_empty() {
        row.verdict = TimerFit::Gone;
        row.detail = format!(
            "none of its {} pods of the window runs now: nothing to judge",
            pods.len()
        );
        return row;
    }
    let mut unknown = Vec::new();
    if !without.is_empty() {
        unknown.push(no_timers(&without));
    }
    let Some(cur) = row.current.clone() else {
        row.verdict = TimerFit::Unknown;
        row.detail = unknown.join("; ");
        return row;
    };
    if !grace_unknown.is_empty() {
        unknown.push(format!(
            "termination grace period unknown on {} of its pods ({}), so whether the drain ends \
             before SIGKILL: give their shims --termination-grace-period",
            grace_unknown.len(),
            names(&grace_unknown)
        ));
    }
    let (drain, parent, grace) = recommend(cur.deregistration_delay, window, rules);
    let rec = Recommended {
        drain_time: drain,
        parent_shutdown_time: parent,
        termination_grace_period_above: grace,
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
    // The sweep's margin matters where the guard ends streams: their last
    // endings come at the drain time's end.
    let close: Vec<Pod> = with
        .iter()
        .copied()
        .filter(|(_, p)| streams > 0 && p.timers.as_ref().is_some_and(tight))
        .collect();
    if !close.is_empty() {
        short.push(tight_margin(&close));
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
    } else if let Some(Err(top)) = high {
        format!(
            "dereg {} + calls past the largest bucket, at least {}{}",
            flag(cur.deregistration_delay),
            flag(top),
            if row.calls.p99_over.is_some() {
                ", the p99 among them"
            } else {
                ""
            }
        )
    } else {
        format!(
            "dereg {} + calls {}",
            flag(cur.deregistration_delay),
            flag(calls_need)
        )
    };
    row.recommended = Some(rec.clone());
    if short.is_empty() && unknown.is_empty() {
        row.detail = format!("within the recommendation ({why})");
        return row;
    }
    if short.is_empty() {
        row.verdict = TimerFit::Unknown;
        row.detail = unknown.join("; ");
        return row;
    }
    row.verdict = TimerFit::Short;
    let mut detail = vec![format!("{} ({why})", short.join(", "))];
    detail.extend(unknown);
    let prestop = crate::config::DEFAULT_PRESTOP_TIMEOUT.get().as_secs_f64();
    if rec.parent_shutdown_time >= prestop {
        // The webhook and `inject` refuse such annotations (the pod would
        // be created without drainshim): no fix is printed.
        detail.push(format!(
            "the recommended parent shutdown is at or past the preStop hooks' {} timeout, \
             which the kubelet stops a drain at: no annotation can set it; the calls must end \
             sooner, or be ones the drain may cut",
            flag(prestop)
        ));
    } else {
        row.fix = Some(fix(ns, service, &cur, &rec));
    }
    row.detail = detail.join("; ");
    row
}

/// The pod template's annotations (the webhook and `inject` turn them into
/// the shim's timers, checked against the grace period, and Envoy's own
/// drain window: `--drain-time-s`, or under Istio the ProxyConfig's
/// `drainDuration`), and the grace period itself when it is too short.
fn fix(ns: &str, service: &str, cur: &Current, rec: &Recommended) -> String {
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
    format!(
        r#"kubectl -n {ns} patch deployment/<the workload of {service}> -p '{{"spec":{{"template":{{"metadata":{{"annotations":{{"drainshim.io/drain-time":"{}","drainshim.io/parent-shutdown-time":"{}"}}}}{grace}}}}}}}'"#,
        flag(rec.drain_time),
        flag(rec.parent_shutdown_time),
    )
}
