//! `bench soak`: the sidecar binary under streams recycled by max age for
//! minutes (or days, by flag), its memory, file descriptors and threads
//! sampled over time.
//!
//! One pod as it runs in a cluster: real Envoy in front, the real
//! `drainshim sidecar` process with its guard and a max connection age,
//! the app behind it. A population of WebSockets holds `--streams` streams
//! through Envoy; each is ended gracefully at its connection's max age and
//! reconnects at once, so every recycled stream is also a new connection
//! through Envoy and the guard. The shim's `/proc` is sampled every few
//! seconds: RSS, open descriptors, threads, against the streams recycled so
//! far. A leak shows as growth per recycled stream: the report gives the
//! slope per 10^5 streams over the loaded part of the run, and the
//! descriptors once the clients left, against the idle shim's.
//!
//! `--node` soaks the node agent instead, on this file's loop: pods in network
//! namespaces, the streams through the agent's guards, and every
//! `--drain-every` one pod drained through the agent and replaced by a new
//! one, as a rollout does.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::client::{Ending, TICK_INTERVAL_MS};
use super::envoy::{EnvoyOptions, EnvoyProcess};
use super::population::{Endpoints, Population, Protocol};
use super::reconnect::{free_port, start_app};
use super::server::Ledger;

/// What a run asks.
#[derive(Clone, Debug)]
pub struct SoakOptions {
    pub envoy: PathBuf,
    /// The `drainshim` binary run as the sidecar (or the node agent).
    pub binary: PathBuf,
    /// The drainshim-bench binary, run as the node soak's admin stand-ins.
    pub stub: PathBuf,
    pub streams: usize,
    pub duration: Duration,
    /// Stop at the first sample with at least this many streams recycled.
    pub until_recycled: Option<u64>,
    pub max_connection_age: Duration,
    /// Time between two samples of the shim's `/proc`.
    pub sample_every: Duration,
    pub progress: bool,
    /// Node mode (`bench soak --node`): one pod drained and replaced this often.
    pub drain_every: Duration,
}

/// The shim's process at one moment.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Sample {
    /// Seconds since the population started (negative: before it).
    pub seconds: f64,
    /// Streams ended and reconnected so far.
    pub recycled: u64,
    pub rss_kib: u64,
    pub fds: u64,
    pub threads: u64,
    /// Tasks alive on its runtime (its `/status`).
    pub tasks: u64,
}

/// Growth limits the run is judged by: generous against an allocator's
/// noise, tight against a per-stream leak (100 bytes a stream is 9.5 MiB
/// per 10^5 streams).
pub const MAX_RSS_KIB_PER_1E5: f64 = 8.0 * 1024.0;
/// Descriptors the shim may hold past its idle count once the clients left.
pub const MAX_FDS_LEFT: u64 = 4;
/// Tasks it may run past its idle count once the clients left.
pub const MAX_TASKS_LEFT: u64 = 4;
/// Descriptors and tasks may grow by at most this many per 10^5 streams
/// while the load runs: one per hundred streams. A leak that the clients'
/// leaving frees (held per client, or until a listener's teardown) leaves
/// the counts after the run at idle, and is seen here instead. The counts
/// float with the connections being recycled at the sample (a few hundred
/// per 10^5 either way at a 0.5 s age), well under it.
pub const MAX_COUNT_PER_1E5: f64 = 1000.0;
/// The fewest recycled streams the slope is judged over: on fewer, an
/// allocator's few hundred KiB of noise reads as a growth per 10^5.
pub const MIN_JUDGED: u64 = 50_000;

#[derive(Clone, Debug, Serialize)]
pub struct SoakReport {
    /// `sidecar`, or `node agent` (the process sampled).
    pub subject: String,
    pub streams: usize,
    pub max_connection_age_seconds: f64,
    pub seconds: f64,
    /// Streams (each a new connection) ended and reconnected.
    pub recycled: u64,
    pub graceful: u64,
    pub cut: u64,
    pub lost_messages: u64,
    /// The shim before the population started.
    pub idle: Sample,
    /// The first sample after the warm-up (a fifth of the run).
    pub warm: Sample,
    /// The last sample under load.
    pub loaded: Sample,
    /// Once the clients left and the shim's descriptors settled.
    pub after: Sample,
    /// Least-squares growth per 10^5 recycled streams, after the warm-up.
    pub rss_kib_per_1e5: f64,
    /// The streams recycled over the samples the slopes are read from.
    pub judged_streams: u64,
    /// The run was asked to judge its growth (`--until-recycled`): fewer
    /// than [`MIN_JUDGED`] judged streams is then a failure, not a note.
    pub judge_required: bool,
    pub fds_per_1e5: f64,
    pub tasks_per_1e5: f64,
    /// Node mode: pods drained through the agent and replaced meanwhile.
    pub drains: u64,
    /// Node mode: drains that reported a stream cut or bypassed.
    pub drains_cut: u64,
    pub samples: Vec<Sample>,
}

impl SoakReport {
    /// Whether the run held: nothing cut or lost, no growth past the
    /// limits, descriptors back to idle.
    pub fn ok(&self) -> bool {
        self.failures().is_empty()
    }

    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.cut > 0 {
            out.push(format!("{} streams cut", self.cut));
        }
        if self.lost_messages > 0 {
            out.push(format!("{} messages lost", self.lost_messages));
        }
        if self.drains_cut > 0 {
            out.push(format!(
                "{} of {} drains cut or bypassed streams",
                self.drains_cut, self.drains
            ));
        }
        if self.judge_required && self.judged_streams < MIN_JUDGED {
            out.push(format!(
                "growth not judged: read over {} streams after the warm-up, fewer than {MIN_JUDGED} \
                 (the streams recycled too slowly for --duration)",
                self.judged_streams
            ));
        }
        if self.judged_streams >= MIN_JUDGED && self.rss_kib_per_1e5 > MAX_RSS_KIB_PER_1E5 {
            out.push(format!(
                "RSS grew {:.0} KiB per 10^5 streams (limit {MAX_RSS_KIB_PER_1E5:.0})",
                self.rss_kib_per_1e5
            ));
        }
        if self.judged_streams >= MIN_JUDGED {
            for (what, per_1e5) in [
                ("descriptors", self.fds_per_1e5),
                ("tasks", self.tasks_per_1e5),
            ] {
                if per_1e5 > MAX_COUNT_PER_1E5 {
                    out.push(format!(
                        "{what} grew {per_1e5:.0} per 10^5 streams under load \
                         (limit {MAX_COUNT_PER_1E5:.0})"
                    ));
                }
            }
        }
        if self.after.tasks > self.idle.tasks + MAX_TASKS_LEFT {
            out.push(format!(
                "{} tasks alive after the clients left, {} idle",
                self.after.tasks, self.idle.tasks
            ));
        }
        if self.after.fds > self.idle.fds + MAX_FDS_LEFT {
            out.push(format!(
                "{} descriptors open after the clients left, {} idle",
                self.after.fds, self.idle.fds
            ));
        }
        out
    }

    pub fn render(&self) -> String {
        let mib = |k: u64| k as f64 / 1024.0;
        let through = if self.subject == "sidecar" {
            "Envoy and the sidecar binary"
        } else {
            "the node agent's guards"
        };
        let mut out = format!(
            "soak: {} WebSockets through {through} for {:.0} s, max connection age {:.1} s: \
             {} streams recycled (each a new connection), {} graceful, {} cut, {} messages lost\n",
            self.streams,
            self.seconds,
            self.max_connection_age_seconds,
            self.recycled,
            self.graceful,
            self.cut,
            self.lost_messages
        );
        let judged = if self.judged_streams >= MIN_JUDGED {
            format!("limit {MAX_RSS_KIB_PER_1E5:.0}")
        } else {
            format!(
                "not judged: read over {} streams, fewer than {MIN_JUDGED}; run longer",
                self.judged_streams
            )
        };
        if self.drains > 0 {
            out.push_str(&format!(
                "pods drained through the agent and replaced: {}, {} with a stream cut or bypassed\n",
                self.drains, self.drains_cut
            ));
        }
        out.push_str(&format!(
            "{} RSS: idle {:.1} MiB, warm {:.1} MiB, loaded {:.1} MiB, after {:.1} MiB; growth {:+.0} KiB per 10^5 streams ({judged})\n",
            self.subject,
            mib(self.idle.rss_kib),
            mib(self.warm.rss_kib),
            mib(self.loaded.rss_kib),
            mib(self.after.rss_kib),
            self.rss_kib_per_1e5,
        ));
        out.push_str(&format!(
            "{} descriptors: idle {}, warm {}, loaded {}, after {} (at most {} more than idle); growth {:+.1} per 10^5 streams (limit {:.0}); threads {} -> {}\n",
            self.subject,
            self.idle.fds,
            self.warm.fds,
            self.loaded.fds,
            self.after.fds,
            MAX_FDS_LEFT,
            self.fds_per_1e5,
            MAX_COUNT_PER_1E5,
            self.idle.threads,
            self.loaded.threads
        ));
        out.push_str(&format!(
            "{} tasks: idle {}, warm {}, loaded {}, after {} (at most {} more than idle); growth {:+.1} per 10^5 streams (limit {:.0})\n",
            self.subject,
            self.idle.tasks,
            self.warm.tasks,
            self.loaded.tasks,
            self.after.tasks,
            MAX_TASKS_LEFT,
            self.tasks_per_1e5,
            MAX_COUNT_PER_1E5
        ));
        let failures = self.failures();
        if failures.is_empty() {
            out.push_str("soak: held\n");
        } else {
            out.push_str(&format!("soak: FAILED: {}\n", failures.join("; ")));
        }
        out
    }
}

/// The sidecar process, killed when dropped.
struct Shim {
    child: Child,
    pid: u32,
    log: PathBuf,
    control: std::net::SocketAddr,
}

/// What a soak holds load against: the process sampled, and what it does
/// between two samples (node mode drains and replaces pods).
pub(super) trait Subject {
    /// `sidecar`, `node agent`.
    fn name(&self) -> &'static str;
    fn pid(&self) -> u32;
    /// An error once the process exited, with its log's tail.
    fn alive(&mut self) -> Result<(), String>;
    /// Called after each sample under load, `elapsed` since it started.
    async fn between(&mut self, elapsed: Duration) -> Result<(), String>;
    /// Drains so far, and those that cut or bypassed a stream.
    fn drains(&self) -> (u64, u64);
    /// Where its `/status` answers (with `tasks`).
    fn status(&self) -> std::net::SocketAddr;
}

impl Subject for Shim {
    fn name(&self) -> &'static str {
        "sidecar"
    }
    fn pid(&self) -> u32 {
        self.pid
    }
    fn alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(format!(
                "the sidecar exited ({status}):\n{}",
                log_tail(&self.log)
            )),
            _ => Ok(()),
        }
    }
    async fn between(&mut self, _elapsed: Duration) -> Result<(), String> {
        Ok(())
    }
    fn drains(&self) -> (u64, u64) {
        (0, 0)
    }
    fn status(&self) -> std::net::SocketAddr {
        self.control
    }
}

/// A process at one moment, from its `/proc`.
pub(super) fn sample(pid: u32, seconds: f64, recycled: u64) -> Result<Sample, String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("read /proc/{pid}/status: {e}"))?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map_err(|e| format!("list /proc/{pid}/fd: {e}"))?
        .count() as u64;
    Ok(Sample {
        seconds,
        recycled,
        rss_kib: field("VmRSS:"),
        fds,
        threads: field("Threads:"),
        tasks: 0,
    })
}

/// A sample with the tasks from the process's `/status` (0 when it does
/// not answer within a few seconds).
async fn sample_all(subject: &impl Subject, seconds: f64, recycled: u64) -> Result<Sample, String> {
    let mut s = sample(subject.pid(), seconds, recycled)?;
    let addr = subject.status();
    let asked = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        let authority = addr.to_string();
        let (_, body) = drainshim::http::request(tcp, &authority, http::Method::GET, "/status")
            .await
            .ok()?;
        serde_json::from_slice::<serde_json::Value>(&body).ok()?["tasks"].as_u64()
    };
    s.tasks = tokio::time::timeout(Duration::from_secs(5), asked)
        .await
        .ok()
        .flatten()
        .unwrap_or(0);
    Ok(s)
}

/// The last lines of a log file.
pub(super) fn log_tail(log: &std::path::Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Least-squares slope of `y` over `x`; 0 with fewer than two distinct x.
pub fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let (mx, my) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x / n, b + y / n));
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (x, y) in points {
        sxy += (x - mx) * (y - my);
        sxx += (x - mx) * (x - mx);
    }
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx
    }
}

pub async fn run(opts: &SoakOptions) -> Result<SoakReport, String> {
    let say = |m: String| {
        if opts.progress {
            eprintln!("bench soak: {m}");
        }
    };
    let dir = tempfile::Builder::new()
        .prefix("drainshim-soak-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let ledger = Ledger::default();
    let stop = CancellationToken::new();
    let (_app_rt, app) = start_app(&ledger, &stop).await?;
    let (guard_port, control_port, admin_port) = (free_port()?, free_port()?, free_port()?);
    let guard = std::net::SocketAddr::from(([127, 0, 0, 1], guard_port));

    // Everything through the guard: no fallback to the app, no retry.
    let mut eo = EnvoyOptions::new(opts.envoy.clone(), guard);
    eo.admin_port = admin_port;
    eo.upstream_follows_downstream = true;
    let envoy = EnvoyProcess::start(&eo).await.map_err(|e| e.to_string())?;

    let log = dir.path().join("shim.log");
    let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let age = opts.max_connection_age;
    let child = Command::new(&opts.binary)
        .args([
            "sidecar".to_string(),
            format!("--envoy-admin=http://127.0.0.1:{admin_port}"),
            format!("--listen=127.0.0.1:{control_port}"),
            format!("--guard-listen={guard}"),
            format!("--guard-upstream={app}"),
            format!("--max-connection-age={}ms", age.as_millis()),
            "--max-connection-age-grace=0s".into(),
            "--max-connection-age-spread=0s".into(),
            format!(
                "--guard-max-connections={}",
                (opts.streams * 3 / 2).max(2048)
            ),
            "--log=warn".into(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("start {}: {e}", opts.binary.display()))?;
    let pid = child.id().ok_or("the sidecar exited at once")?;
    let control = std::net::SocketAddr::from(([127, 0, 0, 1], control_port));
    let mut shim = Shim {
        child,
        pid,
        log,
        control,
    };
    wait_ready(&mut shim, control_port).await?;

    say(format!("sidecar up (pid {pid})"));
    let report = soak(
        opts,
        &mut shim,
        Endpoints::new(vec![envoy.inbound]),
        &ledger,
    )
    .await;
    stop.cancel();
    drop(envoy);
    report
}

/// The samples the slopes are read from: those after the warm-up (the
/// first fifth of the samples).
fn loaded(samples: &[Sample]) -> &[Sample] {
    &samples[(samples.len() / 5).min(samples.len())..]
}

/// The streams recycled over [`loaded`] samples.
fn judged(samples: &[Sample]) -> u64 {
    let part = loaded(samples);
    match (part.first(), part.last()) {
        (Some(a), Some(b)) => b.recycled.saturating_sub(a.recycled),
        _ => 0,
    }
}

/// Whether a run to `until_recycled` streams may stop: they were recycled,
/// and the slope can be judged over them. A run whose rate fell after the
/// warm-up goes on (up to its duration) rather than stop short of judging.
fn enough(until_recycled: Option<u64>, samples: &[Sample]) -> bool {
    until_recycled.is_some_and(|n| {
        samples.last().is_some_and(|s| s.recycled >= n) && judged(samples) >= MIN_JUDGED
    })
}

/// Holds `opts.streams` WebSockets on `endpoints`, recycled by max age, and
/// samples `subject` until `opts.duration` is over (or `opts.until_recycled`
/// streams were recycled); then the clients leave
/// and the report judges what the process kept.
pub(super) async fn soak(
    opts: &SoakOptions,
    subject: &mut impl Subject,
    endpoints: Endpoints,
    ledger: &Ledger,
) -> Result<SoakReport, String> {
    let say = |m: String| {
        if opts.progress {
            eprintln!("bench soak: {m}");
        }
    };
    let age = opts.max_connection_age;
    let idle = sample_all(subject, 0.0, 0).await?;
    say(format!("opening {} WebSockets", opts.streams));
    // Opened in ten groups over one max age, so that the streams' ages
    // spread as they do in a pod that has run for a while, not in one wave.
    let groups = opts.streams.clamp(1, 10);
    let mut populations = Vec::with_capacity(groups);
    for g in 0..groups {
        let n = opts.streams / groups + usize::from(g < opts.streams % groups);
        populations.push(
            Population::start(
                n,
                endpoints.clone(),
                &format!("soak{g}"),
                Protocol::Websocket,
                &[64],
                Duration::from_millis(u64::from(TICK_INTERVAL_MS)),
            )
            .await?,
        );
        tokio::time::sleep(age / groups as u32).await;
    }
    let start = Instant::now();
    let recycled = |ps: &[Population]| {
        ps.iter()
            .map(|p| p.sessions.lock().map_or(0, |s| s.len()) as u64)
            .sum()
    };
    let mut samples: Vec<Sample> = Vec::new();
    while start.elapsed() < opts.duration && !enough(opts.until_recycled, &samples) {
        let left = opts.duration.saturating_sub(start.elapsed());
        tokio::time::sleep(opts.sample_every.min(left)).await;
        subject.alive()?;
        let s = sample_all(
            subject,
            start.elapsed().as_secs_f64(),
            recycled(&populations),
        )
        .await?;
        say(format!(
            "{:>5.0} s of {}: {} streams recycled, RSS {:.1} MiB, {} descriptors, {} threads, {} tasks",
            s.seconds,
            humantime::format_duration(opts.duration),
            s.recycled,
            s.rss_kib as f64 / 1024.0,
            s.fds,
            s.threads,
            s.tasks
        ));
        samples.push(s);
        subject.between(start.elapsed()).await?;
    }
    let seconds = start.elapsed().as_secs_f64();
    // Streams the stop itself ends are not judged.
    let end = Instant::now();
    let mut sessions = Vec::new();
    for p in populations {
        sessions.extend(p.stop().await);
    }
    // The clients are gone: wait (bounded) for the process to close what
    // they held.
    let settled = Instant::now() + Duration::from_secs(30);
    let mut after = sample_all(subject, seconds, sessions.len() as u64).await?;
    while (after.fds > idle.fds + MAX_FDS_LEFT || after.tasks > idle.tasks + MAX_TASKS_LEFT)
        && Instant::now() < settled
    {
        tokio::time::sleep(Duration::from_millis(250)).await;
        after = sample_all(
            subject,
            start.elapsed().as_secs_f64(),
            sessions.len() as u64,
        )
        .await?;
    }
    let (drains, drains_cut) = subject.drains();

    let during: Vec<_> = sessions.iter().filter(|s| s.ended < end).collect();
    let graceful = during
        .iter()
        .filter(|s| matches!(s.ending, Ending::Graceful))
        .count() as u64;
    let cut = during.iter().filter(|s| s.ending == Ending::Cut).count() as u64;
    let lost_messages = ledger.lost(during.iter().copied());
    let loaded_part = loaded(&samples);
    let per_1e5 = |f: fn(&Sample) -> u64| {
        let points: Vec<(f64, f64)> = loaded_part
            .iter()
            .map(|s| (s.recycled as f64 / 1e5, f(s) as f64))
            .collect();
        slope(&points)
    };
    Ok(SoakReport {
        subject: subject.name().into(),
        streams: opts.streams,
        max_connection_age_seconds: age.as_secs_f64(),
        seconds,
        recycled: during.len() as u64,
        graceful,
        cut,
        lost_messages,
        idle,
        warm: loaded_part.first().copied().unwrap_or_default(),
        loaded: samples.last().copied().unwrap_or_default(),
        after,
        rss_kib_per_1e5: per_1e5(|s| s.rss_kib),
        judged_streams: judged(&samples),
        judge_required: opts.until_recycled.is_some(),
        fds_per_1e5: per_1e5(|s| s.fds),
        tasks_per_1e5: per_1e5(|s| s.tasks),
        drains,
        drains_cut,
        samples,
    })
}

/// Until the sidecar answers `/healthz` (bounded).
async fn wait_ready(shim: &mut Shim, port: u16) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        shim.alive()?;
        if let Ok(tcp) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            let authority = format!("127.0.0.1:{port}");
            let asked = drainshim::http::request(tcp, &authority, http::Method::GET, "/healthz");
            if let Ok(Ok((status, _))) = tokio::time::timeout(Duration::from_secs(2), asked).await {
                if status.is_success() {
                    return Ok(());
                }
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the sidecar did not answer /healthz within 30 s:\n{}",
                log_tail(&shim.log)
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_is_growth_per_unit() {
        assert_eq!(slope(&[]), 0.0);
        assert_eq!(slope(&[(1.0, 5.0)]), 0.0);
        assert!((slope(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]) - 2.0).abs() < 1e-12);
        assert_eq!(slope(&[(1.0, 1.0), (1.0, 9.0)]), 0.0);
        // Noise around a flat line reads flat.
        let flat: Vec<(f64, f64)> = (0..10)
            .map(|i| (i as f64, if i % 2 == 0 { 100.0 } else { 101.0 }))
            .collect();
        assert!(slope(&flat).abs() < 0.2);
    }

    #[test]
    fn a_leak_or_a_loss_fails_the_run() {
        let s = |rss_kib, fds| Sample {
            rss_kib,
            fds,
            tasks: fds,
            ..Sample::default()
        };
        let r = SoakReport {
            subject: "sidecar".into(),
            streams: 10,
            max_connection_age_seconds: 1.0,
            seconds: 1.0,
            recycled: 100,
            graceful: 100,
            cut: 0,
            lost_messages: 0,
            idle: s(10_000, 20),
            warm: s(12_000, 40),
            loaded: s(12_000, 40),
            after: s(12_000, 22),
            rss_kib_per_1e5: 100.0,
            judged_streams: MIN_JUDGED,
            judge_required: false,
            fds_per_1e5: 0.0,
            tasks_per_1e5: 0.0,
            drains: 0,
            drains_cut: 0,
            samples: Vec::new(),
        };
        assert!(r.ok(), "{:?}", r.failures());
        let leak = SoakReport {
            rss_kib_per_1e5: 50_000.0,
            after: s(12_000, 30),
            cut: 1,
            ..r.clone()
        };
        // RSS, the cut, descriptors and tasks left.
        assert_eq!(leak.failures().len(), 4, "{:?}", leak.failures());
        // Descriptors and tasks that grow under load and are freed when the
        // clients leave: back at idle after, judged by their slope.
        let held_per_client = SoakReport {
            fds_per_1e5: 1_001.0,
            tasks_per_1e5: 5_000.0,
            ..r.clone()
        };
        let failures = held_per_client.failures();
        assert_eq!(failures.len(), 2, "{failures:?}");
        assert!(
            failures[0].contains("descriptors grew 1001"),
            "{failures:?}"
        );
        assert!(failures[1].contains("tasks grew 5000"), "{failures:?}");
        // The float of recycled connections, either way, passes.
        let floating = SoakReport {
            fds_per_1e5: 216.0,
            tasks_per_1e5: -221.0,
            ..r.clone()
        };
        assert!(floating.ok(), "{:?}", floating.failures());
        // Too few streams to read a slope from: the growth is shown, not judged.
        let short = SoakReport {
            judged_streams: MIN_JUDGED - 1,
            rss_kib_per_1e5: 50_000.0,
            ..r.clone()
        };
        assert!(short.ok(), "{:?}", short.failures());
        assert!(short.render().contains("not judged"));
        // Asked to judge (--until-recycled) and could not: a failure.
        let unjudged = SoakReport {
            judge_required: true,
            ..short.clone()
        };
        assert_eq!(unjudged.failures().len(), 1, "{:?}", unjudged.failures());
        assert!(unjudged.failures()[0].contains("not judged"));
    }

    #[test]
    fn a_rate_that_falls_after_the_warm_up_is_judged_over_the_streams_after_it() {
        // 500 a second for 30 s, then 250: the loaded samples start at the
        // fifth, so 70,000 recycled is not enough to judge yet.
        let mut samples = Vec::new();
        let mut recycled = 0;
        for i in 1..=400u64 {
            recycled += if i <= 6 { 2_500 } else { 1_250 };
            samples.push(Sample {
                seconds: i as f64 * 5.0,
                recycled,
                ..Sample::default()
            });
            if enough(Some(70_000), &samples) {
                break;
            }
        }
        let last = samples.last().unwrap();
        assert!(last.recycled > 70_000, "stopped at {}", last.recycled);
        assert!(judged(&samples) >= MIN_JUDGED);
        assert!(judged(&samples[..samples.len() - 1]) < MIN_JUDGED);
    }
}
