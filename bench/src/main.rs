//! The `drainshim-bench` binary: parse the command line, set up tracing and
//! the runtime, run one benchmark or the demo, exit with its code. `drainshim
//! bench <command>` and `drainshim demo` run it with their arguments, so it
//! speaks as `drainshim bench` and `drainshim demo` in its messages.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

use drainshim::error::{EX_SOFTWARE, EX_USAGE};
use drainshim_bench::cli::Cli;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            let code = if e.use_stderr() { EX_USAGE } else { 0 };
            return ExitCode::from(code);
        }
    };
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
    let json_logs = cli.log_format == drainshim::cli::logging::LogFormat::Json;
    match runtime.block_on(cli.command.run()) {
        Ok(true) => ExitCode::SUCCESS,
        // A benchmark that judges found what it must not.
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            if json_logs {
                tracing::error!(command = name, error = %e, "drainshim {name} failed");
            } else {
                eprintln!("drainshim {name}: {e}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}
