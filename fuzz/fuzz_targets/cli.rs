//! The command line as main.rs handles it, on arbitrary argv: clap parsing,
//! humantime durations, the `--log` filter, and each subcommand's
//! validation. None of it may panic; bad input is a usage error.
//!
//! argv is built from tokens that are either one of the real subcommand and
//! flag names (read from clap, so new flags are fuzzed without edits here)
//! or arbitrary bytes, so the fuzzer reaches deep flag combinations quickly.
#![no_main]

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::sync::OnceLock;
use std::time::Duration;

use arbitrary::Arbitrary;
use clap::{CommandFactory, Parser};
use drainshim::cli::{Cli, Command};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum Token {
    /// A subcommand or `--flag` name, by index.
    Known(u16),
    /// `--flag=value` for a known flag.
    KnownWithValue(u16, String),
    /// `--flag=<n><unit>`: a humantime duration of any size.
    KnownWithDuration(u16, u64, u8),
    /// Anything, including non-UTF-8.
    Raw(Vec<u8>),
}

#[derive(Debug, Arbitrary)]
enum Value {
    /// `<n><unit>`: a humantime duration of any size.
    Duration(u64, u8),
    /// One of the `EDGES`: where duration arithmetic breaks.
    Edge(u8),
    Text(String),
}

#[derive(Debug, Arbitrary)]
enum Input {
    /// One duration string, as every duration flag reads it.
    Duration(String),
    /// argv after the program name.
    Argv(Vec<Token>),
    /// One subcommand (by index) with some of its flags (by index) and
    /// their values: reaches combinations of several flags at once.
    Flags(u16, Vec<(u8, Value)>),
    /// A `plan --tiers` file, resolved against some namespaces.
    Tiers(String, Vec<String>),
}

/// Every leaf subcommand's path and its `--long` flags that take a value.
fn leaves() -> &'static [(Vec<String>, Vec<String>)] {
    static LEAVES: OnceLock<Vec<(Vec<String>, Vec<String>)>> = OnceLock::new();
    LEAVES.get_or_init(|| {
        fn walk(
            cmd: &clap::Command,
            path: &mut Vec<String>,
            out: &mut Vec<(Vec<String>, Vec<String>)>,
        ) {
            if !cmd.has_subcommands() {
                let flags = cmd
                    .get_arguments()
                    .filter(|a| a.get_action().takes_values())
                    .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
                    .collect();
                out.push((path.clone(), flags));
            }
            for sub in cmd.get_subcommands() {
                path.push(sub.get_name().to_string());
                walk(sub, path, out);
                path.pop();
            }
        }
        let mut out = Vec::new();
        walk(&Cli::command(), &mut Vec::new(), &mut out);
        out
    })
}

const UNITS: &[&str] = &["ns", "us", "ms", "s", "m", "h", "d", "w", "M", "y"];
/// Zero, the smallest step, the flags' cap (config::MAX_DURATION) and the
/// largest durations humantime accepts.
const EDGES: &[&str] = &[
    "0s",
    "1ns",
    "100y",
    "100y 1ns",
    "9223372036854775807s",
    "18446744073709551615s",
    "18446744073709551615s 999999999ns",
];

fn value(v: &Value) -> String {
    match v {
        Value::Duration(n, unit) => format!("{n}{}", UNITS[usize::from(*unit) % UNITS.len()]),
        Value::Edge(i) => EDGES[usize::from(*i) % EDGES.len()].to_string(),
        Value::Text(t) => t.clone(),
    }
}

fn flags(which: u16, values: &[(u8, Value)]) {
    let leaves = leaves();
    let (path, flags) = &leaves[usize::from(which) % leaves.len()];
    let mut argv: Vec<OsString> = path.iter().map(OsString::from).collect();
    if !flags.is_empty() {
        for (i, v) in values {
            let flag = &flags[usize::from(*i) % flags.len()];
            argv.push(OsString::from(format!("{flag}={}", value(v))));
        }
    }
    run(argv);
}

/// Every subcommand name and every `--long` flag, at any depth.
fn known() -> &'static [String] {
    static KNOWN: OnceLock<Vec<String>> = OnceLock::new();
    KNOWN.get_or_init(|| {
        fn walk(cmd: &clap::Command, out: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                if let Some(l) = a.get_long() {
                    out.push(format!("--{l}"));
                }
            }
            for sub in cmd.get_subcommands() {
                out.push(sub.get_name().to_string());
                walk(sub, out);
            }
        }
        let mut out = Vec::new();
        walk(&Cli::command(), &mut out);
        out.sort();
        out.dedup();
        out
    })
}

fn token(t: &Token) -> OsString {
    let known = known();
    match t {
        Token::Known(i) => OsString::from(&known[usize::from(*i) % known.len()]),
        Token::KnownWithValue(i, v) => {
            OsString::from(format!("{}={v}", known[usize::from(*i) % known.len()]))
        }
        Token::KnownWithDuration(i, n, unit) => {
            let v = value(&Value::Duration(*n, *unit));
            OsString::from(format!("{}={v}", known[usize::from(*i) % known.len()]))
        }
        Token::Raw(b) => OsString::from_vec(b.clone()),
    }
}

fn durations(s: &str) {
    let flag = s.parse::<drainshim::config::Span>();
    if let Ok(d) = humantime::parse_duration(s) {
        // What we print in errors and reports reads back as the same duration.
        let shown = humantime::format_duration(d).to_string();
        assert_eq!(humantime::parse_duration(&shown).ok(), Some(d), "{shown}");
        // The flags take exactly humantime's durations up to the cap.
        assert_eq!(flag.is_ok(), d <= drainshim::config::MAX_DURATION);
    } else {
        assert!(flag.is_err());
    }
}

fn run(argv: Vec<OsString>) {
    let args = std::iter::once(OsString::from("drainshim")).chain(argv);
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // main.rs prints it and picks the exit code from it.
            let _ = e.to_string();
            let _ = e.use_stderr();
            return;
        }
    };
    if let Some(log) = &cli.log {
        let _ = tracing_subscriber::EnvFilter::try_new(log);
    }
    match cli.command {
        Command::Sidecar(a) => {
            if let Ok(s) = drainshim::settings::SidecarSettings::try_from(&a) {
                let _ = s.effective().to_string();
            }
        }
        Command::Drain(a) => {
            let _ = drainshim::settings::DrainOnceSettings::try_from(&a);
        }
        Command::Node(a) => {
            if let Ok(s) = drainshim::settings::NodeSettings::try_from(&a) {
                let _ = s.effective().to_string();
            }
        }
        Command::Inventory(a) => source(&a.source, &a.access),
        Command::Skew(a) => {
            source(&a.source, &a.access);
            let _ = drainshim::inventory::skew_violation("1.40.0", a.control_plane, a.max_skew);
        }
        Command::Verify(a) => {
            // Validates the reach flags too (TLS, credentials, headers).
            let _ = a.source();
        }
        Command::Plan(a) => {
            if let Ok((_, opts)) = a.options() {
                let _ = opts.step();
                let _ = drainshim::fleet::plan::Versions::new(
                    opts.control_plane,
                    opts.target,
                    opts.max_skew,
                );
            }
        }
        _ => {}
    }
}

fn source(s: &drainshim::cli::SourceArgs, access: &drainshim::cli::PromAccessArgs) {
    match s.source(access) {
        Ok(drainshim::fleet::Source::Admins(urls)) => {
            for u in urls {
                let _ = drainshim::envoy::AdminClient::new(&u, Duration::from_secs(1));
            }
        }
        Ok(drainshim::fleet::Source::Prometheus(reach)) => {
            let url = reach.url().to_string();
            let _ = drainshim::fleet::prometheus::PromClient::new(&url, Duration::from_secs(1));
        }
        Ok(drainshim::fleet::Source::Targets(_)) | Err(_) => {}
    }
}

fuzz_target!(|input: Input| {
    match input {
        Input::Duration(s) => durations(&s),
        Input::Argv(tokens) => run(tokens.iter().map(token).collect()),
        Input::Flags(which, values) => flags(which, &values),
        Input::Tiers(text, seen) => {
            if let Ok(specs) = drainshim::fleet::plan::parse_tiers(&text) {
                let seen = seen.into_iter().collect();
                let _ = drainshim::fleet::plan::resolve(&specs, &seen, Duration::from_secs(60));
            }
        }
    }
});
