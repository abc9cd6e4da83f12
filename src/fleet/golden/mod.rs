//! `verify`'s golden-signal gates: the stream guard's view of each service,
//! the wave's window against the window before, per namespace and service.
//!
//! - **success rate** may not drop more than N points: failures are the
//!   server-side codes ([`FAILURE_CODES`]: gRPC's UNKNOWN, DEADLINE_EXCEEDED,
//!   UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS and HTTP 5xx);
//! - **p99** may not grow more than M%;
//! - **requests reaching the app per caller request** may not grow more than
//!   K%. The guard counts what reached the app; the callers' load is Envoy's
//!   inbound `downstream_rq_total` (`drainshim_envoy_downstream_requests_total`),
//!   what callers sent, which no retry policy changes. A retry default that
//!   changed in the new Envoy raises the first and not the second. Divided,
//!   the ratio does not move with the load itself;
//! - **stream re-opens** (`drainshim_guard_streams_opened_total`) may not
//!   grow more than R% (plus the rate floor).
//!
//! The streams the guard ended itself (a drain, max connection age, the
//! application's own shutdown) are not in the request counter, so never in
//! the success rate: a week of max age reads 100% for a healthy application.
//! They are shown on a line of their own ([`endings`]), by namespace and
//! reason, and not judged.
//!
//! The guard sits outside the mesh: its numbers do not change when Envoy
//! does. Every number is one PromQL query per window; the comparison is
//! pure ([`compare`]) and tested with tables.

use std::collections::BTreeMap;

use serde::Serialize;

use super::prometheus::{PromClient, PromError, Sample};

mod queries;
pub use queries::{per_second, Part, Queries, Read, COUNTERS, MAX_QUERY_LEN, PART, RESETS};

/// Codes counted as failures in the success rate: the server's failures,
/// not the caller's own (a NOT_FOUND or a 4xx is an answer).
pub const FAILURE_CODES: &str =
    "5xx|UNKNOWN|DEADLINE_EXCEEDED|UNIMPLEMENTED|INTERNAL|UNAVAILABLE|DATA_LOSS";

/// The line that shows the guard's own stream endings (not judged).
pub const ENDINGS: &str = "guard's own stream endings (not failures; shown, not judged)";

/// The thresholds, each a `verify` flag.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GoldenThresholds {
    /// Success rate drop allowed, in percentage points.
    pub max_success_drop: f64,
    /// p99 growth allowed (0.25 = +25%).
    pub max_p99_increase: f64,
    /// Growth of requests per caller request allowed (0.1 = +10%).
    pub max_amplification_increase: f64,
    /// Growth of the stream re-open rate allowed.
    pub max_reopen_increase: f64,
    /// Services with fewer requests per second than this in either window
    /// are not judged (too few for a rate or a p99); also the absolute
    /// slack of the re-open check.
    pub min_rate: f64,
}

impl Default for GoldenThresholds {
    fn default() -> Self {
        Self {
            max_success_drop: 1.0,
            max_p99_increase: 0.25,
            max_amplification_increase: 0.1,
            max_reopen_increase: 0.5,
            min_rate: 0.1,
        }
    }
}

/// A service's number in both windows and whether it stayed within bounds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServiceDelta {
    pub namespace: String,
    pub service: String,
    pub before: f64,
    pub now: f64,
    /// now - before (points for the success rate), or (now / before - 1) as a
    /// fraction for the others.
    pub change: f64,
    /// The largest value of `now` that passes.
    pub limit: f64,
    pub ok: bool,
}

/// (namespace, service) -> value.
pub type PerService = BTreeMap<(String, String), f64>;

/// How one gate compares the two windows: a drop in points, or growth.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Comparison {
    /// Percent; may drop `max` points.
    SuccessRate { max_drop: f64 },
    /// May grow by the fraction `max`, plus `floor` absolute.
    Growth { max: f64, floor: f64 },
}

/// Compares every service present in both windows; services missing from
/// one of them cannot be compared and are left out (the caller says so).
pub fn compare(gate: Comparison, before: &PerService, now: &PerService) -> Vec<ServiceDelta> {
    now.iter()
        .filter_map(|(key, &n)| {
            let &b = before.get(key)?;
            if !n.is_finite() || !b.is_finite() {
                return None;
            }
            let (change, limit) = match gate {
                Comparison::SuccessRate { max_drop } => (n - b, b - max_drop),
                Comparison::Growth { max, floor } => (
                    if b > 0.0 { n / b - 1.0 } else { f64::INFINITY },
                    b * (1.0 + max) + floor,
                ),
            };
            let ok = match gate {
                // A rate that did not move passes whatever the rounding.
                Comparison::SuccessRate { .. } => n >= limit - 1e-9,
                Comparison::Growth { .. } => n <= limit + 1e-12,
            };
            Some(ServiceDelta {
                namespace: key.0.clone(),
                service: key.1.clone(),
                before: b,
                now: n,
                change: if n == b { 0.0 } else { change },
                limit,
                ok,
            })
        })
        .collect()
}

/// Keeps the services with at least `min` in both windows.
pub fn busy(values: &PerService, other: &PerService, min: f64) -> Vec<(String, String)> {
    values
        .iter()
        .filter(|(k, v)| **v >= min && other.get(*k).is_some_and(|o| *o >= min))
        .map(|(k, _)| k.clone())
        .collect()
}

fn only(values: &PerService, keys: &[(String, String)]) -> PerService {
    keys.iter()
        .filter_map(|k| values.get(k).map(|v| (k.clone(), *v)))
        .collect()
}

/// A gate's verdict: the check's line and the services behind it.
#[derive(Clone, Debug)]
pub struct GateOutcome {
    pub name: &'static str,
    pub ok: Option<bool>,
    pub detail: String,
    pub services: Vec<ServiceDelta>,
}

fn shown(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Percent => format!("{v:.2}%"),
        Unit::Seconds => format!("{:.1} ms", v * 1000.0),
        Unit::Ratio => format!("{v:.3}"),
        Unit::PerSecond => format!("{v:.3}/s"),
    }
}

#[derive(Clone, Copy, Debug)]
enum Unit {
    Percent,
    Seconds,
    Ratio,
    PerSecond,
}

fn verdict(name: &'static str, unit: Unit, deltas: Vec<ServiceDelta>, what: &str) -> GateOutcome {
    if deltas.is_empty() {
        return GateOutcome {
            name,
            ok: None,
            detail: format!("no service with {what} in both windows"),
            services: deltas,
        };
    }
    let failed: Vec<&ServiceDelta> = deltas.iter().filter(|d| !d.ok).collect();
    let describe = |d: &ServiceDelta| {
        // Rounded as shown first: a change of -1e-16 reads +0.0, not -0.0.
        let at = |x: f64, digits: i32| {
            let k = 10f64.powi(digits);
            (x * k).round() / k + 0.0
        };
        let change = match unit {
            Unit::Percent => format!("{:+.2} points", at(d.change, 2)),
            _ if d.change.is_infinite() => "from zero".to_string(),
            _ => format!("{:+.1}%", at(d.change * 100.0, 1)),
        };
        let limit = match unit {
            Unit::Percent => format!("at least {}", shown(d.limit, unit)),
            _ => format!("at most {}", shown(d.limit, unit)),
        };
        format!(
            "{}/{}: {} -> {} ({change}; {limit})",
            d.namespace,
            d.service,
            shown(d.before, unit),
            shown(d.now, unit)
        )
    };
    let detail = if failed.is_empty() {
        let n = deltas.len();
        // The service that moved most, for the record. Changes equal but for
        // float rounding (stores sum in different orders) are a tie, which
        // the last in name order wins, so every store names the same one.
        let q = |x: f64| (x * 1e9).round() + 0.0; // -0.0 is 0.0
        let most = deltas
            .iter()
            .max_by(|a, b| match unit {
                Unit::Percent => q(b.change).total_cmp(&q(a.change)),
                _ => q(a.change).total_cmp(&q(b.change)),
            })
            .map(describe)
            .unwrap_or_default();
        format!("{n} service(s) within; moved most: {most}")
    } else {
        failed
            .iter()
            .map(|d| describe(d))
            .collect::<Vec<_>>()
            .join("; ")
    };
    GateOutcome {
        name,
        ok: Some(failed.is_empty()),
        detail,
        services: deltas,
    }
}

/// Requests and failures ([`FAILURE_CODES`], matched whole as PromQL does)
/// per (namespace, service) from the per-code rates; summed in label order,
/// so every store's answer, in whatever order it comes, adds up alike.
pub fn requests_and_failures<'a>(
    samples: impl IntoIterator<Item = &'a Sample>,
) -> (PerService, PerService) {
    static FAILURE: std::sync::LazyLock<Option<regex::Regex>> =
        std::sync::LazyLock::new(|| regex::Regex::new(&format!("^(?:{FAILURE_CODES})$")).ok());
    let by_code: BTreeMap<(String, String, String), f64> = samples
        .into_iter()
        .map(|s| {
            let key = (
                s.label("namespace").to_string(),
                s.label("service").to_string(),
                s.label("code").to_string(),
            );
            (key, s.value)
        })
        .collect();
    let (mut requests, mut failures) = (PerService::new(), PerService::new());
    for ((ns, svc, code), v) in by_code {
        let key = (ns, svc);
        if FAILURE.as_ref().is_some_and(|r| r.is_match(&code)) {
            *failures.entry(key.clone()).or_default() += v;
        }
        *requests.entry(key).or_default() += v;
    }
    (requests, failures)
}

/// (namespace, `label`) -> the sum of `samples`, added in the order of
/// their labels: every store's answer, in whatever order it comes, adds up
/// alike.
fn sum_by<'a>(samples: impl IntoIterator<Item = &'a Sample>, label: &str) -> PerService {
    let mut sorted: Vec<&Sample> = samples.into_iter().collect();
    sorted.sort_by(|a, b| a.labels.cmp(&b.labels));
    let mut out = PerService::new();
    for s in sorted {
        let key = (s.label("namespace").to_string(), s.label(label).to_string());
        *out.entry(key).or_default() += s.value;
    }
    out
}

/// One window's numbers.
#[derive(Clone, Debug, Default)]
pub struct Window {
    pub requests: PerService,
    pub failures: PerService,
    pub p99: PerService,
    /// Per namespace (service "").
    pub callers: PerService,
    pub reopens: PerService,
    /// The guard's graceful endings per (namespace, reason).
    pub ended: PerService,
    /// The guard's endings by a reset per (namespace, reason).
    pub reset: PerService,
    /// Per part that had series in the window, the sum over the wave
    /// (retries and kernel resets per second, the extra parts asked).
    pub totals: BTreeMap<&'static str, f64>,
}

impl Window {
    /// The window's numbers: [`COUNTERS`] and the `extra` parts in as few
    /// queries as fit ([`Queries::window`]), and p99, asked at once (a
    /// store runs them side by side). Each counter is read with two
    /// functions, and asked whether it reset; only when one of the wave's
    /// series did (a shim restarted in its pod: rare) is the window asked
    /// again, with the reset-aware form.
    pub async fn read(
        prom: &PromClient,
        q: &Queries<'_>,
        offset: &str,
        extra: &[Part],
    ) -> Result<Self, PromError> {
        let mut parts = Part::counters();
        parts.extend(extra.iter().cloned());
        let mut probed = parts.clone();
        if !q.resets {
            probed.extend(Part::resets());
        }
        let p99 = q.p99(offset);
        let (mut samples, p99) =
            tokio::try_join!(Self::ask(prom, q, offset, &probed), prom.query(&p99))?;
        if !q.resets && samples.iter().any(|s| s.label(PART) == RESETS) {
            let q = Queries { resets: true, ..*q };
            samples = Self::ask(prom, &q, offset, &parts).await?;
        }
        let of = |name: &str| {
            let name = name.to_string();
            samples.iter().filter(move |s| s.label(PART) == name)
        };
        let (requests, failures) = requests_and_failures(of("requests"));
        let totals = parts
            .iter()
            .filter(|p| of(p.name).next().is_some())
            .map(|p| (p.name, sum_by(of(p.name), "").values().sum()))
            .collect();
        Ok(Self {
            requests,
            failures,
            p99: sum_by(&p99, "service"),
            callers: sum_by(of("callers"), ""),
            reopens: sum_by(of("reopens"), "service"),
            ended: sum_by(of("ended"), "reason"),
            reset: sum_by(of("reset"), "reason"),
            totals,
        })
    }

    /// The window's `parts`, every query at once.
    async fn ask(
        prom: &PromClient,
        q: &Queries<'_>,
        offset: &str,
        parts: &[Part],
    ) -> Result<Vec<Sample>, PromError> {
        let asked = q.window(parts, offset);
        let answers =
            futures_util::future::try_join_all(asked.iter().map(|x| prom.query(x))).await?;
        Ok(answers.into_iter().flatten().collect())
    }

    /// Success rate in percent per service.
    fn success(&self) -> PerService {
        self.requests
            .iter()
            .filter(|(_, total)| **total > 0.0)
            .map(|(k, total)| {
                let failed = self.failures.get(k).copied().unwrap_or(0.0);
                (k.clone(), 100.0 * (1.0 - failed / total))
            })
            .collect()
    }

    /// Requests reaching the app per caller request, per service.
    fn amplification(&self) -> PerService {
        self.requests
            .iter()
            .filter_map(|((ns, svc), r)| {
                let callers = *self.callers.get(&(ns.clone(), String::new()))?;
                (callers > 0.0).then(|| ((ns.clone(), svc.clone()), r / callers))
            })
            .collect()
    }
}

/// The four gates over two windows.
pub fn judge(before: &Window, now: &Window, t: &GoldenThresholds) -> Vec<GateOutcome> {
    let judged = busy(&now.requests, &before.requests, t.min_rate);
    let success = compare(
        Comparison::SuccessRate {
            max_drop: t.max_success_drop,
        },
        &only(&before.success(), &judged),
        &only(&now.success(), &judged),
    );
    let p99 = compare(
        Comparison::Growth {
            max: t.max_p99_increase,
            floor: 0.0,
        },
        &only(&before.p99, &judged),
        &only(&now.p99, &judged),
    );
    let amplification = compare(
        Comparison::Growth {
            max: t.max_amplification_increase,
            floor: 0.0,
        },
        &only(&before.amplification(), &judged),
        &only(&now.amplification(), &judged),
    );
    // Re-opens are judged wherever streams were opened at all.
    let reopens = compare(
        Comparison::Growth {
            max: t.max_reopen_increase,
            floor: t.min_rate,
        },
        &before.reopens,
        &now.reopens,
    );
    vec![
        verdict(
            "guard success rate within threshold",
            Unit::Percent,
            success,
            "guard requests",
        ),
        verdict(
            "guard p99 within threshold",
            Unit::Seconds,
            p99,
            "guard requests",
        ),
        verdict(
            "guard requests per caller request within threshold (retries)",
            Unit::Ratio,
            amplification,
            "guard requests and Envoy's inbound requests",
        ),
        verdict(
            "guard stream re-open rate within threshold",
            Unit::PerSecond,
            reopens,
            "streams opened",
        ),
    ]
}

/// The guard's own stream endings in the wave's window, per namespace: shown
/// beside the gates, never judged (they are not the application's failures).
pub fn endings(now: &Window) -> GateOutcome {
    // Per namespace: (graceful by reason, graceful, reset by reason, reset).
    // Each reason apart: a restart's (`drain`), a config push's
    // (`config_push`), max age, the app's own stop.
    type Tally = (Vec<String>, f64, Vec<String>, f64);
    let mut by_ns: BTreeMap<&str, Tally> = BTreeMap::new();
    for ((ns, reason), v) in &now.ended {
        let e = by_ns.entry(ns).or_default();
        if *v > 0.0 {
            e.0.push(format!("{reason} {v:.3}/s"));
        }
        e.1 += v;
    }
    for ((ns, reason), v) in &now.reset {
        let e = by_ns.entry(ns).or_default();
        if *v > 0.0 {
            e.2.push(format!("{reason} {v:.3}/s"));
        }
        e.3 += v;
    }
    let why = |reasons: &[String]| {
        if reasons.is_empty() {
            String::new()
        } else {
            format!(" ({})", reasons.join(", "))
        }
    };
    let lines: Vec<String> = by_ns
        .into_iter()
        .filter(|(_, (_, ended, _, reset))| *ended > 0.0 || *reset > 0.0)
        .map(|(ns, (ended_by, ended, reset_by, reset))| {
            format!(
                "{ns}: {ended:.3}/s ended gracefully{}, {reset:.3}/s reset{}",
                why(&ended_by),
                why(&reset_by)
            )
        })
        .collect();
    GateOutcome {
        name: ENDINGS,
        ok: None,
        detail: if lines.is_empty() {
            "none in the window".into()
        } else {
            lines.join("; ")
        },
        services: Vec::new(),
    }
}

/// The gates' names, in order, for sources that cannot judge them.
pub const GATES: [&str; 4] = [
    "guard success rate within threshold",
    "guard p99 within threshold",
    "guard requests per caller request within threshold (retries)",
    "guard stream re-open rate within threshold",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(entries: &[(&str, &str, f64)]) -> PerService {
        entries
            .iter()
            .map(|(n, s, v)| ((n.to_string(), s.to_string()), *v))
            .collect()
    }

    #[test]
    fn the_guards_endings_are_shown_per_namespace_and_never_judged() {
        let now = Window {
            ended: svc(&[
                ("shop", "max_age", 2.0),
                ("shop", "drain", 0.0),
                ("pay", "drain", 0.5),
                ("pay", "config_push", 0.5),
                ("idle", "max_age", 0.0),
            ]),
            reset: svc(&[("pay", "drain", 0.25), ("pay", "config_push", 0.125)]),
            ..Window::default()
        };
        let v = endings(&now);
        assert_eq!(v.ok, None);
        // A config push's endings and cuts apart from a restart's.
        assert_eq!(
            v.detail,
            "pay: 1.000/s ended gracefully (config_push 0.500/s, drain 0.500/s), \
             0.375/s reset (config_push 0.125/s, drain 0.250/s); \
             shop: 2.000/s ended gracefully (max_age 2.000/s), 0.000/s reset"
        );
        assert_eq!(endings(&Window::default()).detail, "none in the window");
    }

    #[test]
    fn success_rate_may_drop_n_points() {
        let gate = Comparison::SuccessRate { max_drop: 1.0 };
        let before = svc(&[("a", "x.S", 99.5), ("a", "y.S", 99.5), ("b", "z.S", 90.0)]);
        let now = svc(&[("a", "x.S", 98.6), ("a", "y.S", 98.4), ("c", "new.S", 50.0)]);
        let d = compare(gate, &before, &now);
        assert_eq!(d.len(), 2, "only services in both windows: {d:?}");
        assert!(d[0].ok && d[0].service == "x.S", "{d:?}");
        assert!(!d[1].ok && d[1].service == "y.S", "{d:?}");
        assert!((d[1].change + 1.1).abs() < 1e-9);
        // No change passes whatever the float noise.
        assert!(compare(gate, &svc(&[("a", "x", 97.3)]), &svc(&[("a", "x", 97.3)]))[0].ok);
    }

    #[test]
    fn growth_has_a_relative_bound_and_a_floor() {
        let g = Comparison::Growth {
            max: 0.25,
            floor: 0.0,
        };
        let d = compare(g, &svc(&[("a", "x", 0.010)]), &svc(&[("a", "x", 0.0124)]));
        assert!(d[0].ok, "{d:?}");
        let d = compare(g, &svc(&[("a", "x", 0.010)]), &svc(&[("a", "x", 0.013)]));
        assert!(!d[0].ok);
        assert!((d[0].change - 0.3).abs() < 1e-9);
        let floored = Comparison::Growth {
            max: 0.5,
            floor: 0.1,
        };
        let d = compare(floored, &svc(&[("a", "x", 0.0)]), &svc(&[("a", "x", 0.05)]));
        assert!(d[0].ok && d[0].change.is_infinite(), "{d:?}");
        let d = compare(floored, &svc(&[("a", "x", 0.0)]), &svc(&[("a", "x", 0.2)]));
        assert!(!d[0].ok);
        // NaN (histogram_quantile of nothing) is no comparison.
        assert!(compare(g, &svc(&[("a", "x", f64::NAN)]), &svc(&[("a", "x", 1.0)])).is_empty());
    }

    fn window(requests: f64, failures: f64, p99: f64, callers: f64) -> Window {
        Window {
            requests: svc(&[("shop", "cart.Cart", requests)]),
            failures: svc(&[("shop", "cart.Cart", failures)]),
            p99: svc(&[("shop", "cart.Cart", p99)]),
            callers: svc(&[("shop", "", callers)]),
            ..Window::default()
        }
    }

    #[test]
    fn retries_show_as_requests_per_caller_request() {
        let t = GoldenThresholds::default();
        // 25% of calls fail; the new Envoy retries them: 1.31 requests per call.
        let before = window(40.0, 10.0, 0.004, 40.0);
        let retried = window(52.5, 3.2, 0.004, 40.0);
        let v = judge(&before, &retried, &t);
        assert_eq!(v[2].ok, Some(false), "{:?}", v[2]);
        assert!(
            v[2].detail.contains("shop/cart.Cart: 1.000 -> 1.312"),
            "{}",
            v[2].detail
        );
        assert_eq!(
            v[0].ok,
            Some(true),
            "retries made it look better: {:?}",
            v[0]
        );
        // More load with no retries: the ratio stays, the gate passes.
        let busier = window(80.0, 20.0, 0.004, 80.0);
        let v = judge(&before, &busier, &t);
        assert!(v.iter().all(|v| v.ok != Some(false)), "{v:?}");
    }

    #[test]
    fn p99_and_success_rate_regressions_are_named() {
        let t = GoldenThresholds::default();
        let before = window(40.0, 0.0, 0.004, 40.0);
        let v = judge(&before, &window(40.0, 0.0, 0.020, 40.0), &t);
        assert_eq!(v[1].ok, Some(false));
        assert!(
            v[1].detail.contains("4.0 ms -> 20.0 ms (+400.0%"),
            "{}",
            v[1].detail
        );
        let v = judge(&before, &window(40.0, 2.0, 0.004, 40.0), &t);
        assert_eq!(v[0].ok, Some(false));
        assert!(
            v[0].detail.contains("100.00% -> 95.00% (-5.00 points"),
            "{}",
            v[0].detail
        );
    }

    #[test]
    fn quiet_services_are_not_judged() {
        let t = GoldenThresholds::default();
        let v = judge(
            &window(0.05, 0.0, 0.004, 1.0),
            &window(0.05, 0.05, 0.5, 1.0),
            &t,
        );
        assert!(v[..3].iter().all(|v| v.ok.is_none()), "{v:?}");
    }

    #[test]
    fn failures_are_the_failure_codes_matched_whole() {
        let sample = |svc: &str, code: &str, value: f64| Sample {
            labels: [("namespace", "shop"), ("service", svc), ("code", code)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
        };
        let (requests, failures) = requests_and_failures(&[
            sample("a", "OK", 9.0),
            sample("a", "UNAVAILABLE", 1.0),
            sample("a", "5xx", 2.0),
            sample("a", "4xx", 3.0),
            sample("b", "OK", 5.0),
            sample("b", "NOT_UNAVAILABLE", 5.0),
        ]);
        let k = |s: &str| ("shop".to_string(), s.to_string());
        assert_eq!(requests[&k("a")], 15.0);
        assert_eq!(failures[&k("a")], 3.0);
        assert_eq!(requests[&k("b")], 10.0);
        assert!(!failures.contains_key(&k("b")));
    }
}
