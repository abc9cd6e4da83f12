//! The command line: subcommands and flags. Every flag also reads
//! `DRAINSHIM_<FLAG_IN_CAPS>`; durations use humantime (`250ms`, `5s`, `1m30s`).

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use ipnet::IpNet;

use crate::config::{self, Timers};

/// Exit codes, shared by every subcommand (sysexits.h).
pub const EXIT_CODES: &str = "\
Exit codes:
  0   success (for drains: the drain finished, deadline included)
  64  usage error: a bad flag or an inconsistent drain budget
  69  a service it needs is unavailable (the shim, a port to bind)
  70  internal error";

#[derive(Debug, Parser)]
#[command(
    name = "drainshim",
    version,
    about = "Makes Envoy proxy restarts safe for long-lived gRPC streams",
    long_about = "Makes Envoy proxy restarts safe for long-lived gRPC streams.\n\n\
        drainshim runs beside Envoy. On a pod's preStop (or SIGTERM) it fails Envoy's health \
        check, drains its inbound listeners through the admin API, ends long-lived streams \
        gracefully through its stream guard (grpc-status 14, spread over the drain window), and \
        exits early once none are left. It reports what was drained and what was cut, as JSON and \
        as Prometheus metrics, and publishes each proxy's version for the fleet tools.",
    after_help = EXIT_CODES
)]
pub struct Cli {
    /// Log filter (tracing-subscriber syntax), e.g. `info` or `drainshim=debug`.
    /// Default: `info` (`warn` for the demo).
    #[arg(long, env = "DRAINSHIM_LOG", global = true)]
    pub log: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

// Parsed once at start: the size of the biggest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run beside Envoy in the pod: control endpoints, metrics, and the drain
    /// on preStop or SIGTERM.
    #[command(
        long_about = "Run beside Envoy in the pod.\n\n\
            Serves /metrics, /healthz, /readyz, /status and /drain on --listen. A drain starts on \
            POST /drain, on GET|POST /drain?wait=true (what a preStop httpGet calls; it answers \
            with the drain report), or on SIGTERM. A second SIGTERM skips to the deadline. After a \
            drain started by SIGTERM the process prints the report as one JSON line on stdout and \
            exits 0.\n\n\
            /readyz is 503 while draining, while Envoy is not ready, and, with the stream guard, \
            while the data path is down: every --ready-interval (1s) the shim connects to the \
            guard's listener and then to --guard-upstream; after --ready-failures (3) consecutive \
            failed checks /readyz is 503, and one passing check makes it 200 again. At start it \
            is 503 until a check passes.",
        after_help = EXIT_CODES
    )]
    Sidecar(SidecarArgs),

    /// The preStop exec hook: start the drain on the local shim, wait for it,
    /// and print the report.
    #[command(
        long_about = "The preStop exec hook.\n\n\
            Starts the drain on the local shim (GET /drain?wait=true), prints progress lines to \
            stderr while it waits, then prints the drain report JSON on stdout. It exits 0 when \
            the drain finished, deadline included, so the kubelet is never held beyond the budget.",
        after_help = "Exit codes:\n  0   the drain finished (any outcome)\n  64  usage error\n  69  the shim could not be reached, or did not answer within --timeout"
    )]
    Prestop(PrestopArgs),

    /// Drain an Envoy once, with no daemon and no guard, and print the report.
    #[command(
        long_about = "Drain an Envoy once, with no daemon and no guard.\n\n\
            Fails the health check, drains the inbound listeners, polls the live counters, and \
            prints progress to stderr and the drain report JSON on stdout. SIGTERM or Ctrl-C skips \
            to the deadline.",
        after_help = EXIT_CODES
    )]
    Drain(DrainArgs),

    /// List every proxy with its namespace, pod, version and state, and the
    /// version spread per namespace.
    #[command(after_help = FLEET_EXIT_CODES)]
    Inventory(InventoryArgs),

    /// Check every proxy against a control-plane version's supported skew.
    #[command(
        long_about = "Check every proxy against a control-plane version's supported skew.\n\n\
            Answers \"can the control plane move to X.Y now?\": exits 0 when every proxy is within \
            --max-skew minor versions of X.Y (and not newer), 1 otherwise, naming the offenders. \
            Moving the control plane is the point of no return: afterwards proxies outside the skew \
            are unsupported and rollback by restart is gone.",
        after_help = "Exit codes:\n  0   every proxy is within the skew: moving the control plane is safe\n  1   some proxies are outside the skew (listed)\n  64  usage error\n  69  a source (admin API, shim, Prometheus) could not be read"
    )]
    Skew(SkewArgs),

    /// The gate for one upgrade wave: versions, cut streams, config
    /// rejections, retry volume and reset rate.
    #[command(
        long_about = "The gate for one upgrade wave.\n\n\
            Checks that every pod in the namespaces runs --expect-version, that no stream was cut by a \
            drain and no xDS update was rejected on that version within --window, and that the retry \
            volume and the kernel reset rate did not grow past their thresholds against the window \
            before. With --targets (shims scraped directly) the two rate checks are not applicable: \
            they need Prometheus' history.",
        after_help = "Exit codes:\n  0   every applicable check passed: the wave may proceed\n  1   a check failed: stop the rollout\n  64  usage error\n  69  Prometheus or a shim could not be read"
    )]
    Verify(VerifyArgs),

    /// The DaemonSet agent: finds every pod's Envoy through /proc, enters its
    /// network namespace, and gives each pod a preStop listener and metrics.
    #[command(
        long_about = "The DaemonSet agent (node mode).\n\n\
            One agent per node replaces the per-pod sidecar. Every --scan-interval it lists Envoy \
            processes in --proc-root, groups them by network namespace (one namespace = one pod; \
            the node's own is skipped), and for each pod:\n\
            - reaches Envoy's admin API on 127.0.0.1:--pod-admin-port from inside the pod \
            (setns on a short-lived thread, socket handed to tokio);\n\
            - identifies the pod: POD_NAMESPACE/POD_NAME in the Envoy process's environment, then \
            Envoy node metadata NAMESPACE/NAME, then the Istio node id, then the pod UID from its \
            kubepods cgroup;\n\
            - plants a listener inside the pod on 0.0.0.0:--pod-listen-port that serves only \
            GET /drain?wait=true (the pod's preStop httpGet; drains only that pod, and only when \
            asked from one of the node's own addresses or the pod's loopback) and GET /healthz;\n\
            - runs the same drain driver, report and telemetry as the sidecar.\n\
            Pods whose namespace has no Envoy left are retired at the next scan: listener closed, \
            tasks cancelled.\n\n\
            On --listen (the node's namespace): GET /metrics (every series with namespace and pod \
            labels; scrape with honor_labels: true), /healthz, /readyz, /status, and \
            GET /pods/<namespace>/<pod>, POST /pods/<namespace>/<pod>/drain[?wait=true] \
            (loopback only).",
        after_help = NODE_AFTER_HELP
    )]
    Node(NodeArgs),

    /// Benchmark helpers.
    #[command(subcommand)]
    Bench(BenchCommand),

    /// Copy this binary into a shared volume, so another container (Envoy's)
    /// can exec `drainshim prestop` without a shell or a second image.
    #[command(
        long_about = "Copy this binary into a shared volume.\n\n\
            Run it as an init container writing to an emptyDir that the Envoy container mounts; \
            Envoy's preStop can then exec `<dir>/drainshim prestop`. Images need no shell and no \
            `cp`: the binary copies itself.",
        after_help = EXIT_CODES
    )]
    Install(InstallArgs),

    /// Run the main job end to end on this machine: real Envoy, gRPC streams,
    /// a drain, then the restart.
    #[command(after_help = EXIT_CODES)]
    Demo(DemoArgs),
}

/// Privileges and exit codes of `drainshim node`.
pub const NODE_AFTER_HELP: &str = "\
Privileges (pod spec of the DaemonSet):
  hostPID: true        see the pods' processes in /proc
  hostNetwork: true    the agent's namespace is the node's: its addresses are the
                       kubelet's (allowed to drain) and --listen is on the node
  CAP_SYS_ADMIN        setns(CLONE_NEWNET) into each pod's network namespace
  CAP_SYS_PTRACE       open /proc/<pid>/ns/net and read exe of processes run by other
                       users (Istio's proxy runs as 1337). Their /proc/<pid>/environ
                       stays unreadable even so (measured): give Envoy its identity
                       as node metadata NAMESPACE/NAME (downward API), as Istio does
  not needed: CAP_NET_BIND_SERVICE (15098 and 15099 are above 1024),
              CAP_NET_ADMIN, privileged: true

Stream guard per pod (opt in):
  Envoy node metadata DRAINSHIM_GUARD: \"LISTEN=UPSTREAM\", both inside the pod,
  e.g. 127.0.0.1:15097=127.0.0.1:8080: the agent binds LISTEN in the pod's network
  namespace and forwards to UPSTREAM on the pod's loopback. Point Envoy's inbound
  cluster at LISTEN (priority 0) with the app as priority 1 (fail open), as
  deploy/components/envoy/envoy.yaml does. --guard gives pods without the key the same.
  The pod's preStop drain ends its guarded streams gracefully; caps are per pod.

Rolling update (--handover-socket on a hostPath, DaemonSet maxSurge 1):
  the new agent takes every listener (node API, preStop, guards) from the old one:
  nothing is refused; the old one ends its guarded streams over --handover-window
  and exits at SIGTERM. No agent on the socket: bind everything.

Exit codes:
  0   stopped by SIGTERM (after drains in progress finished)
  64  usage error: a bad flag or an inconsistent drain budget
  69  --listen could not be bound, or --proc-root cannot be read
  77  no permission to enter network namespaces (CAP_SYS_ADMIN missing)
  70  internal error";

/// Exit codes of the read-only fleet commands.
pub const FLEET_EXIT_CODES: &str = "\
Exit codes:
  0   success
  64  usage error
  69  a source (admin API, shim, Prometheus) could not be read";

/// Where fleet commands read proxies from: exactly one kind.
#[derive(Debug, Clone, Args)]
#[group(required = true, multiple = false)]
pub struct SourceArgs {
    /// An Envoy admin API to ask directly; repeatable.
    #[arg(
        long = "envoy-admin",
        env = "DRAINSHIM_ENVOY_ADMIN",
        value_delimiter = ','
    )]
    pub envoy_admin: Vec<String>,

    /// A drainshim control address whose /metrics is read; repeatable.
    #[arg(long, env = "DRAINSHIM_TARGETS", value_delimiter = ',')]
    pub targets: Vec<String>,

    /// A Prometheus server scraping the shims (fleet scale).
    #[arg(long, env = "DRAINSHIM_PROMETHEUS")]
    pub prometheus: Option<String>,
}

impl SourceArgs {
    pub fn source(&self) -> crate::fleet::Source {
        use crate::fleet::Source;
        match &self.prometheus {
            Some(p) => Source::Prometheus(p.clone()),
            None if !self.targets.is_empty() => Source::Targets(self.targets.clone()),
            None => Source::Admins(self.envoy_admin.clone()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

#[derive(Debug, Args)]
pub struct InventoryArgs {
    #[command(flatten)]
    pub source: SourceArgs,

    #[arg(long, env = "DRAINSHIM_FORMAT", value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Debug, Args)]
pub struct SkewArgs {
    /// The control-plane version to judge against (X.Y or X.Y.Z).
    #[arg(long, env = "DRAINSHIM_CONTROL_PLANE")]
    pub control_plane: crate::inventory::Release,

    /// How many minor versions a proxy may lag behind the control plane.
    #[arg(long, env = "DRAINSHIM_MAX_SKEW", default_value_t = 1)]
    pub max_skew: u32,

    /// Judge Envoy's own version, or the mesh's (ISTIO_VERSION).
    #[arg(long, env = "DRAINSHIM_VERSION_LABEL", value_enum, default_value_t = crate::fleet::VersionLabel::Version)]
    pub version_label: crate::fleet::VersionLabel,

    #[command(flatten)]
    pub source: SourceArgs,

    #[arg(long, env = "DRAINSHIM_FORMAT", value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// A Prometheus server scraping the shims.
    #[arg(
        long,
        env = "DRAINSHIM_PROMETHEUS",
        required_unless_present = "targets",
        conflicts_with = "targets"
    )]
    pub prometheus: Option<String>,

    /// drainshim control addresses to scrape directly instead; repeatable.
    #[arg(long, env = "DRAINSHIM_TARGETS", value_delimiter = ',')]
    pub targets: Vec<String>,

    /// The wave's namespaces; repeatable (required with --prometheus).
    #[arg(long, env = "DRAINSHIM_NAMESPACE", value_delimiter = ',')]
    pub namespace: Vec<String>,

    /// The Envoy version every pod must run now, e.g. 1.40.0.
    #[arg(long, env = "DRAINSHIM_EXPECT_VERSION")]
    pub expect_version: String,

    /// How far back to look.
    #[arg(long, env = "DRAINSHIM_WINDOW", value_parser = config::parse_duration, default_value = "15m")]
    pub window: Duration,

    /// Allowed relative growth of the retry rate against the window before (0.2 = +20%).
    #[arg(long, env = "DRAINSHIM_MAX_RETRY_INCREASE", default_value_t = 0.2)]
    pub max_retry_increase: f64,

    /// Allowed relative growth of the kernel TCP reset rate against the window before.
    #[arg(long, env = "DRAINSHIM_MAX_RESET_INCREASE", default_value_t = 0.2)]
    pub max_reset_increase: f64,

    /// Absolute slack per second added to both limits, so near-zero rates do not fail on noise.
    #[arg(long, env = "DRAINSHIM_RATE_FLOOR", default_value_t = 0.05)]
    pub rate_floor: f64,

    #[arg(long, env = "DRAINSHIM_FORMAT", value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// Directory to copy the binary into (as `drainshim`, mode 0755).
    #[arg(long, env = "DRAINSHIM_INSTALL_TO")]
    pub to: std::path::PathBuf,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The Envoy binary (default: the project's cached 1.40.0, then `envoy` on PATH).
    #[arg(long, env = "DRAINSHIM_ENVOY")]
    pub envoy: Option<std::path::PathBuf>,

    /// How many long-lived streams to hold open, over two pods.
    #[arg(long, env = "DRAINSHIM_STREAMS", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(2..=10_000))]
    pub streams: u64,

    /// Where to write the reconnect plot.
    #[arg(long, env = "DRAINSHIM_PLOT", default_value = "drainshim-demo.svg")]
    pub plot: std::path::PathBuf,

    /// The long-lived streams: gRPC, WebSockets, or half of each.
    #[arg(long, env = "DRAINSHIM_PROTOCOL", value_enum, default_value = "mixed")]
    pub protocol: crate::bench::population::Protocol,
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// Address for the agent's /metrics, /status and pod API, on the node.
    #[arg(long, env = "DRAINSHIM_LISTEN", default_value = crate::node::DEFAULT_NODE_LISTEN)]
    pub listen: SocketAddr,

    /// Where to list processes: the host's /proc (needs hostPID).
    #[arg(long, env = "DRAINSHIM_PROC_ROOT", default_value = "/proc")]
    pub proc_root: std::path::PathBuf,

    /// A process whose comm or executable is named this is an Envoy; repeatable.
    #[arg(
        long,
        env = "DRAINSHIM_ENVOY_PROCESS_NAME",
        value_delimiter = ',',
        default_value = "envoy"
    )]
    pub envoy_process_name: Vec<String>,

    /// How often to look for pods that came or went.
    #[arg(long, env = "DRAINSHIM_SCAN_INTERVAL", value_parser = config::parse_duration,
          default_value = "5s")]
    pub scan_interval: Duration,

    /// Envoy's admin port on 127.0.0.1 inside each pod.
    #[arg(long, env = "DRAINSHIM_POD_ADMIN_PORT", default_value_t = crate::node::DEFAULT_POD_ADMIN_PORT)]
    pub pod_admin_port: u16,

    /// Port of the preStop listener planted inside each pod (all addresses).
    #[arg(long, env = "DRAINSHIM_POD_LISTEN_PORT", default_value_t = crate::node::DEFAULT_POD_LISTEN_PORT,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub pod_listen_port: u16,

    /// How long a departed pod's drain counters stay on /metrics.
    #[arg(long, env = "DRAINSHIM_POD_RETENTION", value_parser = config::parse_duration,
          default_value = "60s")]
    pub pod_retention: Duration,

    /// Each pod's drain timers.
    #[command(flatten)]
    pub timers: TimerArgs,

    /// The per-pod stream guards and the agent's hand-over.
    #[command(flatten)]
    pub guard: NodeGuardArgs,
}

/// `drainshim node`: the stream guard the agent serves for each opted-in pod
/// (node metadata `DRAINSHIM_GUARD`), and the hand-over of every listener to
/// the next agent. Same meaning as the sidecar's flags, applied per pod.
#[derive(Debug, Clone, Args)]
pub struct NodeGuardArgs {
    /// The guard for pods whose Envoy has no `DRAINSHIM_GUARD` node metadata,
    /// as LISTEN=UPSTREAM inside the pod (e.g. 127.0.0.1:15097=127.0.0.1:8080).
    /// Unset: only pods with the key get a guard.
    #[arg(long = "guard", env = "DRAINSHIM_GUARD", value_name = "LISTEN=UPSTREAM")]
    pub default_guard: Option<String>,

    /// Per pod: most connections its guard holds open at once.
    #[arg(long, env = "DRAINSHIM_GUARD_MAX_CONNECTIONS", default_value_t = crate::guard::DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub guard_max_connections: usize,

    /// Per pod: most streams open through its guard at once; more are
    /// refused retryably before they reach the app.
    #[arg(long, env = "DRAINSHIM_GUARD_MAX_STREAMS", default_value_t = crate::guard::DEFAULT_MAX_STREAMS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
    pub guard_max_streams: usize,

    /// Close each guard connection after this age (±10% jitter), as the sidecar does. Off by default.
    #[arg(long, env = "DRAINSHIM_MAX_CONNECTION_AGE", value_parser = config::parse_duration)]
    pub max_connection_age: Option<Duration>,

    /// How long streams may run after a max-age GOAWAY before the guard ends them.
    #[arg(long, env = "DRAINSHIM_MAX_CONNECTION_AGE_GRACE", value_parser = config::parse_duration,
          default_value = "30s")]
    pub max_connection_age_grace: Duration,

    /// End a connection's remaining streams spread over this window, inside the grace.
    #[arg(long, env = "DRAINSHIM_MAX_CONNECTION_AGE_SPREAD", value_parser = config::parse_duration,
          default_value = "10s")]
    pub max_connection_age_spread: Duration,

    /// Which streams a drain ends early (see `drainshim sidecar --help`).
    #[arg(long, env = "DRAINSHIM_LONG_STREAM_AGE", value_parser = config::parse_duration,
          default_value = "10s")]
    pub long_stream_age: Duration,

    /// Reset a guarded stream whose client takes no response data for this long.
    #[arg(long, env = "DRAINSHIM_WRITE_STALL_TIMEOUT", value_parser = config::parse_duration,
          default_value = "60s")]
    pub write_stall_timeout: Duration,

    /// A unix socket on a host path shared by successive agents. At start the
    /// agent asks the one serving it for every listener (the node API, each
    /// pod's preStop and guard listener), so nothing is closed or refused
    /// during the agent's own rolling update; then it serves it itself.
    #[arg(long, env = "DRAINSHIM_HANDOVER_SOCKET")]
    pub handover_socket: Option<std::path::PathBuf>,

    /// After handing its listeners over, the old agent ends the guarded
    /// streams it still carries spread over this window, then exits at SIGTERM.
    #[arg(long, env = "DRAINSHIM_HANDOVER_WINDOW", value_parser = config::parse_duration,
          default_value = "10s")]
    pub handover_window: Duration,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// A tonic streaming backend that stamps every message with a sequence number.
    #[command(after_help = EXIT_CODES)]
    Server(BenchServerArgs),

    /// Restart one of two pods under N long-lived streams and measure, from
    /// the client side, what each way of restarting costs.
    #[command(
        long_about = "Restart one of two pods under N long-lived streams and measure what it costs.\n\n\
            Each pod is a real Envoy inbound in front of the tonic bench backend (in drainshim mode \
            with a drainshim sidecar and its stream guard between them). Clients reconnect with \
            backoff when a stream ends, like real gRPC clients. Per mode it reports streams ended \
            gracefully and cut, messages lost, reconnect latency p50/p99, and the reconnect storm \
            (peak over mean reconnects per 100 ms). With --soak it instead holds the population for \
            that long under --max-connection-age and reports the steady-state reconnect rate.",
        after_help = EXIT_CODES
    )]
    Reconnect(ReconnectArgs),

    /// The node agent with N pod namespaces: discovery time, RSS, idle CPU.
    #[command(
        long_about = "The node agent with N pod namespaces.\n\n\
            Creates N network namespaces, each with a light admin stand-in for Envoy \
            (`bench admin-stub`, run under the process name `envoy`), starts the real \
            `drainshim node` on a private view of /proc holding just those processes, and \
            reports the time until every pod is inventoried (version read from inside its \
            namespace, preStop listener bound), the agent's RSS, the time of one /metrics \
            scrape, and the agent's idle CPU. Needs root; removes everything it created.",
        after_help = "Exit codes:\n  0   measured\n  64  usage error\n  69  the benchmark could not run (not root, no `ip`, a pod not found)"
    )]
    NodeScale(NodeScaleArgs),

    /// A light stand-in for Envoy's admin API (used by node-scale).
    #[command(hide = true, after_help = EXIT_CODES)]
    AdminStub(AdminStubArgs),

    /// The bench app for both populations on one port: the gRPC streaming
    /// backend (h2c) and a WebSocket ticker/echo (`GET /tick?id=&interval_ms=&size=`).
    #[command(after_help = EXIT_CODES)]
    App(BenchAppArgs),
}

#[derive(Debug, Args)]
pub struct ReconnectArgs {
    /// The Envoy binary (default: the project's cached 1.40.0, then `envoy` on PATH).
    #[arg(long, env = "DRAINSHIM_ENVOY")]
    pub envoy: Option<std::path::PathBuf>,

    /// Long-lived streams, spread over both pods.
    #[arg(long, env = "DRAINSHIM_STREAMS", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(2..=20_000))]
    pub streams: u64,

    /// Which restarts to measure; repeatable (default: all three).
    #[arg(long, env = "DRAINSHIM_MODE", value_enum, value_delimiter = ',')]
    pub mode: Vec<crate::bench::reconnect::Mode>,

    /// The long-lived streams: gRPC server streams, WebSockets (HTTP/1.1
    /// Upgrade; the guard ends them with Close 1012), or half of each. Each
    /// kind gets its own result row.
    #[arg(long, env = "DRAINSHIM_PROTOCOL", value_enum, default_value = "grpc")]
    pub protocol: crate::bench::population::Protocol,

    /// drainshim mode: time for callers to drop the endpoint.
    #[arg(long, env = "DRAINSHIM_DEREGISTRATION_DELAY", value_parser = config::parse_duration, default_value = "2s")]
    pub deregistration_delay: Duration,

    /// drainshim mode: streams are ended gracefully before this.
    #[arg(long, env = "DRAINSHIM_DRAIN_TIME", value_parser = config::parse_duration, default_value = "12s")]
    pub drain_time: Duration,

    /// drainshim mode: hard deadline.
    #[arg(long, env = "DRAINSHIM_PARENT_SHUTDOWN_TIME", value_parser = config::parse_duration, default_value = "20s")]
    pub parent_shutdown_time: Duration,

    /// The guard's max connection age (drainshim mode and --soak).
    #[arg(long, env = "DRAINSHIM_MAX_CONNECTION_AGE", value_parser = config::parse_duration)]
    pub max_connection_age: Option<Duration>,

    /// Grace after a max-age GOAWAY before open streams are ended.
    #[arg(long, env = "DRAINSHIM_MAX_CONNECTION_AGE_GRACE", value_parser = config::parse_duration, default_value = "30s")]
    pub max_connection_age_grace: Duration,

    /// After the grace, a connection's remaining streams are ended over this window.
    #[arg(long, env = "DRAINSHIM_MAX_CONNECTION_AGE_SPREAD", value_parser = config::parse_duration, default_value = "10s")]
    pub max_connection_age_spread: Duration,

    /// Instead of a restart, hold the population this long under
    /// --max-connection-age and report the steady-state reconnect rate.
    #[arg(long, env = "DRAINSHIM_SOAK", value_parser = config::parse_duration, requires = "max_connection_age")]
    pub soak: Option<Duration>,

    /// Message sizes in bytes, comma-separated: stream i gets the i-th size
    /// in turn (e.g. `1,1000,16385,100000,1048576` mixes small and 1 MiB
    /// messages, which span many HTTP/2 frames). At most 1 MiB each.
    #[arg(long, env = "DRAINSHIM_PAYLOAD_BYTES", value_delimiter = ',', default_value = "64",
          value_parser = clap::value_parser!(u32).range(0..=1_048_576))]
    pub payload_bytes: Vec<u32>,

    #[arg(long, env = "DRAINSHIM_FORMAT", value_enum, default_value_t = Format::Table)]
    pub format: Format,

    /// Write reconnects over time per mode as an SVG plot.
    #[arg(long, env = "DRAINSHIM_PLOT")]
    pub plot: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct BenchServerArgs {
    /// Address to serve gRPC (h2c) on.
    #[arg(long, env = "DRAINSHIM_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
}

#[derive(Debug, Args)]
pub struct NodeScaleArgs {
    /// Pod namespaces to create.
    #[arg(long, env = "DRAINSHIM_PODS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub pods: u64,

    /// How long to watch the idle agent's CPU (two scans at the default 5 s).
    #[arg(long, env = "DRAINSHIM_IDLE_WINDOW", value_parser = config::parse_duration,
          default_value = "10s")]
    pub idle_window: Duration,

    #[arg(long, env = "DRAINSHIM_FORMAT", value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Debug, Args)]
pub struct BenchAppArgs {
    /// Address to serve gRPC and WebSocket on.
    #[arg(long, env = "DRAINSHIM_LISTEN", default_value = "127.0.0.1:50052")]
    pub listen: SocketAddr,
}

#[derive(Debug, Args)]
pub struct AdminStubArgs {
    /// Address to serve on (inside the pod's namespace).
    #[arg(long, env = "DRAINSHIM_LISTEN", default_value = "127.0.0.1:15000")]
    pub listen: SocketAddr,

    /// Node metadata NAMESPACE to report.
    #[arg(long, env = "DRAINSHIM_NAMESPACE", default_value = "bench")]
    pub namespace: String,

    /// Node metadata NAME to report.
    #[arg(long, env = "DRAINSHIM_POD", default_value = "pod")]
    pub pod: String,

    /// Envoy release to report.
    #[arg(long, env = "DRAINSHIM_VERSION", default_value = "1.40.0")]
    pub version: String,
}

/// The drain timers; see docs/design.md for the timeline.
#[derive(Debug, Clone, Args)]
pub struct TimerArgs {
    /// How long streams get to finish; the guard ends the rest before this.
    #[arg(long, env = "DRAINSHIM_DRAIN_TIME", value_parser = config::parse_duration,
          default_value = "60s")]
    pub drain_time: Duration,

    /// Hard deadline: whatever is still open then is counted as cut.
    #[arg(long, env = "DRAINSHIM_PARENT_SHUTDOWN_TIME", value_parser = config::parse_duration,
          default_value = "90s")]
    pub parent_shutdown_time: Duration,

    /// Never end the drain earlier than this, even with nothing active.
    #[arg(long, env = "DRAINSHIM_MIN_DRAIN_TIME", value_parser = config::parse_duration,
          default_value = "5s")]
    pub min_drain_time: Duration,

    /// Time for endpoint removal to reach callers; short requests keep being served.
    #[arg(long, env = "DRAINSHIM_DEREGISTRATION_DELAY", value_parser = config::parse_duration,
          default_value = "5s")]
    pub deregistration_delay: Duration,

    /// How often Envoy's live counters are read during a drain.
    #[arg(long, env = "DRAINSHIM_POLL_INTERVAL", value_parser = config::parse_duration,
          default_value = "1s")]
    pub poll_interval: Duration,

    /// The pod's terminationGracePeriodSeconds; must exceed --parent-shutdown-time.
    #[arg(long, env = "DRAINSHIM_TERMINATION_GRACE_PERIOD", value_parser = config::parse_duration)]
    pub termination_grace_period: Option<Duration>,

    /// Deadline for each Envoy admin call; a slower admin counts as unreachable.
    #[arg(long, env = "DRAINSHIM_ADMIN_TIMEOUT", value_parser = config::parse_duration,
          default_value = "2s")]
    pub admin_timeout: Duration,
}

impl TimerArgs {
    pub fn timers(&self) -> Timers {
        Timers {
            deregistration_delay: self.deregistration_delay,
            min_drain_time: self.min_drain_time,
            drain_time: self.drain_time,
            parent_shutdown_time: self.parent_shutdown_time,
            poll_interval: self.poll_interval,
        }
    }
}

#[derive(Debug, Args)]
pub struct SidecarArgs {
    /// Envoy's admin API.
    #[arg(long, env = "DRAINSHIM_ENVOY_ADMIN", default_value = config::DEFAULT_ENVOY_ADMIN)]
    pub envoy_admin: String,

    /// Address for the control endpoints and /metrics.
    #[arg(long, env = "DRAINSHIM_LISTEN", default_value = config::DEFAULT_LISTEN)]
    pub listen: SocketAddr,

    #[command(flatten)]
    pub timers: TimerArgs,

    /// Start the stream guard here: an HTTP/2 and HTTP/1.1 proxy in front of
    /// the app that ends long streams gracefully. Point Envoy's inbound cluster at it.
    #[arg(long, env = "DRAINSHIM_GUARD_LISTEN")]
    pub guard_listen: Option<SocketAddr>,

    /// The application port the guard forwards to.
    #[arg(long, env = "DRAINSHIM_GUARD_UPSTREAM")]
    pub guard_upstream: Option<SocketAddr>,

    /// Most connections the guard holds open at once; more are closed as
    /// soon as they are accepted (Envoy retries them, on the app when it
    /// fails open).
    #[arg(long, env = "DRAINSHIM_GUARD_MAX_CONNECTIONS", default_value_t = crate::guard::DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub guard_max_connections: usize,

    /// Most streams (HTTP/1.1: requests) open through the guard at once, over
    /// all connections; more are refused retryably (HTTP/2 REFUSED_STREAM,
    /// HTTP/1.1 503 with Retry-After) before they reach the app.
    #[arg(long, env = "DRAINSHIM_GUARD_MAX_STREAMS", default_value_t = crate::guard::DEFAULT_MAX_STREAMS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
    pub guard_max_streams: usize,

    /// With the guard, /readyz also checks the data path this often: a TCP
    /// connect to the guard's listener, then to --guard-upstream.
    #[arg(long, env = "DRAINSHIM_READY_INTERVAL", value_parser = config::parse_duration,
          default_value = "1s")]
    pub ready_interval: Duration,

    /// /readyz turns 503 after this many consecutive failed data-path checks
    /// (one slow probe never flips it) and 200 again after one passing check.
    #[arg(long, env = "DRAINSHIM_READY_FAILURES", default_value_t = crate::readiness::DEFAULT_FAILURES,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub ready_failures: u32,

    /// Close each guard connection after this age (±10% jitter): GOAWAY, a
    /// grace, then open streams end with grpc-status 14. Off by default.
    #[arg(long, env = "DRAINSHIM_MAX_CONNECTION_AGE", value_parser = config::parse_duration)]
    pub max_connection_age: Option<Duration>,

    /// How long streams may run after a max-age GOAWAY before the guard ends them.
    #[arg(long, env = "DRAINSHIM_MAX_CONNECTION_AGE_GRACE", value_parser = config::parse_duration,
          default_value = "30s")]
    pub max_connection_age_grace: Duration,

    /// End a connection's remaining streams spread over this window, inside
    /// the grace (capped at it): behind Envoy one pooled connection carries
    /// many streams, and age x (1 +/- 10%) + grace stays a bound on its life.
    #[arg(long, env = "DRAINSHIM_MAX_CONNECTION_AGE_SPREAD", value_parser = config::parse_duration,
          default_value = "10s")]
    pub max_connection_age_spread: Duration,

    /// Which streams a drain ends early. Long-lived streams (a response that
    /// carried two or more messages, or answered at least this long ago) are
    /// ended gracefully, spread over the drain window. Everything else (unary
    /// calls, calls the app has not answered) is left to finish until the
    /// drain's deadline minus the time an ending needs; only what is still
    /// open then is ended, retryably.
    #[arg(long, env = "DRAINSHIM_LONG_STREAM_AGE", value_parser = config::parse_duration,
          default_value = "10s")]
    pub long_stream_age: Duration,

    /// Reset a guarded stream whose client takes no response data for this
    /// long (its flow-control window stays shut), so a peer that stopped
    /// reading does not hold it until max age.
    #[arg(long, env = "DRAINSHIM_WRITE_STALL_TIMEOUT", value_parser = config::parse_duration,
          default_value = "60s")]
    pub write_stall_timeout: Duration,

    /// Networks (CIDR) besides loopback allowed to start a drain; repeatable.
    #[arg(long, env = "DRAINSHIM_ALLOW_DRAIN_FROM", value_delimiter = ',')]
    pub allow_drain_from: Vec<IpNet>,

    /// After a SIGTERM drain, keep serving /metrics this long so Prometheus
    /// scrapes the final counts (a second SIGTERM skips it). Counts against
    /// --termination-grace-period.
    #[arg(long, env = "DRAINSHIM_LINGER", value_parser = config::parse_duration, default_value = "10s")]
    pub linger: Duration,

    /// Pod name for the inventory (else env POD_NAME, then Envoy's node metadata).
    #[arg(long, env = "DRAINSHIM_POD_NAME")]
    pub pod_name: Option<String>,

    /// Pod namespace for the inventory (else env POD_NAMESPACE, then Envoy's node metadata).
    #[arg(long, env = "DRAINSHIM_POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
}

#[derive(Debug, Args)]
pub struct PrestopArgs {
    /// The local shim's control address.
    #[arg(long, env = "DRAINSHIM_SHIM", default_value = "http://127.0.0.1:15099")]
    pub shim: String,

    /// Give up waiting after this long (keep it above the shim's --parent-shutdown-time).
    #[arg(long, env = "DRAINSHIM_TIMEOUT", value_parser = config::parse_duration,
          default_value = "120s")]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct DrainArgs {
    /// Envoy's admin API.
    #[arg(long, env = "DRAINSHIM_ENVOY_ADMIN", default_value = config::DEFAULT_ENVOY_ADMIN)]
    pub envoy_admin: String,

    #[command(flatten)]
    pub timers: TimerArgs,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_match_the_contract() {
        let cli = Cli::try_parse_from(["drainshim", "sidecar"]).unwrap();
        let Command::Sidecar(a) = cli.command else {
            panic!("not sidecar")
        };
        assert_eq!(a.timers.timers(), Timers::default());
        assert_eq!(a.listen.to_string(), "127.0.0.1:15099");
        assert_eq!(a.envoy_admin, "http://127.0.0.1:15000");
    }

    #[test]
    fn durations_use_humantime() {
        let cli = Cli::try_parse_from([
            "drainshim",
            "drain",
            "--drain-time",
            "1m30s",
            "--poll-interval",
            "250ms",
        ])
        .unwrap();
        let Command::Drain(a) = cli.command else {
            panic!("not drain")
        };
        assert_eq!(a.timers.drain_time, Duration::from_secs(90));
        assert_eq!(a.timers.poll_interval, Duration::from_millis(250));
        assert!(Cli::try_parse_from(["drainshim", "drain", "--drain-time", "soon"]).is_err());
    }

    /// Found while writing the fuzz/ target `cli`: durations up to u64::MAX
    /// seconds passed validation and would then panic where they are added to
    /// a clock reading (drain deadline, poll, retention) or scaled (max-age
    /// jitter). Every duration flag is now capped.
    #[test]
    fn durations_past_the_cap_are_usage_errors() {
        let huge = format!("{}s", u64::MAX);
        for argv in [
            vec!["drainshim", "drain", "--parent-shutdown-time", &huge],
            vec!["drainshim", "drain", "--poll-interval", &huge],
            vec!["drainshim", "sidecar", "--max-connection-age", &huge],
            vec!["drainshim", "node", "--pod-retention", &huge],
            vec![
                "drainshim",
                "verify",
                "--targets",
                "http://127.0.0.1:1",
                "--expect-version",
                "1.40.0",
                "--window",
                "101y",
            ],
        ] {
            let err = Cli::try_parse_from(&argv).unwrap_err();
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{argv:?}"
            );
            assert!(err.to_string().contains("at most 100years"), "{err}");
        }
        assert!(Cli::try_parse_from(["drainshim", "node", "--pod-retention", "100y"]).is_ok());
    }
}
