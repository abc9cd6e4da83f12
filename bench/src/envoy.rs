//! Starts a real Envoy for the demo, the benchmarks and the tests: a
//! generated bootstrap, ephemeral ports everywhere, a dynamic `--base-id` so
//! several run side by side, and a wait on `/ready`.
//!
//! The bootstrap has an INBOUND listener (HTTP connection manager, stat
//! prefixes `inbound` / `inbound_http`) routing to one upstream over h2c, and
//! an OUTBOUND TCP listener, so the inbound-only counting is exercised. With
//! a `fallback` the upstream (the guard) fails open to it as the shipped
//! bootstrap does; [`shipped_bootstrap`] runs the shipped file itself.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use envoy_types::pb::envoy::admin::v3::server_info::State;

use drainshim::envoy::AdminClient;

/// The Envoy releases the project tests against; the first is the default.
pub const ENVOY_VERSIONS: [&str; 5] = ["1.40.0", "1.39.3", "1.38.3", "1.37.0", "1.36.4"];
/// Envoy starts in well under a second here; allow for a loaded CI machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum EnvoyError {
    #[error("no Envoy {version} binary: run `make envoy` (scripts/fetch-envoy.sh), or pass --envoy / DRAINSHIM_ENVOY")]
    NotFound { version: String },
    #[error("envoy: {what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error(
        "envoy did not become ready within {:?}: {why}\n--- envoy log (tail) ---\n{log}",
        START_TIMEOUT
    )]
    NotReady { why: String, log: String },
}

/// The project's cache folder: `$DRAINSHIM_CACHE`, else `.cache` in the source tree.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("DRAINSHIM_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::source_root().join(".cache"))
}

/// The cached binary of one release, if it was fetched.
pub fn cached(version: &str) -> Option<PathBuf> {
    let p = cache_dir()
        .join("envoy")
        .join(version)
        .join("envoy/_bin/envoy");
    p.is_file().then_some(p)
}

/// The Envoy to use when none is given: the cached default release, then `envoy` on PATH.
pub fn default_binary() -> Result<PathBuf, EnvoyError> {
    if let Some(p) = cached(ENVOY_VERSIONS[0]) {
        return Ok(p);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("envoy"))
        .find(|p| p.is_file())
        .ok_or(EnvoyError::NotFound {
            version: ENVOY_VERSIONS[0].to_string(),
        })
}

/// The fail-open route retry of the shipped bootstrap
/// (`deploy/components/envoy/envoy.yaml`, which explains each value).
pub const FAILOPEN_RETRY: &str = ", retry_policy: { retry_on: \"connect-failure,refused-stream,reset\", num_retries: 2, \
    retry_priority: { name: envoy.retry_priorities.previous_priorities, typed_config: { \"@type\": type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig, update_frequency: 1 } }, \
    retry_host_predicate: [ { name: envoy.retry_host_predicates.previous_hosts, typed_config: { \"@type\": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate } } ], \
    host_selection_retry_max_attempts: 3, retry_back_off: { base_interval: 0.001s, max_interval: 0.01s } }";

/// The fail-open cluster settings of the shipped bootstrap.
const FAILOPEN_CLUSTER: &str = "    health_checks:
    - { timeout: 1s, interval: 1s, no_traffic_interval: 1s, unhealthy_threshold: 1, healthy_threshold: 1, tcp_health_check: {} }
    outlier_detection:
      split_external_local_origin_errors: true
      consecutive_local_origin_failure: 1
      enforcing_consecutive_local_origin_failure: 100
      enforcing_consecutive_5xx: 0
      enforcing_consecutive_gateway_failure: 0
      enforcing_success_rate: 0
      enforcing_local_origin_success_rate: 0
      base_ejection_time: 10s
      max_ejection_percent: 100
      successful_active_health_check_uneject_host: true
";

/// The shipped bootstrap, as `make deploy-check` validates it.
pub const SHIPPED_BOOTSTRAP: &str = include_str!("../../deploy/components/envoy/envoy.yaml");

/// [`SHIPPED_BOOTSTRAP`] with its fixed ports moved, so it runs beside
/// anything: the inbound listener to 127.0.0.1:0 (from 0.0.0.0:10000), the
/// admin to `admin_port` (0 for any), the guard endpoint (15097) to `guard`
/// and the app endpoint (8080) to `app`. Fails if any of those addresses is
/// not in the file exactly once, so an edit of the shipped file cannot make
/// the benchmark measure something else unnoticed.
pub fn shipped_bootstrap(
    guard: SocketAddr,
    app: SocketAddr,
    admin_port: u16,
) -> Result<String, String> {
    let mut text = SHIPPED_BOOTSTRAP.to_string();
    let sock =
        |ip: &str, port: u16| format!("socket_address: {{ address: {ip}, port_value: {port} }}");
    for (from, to) in [
        (sock("0.0.0.0", 10000), sock("127.0.0.1", 0)),
        (sock("127.0.0.1", 15000), sock("127.0.0.1", admin_port)),
        (
            sock("127.0.0.1", 15097),
            sock(&guard.ip().to_string(), guard.port()),
        ),
        (
            sock("127.0.0.1", 8080),
            sock(&app.ip().to_string(), app.port()),
        ),
    ] {
        let n = text.matches(&from).count();
        if n != 1 {
            return Err(format!(
                "the shipped bootstrap has `{from}` {n} times, want once"
            ));
        }
        text = text.replacen(&from, &to, 1);
    }
    Ok(text)
}

/// How to run one Envoy.
#[derive(Clone, Debug)]
pub struct EnvoyOptions {
    pub binary: PathBuf,
    /// Where the inbound cluster sends traffic (the app, or the stream guard).
    pub upstream: SocketAddr,
    /// `--drain-time-s`; Envoy stops its listeners this long after a graceful drain.
    pub drain_time: Duration,
    /// `--parent-shutdown-time-s`.
    pub parent_shutdown_time: Duration,
    /// `node.id`; Istio-style ids carry the pod identity.
    pub node_id: String,
    /// `node.metadata` string fields (NAMESPACE, NAME, ISTIO_VERSION, ...).
    pub metadata: BTreeMap<String, String>,
    /// 0 for an ephemeral port; a fixed one lets a restarted Envoy keep its admin address.
    pub admin_port: u16,
    /// Adds file-based LDS and CDS (`lds.yaml`, `cds.yaml` in this folder),
    /// the only way to get Envoy's xDS update counters without a control plane.
    pub xds_dir: Option<PathBuf>,
    /// The app itself, as priority 1 behind `upstream` (the guard): fail open
    /// the way the shipped bootstrap does (health check, outlier detection,
    /// retry to the other priority). `None` is a single endpoint.
    pub fallback: Option<SocketAddr>,
    /// A whole bootstrap to run instead of the generated one, e.g.
    /// [`shipped_bootstrap`]; `upstream`, `fallback` and `admin_port` are then
    /// whatever it says.
    pub custom_bootstrap: Option<String>,
    /// The inbound cluster speaks what the client spoke (HTTP/1.1 or
    /// HTTP/2) instead of h2c always; WebSocket upgrades then reach the
    /// upstream as HTTP/1.1 `Upgrade`.
    pub upstream_follows_downstream: bool,
    /// WebSockets over HTTP/2 (RFC 8441 extended CONNECT) on both sides:
    /// Envoy accepts them from clients and sends every WebSocket to its
    /// HTTP/2 upstream as an extended CONNECT.
    pub extended_connect: bool,
    /// The inbound route's `retry_policy` (the YAML flow mapping inside
    /// `{}`), e.g. `retry_on: unavailable, num_retries: 2`; replaces the
    /// fail-open retry when both are set.
    pub route_retry: Option<String>,
}

// === impl EnvoyOptions ===

impl EnvoyOptions {
    pub fn new(binary: PathBuf, upstream: SocketAddr) -> Self {
        Self {
            binary,
            upstream,
            drain_time: Duration::from_secs(60),
            parent_shutdown_time: Duration::from_secs(90),
            node_id: "drainshim-test".to_string(),
            metadata: BTreeMap::new(),
            admin_port: 0,
            xds_dir: None,
            fallback: None,
            custom_bootstrap: None,
            upstream_follows_downstream: false,
            extended_connect: false,
            route_retry: None,
        }
    }

    /// Envoy's command line for `bootstrap`, with a dynamic base id kept in
    /// `dir` (so Envoys run side by side) and the drain timers.
    pub fn args(&self, bootstrap: &Path, dir: &Path) -> Vec<std::ffi::OsString> {
        let mut a: Vec<std::ffi::OsString> = vec!["-c".into(), bootstrap.into()];
        a.extend(["--use-dynamic-base-id".into(), "--base-id-path".into()]);
        a.push(dir.join("base-id").into());
        for s in [
            "--drain-strategy".to_string(),
            "immediate".to_string(),
            "--drain-time-s".to_string(),
            self.drain_time.as_secs().max(1).to_string(),
            "--parent-shutdown-time-s".to_string(),
            self.parent_shutdown_time.as_secs().max(2).to_string(),
            "--concurrency".to_string(),
            "1".to_string(),
            "-l".to_string(),
            "warning".to_string(),
        ] {
            a.push(s.into());
        }
        a
    }

    /// The bootstrap YAML (JSON is YAML, and serde_json quotes for us).
    pub fn bootstrap(&self) -> String {
        if let Some(custom) = &self.custom_bootstrap {
            return custom.clone();
        }
        let metadata = serde_json::to_string(&self.metadata).unwrap_or_else(|_| "{}".into());
        let node_id = serde_json::to_string(&self.node_id).unwrap_or_else(|_| "\"x\"".into());
        let dynamic = match &self.xds_dir {
            None => String::new(),
            Some(dir) => {
                let path = |f: &str| serde_json::to_string(&dir.join(f)).unwrap_or_default();
                format!(
                    "dynamic_resources:\n  lds_config: {{ path_config_source: {{ path: {} }}, resource_api_version: V3 }}\n  cds_config: {{ path_config_source: {{ path: {} }}, resource_api_version: V3 }}\n",
                    path("lds.yaml"),
                    path("cds.yaml")
                )
            }
        };
        format!(
            r#"node: {{ id: {node_id}, cluster: drainshim, metadata: {metadata} }}
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }} }}
{dynamic}static_resources:
  listeners:
  - name: inbound
    stat_prefix: inbound
    traffic_direction: INBOUND
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: inbound_http
          codec_type: AUTO
          stream_idle_timeout: 0s
          upgrade_configs: [{{ upgrade_type: websocket }}]
{downstream_h2}          route_config:
            virtual_hosts:
            - name: app
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route: {{ cluster: app, timeout: 0s{retry} }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }}
  - name: outbound
    stat_prefix: outbound
    traffic_direction: OUTBOUND
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: outbound_tcp
          cluster: app
  clusters:
  - name: app
    type: STATIC
    connect_timeout: 1s
    # Envoy's default circuit breakers allow 1,024 upstream connections and
    # requests; a WebSocket holds one of each, and the benchmarks hold more.
    # One mapping: a second `circuit_breakers` key (the fail-open settings
    # once had one) silently replaced this one. max_retries as the shipped
    # bootstrap's fail open needs it.
    circuit_breakers:
      thresholds: [{{ max_connections: 100000, max_pending_requests: 100000, max_requests: 100000, max_retries: 1024 }}]
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        {upstream_protocol}
{failopen}    load_assignment:
      cluster_name: app
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: "{ip}", port_value: {port} }} }} }}
{fallback}"#,
            ip = self.upstream.ip(),
            port = self.upstream.port(),
            admin_port = self.admin_port,
            retry = match (&self.route_retry, self.fallback.is_some()) {
                (Some(policy), _) => format!(", retry_policy: {{ {policy} }}"),
                (None, true) => FAILOPEN_RETRY.to_string(),
                (None, false) => String::new(),
            },
            failopen = if self.fallback.is_some() { FAILOPEN_CLUSTER } else { "" },
            // The shipped bootstrap's bounded upstream windows, with its
            // fallback; WebSocket upgrades need the upstream to follow the
            // downstream protocol (HTTP/1.1 Upgrade stays HTTP/1.1).
            downstream_h2 = if self.extended_connect {
                "          http2_protocol_options: { allow_connect: true }\n"
            } else {
                ""
            },
            upstream_protocol = {
                let mut windows = if self.fallback.is_some() {
                    " initial_stream_window_size: 262144, initial_connection_window_size: 1048576 "
                        .to_string()
                } else {
                    String::new()
                };
                if self.extended_connect {
                    windows.push_str(if windows.is_empty() { " allow_connect: true " } else { ", allow_connect: true " });
                }
                if self.upstream_follows_downstream {
                    format!("use_downstream_protocol_config: {{ http_protocol_options: {{}}, http2_protocol_options: {{{windows}}} }}")
                } else {
                    format!("explicit_http_config: {{ http2_protocol_options: {{{windows}}} }}")
                }
            },
            fallback = match self.fallback {
                None => String::new(),
                Some(app) => format!(
                    "        priority: 0\n      - priority: 1\n        lb_endpoints:\n        - endpoint: {{ address: {{ socket_address: {{ address: \"{}\", port_value: {} }} }} }}\n",
                    app.ip(),
                    app.port()
                ),
            },
        )
    }
}

/// A running Envoy; killed when dropped.
#[derive(Debug)]
pub struct EnvoyProcess {
    child: Child,
    /// Holds the bootstrap and the log; removed on drop.
    dir: tempfile::TempDir,
    /// The admin API, e.g. `127.0.0.1:41234`.
    pub admin: SocketAddr,
    /// The INBOUND listener that clients connect to.
    pub inbound: SocketAddr,
    /// The OUTBOUND listener (a TCP proxy), present so inbound-only logic is tested.
    pub outbound: SocketAddr,
}

// === impl EnvoyProcess ===

impl EnvoyProcess {
    /// Starts Envoy and waits until it has initialized (`/server_info` state
    /// LIVE, or DRAINING if a watching shim failed its health check already).
    pub async fn start(opts: &EnvoyOptions) -> Result<Self, EnvoyError> {
        let io = |what: &str| {
            let what = what.to_string();
            move |source| EnvoyError::Io { what, source }
        };
        let dir = tempfile::Builder::new()
            .prefix("drainshim-envoy-")
            .tempdir()
            .map_err(io("tempdir"))?;
        let bootstrap = dir.path().join("bootstrap.yaml");
        std::fs::write(&bootstrap, opts.bootstrap()).map_err(io("write bootstrap"))?;
        let admin_path = dir.path().join("admin-address");
        let log = std::fs::File::create(dir.path().join("envoy.log")).map_err(io("create log"))?;
        let log2 = log.try_clone().map_err(io("log"))?;
        let child = Command::new(&opts.binary)
            .args(opts.args(&bootstrap, dir.path()))
            .arg("--admin-address-path")
            .arg(&admin_path)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .kill_on_drop(true)
            .spawn()
            .map_err(io(&format!("spawn {}", opts.binary.display())))?;
        let mut p = Self {
            child,
            dir,
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            inbound: SocketAddr::from(([127, 0, 0, 1], 0)),
            outbound: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        match p.wait_ready(&admin_path).await {
            Ok(()) => Ok(p),
            Err(why) => Err(EnvoyError::NotReady {
                why,
                log: p.log_tail(),
            }),
        }
    }

    async fn wait_ready(&mut self, admin_path: &Path) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut delay = Duration::from_millis(20);
        let mut last = String::from("no admin address yet");
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("envoy exited: {status}"));
            }
            if let Err(e) = self.probe(admin_path).await {
                last = e;
            } else {
                return Ok(());
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(200));
        }
        Err(last)
    }

    /// One readiness probe: the admin address file, `/ready`, the bound listeners.
    async fn probe(&mut self, admin_path: &Path) -> Result<(), String> {
        let text = std::fs::read_to_string(admin_path).map_err(|e| e.to_string())?;
        self.admin = text
            .trim()
            .parse()
            .map_err(|e| format!("admin address {text:?}: {e}"))?;
        let admin = self.admin_client();
        // Initialized: LIVE, or DRAINING when something (a drainshim that
        // watches this admin address) failed its health check already.
        let info = admin.server_info().await.map_err(|e| e.to_string())?;
        if !matches!(info.state(), Some(State::Live | State::Draining)) {
            return Err(format!("not initialized yet: {}", info.state));
        }
        for (name, addr) in admin.bound_listeners().await.map_err(|e| e.to_string())? {
            match name.as_str() {
                "inbound" => self.inbound = addr,
                "outbound" => self.outbound = addr,
                _ => {}
            }
        }
        if self.inbound.port() == 0 {
            return Err("inbound listener not bound yet".into());
        }
        Ok(())
    }

    /// `http://127.0.0.1:<admin port>`.
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin)
    }

    pub fn admin_client(&self) -> AdminClient {
        // The URL is built from a SocketAddr, so it always parses.
        AdminClient::new(&self.admin_url(), Duration::from_secs(2))
            .expect("admin URL built from a socket address")
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends SIGTERM (what the kubelet does after preStop).
    pub fn sigterm(&self) {
        if let Some(pid) = self.child.id() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
    }

    /// SIGKILL and reap.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Waits for the process to exit, up to `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .ok()?
            .ok()
    }

    /// The last lines of Envoy's log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}
