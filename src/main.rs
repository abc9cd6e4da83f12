//! The `drainshim` binary: parse the command line, set up tracing and the
//! runtime, run one command, print its result, exit with its code. Flags
//! become settings in `cli`; failures map to exit codes in `error`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

use drainshim::cli::logging::LogFormat;
use drainshim::cli::{emit, print_json, Cli, Command};
use drainshim::cli::{harness, install};
use drainshim::error::{Error, EX_SOFTWARE, EX_USAGE};
use drainshim::settings::{DrainOnceSettings, NodeSettings, SidecarSettings};
use drainshim::sidecar::sigterm::sigterms;
use drainshim::sidecar::{oneshot, prestop};
use drainshim::{fleet, node, sidecar};

/// With the `mimalloc` feature, mimalloc serves every allocation instead of
/// the system's malloc; it exists to measure the two against each other
/// (docs/design.md "The shipped build"), and the shipped build leaves it off.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The variable of the retired `--guard-http2` flag: a manifest may still
/// set it, and is told it does nothing.
const RETIRED_GUARD_HTTP2: &str = "DRAINSHIM_GUARD_HTTP2";

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            let code = if e.use_stderr() { EX_USAGE } else { 0 };
            return ExitCode::from(code);
        }
    };
    // The benchmarks and the demo are drainshim-bench's: run it in our place.
    if let Command::Bench(_) | Command::Demo(_) = cli.command {
        let drop_bench = matches!(cli.command, Command::Bench(_));
        let e = harness::exec(harness::forwarded(std::env::args_os().skip(1), drop_bench));
        eprintln!("drainshim {}: {e}", cli.command.name());
        return ExitCode::from(e.exit_code());
    }
    if let Err(e) = drainshim::cli::logging::init_from(
        cli.log.as_deref(),
        cli.command.default_log(),
        cli.log_format,
    ) {
        eprintln!("drainshim: {e}");
        return ExitCode::from(EX_USAGE);
    }
    let runtime = match cli.command.runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drainshim: cannot start the runtime: {e}");
            return ExitCode::from(EX_SOFTWARE);
        }
    };
    let name = cli.command.name();
    if std::env::var_os(RETIRED_GUARD_HTTP2).is_some() {
        tracing::warn!(
            "{RETIRED_GUARD_HTTP2} is set but no longer read: the guard has one HTTP/2 path, the frame relay; remove it"
        );
    }
    let json_logs = cli.log_format == LogFormat::Json;
    let result = runtime.block_on(run(cli.command));
    // What the command cost at its peak, for `bench fleet` (debug only).
    tracing::debug!(target: "drainshim::exit", peak_rss_kib = peak_rss_kib(), "exit");
    match result {
        Ok(code) => code,
        Err(e) => {
            // A log pipeline reading JSON lines gets the failure as one too.
            if json_logs {
                tracing::error!(command = name, error = %e, "drainshim {name} failed");
            } else {
                eprintln!("drainshim {name}: {e}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}

/// This process's peak resident set (VmHWM), in KiB; 0 where /proc has none.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Runs one command; `Ok` carries the exit code of a command whose verdict
/// can be "no" (`skew`, `verify`: 1).
async fn run(command: Command) -> Result<ExitCode, Error> {
    match command {
        Command::Sidecar(a) => {
            let settings = SidecarSettings::try_from(&a)?;
            if a.check {
                print_json(&settings.effective());
                return Ok(ExitCode::SUCCESS);
            }
            let signals = sigterms()?;
            print_json(&sidecar::start(settings).await?.run(signals).await);
        }
        Command::Node(a) => {
            let settings = NodeSettings::try_from(&a)?;
            if a.check {
                print_json(&settings.effective());
                return Ok(ExitCode::SUCCESS);
            }
            // Before the "ready" log line: a SIGTERM right after it is handled.
            let signals = sigterms()?;
            node::NodeAgent::start(settings).await?.run(signals).await;
        }
        Command::Prestop(a) if a.check => print_json(&serde_json::json!({
            "shim": a.shim.to_string(),
            "timeout": humantime::format_duration(a.timeout.get()).to_string(),
        })),
        Command::Prestop(a) => print_json(&prestop::run(&a.shim, a.timeout.get()).await?),
        Command::Drain(a) => {
            let settings = DrainOnceSettings::try_from(&a)?;
            print_json(&oneshot::drain(settings, sigterms()?).await?);
        }
        Command::Inventory(a) => {
            let proxies = fleet::proxies(&a.source.source(&a.access)?).await?;
            emit(a.format, &proxies, || fleet::inventory_table(&proxies));
            // Listed, then a failure: a proxy it could not read may be the one that matters.
            fleet::unreachable(&proxies)?;
        }
        Command::Skew(a) => {
            let proxies = fleet::proxies(&a.source.source(&a.access)?).await?;
            let report = fleet::skew(&proxies, a.control_plane, a.max_skew, a.version_label);
            emit(a.format, &report, || report.render());
            return Ok(verdict(report.ok()));
        }
        Command::Verify(a) => {
            let checks = fleet::verify::verify(&a.source()?, &a.options()).await?;
            emit(a.format, &checks, || fleet::verify::render(&checks));
            return Ok(verdict(fleet::verify::passed(&checks)));
        }
        Command::Plan(a) => {
            let (reach, opts) = a.options()?;
            if a.explain == Some(drainshim::cli::plan::Explain::Timers) {
                let report = fleet::plan::explain_timers(&reach, &opts).await?;
                emit(a.format, &report, || fleet::timers::render(&report));
                let short = report.services.iter().any(|s| {
                    matches!(
                        s.verdict,
                        fleet::timers::TimerFit::Short | fleet::timers::TimerFit::Unknown
                    )
                });
                return Ok(ExitCode::from(u8::from(short)));
            }
            let plan = fleet::plan::plan(&reach, &opts, a.estimate).await?;
            if a.next_only {
                let next = serde_json::json!({ "next": plan.next, "verdict": plan.verdict });
                emit(a.format, &next, || fleet::plan::render(&plan, true));
            } else {
                emit(a.format, &plan, || fleet::plan::render(&plan, false));
            }
            return Ok(ExitCode::from(plan.verdict.exit_code()));
        }
        Command::Install(a) => {
            let (dir, deprecated) = a.dir()?;
            if let Some(warning) = deprecated {
                tracing::warn!("{warning}");
            }
            let dest = install::install(dir)?;
            eprintln!("drainshim install: copied to {}", dest.display());
        }
        Command::Inject(a) => a.run()?,
        Command::Webhook(a) => a.run().await?,
        Command::IstioRouting(a) => a.run()?,
        Command::Check(a) => {
            let report = a.run()?;
            emit(a.format, &report, || report.render());
            return Ok(verdict(report.healthy()));
        }
        // Run by drainshim-bench, exec'd in main before the runtime starts.
        Command::Bench(_) | Command::Demo(_) => {
            return Err(Error::Internal(
                "bench and demo run in drainshim-bench".into(),
            ))
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Exit 0 when the check passed, 1 when it did not.
fn verdict(passed: bool) -> ExitCode {
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
