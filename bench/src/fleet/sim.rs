//! A simulated fleet and ten weeks of its migration, as the series the
//! shims export: the history `bench fleet` loads into Prometheus and
//! VictoriaMetrics, so the fleet tools can be run against 2,400 pods and ten
//! weeks without waiting ten weeks.
//!
//! The fleet: `pods` pods of `services` services in `namespaces`
//! namespaces, in four tiers (canary, early, main, late), each pod a sidecar
//! shim scraped as its own `instance`. Its timeline, in days from the
//! history's start (see [`TIMELINE`]):
//!
//! - every tier's guards get a max connection age, one tier a day (d1-d4);
//! - the first restart, 1.38 -> 1.39, one four-hour wave per tier; the main
//!   tier's wave stalls half-way (d24) and is finished three days later;
//! - the control plane moves to 1.40 (d38), the point of no return;
//! - the second restart, 1.39 -> 1.40; a shim of the main tier restarts in
//!   its pod during that tier's wave (its counters reset in the wave's
//!   window, and the wave must still pass); the late tier's wave cuts
//!   streams on its drains (d62), so it fails `verify`.
//!
//! A restart replaces a namespace's pods (new names, new instances) at its
//! moment in the wave, namespace after namespace.
//!
//! What is written, and how densely:
//! - `drainshim_proxy_info` and `drainshim_guard_max_connection_age_seconds`
//!   of every pod over the whole history, one sample per `interval`: what
//!   `plan` reads over its `--history`;
//! - the guard's golden signals, the drain report, retries, resets and
//!   config updates of a tier's pods around each of its waves (the wave and
//!   the window before it, which `verify` compares), one sample per
//!   `interval` or per a 36th of the wave if that is coarser;
//! - `drainshim_draining` of the live pods over the last two hours.
//!
//! Live pods' series run an hour past `end`, so `inventory` and `skew`
//! (which ask "now") find them while the bench runs.

use std::io::{self, Write};
use std::time::Duration;

use serde::Serialize;

/// The versions of the migration: n-2, n-1 and n.
pub const VERSIONS: [&str; 3] = ["1.38.3", "1.39.3", "1.40.0"];

pub const DAY: i64 = 86_400;
pub const HOUR: i64 = 3_600;

/// The timeline of the migration, in days from the history's start.
pub struct Timeline {
    pub history_days: i64,
    /// The tiers: name and share of the namespaces.
    pub tiers: [(&'static str, f64); 4],
    /// Per tier, the day its guards get a max connection age.
    pub lifetime: [i64; 4],
    /// Per tier, the day of its restart to n-1.
    pub to_n1: [i64; 4],
    /// The tier whose restart to n-1 stalls half-way, and the day it goes on.
    pub stalled: (usize, i64),
    /// The day the control plane moves to n.
    pub control_plane: i64,
    /// Per tier, the day of its restart to n.
    pub to_n: [i64; 4],
    /// The tier whose restart to n cuts streams (and so fails verify).
    pub cuts: usize,
    /// The tier one of whose shims restarts in its pod just before its
    /// restart to n (a counter reset in that wave's window).
    pub shim_restart: usize,
    /// How long a wave takes.
    pub wave: i64,
    /// The max connection age the lifetime step sets, seconds.
    pub max_age: f64,
}

pub const TIMELINE: Timeline = Timeline {
    history_days: 70,
    tiers: [
        ("canary", 0.02),
        ("early", 0.18),
        ("main", 0.40),
        ("late", 0.40),
    ],
    lifetime: [1, 2, 3, 4],
    to_n1: [12, 18, 24, 31],
    stalled: (2, 27),
    control_plane: 38,
    to_n: [44, 50, 56, 62],
    cuts: 3,
    shim_restart: 2,
    wave: 4 * HOUR,
    max_age: 1800.0,
};

/// How long live pods' series run past `end`.
pub const LEAD: i64 = HOUR;

/// The fleet's size and the history's sampling.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Shape {
    pub pods: usize,
    pub services: usize,
    pub namespaces: usize,
    /// Seconds between samples.
    pub interval: i64,
    /// The history's end, Unix seconds (a multiple of `interval`).
    pub end: i64,
}

impl Shape {
    pub fn new(
        pods: usize,
        services: usize,
        namespaces: usize,
        interval: Duration,
        end: i64,
    ) -> Result<Self, String> {
        let interval = interval.as_secs() as i64;
        if !(60..=1800).contains(&interval) {
            return Err("the sample interval must be 1 to 30 minutes".into());
        }
        if namespaces < TIMELINE.tiers.len() {
            return Err(format!(
                "at least {} namespaces: one per tier",
                TIMELINE.tiers.len()
            ));
        }
        if services < namespaces || pods < services {
            return Err(format!(
                "need pods >= services >= namespaces (got {pods}, {services}, {namespaces})"
            ));
        }
        Ok(Self {
            pods,
            services,
            namespaces,
            interval,
            end: end - end.rem_euclid(interval),
        })
    }

    /// The history's first sample time.
    pub fn start(&self) -> i64 {
        self.end - TIMELINE.history_days * DAY
    }

    /// Unix seconds of `day` (from the start) plus `secs`.
    pub fn at(&self, day: i64, secs: i64) -> i64 {
        self.start() + day * DAY + secs
    }
}

/// One pod's life: a pod name and instance, on one version, between two
/// restarts.
#[derive(Clone, Debug)]
struct Life {
    namespace: usize,
    service: usize,
    tier: usize,
    pod: String,
    instance: String,
    version: &'static str,
    /// Where in each interval the pod is scraped, seconds: like a real
    /// scrape, never on the minute (so never exactly on a query's edge).
    offset: i64,
    /// First and past-the-last sample times.
    from: i64,
    until: i64,
    /// Whether this life ended in a drain that cut streams.
    cut: bool,
    /// When its shim restarted in the pod (its counters start again from 0).
    restart: Option<i64>,
}

/// A wave as it happened: the tier, its step (3 or 5), start and end.
#[derive(Clone, Debug, Serialize)]
pub struct SimWave {
    pub tier: String,
    pub step: u8,
    pub namespaces: Vec<String>,
    pub version: &'static str,
    pub start: i64,
    pub end: i64,
}

/// The simulated fleet: its tiers, every pod life and every wave.
pub struct Fleet {
    pub shape: Shape,
    /// Tier names and their namespaces, in rollout order.
    pub tiers: Vec<(String, Vec<String>)>,
    pub waves: Vec<SimWave>,
    lives: Vec<Life>,
}

fn namespace_name(k: usize) -> String {
    format!("ns-{k:03}")
}

fn service_name(k: usize) -> String {
    format!("svc-{k:04}")
}

impl Fleet {
    pub fn new(shape: Shape) -> Self {
        let t = &TIMELINE;
        let g = shape.interval;
        let on_grid = |x: i64| x - (x - shape.start()).rem_euclid(g);
        // Namespaces to tiers by share, each tier at least one.
        let mut tier_of_ns = Vec::with_capacity(shape.namespaces);
        let mut tier_first = Vec::new();
        let mut tiers = Vec::new();
        let mut next = 0usize;
        for (k, (name, share)) in t.tiers.iter().enumerate() {
            let left_for_others = t.tiers.len() - k - 1;
            let n = if left_for_others == 0 {
                shape.namespaces - next
            } else {
                ((shape.namespaces as f64 * share).round() as usize)
                    .max(1)
                    .min(shape.namespaces - next - left_for_others)
            };
            tiers.push((
                name.to_string(),
                (next..next + n).map(namespace_name).collect::<Vec<_>>(),
            ));
            tier_first.push(next);
            tier_of_ns.extend(std::iter::repeat_n(k, n));
            next += n;
        }
        // When each namespace restarts, per step; and the waves.
        let mut switch = [vec![0i64; shape.namespaces], vec![0i64; shape.namespaces]];
        let mut waves = Vec::new();
        for (tier, (name, nss)) in tiers.iter().enumerate() {
            let first = tier_first[tier];
            for (s, (days, version)) in [(&t.to_n1, VERSIONS[1]), (&t.to_n, VERSIONS[2])]
                .into_iter()
                .enumerate()
            {
                let start = shape.at(days[tier], 0);
                let k = nss.len() as i64;
                let mut end = start;
                for j in 0..k {
                    let at = if s == 0 && tier == t.stalled.0 {
                        // Half of the namespaces in the first half of the
                        // wave, then nothing until the stall is lifted.
                        let half = (k + 1) / 2;
                        if j < half {
                            start + j * (t.wave / 2) / half
                        } else {
                            shape.at(t.stalled.1, (j - half) * (t.wave / 2) / (k - half))
                        }
                    } else {
                        start + j * t.wave / k
                    };
                    let at = on_grid(at);
                    switch[s][first + j as usize] = at;
                    end = end.max(at + g);
                }
                waves.push(SimWave {
                    tier: name.clone(),
                    step: if s == 0 { 3 } else { 5 },
                    namespaces: nss.clone(),
                    version,
                    start,
                    end,
                });
            }
        }
        // The pod whose shim restarts: the first of the last namespace of
        // its tier, which that tier's restart to n reaches last.
        let restarting_ns = tier_first[t.shim_restart] + tiers[t.shim_restart].1.len() - 1;
        let restarting_pod =
            (0..shape.pods).find(|p| (p % shape.services) % shape.namespaces == restarting_ns);
        // Every pod's three lives.
        let mut lives = Vec::with_capacity(shape.pods * 3);
        for p in 0..shape.pods {
            let service = p % shape.services;
            let namespace = service % shape.namespaces;
            let tier = tier_of_ns[namespace];
            let bounds = [
                shape.start(),
                switch[0][namespace],
                switch[1][namespace],
                shape.end + LEAD,
            ];
            for gen in 0..3 {
                lives.push(Life {
                    namespace,
                    service,
                    tier,
                    pod: format!("{}-r{gen}-{p:05}", service_name(service)),
                    instance: format!("10.{}.{}.{}:15099", gen, p / 256, p % 256),
                    version: VERSIONS[gen],
                    offset: 1 + 10 * (p as i64 % ((g - 1) / 10)),
                    from: bounds[gen],
                    until: bounds[gen + 1],
                    cut: gen == 1 && tier == t.cuts,
                    // One shim restarts in its pod an hour before the pod
                    // is replaced, inside its tier's wave to n: `verify` of
                    // that wave meets a counter reset (weeks of counts back
                    // to 0), and must still pass.
                    restart: (gen == 1 && Some(p) == restarting_pod).then(|| bounds[2] - HOUR),
                });
            }
        }
        Self {
            shape,
            tiers,
            waves,
            lives,
        }
    }

    /// The tiers file `plan --tiers` reads.
    pub fn tiers_toml(&self) -> String {
        let mut out = String::new();
        for (name, nss) in &self.tiers {
            let list: Vec<String> = nss.iter().map(|n| format!("{n:?}")).collect();
            out.push_str(&format!(
                "[[tier]]\nname = {name:?}\nnamespaces = [{}]\n\n",
                list.join(", ")
            ));
        }
        out
    }

    /// Sample times of `life` in [from, until), every `step` seconds on the
    /// history's grid.
    fn times(&self, life: &Life, from: i64, until: i64, step: i64) -> impl Iterator<Item = i64> {
        let start = self.shape.start() + life.offset;
        let from = from.max(life.from).max(start);
        let until = until.min(life.until);
        let first = from + (step - (from - start).rem_euclid(step)) % step;
        (0..)
            .map(move |i| first + i * step)
            .take_while(move |t| *t < until)
    }

    /// Writes every series into `sink`, family by family.
    pub fn write(&self, sink: &mut dyn Sink) -> io::Result<u64> {
        let t = &TIMELINE;
        let g = self.shape.interval;
        let mut points = Vec::new();
        // The inventory over the whole history.
        sink.family("drainshim_proxy_info")?;
        for l in &self.lives {
            points.clear();
            points.extend(self.times(l, i64::MIN, i64::MAX, g).map(|x| (x, 1.0)));
            let ns = namespace_name(l.namespace);
            sink.series(
                "drainshim_proxy_info",
                &[
                    ("instance", &l.instance),
                    ("job", "drainshim"),
                    ("mesh_version", l.version),
                    ("namespace", &ns),
                    ("pod", &l.pod),
                    ("version", l.version),
                ],
                &points,
            )?;
        }
        sink.family("drainshim_guard_max_connection_age_seconds")?;
        for l in &self.lives {
            let set = self.shape.at(t.lifetime[l.tier], 0);
            points.clear();
            points.extend(
                self.times(l, i64::MIN, i64::MAX, g)
                    .map(|x| (x, if x >= set { t.max_age } else { 0.0 })),
            );
            sink.series(
                "drainshim_guard_max_connection_age_seconds",
                &[("instance", &l.instance), ("job", "drainshim")],
                &points,
            )?;
        }
        // Every shim's drain timers, the sidecar's defaults: what `plan`'s
        // drain-timers step compares with each service's calls. It reads
        // them at one instant, so they are written only in the two hours
        // before each moment `plan` is judged at (over ten weeks they would
        // be four times the max age's samples, the bench's disk and
        // promtool's memory again).
        sink.family("drainshim_drain_timer_seconds")?;
        let judged = super::plan_moments(&self.shape).map(|(_, _, at)| at);
        for l in &self.lives {
            for (timer, secs) in DRAIN_TIMERS {
                points.clear();
                for at in judged {
                    points.extend(self.times(l, at - 2 * HOUR, at + 1, g).map(|x| (x, secs)));
                }
                sink.series(
                    "drainshim_drain_timer_seconds",
                    &[
                        ("instance", &l.instance),
                        ("job", "drainshim"),
                        ("timer", timer),
                    ],
                    &points,
                )?;
            }
        }
        sink.family("drainshim_draining")?;
        for l in &self.lives {
            points.clear();
            points.extend(
                self.times(l, self.shape.end - 2 * HOUR, i64::MAX, g)
                    .map(|x| (x, 0.0)),
            );
            sink.series(
                "drainshim_draining",
                &[("instance", &l.instance), ("job", "drainshim")],
                &points,
            )?;
        }
        // The traffic around each wave.
        for family in traffic_families() {
            sink.family(family)?;
            for w in &self.waves {
                let dur = w.end - w.start;
                let step = g.max((dur / 36 + g - 1) / g * g);
                let (from, until) = (w.start - dur - 4 * HOUR, w.end + 4 * HOUR);
                let tier = self.tiers.iter().position(|(n, _)| *n == w.tier);
                for l in self.lives.iter().filter(|l| Some(l.tier) == tier) {
                    let times: Vec<i64> = self.times(l, from, until, step).collect();
                    if times.is_empty() {
                        continue;
                    }
                    let last = *times.last().unwrap_or(&0);
                    let service = format!("{}.Api", service_name(l.service));
                    for (own, value) in traffic(family, l, &service) {
                        points.clear();
                        points.extend(times.iter().map(|&x| {
                            let drained = l.until <= self.shape.end && x == last;
                            (
                                x,
                                value.at(Moment {
                                    life: l,
                                    t: x,
                                    drained,
                                }),
                            )
                        }));
                        let mut all: Vec<(&str, &str)> =
                            vec![("instance", &l.instance), ("job", "drainshim")];
                        all.extend(own.iter().map(|(k, v)| (*k, v.as_str())));
                        sink.series(family, &all, &points)?;
                    }
                }
            }
        }
        sink.finish()
    }
}

/// A pod life at one sample time.
#[derive(Clone, Copy)]
struct Moment<'a> {
    life: &'a Life,
    t: i64,
    /// The life's last sample before a restart: its drain report is out.
    drained: bool,
}

/// How a traffic series' value follows the pod's life.
#[derive(Clone, Copy)]
enum Value {
    /// A counter at this share of the pod's requests.
    Requests(f64),
    /// A counter growing at this rate per second.
    PerSecond(f64),
    /// The latency histogram's sum: 12 ms a request.
    LatencySum,
    /// A drain report counter: this many streams on the last sample before
    /// a restart.
    Drained(f64),
}

impl Value {
    fn at(self, m: Moment<'_>) -> f64 {
        let since = match m.life.restart {
            Some(r) if m.t >= r => r,
            _ => m.life.from,
        };
        let up = (m.t - since) as f64;
        // Each pod serves 2 to 8 requests a second.
        let rps = 2.0 + (m.life.service % 7) as f64;
        match self {
            Value::Requests(share) => (rps * share * up).floor(),
            Value::PerSecond(r) => (r * up).floor(),
            Value::LatencySum => rps * up * 0.012,
            Value::Drained(n) if m.drained => n,
            Value::Drained(_) => 0.0,
        }
    }
}

/// The drain timers every simulated shim runs (the sidecar's defaults).
const DRAIN_TIMERS: [(&str, f64); 5] = [
    ("deregistration_delay", 5.0),
    ("min_drain_time", 5.0),
    ("drain_time", 60.0),
    ("parent_shutdown_time", 90.0),
    // The shipped manifests' --termination-grace-period.
    ("termination_grace_period", 120.0),
];

/// The latency histogram: the share of requests at or under each bucket
/// (a shim's edges, `RPC_LATENCY_BUCKETS`).
const LATENCY: [(&str, f64); 19] = [
    ("0.001", 0.05),
    ("0.0025", 0.15),
    ("0.005", 0.35),
    ("0.01", 0.6),
    ("0.025", 0.8),
    ("0.05", 0.9),
    ("0.1", 0.95),
    ("0.25", 0.985),
    ("0.5", 0.995),
    ("1.0", 0.999),
    ("2.5", 1.0),
    ("5.0", 1.0),
    ("10.0", 1.0),
    ("30.0", 1.0),
    ("60.0", 1.0),
    ("90.0", 1.0),
    ("120.0", 1.0),
    ("300.0", 1.0),
    ("+Inf", 1.0),
];

/// The traffic families, as a sidecar shim exports them (no namespace
/// label: the fleet tools join them to `drainshim_proxy_info` on
/// `instance`): every counter the fleet tools read, the request-duration
/// histogram and the drain report.
fn traffic_families() -> impl Iterator<Item = &'static str> {
    drainshim::fleet::golden::COUNTERS
        .into_iter()
        .map(|(_, metric)| metric)
        .chain([
            "drainshim_guard_request_duration_seconds_bucket",
            "drainshim_guard_request_duration_seconds_count",
            "drainshim_guard_request_duration_seconds_sum",
            "drainshim_drained_streams_total",
        ])
}

type Labels = Vec<(&'static str, String)>;

fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// The series of `family` for one pod life, whose service is `svc`.
fn traffic(family: &str, life: &Life, svc: &str) -> Vec<(Labels, Value)> {
    let grpc = ("protocol", "grpc");
    match family {
        "drainshim_guard_requests_total" => vec![
            (
                labels(&[("code", "OK"), grpc, ("service", svc)]),
                Value::Requests(0.999),
            ),
            (
                labels(&[("code", "UNAVAILABLE"), grpc, ("service", svc)]),
                Value::Requests(0.001),
            ),
        ],
        "drainshim_guard_request_duration_seconds_bucket" => LATENCY
            .iter()
            .map(|(le, share)| {
                (
                    labels(&[("le", le), ("service", svc)]),
                    Value::Requests(*share),
                )
            })
            .collect(),
        "drainshim_guard_request_duration_seconds_count" => {
            vec![(labels(&[("service", svc)]), Value::Requests(1.0))]
        }
        "drainshim_guard_request_duration_seconds_sum" => {
            vec![(labels(&[("service", svc)]), Value::LatencySum)]
        }
        "drainshim_envoy_downstream_requests_total" => vec![(Vec::new(), Value::Requests(1.0))],
        "drainshim_guard_streams_opened_total" => {
            vec![(labels(&[grpc, ("service", svc)]), Value::PerSecond(0.02))]
        }
        "drainshim_streams_terminated_total" => vec![(
            labels(&[grpc, ("reason", "max_age")]),
            Value::PerSecond(0.02),
        )],
        "drainshim_streams_ungraceful_total" => vec![(
            labels(&[grpc, ("reason", "deadline")]),
            Value::PerSecond(0.0),
        )],
        "drainshim_envoy_upstream_retries_total" => vec![(Vec::new(), Value::Requests(0.002))],
        "drainshim_tcp_resets_total" => {
            vec![(labels(&[("kind", "EstabResets")]), Value::PerSecond(0.001))]
        }
        "drainshim_drained_streams_total" => vec![
            (labels(&[("outcome", "drained")]), Value::Drained(12.0)),
            (
                labels(&[("outcome", "cut")]),
                Value::Drained(if life.cut { 2.0 } else { 0.0 }),
            ),
        ],
        _ => Vec::new(),
    }
}

/// Where the series go: a store's import format.
pub trait Sink {
    /// A new metric family begins (every series of a family is written
    /// together).
    fn family(&mut self, name: &str) -> io::Result<()>;
    /// One series and its points (Unix seconds, value), in time order.
    fn series(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        points: &[(i64, f64)],
    ) -> io::Result<()>;
    /// Ends the output; the number of samples written.
    fn finish(&mut self) -> io::Result<u64>;
}

/// OpenMetrics text with timestamps in seconds, as
/// `promtool tsdb create-blocks-from openmetrics` reads it.
pub struct OpenMetrics<W: Write> {
    out: W,
    samples: u64,
}

impl<W: Write> OpenMetrics<W> {
    pub fn new(out: W) -> Self {
        Self { out, samples: 0 }
    }
}

fn label_text(labels: &[(&str, &str)]) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{v}\""))
        .collect::<Vec<_>>()
        .join(",")
}

impl<W: Write> Sink for OpenMetrics<W> {
    fn family(&mut self, name: &str) -> io::Result<()> {
        writeln!(self.out, "# TYPE {name} unknown")
    }
    fn series(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        points: &[(i64, f64)],
    ) -> io::Result<()> {
        let head = format!("{name}{{{}}}", label_text(labels));
        for (t, v) in points {
            writeln!(self.out, "{head} {v} {t}")?;
        }
        self.samples += points.len() as u64;
        Ok(())
    }
    fn finish(&mut self) -> io::Result<u64> {
        writeln!(self.out, "# EOF")?;
        self.out.flush()?;
        Ok(self.samples)
    }
}

/// VictoriaMetrics' JSON lines import (`/api/v1/import`): one line per
/// series, timestamps in milliseconds.
pub struct JsonLines<W: Write> {
    out: W,
    samples: u64,
}

impl<W: Write> JsonLines<W> {
    pub fn new(out: W) -> Self {
        Self { out, samples: 0 }
    }
}

impl<W: Write> Sink for JsonLines<W> {
    fn family(&mut self, _: &str) -> io::Result<()> {
        Ok(())
    }
    fn series(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        points: &[(i64, f64)],
    ) -> io::Result<()> {
        if points.is_empty() {
            return Ok(());
        }
        let mut metric = serde_json::Map::new();
        metric.insert("__name__".into(), name.into());
        for (k, v) in labels {
            metric.insert((*k).into(), (*v).into());
        }
        let line = serde_json::json!({
            "metric": metric,
            "values": points.iter().map(|(_, v)| *v).collect::<Vec<_>>(),
            "timestamps": points.iter().map(|(t, _)| t * 1000).collect::<Vec<_>>(),
        });
        serde_json::to_writer(&mut self.out, &line)?;
        self.out.write_all(b"\n")?;
        self.samples += points.len() as u64;
        Ok(())
    }
    fn finish(&mut self) -> io::Result<u64> {
        self.out.flush()?;
        Ok(self.samples)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Fleet {
        let end = 1_800_000_000;
        Fleet::new(Shape::new(40, 12, 8, Duration::from_secs(600), end).unwrap())
    }

    #[test]
    fn tiers_cover_every_namespace_once_in_order() {
        let f = small();
        let names: Vec<&str> = f.tiers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["canary", "early", "main", "late"]);
        let all: Vec<String> = f.tiers.iter().flat_map(|(_, n)| n.clone()).collect();
        assert_eq!(all, (0..8).map(namespace_name).collect::<Vec<_>>());
        assert!(f.tiers.iter().all(|(_, n)| !n.is_empty()));
        assert!(parse(&f.tiers_toml()).is_ok());
    }

    fn parse(s: &str) -> Result<Vec<drainshim::fleet::plan::TierSpec>, String> {
        drainshim::fleet::plan::parse_tiers(s)
    }

    #[test]
    fn the_stalled_wave_is_half_done_for_days() {
        let f = small();
        let main = f
            .waves
            .iter()
            .find(|w| w.tier == "main" && w.step == 3)
            .unwrap();
        assert!(main.end - main.start > 2 * DAY, "{main:?}");
        let late = f
            .waves
            .iter()
            .find(|w| w.tier == "late" && w.step == 5)
            .unwrap();
        assert!(late.end - late.start <= TIMELINE.wave, "{late:?}");
    }

    #[test]
    fn every_series_is_in_time_order_and_pods_never_overlap() {
        struct Check(u64);
        impl Sink for Check {
            fn family(&mut self, _: &str) -> io::Result<()> {
                Ok(())
            }
            fn series(&mut self, _: &str, _: &[(&str, &str)], p: &[(i64, f64)]) -> io::Result<()> {
                assert!(p.windows(2).all(|w| w[0].0 < w[1].0));
                self.0 += p.len() as u64;
                Ok(())
            }
            fn finish(&mut self) -> io::Result<u64> {
                Ok(self.0)
            }
        }
        let f = small();
        assert!(f.write(&mut Check(0)).unwrap() > 0);
        for p in f.lives.chunks(3) {
            assert!(p[0].until <= p[1].from && p[1].until <= p[2].from);
        }
    }

    #[test]
    fn both_formats_carry_the_same_samples() {
        let f = small();
        let (mut om, mut js) = (Vec::new(), Vec::new());
        let a = f.write(&mut OpenMetrics::new(&mut om)).unwrap();
        let b = f.write(&mut JsonLines::new(&mut js)).unwrap();
        assert_eq!(a, b);
        let text = String::from_utf8(om).unwrap();
        assert!(text.ends_with("# EOF\n"));
        assert_eq!(
            text.lines().filter(|l| !l.starts_with('#')).count() as u64,
            a
        );
    }
}
