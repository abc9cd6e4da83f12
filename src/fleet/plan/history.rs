//! What Prometheus is asked: the timelines every row is derived from.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::PlanOptions;
use crate::fleet::prometheus::{PromClient, Series};
use crate::fleet::{FleetError, VersionLabel};

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
    /// The drain timers each service needs and runs, over the window
    /// before the last point.
    pub timers: crate::fleet::timers::TimersReport,
    /// What config pushes did over the history: step 4's gate once the
    /// control plane moved (its new listeners drain on every proxy).
    pub config_pushes: ConfigPushes,
}

/// Config pushes over the plan's history, from every guard and watcher:
/// Envoy's listener drains after a config update, the streams the guard
/// ended gracefully because of them, and those it could not.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigPushes {
    /// Listener and filter-chain drains Envoy began after config updates.
    pub drains: f64,
    /// Streams ended gracefully before Envoy closed their connections.
    pub ended: f64,
    /// Streams a config push cut (the guard's ungraceful endings with
    /// reason `config_push`), by where: the namespace, or the shim's
    /// instance where its series carry none.
    pub cut: BTreeMap<String, f64>,
}

impl ConfigPushes {
    /// Streams cut in all (a counter's `increase()` may read a fraction).
    pub fn cut_total(&self) -> f64 {
        self.cut.values().sum()
    }
}

/// Reads [`ConfigPushes`] over `history` ending at `end`: three instant
/// queries, each counter's `increase()` (which counts across a shim's
/// restart) summed.
pub async fn read_config_pushes(
    prom: &PromClient,
    history: Duration,
    end: f64,
) -> Result<ConfigPushes, FleetError> {
    let at = prom
        .clone()
        .at(Some(UNIX_EPOCH + Duration::from_secs_f64(end)));
    let h = history.as_secs().max(1);
    let total = |q: String| {
        let at = at.clone();
        async move {
            let samples = at.query(&q).await?;
            Ok::<f64, FleetError>(samples.iter().map(|s| s.value).sum())
        }
    };
    let cut_q = format!(
        "sum by (namespace, instance) (increase(drainshim_streams_ungraceful_total{{reason=\"config_push\"}}[{h}s])) > 0"
    );
    let (drains, ended, cut) = tokio::join!(
        total(format!(
            "sum(increase(drainshim_envoy_listener_drains_total[{h}s]))"
        )),
        total(format!(
            "sum(increase(drainshim_streams_terminated_total{{reason=\"config_push\"}}[{h}s]))"
        )),
        at.query(&cut_q),
    );
    let mut out = ConfigPushes {
        drains: drains?,
        ended: ended?,
        cut: BTreeMap::new(),
    };
    for s in cut? {
        let place = match s.label("namespace") {
            "" => format!("instance {}", s.label("instance")),
            ns => ns.to_string(),
        };
        *out.cut.entry(place).or_default() += s.value;
    }
    Ok(out)
}

/// The step between points: a tenth of the shortest rule (stall, soaks)
/// and at most a hundredth of the history, so every rule is judged on
/// several points; but no finer than a second, and no more than 2,000
/// points over the history. The points bound the cost: a range query costs
/// the store (series x points), and at 2,400 pods over ten weeks a point a
/// minute would take it minutes. A stall is then seen up to one step late.
pub fn step_for(history: Duration, rules: &[Duration]) -> Duration {
    let shortest = rules
        .iter()
        .copied()
        .chain([history / 100])
        .min()
        .unwrap_or(history);
    let fine = Duration::from_secs((shortest / 10).as_secs().max(1));
    let coarsest = Duration::from_secs(history.as_secs().div_ceil(MAX_POINTS));
    fine.max(coarsest)
}

/// The most points a timeline has over the history.
pub const MAX_POINTS: u64 = 2_000;

impl PlanOptions {
    /// The step the versions are read at.
    pub fn step(&self) -> Duration {
        step_for(
            self.history,
            &[self.stall_after, self.soak, self.lifetime_soak],
        )
    }

    /// The step the guards' max connection age is read at: a tenth of the
    /// lifetime soak, which is all it gates (a lifetime is seen set up to
    /// one step late, so its soak ends late, never early), and never finer
    /// than the versions' step.
    pub fn max_age_step(&self) -> Duration {
        self.step().max(Duration::from_secs(
            (self.lifetime_soak / 10).as_secs().max(1),
        ))
    }
}

/// `query` over the history at `step`, on multiples of the step, as stores
/// that align range queries for their caches (VictoriaMetrics, a Thanos or
/// Mimir query frontend) would move it there anyway and answer at other
/// times than asked; and at `end` itself, one more instant query, when it
/// is between two multiples, so the last point is still "now".
async fn history_of(
    prom: &PromClient,
    query: &str,
    history: Duration,
    step: Duration,
    end: f64,
) -> Result<(Vec<f64>, Vec<Series>), FleetError> {
    let s = step.as_secs().max(1) as f64;
    let last = (end / s).floor() * s;
    let steps = history.as_secs().div_ceil(step.as_secs().max(1));
    let start = (last - steps as f64 * s).max(0.0);
    let at = |t: f64| UNIX_EPOCH + Duration::from_secs_f64(t);
    let mut series = prom.query_range(query, at(start), at(last), step).await?;
    let mut times: Vec<f64> = (0..=steps)
        .map(|k| start + k as f64 * s)
        .filter(|t| *t <= last)
        .collect();
    if end > last + 0.0005 {
        let now = prom.clone().at(Some(at(end)));
        series.extend(now.query(query).await?.into_iter().map(|x| Series {
            labels: x.labels,
            points: vec![(end, x.value)],
        }));
        times.push(end);
    }
    Ok((times, series))
}

/// Reads the versions timeline from Prometheus at the plan's step; the
/// max age is left unknown at every point, for [`read_max_age`] to fill.
/// Every proxy's `drainshim_proxy_info` is 1, so it is counted as it is: a
/// filter (`== 1`) at each of 2,000 points costs the store as much again.
pub async fn read_versions(prom: &PromClient, opts: &PlanOptions) -> Result<Timelines, FleetError> {
    let end = unix(opts.at.unwrap_or_else(SystemTime::now));
    let label = match opts.version_label {
        VersionLabel::Version => "version",
        VersionLabel::MeshVersion => "mesh_version",
    };
    let versions_q = format!("count by (namespace, {label}) (drainshim_proxy_info)");
    let (times, versions) = history_of(prom, &versions_q, opts.history, opts.step(), end).await?;
    let index = index_of(&times);
    let mut tl = Timelines {
        times,
        versions: vec![BTreeMap::new(); index.len()],
        max_age: vec![BTreeMap::new(); index.len()],
        namespaces: BTreeSet::new(),
        timers: Default::default(),
        config_pushes: ConfigPushes::default(),
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
    Ok(tl)
}

/// The guards' max connection age per namespace, read at its own coarser
/// step and mapped onto the versions' points: each point takes the last
/// reading at or before it. The history ends where the versions' does (its
/// last point), so "now" is one moment for both, however long the versions
/// took to read.
pub async fn read_max_age(
    prom: &PromClient,
    opts: &PlanOptions,
    times: &[f64],
) -> Result<Vec<BTreeMap<String, f64>>, FleetError> {
    let end = match times.last() {
        Some(t) => *t,
        None => unix(opts.at.unwrap_or_else(SystemTime::now)),
    };
    // A guard's gauge carries no namespace in sidecar mode: join it to its
    // shim's proxy_info on the instance (node agents label their own).
    let q = crate::fleet::golden::Queries {
        ns: ".+",
        secs: 0,
        resets: false,
    };
    let joined = q.in_fleet(|sel| format!("drainshim_guard_max_connection_age_seconds{{{sel}}}"));
    let max_age_q = format!("min by (namespace) ({joined})");
    let (age_times, max_age) =
        history_of(prom, &max_age_q, opts.history, opts.max_age_step(), end).await?;
    let mut readings: BTreeMap<i64, BTreeMap<String, f64>> = age_times
        .iter()
        .map(|t| (key(*t), BTreeMap::new()))
        .collect();
    for s in &max_age {
        let ns = s.label("namespace").to_string();
        for (t, v) in &s.points {
            readings.entry(key(*t)).or_default().insert(ns.clone(), *v);
        }
    }
    Ok(times
        .iter()
        .map(|t| {
            readings
                .range(..=key(*t) + 500)
                .next_back()
                .map(|(_, m)| m.clone())
                .unwrap_or_default()
        })
        .collect())
}

/// A time as the milliseconds the points are matched by.
fn key(t: f64) -> i64 {
    (t * 1000.0).round() as i64
}

fn index_of(times: &[f64]) -> BTreeMap<i64, usize> {
    times
        .iter()
        .enumerate()
        .map(|(i, t)| (key(*t), i))
        .collect()
}

/// The step a point Prometheus returned belongs to (it answers at exactly
/// the times asked; this tolerates rounding).
fn nearest(index: &BTreeMap<i64, usize>, t: i64) -> Option<usize> {
    // The closest: "now" can be less than half a second after a step.
    index
        .range(t - 500..=t + 500)
        .min_by_key(|(k, _)| (**k - t).abs())
        .map(|(_, i)| *i)
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_goes_to_the_closest_step() {
        let index: BTreeMap<i64, usize> = [(1_000, 0), (1_300, 1)].into();
        assert_eq!(nearest(&index, 1_290), Some(1));
        assert_eq!(nearest(&index, 1_100), Some(0));
        assert_eq!(nearest(&index, 2_000), None);
    }

    #[test]
    fn steps_stay_under_the_point_limit() {
        let day = Duration::from_secs(86_400);
        let s = step_for(90 * day, &[Duration::from_secs(3600), day, 7 * day]);
        assert!((90 * day).as_secs() / s.as_secs() <= MAX_POINTS);
        assert_eq!(s, Duration::from_secs(3888));
        let s = step_for(Duration::from_secs(900), &[Duration::from_secs(7200), day]);
        assert_eq!(s, Duration::from_secs(1), "a short history is read finely");
        let s = step_for(day, &[Duration::from_secs(3600)]);
        assert_eq!(s, Duration::from_secs(86));
    }
}
