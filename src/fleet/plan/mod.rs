//! `plan`: the whole migration from mesh version n-2 to n as a plan the
//! fleet itself reports.
//!
//! The sequence is fixed: (1) the version inventory, (2) a connection
//! lifetime on every tier's guards, soaked, then each tier's drain timers
//! held to what its own calls and streams need (`drain`), (3) a data-plane restart to n-1
//! tier by tier, (4) the control plane to n, the point of no return, and (5)
//! a data-plane restart to n tier by tier. Every row's state is derived from
//! what Prometheus holds now and remembers (`drainshim_proxy_info` and
//! `drainshim_guard_max_connection_age_seconds` over `--history`), never
//! from a file this tool wrote: stop at any point, re-run a month later, and
//! the plan still knows where the fleet stands.
//!
//! The module has two halves: [`read`] asks Prometheus for the timelines,
//! and everything after it is a pure function of those timelines, tested
//! without a server.

mod drain;
mod history;
mod next;
mod render;
mod rows;
mod tiers;
mod wave;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use serde::Serialize;

use super::prometheus::PromClient;
use super::timers::TimerRules;
use super::verify::{self, Thresholds, VerifyOptions, VerifySource};
use super::{FleetError, VersionLabel};
use crate::inventory::Release;

pub use drain::{explain_timers, timers_window};
pub use history::{
    read_config_pushes, read_max_age, read_versions, step_for, ConfigPushes, Timelines,
};
use next::wave_window;
pub use next::{estimate_of, Estimate, Next, Verdict};
pub use render::{human, render, when};
pub use rows::{derive, Gate, Rollback, Row, StepKind};
pub use tiers::{parse_tiers, resolve, Tier, TierSpec};
pub use wave::{wave, Edge, Point, State, Versions, Wave};

/// How the next action's commands are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Mesh {
    /// Istio with revisions: namespace labels, then rollout restarts.
    Istio,
    /// A plain Envoy sidecar: rollout restarts once the pod template runs
    /// the new Envoy.
    Envoy,
}

/// What the commands of the next action are written with.
#[derive(Clone, Debug)]
pub struct Commands {
    pub mesh: Mesh,
    /// Istio revision names by minor version ("1.39" -> "1-39-3").
    pub revisions: BTreeMap<(u32, u32), String>,
    /// The max connection age the lifetime step's command suggests.
    pub suggest_max_age: Duration,
    /// How the operator reaches Prometheus.
    pub prometheus_url: String,
}

#[derive(Clone, Debug)]
pub struct PlanOptions {
    pub control_plane: Release,
    pub target: Release,
    pub max_skew: u32,
    pub tiers: Vec<TierSpec>,
    pub version_label: VersionLabel,
    /// A tier with mixed versions and no change for this long is stalled.
    pub stall_after: Duration,
    /// After a tier finished, the next waits this long.
    pub soak: Duration,
    /// How long a tier's guards must have had a max connection age before
    /// its first restart.
    pub lifetime_soak: Duration,
    /// How far back Prometheus is asked.
    pub history: Duration,
    /// Judge as of this moment instead of now.
    pub at: Option<SystemTime>,
    /// How the next action's commands are written.
    pub commands: Commands,
    /// Every wave's verify gates.
    pub thresholds: Thresholds,
    /// How the drain-timers step reads and recommends.
    pub timers: TimerRules,
}

#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    /// When the plan was judged, Unix seconds.
    pub at: f64,
    pub control_plane: String,
    pub intermediate: String,
    pub target: String,
    pub max_skew: u32,
    pub tiers: Vec<Tier>,
    /// Namespaces with proxies that no tier names: they move with no gate.
    pub untiered: Vec<String>,
    pub rows: Vec<Row>,
    pub next: Next,
    pub verdict: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimate: Option<Estimate>,
}

/// How many finished waves are verified at once.
const VERIFY_CONCURRENCY: usize = 2;

/// The wave verdict `plan` needs for a finished tier: `None` when it
/// cannot be judged.
pub type WaveVerify = Option<Result<Vec<verify::Check>, FleetError>>;

/// A finished wave to verify: where, on what, over which window.
#[derive(Clone, Debug, PartialEq)]
pub struct WaveCheck {
    pub namespaces: Vec<String>,
    pub version: String,
    pub window: Duration,
    /// The wave's end, Unix seconds.
    pub end: f64,
}

/// The finished waves by (step, tier index): `None` for a wave that
/// finished before the history, which cannot be verified again.
pub fn waves_to_verify(plan: &Plan) -> Vec<((u8, usize), Option<WaveCheck>)> {
    let mut out = Vec::new();
    let mut index: BTreeMap<u8, usize> = BTreeMap::new();
    for r in plan.rows.iter().filter(|r| r.kind == StepKind::Restart) {
        let k = index.entry(r.step).or_default();
        let key = (r.step, *k);
        *k += 1;
        let version = if r.step == 3 {
            &plan.intermediate
        } else {
            &plan.target
        };
        match (r.finished, wave_window(r)) {
            (Some(Edge::At(end)), Some(window)) => out.push((
                key,
                Some(WaveCheck {
                    namespaces: r.namespaces.clone(),
                    version: version.clone(),
                    window,
                    end,
                }),
            )),
            (Some(Edge::BeforeHistory(_)), _) => out.push((key, None)),
            _ => {}
        }
    }
    out
}

/// Verdicts of `verify` as a gate.
pub fn verify_gate(result: WaveVerify) -> Gate {
    match result {
        None => Gate {
            ok: None,
            detail: "finished before the history Prometheus keeps: not re-verified".into(),
            opens_at: None,
            failed: false,
        },
        Some(Err(e)) => Gate::fails(format!("verify could not run: {e}")),
        Some(Ok(checks)) => {
            let failed: Vec<String> = checks
                .iter()
                .filter(|c| c.ok == Some(false))
                .map(|c| format!("{}: {}", c.check, c.detail))
                .collect();
            if failed.is_empty() {
                Gate::open(format!(
                    "verify PASS ({} checks, {} n/a)",
                    checks.len(),
                    checks.iter().filter(|c| c.ok.is_none()).count()
                ))
            } else {
                Gate::fails(format!("verify FAIL: {}", failed.join("; ")))
            }
        }
    }
}

/// Reads the fleet and derives the plan, verifying every wave that
/// finished inside the history.
pub async fn plan(
    reach: &super::reach::Reach,
    opts: &PlanOptions,
    estimate: bool,
) -> Result<Plan, FleetError> {
    let v =
        Versions::new(opts.control_plane, opts.target, opts.max_skew).map_err(FleetError::Input)?;
    let prom = PromClient::from_reach(reach.clone(), reach.timeout());
    let mut tl = read_versions(&prom, opts).await?;
    if tl.namespaces.is_empty() {
        return Err(FleetError::Empty(format!(
            "Prometheus at {} has no drainshim_proxy_info in the last {}: are the shims scraped?",
            prom.url(),
            human(opts.history)
        )));
    }
    let tiers = resolve(&opts.tiers, &tl.namespaces, opts.history).map_err(FleetError::Input)?;
    // A wave's edges are in the versions alone: its verify runs while the
    // store reads the max age, the other history query.
    let source = VerifySource::Prometheus(Box::new(reach.clone()));
    let early = waves_to_verify(&derive(&tl, &tiers, v, opts, &BTreeMap::new()));
    let end = tl.times.last().copied().unwrap_or_default();
    let (max_age, verified, timers, pushes) = tokio::join!(
        read_max_age(&prom, opts, &tl.times),
        verify_waves(&source, early.clone(), opts),
        drain::read_timers(&prom, opts, &tiers, end),
        read_config_pushes(&prom, opts.history, end),
    );
    tl.max_age = max_age?;
    tl.timers = timers?;
    tl.config_pushes = pushes?;
    let mut verified = verified?;
    // Should the max age change which waves finished, or when, those are
    // verified now.
    let again: Vec<_> = waves_to_verify(&derive(&tl, &tiers, v, opts, &BTreeMap::new()))
        .into_iter()
        .filter(|wave| !early.contains(wave))
        .collect();
    verified.extend(verify_waves(&source, again, opts).await?);
    let mut plan = derive(&tl, &tiers, v, opts, &verified);
    if estimate {
        plan.estimate = Some(estimate_of(&plan, opts));
    }
    Ok(plan)
}

/// Verifies `waves`, two at a time (each asks its queries at once): a
/// store with cores to spare runs them side by side.
async fn verify_waves(
    source: &VerifySource,
    waves: Vec<((u8, usize), Option<WaveCheck>)>,
    opts: &PlanOptions,
) -> Result<BTreeMap<(u8, usize), Gate>, FleetError> {
    let step = opts.step();
    let checks = futures_util::stream::iter(waves)
        .map(|(key, wave)| async move {
            let Some(w) = wave else {
                return (key, None);
            };
            let vo = VerifyOptions {
                namespaces: w.namespaces,
                expect_version: w.version,
                window: w.window + step,
                at: Some(UNIX_EPOCH + Duration::from_secs_f64(w.end) + step),
                thresholds: opts.thresholds.clone(),
            };
            (key, Some(verify::verify(source, &vo).await))
        })
        .buffered(VERIFY_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    let mut verified = BTreeMap::new();
    for (key, result) in checks {
        match result {
            // Unreachable or refused: the plan cannot be read at all.
            Some(Err(FleetError::Prometheus(e)))
                if !matches!(e, super::prometheus::PromError::Query { .. }) =>
            {
                return Err(FleetError::Prometheus(e))
            }
            result => verified.insert(key, verify_gate(result)),
        };
    }
    Ok(verified)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: f64 = 86_400.0;
    const HOUR: f64 = 3600.0;

    fn opts(tiers: usize) -> PlanOptions {
        PlanOptions {
            control_plane: "1.39".parse().unwrap(),
            target: "1.40".parse().unwrap(),
            max_skew: 1,
            tiers: (0..tiers)
                .map(|k| TierSpec {
                    name: format!("tier{k}"),
                    namespaces: vec![format!("ns{k}")],
                    pattern: None,
                })
                .collect(),
            version_label: VersionLabel::Version,
            stall_after: Duration::from_secs(2 * 3600),
            soak: Duration::from_secs(86_400),
            lifetime_soak: Duration::from_secs(7 * 86_400),
            history: Duration::from_secs(90 * 86_400),
            at: None,
            commands: Commands {
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

    /// A fleet seen at `times`: `versions(t)` gives (namespace, version,
    /// proxies) and `max_age(t)` (namespace, seconds).
    fn fleet(
        times: &[f64],
        versions: impl Fn(f64) -> Vec<(&'static str, &'static str, u64)>,
        max_age: impl Fn(f64) -> Vec<(&'static str, f64)>,
    ) -> Timelines {
        let mut tl = Timelines {
            times: times.to_vec(),
            ..Default::default()
        };
        for &t in times {
            let v: BTreeMap<(String, String), u64> = versions(t)
                .into_iter()
                .map(|(ns, v, n)| ((ns.to_string(), v.to_string()), n))
                .collect();
            tl.namespaces.extend(v.keys().map(|(ns, _)| ns.clone()));
            tl.versions.push(v);
            tl.max_age.push(
                max_age(t)
                    .into_iter()
                    .map(|(ns, a)| (ns.to_string(), a))
                    .collect(),
            );
        }
        tl
    }

    fn derived(tl: &Timelines, o: &PlanOptions) -> Plan {
        let v = Versions::new(o.control_plane, o.target, o.max_skew).unwrap();
        let tiers = resolve(&o.tiers, &tl.namespaces, o.history).unwrap();
        derive(tl, &tiers, v, o, &BTreeMap::new())
    }

    #[test]
    fn a_fresh_fleet_starts_with_the_connection_lifetime_and_takes_weeks() {
        let o = opts(4);
        let times: Vec<f64> = (0..10).map(|i| i as f64 * HOUR).collect();
        let all = ["ns0", "ns1", "ns2", "ns3"];
        let tl = fleet(
            &times,
            |_| all.iter().map(|ns| (*ns, "1.38.3", 3)).collect(),
            |_| Vec::new(),
        );
        let mut plan = derived(&tl, &o);
        assert_eq!(plan.verdict, Verdict::Go);
        let next = &plan.rows[plan.next.row.unwrap()];
        assert_eq!(
            (next.kind, next.tier.as_deref()),
            (StepKind::ConnectionLifetime, Some("tier0"))
        );
        assert!(plan.next.commands[0].contains("DRAINSHIM_MAX_CONNECTION_AGE=30m"));
        assert_eq!(plan.rows[0].detail, "12 proxies: 12 on 1.38");
        // Lifetime soak 7d; per restart 4 waves of the assumed 4h plus a day's
        // soak each; the control plane one wave: 16d 12h in all.
        let e = estimate_of(&plan, &o);
        assert_eq!(
            e.remaining_seconds,
            7.0 * DAY + 8.0 * (4.0 * HOUR + DAY) + 4.0 * HOUR
        );
        assert_eq!(e.waves_left, 8);
        plan.estimate = Some(e);
        assert!(
            render(&plan, false).contains("estimate: 16d12h left"),
            "{}",
            render(&plan, false)
        );
    }

    /// One namespace of the second tier relabelled early: a proxy on 1.40
    /// while the control plane runs 1.39. `skew --control-plane 1.39` calls
    /// it a violation, and so does the plan: stop (exit 1), naming it, at
    /// whatever step the fleet is.
    #[test]
    fn a_proxy_outside_the_control_planes_skew_stops_the_plan() {
        let mut o = opts(2);
        o.lifetime_soak = Duration::from_secs(3600);
        let times: Vec<f64> = (0..10).map(|i| i as f64 * HOUR).collect();
        let tl = fleet(
            &times,
            |_| {
                vec![
                    ("ns0", "1.39.3", 2),
                    ("ns1", "1.38.3", 2),
                    ("ns1", "1.40.0", 1),
                ]
            },
            |_| vec![("ns0", 1800.0), ("ns1", 1800.0)],
        );
        let plan = derived(&tl, &o);
        assert_eq!(plan.verdict, Verdict::Stop, "{:?}", plan.next);
        assert_eq!(plan.verdict.exit_code(), 1);
        assert_eq!(plan.next.row, Some(0), "the inventory row: {:?}", plan.next);
        let action = &plan.next.action;
        assert!(
            action.contains("1 proxy is outside the skew of the control plane 1.39"),
            "{action}"
        );
        assert!(
            action.contains("ns1 on 1.40.0: newer than the control plane"),
            "{action}"
        );
        assert!(
            crate::inventory::skew_violation("1.40.0", o.control_plane, o.max_skew).is_some(),
            "skew agrees"
        );

        // Rolled back: the plan goes on (tier 1's restart to 1.39 next).
        let tl = fleet(
            &times,
            |_| vec![("ns0", "1.39.3", 2), ("ns1", "1.38.3", 3)],
            |_| vec![("ns0", 1800.0), ("ns1", 1800.0)],
        );
        let plan = derived(&tl, &o);
        assert_ne!(plan.verdict, Verdict::Stop, "{:?}", plan.next);

        // Two behind, once the control plane moved to 1.40: stop too.
        let mut moved = o.clone();
        moved.control_plane = "1.40".parse().unwrap();
        let plan = derived(&tl, &moved);
        assert_eq!(plan.verdict, Verdict::Stop, "{:?}", plan.next);
        assert!(
            plan.next.action.contains("2 minor versions behind 1.40"),
            "{}",
            plan.next.action
        );
    }

    /// Once the control plane moved, its config push is judged: a stream
    /// it cut stops the plan before step 5; none cut opens the gate and
    /// says what the pushes did.
    #[test]
    fn a_config_push_that_cut_a_stream_stops_the_plan_at_step_4() {
        let mut o = opts(1);
        o.lifetime_soak = Duration::from_secs(3600);
        o.control_plane = "1.40".parse().unwrap();
        let times: Vec<f64> = (0..4).map(|i| i as f64 * HOUR).collect();
        let mut tl = fleet(
            &times,
            |_| vec![("ns0", "1.39.3", 2)],
            |_| vec![("ns0", 1800.0)],
        );
        tl.config_pushes = ConfigPushes {
            drains: 4.0,
            ended: 120.0,
            cut: BTreeMap::new(),
        };
        let plan = derived(&tl, &o);
        let cp = plan
            .rows
            .iter()
            .find(|r| r.kind == StepKind::ControlPlane)
            .unwrap();
        assert_eq!(cp.gate.ok, Some(true), "{:?}", cp.gate);
        assert!(
            cp.gate.detail.contains(
                "config pushes cut no stream (4 listener drains, 120 streams ended gracefully)"
            ),
            "{}",
            cp.gate.detail
        );
        assert_ne!(plan.verdict, Verdict::Stop);

        tl.config_pushes.cut = [
            ("ns0".to_string(), 3.0),
            ("instance 10.0.0.7:15020".to_string(), 1.0),
        ]
        .into();
        let plan = derived(&tl, &o);
        assert_eq!(plan.verdict, Verdict::Stop, "{:?}", plan.next);
        let cp = plan
            .rows
            .iter()
            .find(|r| r.kind == StepKind::ControlPlane)
            .unwrap();
        assert!(cp.gate.failed);
        assert!(
            cp.gate
                .detail
                .contains("config pushes cut 4 streams in the last")
                && cp.gate.detail.contains("ns0 3"),
            "{}",
            cp.gate.detail
        );
    }

    #[test]
    fn a_wave_before_the_history_is_done_but_not_verified_again() {
        let mut o = opts(2);
        o.lifetime_soak = Duration::from_secs(3600);
        let times: Vec<f64> = (0..10).map(|i| i as f64 * HOUR).collect();
        // Tier 0 was on 1.39 before the history began; tier 1 moves at 5h.
        let tl = fleet(
            &times,
            |t| {
                vec![
                    ("ns0", "1.39.3", 2),
                    ("ns1", if t >= 5.0 * HOUR { "1.39.3" } else { "1.38.3" }, 2),
                ]
            },
            |_| vec![("ns0", 1800.0), ("ns1", 1800.0)],
        );
        let mut verified = BTreeMap::new();
        let first = derived(&tl, &o);
        for (key, wave) in waves_to_verify(&first) {
            // Only tier 1 (inside the history) is verified; tier 0 is not.
            assert_eq!(wave.is_some(), key == (3, 1), "{key:?}");
            verified.insert(key, verify_gate(wave.map(|_| Ok(Vec::new()))));
        }
        let v = Versions::new(o.control_plane, o.target, o.max_skew).unwrap();
        let tiers = resolve(&o.tiers, &tl.namespaces, o.history).unwrap();
        let plan = derive(&tl, &tiers, v, &o, &verified);
        // Inventory, two lifetimes, two drain timers, then step 3.
        let t0 = &plan.rows[5];
        assert_eq!(t0.state, State::Done);
        assert!(matches!(t0.finished, Some(Edge::BeforeHistory(_))));
        assert!(t0
            .verify
            .as_ref()
            .unwrap()
            .detail
            .contains("not re-verified"));
        assert_eq!(plan.rows[6].state, State::Verified);
        // Tier 1 finished at 5h, the last step is 9h: the control plane's
        // soak of a day still runs.
        assert_eq!(plan.verdict, Verdict::Wait);
        assert_eq!(plan.next.not_before, Some(5.0 * HOUR + DAY));
    }

    #[test]
    fn commands_follow_the_mesh_and_its_revision_names() {
        let mut o = opts(1);
        o.lifetime_soak = Duration::from_secs(3600);
        let times: Vec<f64> = (0..4).map(|i| i as f64 * HOUR).collect();
        let tl = fleet(
            &times,
            |_| vec![("ns0", "1.38.3", 2)],
            |_| vec![("ns0", 1800.0)],
        );
        o.commands.revisions.insert((1, 39), "1-39-3".into());
        let plan = derived(&tl, &o);
        assert_eq!(plan.verdict, Verdict::Go);
        assert_eq!(
            plan.next.commands[..2],
            [
                "kubectl label namespace ns0 istio.io/rev=1-39-3 --overwrite".to_string(),
                "kubectl -n ns0 rollout restart deployment,statefulset,daemonset".to_string(),
            ]
        );
        o.commands.mesh = Mesh::Envoy;
        let plan = derived(&tl, &o);
        assert!(plan.next.commands[0].contains("ns0: set the pod templates' Envoy image to 1.39"));
        assert!(plan.next.commands[1].contains("rollout restart"));
    }
}
