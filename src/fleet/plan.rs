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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::prometheus::PromClient;
use super::verify::{self, Thresholds, VerifyOptions, VerifySource};
use super::{table, FleetError, VersionLabel, CALL_TIMEOUT};
use crate::inventory::{skew_violation, Release};

/// A tier of the tiers file: its name and namespaces, in rollout order.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TierSpec {
    pub name: String,
    /// Namespaces by name.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Namespaces by regular expression, matched whole against the
    /// namespaces Prometheus has seen.
    #[serde(default)]
    pub pattern: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TiersFile {
    tier: Vec<TierSpec>,
}

/// Parses a tiers file (TOML, `[[tier]]` tables in rollout order).
pub fn parse_tiers(text: &str) -> Result<Vec<TierSpec>, String> {
    let file: TiersFile = toml::from_str(text).map_err(|e| e.to_string())?;
    if file.tier.is_empty() {
        return Err("no [[tier]] in the file".into());
    }
    let mut names = BTreeSet::new();
    for t in &file.tier {
        if t.name.trim().is_empty() {
            return Err("a tier has an empty name".into());
        }
        if !names.insert(&t.name) {
            return Err(format!("tier {:?} is named twice", t.name));
        }
        if t.namespaces.is_empty() && t.pattern.is_none() {
            return Err(format!(
                "tier {:?} names no namespaces and no pattern",
                t.name
            ));
        }
        if let Some(p) = &t.pattern {
            regex::Regex::new(&format!("^(?:{p})$"))
                .map_err(|e| format!("tier {:?}: pattern {p:?}: {e}", t.name))?;
        }
    }
    Ok(file.tier)
}

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

// ---------------------------------------------------------------------------
// What Prometheus is asked.

/// The timelines the plan is derived from: one point per step over the
/// history, each with what was true then.
#[derive(Clone, Debug, Default)]
pub struct Timelines {
    /// The step times (Unix seconds), ascending; the last is now.
    pub times: Vec<f64>,
    /// Per step: (namespace, version) -> proxies.
    pub versions: Vec<BTreeMap<(String, String), u64>>,
    /// Per step: namespace -> the smallest max connection age of its guards
    /// (0: some guard has none). A namespace without guards is absent.
    pub max_age: Vec<BTreeMap<String, f64>>,
    /// Every namespace seen in the history.
    pub namespaces: BTreeSet<String>,
}

/// The step between points: a tenth of the shortest rule (stall, soaks)
/// and at most a thousandth of the history, so every rule is judged on
/// several points; but no finer than a second, and coarse enough to stay
/// under Prometheus' 11,000 points per series.
pub fn step_for(history: Duration, rules: &[Duration]) -> Duration {
    let shortest = rules
        .iter()
        .copied()
        .chain([history / 100])
        .min()
        .unwrap_or(history);
    let fine = Duration::from_secs((shortest / 10).as_secs().max(1));
    let coarsest = Duration::from_secs(history.as_secs().div_ceil(10_000));
    fine.max(coarsest)
}

impl PlanOptions {
    /// The step the timelines are read at.
    pub fn step(&self) -> Duration {
        step_for(
            self.history,
            &[self.stall_after, self.soak, self.lifetime_soak],
        )
    }
}

/// Reads the timelines from Prometheus.
pub async fn read(prom: &PromClient, opts: &PlanOptions) -> Result<Timelines, FleetError> {
    let end = opts.at.unwrap_or_else(SystemTime::now);
    let step = opts.step();
    // Whole steps back from the end, so the last point is the end itself.
    let steps = opts.history.as_secs_f64() / step.as_secs_f64();
    let start = end
        .checked_sub(step.mul_f64(steps.ceil()))
        .unwrap_or(UNIX_EPOCH);
    let label = match opts.version_label {
        VersionLabel::Version => "version",
        VersionLabel::MeshVersion => "mesh_version",
    };
    let versions = prom
        .query_range(
            &format!("count by (namespace, {label}) (drainshim_proxy_info == 1)"),
            start,
            end,
            step,
        )
        .await?;
    // A guard's gauge carries no namespace in sidecar mode: join it to its
    // shim's proxy_info on the instance (node agents label their own).
    let w = format!("{}s", (step.as_secs() * 2).max(30));
    let q = super::golden::Queries { ns: ".+", w: &w };
    let joined = q.in_wave(
        |sel| format!("drainshim_guard_max_connection_age_seconds{{{sel}}}"),
        "",
    );
    let max_age = prom
        .query_range(&format!("min by (namespace) ({joined})"), start, end, step)
        .await?;

    let mut times: BTreeSet<i64> = BTreeSet::new();
    let key = |t: f64| (t * 1000.0).round() as i64;
    let mut at = start;
    while at <= end {
        times.insert(key(unix(at)));
        at += step;
    }
    let index: BTreeMap<i64, usize> = times.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    let mut tl = Timelines {
        times: times.iter().map(|t| *t as f64 / 1000.0).collect(),
        versions: vec![BTreeMap::new(); times.len()],
        max_age: vec![BTreeMap::new(); times.len()],
        namespaces: BTreeSet::new(),
    };
    for s in &versions {
        let ns = s.label("namespace").to_string();
        let v = s.label(label).to_string();
        tl.namespaces.insert(ns.clone());
        for (t, n) in &s.points {
            if let Some(i) = nearest(&index, key(*t)) {
                *tl.versions[i].entry((ns.clone(), v.clone())).or_default() += *n as u64;
            }
        }
    }
    for s in &max_age {
        let ns = s.label("namespace").to_string();
        for (t, v) in &s.points {
            if let Some(i) = nearest(&index, key(*t)) {
                tl.max_age[i].insert(ns.clone(), *v);
            }
        }
    }
    Ok(tl)
}

/// The step a point Prometheus returned belongs to (it answers at exactly
/// the times asked; this tolerates rounding).
fn nearest(index: &BTreeMap<i64, usize>, t: i64) -> Option<usize> {
    index.range(t - 500..=t + 500).next().map(|(_, i)| *i)
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

// ---------------------------------------------------------------------------
// The plan, derived.

/// A tier with its namespaces resolved.
#[derive(Clone, Debug, Serialize)]
pub struct Tier {
    pub name: String,
    pub namespaces: Vec<String>,
}

/// The versions of the migration: from anything older than `intermediate`,
/// to `intermediate` (n-1), then to `target` (n).
#[derive(Clone, Copy, Debug)]
pub struct Versions {
    pub control_plane: Release,
    pub intermediate: Release,
    pub target: Release,
    pub max_skew: u32,
}

impl Versions {
    /// Checks the versions and the skew make a plan; the error says why not.
    pub fn new(control_plane: Release, target: Release, max_skew: u32) -> Result<Self, String> {
        let (c, t) = (control_plane, target);
        if t.major != c.major {
            return Err(format!(
                "--target {} changes the major version of the control plane's {}: plan covers minor upgrades",
                mm(t),
                mm(c)
            ));
        }
        if t.minor < c.minor {
            return Err(format!(
                "--target {} is behind the control plane's {}: a plan moves forward; the rollback column says how to go back",
                mm(t),
                mm(c)
            ));
        }
        let Some(i) = t.minor.checked_sub(max_skew) else {
            return Err(format!(
                "--max-skew {max_skew} is more than the target's minor version"
            ));
        };
        if i > c.minor {
            return Err(format!(
                "no plan keeps every proxy supported: with --max-skew {max_skew}, proxies must run {}.{i} before the control plane moves to {}, \
                 but {}.{i} is newer than the control plane's {} now (proxies may not run ahead of it). \
                 Plan the control plane one version at a time (--target {}.{}), or check the supported skew",
                t.major,
                mm(t),
                t.major,
                mm(c),
                c.major,
                c.minor + max_skew.max(1)
            ));
        }
        Ok(Self {
            control_plane: c,
            intermediate: Release {
                major: t.major,
                minor: i,
                patch: None,
            },
            target: t,
            max_skew,
        })
    }

    /// Whether the control plane already runs the target.
    pub fn moved(&self) -> bool {
        self.control_plane.minor >= self.target.minor
    }
}

fn mm(r: Release) -> String {
    format!("{}.{}", r.major, r.minor)
}

/// Whether `version` is at `at_least` or newer (same major). Unknown
/// versions are not.
fn at_least(version: &str, at_least: Release) -> bool {
    version
        .parse::<Release>()
        .is_ok_and(|v| v.major == at_least.major && v.minor >= at_least.minor)
}

/// Resolves the tiers against the namespaces Prometheus has seen.
pub fn resolve(
    specs: &[TierSpec],
    seen: &BTreeSet<String>,
    history: Duration,
) -> Result<Vec<Tier>, String> {
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    let mut tiers = Vec::new();
    for spec in specs {
        let mut namespaces: BTreeSet<String> = BTreeSet::new();
        for ns in &spec.namespaces {
            if !seen.contains(ns) {
                return Err(format!(
                    "tier {:?}: namespace {ns:?} is unknown: no proxy in it reported a version in the last {} \
                     (is it spelled right, and are its shims scraped?)",
                    spec.name,
                    human(history)
                ));
            }
            namespaces.insert(ns.clone());
        }
        if let Some(p) = &spec.pattern {
            let re = regex::Regex::new(&format!("^(?:{p})$"))
                .map_err(|e| format!("tier {:?}: pattern {p:?}: {e}", spec.name))?;
            let before = namespaces.len();
            namespaces.extend(seen.iter().filter(|ns| re.is_match(ns)).cloned());
            if namespaces.len() == before && spec.namespaces.is_empty() {
                return Err(format!(
                    "tier {:?}: pattern {p:?} matches no namespace Prometheus has seen",
                    spec.name
                ));
            }
        }
        for ns in &namespaces {
            if let Some(other) = owner.insert(ns.clone(), spec.name.clone()) {
                return Err(format!(
                    "namespace {ns:?} is in two tiers: {other:?} and {:?}",
                    spec.name
                ));
            }
        }
        tiers.push(Tier {
            name: spec.name.clone(),
            namespaces: namespaces.into_iter().collect(),
        });
    }
    Ok(tiers)
}

/// A point of a tier's wave: proxies in its namespaces, and how many run
/// the wave's version or newer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub t: f64,
    pub total: u64,
    pub moved: u64,
}

/// When something happened: at a step, or before the history Prometheus
/// keeps (then the value is the history's first step).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "when", content = "at", rename_all = "snake_case")]
pub enum Edge {
    At(f64),
    BeforeHistory(f64),
}

impl Edge {
    fn time(self) -> f64 {
        match self {
            Edge::At(t) | Edge::BeforeHistory(t) => t,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    NotStarted,
    InProgress,
    Stalled,
    Done,
    Verified,
}

/// A tier's wave, read from its points.
#[derive(Clone, Debug, PartialEq)]
pub struct Wave {
    pub state: State,
    pub total: u64,
    pub moved: u64,
    pub started: Option<Edge>,
    pub finished: Option<Edge>,
    /// In progress: since when nothing changed.
    pub unchanged_since: Option<Edge>,
}

/// Reads a wave from its points (ascending; steps where the tier reported
/// nothing are left out by the caller).
pub fn wave(points: &[Point], stall_after: f64) -> Wave {
    let Some(&now) = points.last() else {
        return Wave {
            state: State::NotStarted,
            total: 0,
            moved: 0,
            started: None,
            finished: None,
            unchanged_since: None,
        };
    };
    let first = points[0].t;
    // The earliest point of the run that ends at `end` and keeps `keep`.
    let run_start = |end: usize, keep: &dyn Fn(&Point) -> bool| -> Edge {
        let mut i = end;
        while i > 0 && keep(&points[i - 1]) {
            i -= 1;
        }
        if i == 0 {
            Edge::BeforeHistory(first)
        } else {
            Edge::At(points[i].t)
        }
    };
    let last = points.len() - 1;
    let done = |p: &Point| p.total > 0 && p.moved == p.total;
    if now.total == 0 || done(&now) {
        let finished = run_start(last, &done);
        let end = match finished {
            Edge::At(t) => points.iter().position(|p| p.t == t).unwrap_or(last),
            Edge::BeforeHistory(_) => 0,
        };
        let started = run_start(end, &|p: &Point| p.moved > 0);
        return Wave {
            state: State::Done,
            total: now.total,
            moved: now.moved,
            started: Some(started),
            finished: Some(finished),
            unchanged_since: None,
        };
    }
    if now.moved == 0 {
        return Wave {
            state: State::NotStarted,
            total: now.total,
            moved: 0,
            started: None,
            finished: None,
            unchanged_since: None,
        };
    }
    let same = |p: &Point| p.total == now.total && p.moved == now.moved;
    let unchanged = run_start(last, &same);
    let stalled = now.t - unchanged.time() >= stall_after;
    Wave {
        state: if stalled {
            State::Stalled
        } else {
            State::InProgress
        },
        total: now.total,
        moved: now.moved,
        started: Some(run_start(last, &|p: &Point| p.moved > 0)),
        finished: None,
        unchanged_since: Some(unchanged),
    }
}

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
    fn open(detail: impl Into<String>) -> Self {
        Self {
            ok: Some(true),
            detail: detail.into(),
            opens_at: None,
            failed: false,
        }
    }
    fn waits(detail: impl Into<String>, opens_at: Option<f64>) -> Self {
        Self {
            ok: Some(false),
            detail: detail.into(),
            opens_at,
            failed: false,
        }
    }
    fn fails(detail: impl Into<String>) -> Self {
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
pub enum Kind {
    Inventory,
    ConnectionLifetime,
    Restart,
    ControlPlane,
}

/// One row of the plan.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// 1 to 5, the sequence's step.
    pub step: u8,
    pub kind: Kind,
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
}

impl Row {
    fn finished_ok(&self) -> bool {
        matches!(self.state, State::Done | State::Verified)
            && self.verify.as_ref().is_none_or(|v| !v.failed)
    }
}

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

/// The proxies of a tier's namespaces at one step.
fn tier_point(tl: &Timelines, i: usize, tier: &Tier, to: Release) -> Point {
    let mut p = Point {
        t: tl.times[i],
        total: 0,
        moved: 0,
    };
    for ((ns, v), n) in &tl.versions[i] {
        if tier.namespaces.binary_search(ns).is_ok() {
            p.total += n;
            if at_least(v, to) {
                p.moved += n;
            }
        }
    }
    p
}

fn tier_points(tl: &Timelines, tier: &Tier, to: Release) -> Vec<Point> {
    (0..tl.times.len())
        .map(|i| tier_point(tl, i, tier, to))
        .filter(|p| p.total > 0)
        .collect()
}

/// When a tier's guards all had a max connection age, continuously up to
/// the last step, and the smallest now. `None` when they have none now.
fn lifetime_since(tl: &Timelines, tier: &Tier) -> Option<(Edge, f64)> {
    let configured = |i: usize| -> Option<f64> {
        let ages: Vec<f64> = tier
            .namespaces
            .iter()
            .filter_map(|ns| tl.max_age[i].get(ns).copied())
            .collect();
        (ages.len() == tier.namespaces.len() && ages.iter().all(|a| *a > 0.0))
            .then(|| ages.iter().copied().fold(f64::INFINITY, f64::min))
    };
    let last = tl.times.len().checked_sub(1)?;
    let age = configured(last)?;
    let mut i = last;
    while i > 0 && configured(i - 1).is_some() {
        i -= 1;
    }
    let since = if i == 0 {
        Edge::BeforeHistory(tl.times[0])
    } else {
        Edge::At(tl.times[i])
    };
    Some((since, age))
}

/// Formats Unix seconds as RFC 3339, to the second.
pub fn when(t: f64) -> String {
    let t = UNIX_EPOCH + Duration::from_secs_f64(t.max(0.0));
    humantime::format_rfc3339_seconds(t).to_string()
}

fn span(secs: f64) -> String {
    human(Duration::from_secs(secs.max(0.0).round() as u64))
}

/// A duration as days, hours, minutes and seconds ("90d", "1d2h"), never
/// in months as humantime would.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    let parts = [
        (s / 86_400, "d"),
        (s / 3600 % 24, "h"),
        (s / 60 % 60, "m"),
        (s % 60, "s"),
    ];
    let out: Vec<String> = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, u)| format!("{n}{u}"))
        .collect();
    if out.is_empty() {
        "0s".into()
    } else {
        out.join("")
    }
}

fn edge_text(e: Edge) -> String {
    match e {
        Edge::At(t) => when(t),
        Edge::BeforeHistory(t) => format!("before {} (the history's start)", when(t)),
    }
}

/// The wave verdict `plan` needs for a finished tier: `None` when it
/// cannot be judged.
pub type WaveVerify = Option<Result<Vec<verify::Check>, FleetError>>;

/// Derives the plan (without the waves' verify results, which [`judge`]
/// asks for rows that finished: see [`plan`]).
pub fn derive(
    tl: &Timelines,
    tiers: &[Tier],
    v: Versions,
    opts: &PlanOptions,
    verified: &BTreeMap<(u8, usize), Gate>,
) -> Plan {
    let now = tl.times.last().copied().unwrap_or_default();
    let stall = opts.stall_after.as_secs_f64();
    let soak = opts.soak.as_secs_f64();
    let lifetime_soak = opts.lifetime_soak.as_secs_f64();
    let last = tl.times.len().saturating_sub(1);
    let mut rows = Vec::new();

    // 1: the inventory.
    let current = tl.versions.get(last).cloned().unwrap_or_default();
    let proxies: u64 = current.values().sum();
    let unknown: u64 = current
        .iter()
        .filter(|((_, ver), _)| ver.parse::<Release>().is_err())
        .map(|(_, n)| n)
        .sum();
    let mut spread: BTreeMap<String, u64> = BTreeMap::new();
    for ((_, ver), n) in &current {
        *spread
            .entry(
                ver.parse::<Release>()
                    .map(mm)
                    .unwrap_or_else(|_| "unknown".into()),
            )
            .or_default() += n;
    }
    let spread_text = spread
        .iter()
        .map(|(ver, n)| format!("{n} on {ver}"))
        .collect::<Vec<_>>()
        .join(", ");
    let inventory_ok = proxies > 0 && unknown == 0;
    rows.push(Row {
        step: 1,
        kind: Kind::Inventory,
        what: "publish the version inventory".into(),
        tier: None,
        namespaces: Vec::new(),
        state: if inventory_ok {
            State::Done
        } else {
            State::NotStarted
        },
        detail: if proxies == 0 {
            "no proxy reports a version now".into()
        } else {
            format!("{proxies} proxies: {spread_text}")
        },
        moved: None,
        pods: Some(proxies),
        started: None,
        finished: None,
        verify: None,
        gate: if inventory_ok {
            Gate::open("every proxy reports its version")
        } else if proxies == 0 {
            Gate::fails("no proxy reports a version: are the shims scraped?")
        } else {
            Gate::fails(format!("{unknown} proxies report no version"))
        },
        rollback: Rollback {
            possible: None,
            how: "nothing to roll back".into(),
        },
    });

    // 2: the connection lifetime, per tier.
    for tier in tiers {
        let (state, detail, gate) = match lifetime_since(tl, tier) {
            None => (
                State::NotStarted,
                "some guards have no max connection age".to_string(),
                Gate::open("may start now"),
            ),
            Some((since, age)) => {
                let soaked_at = since.time() + lifetime_soak;
                let age = span(age);
                if now >= soaked_at {
                    (
                        State::Done,
                        format!("max age {age} on every guard since {}", edge_text(since)),
                        Gate::open("soaked"),
                    )
                } else {
                    (
                        State::InProgress,
                        format!("max age {age} on every guard since {}", edge_text(since)),
                        Gate::waits(format!("soaks until {}", when(soaked_at)), Some(soaked_at)),
                    )
                }
            }
        };
        rows.push(Row {
            step: 2,
            kind: Kind::ConnectionLifetime,
            what: format!("connection lifetime, soaked {}", human(opts.lifetime_soak)),
            tier: Some(tier.name.clone()),
            namespaces: tier.namespaces.clone(),
            state,
            detail,
            moved: None,
            pods: None,
            started: None,
            finished: None,
            verify: None,
            gate,
            rollback: Rollback {
                possible: Some(true),
                how: "unset --max-connection-age".into(),
            },
        });
    }
    let lifetime_row = |k: usize| 1 + k;

    // 3 and 5: the restarts.
    let restart_rows = |step: u8,
                        from: String,
                        to: Release,
                        rows: &mut Vec<Row>,
                        first_gate: &dyn Fn(usize, &[Row]) -> Gate,
                        rollback: Rollback| {
        let mut prev: Option<usize> = None;
        for (k, tier) in tiers.iter().enumerate() {
            let w = wave(&tier_points(tl, tier, to), stall);
            let mut verify_gate = None;
            let mut state = w.state;
            if w.state == State::Done {
                let g = verified.get(&(step, k)).cloned().unwrap_or_else(|| Gate {
                    ok: None,
                    detail: "not verified".into(),
                    opens_at: None,
                    failed: false,
                });
                if g.ok == Some(true) {
                    state = State::Verified;
                }
                verify_gate = Some(g);
            }
            let detail = match w.state {
                State::NotStarted => format!("0 of {} pods on {}", w.total, mm(to)),
                State::InProgress => format!(
                    "{} of {} pods on {}, since {}",
                    w.moved,
                    w.total,
                    mm(to),
                    w.started.map(edge_text).unwrap_or_default()
                ),
                State::Stalled => format!(
                    "{} of {} pods on {}, no change since {}",
                    w.moved,
                    w.total,
                    mm(to),
                    w.unchanged_since.map(edge_text).unwrap_or_default()
                ),
                _ => format!(
                    "{} of {} pods on {}, finished {}",
                    w.moved,
                    w.total,
                    mm(to),
                    w.finished.map(edge_text).unwrap_or_default()
                ),
            };
            let gate = match w.state {
                State::Stalled => Gate::fails(format!(
                    "stalled: mixed versions and no change for {} or more",
                    human(opts.stall_after)
                )),
                _ => match prev {
                    None => first_gate(k, rows),
                    Some(p) => {
                        let before: &Row = &rows[p];
                        if let Some(v) = before.verify.as_ref().filter(|v| v.failed) {
                            Gate::fails(format!(
                                "tier {} failed verify: {}",
                                before.tier.as_deref().unwrap_or(""),
                                v.detail
                            ))
                        } else if !before.finished_ok() {
                            Gate::waits(
                                format!(
                                    "waits for tier {} to finish",
                                    before.tier.as_deref().unwrap_or("")
                                ),
                                None,
                            )
                        } else {
                            let done_at = before.finished.map_or(now, Edge::time);
                            let opens = done_at + soak;
                            if now >= opens
                                || matches!(before.finished, Some(Edge::BeforeHistory(_)))
                            {
                                first_gate(k, rows)
                            } else {
                                Gate::waits(
                                    format!(
                                        "one tier at a time: tier {} finished {}, soak until {}",
                                        before.tier.as_deref().unwrap_or(""),
                                        when(done_at),
                                        when(opens)
                                    ),
                                    Some(opens),
                                )
                            }
                        }
                    }
                },
            };
            rows.push(Row {
                step,
                kind: Kind::Restart,
                what: format!("restart {from} -> {}", mm(to)),
                tier: Some(tier.name.clone()),
                namespaces: tier.namespaces.clone(),
                state,
                detail,
                moved: Some(w.moved),
                pods: Some(w.total),
                started: w.started,
                finished: w.finished,
                verify: verify_gate,
                gate,
                rollback: rollback.clone(),
            });
            prev = Some(rows.len() - 1);
        }
    };

    let (i, t, c) = (v.intermediate, v.target, v.control_plane);
    let older = format!("<{}", mm(i));
    let r1_rollback = if v.moved() {
        Rollback {
            possible: Some(false),
            how: format!(
                "gone: the control plane runs {}, and {older} is outside its skew of {}",
                mm(c),
                v.max_skew
            ),
        }
    } else {
        Rollback {
            possible: Some(true),
            how: format!(
                "restart back to the old version: possible until the control plane moves to {}",
                mm(t)
            ),
        }
    };
    let inventory_gate = rows[0].gate.clone();
    let lifetime_gate = |k: usize, rows: &[Row]| -> Gate {
        if inventory_gate.failed {
            return Gate::fails(format!("step 1: {}", inventory_gate.detail));
        }
        let l = &rows[lifetime_row(k)];
        match l.state {
            State::Done => Gate::open("may start now"),
            State::InProgress => Gate::waits(
                format!("connection lifetime {}", l.gate.detail),
                l.gate.opens_at,
            ),
            _ => Gate::waits(
                "waits for step 2: set a max connection age on this tier's guards",
                None,
            ),
        }
    };
    restart_rows(3, older.clone(), i, &mut rows, &lifetime_gate, r1_rollback);

    // 4: the control plane.
    let fleet_now: Vec<(String, String, u64)> = current
        .iter()
        .map(|((ns, ver), n)| (ns.clone(), ver.clone(), *n))
        .collect();
    let outside = |cp: Release| -> (u64, Vec<String>) {
        let mut n = 0;
        let mut which = BTreeSet::new();
        for (ns, ver, count) in &fleet_now {
            if skew_violation(ver, cp, v.max_skew).is_some() {
                n += count;
                which.insert(format!("{ns} on {ver}"));
            }
        }
        (n, which.into_iter().collect())
    };
    let (outside_t, which_t) = outside(t);
    let skew_text = if outside_t == 0 {
        format!("skew: every proxy is within {} of {}", v.max_skew, mm(t))
    } else {
        format!(
            "skew: {outside_t} proxies outside {} of {}: {}",
            v.max_skew,
            mm(t),
            which_t.join(", ")
        )
    };
    let r1: Vec<&Row> = rows.iter().filter(|r| r.step == 3).collect();
    let cp_gate = if v.moved() {
        if outside_t == 0 {
            Gate::open(skew_text.clone())
        } else {
            Gate::fails(format!("unsupported proxies: {skew_text}"))
        }
    } else if let Some(f) = r1
        .iter()
        .find(|r| r.gate.failed || r.verify.as_ref().is_some_and(|v| v.failed))
    {
        Gate::fails(format!(
            "tier {} of step 3 failed: {}",
            f.tier.as_deref().unwrap_or(""),
            f.verify
                .as_ref()
                .filter(|v| v.failed)
                .map_or(&f.gate.detail, |v| &v.detail)
        ))
    } else if let Some(w) = r1.iter().find(|r| !r.finished_ok()) {
        Gate::waits(
            format!(
                "waits for tier {} of step 3",
                w.tier.as_deref().unwrap_or("")
            ),
            None,
        )
    } else if outside_t > 0 {
        Gate::waits(skew_text.clone(), None)
    } else {
        let last_done = r1
            .iter()
            .filter_map(|r| match r.finished {
                Some(Edge::At(t)) => Some(t),
                _ => None,
            })
            .fold(f64::NEG_INFINITY, f64::max);
        let opens = last_done + soak;
        if last_done.is_finite() && now < opens {
            Gate::waits(
                format!(
                    "soak after the last tier: until {}; {skew_text}",
                    when(opens)
                ),
                Some(opens),
            )
        } else {
            Gate::open(format!("may start now; {skew_text}"))
        }
    };
    let cp_row = rows.len();
    rows.push(Row {
        step: 4,
        kind: Kind::ControlPlane,
        what: if v.moved() {
            format!("control plane -> {}: the point of no return", mm(t))
        } else {
            format!(
                "control plane {} -> {}: the point of no return",
                mm(c),
                mm(t)
            )
        },
        tier: None,
        namespaces: Vec::new(),
        state: if v.moved() {
            State::Done
        } else {
            State::NotStarted
        },
        detail: format!("runs {}; {skew_text}", mm(c)),
        moved: None,
        pods: None,
        started: None,
        finished: None,
        verify: None,
        gate: cp_gate,
        rollback: if v.moved() {
            Rollback {
                possible: Some(false),
                how: "gone: the control plane moved; proxies older than the skew are unsupported"
                    .into(),
            }
        } else {
            Rollback {
                possible: Some(true),
                how: format!(
                    "none once it moves: after it, a restart back to {older} is unsupported"
                ),
            }
        },
    });

    let cp_done = v.moved();
    let after_cp = |_: usize, rows: &[Row]| -> Gate {
        if cp_done {
            Gate::open("may start now")
        } else {
            let cp = &rows[cp_row];
            Gate::waits(
                format!("waits for step 4 (control plane): {}", cp.gate.detail),
                None,
            )
        }
    };
    restart_rows(
        5,
        mm(i),
        t,
        &mut rows,
        &after_cp,
        Rollback {
            possible: Some(true),
            how: format!("restart back to {}: within the skew of {}", mm(i), mm(t)),
        },
    );

    let (next, verdict) = next_action(&rows, opts, v, now);
    let untiered: Vec<String> = current
        .keys()
        .map(|(ns, _)| ns.clone())
        .filter(|ns| !tiers.iter().any(|t| t.namespaces.binary_search(ns).is_ok()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    Plan {
        at: now,
        control_plane: mm(c),
        intermediate: mm(i),
        target: mm(t),
        max_skew: v.max_skew,
        tiers: tiers.to_vec(),
        untiered,
        rows,
        next,
        verdict,
        estimate: None,
    }
}

/// The next action, and the verdict.
fn next_action(rows: &[Row], opts: &PlanOptions, v: Versions, now: f64) -> (Next, Verdict) {
    let rerun = "then re-run drainshim plan with the same flags".to_string();
    // A failure anywhere stops the plan.
    if let Some((k, r)) = rows.iter().enumerate().find(|(_, r)| {
        r.state == State::Stalled
            || r.verify.as_ref().is_some_and(|g| g.failed)
            || (r.gate.failed && r.kind == Kind::ControlPlane && v.moved())
            || (r.gate.failed && r.kind == Kind::Inventory)
    }) {
        let tier = r.tier.clone().unwrap_or_default();
        let ns = r.namespaces.join(",");
        let (action, commands) = if r.state == State::Stalled {
            (
                format!("stop: tier {tier} is stalled ({}); finish or roll back its restart", r.detail),
                vec![format!(
                    "drainshim inventory --prometheus {} -o json   # the pods of {ns} left on the old version",
                    opts.prometheus_url
                )],
            )
        } else if let Some(g) = r.verify.as_ref().filter(|g| g.failed) {
            let to = r.what.rsplit(' ').next().unwrap_or_default();
            let at = r.finished.map(|e| when(e.time())).unwrap_or_default();
            (
                format!("stop: tier {tier}'s wave failed verify ({}); {}", g.detail, r.rollback.how),
                vec![format!(
                    "drainshim verify --prometheus {} --namespace {ns} --expect-version {to} --at {at} --window {}",
                    opts.prometheus_url,
                    wave_window(r).map_or("10m".into(), human)
                )],
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
        let go_on = r.state == State::InProgress && r.kind == Kind::Restart;
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
            let (k, r) = rows
                .iter()
                .enumerate()
                .find(|(_, r)| !r.finished_ok())
                .expect("not every row is done");
            (
                Next {
                    row: Some(k),
                    action: format!("stop: {}", r.gate.detail),
                    commands: Vec::new(),
                    not_before: None,
                },
                Verdict::Stop,
            )
        }
    }
}

/// The window a finished wave is verified over: its start to its end.
fn wave_window(r: &Row) -> Option<Duration> {
    match (r.started, r.finished) {
        (Some(s), Some(Edge::At(f))) => Some(Duration::from_secs_f64((f - s.time()).max(1.0))),
        _ => None,
    }
}

fn revision(opts: &PlanOptions, r: Release) -> String {
    opts.revisions
        .get(&(r.major, r.minor))
        .cloned()
        .unwrap_or_else(|| format!("{}-{}", r.major, r.minor))
}

fn commands_for(r: &Row, opts: &PlanOptions, v: Versions, go_on: bool) -> (String, Vec<String>) {
    let tier = r.tier.clone().unwrap_or_default();
    match r.kind {
        Kind::Inventory => ("publish the inventory".into(), Vec::new()),
        Kind::ConnectionLifetime => (
            format!(
                "step 2, tier {tier}: give its guards a max connection age, then let it soak {}",
                human(opts.lifetime_soak)
            ),
            r.namespaces
                .iter()
                .map(|ns| {
                    format!(
                        "kubectl -n {ns} set env deployment,statefulset --all -c drainshim DRAINSHIM_MAX_CONNECTION_AGE={}",
                        human(opts.suggest_max_age)
                    )
                })
                .collect(),
        ),
        Kind::Restart => {
            let to = if r.step == 3 { v.intermediate } else { v.target };
            let verb = if go_on { "go on with" } else { "start" };
            let mut cmds = Vec::new();
            for ns in &r.namespaces {
                match opts.mesh {
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
        Kind::ControlPlane => (
            format!(
                "step 4: move the control plane to {}, the point of no return",
                mm(v.target)
            ),
            match opts.mesh {
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
    for r in plan.rows.iter().filter(|r| r.kind == Kind::Restart) {
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
        .filter(|r| r.kind == Kind::Restart)
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
        .filter(|r| r.kind == Kind::ConnectionLifetime && !r.finished_ok())
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
        .any(|r| r.kind == Kind::ControlPlane && !r.finished_ok())
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

/// The plan as a table, the next action below it.
pub fn render(plan: &Plan, next_only: bool) -> String {
    let mut out = String::new();
    if !next_only {
        let rows: Vec<Vec<String>> = plan
            .rows
            .iter()
            .map(|r| {
                let state = match r.state {
                    State::NotStarted => "not started",
                    State::InProgress => "in progress",
                    State::Stalled => "STALLED",
                    State::Done => "done",
                    State::Verified => "done, verified",
                };
                let gate = match (&r.verify, r.gate.ok) {
                    (Some(v), _) if r.state != State::NotStarted => v.detail.clone(),
                    (_, Some(true)) if matches!(r.state, State::Done | State::Verified) => {
                        "-".into()
                    }
                    _ => r.gate.detail.clone(),
                };
                let rollback = match r.rollback.possible {
                    Some(true) => format!("possible: {}", r.rollback.how),
                    Some(false) => r.rollback.how.clone(),
                    None => "-".into(),
                };
                vec![
                    r.step.to_string(),
                    r.what.clone(),
                    r.tier.clone().unwrap_or_else(|| "-".into()),
                    format!("{state}: {}", r.detail),
                    gate,
                    rollback,
                ]
            })
            .collect();
        out.push_str(&table(
            &["STEP", "WHAT", "TIER", "STATE", "GATE", "ROLLBACK"],
            &rows,
        ));
        if !plan.untiered.is_empty() {
            let _ = writeln!(
                out,
                "\nnamespaces no tier names (they move without a gate): {}",
                plan.untiered.join(", ")
            );
        }
    }
    let _ = writeln!(out, "\nnext: {}", plan.next.action);
    if let Some(t) = plan.next.not_before {
        if t > plan.at + 1.0 {
            let _ = writeln!(out, "not before: {}", when(t));
        }
    }
    for c in &plan.next.commands {
        let _ = writeln!(out, "  {c}");
    }
    if let Some(e) = &plan.estimate {
        let _ = writeln!(
            out,
            "\nestimate: {} left ({} waves left at {} each, {} measured)",
            span(e.remaining_seconds),
            e.waves_left,
            span(e.wave_seconds),
            if e.waves_measured == 0 {
                "none yet: assumed".to_string()
            } else {
                e.waves_measured.to_string()
            }
        );
        for (what, secs) in &e.parts {
            let _ = writeln!(out, "  {what}: {}", span(*secs));
        }
        let _ = writeln!(
            out,
            "  (a migration planned by hand takes six to ten weeks)"
        );
    }
    let _ = writeln!(
        out,
        "plan: {}",
        match plan.verdict {
            Verdict::Go => "GO, the next step may start",
            Verdict::Done => "DONE",
            Verdict::Wait => "WAIT, nothing may start yet",
            Verdict::Stop => "STOP, a gate failed",
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> Release {
        s.parse().unwrap()
    }

    fn pts(v: &[(f64, u64, u64)]) -> Vec<Point> {
        v.iter()
            .map(|&(t, total, moved)| Point { t, total, moved })
            .collect()
    }

    #[test]
    fn versions_make_a_plan_or_say_why_not() {
        let v = Versions::new(r("1.39"), r("1.40"), 1).unwrap();
        assert_eq!(mm(v.intermediate), "1.39");
        assert!(!v.moved());
        assert!(Versions::new(r("1.40"), r("1.40"), 1).unwrap().moved());
        let behind = Versions::new(r("1.40"), r("1.39"), 1).unwrap_err();
        assert!(behind.contains("behind"), "{behind}");
        let zero = Versions::new(r("1.39"), r("1.40"), 0).unwrap_err();
        assert!(
            zero.contains("no plan keeps every proxy supported"),
            "{zero}"
        );
        let jump = Versions::new(r("1.38"), r("1.40"), 1).unwrap_err();
        assert!(jump.contains("--target 1.39"), "{jump}");
        assert!(Versions::new(r("1.38"), r("1.40"), 2).is_ok());
        assert!(Versions::new(r("1.39"), r("2.0"), 1).is_err());
    }

    #[test]
    fn waves_read_from_points() {
        // Not started.
        let w = wave(&pts(&[(0.0, 3, 0), (1.0, 3, 0)]), 10.0);
        assert_eq!(w.state, State::NotStarted);
        // In progress, changed recently.
        let w = wave(&pts(&[(0.0, 3, 0), (1.0, 3, 1), (2.0, 3, 2)]), 10.0);
        assert_eq!(w.state, State::InProgress);
        assert_eq!(w.started, Some(Edge::At(1.0)));
        assert_eq!(w.unchanged_since, Some(Edge::At(2.0)));
        // Stalled: no change for the stall time.
        let w = wave(
            &pts(&[(0.0, 3, 0), (1.0, 3, 1), (5.0, 3, 1), (12.0, 3, 1)]),
            10.0,
        );
        assert_eq!(w.state, State::Stalled);
        // Done, with start and finish.
        let w = wave(
            &pts(&[
                (0.0, 3, 0),
                (1.0, 3, 1),
                (2.0, 4, 3),
                (3.0, 3, 3),
                (4.0, 3, 3),
            ]),
            10.0,
        );
        assert_eq!(w.state, State::Done);
        assert_eq!(w.started, Some(Edge::At(1.0)));
        assert_eq!(w.finished, Some(Edge::At(3.0)));
        // Done before the history began.
        let w = wave(&pts(&[(0.0, 3, 3), (1.0, 3, 3)]), 10.0);
        assert_eq!(w.finished, Some(Edge::BeforeHistory(0.0)));
        assert_eq!(w.started, Some(Edge::BeforeHistory(0.0)));
    }

    #[test]
    fn tiers_resolve_against_the_fleet() {
        let seen: BTreeSet<String> = ["a", "b", "team-x", "team-y"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let specs = parse_tiers(
            "[[tier]]\nname = \"one\"\nnamespaces = [\"a\"]\n[[tier]]\nname = \"two\"\npattern = \"team-.*\"\n",
        )
        .unwrap();
        let tiers = resolve(&specs, &seen, Duration::from_secs(60)).unwrap();
        assert_eq!(tiers[1].namespaces, vec!["team-x", "team-y"]);
        let unknown = parse_tiers("[[tier]]\nname = \"one\"\nnamespaces = [\"zz\"]\n").unwrap();
        let e = resolve(&unknown, &seen, Duration::from_secs(60)).unwrap_err();
        assert!(e.contains("\"zz\" is unknown"), "{e}");
        let twice = parse_tiers(
            "[[tier]]\nname = \"one\"\nnamespaces = [\"a\"]\n[[tier]]\nname = \"two\"\nnamespaces = [\"a\"]\n",
        )
        .unwrap();
        assert!(resolve(&twice, &seen, Duration::from_secs(60))
            .unwrap_err()
            .contains("two tiers"));
        assert!(parse_tiers("[[tier]]\nname = \"x\"\n").is_err());
        assert!(parse_tiers("[[tier]]\nname = \"x\"\npattern = \"(\"\n").is_err());
        assert!(parse_tiers("[[tier]]\nname = \"x\"\nnamespace = [\"a\"]\n").is_err());
        assert!(parse_tiers("").is_err());
    }

    #[test]
    fn steps_stay_under_the_point_limit() {
        let day = Duration::from_secs(86_400);
        let s = step_for(90 * day, &[Duration::from_secs(3600), day, 7 * day]);
        assert!((90 * day).as_secs() / s.as_secs() <= 10_000);
        assert_eq!(s, Duration::from_secs(778));
        let s = step_for(Duration::from_secs(900), &[Duration::from_secs(7200), day]);
        assert_eq!(s, Duration::from_secs(1), "a short history is read finely");
        let s = step_for(day, &[Duration::from_secs(3600)]);
        assert_eq!(s, Duration::from_secs(86));
    }
}
