//! `drainshim bench reconnect`: restarts one of two "pods" under a
//! population of long-lived gRPC streams and measures, from the client side,
//! what each way of restarting costs.
//!
//! Each pod is a real Envoy inbound in front of the bench app (the tonic
//! streaming backend and the WebSocket ticker on one port); in `drainshim`
//! mode a drainshim sidecar with the stream guard sits between them, as in
//! a mesh where Envoy's inbound cluster points at the guard. The population
//! holds gRPC streams, WebSockets, or both (`--protocol`); each kind gets its
//! own result row.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use std::net::SocketAddr;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::client::TICK_INTERVAL_MS;
use super::envoy::{EnvoyOptions, EnvoyProcess};
use super::measure::{self, ModeResult, Observed};
use super::population::{Endpoints, Population, Protocol};
use super::server::Ledger;
use drainshim::config::{self, Invalid, Span, Timers};
use drainshim::drain::{DrainHandle, Report, Trigger};
use drainshim::http::{Endpoint, UrlError};
use drainshim::settings::{GuardSettings, SidecarSettings};
use drainshim::sidecar;

/// How pod A is restarted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The preStop drain through drainshim (guard ends streams gracefully), then SIGTERM.
    Drainshim,
    /// Plain SIGTERM to Envoy, as a pod without a drain hook gets.
    EnvoySigterm,
    /// Istio's default: drain_listeners?inboundonly&graceful, wait 5 s, then kill.
    IstioDefault,
}

// === impl Mode ===

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Drainshim => "drainshim",
            Mode::EnvoySigterm => "envoy-sigterm",
            Mode::IstioDefault => "istio-default",
        }
    }
}

/// Istio's default terminationDrainDuration.
const ISTIO_DRAIN: Duration = Duration::from_secs(5);
/// After pod A is gone, how long the clients get to settle before the count.
const SETTLE: Duration = Duration::from_secs(2);

/// The bench's drain timers: short, so a run takes a minute, and in the
/// budget's order (`--deregistration-delay` is also the minimum drain time).
pub const DEFAULT_DEREGISTRATION_DELAY: Span = Span::secs(2);
pub const DEFAULT_DRAIN_TIME: Span = Span::secs(12);
pub const DEFAULT_PARENT_SHUTDOWN_TIME: Span = Span::secs(20);
/// How long the streams run before the restart, by default: this many
/// ticks, and at least [`MIN_DEFAULT_WARMUP`]. The guard needs about fifteen
/// steady gaps to learn a stream's cadence; a long-lived stream has them.
pub const WARMUP_TICKS: u32 = 20;
pub const MIN_DEFAULT_WARMUP: Duration = Duration::from_secs(1);
/// Between two messages on a stream, by default.
pub const DEFAULT_TICK: Span = Span::millis(TICK_INTERVAL_MS as u64);

/// The bounds of `--tick`: a message per millisecond per stream at most,
/// and a stream quiet for a minute at least once a minute.
pub const MIN_TICK: Duration = Duration::from_millis(1);
pub const MAX_TICK: Duration = Duration::from_secs(60);

/// Bench settings.
#[derive(Clone, Debug)]
pub struct ReconnectOptions {
    pub envoy: PathBuf,
    pub streams: usize,
    pub modes: Vec<Mode>,
    /// drainshim's timers in `drainshim` mode (short defaults for a bench).
    pub deregistration_delay: Duration,
    pub drain_time: Duration,
    pub parent_shutdown_time: Duration,
    /// The guard's max connection age, if any (all modes with a guard).
    pub max_connection_age: Option<Duration>,
    pub max_connection_age_grace: Duration,
    /// After the grace, a connection's streams are ended over this window.
    pub max_connection_age_spread: Duration,
    /// gRPC streams, WebSockets, or half of each.
    pub protocol: Protocol,
    /// Message sizes; stream i gets the i-th in turn.
    pub payload_bytes: Vec<u32>,
    /// Between two of the server's messages on a stream.
    pub tick: Duration,
    /// How long the population runs before the restart: the guard learns a
    /// stream's cadence from its history. None: [`WARMUP_TICKS`] ticks.
    pub warmup: Option<Duration>,
    /// Print progress lines to stderr.
    pub progress: bool,
}

// === impl ReconnectOptions ===

impl ReconnectOptions {
    pub fn new(envoy: PathBuf) -> Self {
        Self {
            envoy,
            streams: 200,
            modes: vec![Mode::EnvoySigterm, Mode::IstioDefault, Mode::Drainshim],
            deregistration_delay: DEFAULT_DEREGISTRATION_DELAY.get(),
            drain_time: DEFAULT_DRAIN_TIME.get(),
            parent_shutdown_time: DEFAULT_PARENT_SHUTDOWN_TIME.get(),
            max_connection_age: None,
            max_connection_age_grace: config::DEFAULT_MAX_CONNECTION_AGE_GRACE.get(),
            max_connection_age_spread: config::DEFAULT_MAX_CONNECTION_AGE_SPREAD.get(),
            protocol: Protocol::Grpc,
            payload_bytes: vec![64],
            tick: DEFAULT_TICK.get(),
            warmup: None,
            progress: true,
        }
    }

    /// How long the streams run before the restart.
    pub fn warmup(&self) -> Duration {
        self.warmup
            .unwrap_or((self.tick * WARMUP_TICKS).max(MIN_DEFAULT_WARMUP))
    }

    /// The drainshim sidecar's timers in `drainshim` mode.
    pub fn timers(&self) -> Timers {
        Timers {
            deregistration_delay: self.deregistration_delay,
            min_drain_time: self.deregistration_delay,
            drain_time: self.drain_time,
            parent_shutdown_time: self.parent_shutdown_time,
            poll_interval: Duration::from_millis(250),
        }
    }

    /// Every violation at once; the timers only matter in `drainshim` mode.
    pub fn validate(&self) -> Result<(), Invalid> {
        let mut errs = Invalid::default();
        if self.modes.contains(&Mode::Drainshim) {
            errs.merge(self.timers().validate(None));
        }
        errs.check(self.streams >= 2, || "--streams must be at least 2".into());
        errs.check((MIN_TICK..=MAX_TICK).contains(&self.tick), || {
            format!(
                "--tick must be between {} and {}",
                humantime::format_duration(MIN_TICK),
                humantime::format_duration(MAX_TICK)
            )
        });
        errs.check(!self.modes.is_empty(), || {
            "--mode needs at least one mode".into()
        });
        errs.into_result()
    }

    fn say(&self, msg: &str) {
        if self.progress {
            eprintln!("bench reconnect: {msg}");
        }
    }
}

/// One pod: backend, optional drainshim sidecar with guard, and Envoy.
struct Pod {
    envoy: EnvoyProcess,
    shim: Option<DrainHandle>,
    _shim_task: Option<JoinHandle<Report>>,
    /// The sidecar's SIGTERM source; the bench drives the drain itself, and
    /// dropping this ends the sidecar with the pod.
    _sigterm: Option<tokio::sync::mpsc::UnboundedSender<()>>,
    stop: CancellationToken,
    /// The app's and the sidecar's runtimes (dropped last).
    _app_rt: OwnRuntime,
    _shim_rt: Option<OwnRuntime>,
}

/// A tokio runtime of its own for one container of a pod (the app, the
/// sidecar), as that container's process would have. On the bench's
/// runtime, the app's HTTP/2 connection tasks waited behind thousands of
/// client tasks: a message it had handed its transport stayed queued for
/// longer than the stream's tick, so the guard's cancel, timed by what had
/// arrived, met it (234 ticks lost at 2,000 streams per pod on a loaded
/// machine), a delay no app in a container of its own has.
pub(super) struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl OwnRuntime {
    fn new(name: &str) -> Result<Self, String> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(name)
            .enable_all()
            .build()
            .map(|rt| Self(Some(rt)))
            .map_err(|e| format!("start the {name} runtime: {e}"))
    }

    /// Runs `fut` on this runtime; awaitable from any other.
    fn spawn<F>(&self, fut: F) -> Result<JoinHandle<F::Output>, String>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.0
            .as_ref()
            .map(|rt| rt.spawn(fut))
            .ok_or_else(|| "internal: the runtime is gone".to_string())
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which an async context forbids.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

// === impl Pod ===

impl Drop for Pod {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub(super) fn free_port() -> Result<u16, String> {
    super::free_port().map_err(|e| format!("pick a free port: {e}"))
}

/// The app of a pod, on a runtime of its own as its container would be:
/// gRPC and WebSocket on one port, every message handed to the transport
/// written in `ledger`. Stops when `stop` is cancelled.
pub(super) async fn start_app(
    ledger: &Ledger,
    stop: &CancellationToken,
) -> Result<(OwnRuntime, SocketAddr), String> {
    let app_rt = OwnRuntime::new("bench-app")?;
    let (ledger, app_stop) = (ledger.clone(), stop.clone());
    let app = app_rt
        .spawn(async move {
            // The app's accept queue as a Go or Java server's
            // (net.core.somaxconn), not tokio's 128: a burst of WebSockets
            // must not overflow it either.
            let listener = drainshim::guard::bind_listener(SocketAddr::from(([127, 0, 0, 1], 0)))
                .map_err(|e| format!("bind backend: {e}"))?;
            let app = listener.local_addr().map_err(|e| e.to_string())?;
            // The app serves both populations on one port: gRPC and WebSocket.
            tokio::spawn(super::ws::serve_mixed(
                listener,
                ledger,
                app_stop.cancelled_owned(),
            ));
            Ok::<_, String>(app)
        })?
        .await
        .map_err(|e| format!("start the app: {e}"))??;
    Ok((app_rt, app))
}

async fn start_pod(opts: &ReconnectOptions, ledger: &Ledger, guard: bool) -> Result<Pod, String> {
    let stop = CancellationToken::new();
    let (app_rt, app) = start_app(ledger, &stop).await?;

    let admin_port = free_port()?;
    let shim_rt = guard.then(|| OwnRuntime::new("drainshim")).transpose()?;
    let (upstream, shim, shim_task, sigterm) = if let Some(rt) = &shim_rt {
        let admin: Endpoint = format!("http://127.0.0.1:{admin_port}")
            .parse()
            .map_err(|e: UrlError| e.to_string())?;
        let mut settings = SidecarSettings::new(admin);
        settings.listen = "127.0.0.1:0".parse().map_err(|_| "internal: address")?;
        settings.linger = Duration::ZERO;
        settings.budget.timers = opts.timers();
        let mut g = GuardSettings::new(settings.listen, app);
        g.config.max_connection_age = opts.max_connection_age;
        g.config.max_connection_age_grace = opts.max_connection_age_grace;
        g.config.max_connection_age_spread = opts.max_connection_age_spread;
        // The bench's Envoy admits 100,000 upstream connections (its circuit
        // breakers raised for the population, as an operator running
        // thousands of WebSockets per pod must); the guard's cap is raised
        // with it, as that operator would with --guard-max-connections:
        // every stream of the population may land on one pod, a WebSocket
        // holds a connection of its own, and half again is headroom.
        let population = opts.streams.saturating_mul(3) / 2;
        g.config.limits.max_connections = g.config.limits.max_connections.max(population);
        settings.guard = Some(g);
        settings.validate().map_err(|e| e.to_string())?;
        let sc = rt
            .spawn(async move { sidecar::start(settings).await.map_err(|e| e.to_string()) })?
            .await
            .map_err(|e| format!("start the sidecar: {e}"))??;
        let guard_addr = sc
            .guard_addr()
            .ok_or("internal: the sidecar started without its guard")?;
        let drain = sc.drain().clone();
        let (sigterm, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = rt.spawn(sc.run(rx))?;
        (guard_addr, Some(drain), Some(task), Some(sigterm))
    } else {
        (app, None, None, None)
    };
    let mut eo = EnvoyOptions::new(opts.envoy.clone(), upstream);
    eo.admin_port = admin_port;
    // Fail open as the shipped bootstrap does: the app behind the guard.
    eo.fallback = guard.then_some(app);
    eo.drain_time = opts.drain_time;
    eo.parent_shutdown_time = opts.parent_shutdown_time;
    // gRPC stays HTTP/2 and WebSockets HTTP/1.1 Upgrade up to the app.
    eo.upstream_follows_downstream = true;
    let envoy = EnvoyProcess::start(&eo).await.map_err(|e| e.to_string())?;
    Ok(Pod {
        envoy,
        shim,
        _shim_task: shim_task,
        _sigterm: sigterm,
        stop,
        _app_rt: app_rt,
        _shim_rt: shim_rt,
    })
}

/// Envoy's connect failures and failed health checks to the `app` cluster
/// (the guard, and the app behind it), as its admin counts them; 0 for a
/// counter it does not report.
async fn envoy_failures(envoy: &EnvoyProcess) -> (u64, u64) {
    let stats = envoy
        .admin_client()
        .stats(r"^cluster\.app\.(upstream_cx_connect_fail|health_check\.failure)$")
        .await
        .unwrap_or_default();
    let of = |name: &str| {
        stats
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .sum::<u64>()
    };
    (
        of("cluster.app.upstream_cx_connect_fail"),
        of("cluster.app.health_check.failure"),
    )
}

/// Runs one mode end to end and measures it.
pub async fn run_mode(opts: &ReconnectOptions, mode: Mode) -> Result<Vec<ModeResult>, String> {
    let guard = mode == Mode::Drainshim;
    let ledger = Ledger::default();
    opts.say(&format!(
        "[{}] starting two pods (Envoy{})",
        mode.name(),
        if guard { " + drainshim guard" } else { "" }
    ));
    let mut a = start_pod(opts, &ledger, guard).await?;
    let b = start_pod(opts, &ledger, guard).await?;
    let endpoints = Endpoints::new(vec![a.envoy.inbound, b.envoy.inbound]);
    opts.say(&format!(
        "[{}] opening {} long-lived streams over both pods",
        mode.name(),
        opts.streams
    ));
    let population = Population::start(
        opts.streams,
        endpoints.clone(),
        mode.name(),
        opts.protocol,
        &opts.payload_bytes,
        opts.tick,
    )
    .await?;
    // Let the streams run a while, so every one has history.
    tokio::time::sleep(opts.warmup()).await;

    opts.say(&format!("[{}] restarting pod A", mode.name()));
    let attempts_at_trigger = population.attempts.lock().map(|a| *a).unwrap_or_default();
    let trigger = Instant::now();
    let cpu_at_trigger = measure::MachineCpu::now().ok();
    // Deregistration: callers stop picking pod A.
    endpoints.remove(0);
    let mut bypassed = 0;
    // Pod A's Envoy is read before it exits (drainshim mode only: the
    // baselines have no guard to go around).
    let mut failures_a = (0, 0);
    match mode {
        Mode::Drainshim => {
            let drain = a
                .shim
                .as_ref()
                .ok_or("internal: drainshim mode without a shim")?;
            drain.trigger(Trigger::Prestop).await;
            let report = drain.report().await.ok_or("the drain driver stopped")?;
            opts.say(&format!(
                "[{}] drain report: outcome {:?}, terminated {}, cut {}, bypassed {}",
                mode.name(),
                report.outcome,
                report.streams.terminated,
                report.streams.cut,
                report.streams.bypassed
            ));
            bypassed = report.streams.bypassed;
            failures_a = envoy_failures(&a.envoy).await;
            a.envoy.sigterm();
        }
        Mode::EnvoySigterm => a.envoy.sigterm(),
        Mode::IstioDefault => {
            let admin = a.envoy.admin_client();
            admin
                .drain_listeners(true, true)
                .await
                .map_err(|e| e.to_string())?;
            tokio::time::sleep(ISTIO_DRAIN).await;
            a.envoy.kill().await;
        }
    }
    let _ = a.envoy.wait_exit(Duration::from_secs(10)).await;
    let done = Instant::now();
    let cpu_busy = cpu_at_trigger
        .zip(measure::MachineCpu::now().ok())
        .map_or(0.0, |(a, b)| a.busy_until(b));
    tokio::time::sleep(SETTLE).await;
    let attempts_at_end = population.attempts.lock().map(|a| *a).unwrap_or_default();
    let sessions = population.stop().await;
    let failures_b = if guard {
        envoy_failures(&b.envoy).await
    } else {
        (0, 0)
    };
    let (connect_failures, health_check_failures) =
        (failures_a.0 + failures_b.0, failures_a.1 + failures_b.1);
    if guard {
        opts.say(&format!(
            "[{}] Envoy, both pods: {connect_failures} connect failures, {health_check_failures} failed health checks (to the guard or the app behind it; each connect failure is a call that went around a live guard if a retry found the app)",
            mode.name()
        ));
    }
    drop(b);
    let mut results = Vec::new();
    for kind in opts.protocol.kinds() {
        let mut result = measure::summarize(&Observed {
            mode: mode.name(),
            kind,
            streams: sessions_of(&sessions, kind, opts.streams),
            sessions: &sessions,
            restarted: 0,
            trigger,
            done,
            ledger: &ledger,
            attempts_at_trigger,
            attempts_at_end,
        });
        result.bypassed = bypassed;
        result.envoy_connect_failures = connect_failures;
        result.envoy_health_check_failures = health_check_failures;
        result.machine_cpu_busy = cpu_busy;
        opts.say(&format!(
            "[{}] {} {} streams on pod A: {} graceful, {} cut",
            mode.name(),
            result.streams_on_restarted_pod,
            kind.name(),
            result.graceful,
            result.cut
        ));
        results.push(result);
    }
    Ok(results)
}

/// How many of the population's `total` streams are of `kind`.
fn sessions_of(
    sessions: &[super::population::Session],
    kind: super::population::StreamKind,
    total: usize,
) -> usize {
    let kinds: std::collections::HashMap<usize, super::population::StreamKind> =
        sessions.iter().map(|s| (s.client, s.kind)).collect();
    if kinds.is_empty() {
        return total;
    }
    kinds.values().filter(|k| **k == kind).count()
}

/// Runs every requested mode, one after the other.
pub async fn run(opts: &ReconnectOptions) -> Result<Vec<ModeResult>, String> {
    let mut out = Vec::new();
    for mode in &opts.modes {
        out.extend(run_mode(opts, *mode).await?);
    }
    Ok(out)
}

/// Steady state under a max connection age: what an operator watches for a
/// week after rolling the connection-lifetime change out.
#[derive(Clone, Debug, Serialize)]
pub struct SoakResult {
    pub streams: usize,
    pub max_connection_age_seconds: f64,
    pub grace_seconds: f64,
    pub spread_seconds: f64,
    pub soak_seconds: f64,
    /// Streams that ended (and reconnected) during the soak.
    pub reconnects: usize,
    pub reconnects_per_minute: f64,
    pub graceful: usize,
    pub cut: usize,
    pub lost_messages: u64,
    pub reconnect_p99_ms: f64,
    /// Peak reconnects per 100 ms over the mean, over the soak.
    pub storm_peak_to_mean: f64,
}

// === impl SoakResult ===

impl SoakResult {
    /// One line for the terminal.
    pub fn render(&self) -> String {
        format!(
            "soak {:.0}s, {} streams, max age {:.0}s (+/-10%), grace {:.0}s, spread {:.0}s: {} reconnects ({:.1}/min), {} graceful, {} cut, {} lost, reconnect p99 {:.0} ms, storm peak/mean {:.2}\n",
            self.soak_seconds,
            self.streams,
            self.max_connection_age_seconds,
            self.grace_seconds,
            self.spread_seconds,
            self.reconnects,
            self.reconnects_per_minute,
            self.graceful,
            self.cut,
            self.lost_messages,
            self.reconnect_p99_ms,
            self.storm_peak_to_mean
        )
    }
}

pub async fn soak(opts: &ReconnectOptions, duration: Duration) -> Result<SoakResult, String> {
    let age = opts
        .max_connection_age
        .ok_or("--soak needs --max-connection-age")?;
    let ledger = Ledger::default();
    opts.say("[soak] starting two pods with the guard's max connection age");
    let a = start_pod(opts, &ledger, true).await?;
    let b = start_pod(opts, &ledger, true).await?;
    let endpoints = Endpoints::new(vec![a.envoy.inbound, b.envoy.inbound]);
    let population = Population::start(
        opts.streams,
        endpoints,
        "soak",
        opts.protocol,
        &opts.payload_bytes,
        opts.tick,
    )
    .await?;
    let start = Instant::now();
    let mut next_report = start;
    while start.elapsed() < duration {
        if Instant::now() >= next_report {
            let ended = population.snapshot().len();
            opts.say(&format!(
                "[soak] {:>4.0}s of {}: {ended} streams ended and reconnected so far",
                start.elapsed().as_secs_f64(),
                humantime::format_duration(duration)
            ));
            next_report += Duration::from_secs(10);
        }
        tokio::time::sleep(
            Duration::from_millis(500).min(duration.saturating_sub(start.elapsed())),
        )
        .await;
    }
    let end = Instant::now();
    let sessions = population.stop().await;
    drop((a, b));
    let during: Vec<_> = sessions.iter().filter(|s| s.ended < end).collect();
    let graceful = during
        .iter()
        .filter(|s| matches!(s.ending, super::client::Ending::Graceful))
        .count();
    let cut = during
        .iter()
        .filter(|s| s.ending == super::client::Ending::Cut)
        .count();
    let lost_messages = ledger.lost(during.iter().copied());
    let starts: Vec<Instant> = sessions
        .iter()
        .filter(|s| s.reconnect.is_some() && s.started < end)
        .map(|s| s.started)
        .collect();
    let mut lat: Vec<f64> = sessions
        .iter()
        .filter_map(|s| s.reconnect)
        .map(|d| d.as_secs_f64() * 1000.0)
        .collect();
    lat.sort_by(f64::total_cmp);
    let secs = end.saturating_duration_since(start).as_secs_f64();
    Ok(SoakResult {
        streams: opts.streams,
        max_connection_age_seconds: age.as_secs_f64(),
        grace_seconds: opts.max_connection_age_grace.as_secs_f64(),
        spread_seconds: opts.max_connection_age_spread.as_secs_f64(),
        soak_seconds: secs,
        reconnects: during.len(),
        reconnects_per_minute: during.len() as f64 / secs * 60.0,
        graceful,
        cut,
        lost_messages,
        reconnect_p99_ms: measure::percentile(&lat, 0.99),
        storm_peak_to_mean: measure::peak_to_mean(&starts),
    })
}
