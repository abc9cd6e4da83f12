use std::collections::BTreeMap;

use super::read::observe;
use super::*;
use crate::fleet::prometheus::Sample;

fn sample(labels: &[(&str, &str)], value: f64) -> Sample {
    Sample {
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        value,
    }
}

/// A pod's call buckets: `n` calls, all at or under `edge`.
fn calls(instance: &str, ns: &str, svc: &str, n: f64, edge: &str) -> Vec<Sample> {
    let edges = ["0.5", "1", "2.5", "5", "10", "+Inf"];
    let at = edges.iter().position(|e| *e == edge).expect("an edge");
    edges
        .iter()
        .enumerate()
        .map(|(k, le)| {
            sample(
                &[
                    ("instance", instance),
                    ("namespace", ns),
                    ("service", svc),
                    ("le", le),
                ],
                if k >= at { n } else { 0.0 },
            )
        })
        .collect()
}

fn timers(instance: &str, ns: &str, drain: f64, parent: f64) -> Vec<Sample> {
    [
        ("deregistration_delay", 5.0),
        ("min_drain_time", 1.0),
        ("drain_time", drain),
        ("parent_shutdown_time", parent),
    ]
    .iter()
    .map(|(t, v)| {
        sample(
            &[("instance", instance), ("namespace", ns), ("timer", t)],
            *v,
        )
    })
    .collect()
}

#[test]
fn quantiles_follow_prometheus() {
    let b: Buckets = [
        (Le(1.0), 50.0),
        (Le(5.0), 100.0),
        (Le(f64::INFINITY), 100.0),
    ]
    .into();
    assert_eq!(quantile(0.5, &b), Some(1.0));
    assert!((quantile(0.99, &b).unwrap() - 4.92).abs() < 1e-9);
    assert_eq!(highest(&b), Some(Ok(5.0)));
    let over: Buckets = [(Le(10.0), 90.0), (Le(f64::INFINITY), 100.0)].into();
    assert_eq!(highest(&over), Some(Err(10.0)));
    assert_eq!(quantile(0.99, &over), Some(10.0));
    assert_eq!(highest(&BTreeMap::new()), None);
}

#[test]
fn a_drain_shorter_than_the_calls_is_named_with_its_fix() {
    let mut c = calls("a:1", "shop", "shop.Slow", 10.0, "5");
    c.extend(calls("b:1", "shop", "shop.Fast", 10.0, "0.5"));
    let mut t = timers("a:1", "shop", 6.0, 9.0);
    t.extend(timers("b:1", "shop", 60.0, 90.0));
    let obs = observe(&c, &[], &[], &t);
    let rows = judge(&obs, &TimerRules::default(), &["shop".to_string()]);
    let slow = rows.iter().find(|r| r.service == "shop.Slow").unwrap();
    assert_eq!(slow.verdict, Verdict::Short, "{slow:?}");
    // 5 s of deregistration plus the 5 s bucket, and the 10 s margin.
    let rec = slow.recommended.as_ref().unwrap();
    assert_eq!((rec.drain_time, rec.parent_shutdown_time), (10.0, 20.0));
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
    let fast = rows.iter().find(|r| r.service == "shop.Fast").unwrap();
    assert_eq!(fast.verdict, Verdict::Ok, "{fast:?}");
}

#[test]
fn streams_need_their_spread_bounded_by_the_max_age() {
    let c = calls("a:1", "chat", "chat.Feed", 10.0, "0.5");
    let s: Vec<Sample> = [("60", 0.0), ("300", 3.0), ("+Inf", 3.0)]
        .iter()
        .map(|(le, n)| {
            sample(
                &[("instance", "a:1"), ("namespace", "chat"), ("le", le)],
                *n,
            )
        })
        .collect();
    let age = [sample(&[("instance", "a:1"), ("namespace", "chat")], 120.0)];
    let obs = observe(&c, &s, &age, &timers("a:1", "chat", 20.0, 40.0));
    let rows = judge(&obs, &TimerRules::default(), &["chat".to_string()]);
    // Streams up to 300 s, the max age 120 s: spread the default 30 s.
    assert_eq!(rows[0].longest_stream, Some(120.0));
    assert_eq!(rows[0].recommended.as_ref().unwrap().drain_time, 35.0);
    assert_eq!(rows[0].verdict, Verdict::Short);
}

#[test]
fn idle_pods_and_pods_without_timers_are_said_so() {
    let c = calls("a:1", "old", "old.Svc", 10.0, "0.5");
    let idle = timers("b:1", "quiet", 60.0, 90.0);
    let obs = observe(&c, &[], &[], &idle);
    let ns = vec!["old".to_string(), "quiet".to_string()];
    let rows = judge(&obs, &TimerRules::default(), &ns);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].verdict, Verdict::Unknown);
    assert_eq!(rows[1].verdict, Verdict::NoTraffic);
    assert!(rows[1].detail.contains("no traffic in the window"));
    let text = render(&TimersReport {
        window_seconds: 3600.0,
        at: 0.0,
        services: rows,
    });
    assert!(
        text.contains("quiet/-: no traffic in the window: cannot recommend"),
        "{text}"
    );
}

#[test]
fn a_foreign_nan_or_infinity_is_said_never_a_panic() {
    assert_eq!(super::flag(1.5), "1500ms");
    for v in [f64::NAN, f64::INFINITY, 1e300] {
        assert!(!super::flag(v).is_empty());
    }
}
