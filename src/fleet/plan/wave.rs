//! The migration's versions, and a tier's wave read from its points.

use serde::Serialize;

use super::{Tier, Timelines};
use crate::inventory::Release;

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

pub(super) fn mm(r: Release) -> String {
    format!("{}.{}", r.major, r.minor)
}

/// Whether `version` is at `at_least` or newer (same major). Unknown
/// versions are not.
pub(super) fn at_least(version: &str, at_least: Release) -> bool {
    version
        .parse::<Release>()
        .is_ok_and(|v| v.major == at_least.major && v.minor >= at_least.minor)
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
    pub(super) fn time(self) -> f64 {
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

/// The proxies of a tier's namespaces at one step.
pub(super) fn tier_point(tl: &Timelines, i: usize, tier: &Tier, to: Release) -> Point {
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

pub(super) fn tier_points(tl: &Timelines, tier: &Tier, to: Release) -> Vec<Point> {
    (0..tl.times.len())
        .map(|i| tier_point(tl, i, tier, to))
        .filter(|p| p.total > 0)
        .collect()
}

/// When a tier's guards all had a max connection age, continuously up to
/// the last step, and the smallest now. `None` when they have none now.
pub(super) fn lifetime_since(tl: &Timelines, tier: &Tier) -> Option<(Edge, f64)> {
    let points: Vec<Lifetime> = (0..tl.times.len())
        .map(|i| {
            let ages: Vec<Option<f64>> = tier
                .namespaces
                .iter()
                .map(|ns| tl.max_age[i].get(ns).copied())
                .collect();
            Lifetime::of(&ages)
        })
        .collect();
    lifetime_run(&points, &tl.times)
}

/// A tier's guards' max connection age at one step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Lifetime {
    /// Every namespace's guards have one; the smallest.
    On(f64),
    /// Some guard has none.
    Off,
    /// Some namespace reported nothing at this step (a scrape gap, pods
    /// between a rollout's old and new): it neither starts nor ends a run.
    Unknown,
}

impl Lifetime {
    /// From each namespace's smallest max age (`None`: no guard reported).
    pub fn of(ages: &[Option<f64>]) -> Self {
        if ages.contains(&Some(0.0)) {
            Lifetime::Off
        } else if ages.iter().all(Option::is_some) && !ages.is_empty() {
            Lifetime::On(ages.iter().flatten().copied().fold(f64::INFINITY, f64::min))
        } else {
            Lifetime::Unknown
        }
    }
}

/// Since when the run of `On` that is the latest known state began, and
/// its age now; `None` when the latest known state is `Off` or nothing is
/// known.
pub fn lifetime_run(points: &[Lifetime], times: &[f64]) -> Option<(Edge, f64)> {
    let last = points.iter().rposition(|p| *p != Lifetime::Unknown)?;
    let Lifetime::On(age) = points[last] else {
        return None;
    };
    let mut since = last;
    for i in (0..last).rev() {
        match points[i] {
            Lifetime::On(_) => since = i,
            Lifetime::Off => break,
            Lifetime::Unknown => {}
        }
    }
    let edge = if since == 0 {
        Edge::BeforeHistory(times[0])
    } else {
        Edge::At(times[since])
    };
    Some((edge, age))
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
    fn a_lifetime_survives_gaps_and_ends_where_a_guard_has_none() {
        use Lifetime::*;
        let times = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
        let run = |p: &[Lifetime]| lifetime_run(p, &times[..p.len()]);
        assert_eq!(
            run(&[Off, On(60.0), Unknown, On(30.0)]),
            Some((Edge::At(1.0), 30.0))
        );
        assert_eq!(
            run(&[On(60.0), Unknown, On(60.0)]),
            Some((Edge::BeforeHistory(0.0), 60.0))
        );
        assert_eq!(
            run(&[Unknown, On(60.0), On(60.0)]),
            Some((Edge::At(1.0), 60.0))
        );
        assert_eq!(run(&[On(60.0), Off, Unknown]), None);
        assert_eq!(run(&[Unknown, Unknown]), None);
        assert_eq!(Lifetime::of(&[Some(60.0), None]), Unknown);
        assert_eq!(Lifetime::of(&[Some(60.0), Some(0.0), None]), Off);
        assert_eq!(Lifetime::of(&[Some(60.0), Some(30.0)]), On(30.0));
        assert_eq!(Lifetime::of(&[]), Unknown);
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
}
