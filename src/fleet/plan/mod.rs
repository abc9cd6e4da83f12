//! `plan`: the whole migration from mesh version n-2 to n as a plan the
//! fleet itself reports.
//!
//! The sequence is fixed: (1) the version inventory, (2) a connection
//! lifetime on every tier's guards, soaked, (3) a data-plane restart to n-1
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

mod history;
mod next;
mod render;
mod rows;
mod tiers;
mod wave;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::prometheus::PromClient;
use super::verify::{self, Thresholds, VerifyOptions, VerifySource};
use super::{FleetError, VersionLabel, CALL_TIMEOUT};
use crate::inventory::Release;

pub use history::{read, step_for, Timelines};
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
    pub mesh: Mesh,
    /// Istio revision names by minor version ("1.39" -> "1-39-3").
    pub revisions: BTreeMap<(u32, u32), String>,
    /// The max connection age the lifetime step's command suggests.
    pub suggest_max_age: Duration,
    /// Every wave's verify gates.
    pub thresholds: Thresholds,
    /// For the commands printed: how the operator reaches Prometheus.
    pub prometheus_url: String,
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

/// The wave verdict `plan` needs for a finished tier: `None` when it
/// cannot be judged.
pub type WaveVerify = Option<Result<Vec<verify::Check>, FleetError>>;

/// A finished wave to verify: where, on what, over which window.
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
    let prom = PromClient::from_reach(reach.clone(), CALL_TIMEOUT);
    let tl = read(&prom, opts).await?;
    if tl.namespaces.is_empty() {
        return Err(FleetError::Empty(format!(
            "Prometheus at {} has no drainshim_proxy_info in the last {}: are the shims scraped?",
            prom.url(),
            human(opts.history)
        )));
    }
    let tiers = resolve(&opts.tiers, &tl.namespaces, opts.history).map_err(FleetError::Input)?;
    let first = derive(&tl, &tiers, v, opts, &BTreeMap::new());
    let step = opts.step();
    let mut verified = BTreeMap::new();
    for (key, wave) in waves_to_verify(&first) {
        let Some(w) = wave else {
            verified.insert(key, verify_gate(None));
            continue;
        };
        let vo = VerifyOptions {
            namespaces: w.namespaces,
            expect_version: w.version,
            window: w.window + step,
            at: Some(UNIX_EPOCH + Duration::from_secs_f64(w.end) + step),
            thresholds: opts.thresholds.clone(),
        };
        let source = VerifySource::Prometheus(Box::new(reach.clone()));
        match verify::verify(&source, &vo).await {
            // Unreachable or refused: the plan cannot be read at all.
            Err(FleetError::Prometheus(e))
                if !matches!(e, super::prometheus::PromError::Query { .. }) =>
            {
                return Err(FleetError::Prometheus(e))
            }
            result => verified.insert(key, verify_gate(Some(result))),
        };
    }
    let mut plan = derive(&tl, &tiers, v, opts, &verified);
    if estimate {
        plan.estimate = Some(estimate_of(&plan, opts));
    }
    Ok(plan)
}
