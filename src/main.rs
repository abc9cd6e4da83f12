//! The `drainshim` binary: parse the CLI, set up tracing and the runtime, run
//! the subcommand, and map errors to sysexits codes.
#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tokio::sync::mpsc;
use tracing_subscriber::EnvFilter;

use drainshim::cli::{BenchCommand, Cli, Command, Format};
use drainshim::drain::{self, DrainSettings, Trigger};
use drainshim::fleet::{self, verify::VerifyOptions, verify::VerifySource};
use drainshim::metrics::Metrics;
use drainshim::{bench, node, prestop, sidecar};

const EX_USAGE: u8 = 64;
const EX_UNAVAILABLE: u8 = 69;
const EX_SOFTWARE: u8 = 70;
const EX_NOPERM: u8 = 77;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EX_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // The demo talks to a person: only warnings from the library unless asked.
    let log = cli.log.clone().unwrap_or_else(|| match cli.command {
        Command::Demo(_) => "warn".to_string(),
        _ => "info".to_string(),
    });
    let filter = match EnvFilter::try_new(&log) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("drainshim: invalid --log {log:?}: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Plain text in `kubectl logs`; colours only on a terminal.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drainshim: cannot start the runtime: {e}");
            return ExitCode::from(EX_SOFTWARE);
        }
    };
    runtime.block_on(run(cli.command))
}

async fn run(command: Command) -> ExitCode {
    match command {
        Command::Sidecar(args) => {
            let settings = match sidecar::validate_sidecar(&args) {
                Ok(s) => s,
                Err(msg) => return usage(&msg),
            };
            match sidecar::start(args, settings).await {
                Ok(sidecar) => {
                    print_json(&sidecar.run(sigterms()).await);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("drainshim sidecar: {e}");
                    ExitCode::from(EX_UNAVAILABLE)
                }
            }
        }
        Command::Node(args) => {
            let settings = match node::validate(&args) {
                Ok(s) => s,
                Err(msg) => return usage(&msg),
            };
            // Before the "ready" log line: a SIGTERM right after it is handled.
            let signals = sigterms();
            match node::NodeAgent::start(settings, args.listen).await {
                Ok(agent) => {
                    agent.run(signals).await;
                    ExitCode::SUCCESS
                }
                Err(e @ node::NodeError::NoPrivilege(_)) => {
                    eprintln!("drainshim node: {e}");
                    ExitCode::from(EX_NOPERM)
                }
                Err(e) => {
                    eprintln!("drainshim node: {e}");
                    ExitCode::from(EX_UNAVAILABLE)
                }
            }
        }
        Command::Prestop(args) => match prestop::run(&args.shim, args.timeout).await {
            Ok(report) => {
                print_json(&report);
                ExitCode::SUCCESS
            }
            Err(e @ prestop::PrestopError::Url(_)) => usage(&e.to_string()),
            Err(e) => {
                eprintln!("drainshim prestop: {e}");
                ExitCode::from(EX_UNAVAILABLE)
            }
        },
        Command::Drain(args) => {
            let settings = match sidecar::validate(&args.envoy_admin, &args.timers, Duration::ZERO)
            {
                Ok(s) => s,
                Err(msg) => return usage(&msg),
            };
            drain_once(settings).await
        }
        Command::Inventory(args) => match fleet::proxies(&args.source.source()).await {
            Ok(proxies) => {
                match args.format {
                    Format::Json => print_json(&proxies),
                    Format::Table => print!("{}", fleet::inventory_table(&proxies)),
                }
                ExitCode::SUCCESS
            }
            Err(e) => fleet_error("inventory", e),
        },
        Command::Skew(args) => match fleet::proxies(&args.source.source()).await {
            Ok(proxies) => {
                let report = fleet::skew(
                    &proxies,
                    args.control_plane,
                    args.max_skew,
                    args.version_label,
                );
                match args.format {
                    Format::Json => print_json(&report),
                    Format::Table => print!("{}", report.render()),
                }
                if report.ok() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                }
            }
            Err(e) => fleet_error("skew", e),
        },
        Command::Verify(args) => {
            let source = match args.prometheus {
                Some(p) => VerifySource::Prometheus(p),
                None => VerifySource::Targets(args.targets),
            };
            let opts = VerifyOptions {
                namespaces: args.namespace,
                expect_version: args.expect_version,
                window: args.window,
                max_retry_increase: args.max_retry_increase,
                max_reset_increase: args.max_reset_increase,
                rate_floor: args.rate_floor,
                golden: fleet::golden::GoldenThresholds {
                    max_success_drop: args.max_success_drop,
                    max_p99_increase: args.max_p99_increase,
                    max_amplification_increase: args.max_requests_per_call_increase,
                    max_reopen_increase: args.max_reopen_increase,
                    min_rate: args.min_request_rate,
                },
            };
            match fleet::verify::verify(&source, &opts).await {
                Ok(checks) => {
                    match args.format {
                        Format::Json => print_json(&checks),
                        Format::Table => print!("{}", fleet::verify::render(&checks)),
                    }
                    if fleet::verify::passed(&checks) {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    }
                }
                Err(e) => fleet_error("verify", e),
            }
        }
        Command::Install(args) => match install(&args.to) {
            Ok(dest) => {
                eprintln!("drainshim install: copied to {}", dest.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("drainshim install: {e}");
                ExitCode::from(EX_UNAVAILABLE)
            }
        },
        Command::Demo(args) => {
            let envoy = match args.envoy.map_or_else(bench::envoy::default_binary, Ok) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("drainshim demo: {e}");
                    return ExitCode::from(EX_UNAVAILABLE);
                }
            };
            let opts = bench::demo::DemoOptions {
                envoy,
                streams: args.streams as usize,
                plot: args.plot,
                protocol: args.protocol,
            };
            match bench::demo::run(opts).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("drainshim demo: {e}");
                    ExitCode::from(EX_UNAVAILABLE)
                }
            }
        }
        Command::Bench(BenchCommand::Reconnect(args)) => bench_reconnect(args).await,
        Command::Bench(BenchCommand::NodeScale(args)) => {
            let binary = match std::env::current_exe() {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("drainshim bench node-scale: finding this executable: {e}");
                    return ExitCode::from(EX_SOFTWARE);
                }
            };
            let opts = bench::node_scale::NodeScaleOptions {
                pods: args.pods as usize,
                idle_window: args.idle_window,
                binary,
            };
            match bench::node_scale::run(opts).await {
                Ok(report) => {
                    match args.format {
                        Format::Json => print_json(&report),
                        Format::Table => print!("{}", report.render()),
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("drainshim bench node-scale: {e}");
                    ExitCode::from(EX_UNAVAILABLE)
                }
            }
        }
        Command::Bench(BenchCommand::App(args)) => {
            let listener = match tokio::net::TcpListener::bind(args.listen).await {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("drainshim bench app: bind {}: {e}", args.listen);
                    return ExitCode::from(EX_UNAVAILABLE);
                }
            };
            let mut signals = sigterms();
            bench::ws::serve_mixed(listener, bench::ws::WsLedger::default(), async move {
                let _ = signals.recv().await;
            })
            .await;
            ExitCode::SUCCESS
        }
        Command::Bench(BenchCommand::AdminStub(args)) => {
            let listener = match tokio::net::TcpListener::bind(args.listen).await {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("drainshim bench admin-stub: bind {}: {e}", args.listen);
                    return ExitCode::from(EX_UNAVAILABLE);
                }
            };
            let id = bench::admin_stub::StubIdentity {
                version: args.version,
                namespace: args.namespace,
                pod: args.pod,
            };
            let stop = tokio_util::sync::CancellationToken::new();
            let mut signals = sigterms();
            let s = stop.clone();
            tokio::spawn(async move {
                let _ = signals.recv().await;
                s.cancel();
            });
            bench::admin_stub::serve(listener, id, stop).await;
            ExitCode::SUCCESS
        }
        Command::Bench(BenchCommand::Server(args)) => {
            let mut signals = sigterms();
            let shutdown = async move {
                let _ = signals.recv().await;
            };
            match bench::server::run(args.listen, shutdown).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("drainshim bench server: {e}");
                    ExitCode::from(EX_UNAVAILABLE)
                }
            }
        }
    }
}

/// `drainshim bench reconnect`.
async fn bench_reconnect(args: drainshim::cli::ReconnectArgs) -> ExitCode {
    use bench::reconnect::{self, Mode, ReconnectOptions};
    let envoy = match args.envoy.map_or_else(bench::envoy::default_binary, Ok) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("drainshim bench reconnect: {e}");
            return ExitCode::from(EX_UNAVAILABLE);
        }
    };
    let mut opts = ReconnectOptions::new(envoy);
    opts.streams = args.streams as usize;
    opts.protocol = args.protocol;
    if !args.mode.is_empty() {
        opts.modes = args.mode;
    }
    opts.deregistration_delay = args.deregistration_delay;
    opts.drain_time = args.drain_time;
    opts.parent_shutdown_time = args.parent_shutdown_time;
    opts.max_connection_age = args.max_connection_age;
    opts.max_connection_age_grace = args.max_connection_age_grace;
    opts.max_connection_age_spread = args.max_connection_age_spread;
    opts.payload_bytes = args.payload_bytes;
    if opts.modes.contains(&Mode::Drainshim) {
        let t = drainshim::config::Timers {
            deregistration_delay: opts.deregistration_delay,
            min_drain_time: opts.deregistration_delay,
            drain_time: opts.drain_time,
            parent_shutdown_time: opts.parent_shutdown_time,
            poll_interval: Duration::from_millis(250),
        };
        if let Err(e) = t.validate(None) {
            return usage(&e.to_string());
        }
    }
    if let Some(d) = args.soak {
        return match reconnect::soak(&opts, d).await {
            Ok(r) => {
                match args.format {
                    Format::Json => print_json(&r),
                    Format::Table => println!(
                        "soak {:.0}s, {} streams, max age {:.0}s (+/-10%), grace {:.0}s, spread {:.0}s: {} reconnects ({:.1}/min), {} graceful, {} cut, {} lost, reconnect p99 {:.0} ms, storm peak/mean {:.2}",
                        r.soak_seconds, r.streams, r.max_connection_age_seconds, r.grace_seconds, r.spread_seconds, r.reconnects,
                        r.reconnects_per_minute, r.graceful, r.cut, r.lost_messages, r.reconnect_p99_ms, r.storm_peak_to_mean
                    ),
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("drainshim bench reconnect: {e}");
                ExitCode::from(EX_UNAVAILABLE)
            }
        };
    }
    match reconnect::run(&opts).await {
        Ok(results) => {
            match args.format {
                Format::Json => print_json(&results),
                Format::Table => print!("{}", bench::measure::render_table(&results)),
            }
            if let Some(path) = args.plot {
                if let Err(e) = bench::measure::plot(&results, &path) {
                    eprintln!("drainshim bench reconnect: {e}");
                    return ExitCode::from(EX_UNAVAILABLE);
                }
                eprintln!(
                    "drainshim bench reconnect: plot written to {}",
                    path.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("drainshim bench reconnect: {e}");
            ExitCode::from(EX_UNAVAILABLE)
        }
    }
}

/// `drainshim drain`: one drain with progress on stderr and the report on stdout.
async fn drain_once(settings: sidecar::Validated) -> ExitCode {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let (handle, _task) = drain::spawn(
        DrainSettings {
            timers: settings.timers,
            admin: settings.admin,
            guard: None,
        },
        metrics,
    );
    handle.trigger(Trigger::Api).await;
    let mut status = handle.subscribe();
    let mut signals = sigterms();
    let mut progress = drain::Progress::new(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            changed = status.changed() => {
                if changed.is_err() {
                    eprintln!("drainshim drain: the drain driver stopped unexpectedly");
                    return ExitCode::from(EX_SOFTWARE);
                }
                let s = status.borrow_and_update().clone();
                if let Some(line) = progress.line(&s) {
                    eprintln!("drainshim drain: {line}");
                }
                if let Some(report) = s.report {
                    print_json(&report);
                    return ExitCode::SUCCESS;
                }
            }
            Some(()) = signals.recv() => {
                eprintln!("drainshim drain: interrupted: skipping to the deadline");
                handle.hurry();
            }
        }
    }
}

/// Copies the running executable to `<dir>/drainshim` (via a temporary file
/// and a rename, so a reader never sees half a binary).
fn install(dir: &std::path::Path) -> Result<std::path::PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let me = std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
    let dest = dir.join("drainshim");
    let tmp = dir.join(".drainshim.tmp");
    std::fs::copy(&me, &tmp)
        .map_err(|e| format!("copy {} to {}: {e}", me.display(), tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &dest).map_err(|e| format!("rename to {}: {e}", dest.display()))?;
    Ok(dest)
}

/// One message per SIGTERM or SIGINT. The handlers are installed before this
/// returns, so a signal sent right after is never the default (fatal) one.
fn sigterms() -> mpsc::UnboundedReceiver<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let (tx, rx) = mpsc::unbounded_channel();
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return rx;
    };
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if tx.send(()).is_err() {
                return;
            }
        }
    });
    rx
}

fn fleet_error(cmd: &str, e: fleet::FleetError) -> ExitCode {
    eprintln!("drainshim {cmd}: {e}");
    match e {
        fleet::FleetError::Input(_) => ExitCode::from(EX_USAGE),
        fleet::FleetError::Prometheus(fleet::prometheus::PromError::Url(_)) => {
            ExitCode::from(EX_USAGE)
        }
        _ => ExitCode::from(EX_UNAVAILABLE),
    }
}

fn usage(msg: &str) -> ExitCode {
    eprintln!("drainshim: {msg}");
    ExitCode::from(EX_USAGE)
}

fn print_json<T: serde::Serialize>(v: &T) {
    match serde_json::to_string(v) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("drainshim: encoding the report: {e}"),
    }
}
