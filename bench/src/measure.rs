//! Turns a population's sessions into the reconnect figures of docs/design.md
//! (`bench reconnect --format json`): cut and graceful counts, lost
//! messages, reconnect latency, and the reconnect storm's peak-to-mean.

use std::io;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::client::Ending;
use super::population::{Session, StreamKind};
use super::server::Ledger;

/// CPU time (user + system, all threads) that process `pid` used so far,
/// from `/proc/PID/stat`: what the benchmarks divide by the requests served.
pub fn cpu_time(pid: u32) -> io::Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path)?;
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected format of {path}"),
        )
    };
    // Fields after the command name, which is in parentheses and may hold
    // spaces, start at `state` (field 3): utime and stime are fields 14 and 15.
    let (_, after) = text.rsplit_once(')').ok_or_else(bad)?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    let (Some(user), Some(system)) = (ticks(11), ticks(12)) else {
        return Err(bad());
    };
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|hz| *hz > 0)
        .unwrap_or(100) as f64;
    Ok(Duration::from_secs_f64((user + system) as f64 / hz))
}

/// The whole machine's CPU counters, every core, from `/proc/stat`: two
/// readings tell how busy the machine was between them.
#[derive(Clone, Copy, Debug, Default)]
pub struct MachineCpu {
    busy: u64,
    total: u64,
}

// === impl MachineCpu ===

impl MachineCpu {
    pub fn now() -> io::Result<Self> {
        Self::parse(&std::fs::read_to_string("/proc/stat")?).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "unexpected format of /proc/stat",
            )
        })
    }

    /// The `cpu` line: user nice system idle iowait irq softirq steal, in
    /// clock ticks (the guest columns are already inside user and nice).
    fn parse(stat: &str) -> Option<Self> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let ticks: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        if ticks.len() < 5 {
            return None;
        }
        let total: u64 = ticks.iter().sum();
        Some(Self {
            busy: total - ticks[3] - ticks[4],
            total,
        })
    }

    /// The share of the machine in use from `self` to `later`, 0 to 1.
    pub fn busy_until(self, later: MachineCpu) -> f64 {
        let total = later.total.saturating_sub(self.total);
        if total == 0 {
            return 0.0;
        }
        later.busy.saturating_sub(self.busy) as f64 / total as f64
    }
}

/// Above this share of the machine in use, a row's times measure the machine.
pub const SATURATED: f64 = 0.95;

/// The storm is measured in buckets of this width (docs/design.md).
pub const BUCKET: Duration = Duration::from_millis(100);

/// One mode's result.
#[derive(Clone, Debug, Serialize)]
pub struct ModeResult {
    pub mode: String,
    /// `grpc` or `websocket`: the kind of stream this row counts.
    pub protocol: String,
    /// Streams held open in the whole population.
    pub streams: usize,
    /// Streams on the restarted pod when the restart began.
    pub streams_on_restarted_pod: usize,
    /// Of those: ended with retryable trailers (or completed).
    pub graceful: usize,
    /// Of those: ended by a transport error or reset.
    pub cut: usize,
    /// Streams (of every protocol) the restarted pod's drain found on
    /// Envoy's fail-open path at its deadline: they had gone around the
    /// guard, so nothing could end them gracefully (drainshim mode; 0
    /// otherwise).
    pub bypassed: u64,
    /// Connections Envoy failed to make to its upstreams (the guard, or
    /// the app behind it), both pods, over the run: each one a call that
    /// went around a live guard if its retry found the app.
    pub envoy_connect_failures: u64,
    /// Envoy's failed health checks of its upstreams, both pods.
    pub envoy_health_check_failures: u64,
    /// Messages the backend handed to its transport that the client never got.
    pub lost_messages: u64,
    pub reconnect_p50_ms: f64,
    pub reconnect_p99_ms: f64,
    /// Peak reconnects per 100 ms over the mean, from the first reconnect to
    /// the last (at least 1 s): 1 is an even spread, a burst scores high.
    pub storm_peak_to_mean: f64,
    /// Subscribe attempts after the restart began that delivered a first message.
    pub success_rate: f64,
    /// From the start of the restart to the old pod's exit.
    pub restart_seconds: f64,
    /// The machine's CPU in use over that time, every core, 0 to 1. At
    /// [`SATURATED`] and above, reconnect times and the storm measure the
    /// machine that runs both pods and every client, not the restart.
    pub machine_cpu_busy: f64,
    /// Reconnects per 100 ms bucket from one second before the restart, for the plot.
    #[serde(skip)]
    pub timeline: Vec<u32>,
}

/// Inputs of one measurement.
pub struct Observed<'a> {
    pub mode: &'a str,
    /// Only sessions of this kind are counted.
    pub kind: StreamKind,
    pub streams: usize,
    pub sessions: &'a [Session],
    /// Which endpoint index was restarted.
    pub restarted: usize,
    pub trigger: Instant,
    pub done: Instant,
    pub ledger: &'a Ledger,
    /// (attempts, successes) at the trigger and at the end.
    pub attempts_at_trigger: (u64, u64),
    pub attempts_at_end: (u64, u64),
}

pub fn summarize(o: &Observed) -> ModeResult {
    // Streams alive on the restarted pod at the trigger.
    let victims: Vec<&Session> = o
        .sessions
        .iter()
        .filter(|s| {
            s.kind == o.kind
                && s.endpoint == o.restarted
                && s.started <= o.trigger
                && s.ended >= o.trigger
        })
        .collect();
    let graceful = victims
        .iter()
        .filter(|s| matches!(s.ending, Ending::Graceful | Ending::Completed))
        .count();
    let cut = victims.iter().filter(|s| s.ending == Ending::Cut).count();
    let lost_messages = o.ledger.lost(victims.iter().copied());

    // Reconnects caused by the restart: new sessions of the victims' clients.
    let victim_clients: std::collections::HashSet<usize> =
        victims.iter().map(|s| s.client).collect();
    let mut reconnects: Vec<&Session> = o
        .sessions
        .iter()
        .filter(|s| {
            s.started > o.trigger && victim_clients.contains(&s.client) && s.reconnect.is_some()
        })
        .collect();
    reconnects.sort_by_key(|s| s.started);
    let mut latencies: Vec<f64> = reconnects
        .iter()
        .filter_map(|s| s.reconnect)
        .map(|d| d.as_secs_f64() * 1000.0)
        .collect();
    latencies.sort_by(f64::total_cmp);

    let starts: Vec<Instant> = reconnects.iter().map(|s| s.started).collect();
    let storm_peak_to_mean = peak_to_mean(&starts);
    let origin = o
        .trigger
        .checked_sub(Duration::from_secs(1))
        .unwrap_or(o.trigger);
    let end = starts.last().copied().unwrap_or(o.done).max(o.done);
    let n_buckets =
        (end.saturating_duration_since(origin).as_millis() / BUCKET.as_millis()) as usize + 1;
    let mut timeline = vec![0u32; n_buckets.min(100_000)];
    for t in &starts {
        let b = (t.saturating_duration_since(origin).as_millis() / BUCKET.as_millis()) as usize;
        if let Some(slot) = timeline.get_mut(b) {
            *slot += 1;
        }
    }
    let (a0, s0) = o.attempts_at_trigger;
    let (a1, s1) = o.attempts_at_end;
    let success_rate = if a1 > a0 {
        (s1 - s0) as f64 / (a1 - a0) as f64
    } else {
        1.0
    };
    ModeResult {
        mode: o.mode.to_string(),
        protocol: o.kind.name().to_string(),
        streams: o.streams,
        streams_on_restarted_pod: victims.len(),
        graceful,
        cut,
        bypassed: 0,
        envoy_connect_failures: 0,
        envoy_health_check_failures: 0,
        lost_messages,
        reconnect_p50_ms: percentile(&latencies, 0.50),
        reconnect_p99_ms: percentile(&latencies, 0.99),
        storm_peak_to_mean,
        success_rate,
        restart_seconds: o.done.saturating_duration_since(o.trigger).as_secs_f64(),
        machine_cpu_busy: 0.0,
        timeline,
    }
}

/// What drainshim mode must never do, one line per row that did it: cut a
/// stream, let one go around the guard, or lose a message. Empty when
/// every drainshim row is clean (the baselines cut by design).
pub fn drainshim_failures(results: &[ModeResult]) -> Vec<String> {
    results
        .iter()
        .filter(|r| r.mode == "drainshim")
        .filter(|r| r.cut > 0 || r.bypassed > 0 || r.lost_messages > 0)
        .map(|r| {
            format!(
                "drainshim mode, {}: {} cut, {} bypassed the guard, {} messages lost (want 0 each)",
                r.protocol, r.cut, r.bypassed, r.lost_messages
            )
        })
        .collect()
}

/// One warning per row measured on a saturated machine.
pub fn saturation_warnings(results: &[ModeResult]) -> Vec<String> {
    results
        .iter()
        .filter(|r| r.machine_cpu_busy >= SATURATED)
        .map(|r| {
            format!(
                "{} mode, {}: the machine was {:.0}% busy during the restart, so its reconnect \
                 times and storm measure this machine, not the restart; fewer --streams or a \
                 longer --tick leave it room",
                r.mode,
                r.protocol,
                r.machine_cpu_busy * 100.0
            )
        })
        .collect()
}

/// Nearest-rank percentile of sorted values; 0 when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The shortest window a storm is judged over: reconnects that all land in
/// the same instant are a storm, not an even spread over one bucket.
pub const MIN_STORM_WINDOW: Duration = Duration::from_secs(1);

/// Peak events per 100 ms bucket over the mean per bucket, over the window
/// from the first event to the last, but at least [`MIN_STORM_WINDOW`].
/// 1.0 is a perfectly even spread; a burst scores high.
pub fn peak_to_mean(times: &[Instant]) -> f64 {
    let (Some(first), Some(last)) = (times.iter().min(), times.iter().max()) else {
        return 0.0;
    };
    let span = last.saturating_duration_since(*first).max(MIN_STORM_WINDOW);
    let n = (span.as_millis() / BUCKET.as_millis()) as usize + 1;
    let mut buckets = vec![0u32; n];
    for t in times {
        let b = (t.saturating_duration_since(*first).as_millis() / BUCKET.as_millis()) as usize;
        buckets[b.min(n - 1)] += 1;
    }
    let peak = f64::from(buckets.iter().copied().max().unwrap_or(0));
    let mean = times.len() as f64 / n as f64;
    peak / mean
}

/// The side-by-side table.
pub fn render_table(results: &[ModeResult]) -> String {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            vec![
                r.mode.clone(),
                r.protocol.clone(),
                r.streams_on_restarted_pod.to_string(),
                r.graceful.to_string(),
                r.cut.to_string(),
                r.bypassed.to_string(),
                r.lost_messages.to_string(),
                format!("{:.0}", r.reconnect_p50_ms),
                format!("{:.0}", r.reconnect_p99_ms),
                format!("{:.2}", r.storm_peak_to_mean),
                format!("{:.3}", r.success_rate),
                format!("{:.1}", r.restart_seconds),
                format!("{:.0}%", r.machine_cpu_busy * 100.0),
            ]
        })
        .collect();
    drainshim::fleet::table(
        &[
            "MODE",
            "PROTOCOL",
            "STREAMS_ON_POD",
            "GRACEFUL",
            "CUT",
            "BYPASSED",
            "LOST_MSGS",
            "RECONNECT_P50_MS",
            "RECONNECT_P99_MS",
            "STORM_PEAK/MEAN",
            "SUCCESS",
            "RESTART_S",
            "CPU_BUSY",
        ],
        &rows,
    )
}

/// Reconnects per 100 ms over time, one line per mode, as SVG.
pub fn plot(results: &[ModeResult], path: &Path) -> Result<(), String> {
    use plotters::prelude::*;
    let max_x = results
        .iter()
        .map(|r| r.timeline.len())
        .max()
        .unwrap_or(1)
        .max(2);
    let max_y = results
        .iter()
        .flat_map(|r| r.timeline.iter().copied())
        .max()
        .unwrap_or(1)
        .max(1);
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let x_secs = |b: usize| b as f64 * BUCKET.as_secs_f64() - 1.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Reconnects per 100 ms during a pod restart (t = 0: restart begins)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(x_secs(0)..x_secs(max_x), 0.0..(f64::from(max_y) * 1.1))
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("seconds since the restart began")
        .y_desc("reconnects / 100 ms")
        .draw()
        .map_err(|e| err(&e))?;
    // Red and blue for the baselines, a dark green that shows on white for drainshim.
    let colors = [RED, BLUE, RGBColor(0, 140, 0), MAGENTA, CYAN];
    for (i, r) in results.iter().enumerate() {
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(
                r.timeline
                    .iter()
                    .enumerate()
                    .map(|(b, v)| (x_secs(b), f64::from(*v))),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(format!(
                "{} {} (cut {}, peak/mean {:.2})",
                r.mode, r.protocol, r.cut, r.storm_peak_to_mean
            ))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_reads_a_live_process_and_names_a_missing_one() {
        cpu_time(std::process::id()).expect("this process's own stat");
        // Above any pid_max (at most 2^22): no such process.
        let e = cpu_time(u32::MAX).expect_err("no process has this pid");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn machine_cpu_is_busy_share_between_two_readings() {
        let a = MachineCpu::parse("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4 5\n")
            .expect("a cpu line");
        // 300 more busy ticks (user, system, softirq), 100 idle, 0 iowait.
        let b = MachineCpu::parse("cpu  250 0 200 800 100 0 50 0 0 0\n").expect("a cpu line");
        assert!((a.busy_until(b) - 0.75).abs() < 1e-9);
        assert_eq!(b.busy_until(b), 0.0);
        assert!(MachineCpu::parse("cpu0 1 2 3 4 5\n").is_none());
        assert!(MachineCpu::parse("cpu  1 x 3 4 5\n").is_none());
        MachineCpu::now().expect("this machine's /proc/stat");
        let busy = |b| ModeResult {
            mode: "drainshim".into(),
            protocol: "websocket".into(),
            streams: 2,
            streams_on_restarted_pod: 1,
            graceful: 1,
            cut: 0,
            bypassed: 0,
            envoy_connect_failures: 0,
            envoy_health_check_failures: 0,
            lost_messages: 0,
            reconnect_p50_ms: 1.0,
            reconnect_p99_ms: 1.0,
            storm_peak_to_mean: 1.0,
            success_rate: 1.0,
            restart_seconds: 1.0,
            machine_cpu_busy: b,
            timeline: Vec::new(),
        };
        assert_eq!(saturation_warnings(&[busy(0.5), busy(0.97)]).len(), 1);
    }

    #[test]
    fn percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn evenly_spread_events_have_a_low_peak_to_mean() {
        let t0 = Instant::now();
        // 200 events 40 ms apart: 2 or 3 per 100 ms bucket.
        let spread: Vec<Instant> = (0..200)
            .map(|i| t0 + Duration::from_millis(40 * i))
            .collect();
        let r = peak_to_mean(&spread);
        assert!(r <= 1.25, "{r}");
        // All in one burst after a long quiet period.
        let mut storm: Vec<Instant> = vec![t0; 100];
        storm.push(t0 + Duration::from_secs(5));
        assert!(peak_to_mean(&storm) > 40.0);
        // All in the same instant: still a storm.
        assert!(peak_to_mean(&vec![t0; 20]) >= 10.0);
    }
}
