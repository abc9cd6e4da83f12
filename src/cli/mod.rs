//! The command line: subcommands and flags. Every flag also reads
//! `DRAINSHIM_<FLAG_IN_CAPS>`; durations use humantime (`250ms`, `5s`, `1m30s`).

use clap::{Parser, Subcommand};

mod agent;
mod check;
mod fleet;
pub mod harness;
mod inject;
pub mod install;
pub mod logging;
pub mod plan;
pub use agent::{
    DrainArgs, GuardTuningArgs, InstallArgs, MaxAgeArgs, NodeArgs, NodeGuardArgs, PrestopArgs,
    SidecarArgs, TimerArgs, NODE_AFTER_HELP,
};
pub use check::CheckArgs;
pub use fleet::{
    Format, InventoryArgs, PromAccessArgs, SkewArgs, SourceArgs, VerifyArgs, WaveThresholdArgs,
    FLEET_EXIT_CODES,
};
pub use inject::{InjectArgs, IstioRoutingArgs, WebhookArgs};
pub use plan::PlanArgs;

/// What `--version` prints after the name: the crate version, the git commit
/// it was built from (`unknown` without git) and the enabled features
/// (`none`, or `mimalloc`), from build.rs.
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
          default_value_t = crate::cli::logging::LogFormat::Text)]
    pub log_format: crate::cli::logging::LogFormat,

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
            is 503 until a check passes.\n\n\
            Config pushes: when Envoy drains a listener (or some filter chains) after an LDS \
            update, it closes what is left on it after its --drain-time-s. The shim watches \
            Envoy's admin API every --poll-interval and the guard ends the streams of the drained \
            connections gracefully (reason config_push) before then, spread over the drain time \
            less a margin of at least 7 s; new streams and newer connections are left alone. It \
            tells them apart by request headers the inbound route adds \
            (x-drainshim-downstream-connection: %CONNECTION_ID%, x-drainshim-filter-chain: \
            %FILTER_CHAIN_NAME%, and on Envoy 1.40+ x-drainshim-listener: %LISTENER_NAME%), or \
            without them by time.",
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

    /// Add drainshim to the pods of Kubernetes manifests, offline (or
    /// `--uninject`): what the sidecar Components add, for GitOps pipelines.
    #[command(long_about = inject::INJECT_LONG_ABOUT, after_help = inject::INJECT_EXIT_CODES)]
    Inject(InjectArgs),

    /// The mutating admission webhook: adds drainshim to pods as they are
    /// created, in namespaces labelled drainshim.io/inject=enabled.
    #[command(long_about = inject::WEBHOOK_LONG_ABOUT, after_help = EXIT_CODES)]
    Webhook(WebhookArgs),

    /// Preflight: read exported Kubernetes objects and name what would keep
    /// drainshim from serving a namespace, and what to do.
    #[command(long_about = check::CHECK_LONG_ABOUT, after_help = check::CHECK_EXIT_CODES)]
    Check(CheckArgs),

    /// Under Istio: the mesh objects (one EnvoyFilter per app port) that send
    /// inbound traffic through the guard of every pod injected in Istio mode.
    #[command(long_about = inject::ISTIO_ROUTING_LONG_ABOUT, after_help = EXIT_CODES)]
    IstioRouting(IstioRoutingArgs),

    /// Benchmark helpers (needs drainshim-bench, a separate binary:
    /// `cargo install --path bench` from a checkout).
    #[command(
        long_about = harness::BENCH_LONG_ABOUT,
        disable_help_flag = true,
        after_help = EXIT_CODES
    )]
    Bench(harness::HarnessArgs),

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
    /// a drain, then the restart (needs drainshim-bench; `make demo` builds it).
    #[command(
        long_about = harness::DEMO_LONG_ABOUT,
        disable_help_flag = true,
        after_help = EXIT_CODES
    )]
    Demo(harness::HarnessArgs),
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
            Command::Inject(_) => "inject",
            Command::Webhook(_) => "webhook",
            Command::Check(_) => "check",
            Command::IstioRouting(_) => "istio-routing",
            Command::Bench(_) => "bench",
            Command::Demo(_) => "demo",
        }
    }

    /// The runtime the command runs on: the sidecar's worker threads are a
    /// setting (`--worker-threads`); others one per core. One
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
            _ => tokio::runtime::Builder::new_multi_thread(),
        };
        builder.enable_all().build()
    }

    /// The log filter without `--log` (drainshim-bench picks its own for
    /// `bench` and `demo`).
    pub fn default_log(&self) -> &'static str {
        "info"
    }
}

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

/// Prints one JSON line on stdout: reports, settings, tables as data.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{self, Span, Timers};
    use crate::settings::SidecarSettings;
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
