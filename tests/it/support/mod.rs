//! Shared harness for the integration tests: real Envoy, the real tonic bench
//! backend, tonic clients, the sidecar in-process or as the real binary.
//!
//! A missing Envoy is a failure, never a skip: run `make envoy` first
//! (`make test` does).
#![allow(dead_code, unused_imports)]

pub mod abuse;
pub mod ends;
pub mod guard;
pub mod h1;
pub mod load;
pub mod node;
pub mod peers;
pub mod podapp;
pub mod proc;
pub mod prom;
pub mod promreach;
pub mod ws;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use drainshim::config::Timers;
use drainshim::drain::Report;
use drainshim::settings::{GuardSettings, SidecarSettings};
use drainshim::sidecar::{self, Sidecar};
use drainshim_bench::envoy::{self, EnvoyOptions, EnvoyProcess};
use drainshim_bench::proto::bench::stream_client::StreamClient;
use drainshim_bench::proto::bench::{EchoRequest, SubscribeRequest};
use drainshim_bench::server::{BenchService, Ledger};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Upper bound for any single wait in a test; a loaded 2-core CI stays well inside.
pub const WAIT: Duration = Duration::from_secs(30);

/// Every Envoy release `make envoy` fetches (scripts/fetch-envoy.sh's
/// default list, newest first); `envoy_versions` runs the core drain on each.
pub const ENVOY_RELEASES: [&str; 5] = ["1.40.0", "1.39.3", "1.38.3", "1.37.0", "1.36.4"];

/// The cached Envoy binary of `version`, or a failing test with the fix.
pub fn envoy_binary(version: &str) -> PathBuf {
    envoy::cached(version).unwrap_or_else(|| {
        panic!(
            "Envoy {version} is missing from {}: run `make envoy` (scripts/fetch-envoy.sh). \
             Tests never skip for a missing Envoy.",
            envoy::cache_dir().display()
        )
    })
}

/// Polls `cond` until it holds, failing the test after `limit`.
pub async fn wait_for<F, Fut>(what: &str, limit: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_for_ok(what, limit, || {
        let holds = cond();
        async move {
            holds
                .await
                .then_some(())
                .ok_or_else(|| "not yet".to_string())
        }
    })
    .await
}

/// The one wait of the tests: polls `attempt` until it gives a value,
/// failing the test after `limit` with the last thing it said instead.
pub async fn wait_for_ok<T, F, Fut>(what: &str, limit: Duration, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        match attempt().await {
            Ok(v) => return v,
            Err(last) => assert!(
                Instant::now() < deadline,
                "timed out after {limit:?} waiting for: {what}\nlast: {last}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The bench backend on an ephemeral port; stops when the token is dropped or cancelled.
pub struct Backend {
    pub addr: SocketAddr,
    /// The application: its ledger of what it wrote, and its faults.
    pub service: BenchService,
    pub ledger: Ledger,
    /// Faults injected into `Echo` (failures, latency), changeable while serving.
    pub faults: drainshim_bench::server::Faults,
    stop: CancellationToken,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub async fn backend() -> Backend {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind backend");
    let addr = listener.local_addr().expect("backend addr");
    let service = BenchService::default();
    let ledger = service.ledger.clone();
    let faults = service.faults.clone();
    let stop = CancellationToken::new();
    let s = stop.clone();
    let svc = service.clone();
    tokio::spawn(async move {
        let _ = drainshim_bench::server::serve(listener, svc, s.cancelled_owned()).await;
    });
    Backend {
        addr,
        service,
        ledger,
        faults,
        stop,
    }
}

/// A real Envoy of `version` routing its inbound listener to `upstream`.
pub async fn envoy_with(
    version: &str,
    upstream: SocketAddr,
    tweak: impl FnOnce(&mut EnvoyOptions),
) -> EnvoyProcess {
    let mut opts = EnvoyOptions::new(envoy_binary(version), upstream);
    tweak(&mut opts);
    EnvoyProcess::start(&opts)
        .await
        .unwrap_or_else(|e| panic!("start envoy {version}: {e}"))
}

pub async fn envoy(version: &str, upstream: SocketAddr) -> EnvoyProcess {
    envoy_with(version, upstream, |_| {}).await
}

pub use drainshim_bench::client::{Ending, StreamEnd};

/// Opens `n` long-lived Subscribe streams to `addr`, each on its own
/// connection, and returns once all have received their first message.
pub async fn open_streams(addr: SocketAddr, n: usize, prefix: &str) -> Vec<JoinHandle<StreamEnd>> {
    drainshim_bench::client::open_streams(addr, n, prefix, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| panic!("open streams: {e}"))
}

/// Sends unary Echo calls on one channel until `stop`, at most `max` calls.
/// Returns (calls that succeeded, the instant the last one finished).
pub async fn unary_until(
    addr: SocketAddr,
    stop: CancellationToken,
    max: usize,
) -> (usize, Instant) {
    let mut client = StreamClient::connect(format!("http://{addr}"))
        .await
        .expect("connect unary client");
    let mut ok = 0;
    let mut last = Instant::now();
    for i in 0..max {
        if stop.is_cancelled() {
            break;
        }
        if client
            .echo(EchoRequest {
                body: format!("req-{i}"),
                ..Default::default()
            })
            .await
            .is_ok()
        {
            ok += 1;
        }
        last = Instant::now();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (ok, last)
}

/// One finite Subscribe call: `count` messages `interval_ms` apart. Returns
/// the messages received and when the call completed.
pub async fn finite_request(addr: SocketAddr, count: u64, interval_ms: u32) -> (u64, Instant) {
    let mut client = StreamClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let mut stream = client
        .subscribe(SubscribeRequest {
            stream_id: "finite".into(),
            count,
            interval_ms,
            payload_bytes: 8,
            ..Default::default()
        })
        .await
        .expect("subscribe")
        .into_inner();
    let mut n = 0;
    while let Ok(Some(_)) = stream.message().await {
        n += 1;
    }
    (n, Instant::now())
}

/// Sidecar settings for a test: `envoy_admin`, any free port, no linger
/// (tests read the report from the returned task at once), then `tweak`.
pub fn sidecar_settings(
    envoy_admin: &str,
    tweak: impl FnOnce(&mut SidecarSettings),
) -> SidecarSettings {
    let mut s = SidecarSettings::new(envoy_admin.parse().expect("envoy admin URL"));
    s.listen = "127.0.0.1:0".parse().expect("address");
    s.linger = Duration::ZERO;
    tweak(&mut s);
    s.validate().expect("valid settings");
    s
}

/// An in-process sidecar; SIGTERMs are sent through the returned channel.
pub async fn start_sidecar(
    envoy_admin: &str,
    tweak: impl FnOnce(&mut SidecarSettings),
) -> (
    SocketAddr,
    drainshim::drain::DrainHandle,
    mpsc::UnboundedSender<()>,
    JoinHandle<Report>,
) {
    let settings = sidecar_settings(envoy_admin, tweak);
    let s: Sidecar = sidecar::start(settings).await.expect("start sidecar");
    let addr = s.local_addr();
    let drain = s.drain().clone();
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(s.run(rx));
    (addr, drain, tx, task)
}

/// Drain timers: `min_drain_time` is the deregistration delay.
pub fn timers(
    deregistration: Duration,
    drain: Duration,
    deadline: Duration,
    poll: Duration,
) -> Timers {
    Timers {
        deregistration_delay: deregistration,
        min_drain_time: deregistration,
        drain_time: drain,
        parent_shutdown_time: deadline,
        poll_interval: poll,
    }
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Short timers for tests: streams that stay open are cut at 2 s.
pub fn short_timers(s: &mut SidecarSettings) {
    s.budget.timers = timers(ms(200), secs(1), secs(2), ms(100));
    s.budget.admin_timeout = ms(500);
}

/// The same short timers as flags, for the real binary.
pub const SHORT_TIMERS: &[&str] = &[
    "--deregistration-delay",
    "200ms",
    "--min-drain-time",
    "200ms",
    "--drain-time",
    "1s",
    "--parent-shutdown-time",
    "2s",
    "--poll-interval",
    "100ms",
    "--admin-timeout",
    "500ms",
];

/// Max connection age 2 s with a 1 s grace, as flags for the real binary.
pub const MAX_AGE_2S: &[&str] = &[
    "--max-connection-age",
    "2s",
    "--max-connection-age-grace",
    "1s",
];

/// The drainshim binary built for this test run (`DRAINSHIM_IT_BIN`
/// names another, for a developer who copied the build aside to keep
/// editing while the suite runs; `make test` never sets it).
pub fn drainshim_bin() -> PathBuf {
    std::env::var_os("DRAINSHIM_IT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_drainshim")))
}

/// Runs the real binary with `args` (bounded by [`WAIT`]) and returns
/// (exit code, stdout, stderr).
pub async fn run_bin<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (Option<i32>, String, String) {
    run_bin_env(args, &[]).await
}

/// [`run_bin`] with `envs` added to its environment.
pub async fn run_bin_env<S: AsRef<std::ffi::OsStr>>(
    args: &[S],
    envs: &[(&str, &str)],
) -> (Option<i32>, String, String) {
    let out = tokio::time::timeout(
        WAIT,
        tokio::process::Command::new(drainshim_bin())
            .args(args)
            .envs(envs.iter().copied())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("finishes")
    .expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Output of a finished `drainshim prestop`.
pub struct PrestopRun {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl PrestopRun {
    pub fn report(&self) -> Report {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "prestop stdout is not a report ({e}): {:?}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }
}

/// Runs the real `drainshim prestop --shim http://<shim>`.
pub async fn prestop(shim: SocketAddr) -> PrestopRun {
    let out = tokio::time::timeout(
        WAIT,
        tokio::process::Command::new(drainshim_bin())
            .args([
                "prestop",
                "--shim",
                &format!("http://{shim}"),
                "--timeout",
                "20s",
            ])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("prestop did not finish")
    .expect("run prestop");
    PrestopRun {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A plain HTTP/1.1 request; returns (status, body).
pub async fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let method: http::Method = method.parse().expect("method");
    let (status, body) = drainshim::http::request(stream, &addr.to_string(), method, path)
        .await
        .expect("request");
    (status.as_u16(), String::from_utf8_lossy(&body).into_owned())
}

/// Envoy's live inbound stream count, through the admin API.
pub async fn envoy_streams(envoy: &EnvoyProcess) -> u64 {
    let admin = envoy.admin_client();
    let scope = admin.inbound_scope().await.expect("inbound scope");
    admin.counts(&scope).await.expect("counts").rq_active
}

/// A real Prometheus (Debian's package, fetched into the cache by
/// `make tools`) scraping `targets` every second; killed on drop.
pub struct Prometheus {
    pub addr: SocketAddr,
    /// https when started with a TLS web config.
    scheme: &'static str,
    _child: tokio::process::Child,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Replaces the scrape targets (file service discovery: Prometheus
    /// watches the file). Written whole and renamed into place, so it never
    /// reads half a list.
    pub fn set_targets(&self, targets: &[SocketAddr]) {
        let list = targets
            .iter()
            .map(|t| format!("\"{t}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let tmp = self._dir.path().join("targets.json.tmp");
        std::fs::write(&tmp, format!("[{{\"targets\": [{list}]}}]")).expect("targets");
        std::fs::rename(&tmp, self._dir.path().join("targets.json")).expect("targets");
    }

    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// Kills Prometheus and waits until the process is gone, so a test can
    /// assert on its absence (a killed process still answers for a moment).
    pub async fn stop(mut self) {
        let _ = self._child.start_kill();
        let _ = tokio::time::timeout(WAIT, self._child.wait()).await;
    }
}

pub async fn prometheus(targets: &[SocketAddr]) -> Prometheus {
    prometheus_with(targets, None).await
}

/// A real Prometheus whose scrape drops `metric` from the targets
/// `dropping` (a `metric_relabel_configs` drop, as a scrape config that
/// keeps only some families does).
pub async fn prometheus_dropping(
    targets: &[SocketAddr],
    metric: &str,
    dropping: &[SocketAddr],
) -> Prometheus {
    let instances: Vec<String> = dropping
        .iter()
        .map(|t| t.to_string().replace('.', "\\\\."))
        .collect();
    let relabel = format!(
        "  metric_relabel_configs:\n  - {{ source_labels: [__name__, instance], regex: \"{metric};({})\", action: drop }}\n",
        instances.join("|")
    );
    start_prometheus(targets, None, &relabel).await
}

/// A real Prometheus with `web_config` as its `--web.config.file` (TLS,
/// basic auth), when given: ready once its log says so, since its own
/// readiness endpoint then wants the TLS and the password too.
pub async fn prometheus_with(targets: &[SocketAddr], web_config: Option<&str>) -> Prometheus {
    start_prometheus(targets, web_config, "").await
}

/// Prometheus scraping `targets`, `scrape` appended to its one scrape
/// config.
async fn start_prometheus(
    targets: &[SocketAddr],
    web_config: Option<&str>,
    scrape: &str,
) -> Prometheus {
    let bin = drainshim_bench::envoy::cache_dir().join("prometheus/usr/bin/prometheus");
    assert!(
        bin.is_file(),
        "Prometheus is missing at {}: run `make tools` (scripts/fetch-prometheus.sh). Tests never skip for it.",
        bin.display()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let list = targets
        .iter()
        .map(|t| format!("\"{t}\""))
        .collect::<Vec<_>>()
        .join(", ");
    // The targets are a file Prometheus watches, so a test can move pods
    // (Prometheus::set_targets).
    std::fs::write(
        dir.path().join("targets.json"),
        format!("[{{\"targets\": [{list}]}}]"),
    )
    .expect("targets");
    let config = format!(
        "global: {{ scrape_interval: 1s, evaluation_interval: 1s, scrape_timeout: 900ms }}\n\
         scrape_configs:\n- job_name: drainshim\n  file_sd_configs:\n  - files: [{}]\n    refresh_interval: 1s\n{scrape}",
        dir.path().join("targets.json").display()
    );
    std::fs::write(dir.path().join("prometheus.yml"), config).expect("config");
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let log_path = dir.path().join("prometheus.log");
    let log = std::fs::File::create(&log_path).expect("log");
    let mut cmd = tokio::process::Command::new(&bin);
    cmd.arg(format!(
        "--config.file={}",
        dir.path().join("prometheus.yml").display()
    ))
    .arg(format!(
        "--storage.tsdb.path={}",
        dir.path().join("data").display()
    ))
    .arg(format!("--web.listen-address={addr}"));
    if let Some(web) = web_config {
        let path = dir.path().join("web.yml");
        std::fs::write(&path, web).expect("web config");
        cmd.arg(format!("--web.config.file={}", path.display()));
    }
    let child = cmd
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("start prometheus");
    let p = Prometheus {
        addr,
        scheme: if web_config.is_some_and(|w| w.contains("tls_server_config")) {
            "https"
        } else {
            "http"
        },
        _child: child,
        _dir: dir,
    };
    if web_config.is_some() {
        wait_for("prometheus is ready", WAIT, || async {
            std::fs::read_to_string(&log_path)
                .is_ok_and(|l| l.contains("Server is ready to receive web requests."))
        })
        .await;
        return p;
    }
    wait_for("prometheus is ready", WAIT, || async {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(s) => drainshim::http::request(s, &addr.to_string(), http::Method::GET, "/-/ready")
                .await
                .is_ok_and(|(status, _)| status == 200),
            Err(_) => false,
        }
    })
    .await;
    p
}

/// A "pod" with the stream guard: backend <- drainshim guard <- Envoy, with
/// the sidecar in-process. Envoy's admin port is chosen first so the shim
/// can be told where it is before Envoy starts.
pub struct GuardedPod {
    pub backend: Backend,
    pub envoy: EnvoyProcess,
    pub shim: SocketAddr,
    pub guard: SocketAddr,
    pub drain: drainshim::drain::DrainHandle,
    pub sigterm: mpsc::UnboundedSender<()>,
    pub task: JoinHandle<Report>,
}

pub async fn guarded_pod(version: &str, tweak: impl FnOnce(&mut SidecarSettings)) -> GuardedPod {
    let backend = backend().await;
    let g = guard_in_front_of(version, backend.addr, tweak).await;
    GuardedPod {
        backend,
        envoy: g.envoy,
        shim: g.shim,
        guard: g.guard,
        drain: g.drain,
        sigterm: g.sigterm,
        task: g.task,
    }
}

/// A guarded pod whose application is somewhere else (a process the test
/// controls): Envoy -> drainshim guard -> `upstream`.
pub struct Guarded {
    pub envoy: EnvoyProcess,
    pub shim: SocketAddr,
    pub guard: SocketAddr,
    pub drain: drainshim::drain::DrainHandle,
    pub sigterm: mpsc::UnboundedSender<()>,
    pub task: JoinHandle<Report>,
}

pub async fn guard_in_front_of(
    version: &str,
    upstream: SocketAddr,
    tweak: impl FnOnce(&mut SidecarSettings),
) -> Guarded {
    let admin_port = free_port();
    let admin = format!("http://127.0.0.1:{admin_port}");
    let settings = sidecar_settings(&admin, |s| {
        s.guard = Some(GuardSettings::new(
            "127.0.0.1:0".parse().expect("address"),
            upstream,
        ));
        tweak(s);
    });
    let upstream = upstream.to_string();
    let s: Sidecar = sidecar::start(settings).await.expect("start sidecar");
    let shim = s.local_addr();
    let guard = s.guard_addr().expect("guard address");
    let drain = s.drain().clone();
    let (sigterm, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(s.run(rx));
    // Fail open as the shipped bootstrap does: the app is priority 1.
    let envoy = envoy_with(version, guard, |o| {
        o.admin_port = admin_port;
        o.fallback = upstream.parse().ok();
    })
    .await;
    Guarded {
        envoy,
        shim,
        guard,
        drain,
        sigterm,
        task,
    }
}

/// A free TCP port on loopback (bound and released: good enough for tests
/// that hand it to a process which binds it at once).
pub fn free_port() -> u16 {
    drainshim_bench::free_port().expect("a free loopback port")
}

/// The real `drainshim sidecar` binary, its control address learned from
/// its startup log line, and its log (stderr) collected as it comes.
pub struct SidecarBin {
    pub child: tokio::process::Child,
    pub addr: SocketAddr,
    /// Where its stream guard listens, from the same line (`guard=`).
    pub guard: Option<SocketAddr>,
    /// Every stderr line so far.
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl SidecarBin {
    /// The guard's address; panics if this shim runs no guard.
    pub fn guard(&self) -> SocketAddr {
        self.guard
            .unwrap_or_else(|| panic!("this sidecar runs no stream guard: {}", self.log()))
    }

    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Waits until the log has a line containing `needle`.
    pub async fn wait_log(&self, needle: &str) {
        wait_for(&format!("log line {needle:?}"), WAIT, || async {
            self.log().contains(needle)
        })
        .await;
    }
}

/// A pod whose shim is the real binary: Envoy 1.40 -> `drainshim sidecar`
/// with its guard on a port of its own choosing -> `app`. `extra` goes to
/// the sidecar, `tweak` to Envoy's options. Returns Envoy, the shim and the
/// guard address.
///
/// The guard binds port 0 and the shim's ready line says where, so nothing
/// can take its port. The shim must know Envoy's admin address before Envoy
/// starts, though, so that port is picked free and bound by Envoy a moment
/// later; in between, a connection of the tests running beside may take it
/// as its source port. Envoy then exits with "Address already in use", and
/// the pod is started again on a new port (a test-harness race, not the
/// guard's: at most 3 times).
pub async fn guard_bin_pod(
    app: SocketAddr,
    extra: &[&str],
    tweak: impl Fn(&mut EnvoyOptions),
) -> (EnvoyProcess, SidecarBin, SocketAddr) {
    const ATTEMPTS: usize = 3;
    for attempt in 1..=ATTEMPTS {
        let admin_port = free_port();
        let shim = guard_sidecar_bin(admin_port, ANY_PORT, app, extra).await;
        let guard = shim.guard();
        let mut opts = EnvoyOptions::new(envoy_binary("1.40.0"), guard);
        opts.admin_port = admin_port;
        tweak(&mut opts);
        match EnvoyProcess::start(&opts).await {
            Ok(envoy) => return (envoy, shim, guard),
            Err(e) if attempt < ATTEMPTS && e.to_string().contains("Address already in use") => {
                eprintln!("guard_bin_pod: Envoy's port was taken meanwhile ({attempt} of {ATTEMPTS}); new ports");
            }
            Err(e) => panic!("start envoy 1.40.0: {e}"),
        }
    }
    unreachable!("the last attempt returns or panics")
}

/// `--guard-listen` for a guard that picks its own port: the shim's ready
/// line says which ([`SidecarBin::guard`]). A port picked free by the test
/// and bound by the shim a moment later can be taken in between.
pub const ANY_PORT: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// The real `drainshim sidecar` binary for Envoy's admin on `admin_port`,
/// guarding `app` on `guard`, with `extra` flags.
pub async fn guard_sidecar_bin(
    admin_port: u16,
    guard: SocketAddr,
    app: SocketAddr,
    extra: &[&str],
) -> SidecarBin {
    let (admin, guard, app) = (
        format!("http://127.0.0.1:{admin_port}"),
        guard.to_string(),
        app.to_string(),
    );
    let mut args = vec![
        "--envoy-admin",
        admin.as_str(),
        "--guard-listen",
        guard.as_str(),
        "--guard-upstream",
        app.as_str(),
    ];
    args.extend_from_slice(extra);
    sidecar_bin(&args).await
}

/// `drainshim sidecar --listen 127.0.0.1:0 --linger 0s <args>`.
pub async fn sidecar_bin(args: &[&str]) -> SidecarBin {
    let mut cmd = tokio::process::Command::new(drainshim_bin());
    cmd.args(["sidecar", "--listen", "127.0.0.1:0", "--linger", "0s"])
        .args(args);
    sidecar_bin_cmd(cmd).await
}

/// Runs `cmd`, a `drainshim sidecar` command line (perhaps behind
/// `ip netns exec`), and waits for its ready line.
pub async fn sidecar_bin_cmd(mut cmd: tokio::process::Command) -> SidecarBin {
    use tokio::io::AsyncBufReadExt;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn drainshim sidecar");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    // The ready line's `key=address` field, if it has one.
    let field = |line: &str, key: &str| -> Option<SocketAddr> {
        let rest = line.split(&format!(" {key}=")).nth(1)?;
        let addr = rest.split_whitespace().next().unwrap_or_default();
        let addr: SocketAddr = addr
            .parse()
            .unwrap_or_else(|e| panic!("{key}={addr:?} in {line:?}: {e}"));
        assert_ne!(addr.port(), 0, "{key}= names no bound port: {line:?}");
        Some(addr)
    };
    let (addr, guard) = tokio::time::timeout(WAIT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(mut l) = log.lock() {
                l.push_str(&line);
                l.push('\n');
            }
            if line.contains("sidecar ready") {
                let addr = field(&line, "listen").expect("listen address in the ready line");
                return (addr, field(&line, "guard"));
            }
        }
        panic!(
            "the sidecar exited before it was ready: {:?}",
            log.lock().map(|l| l.clone())
        );
    })
    .await
    .expect("sidecar ready in time");
    peers::collect(lines.into_inner(), log.clone());
    SidecarBin {
        child,
        addr,
        guard,
        log,
    }
}

/// The Python of the test venv (`.cache/py-venv`: websockets, grpcio, h2):
/// the independent peers. A missing venv fails the test, never skips it.
pub fn python() -> PathBuf {
    let p = envoy::cache_dir().join("py-venv/bin/python");
    assert!(
        p.is_file(),
        "{} is missing: run `make pytools` (scripts/fetch-pytools.sh). Tests never skip for it.",
        p.display()
    );
    p
}

/// Drain timers for the real binary that fit a test: a 0.5 s
/// deregistration, long-lived streams ended over about 2 s after it, and
/// a 10 s deadline for what is not long-lived (unary calls).
pub const QUICK_DRAIN_TIMERS: &[&str] = &[
    "--deregistration-delay",
    "500ms",
    "--min-drain-time",
    "500ms",
    "--drain-time",
    "2500ms",
    "--parent-shutdown-time",
    "10s",
    "--poll-interval",
    "100ms",
];
