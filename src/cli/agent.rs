//! The flags of the commands that run beside Envoy on a node (`sidecar`,
//! `node`, `prestop`, `drain`, `install`), grouped as the settings they
//! become, and their conversion into those validated settings.

use std::net::SocketAddr;

use clap::Args;
use ipnet::IpNet;

use crate::config::{self, Invalid, Span, Timers};
use crate::http::Endpoint;
use crate::settings::{
    Budget, DrainOnceSettings, GuardSettings, NodeGuardSettings, NodeSettings, SidecarSettings,
};

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
  nothing is refused; the old one ends its guarded streams over --handover-window,
  lets short calls finish (up to 30 s more) and exits at SIGTERM. No agent on the socket: bind everything.
  Without the socket both agents bind side by side (SO_REUSEPORT); with
  --tcp-migrate-req (default) the old one's queued connections move to the new one.

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
    /// streams it still carries spread over this window (short calls get up
    /// to 30 s more to finish), then exits at SIGTERM.
    #[arg(long, env = "DRAINSHIM_HANDOVER_WINDOW", default_value_t = config::DEFAULT_HANDOVER_WINDOW)]
    pub handover_window: Span,

    /// Set net.ipv4.tcp_migrate_req=1 in each pod's network namespace (Linux
    /// 5.14 and later). The agent binds its listeners with SO_REUSEPORT, so
    /// two agents started side by side without --handover-socket (an
    /// operator who left it out, a predecessor that crashed) both serve;
    /// when the old one closes its listeners, the kernel moves the
    /// connections queued on them to the new one's instead of resetting
    /// them. Without it those connections fail. Unavailable: a warn line
    /// and drainshim_node_pods_without_tcp_migrate_req.
    #[arg(long, env = "DRAINSHIM_TCP_MIGRATE_REQ", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub tcp_migrate_req: bool,
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
    /// Print the effective settings (the shim's address and the timeout,
    /// defaults included) as JSON and exit 0, without calling the shim.
    #[arg(long)]
    pub check: bool,

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
            tcp_migrate_req: a.tcp_migrate_req,
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
