//! The next action, the verdict, and the estimate of the time left.

use std::time::Duration;

use serde::Serialize;

use super::render::when;
use super::wave::mm;
use super::{human, Edge, Mesh, Plan, PlanOptions, Row, State, StepKind, Versions};
use crate::inventory::Release;

/// What the operator does next.
#[derive(Clone, Debug, Serialize)]
pub struct Next {
    /// The row it concerns (an index into `rows`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub row: Option<usize>,
    pub action: String,
    pub commands: Vec<String>,
    /// When it may start: Unix seconds; now or later.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_before: Option<f64>,
}

/// The plan's verdict, and its exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The next step may go (0).
    Go,
    /// Every step is done (0).
    Done,
    /// Nothing may go before a soak ends (75).
    Wait,
    /// A gate failed or a tier is stalled (1).
    Stop,
}

impl Verdict {
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Go | Verdict::Done => 0,
            Verdict::Wait => 75,
            Verdict::Stop => 1,
        }
    }
}

/// The next action, and the verdict.
pub(super) fn next_action(
    rows: &[Row],
    opts: &PlanOptions,
    v: Versions,
    now: f64,
) -> (Next, Verdict) {
    let rerun = "then re-run drainshim plan with the same flags".to_string();
    // A failure anywhere stops the plan.
    if let Some((k, r)) = rows.iter().enumerate().find(|(_, r)| {
        r.state == State::Stalled
            || r.verify.as_ref().is_some_and(|g| g.failed)
            || (r.gate.failed && r.kind == StepKind::ControlPlane && v.moved())
            || (r.gate.failed && r.kind == StepKind::Inventory)
            || (r.gate.failed && r.kind == StepKind::DrainTimers)
    }) {
        let tier = r.tier.clone().unwrap_or_default();
        let ns = r.namespaces.join(",");
        let (action, commands) = if r.state == State::Stalled {
            (
                format!("stop: tier {tier} is stalled ({}); finish or roll back its restart", r.detail),
                vec![format!(
                    "drainshim inventory --prometheus {} -o json   # the pods of {ns} left on the old version",
                    opts.commands.prometheus_url
                )],
            )
        } else if let Some(g) = r.verify.as_ref().filter(|g| g.failed) {
            let to = mm(if r.step == 3 {
                v.intermediate
            } else {
                v.target
            });
            let at = r.finished.map(|e| when(e.time())).unwrap_or_default();
            (
                format!(
                    "stop: tier {tier}'s wave failed verify ({}); find why, then fix forward or roll back ({})",
                    g.detail, r.rollback.how
                ),
                vec![format!(
                    "drainshim verify --prometheus {} --namespace {ns} --expect-version {to} --at {at} --window {}",
                    opts.commands.prometheus_url,
                    wave_window(r).map_or("10m".into(), human)
                )],
            )
        } else if r.kind == StepKind::DrainTimers {
            (
                format!("stop: tier {tier}'s drain timers: {}", r.gate.detail),
                r.fixes.clone(),
            )
        } else {
            (format!("stop: {}", r.gate.detail), Vec::new())
        };
        return (
            Next {
                row: Some(k),
                action,
                commands,
                not_before: None,
            },
            Verdict::Stop,
        );
    }
    // The first row that may go on or start now.
    for (k, r) in rows.iter().enumerate() {
        if r.finished_ok() {
            continue;
        }
        let go_on = r.state == State::InProgress && r.kind == StepKind::Restart;
        if !(go_on || (r.state == State::NotStarted && r.gate.ok == Some(true))) {
            continue;
        }
        let (action, commands) = commands_for(r, opts, v, go_on);
        let mut commands = commands;
        commands.push(format!("# {rerun}"));
        return (
            Next {
                row: Some(k),
                action,
                commands,
                not_before: Some(now),
            },
            Verdict::Go,
        );
    }
    if rows.iter().all(Row::finished_ok) {
        return (
            Next {
                row: None,
                action: format!(
                    "done: every proxy runs {} and the control plane too",
                    mm(v.target)
                ),
                commands: Vec::new(),
                not_before: None,
            },
            Verdict::Done,
        );
    }
    // Nothing may go now: the earliest soak, or what everything waits for.
    let waiting = rows
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.finished_ok())
        .filter_map(|(k, r)| r.gate.opens_at.map(|t| (k, t)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    match waiting {
        Some((k, t)) => (
            Next {
                row: Some(k),
                action: format!(
                    "wait: {} ({})",
                    rows[k].gate.detail,
                    rows[k]
                        .tier
                        .as_deref()
                        .map_or_else(|| rows[k].what.clone(), |t| format!("tier {t}"))
                ),
                commands: vec![format!("# {rerun} after {}", when(t))],
                not_before: Some(t),
            },
            Verdict::Wait,
        ),
        None => {
            // Not every row is done (checked above), so there is one.
            let blocked = rows.iter().enumerate().find(|(_, r)| !r.finished_ok());
            (
                Next {
                    row: blocked.map(|(k, _)| k),
                    action: format!(
                        "stop: {}",
                        blocked.map_or("no step may go", |(_, r)| r.gate.detail.as_str())
                    ),
                    commands: Vec::new(),
                    not_before: None,
                },
                Verdict::Stop,
            )
        }
    }
}

/// The window a finished wave is verified over: its start to its end.
pub(super) fn wave_window(r: &Row) -> Option<Duration> {
    match (r.started, r.finished) {
        (Some(s), Some(Edge::At(f))) => Some(Duration::from_secs_f64((f - s.time()).max(1.0))),
        _ => None,
    }
}

fn revision(opts: &PlanOptions, r: Release) -> String {
    opts.commands
        .revisions
        .get(&(r.major, r.minor))
        .cloned()
        .unwrap_or_else(|| format!("{}-{}", r.major, r.minor))
}

fn commands_for(r: &Row, opts: &PlanOptions, v: Versions, go_on: bool) -> (String, Vec<String>) {
    let tier = r.tier.clone().unwrap_or_default();
    match r.kind {
        StepKind::Inventory => ("publish the inventory".into(), Vec::new()),
        StepKind::DrainTimers => (
            format!("step 2, tier {tier}: set the drain timers"),
            r.fixes.clone(),
        ),
        StepKind::ConnectionLifetime => (
            format!(
                "step 2, tier {tier}: give its guards a max connection age, then let it soak {}",
                human(opts.lifetime_soak)
            ),
            r.namespaces
                .iter()
                .map(|ns| {
                    format!(
                        "kubectl -n {ns} set env deployment,statefulset --all -c drainshim DRAINSHIM_MAX_CONNECTION_AGE={}",
                        human(opts.commands.suggest_max_age)
                    )
                })
                .collect(),
        ),
        StepKind::Restart => {
            let to = if r.step == 3 { v.intermediate } else { v.target };
            let verb = if go_on { "go on with" } else { "start" };
            let mut cmds = Vec::new();
            for ns in &r.namespaces {
                match opts.commands.mesh {
                    Mesh::Istio => cmds.push(format!(
                        "kubectl label namespace {ns} istio.io/rev={} --overwrite",
                        revision(opts, to)
                    )),
                    Mesh::Envoy => cmds.push(format!(
                        "# {ns}: set the pod templates' Envoy image to {} first",
                        mm(to)
                    )),
                }
                cmds.push(format!(
                    "kubectl -n {ns} rollout restart deployment,statefulset,daemonset"
                ));
            }
            (
                format!("step {}, tier {tier}: {verb} the restart to {}", r.step, mm(to)),
                cmds,
            )
        }
        StepKind::ControlPlane => (
            format!(
                "step 4: move the control plane to {}, the point of no return",
                mm(v.target)
            ),
            match opts.commands.mesh {
                Mesh::Istio => vec![format!(
                    "istioctl install --set revision={} --set profile=default",
                    revision(opts, v.target)
                )],
                Mesh::Envoy => vec![format!(
                    "# move the control plane to {} with its own upgrade procedure, then run plan with --control-plane {}",
                    mm(v.target),
                    mm(v.target)
                )],
            },
        ),
    }
}

/// The elapsed time left, from the soak rules and the pace so far.
#[derive(Clone, Debug, Serialize)]
pub struct Estimate {
    /// Seconds left, in all.
    pub remaining_seconds: f64,
    /// Mean duration of the waves finished inside the history (seconds),
    /// or the assumption used when none has.
    pub wave_seconds: f64,
    pub waves_measured: usize,
    pub waves_left: usize,
    /// Where it goes: (what, seconds).
    pub parts: Vec<(String, f64)>,
}

/// Assumed wave duration when none finished inside the history.
const ASSUMED_WAVE: Duration = Duration::from_secs(4 * 3600);

/// The elapsed time left: every wave not done takes the measured pace
/// (or the assumption), each tier after the first in a restart waits the
/// soak, the control plane waits the soak after the last tier, and the
/// lifetime soak runs first.
pub fn estimate_of(plan: &Plan, opts: &PlanOptions) -> Estimate {
    let measured: Vec<f64> = plan
        .rows
        .iter()
        .filter(|r| r.kind == StepKind::Restart)
        .filter_map(|r| match (r.started, r.finished) {
            (Some(Edge::At(s)), Some(Edge::At(f))) => Some(f - s),
            _ => None,
        })
        .collect();
    let pace = if measured.is_empty() {
        ASSUMED_WAVE.as_secs_f64()
    } else {
        measured.iter().sum::<f64>() / measured.len() as f64
    };
    let soak = opts.soak.as_secs_f64();
    let now = plan.at;
    let mut parts = Vec::new();
    // The lifetime soak: until the last tier's soak ends.
    let lifetime_left = plan
        .rows
        .iter()
        .filter(|r| r.kind == StepKind::ConnectionLifetime && !r.finished_ok())
        .map(|r| match r.gate.opens_at {
            Some(t) => (t - now).max(0.0),
            None => opts.lifetime_soak.as_secs_f64(),
        })
        .fold(0.0, f64::max);
    if lifetime_left > 0.0 {
        parts.push(("connection lifetime soak".to_string(), lifetime_left));
    }
    let mut waves_left = 0;
    for step in [3u8, 5] {
        let left: Vec<&Row> = plan
            .rows
            .iter()
            .filter(|r| r.step == step && !r.finished_ok())
            .collect();
        if left.is_empty() {
            continue;
        }
        waves_left += left.len();
        let mut secs = 0.0;
        for r in &left {
            let done_share = match (r.moved, r.pods) {
                (Some(m), Some(p)) if p > 0 => m as f64 / p as f64,
                _ => 0.0,
            };
            secs += pace * (1.0 - done_share);
        }
        // A soak between tiers, and one after the last before the next step.
        secs += soak * left.len() as f64;
        parts.push((format!("step {step}: {} tiers", left.len()), secs));
    }
    if plan
        .rows
        .iter()
        .any(|r| r.kind == StepKind::ControlPlane && !r.finished_ok())
    {
        parts.push(("step 4: control plane".to_string(), pace));
    }
    Estimate {
        remaining_seconds: parts.iter().map(|(_, s)| s).sum(),
        wave_seconds: pace,
        waves_measured: measured.len(),
        waves_left,
        parts,
    }
}
