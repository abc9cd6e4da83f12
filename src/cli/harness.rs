//! `drainshim bench <command>` and `drainshim demo`: the benchmarks and the
//! demo are a binary of their own, drainshim-bench (bench/ in the
//! repository), so the product builds without their dependencies. These
//! two subcommands run it in this process's place (exec) with the same
//! arguments, `bench` left out; its flags, help and exit codes are its own.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use clap::Args;

use crate::error::Error;

/// The harness binary.
pub const BENCH_BIN: &str = "drainshim-bench";

/// How to get it, for the help and the error when it is missing (a macro,
/// so `concat!` can put it into the help's constant).
macro_rules! how_to_get_it {
    () => {
        "From a checkout: `cargo install --path bench` (puts it on PATH), \
         `cargo build --workspace` (builds it beside target/<profile>/drainshim), or `make demo`."
    };
}
const HOW_TO_GET_IT: &str = how_to_get_it!();

pub const BENCH_LONG_ABOUT: &str = concat!(
    "Benchmark helpers: the reconnect benchmark, the soaks, node \
    scale, the fleet tools at scale, and the backends, relay and admin stand-in they run.\n\n\
    They are in drainshim-bench, a separate binary, found beside this one, then on PATH; \
    `drainshim bench <command> ...` runs `drainshim-bench <command> ...`, and \
    `drainshim bench --help` lists the commands. ",
    how_to_get_it!()
);

pub const DEMO_LONG_ABOUT: &str = "Run the main job end to end on this machine: real Envoy, gRPC \
    streams, a drain, then the restart.\n\n\
    The demo is in drainshim-bench, a separate binary, found beside this one, then on PATH; \
    `drainshim demo ...` runs `drainshim-bench demo ...` (`drainshim demo --help` for its \
    flags). From a checkout: `make demo`, or `cargo install --path bench` (puts it on PATH).";

/// The arguments of `bench` and `demo`: drainshim-bench's, passed on as given.
#[derive(Debug, Args)]
pub struct HarnessArgs {
    /// drainshim-bench's command and flags (`--help` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub args: Vec<OsString>,
}

/// drainshim-bench: beside this executable first (a cargo target directory,
/// or both installed together), then on PATH.
pub fn find() -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .map(|exe| exe.with_file_name(BENCH_BIN));
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    beside
        .into_iter()
        .chain(on_path.into_iter().map(|dir| dir.join(BENCH_BIN)))
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// drainshim-bench's arguments from this process's (without the program):
/// the same, but for `bench` itself when `drop_bench` (`drainshim bench
/// soak --node` is `drainshim-bench soak --node`; `drainshim demo` is
/// `drainshim-bench demo`). The global `--log` and `--log-format`, which
/// drainshim-bench reads too, may come before the command.
pub fn forwarded(args: impl IntoIterator<Item = OsString>, drop_bench: bool) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut args = args.into_iter();
    let mut command_seen = false;
    while let Some(arg) = args.next() {
        if command_seen {
            out.push(arg);
            continue;
        }
        if arg == OsStr::new("--log") || arg == OsStr::new("--log-format") {
            out.push(arg);
            out.extend(args.next());
            continue;
        }
        let global = arg
            .to_str()
            .is_some_and(|a| a.starts_with("--log=") || a.starts_with("--log-format="));
        if !global {
            command_seen = true;
            if drop_bench && arg == OsStr::new("bench") {
                continue;
            }
        }
        out.push(arg);
    }
    out
}

/// Runs drainshim-bench with `args` in this process's place. Returns only
/// when that failed: drainshim-bench is missing (69, saying how to get it),
/// or the exec itself failed.
pub fn exec(args: Vec<OsString>) -> Error {
    let Some(path) = find() else {
        let here = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|d| d.display().to_string()))
            .unwrap_or_else(|| "this binary".into());
        return Error::Unavailable(format!(
            "{BENCH_BIN} not found in {here} or on PATH: the benchmarks and the demo are a \
             binary of their own. {HOW_TO_GET_IT}"
        ));
    };
    let err = std::process::Command::new(&path).args(args).exec();
    Error::Unavailable(format!("running {}: {err}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fwd(args: &[&str], drop_bench: bool) -> Vec<String> {
        forwarded(args.iter().map(OsString::from), drop_bench)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn bench_is_left_out_and_everything_else_passed_on() {
        assert_eq!(
            fwd(&["bench", "soak", "--node", "--log", "warn"], true),
            ["soak", "--node", "--log", "warn"]
        );
        assert_eq!(
            fwd(&["--log", "bench", "bench", "server", "bench"], true),
            ["--log", "bench", "server", "bench"]
        );
        assert_eq!(
            fwd(&["--log-format=json", "bench", "--help"], true),
            ["--log-format=json", "--help"]
        );
        assert_eq!(
            fwd(&["demo", "--streams", "20"], false),
            ["demo", "--streams", "20"]
        );
    }
}
