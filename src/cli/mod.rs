//! The command line: subcommands and flags. Every flag also reads
//! `DRAINSHIM_<FLAG_IN_CAPS>`; durations use humantime (`250ms`, `5s`, `1m30s`).

use std::net::SocketAddr;

use clap::{Args, Parser, Subcommand};
use ipnet::IpNet;

#[cfg(feature = "bench")]
mod bench;
mod fleet;
mod plan;
#[cfg(feature = "bench")]
pub use bench::*;
pub use fleet::{
    Format, InventoryArgs, PromAccessArgs, SkewArgs, SourceArgs, VerifyArgs, WaveThresholdArgs,
    FLEET_EXIT_CODES,
};
pub use plan::PlanArgs;

use crate::config::{self, Invalid, Span, Timers};
use crate::http::Endpoint;
use crate::settings::{
    Budget, DrainOnceSettings, GuardSettings, NodeGuardSettings, NodeSettings, SidecarSettings,
};

/// What `--version` prints after the name: the crate version, the git commit
/// it was built from (`unknown` without git) and the enabled features
/// (`bench`, or `none` for the production build), from build.rs.
pub const VERSION: &str = env!("DRAINSHIM_VERSION");

/// Exit codes, shared by every subcommand (sysexits.h).
pub const EXIT_CODES: &str = "\
Exit codes:
  0   success (for drains: the drain finished, deadline included)
  64  usage error: a bad flag or an inconsistent drain budget
  69  a service it needs is unavailable (the shim, a port to bind)
  70  internal error
  71  the operating system refused what every run needs (signal handlers)";

#[derive(Debug, Parser)]
#[command(
    name = "drainshim",
    version = VERSION,
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

    /// How log lines on stderr are written: `text` for people (`kubectl
    /// logs`), or `json`, one JSON object per line for a cluster's log
    /// pipeline (timestamp, level, target, message and the event's fields;
    /// the drain report is a nested object, not a string).
    #[arg(long, env = "DRAINSHIM_LOG_FORMAT", global = true, value_enum,
          default_value_t = crate::logging::LogFormat::Text)]
    pub log_format: crate::logging::LogFormat,

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
        after_help = EXIT_CODES,
        mut_arg("termination_grace_period", |a| a.help(
            "The pod's terminationGracePeriodSeconds, checked against the budget: \
             --parent-shutdown-time plus --linger (the final scrape after a SIGTERM drain) \
             must stay below it"
        ))
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
        after_help = EXIT_CODES,
        mut_arg("drain_time", |a| a.help(
            "How long streams get to finish on their own: `drain` has no guard to end them; \
             what is still open at --parent-shutdown-time is counted as cut"
        ))
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
        after_help = "Exit codes:\n  0   every proxy is within the skew: moving the control plane is safe\n  1   some proxies are outside the skew (listed)\n  64  usage error (a bad flag, an unreadable CA, token or password file, a bad header)\n  69  a source (admin API, shim, Prometheus) could not be read; a TLS failure\n  77  Prometheus refused the request (401, 403): the credentials or the tenant header"
    )]
    Skew(SkewArgs),

    /// The gate for one upgrade wave: versions, cut streams, config
    /// rejections, retry volume, reset rate, and the guard's golden signals.
    #[command(
        long_about = "The gate for one upgrade wave.\n\n\
            Checks that every pod in the namespaces runs --expect-version, that no stream was cut by a \
            drain, that no drain found streams on the fail-open path at its deadline (bypassed: opened \
            around a guard that was down, so the restart cut them too), that no xDS update was \
            rejected on that version within --window, and that the retry \
            volume and the kernel reset rate did not grow past their thresholds against the window \
            before.\n\n\
            Then, per namespace and service, the stream guard's own view, which does not change when \
            Envoy does: the success rate (--max-success-drop points), the p99 (--max-p99-increase), \
            requests reaching the app per request callers sent to Envoy (--max-requests-per-call-increase: \
            exposes extra retries), and the stream re-open rate (--max-reopen-increase). Each names the \
            services that moved and by how much. The streams the guard ended itself (max connection \
            age, a drain, the app's own shutdown) are not the app's failures: they are left out of the \
            success rate and shown on a line of their own, per namespace and reason, never judged.\n\n\
            Pods are taken by the namespace label their series carry (node mode, or a scrape that adds \
            pod labels), else through drainshim_proxy_info on the scrape instance. With --targets \
            (shims scraped directly) the rate checks are not applicable: they need Prometheus' history.",
        after_help = "Exit codes:\n  0   every applicable check passed: the wave may proceed\n  1   a check failed: stop the rollout\n  64  usage error (a bad flag, an unreadable CA, token or password file, a bad header)\n  69  Prometheus or a shim could not be read; a TLS failure\n  77  Prometheus refused the request (401, 403): the credentials or the tenant header"
    )]
    Verify(VerifyArgs),

    /// The whole migration (n-2 to n) as a plan read from the fleet: every
    /// step and tier, its state, gate and rollback, and the next action.
    #[command(long_about = plan::PLAN_LONG_ABOUT, after_help = plan::PLAN_EXIT_CODES)]
    Plan(PlanArgs),

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
            asked from one of the node's own addresses or the pod's 127.0.0.1/::1) and GET /healthz;\n\
            - runs the same drain driver, report and telemetry as the sidecar.\n\
            Pods whose namespace has no Envoy left are retired at the next scan: listener closed, \
            tasks cancelled.\n\n\
            On --listen (the node's namespace): GET /metrics (every series with namespace and pod \
            labels; scrape with honor_labels: true), /healthz, /readyz, /status, and \
            GET /pods/<namespace>/<pod>, POST /pods/<namespace>/<pod>/drain[?wait=true] \
            (127.0.0.1 and ::1 only).",
        after_help = NODE_AFTER_HELP
    )]
    Node(NodeArgs),

    /// Benchmark helpers.
    #[cfg(feature = "bench")]
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
    #[cfg(feature = "bench")]
    #[command(after_help = EXIT_CODES)]
    Demo(DemoArgs),
}

// === impl Command ===

impl Command {
    /// The subcommand's name, for error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Sidecar(_) => "sidecar",
            Command::Prestop(_) => "prestop",
            Command::Drain(_) => "drain",
            Command::Inventory(_) => "inventory",
            Command::Skew(_) => "skew",
            Command::Verify(_) => "verify",
            Command::Plan(_) => "plan",
            Command::Node(_) => "node",
            Command::Install(_) => "install",
            #[cfg(feature = "bench")]
            Command::Bench(_) => "bench",
            #[cfg(feature = "bench")]
            Command::Demo(_) => "demo",
        }
    }

    /// The runtime the command runs on: the sidecar's worker threads are a
    /// setting (`--worker-threads`); `bench relay` gets one; others one per core. One
    /// thread is tokio's current-thread scheduler, which runs woken tasks in
    /// turn: a stream that queues a frame does not switch straight to the
    /// connection's task (the multi-thread scheduler's LIFO slot does), so
    /// every stream ready at once queues its frames first and the
    /// connection writes them in one batch.
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = match self {
            Command::Sidecar(a) if a.worker_threads == 1 => {
                tokio::runtime::Builder::new_current_thread()
            }
            Command::Sidecar(a) => {
                let mut b = tokio::runtime::Builder::new_multi_thread();
                b.worker_threads(a.worker_threads);
                b
            }
            #[cfg(feature = "bench")]
            Command::Bench(b) if b.single_threaded() => {
                tokio::runtime::Builder::new_current_thread()
            }
            _ => tokio::runtime::Builder::new_multi_thread(),
        };
        builder.enable_all().build()
    }

    /// The log filter without `--log`: the demo talks to a person, so only
    /// warnings from the library.
    pub fn default_log(&self) -> &'static str {
        match self {
            #[cfg(feature = "bench")]
            Command::Demo(_) => "warn",
            _ => "info",
        }
    }
}

/// Prints one JSON line on stdout: reports, settings, tables as data.
/// A moment as RFC 3339 (`2026-11-30T14:05:00Z`, UTC) or Unix seconds.
fn parse_time(s: &str) -> Result<std::time::SystemTime, String> {
    if let Ok(secs) = s.parse::<f64>() {
        if (0.0..1e11).contains(&secs) {
            return Ok(std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(secs));
        }
        return Err(format!("{s:?} is not a Unix time in seconds"));
    }
    humantime::parse_rfc3339_weak(s).map_err(|e| {
        format!("{s:?}: {e} (expected RFC 3339, e.g. 2026-11-30T14:05:00Z, or Unix seconds)")
    })
}

pub fn print_json<T: serde::Serialize>(v: &T) {
    match serde_json::to_string(v) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("drainshim: encoding the report: {e}"),
    }
}

/// Prints `v` as JSON or its table.
pub fn emit<T: serde::Serialize>(format: Format, v: &T, table: impl FnOnce() -> String) {
    match format {
        Format::Json => print_json(v),
        Format::Table => print!("{}", table()),
    }
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

Drain timers per pod (opt in):
  Envoy node metadata under the timer flags' variable names, e.g.
  DRAINSHIM_DRAIN_TIME: \"300s\", DRAINSHIM_PARENT_SHUTDOWN_TIME: \"330s\",
  DRAINSHIM_TERMINATION_GRACE_PERIOD: \"360s\" (also DRAINSHIM_DEREGISTRATION_DELAY,
  DRAINSHIM_MIN_DRAIN_TIME, DRAINSHIM_POLL_INTERVAL): that pod's drain runs with them,
  the flags fill in the keys it leaves out. They are held to the flags' rules; a pod
  whose values break one, or do not parse, drains with the flags' timers and is named
  with every violation: one warn line, its /status, drainshim_node_pod_timers_invalid.

Rolling update (--handover-socket on a hostPath, DaemonSet maxSurge 1):
  the new agent takes every listener (node API, preStop, guards) from the old one:
  nothing is refused; the old one ends its guarded streams over --handover-window
  and exits at SIGTERM. No agent on the socket: bind everything.

Exit codes:
  0   stopped by SIGTERM (after drains in progress finished)
  64  usage error: a bad flag or an inconsistent drain budget
  69  --listen could not be bound, or --proc-root cannot be read
  77  no permission to enter network namespaces (CAP_SYS_ADMIN missing)
  70  internal error
  71  the operating system refused what every run needs (signal handlers)";

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// Directory to copy the binary into (as `drainshim`, mode 0755).
    #[arg(
        long,
        env = "DRAINSHIM_TO",
        value_name = "DIR",
        required_unless_present = "install_to"
    )]
    pub to: Option<std::path::PathBuf>,

    /// The variable's old name, DRAINSHIM_INSTALL_TO, before it followed the
    /// DRAINSHIM_<FLAG> pattern: still read (with a warning) so manifests
    /// written for it keep working. Hidden; --to wins when both are set.
    #[arg(long, env = "DRAINSHIM_INSTALL_TO", value_name = "DIR", hide = true)]
    pub install_to: Option<std::path::PathBuf>,
}

impl InstallArgs {
    /// The directory to install into, and the warning to log when it came
    /// from the old variable name.
    pub fn dir(&self) -> Result<(&std::path::Path, Option<&'static str>), Invalid> {
        const OLD: &str =
            "DRAINSHIM_INSTALL_TO is deprecated and will be removed: set DRAINSHIM_TO (or --to)";
        match (&self.to, &self.install_to) {
            (Some(to), None) => Ok((to, None)),
            (Some(to), Some(_)) => Ok((to, Some(OLD))),
            (None, Some(old)) => Ok((old, Some(OLD))),
            // clap already requires one of them; said again, not assumed.
            (None, None) => Err(Invalid(vec![
                "--to (or DRAINSHIM_TO) is required: the directory to copy the binary into".into(),
            ])),
        }
    }
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// Validate the flags and environment, print the effective settings as
    /// JSON, and exit: 0 when they are valid, 64 with every violation when not.
    /// Nothing is bound and no namespace is entered.
    #[arg(long)]
    pub check: bool,

    /// Address for the agent's /metrics, /status and pod API, on the node.
    #[arg(long, env = "DRAINSHIM_LISTEN", default_value_t = config::DEFAULT_NODE_LISTEN)]
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
    #[arg(long, env = "DRAINSHIM_SCAN_INTERVAL", default_value_t = config::DEFAULT_SCAN_INTERVAL)]
    pub scan_interval: Span,

    /// Envoy's admin port on 127.0.0.1 inside each pod.
    #[arg(long, env = "DRAINSHIM_POD_ADMIN_PORT", default_value_t = config::DEFAULT_POD_ADMIN_PORT)]
    pub pod_admin_port: u16,

    /// Port of the preStop listener planted inside each pod (all addresses).
    #[arg(long, env = "DRAINSHIM_POD_LISTEN_PORT", default_value_t = config::DEFAULT_POD_LISTEN_PORT,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub pod_listen_port: u16,

    /// How long a departed pod's drain counters stay on /metrics.
    #[arg(long, env = "DRAINSHIM_POD_RETENTION", default_value_t = config::DEFAULT_POD_RETENTION)]
    pub pod_retention: Span,

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
    #[arg(
        long = "guard",
        env = "DRAINSHIM_GUARD",
        value_name = "LISTEN=UPSTREAM"
    )]
    pub default_guard: Option<crate::settings::GuardSpec>,

    /// The guards' limits and ages, per pod, as the sidecar's.
    #[command(flatten)]
    pub tuning: GuardTuningArgs,

    /// A unix socket on a host path shared by successive agents. At start the
    /// agent asks the one serving it for every listener (the node API, each
    /// pod's preStop and guard listener), so nothing is closed or refused
    /// during the agent's own rolling update; then it serves it itself.
    #[arg(long, env = "DRAINSHIM_HANDOVER_SOCKET")]
    pub handover_socket: Option<std::path::PathBuf>,

    /// After handing its listeners over, the old agent ends the guarded
    /// streams it still carries spread over this window, then exits at SIGTERM.
    #[arg(long, env = "DRAINSHIM_HANDOVER_WINDOW", default_value_t = config::DEFAULT_HANDOVER_WINDOW)]
    pub handover_window: Span,
}

/// The guard's max connection age (gRPC A9): the sidecar's, each node-mode
/// guard's and the reconnect bench's guard read the same flags.
#[derive(Debug, Clone, Args)]
pub struct MaxAgeArgs {
    /// Close each guard connection after this age (±10% jitter): GOAWAY, a
    /// grace, then open streams end with grpc-status 14. Off by default.
    #[arg(long, env = "DRAINSHIM_MAX_CONNECTION_AGE")]
    pub max_connection_age: Option<Span>,

    /// How long streams may run after a max-age GOAWAY before the guard ends them.
    #[arg(long, env = "DRAINSHIM_MAX_CONNECTION_AGE_GRACE", default_value_t = config::DEFAULT_MAX_CONNECTION_AGE_GRACE)]
    pub max_connection_age_grace: Span,

    /// End a connection's remaining streams spread over this window, inside
    /// the grace (capped at it): behind Envoy one pooled connection carries
    /// many streams, and age x (1 +/- 10%) + grace stays a bound on its life.
    #[arg(long, env = "DRAINSHIM_MAX_CONNECTION_AGE_SPREAD", default_value_t = config::DEFAULT_MAX_CONNECTION_AGE_SPREAD)]
    pub max_connection_age_spread: Span,
}

impl MaxAgeArgs {
    /// Writes these flags into a guard's configuration.
    pub fn apply(&self, c: &mut crate::guard::GuardConfig) {
        c.max_connection_age = self.max_connection_age.map(Span::get);
        c.max_connection_age_grace = self.max_connection_age_grace.get();
        c.max_connection_age_spread = self.max_connection_age_spread.get();
    }
}

/// The stream guard's limits and connection ages: the same flags for the
/// sidecar's guard and for each guard of the node agent (per pod there).
#[derive(Debug, Clone, Args)]
pub struct GuardTuningArgs {
    /// Most connections the guard (node mode: each pod's) holds open at once; more are closed as
    /// soon as they are accepted (Envoy retries them, on the app when it
    /// fails open).
    #[arg(long, env = "DRAINSHIM_GUARD_MAX_CONNECTIONS", default_value_t = crate::guard::DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub guard_max_connections: usize,

    /// Most streams (HTTP/1.1: requests) open through the guard (node mode:
    /// each pod's) at once, over all connections; more are refused retryably (HTTP/2 REFUSED_STREAM,
    /// HTTP/1.1 503 with Retry-After) before they reach the app.
    #[arg(long, env = "DRAINSHIM_GUARD_MAX_STREAMS", default_value_t = crate::guard::DEFAULT_MAX_STREAMS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
    pub guard_max_streams: usize,

    #[command(flatten)]
    pub max_age: MaxAgeArgs,

    /// When the app itself sends GOAWAY (its graceful stop, e.g. on its own
    /// SIGTERM), end that connection's long-lived streams gracefully
    /// (grpc-status 14, WebSocket 1001, SSE end) spread over this window, so
    /// the app's grace never cuts them; its short calls finish. Keep it well
    /// under the app's own grace.
    #[arg(long, env = "DRAINSHIM_APP_SHUTDOWN_SPREAD", default_value_t = config::DEFAULT_APP_SHUTDOWN_SPREAD)]
    pub app_shutdown_spread: Span,

    /// Which streams a drain ends early. Long-lived streams (a response that
    /// carried two or more messages, or answered at least this long ago) are
    /// ended gracefully, spread over the drain window. Everything else (unary
    /// calls, calls the app has not answered) is left to finish until the
    /// drain's deadline minus the time an ending needs; only what is still
    /// open then is ended, retryably.
    #[arg(long, env = "DRAINSHIM_LONG_STREAM_AGE", default_value_t = config::DEFAULT_LONG_STREAM_AGE)]
    pub long_stream_age: Span,

    /// Reset a guarded stream whose client takes no response data for this
    /// long (its flow-control window stays shut), so a peer that stopped
    /// reading does not hold it until max age.
    #[arg(long, env = "DRAINSHIM_WRITE_STALL_TIMEOUT", default_value_t = config::DEFAULT_WRITE_STALL_TIMEOUT)]
    pub write_stall_timeout: Span,
}

impl GuardTuningArgs {
    /// Writes these flags into a guard's configuration.
    fn apply(&self, c: &mut crate::guard::GuardConfig) {
        self.max_age.apply(c);
        c.app_shutdown_spread = self.app_shutdown_spread.get();
        c.long_stream_age = self.long_stream_age.get();
        c.limits.write_stall_timeout = self.write_stall_timeout.get();
        c.limits.max_connections = self.guard_max_connections;
        c.limits.max_streams = self.guard_max_streams;
    }
}

/// The drain timers; see docs/design.md for the timeline.
#[derive(Debug, Clone, Args)]
pub struct TimerArgs {
    /// How long streams get to finish; the stream guard, where there is one,
    /// ends the long-lived rest gracefully before this.
    #[arg(long, env = "DRAINSHIM_DRAIN_TIME", default_value_t = config::DEFAULT_DRAIN_TIME)]
    pub drain_time: Span,

    /// Hard deadline: whatever is still open then is counted as cut.
    #[arg(long, env = "DRAINSHIM_PARENT_SHUTDOWN_TIME", default_value_t = config::DEFAULT_PARENT_SHUTDOWN_TIME)]
    pub parent_shutdown_time: Span,

    /// Never end the drain earlier than this, even with nothing active.
    #[arg(long, env = "DRAINSHIM_MIN_DRAIN_TIME", default_value_t = config::DEFAULT_MIN_DRAIN_TIME)]
    pub min_drain_time: Span,

    /// Time for endpoint removal to reach callers; short requests keep being served.
    #[arg(long, env = "DRAINSHIM_DEREGISTRATION_DELAY", default_value_t = config::DEFAULT_DEREGISTRATION_DELAY)]
    pub deregistration_delay: Span,

    /// How often Envoy's live counters are read during a drain.
    #[arg(long, env = "DRAINSHIM_POLL_INTERVAL", default_value_t = config::DEFAULT_POLL_INTERVAL)]
    pub poll_interval: Span,

    /// The pod's terminationGracePeriodSeconds, checked against the budget:
    /// it must exceed --parent-shutdown-time.
    #[arg(long, env = "DRAINSHIM_TERMINATION_GRACE_PERIOD")]
    pub termination_grace_period: Option<Span>,

    /// Deadline for each Envoy admin call; a slower admin counts as unreachable.
    #[arg(long, env = "DRAINSHIM_ADMIN_TIMEOUT", default_value_t = config::DEFAULT_ADMIN_TIMEOUT)]
    pub admin_timeout: Span,
}

impl TimerArgs {
    /// The drain budget these flags describe (checked by its command's
    /// `validate`).
    pub fn budget(&self) -> Budget {
        Budget {
            timers: Timers {
                deregistration_delay: self.deregistration_delay.get(),
                min_drain_time: self.min_drain_time.get(),
                drain_time: self.drain_time.get(),
                parent_shutdown_time: self.parent_shutdown_time.get(),
                poll_interval: self.poll_interval.get(),
            },
            termination_grace_period: self.termination_grace_period.map(Span::get),
            admin_timeout: self.admin_timeout.get(),
        }
    }
}

#[derive(Debug, Args)]
pub struct SidecarArgs {
    /// Validate the flags and environment, print the effective settings as
    /// JSON, and exit: 0 when they are valid, 64 with every violation when not.
    /// Nothing is bound and Envoy is not contacted.
    #[arg(long)]
    pub check: bool,

    /// Envoy's admin API.
    #[arg(long, env = "DRAINSHIM_ENVOY_ADMIN", default_value = config::DEFAULT_ENVOY_ADMIN)]
    pub envoy_admin: Endpoint,

    /// Runtime worker threads (the guard, the control endpoints and the
    /// drain share them). One, the default, runs everything on one thread
    /// in turn: requests that arrive together leave together, in one write
    /// per connection, the cheapest per request. Raise it for a guard that
    /// needs more than a core.
    #[arg(long, env = "DRAINSHIM_WORKER_THREADS", default_value_t = config::DEFAULT_WORKER_THREADS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub worker_threads: usize,

    /// Address for the control endpoints and /metrics.
    #[arg(long, env = "DRAINSHIM_LISTEN", default_value_t = config::DEFAULT_LISTEN)]
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

    #[command(flatten)]
    pub tuning: GuardTuningArgs,

    /// Record the guard's golden signals per request: drainshim_guard_requests_total
    /// {service,code,protocol}, drainshim_guard_request_duration_seconds{service},
    /// drainshim_guard_streams_opened_total and drainshim_guard_stream_lifetime_seconds.
    /// `false` turns them off (the series stay absent) and `verify` cannot
    /// judge this pod's success rate, p99 and retry volume.
    #[arg(long, env = "DRAINSHIM_GUARD_REQUEST_METRICS", default_value_t = true,
          action = clap::ArgAction::Set, value_name = "BOOL")]
    pub guard_request_metrics: bool,

    /// Add a `method` label (the gRPC method) to the guard's request series.
    /// Off by default: it multiplies the series; methods count against
    /// --guard-metrics-max-services.
    #[arg(long, env = "DRAINSHIM_GUARD_METRICS_METHODS")]
    pub guard_metrics_methods: bool,

    /// Most gRPC services (`package.Service` from the path; with
    /// --guard-metrics-methods, service/method pairs) with series of their
    /// own; later ones, and paths that name no service, are counted as
    /// service="other". Requests that are not gRPC are service="http".
    #[arg(long, env = "DRAINSHIM_GUARD_METRICS_MAX_SERVICES", default_value_t = crate::guard::DEFAULT_MAX_SERVICES,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000))]
    pub guard_metrics_max_services: usize,

    /// With the guard, /readyz also checks the data path this often: a TCP
    /// connect to the guard's listener, then to --guard-upstream.
    #[arg(long, env = "DRAINSHIM_READY_INTERVAL", default_value_t = config::DEFAULT_READY_INTERVAL)]
    pub ready_interval: Span,

    /// /readyz turns 503 after this many consecutive failed data-path checks
    /// (one slow probe never flips it) and 200 again after one passing check.
    #[arg(long, env = "DRAINSHIM_READY_FAILURES", default_value_t = config::DEFAULT_READY_FAILURES,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub ready_failures: u32,

    /// Networks (CIDR) besides loopback allowed to start a drain; repeatable.
    #[arg(long, env = "DRAINSHIM_ALLOW_DRAIN_FROM", value_delimiter = ',')]
    pub allow_drain_from: Vec<IpNet>,

    /// After a SIGTERM drain, keep serving /metrics this long so Prometheus
    /// scrapes the final counts (a second SIGTERM skips it). Counts against
    /// --termination-grace-period.
    #[arg(long, env = "DRAINSHIM_LINGER", default_value_t = config::DEFAULT_LINGER)]
    pub linger: Span,

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
    pub shim: Endpoint,

    /// Give up waiting after this long (keep it above the shim's --parent-shutdown-time).
    #[arg(long, env = "DRAINSHIM_TIMEOUT", default_value_t = config::DEFAULT_PRESTOP_TIMEOUT)]
    pub timeout: Span,
}

#[derive(Debug, Args)]
pub struct DrainArgs {
    /// Envoy's admin API.
    #[arg(long, env = "DRAINSHIM_ENVOY_ADMIN", default_value = config::DEFAULT_ENVOY_ADMIN)]
    pub envoy_admin: Endpoint,

    #[command(flatten)]
    pub timers: TimerArgs,
}

// === args to settings ===
//
// Flags that only make sense together are checked here (their shape); the
// values themselves are checked by the settings' own `validate`, so the
// library and its tests apply the same rules.

impl TryFrom<&SidecarArgs> for SidecarSettings {
    type Error = Invalid;

    fn try_from(a: &SidecarArgs) -> Result<Self, Invalid> {
        let mut shape = Invalid::default();
        let guard = match (a.guard_listen, a.guard_upstream) {
            (Some(listen), Some(upstream)) => {
                let mut g = GuardSettings::new(listen, upstream);
                let c = &mut g.config;
                a.tuning.apply(c);
                c.signals = crate::guard::SignalSettings {
                    enabled: a.guard_request_metrics,
                    methods: a.guard_metrics_methods,
                    max_services: a.guard_metrics_max_services,
                };
                g.ready_interval = a.ready_interval.get();
                g.ready_failures = a.ready_failures;
                Some(g)
            }
            (None, None) => {
                shape.check(a.tuning.max_age.max_connection_age.is_none(), || {
                    "--max-connection-age needs the stream guard: set --guard-listen and --guard-upstream".into()
                });
                None
            }
            (Some(_), None) => {
                shape.0.push("--guard-listen needs --guard-upstream (the application port the guard forwards to)".into());
                None
            }
            (None, Some(_)) => {
                shape.0.push(
                    "--guard-upstream needs --guard-listen (where Envoy's inbound cluster connects)"
                        .into(),
                );
                None
            }
        };
        let settings = SidecarSettings {
            envoy_admin: a.envoy_admin.clone(),
            listen: a.listen,
            worker_threads: a.worker_threads,
            budget: a.timers.budget(),
            guard,
            allow_drain_from: a.allow_drain_from.clone(),
            linger: a.linger.get(),
            pod_namespace: a.pod_namespace.clone(),
            pod_name: a.pod_name.clone(),
        };
        shape.merge(settings.validate());
        shape.into_result().map(|()| settings)
    }
}

impl TryFrom<&NodeArgs> for NodeSettings {
    type Error = Invalid;

    fn try_from(a: &NodeArgs) -> Result<Self, Invalid> {
        let settings = NodeSettings {
            listen: a.listen,
            proc_root: a.proc_root.clone(),
            process_names: a
                .envoy_process_name
                .iter()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect(),
            scan_interval: a.scan_interval.get(),
            pod_admin_port: a.pod_admin_port,
            pod_listen_port: a.pod_listen_port,
            budget: a.timers.budget(),
            retention: a.pod_retention.get(),
            guard: NodeGuardSettings::from(&a.guard),
        };
        settings.validate().map(|()| settings)
    }
}

impl From<&NodeGuardArgs> for NodeGuardSettings {
    fn from(a: &NodeGuardArgs) -> Self {
        let mut g = NodeGuardSettings {
            default: a.default_guard,
            handover_socket: a.handover_socket.clone(),
            handover_window: a.handover_window.get(),
            ..NodeGuardSettings::default()
        };
        a.tuning.apply(&mut g.template);
        g
    }
}

impl TryFrom<&DrainArgs> for DrainOnceSettings {
    type Error = Invalid;

    fn try_from(a: &DrainArgs) -> Result<Self, Invalid> {
        let settings = DrainOnceSettings {
            envoy_admin: a.envoy_admin.clone(),
            budget: a.timers.budget(),
        };
        settings.validate().map(|()| settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::time::Duration;

    /// The help texts list the codes `error::Error::exit_code` gives.
    #[test]
    fn help_lists_every_exit_code() {
        use crate::error::{EX_NOPERM, EX_OSERR, EX_SOFTWARE, EX_UNAVAILABLE, EX_USAGE};
        for code in [EX_USAGE, EX_UNAVAILABLE, EX_SOFTWARE, EX_OSERR] {
            assert!(EXIT_CODES.contains(&format!("  {code}  ")), "{code}");
            assert!(NODE_AFTER_HELP.contains(&format!("  {code}  ")), "{code}");
        }
        assert!(NODE_AFTER_HELP.contains(&format!("  {EX_NOPERM}  ")));
        // A Prometheus that refuses the credentials.
        assert!(FLEET_EXIT_CODES.contains(&format!("  {EX_NOPERM}  ")));
        assert!(FLEET_EXIT_CODES.contains(&format!("  {EX_UNAVAILABLE}  ")));
    }

    #[test]
    fn verify_at_takes_rfc3339_or_unix_seconds_with_prometheus_only() {
        let parse = |at: &str, source: &str| {
            Cli::try_parse_from([
                "drainshim",
                "verify",
                source,
                "http://127.0.0.1:9",
                "--namespace",
                "shop",
                "--expect-version",
                "1.40.0",
                "--at",
                at,
            ])
            .map(|cli| match cli.command {
                Command::Verify(a) => a.options().at,
                _ => panic!("not verify"),
            })
        };
        let at = std::time::UNIX_EPOCH + Duration::from_secs(1_796_000_000);
        assert_eq!(parse("1796000000", "--prometheus").unwrap(), Some(at));
        assert_eq!(
            parse("2026-11-30T14:05:00Z", "--prometheus").unwrap(),
            Some(std::time::UNIX_EPOCH + Duration::from_secs(1_796_047_500))
        );
        for bad in ["yesterday", "1e20", "NaN", "2026-13-01T00:00:00Z"] {
            let err = parse(bad, "--prometheus").unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation, "{bad}");
        }
        // Targets are scraped now; there is no history to evaluate at.
        assert!(parse("1796000000", "--targets").is_err());
    }

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
        let settings = SidecarSettings::try_from(&a).unwrap();
        let defaults = SidecarSettings::new(config::DEFAULT_ENVOY_ADMIN.parse().unwrap());
        assert_eq!(settings, defaults);
        assert_eq!(settings.budget.timers, Timers::default());
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
        assert_eq!(a.timers.drain_time.get(), Duration::from_secs(90));
        assert_eq!(a.timers.poll_interval, Span::millis(250));
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
