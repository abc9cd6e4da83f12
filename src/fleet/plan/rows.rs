//! The plan's rows: every step and tier with its state, gate and rollback.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::next::next_action;
use super::render::{edge_text, human, span, when};
use super::wave::{lifetime_since, mm, tier_points};
use super::{wave, Edge, Plan, PlanOptions, State, Tier, Timelines, Versions};
use crate::inventory::{skew_violation, Release};

/// A gate: `ok` true (open), false (closed: a failure or a wait), or null
/// (nothing to judge yet); `until` when it opens by itself.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Gate {
    pub ok: Option<bool>,
    pub detail: String,
    /// The gate opens by itself at this time (a soak): Unix seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opens_at: Option<f64>,
    /// The gate is closed because something failed (exit 1), not because it
    /// waits.
    pub failed: bool,
}

impl Gate {
    pub(super) fn open(detail: impl Into<String>) -> Self {
        Self {
            ok: Some(true),
            detail: detail.into(),
            opens_at: None,
            failed: false,
        }
    }
    pub(super) fn waits(detail: impl Into<String>, opens_at: Option<f64>) -> Self {
        Self {
            ok: Some(false),
            detail: detail.into(),
            opens_at,
            failed: false,
        }
    }
    pub(super) fn fails(detail: impl Into<String>) -> Self {
        Self {
            ok: Some(false),
            detail: detail.into(),
            opens_at: None,
            failed: true,
        }
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Rollback {
    /// Whether rolling back is still possible.
    pub possible: Option<bool>,
    pub how: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    Inventory,
    ConnectionLifetime,
    /// Step 2's second half: every pod's drain timers at or above what its
    /// service's calls and streams need.
    DrainTimers,
    Restart,
    ControlPlane,
}

/// One row of the plan.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// 1 to 5, the sequence's step.
    pub step: u8,
    pub kind: StepKind,
    /// What the step does, e.g. "restart 1.38 -> 1.39".
    pub what: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    pub namespaces: Vec<String>,
    pub state: State,
    /// What the state is, in words: "3 of 4 pods on 1.39", "soaking since".
    pub detail: String,
    /// Proxies moved, and in all (restart rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moved: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pods: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started: Option<Edge>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished: Option<Edge>,
    /// The wave's `verify`, once it finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<Gate>,
    /// Whether this row may start (or go on) now.
    pub gate: Gate,
    pub rollback: Rollback,
    /// The changes that open a failed gate (the drain timers' manifests).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fixes: Vec<String>,
}

impl Row {
    pub fn finished_ok(&self) -> bool {
        matches!(self.state, State::Done | State::Verified)
            && self.verify.as_ref().is_none_or(|v| !v.failed)
    }
}

/// Derives the plan from the timelines. `verified` holds the verify
/// verdicts of the waves that finished, by (step, tier index): see
/// [`super::plan`], which asks for them.
pub fn derive(
    tl: &Timelines,
    tiers: &[Tier],
    v: Versions,
    opts: &PlanOptions,
    verified: &BTreeMap<(u8, usize), Gate>,
) -> Plan {
    let d = Derivation {
        tl,
        tiers,
        v,
        opts,
        verified,
        now: tl.times.last().copied().unwrap_or_default(),
        current: tl.versions.last().cloned().unwrap_or_default(),
    };
    let mut rows = vec![d.inventory()];
    rows.extend(tiers.iter().map(|t| d.lifetime(t)));
    for k in 0..tiers.len() {
        let r = d.drain_timers(k, &rows);
        rows.push(r);
    }
    d.restarts(3, v.intermediate, &mut rows, &|k, rows| {
        d.after_lifetime(k, rows)
    });
    let cp = d.control_plane(&rows);
    rows.push(cp);
    d.restarts(5, v.target, &mut rows, &|_, _| {
        if v.moved() {
            Gate::open("may start now")
        } else {
            Gate::waits("waits for step 4 (the control plane)", None)
        }
    });

    let (next, verdict) = next_action(&rows, opts, v, d.now);
    let untiered: BTreeSet<String> = d
        .current
        .keys()
        .map(|(ns, _)| ns.clone())
        .filter(|ns| !tiers.iter().any(|t| t.namespaces.binary_search(ns).is_ok()))
        .collect();
    Plan {
        at: d.now,
        control_plane: mm(v.control_plane),
        intermediate: mm(v.intermediate),
        target: mm(v.target),
        max_skew: v.max_skew,
        tiers: tiers.to_vec(),
        untiered: untiered.into_iter().collect(),
        rows,
        next,
        verdict,
        estimate: None,
    }
}

/// What every row is derived from.
struct Derivation<'a> {
    tl: &'a Timelines,
    tiers: &'a [Tier],
    v: Versions,
    opts: &'a PlanOptions,
    verified: &'a BTreeMap<(u8, usize), Gate>,
    /// The last step's time.
    now: f64,
    /// (namespace, version) -> proxies at the last step.
    current: BTreeMap<(String, String), u64>,
}

impl Derivation<'_> {
    fn row(&self, step: u8, kind: StepKind, what: String, tier: Option<&Tier>) -> Row {
        Row {
            step,
            kind,
            what,
            tier: tier.map(|t| t.name.clone()),
            namespaces: tier.map(|t| t.namespaces.clone()).unwrap_or_default(),
            state: State::NotStarted,
            detail: String::new(),
            moved: None,
            pods: None,
            started: None,
            finished: None,
            verify: None,
            gate: Gate::open(""),
            rollback: Rollback {
                possible: None,
                how: "-".into(),
            },
            fixes: Vec::new(),
        }
    }

    /// Step 1: every proxy reports its version.
    fn inventory(&self) -> Row {
        let proxies: u64 = self.current.values().sum();
        let mut spread: BTreeMap<String, u64> = BTreeMap::new();
        for ((_, ver), n) in &self.current {
            let minor = ver.parse::<Release>().map(mm);
            *spread
                .entry(minor.unwrap_or_else(|_| "unknown".into()))
                .or_default() += n;
        }
        let unknown = spread.get("unknown").copied().unwrap_or(0);
        let mut r = self.row(1, StepKind::Inventory, "version inventory".into(), None);
        r.pods = Some(proxies);
        r.detail = if proxies == 0 {
            "no proxy reports a version now".into()
        } else {
            let spread: Vec<String> = spread.iter().map(|(v, n)| format!("{n} on {v}")).collect();
            format!("{proxies} proxies: {}", spread.join(", "))
        };
        (r.state, r.gate) = if proxies == 0 {
            (
                State::NotStarted,
                Gate::fails("no proxy reports a version: are the shims scraped?"),
            )
        } else if unknown > 0 {
            (
                State::NotStarted,
                Gate::fails(format!("{unknown} proxies report no version")),
            )
        } else if let Some(offenders) = self.outside_skew() {
            (State::Done, Gate::fails(offenders))
        } else {
            (State::Done, Gate::open("every proxy reports its version"))
        };
        r
    }

    /// The proxies outside the skew the control plane supports now (the
    /// `--control-plane` it runs, whatever the target), named by namespace
    /// and version, as `skew` names them; None when there are none. A proxy
    /// ahead of the control plane (a namespace relabelled early) or too far
    /// behind it is unsupported at every step, not only at the point of no
    /// return.
    fn outside_skew(&self) -> Option<String> {
        const NAMED: usize = 10;
        let (cp, skew) = (self.v.control_plane, self.v.max_skew);
        let offenders: Vec<(String, u64)> = self
            .current
            .iter()
            .filter(|((_, ver), n)| **n > 0 && ver.parse::<Release>().is_ok())
            .filter_map(|((ns, ver), n)| {
                skew_violation(ver, cp, skew).map(|why| (format!("{ns} on {ver}: {why}"), *n))
            })
            .collect();
        if offenders.is_empty() {
            return None;
        }
        let total: u64 = offenders.iter().map(|(_, n)| n).sum();
        let mut named: Vec<String> = offenders
            .iter()
            .take(NAMED)
            .map(|(what, n)| format!("{n} in {what}"))
            .collect();
        if offenders.len() > NAMED {
            named.push(format!("and {} more namespaces", offenders.len() - NAMED));
        }
        let (proxies, are) = if total == 1 {
            ("proxy", "is")
        } else {
            ("proxies", "are")
        };
        Some(format!(
            "{total} {proxies} {are} outside the skew of the control plane {} (at most {skew} minor behind, never ahead): {}; \
             roll back or move the control plane first (drainshim skew --control-plane {} lists each)",
            mm(cp),
            named.join("; "),
            mm(cp)
        ))
    }

    /// Step 2 for a tier: every guard has a max connection age, for
    /// --lifetime-soak.
    fn lifetime(&self, tier: &Tier) -> Row {
        let soak = self.opts.lifetime_soak;
        let mut r = self.row(
            2,
            StepKind::ConnectionLifetime,
            format!("connection lifetime, soak {}", human(soak)),
            Some(tier),
        );
        r.rollback = Rollback {
            possible: Some(true),
            how: "unset the max age".into(),
        };
        let Some((since, age)) = lifetime_since(self.tl, tier) else {
            r.detail = "a guard has no max connection age".into();
            return r;
        };
        let soaked_at = since.time() + soak.as_secs_f64();
        r.detail = format!("max age {} since {}", span(age), edge_text(since));
        if self.now >= soaked_at {
            r.state = State::Done;
        } else {
            r.state = State::InProgress;
            r.gate = Gate::waits(format!("soaks until {}", when(soaked_at)), Some(soaked_at));
        }
        r
    }

    /// Step 2's drain timers for tier `k`: see [`super::drain::row`].
    fn drain_timers(&self, k: usize, rows: &[Row]) -> Row {
        let tier = &self.tiers[k];
        let base = self.row(2, StepKind::DrainTimers, "drain timers".into(), Some(tier));
        super::drain::row(base, tier, &rows[1 + k], &self.tl.timers)
    }

    /// The first restart's gate for tier `k`: the inventory, and the
    /// tier's connection lifetime soaked.
    fn after_lifetime(&self, k: usize, rows: &[Row]) -> Gate {
        if rows[0].gate.failed {
            return Gate::fails(format!("step 1: {}", rows[0].gate.detail));
        }
        let lifetime = &rows[1 + k];
        let timers = &rows[1 + self.tiers.len() + k];
        match lifetime.state {
            State::Done if timers.gate.failed => {
                Gate::fails(format!("step 2, drain timers: {}", timers.gate.detail))
            }
            State::Done => Gate::open("may start now"),
            State::InProgress => Gate::waits(
                format!("step 2 {}", lifetime.gate.detail),
                lifetime.gate.opens_at,
            ),
            _ => Gate::waits("waits for step 2: a max connection age on its guards", None),
        }
    }

    /// Steps 3 and 5: a restart to `to`, one row per tier. The first tier's
    /// gate is `first`; every other tier waits for the one before to
    /// finish, pass verify and soak, then takes `first` too.
    fn restarts(
        &self,
        step: u8,
        to: Release,
        rows: &mut Vec<Row>,
        first: &dyn Fn(usize, &[Row]) -> Gate,
    ) {
        let start = rows.len();
        for (k, tier) in self.tiers.iter().enumerate() {
            let w = wave(
                &tier_points(self.tl, tier, to),
                self.opts.stall_after.as_secs_f64(),
            );
            let mut r = self.row(
                step,
                StepKind::Restart,
                format!("restart to {}", mm(to)),
                Some(tier),
            );
            r.rollback = self.restart_rollback(step);
            (r.moved, r.pods, r.started, r.finished) =
                (Some(w.moved), Some(w.total), w.started, w.finished);
            r.state = w.state;
            let on = format!("{} of {} on {}", w.moved, w.total, mm(to));
            r.detail = match w.state {
                State::NotStarted => on,
                State::InProgress => format!(
                    "{on}, since {}",
                    w.started.map(edge_text).unwrap_or_default()
                ),
                State::Stalled => format!(
                    "{on}, no change since {}",
                    w.unchanged_since.map(edge_text).unwrap_or_default()
                ),
                _ => format!(
                    "{on}, finished {}",
                    w.finished.map(edge_text).unwrap_or_default()
                ),
            };
            if w.state == State::Done {
                let verdict = self.verified.get(&(step, k)).cloned().unwrap_or(Gate {
                    ok: None,
                    detail: "not verified".into(),
                    opens_at: None,
                    failed: false,
                });
                if verdict.ok == Some(true) {
                    r.state = State::Verified;
                }
                r.verify = Some(verdict);
            }
            r.gate = if w.state == State::Stalled {
                Gate::fails(format!(
                    "stalled: mixed versions, no change for {}",
                    human(self.opts.stall_after)
                ))
            } else if k == 0 {
                first(k, rows)
            } else {
                self.after_tier(&rows[start + k - 1])
                    .unwrap_or_else(|| first(k, rows))
            };
            rows.push(r);
        }
    }

    /// The gate a tier's restart waits at behind the tier before it: `None`
    /// once that tier finished, passed verify and soaked.
    fn after_tier(&self, before: &Row) -> Option<Gate> {
        let name = before.tier.as_deref().unwrap_or_default();
        if before.verify.as_ref().is_some_and(|v| v.failed) {
            return Some(Gate::fails(format!("tier {name} failed verify")));
        }
        if !before.finished_ok() {
            return Some(Gate::waits(format!("waits for tier {name}"), None));
        }
        let Some(Edge::At(done)) = before.finished else {
            return None;
        };
        let opens = done + self.opts.soak.as_secs_f64();
        (self.now < opens).then(|| {
            Gate::waits(
                format!("one tier a day: {name} soaks until {}", when(opens)),
                Some(opens),
            )
        })
    }

    fn restart_rollback(&self, step: u8) -> Rollback {
        let v = self.v;
        match step {
            3 if v.moved() => Rollback {
                possible: Some(false),
                how: format!(
                    "gone: older than {} is outside the skew of {}",
                    mm(v.intermediate),
                    mm(v.control_plane)
                ),
            },
            3 => Rollback {
                possible: Some(true),
                how: "restart to the old version, until step 4".into(),
            },
            _ => Rollback {
                possible: Some(true),
                how: format!("restart to {}", mm(v.intermediate)),
            },
        }
    }

    /// Proxies now outside the skew of `cp`, and where ("ns on version").
    fn outside(&self, cp: Release) -> (u64, Vec<String>) {
        let mut n = 0;
        let mut which = BTreeSet::new();
        for ((ns, ver), count) in &self.current {
            if skew_violation(ver, cp, self.v.max_skew).is_some() {
                n += count;
                which.insert(format!("{ns} on {ver}"));
            }
        }
        (n, which.into_iter().collect())
    }

    /// Step 4: the control plane to the target, the point of no return.
    /// It waits for every tier of step 3 (finished, verified, soaked) and
    /// for every proxy within the skew of the target.
    fn control_plane(&self, rows: &[Row]) -> Row {
        let (v, now) = (self.v, self.now);
        let (t, c) = (v.target, v.control_plane);
        let (outside, which) = self.outside(t);
        let skew = if outside == 0 {
            format!("skew: all within {} of {}", v.max_skew, mm(t))
        } else {
            format!(
                "skew: {outside} outside {} of {}: {}",
                v.max_skew,
                mm(t),
                which.join(", ")
            )
        };
        let what = if v.moved() {
            format!("control plane to {} (no return)", mm(t))
        } else {
            format!("control plane {} to {} (no return)", mm(c), mm(t))
        };
        let mut r = self.row(4, StepKind::ControlPlane, what, None);
        r.detail = format!("runs {}; {skew}", mm(c));
        if v.moved() {
            r.state = State::Done;
            r.rollback = Rollback {
                possible: Some(false),
                how: "gone: the point of no return is behind".into(),
            };
            let pushes = &self.tl.config_pushes;
            let cut = pushes.cut_total();
            r.gate = if outside > 0 {
                Gate::fails(format!("unsupported proxies: {skew}"))
            } else if cut >= 0.5 {
                let places: Vec<String> = pushes
                    .cut
                    .iter()
                    .map(|(at, n)| format!("{at} {n:.0}"))
                    .collect();
                Gate::fails(format!(
                    "config pushes cut {cut:.0} streams in the last {}: {}. The control plane's new \
                     listeners drain on every proxy; a cut one means the guard could not end a \
                     stream before Envoy closed its connection (the guards' logs name each; \
                     docs/troubleshooting: \"a config push cut streams\"); {skew}",
                    human(self.opts.history),
                    places.join(", ")
                ))
            } else {
                Gate::open(format!(
                    "config pushes cut no stream ({:.0} listener drains, {:.0} streams ended gracefully); {skew}",
                    pushes.drains, pushes.ended
                ))
            };
            return r;
        }
        r.rollback = Rollback {
            possible: Some(true),
            how: "none once it moves".into(),
        };
        let first = rows.iter().filter(|r| r.step == 3);
        let last_done = first
            .clone()
            .filter_map(|r| match r.finished {
                Some(Edge::At(t)) => Some(t),
                _ => None,
            })
            .fold(f64::NEG_INFINITY, f64::max);
        let opens = last_done + self.opts.soak.as_secs_f64();
        r.gate = if let Some(f) = first
            .clone()
            .find(|r| r.gate.failed || r.verify.as_ref().is_some_and(|g| g.failed))
        {
            let why = f
                .verify
                .as_ref()
                .filter(|g| g.failed)
                .map_or(&f.gate.detail, |g| &g.detail);
            Gate::fails(format!(
                "step 3, tier {}: {why}",
                f.tier.as_deref().unwrap_or_default()
            ))
        } else if let Some(w) = first.clone().find(|r| !r.finished_ok()) {
            Gate::waits(
                format!(
                    "waits for step 3, tier {}",
                    w.tier.as_deref().unwrap_or_default()
                ),
                None,
            )
        } else if outside > 0 {
            Gate::waits(skew, None)
        } else if last_done.is_finite() && now < opens {
            Gate::waits(format!("soaks until {}; {skew}", when(opens)), Some(opens))
        } else {
            Gate::open(format!("may start now; {skew}"))
        };
        r
    }
}
