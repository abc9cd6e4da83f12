//! Step 2's drain timers in the plan: the window read, the row per tier,
//! and `--explain timers`. The figures and the formula are
//! [`crate::fleet::timers`].

use std::time::Duration;

use super::render::{human, span, when};
use super::{
    read_versions, resolve, FleetError, Gate, PlanOptions, PromClient, Rollback, Row, State, Tier,
};
use crate::fleet::timers::{self as drain_timers, short_detail, TimerFit as T, TimersReport};

/// The window the drain-timers step reads: `--timers-window`, or the
/// lifetime soak step 2 just watched; never more than the history, never
/// less than a minute.
pub fn timers_window(opts: &PlanOptions) -> Duration {
    opts.timers
        .window
        .unwrap_or(opts.lifetime_soak)
        .min(opts.history)
        .max(Duration::from_secs(60))
}

/// The drain timers of every tier's services over the window ending at
/// `end` (Unix seconds).
pub(super) async fn read_timers(
    prom: &PromClient,
    opts: &PlanOptions,
    tiers: &[Tier],
    end: f64,
) -> Result<TimersReport, FleetError> {
    let window = timers_window(opts);
    let read = drain_timers::read(prom, window, end).await?;
    let mut namespaces: Vec<String> = tiers.iter().flat_map(|t| t.namespaces.clone()).collect();
    namespaces.sort();
    Ok(TimersReport {
        window_seconds: window.as_secs_f64(),
        at: end,
        services: drain_timers::judge(&read.observed, &opts.timers, &namespaces),
    })
}

/// `plan --explain timers`: the drain-timers step's table for every tier,
/// without the rest of the plan. A window in which no pod of the tiers
/// reported a call, a stream or a timer is an error (69), not an empty
/// table.
pub async fn explain_timers(
    reach: &crate::fleet::reach::Reach,
    opts: &PlanOptions,
) -> Result<TimersReport, FleetError> {
    let prom = PromClient::from_reach(reach.clone(), reach.timeout());
    let tl = read_versions(&prom, opts).await?;
    if tl.namespaces.is_empty() {
        return Err(FleetError::Empty(format!(
            "Prometheus at {} has no drainshim_proxy_info in the last {}: are the shims scraped?",
            prom.url(),
            human(opts.history)
        )));
    }
    let tiers = resolve(&opts.tiers, &tl.namespaces, opts.history).map_err(FleetError::Input)?;
    let end = tl.times.last().copied().unwrap_or_default();
    let report = read_timers(&prom, opts, &tiers, end).await?;
    let idle = |s: &drain_timers::ServiceTimers| s.verdict == drain_timers::TimerFit::NoTraffic;
    if report.services.iter().all(idle) {
        return Err(FleetError::Empty(format!(
            "no pod of the tiers reported a call or its drain timers in the {} before {} \
             (drainshim_guard_request_duration_seconds): a window with no data cannot be judged",
            human(timers_window(opts)),
            when(end)
        )));
    }
    Ok(report)
}

/// Step 2 for a tier, once its lifetime soaked: every service's pods
/// run drain timers at or above what its calls and streams need (see
/// [`crate::fleet::timers`]). A service short of them, or one of whose
/// pods running now exports no timers or no grace period, fails the gate
/// (the plan stops, naming each); pods without traffic in the window, and
/// services none of whose pods runs now, cannot be judged and are named,
/// not counted as a pass.
pub(super) fn row(mut r: Row, tier: &Tier, lifetime: &Row, report: &TimersReport) -> Row {
    r.rollback = Rollback {
        possible: Some(true),
        how: "restore the old timers".into(),
    };
    if lifetime.state != State::Done {
        r.detail = "judged once the connection lifetime soaked".into();
        r.gate = Gate::waits(
            "waits for step 2's soak: the window it reads",
            lifetime.gate.opens_at,
        );
        return r;
    }
    let all: Vec<_> = report.of(&tier.namespaces).collect();
    let named = |v: T| -> Vec<String> {
        all.iter()
            .filter(|s| s.verdict == v)
            .map(|s| short_detail(s))
            .collect()
    };
    let (short, unknown) = (named(T::Short), named(T::Unknown));
    let of = |v: T| -> Vec<String> {
        all.iter()
            .filter(|s| s.verdict == v)
            .map(|s| format!("{}/{}", s.namespace, s.service))
            .collect()
    };
    let (idle, gone) = (of(T::NoTraffic), of(T::Gone));
    let ok = all.iter().filter(|s| s.verdict == T::Ok).count();
    let window = span(report.window_seconds);
    let mut parts = vec![format!(
        "{ok} of {} services within their recommendation over {window}",
        all.len() - idle.len() - gone.len()
    )];
    if all.len() == idle.len() {
        parts = vec![format!(
            "no traffic in the last {window} from any service of the tier: cannot recommend{}",
            if idle.is_empty() {
                String::new()
            } else {
                format!(" ({})", idle.join(", "))
            }
        )];
    } else if !idle.is_empty() {
        parts.push(format!(
            "no traffic in the window, cannot recommend: {}",
            idle.join(", ")
        ));
    }
    if !gone.is_empty() {
        parts.push(format!(
            "calls in the window but no pod running now, nothing to judge: {}",
            gone.join(", ")
        ));
    }
    if short.is_empty() && unknown.is_empty() {
        r.state = State::Done;
        r.detail = parts.join("; ");
        return r;
    }
    let mut why = Vec::new();
    if !short.is_empty() {
        let (n, run) = match short.len() {
            1 => ("1 service".to_string(), "runs"),
            n => (format!("{n} services"), "run"),
        };
        why.push(format!(
            "{n} {run} drain timers below its recommendation: {}",
            short.join("; ")
        ));
    }
    if !unknown.is_empty() {
        why.push(format!("timers unknown: {}", unknown.join("; ")));
    }
    r.detail = parts.join("; ");
    r.gate = Gate::fails(why.join("; "));
    r.fixes = all.iter().filter_map(|s| s.fix.clone()).collect();
    r
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::{
        derive, Mesh, Plan, StepKind, TierSpec, Timelines, TimerRules, Verdict, Versions,
    };
    use super::*;
    use crate::fleet::timers::{Current, Recommended, ServiceTimers};
    use crate::fleet::verify::Thresholds;
    use crate::fleet::VersionLabel;

    fn service(ns: &str, verdict: T) -> ServiceTimers {
        ServiceTimers {
            namespace: ns.into(),
            service: "shop.Cart".into(),
            pods: 2,
            calls: crate::fleet::timers::Calls {
                p99: Some(2.9),
                p99_over: None,
                max: Some(5.0),
                over: None,
            },
            streams: 0,
            longest_stream: Some(0.0),
            max_age: Some(1800.0),
            current: Some(Current {
                deregistration_delay: 5.0,
                min_drain_time: 5.0,
                drain_time: 6.0,
                parent_shutdown_time: 9.0,
                termination_grace_period: None,
            }),
            recommended: Some(Recommended {
                drain_time: 10.0,
                parent_shutdown_time: 20.0,
                termination_grace_period_above: 30.0,
            }),
            without_timers: Vec::new(),
            grace_unknown: Vec::new(),
            verdict,
            detail: "drain time 6s < 10s".into(),
            fix: (verdict == T::Short).then(|| "kubectl -n ns1 patch ...".into()),
            needs: Some(5.0),
        }
    }

    /// Two tiers, both soaked (or not), tier 1's service short.
    fn plan_with(soaked: bool, services: Vec<ServiceTimers>) -> Plan {
        let o = PlanOptions {
            lifetime_soak: Duration::from_secs(if soaked { 3600 } else { 86_400 }),
            ..tests_opts()
        };
        let times: Vec<f64> = (0..10).map(|i| i as f64 * 3600.0).collect();
        let mut tl = Timelines {
            times: times.clone(),
            ..Default::default()
        };
        for _ in &times {
            let v: BTreeMap<(String, String), u64> = [
                (("ns0".to_string(), "1.38.3".to_string()), 2),
                (("ns1".to_string(), "1.38.3".to_string()), 2),
            ]
            .into();
            tl.namespaces.extend(v.keys().map(|(ns, _)| ns.clone()));
            tl.versions.push(v);
            tl.max_age
                .push([("ns0".into(), 1800.0), ("ns1".into(), 1800.0)].into());
        }
        tl.timers = TimersReport {
            window_seconds: 3600.0,
            at: 9.0 * 3600.0,
            services,
        };
        let v = Versions::new(o.control_plane, o.target, o.max_skew).unwrap();
        let tiers = resolve(&o.tiers, &tl.namespaces, o.history).unwrap();
        derive(&tl, &tiers, v, &o, &BTreeMap::new())
    }

    fn tests_opts() -> PlanOptions {
        PlanOptions {
            control_plane: "1.39".parse().unwrap(),
            target: "1.40".parse().unwrap(),
            max_skew: 1,
            tiers: (0..2)
                .map(|k| TierSpec {
                    name: format!("tier{k}"),
                    namespaces: vec![format!("ns{k}")],
                    pattern: None,
                })
                .collect(),
            version_label: VersionLabel::Version,
            stall_after: Duration::from_secs(7200),
            soak: Duration::from_secs(86_400),
            lifetime_soak: Duration::from_secs(3600),
            history: Duration::from_secs(90 * 86_400),
            at: None,
            commands: super::super::Commands {
                mesh: Mesh::Istio,
                revisions: BTreeMap::new(),
                suggest_max_age: Duration::from_secs(1800),
                prometheus_url: "http://prometheus:9090".into(),
            },
            thresholds: Thresholds {
                max_retry_increase: 0.2,
                max_reset_increase: 0.2,
                rate_floor: 0.05,
                golden: Default::default(),
            },
            timers: TimerRules::default(),
        }
    }

    #[test]
    fn a_short_service_stops_the_plan_at_its_tier_with_its_fix() {
        let plan = plan_with(true, vec![service("ns0", T::Ok), service("ns1", T::Short)]);
        assert_eq!(plan.verdict, Verdict::Stop, "{:?}", plan.next);
        let row = &plan.rows[plan.next.row.unwrap()];
        assert_eq!(
            (row.kind, row.tier.as_deref()),
            (StepKind::DrainTimers, Some("tier1"))
        );
        assert!(
            plan.next
                .action
                .contains("ns1/shop.Cart (2 pods; calls p99 2900ms max 5s): drain time 6s < 10s"),
            "{}",
            plan.next.action
        );
        assert_eq!(
            plan.next.commands,
            vec!["kubectl -n ns1 patch ...".to_string()]
        );
        // Tier 0's restart may not start either: the plan stops as a whole.
        let first = plan.rows.iter().find(|r| r.step == 3).unwrap();
        assert_eq!(first.gate.ok, Some(true), "tier 0's own gate is open");

        // Unknown timers stop it too; no traffic is named and passes.
        let plan = plan_with(
            true,
            vec![service("ns0", T::Unknown), service("ns1", T::NoTraffic)],
        );
        assert_eq!(plan.verdict, Verdict::Stop);
        assert!(
            plan.next.action.contains("timers unknown"),
            "{}",
            plan.next.action
        );
        let plan = plan_with(
            true,
            vec![service("ns0", T::Ok), service("ns1", T::NoTraffic)],
        );
        assert_eq!(plan.verdict, Verdict::Go, "{:?}", plan.next);
        let idle = plan
            .rows
            .iter()
            .find(|r| r.kind == StepKind::DrainTimers && r.tier.as_deref() == Some("tier1"))
            .unwrap();
        assert!(idle.detail.contains("no traffic") && idle.detail.contains("cannot recommend"));
    }

    #[test]
    fn before_the_lifetime_soaked_the_timers_wait_and_judge_nothing() {
        let plan = plan_with(false, vec![service("ns1", T::Short)]);
        assert_eq!(plan.verdict, Verdict::Wait, "{:?}", plan.next);
        let row = plan
            .rows
            .iter()
            .find(|r| r.kind == StepKind::DrainTimers)
            .unwrap();
        assert!(!row.gate.failed);
        assert!(row.gate.detail.contains("waits for step 2's soak"));
    }
}
