use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::fleet::prometheus::Sample;
use crate::metrics::RPC_LATENCY_BUCKETS;

fn sample(labels: &[(&str, &str)], value: f64) -> Sample {
    Sample {
        labels: labels
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        value,
    }
}

/// A pod's call buckets as the read answers them (buckets that did not
/// grow left out): `n` calls, all at or under `edge` and over the one
/// below. `pod`: node mode's pod label ("" for a sidecar).
fn calls_of(instance: &str, pod: &str, ns: &str, svc: &str, n: f64, edge: &str) -> Vec<Sample> {
    let edges: Vec<String> = RPC_LATENCY_BUCKETS
        .iter()
        .map(|e| e.to_string())
        .chain(["+Inf".to_string()])
        .collect();
    let at = edges.iter().position(|e| e == edge).expect("an edge");
    edges[at..]
        .iter()
        .map(|le| {
            sample(
                &[
                    ("instance", instance),
                    ("pod", pod),
                    ("namespace", ns),
                    ("service", svc),
                    ("le", le),
                ],
                n,
            )
        })
        .collect()
}

fn calls(instance: &str, ns: &str, svc: &str, n: f64, edge: &str) -> Vec<Sample> {
    calls_of(instance, "", ns, svc, n, edge)
}

fn timers_of(instance: &str, pod: &str, ns: &str, t: [f64; 3]) -> Vec<Sample> {
    let [drain, parent, grace] = t;
    [
        ("deregistration_delay", 5.0),
        ("min_drain_time", 1.0),
        ("drain_time", drain),
        ("parent_shutdown_time", parent),
        ("termination_grace_period", grace),
    ]
    .iter()
    .filter(|(_, v)| !v.is_nan())
    .map(|(t, v)| {
        sample(
            &[
                ("instance", instance),
                ("pod", pod),
                ("namespace", ns),
                ("timer", t),
            ],
            *v,
        )
    })
    .collect()
}

/// A sidecar's timers with a 120 s grace period.
fn timers(instance: &str, ns: &str, drain: f64, parent: f64) -> Vec<Sample> {
    timers_of(instance, "", ns, [drain, parent, 120.0])
}

/// `drainshim_draining` of pods that run now.
fn live(pods: &[(&str, &str)]) -> Vec<Sample> {
    pods.iter()
        .map(|(instance, ns)| sample(&[("instance", instance), ("namespace", ns)], 0.0))
        .collect()
}

fn row<'a>(rows: &'a [ServiceTimers], ns: &str, svc: &str) -> &'a ServiceTimers {
    rows.iter()
        .find(|r| r.namespace == ns && r.service == svc)
        .unwrap_or_else(|| panic!("no {ns}/{svc} in {rows:#?}"))
}

fn ns(names: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

#[test]
fn quantiles_follow_prometheus() {
    let b: Buckets = [
        (Le(1.0), 50.0),
        (Le(5.0), 100.0),
        (Le(f64::INFINITY), 100.0),
    ]
    .into();
    assert_eq!(quantile(0.5, &b), Some(Ok(1.0)));
    assert!((quantile(0.99, &b).unwrap().unwrap() - 4.92).abs() < 1e-9);
    assert_eq!(highest(&b), Some(Ok(5.0)));
    let over: Buckets = [(Le(10.0), 90.0), (Le(f64::INFINITY), 100.0)].into();
    assert_eq!(highest(&over), Some(Err(10.0)));
    // Past the largest bucket: at least it, never a figure within.
    assert_eq!(quantile(0.99, &over), Some(Err(10.0)));
    assert_eq!(highest(&BTreeMap::new()), None);
    // A count below the one under it (an extrapolated increase, rounded)
    // is taken as that one, as histogram_quantile does.
    let bumpy: Buckets = [
        (Le(1.0), 5.0),
        (Le(5.0), 4.0),
        (Le(10.0), 10.0),
        (Le(f64::INFINITY), 10.0),
    ]
    .into();
    assert!((quantile(0.99, &bumpy).unwrap().unwrap() - 9.9).abs() < 1e-9);
}

#[test]
fn a_drain_shorter_than_the_calls_is_named_with_its_fix() {
    let mut c = calls("a:1", "shop", "shop.Slow", 10.0, "5");
    c.extend(calls("b:1", "shop", "shop.Fast", 10.0, "0.5"));
    let mut t = timers("a:1", "shop", 6.0, 9.0);
    t.extend(timers("b:1", "shop", 60.0, 90.0));
    let obs = observe(&c, &[], &[], &t, &[]);
    let rows = judge(&obs, &TimerRules::default(), &ns(&["shop"]));
    let slow = row(&rows, "shop", "shop.Slow");
    assert_eq!(slow.verdict, TimerFit::Short, "{slow:?}");
    // 5 s of deregistration plus the 5 s bucket, and the 10 s margin.
    let rec = slow.recommended.as_ref().unwrap();
    assert_eq!((rec.drain_time, rec.parent_shutdown_time), (10.0, 20.0));
    // The buckets below the fastest call, left out of the answer, are put
    // back: the p99 interpolates from the 2.5 s edge.
    assert!(
        slow.calls.p99.is_some_and(|p| p > 2.5 && p < 5.0),
        "{slow:?}"
    );
    assert!(
        slow.detail.contains("drain time 6s < 10s"),
        "{}",
        slow.detail
    );
    let fix = slow.fix.as_ref().unwrap();
    assert!(
        fix.contains(
            r#""drainshim.io/drain-time":"10s","drainshim.io/parent-shutdown-time":"20s""#
        ),
        "{fix}"
    );
    let fast = row(&rows, "shop", "shop.Fast");
    assert_eq!(fast.verdict, TimerFit::Ok, "{fast:?}");
}

#[test]
fn streams_need_their_spread_bounded_by_the_max_age() {
    let c = calls("a:1", "chat", "chat.Feed", 10.0, "0.5");
    let s: Vec<Sample> = [("300", 3.0), ("+Inf", 3.0)]
        .iter()
        .map(|(le, n)| {
            sample(
                &[("instance", "a:1"), ("namespace", "chat"), ("le", le)],
                *n,
            )
        })
        .collect();
    let age = [sample(&[("instance", "a:1"), ("namespace", "chat")], 120.0)];
    let obs = observe(&c, &s, &age, &timers("a:1", "chat", 20.0, 40.0), &[]);
    let rows = judge(&obs, &TimerRules::default(), &ns(&["chat"]));
    // Streams up to 300 s, the max age 120 s: spread the default 30 s.
    assert_eq!(rows[0].longest_stream, Some(120.0));
    assert_eq!(rows[0].recommended.as_ref().unwrap().drain_time, 35.0);
    assert_eq!(rows[0].verdict, TimerFit::Short);
}

#[test]
fn idle_pods_and_pods_without_timers_are_said_so() {
    let c = calls("a:1", "old", "old.Svc", 10.0, "0.5");
    let idle = timers("b:1", "quiet", 60.0, 90.0);
    let obs = observe(&c, &[], &[], &idle, &live(&[("a:1", "old")]));
    let rows = judge(&obs, &TimerRules::default(), &ns(&["old", "quiet"]));
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].verdict, TimerFit::Unknown);
    assert!(rows[0].detail.contains("no timers exported"), "{rows:?}");
    assert_eq!(rows[1].verdict, TimerFit::NoTraffic);
    assert!(rows[1].detail.contains("no traffic in the window"));
    let text = render(&TimersReport {
        window_seconds: 3600.0,
        at: 0.0,
        services: rows,
    });
    assert!(
        text.contains("quiet/-: no traffic in the window: cannot recommend (1 pod: b:1)"),
        "{text}"
    );
}

/// A pod that runs now and exports no timers (an old shim, or a scrape
/// that drops the family) fails its service's gate by name, beside pods
/// that run enough; one without a call in the window fails its namespace's
/// row, and pods without a call beside judged services are named.
#[test]
fn a_live_pod_without_timers_is_a_named_failure_never_a_silent_pass() {
    let mut c = calls("a:1", "shop", "shop.Cart", 10.0, "1");
    c.extend(calls("b:1", "shop", "shop.Cart", 10.0, "1"));
    let t = timers("a:1", "shop", 60.0, 90.0);
    // b:1 serves shop.Cart and runs; c:1 runs without a call; d:1 runs
    // without a call and with timers; e:1 took calls and is gone.
    c.extend(calls("e:1", "shop", "shop.Cart", 1.0, "1"));
    let mut t2 = t.clone();
    t2.extend(timers("d:1", "shop", 60.0, 90.0));
    let up = live(&[("a:1", "shop"), ("b:1", "shop"), ("c:1", "shop")]);
    let obs = observe(&c, &[], &[], &t2, &up);
    let rows = judge(&obs, &TimerRules::default(), &ns(&["shop"]));
    let cart = row(&rows, "shop", "shop.Cart");
    assert_eq!(cart.verdict, TimerFit::Unknown, "{cart:?}");
    assert_eq!(cart.pods, 2, "the two that run now: {cart:?}");
    assert_eq!(cart.without_timers, vec!["b:1".to_string()]);
    assert!(
        cart.detail
            .contains("no timers exported by 1 of its pods running now (b:1)"),
        "{}",
        cart.detail
    );
    let quiet = row(&rows, "shop", "-");
    assert_eq!(quiet.verdict, TimerFit::Unknown, "{quiet:?}");
    assert_eq!(quiet.pods, 2);
    assert_eq!(quiet.without_timers, vec!["c:1".to_string()]);
    assert!(
        quiet
            .detail
            .contains("2 pods beside its judged services: c:1, d:1"),
        "{}",
        quiet.detail
    );
    // Without the old shims, the service passes and the idle pod is named,
    // a warning.
    let mut c = calls("a:1", "shop", "shop.Cart", 10.0, "1");
    c.extend(calls("e:1", "shop", "shop.Cart", 1.0, "1"));
    let obs = observe(&c, &[], &[], &t2, &live(&[("a:1", "shop")]));
    let rows = judge(&obs, &TimerRules::default(), &ns(&["shop"]));
    assert_eq!(row(&rows, "shop", "shop.Cart").verdict, TimerFit::Ok);
    let quiet = row(&rows, "shop", "-");
    assert_eq!(quiet.verdict, TimerFit::NoTraffic, "{quiet:?}");
    assert!(quiet.detail.contains("d:1"), "{}", quiet.detail);

    // Every pod of the window gone: nothing to judge, said.
    let obs = observe(
        &calls("e:1", "gone", "gone.Svc", 3.0, "1"),
        &[],
        &[],
        &[],
        &[],
    );
    let rows = judge(&obs, &TimerRules::default(), &ns(&["gone"]));
    assert_eq!(rows[0].verdict, TimerFit::Gone, "{rows:?}");
    assert!(rows[0]
        .detail
        .contains("none of its 1 pods of the window runs now"));
}

/// With buckets to 300 s, a 40 s call reads as the 60 s bucket; a p99 past
/// the largest is "at least" it, and no drain below it passes.
#[test]
fn calls_past_the_largest_bucket_are_at_least_it_and_never_pass_below() {
    assert_eq!(CALLS_LARGEST, 300.0);
    let c = calls("a:1", "slow", "slow.Svc", 10.0, "60");
    let obs = observe(&c, &[], &[], &timers("a:1", "slow", 30.0, 60.0), &[]);
    let rows = judge(&obs, &TimerRules::default(), &ns(&["slow"]));
    assert_eq!(rows[0].calls.max, Some(60.0), "{rows:?}");
    assert_eq!(rows[0].verdict, TimerFit::Short);
    assert_eq!(rows[0].recommended.as_ref().unwrap().drain_time, 65.0);

    // Every call past 300 s.
    let c = calls("a:1", "slow", "slow.Svc", 10.0, "+Inf");
    let obs = observe(&c, &[], &[], &timers("a:1", "slow", 100.0, 110.0), &[]);
    let rows = judge(&obs, &TimerRules::default(), &ns(&["slow"]));
    let r = &rows[0];
    assert_eq!(
        (r.calls.p99, r.calls.p99_over),
        (None, Some(300.0)),
        "{r:?}"
    );
    assert_eq!((r.calls.max, r.calls.over), (None, Some(300.0)));
    assert_eq!(r.verdict, TimerFit::Short);
    assert_eq!(r.recommended.as_ref().unwrap().drain_time, 305.0);
    assert!(
        r.detail
            .contains("calls past the largest bucket, at least 300s, the p99 among them"),
        "{}",
        r.detail
    );
    // Past the preStop hooks' timeout no annotation can set it: no fix
    // (the webhook would refuse it), and why.
    assert_eq!(r.fix, None);
    assert!(
        r.detail.contains("preStop hooks' 120s timeout"),
        "{}",
        r.detail
    );
    let text = render(&TimersReport {
        window_seconds: 60.0,
        at: 0.0,
        services: rows.clone(),
    });
    assert!(text.contains(">300s / >300s"), "{text}");

    // A shim before the longer buckets (its histogram ends at 10 s) whose
    // calls went past it: at least the largest bucket, never 10 s.
    let old: Vec<Sample> = [("5", 4.0), ("10", 4.0), ("+Inf", 6.0)]
        .iter()
        .map(|(le, n)| {
            sample(
                &[
                    ("instance", "b:1"),
                    ("namespace", "slow"),
                    ("service", "slow.Svc"),
                    ("le", le),
                ],
                *n,
            )
        })
        .collect();
    let mut c = calls("a:1", "slow", "slow.Svc", 10.0, "1");
    c.extend(old);
    let mut t = timers("a:1", "slow", 60.0, 90.0);
    t.extend(timers("b:1", "slow", 60.0, 90.0));
    let obs = observe(&c, &[], &[], &t, &[]);
    let rows = judge(&obs, &TimerRules::default(), &ns(&["slow"]));
    assert_eq!(rows[0].calls.over, Some(300.0), "{rows:?}");
    assert_eq!(rows[0].verdict, TimerFit::Short);
    // The p99 is read over the edges both have: past 10 s, at least that.
    assert_eq!(rows[0].calls.p99_over, Some(10.0));
}

/// A pod that does not know its grace period is named; the smallest grace
/// of those that do is still checked.
#[test]
fn an_unknown_grace_period_is_named_and_the_known_ones_still_checked() {
    let mut c = calls("a:1", "shop", "shop.Cart", 10.0, "1");
    c.extend(calls("b:1", "shop", "shop.Cart", 10.0, "1"));
    let mut t = timers_of("a:1", "", "shop", [60.0, 90.0, 200.0]);
    t.extend(timers_of("b:1", "", "shop", [60.0, 90.0, f64::NAN]));
    let obs = observe(&c, &[], &[], &t, &[]);
    let rows = judge(&obs, &TimerRules::default(), &ns(&["shop"]));
    let r = &rows[0];
    assert_eq!(r.verdict, TimerFit::Unknown, "{r:?}");
    assert_eq!(r.grace_unknown, vec!["b:1".to_string()]);
    assert!(
        r.detail
            .contains("termination grace period unknown on 1 of its pods (b:1)"),
        "{}",
        r.detail
    );
    assert_eq!(
        r.current.as_ref().unwrap().termination_grace_period,
        Some(200.0)
    );
    // A known grace too short for the timers fails whatever the others say.
    let mut t = timers_of("a:1", "", "shop", [60.0, 90.0, 25.0]);
    t.extend(timers_of("b:1", "", "shop", [60.0, 90.0, f64::NAN]));
    let obs = observe(&c, &[], &[], &t, &[]);
    let rows = judge(&obs, &TimerRules::default(), &ns(&["shop"]));
    assert_eq!(rows[0].verdict, TimerFit::Short, "{rows:?}");
    assert!(
        rows[0].detail.contains("grace period 25s not above 26s"),
        "{}",
        rows[0].detail
    );
}

/// Two StatefulSets' `web-0` on one node agent, in two namespaces, each
/// serving `shop.Cart`: two pods, each judged in its own namespace.
#[test]
fn pods_and_services_are_joined_on_their_namespace() {
    let mut c = calls_of("node:1", "web-0", "a", "shop.Cart", 10.0, "5");
    c.extend(calls_of("node:1", "web-0", "b", "shop.Cart", 10.0, "0.5"));
    let mut t = timers_of("node:1", "web-0", "a", [6.0, 9.0, 120.0]);
    t.extend(timers_of("node:1", "web-0", "b", [60.0, 90.0, 120.0]));
    let obs = observe(&c, &[], &[], &t, &[]);
    assert_eq!(obs.pods.len(), 2, "{obs:?}");
    let rows = judge(&obs, &TimerRules::default(), &ns(&["a", "b"]));
    assert_eq!(rows.len(), 2, "{rows:?}");
    let a = row(&rows, "a", "shop.Cart");
    assert_eq!(
        (a.verdict, a.calls.max),
        (TimerFit::Short, Some(5.0)),
        "{a:?}"
    );
    assert_eq!(a.current.as_ref().unwrap().drain_time, 6.0);
    let b = row(&rows, "b", "shop.Cart");
    assert_eq!((b.verdict, b.calls.max), (TimerFit::Ok, Some(0.5)), "{b:?}");
    assert_eq!(b.current.as_ref().unwrap().drain_time, 60.0);
}

/// A pod whose histograms reset in the window is read again with
/// `increase()`: its counts replace the highest-less-lowest ones, whole.
#[test]
fn a_reset_pods_histograms_are_replaced_by_their_increase() {
    let mut c = calls("a:1", "shop", "shop.Cart", 100.0, "10");
    c.extend(calls("b:1", "shop", "shop.Cart", 3.0, "1"));
    let mut obs = observe(&c, &[], &[], &timers("a:1", "shop", 60.0, 90.0), &[]);
    let again: Vec<Sample> = calls("a:1", "shop", "shop.Cart", 4.02, "1")
        .into_iter()
        .chain(calls("a:1", "shop", "shop.Other", 0.3, "1"))
        .collect();
    let reset: BTreeSet<PodKey> = [("shop".into(), "a:1".into(), String::new())].into();
    recount(&mut obs, &reset, &again, &[]);
    let a = &obs.pods[&("shop".to_string(), "a:1".to_string(), String::new())];
    assert_eq!(a.calls.len(), 1, "0.3 of a call is none: {a:?}");
    assert_eq!(a.calls["shop.Cart"][&Le(f64::INFINITY)], 4.0);
    assert_eq!(a.calls["shop.Cart"][&Le(1.0)], 4.0);
    assert!(a.timers.is_some(), "its timers stay");
    let b = &obs.pods[&("shop".to_string(), "b:1".to_string(), String::new())];
    assert_eq!(b.calls["shop.Cart"][&Le(f64::INFINITY)], 3.0);
}

#[test]
fn a_foreign_nan_or_infinity_is_said_never_a_panic() {
    assert_eq!(super::flag(1.5), "1500ms");
    for v in [f64::NAN, f64::INFINITY, 1e300] {
        assert!(!super::flag(v).is_empty());
    }
}

/// A pod whose calls cannot be seen fails by name, never a "no traffic"
/// pass: its guard's request metrics off, or its `_count` grown with no
/// `_bucket` (a scrape that drops them). Requests its Envoy counted that the
/// guard recorded none of are said, not failed (streams still open,
/// Envoy's own answers); Envoy's count not scraped is said too.
#[test]
fn calls_that_cannot_be_seen_are_unknown_never_no_traffic() {
    let t = timers("a:1", "blind", 60.0, 90.0);
    let judged = |obs: &Observed| {
        let rows = judge(obs, &TimerRules::default(), &ns(&["blind"]));
        row(&rows, "blind", "-").clone()
    };
    let mut obs = observe(&[], &[], &[], &t, &[]);
    envoy_requests(&mut obs, &requests("a:1", "blind", 50.0));
    visibility(&mut obs, &requests("a:1", "blind", 0.0), &[]);
    let r = judged(&obs);
    assert_eq!(r.verdict, TimerFit::Unknown, "{r:?}");
    assert!(
        r.detail
            .contains("the guard's request metrics are off on 1 of its pods (a:1)"),
        "{}",
        r.detail
    );

    let mut obs = observe(&[], &[], &[], &t, &[]);
    envoy_requests(&mut obs, &requests("a:1", "blind", 7.0));
    visibility(
        &mut obs,
        &requests("a:1", "blind", 1.0),
        &requests("a:1", "blind", 7.0),
    );
    let r = judged(&obs);
    assert_eq!(r.verdict, TimerFit::Unknown, "{r:?}");
    assert!(
        r.detail.contains(
            "1 of its pods (a:1) have calls in drainshim_guard_request_duration_seconds_count"
        ),
        "{}",
        r.detail
    );

    let mut obs = observe(&[], &[], &[], &t, &[]);
    envoy_requests(&mut obs, &requests("a:1", "blind", 50.0));
    visibility(&mut obs, &requests("a:1", "blind", 1.0), &[]);
    let r = judged(&obs);
    assert_eq!(r.verdict, TimerFit::NoTraffic, "{r:?}");
    assert!(
        r.detail
            .contains("Envoy counted requests in the window that the guard recorded none of on 1 of them (a:1)"),
        "{}",
        r.detail
    );

    let obs = observe(&[], &[], &[], &t, &[]);
    let r = judged(&obs);
    assert_eq!(r.verdict, TimerFit::NoTraffic, "{r:?}");
    assert!(
        r.detail.contains("whether a:1 took requests is not known"),
        "{}",
        r.detail
    );
}

/// Envoy's count of a pod's requests in the window (or any per-pod value).
fn requests(instance: &str, ns: &str, n: f64) -> Vec<Sample> {
    vec![sample(&[("instance", instance), ("namespace", ns)], n)]
}

/// A pod without a call beside a judged service is compared with what the
/// service needs, with its own deregistration delay: below it, it may be
/// one of its replicas, which a restart would cut: it fails by name. So is
/// it beside a service none of whose pods runs now (a rollout inside the
/// window), and one whose grace period is unknown or whose parent shutdown
/// is too close to its drain time.
#[test]
fn an_idle_replica_is_compared_with_the_services_beside_it() {
    // shop.Slow's calls take up to 5 s: with 5 s of deregistration, 10 s of
    // drain and a parent shutdown 10 s later.
    let c = calls("a:1", "shop", "shop.Slow", 10.0, "5");
    let idle = |t: Vec<Sample>, live_pods: &[(&str, &str)]| {
        let mut obs = observe(&c, &[], &[], &t, &live(live_pods));
        envoy_requests(&mut obs, &requests("b:1", "shop", 0.0));
        judge(&obs, &TimerRules::default(), &ns(&["shop"]))
    };
    let mut t = timers("a:1", "shop", 60.0, 90.0);
    t.extend(timers("b:1", "shop", 6.0, 16.0));
    let rows = idle(t, &[]);
    assert_eq!(row(&rows, "shop", "shop.Slow").verdict, TimerFit::Ok);
    let r = row(&rows, "shop", "-");
    assert_eq!(r.verdict, TimerFit::Unknown, "{r:?}");
    assert!(
        r.detail.contains(
            "1 of its pods (b:1) run drain timers below what shop.Slow needs with their own \
             deregistration delay (5s of calls and streams after it, a parent shutdown 10s later"
        ),
        "{}",
        r.detail
    );

    let mut t = timers("a:1", "shop", 60.0, 90.0);
    t.extend(timers("b:1", "shop", 10.0, 20.0));
    let rows = idle(t, &[]);
    let r = row(&rows, "shop", "-");
    assert_eq!(r.verdict, TimerFit::NoTraffic, "{r:?}");
    assert!(
        r.detail.contains("beside its judged services: b:1"),
        "{}",
        r.detail
    );

    // a:1 gone (replaced inside the window), b:1 runs short: compared with
    // the gone service's needs all the same.
    let rows = idle(timers("b:1", "shop", 6.0, 16.0), &[("b:1", "shop")]);
    assert_eq!(row(&rows, "shop", "shop.Slow").verdict, TimerFit::Gone);
    let r = row(&rows, "shop", "-");
    assert_eq!(r.verdict, TimerFit::Unknown, "{r:?}");
    assert!(
        r.detail.contains("below what shop.Slow needs"),
        "{}",
        r.detail
    );

    // Enough drain, but no grace period known: unknown, named.
    let mut t = timers("a:1", "shop", 60.0, 90.0);
    t.extend(timers_of("b:1", "", "shop", [10.0, 20.0, f64::NAN]));
    let r = row(&idle(t, &[]), "shop", "-").clone();
    assert_eq!(r.verdict, TimerFit::Unknown, "{r:?}");
    assert!(
        r.detail
            .contains("(b:1) run drain timers below what shop.Slow needs"),
        "{}",
        r.detail
    );
    // A parent shutdown 2 s after a long drain, beside a service without
    // streams (nothing is ended at the drain's end): named, not failed.
    let mut t = timers("a:1", "shop", 60.0, 90.0);
    t.extend(timers("b:1", "shop", 100.0, 102.0));
    let r = row(&idle(t, &[]), "shop", "-").clone();
    assert_eq!(r.verdict, TimerFit::NoTraffic, "{r:?}");
    // Idle pods with no judged service beside them, their grace unknown
    // and their margin tight: named, nothing to compare with.
    let t = timers_of("c:1", "", "idle", [10.0, 11.0, f64::NAN]);
    let obs = observe(&[], &[], &[], &t, &[]);
    let rows = judge(&obs, &TimerRules::default(), &ns(&["idle"]));
    assert_eq!(
        row(&rows, "idle", "-").verdict,
        TimerFit::NoTraffic,
        "{rows:?}"
    );
}

/// One stream-lifetime series of `n` streams, all under `edge`.
fn streams(instance: &str, ns: &str, n: f64, edge: &str) -> Vec<Sample> {
    [(edge, n), ("+Inf", n)]
        .iter()
        .map(|(le, n)| sample(&[("instance", instance), ("namespace", ns), ("le", le)], *n))
        .collect()
}

/// A judged service's pod whose parent shutdown is too close to its drain
/// time is short, even above the recommendation: its sweep's endings would
/// have less than their bound.
#[test]
fn a_parent_shutdown_too_close_to_the_drain_is_short() {
    let c = calls("a:1", "shop", "shop.Slow", 10.0, "5");
    // Without streams, nothing is ended at the drain's end: within.
    let obs = observe(&c, &[], &[], &timers("a:1", "shop", 100.0, 101.0), &[]);
    let rows = judge(&obs, &TimerRules::default(), &ns(&["shop"]));
    assert_eq!(
        row(&rows, "shop", "shop.Slow").verdict,
        TimerFit::Ok,
        "{rows:?}"
    );
    // With streams, their last endings come at the drain's end: short.
    let s = streams("a:1", "shop", 4.0, "30");
    let obs = observe(&c, &s, &[], &timers("a:1", "shop", 100.0, 101.0), &[]);
    let rows = judge(&obs, &TimerRules::default(), &ns(&["shop"]));
    let r = row(&rows, "shop", "shop.Slow");
    assert_eq!(r.verdict, TimerFit::Short, "{r:?}");
    assert!(
        r.detail.contains("less than 6s after their drain time"),
        "{}",
        r.detail
    );
    assert!(r.fix.is_some(), "{r:?}");
}

/// A pod whose window holds streams and no call (watches that waited for
/// their first event have no latency) is judged on its streams' spread,
/// never left as "no traffic".
#[test]
fn a_pod_with_streams_and_no_call_is_judged_on_its_streams() {
    let s = streams("a:1", "w", 100.0, "300");
    let age = [sample(&[("instance", "a:1"), ("namespace", "w")], 120.0)];
    let obs = observe(&[], &s, &age, &timers("a:1", "w", 6.0, 16.0), &[]);
    let rows = judge(&obs, &TimerRules::default(), &ns(&["w"]));
    let r = row(&rows, "w", "(streams only)");
    assert_eq!(r.verdict, TimerFit::Short, "{r:?}");
    assert_eq!(r.streams, 100);
    // 5 s of deregistration and the 30 s spread.
    assert_eq!(r.recommended.as_ref().map(|r| r.drain_time), Some(35.0));
    assert!(r.detail.contains("stream spread 30s"), "{}", r.detail);
    assert!(!rows.iter().any(|r| r.service == "-"), "{rows:?}");
    let obs = observe(&[], &s, &age, &timers("a:1", "w", 35.0, 45.0), &[]);
    let rows = judge(&obs, &TimerRules::default(), &ns(&["w"]));
    assert_eq!(
        row(&rows, "w", "(streams only)").verdict,
        TimerFit::Ok,
        "{rows:?}"
    );
}
