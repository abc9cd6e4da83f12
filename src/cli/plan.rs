//! `drainshim plan`'s flags.

use std::collections::BTreeMap;

use clap::Args;

use super::{Format, PromAccessArgs, WaveThresholdArgs};
use crate::config::{Invalid, Span};
use crate::fleet::plan::{Mesh, PlanOptions};
use crate::inventory::Release;

pub const PLAN_LONG_ABOUT: &str = "The whole migration from mesh version n-2 to n as a plan, \
read from the fleet.\n\n\
The sequence is fixed: (1) publish the version inventory; (2) give every tier's guards a max \
connection age and let it soak (--lifetime-soak); (3) restart the data plane to n-1, tier by tier, \
the next tier waiting --soak after the previous one finished and passed `verify`; (4) move the \
control plane to n, the point of no return: after it proxies outside the skew are unsupported and \
rollback by restart is gone, and its new listeners drain on every proxy: the step's gate stops the plan \
if a config push cut a stream over --history (drainshim_streams_ungraceful_total{reason=\"config_push\"}); (5) restart the data plane to n, tier by tier again. Step 2 ends with each tier's drain timers: \
every pod must run a drain time and parent shutdown at or above what its service's own calls and \
streams need (`--explain timers` prints the table).\n\n\
Every row's state (not started, in progress k of n, stalled, done, done and verified) comes from \
Prometheus: the proxies' versions now and over --history, and the guards' max connection age. \
Nothing is written anywhere, so the plan can stop at any point and be run again a month later. \
Each finished wave is verified over its own window with the same gates as `verify`.\n\n\
Tiers come from a TOML file, in rollout order:\n\n  \
[[tier]]\n  name = \"platform-test\"\n  namespaces = [\"ptest\"]\n\n  \
[[tier]]\n  name = \"read-paths\"\n  pattern = \"read-.*\"   # whole-name regex over the namespaces Prometheus has seen\n\n\
It prints every row, then the next action with the commands to run and when it may start. \
With -o json the same, on one line, for a pipeline gate (`--next-only` for the next action alone).\n\n\
It reads Prometheus only: every state and gate is about history (since when, for how long, \
unchanged since), which scraping the shims directly (`--targets` of the other fleet tools) \
cannot give.";

pub const PLAN_EXIT_CODES: &str = "Exit codes:\n  0   the next step may go now (or every step is done)\n  1   stop: a tier is stalled, a wave failed verify, proxies are outside the skew of the control plane, a config push cut streams after the control plane moved, or pods run drain timers below their service's recommendation\n  64  usage error: a bad flag, a bad tiers file, an unknown tier namespace, a target behind the control plane, a skew that makes the plan impossible\n  69  Prometheus could not be read; a TLS failure\n  75  wait: nothing may start before a soak ends (the time is printed); run it again then\n  77  Prometheus refused the request (401, 403): the credentials or the tenant header";

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// A Prometheus server scraping the shims (the plan needs its history):
    /// http:// or https://, with a path prefix if it has one. See the
    /// --prometheus-* flags for TLS, credentials and a tenant.
    #[arg(long, env = "DRAINSHIM_PROMETHEUS")]
    pub prometheus: String,

    #[command(flatten)]
    pub access: PromAccessArgs,

    /// The control plane's version now (X.Y).
    #[arg(long, env = "DRAINSHIM_CONTROL_PLANE")]
    pub control_plane: Release,

    /// The version the migration ends on, n (X.Y): not behind the control plane.
    #[arg(long, env = "DRAINSHIM_TARGET")]
    pub target: Release,

    /// How many minor versions a proxy may lag behind the control plane.
    #[arg(long, env = "DRAINSHIM_MAX_SKEW", default_value_t = 1)]
    pub max_skew: u32,

    /// The tiers file (TOML, `[[tier]]` with `name` and `namespaces` or
    /// `pattern`), in rollout order.
    #[arg(long, env = "DRAINSHIM_TIERS", value_name = "FILE")]
    pub tiers: std::path::PathBuf,

    /// Judge Envoy's own version, or the mesh's (ISTIO_VERSION).
    #[arg(long, env = "DRAINSHIM_VERSION_LABEL", value_enum, default_value_t = crate::fleet::VersionLabel::Version)]
    pub version_label: crate::fleet::VersionLabel,

    /// A tier with mixed versions and no change for this long is stalled (exit 1).
    #[arg(long, env = "DRAINSHIM_STALL_AFTER", default_value = "2h")]
    pub stall_after: Span,

    /// After a tier finished, the next tier waits this long: at most one tier a day.
    #[arg(long, env = "DRAINSHIM_SOAK", default_value = "1d")]
    pub soak: Span,

    /// How long a tier's guards must have had a max connection age before
    /// its first restart: watch the reconnect rates for a week.
    #[arg(long, env = "DRAINSHIM_LIFETIME_SOAK", default_value = "7d")]
    pub lifetime_soak: Span,

    /// How far back to ask Prometheus. What it no longer keeps is reported as
    /// "before the history": finished waves there are not verified again.
    #[arg(long, env = "DRAINSHIM_HISTORY", default_value = "90d")]
    pub history: Span,

    /// Judge as of this moment instead of now: RFC 3339 or Unix seconds.
    #[arg(long, env = "DRAINSHIM_AT", value_name = "TIME", value_parser = super::parse_time)]
    pub at: Option<std::time::SystemTime>,

    /// How the next action's commands are written: Istio revision labels,
    /// or a plain Envoy sidecar's restart.
    #[arg(long, env = "DRAINSHIM_MESH", value_enum, default_value_t = Mesh::Istio)]
    pub mesh: Mesh,

    /// An Istio revision's name for a version, e.g. 1.40=1-40-2; repeatable.
    /// Without it, X.Y is revision X-Y.
    #[arg(
        long = "revision",
        env = "DRAINSHIM_REVISION",
        value_delimiter = ',',
        value_name = "X.Y=NAME"
    )]
    pub revisions: Vec<String>,

    /// The max connection age step 2's commands suggest.
    #[arg(long, env = "DRAINSHIM_SUGGEST_MAX_AGE", default_value = "30m")]
    pub suggest_max_age: Span,

    #[command(flatten)]
    pub thresholds: WaveThresholdArgs,

    /// Print only the next action (and the verdict).
    #[arg(long)]
    pub next_only: bool,

    /// Also estimate the elapsed time left, from the soak rules and the pace
    /// of the waves finished so far.
    #[arg(long)]
    pub estimate: bool,

    /// Output: `table` for people, `json` (on one line) for scripts.
    #[arg(short = 'o', long, env = "DRAINSHIM_FORMAT", value_enum, default_value_t = Format::Table)]
    pub format: Format,

    /// Print one step's figures instead of the plan: `timers`, the drain
    /// timers table (per service: its calls' p99 and longest, its streams,
    /// the max age, the timers its pods run, the recommended ones). Exit 1
    /// when a service's pods run less than its recommendation.
    #[arg(long, value_enum, value_name = "STEP")]
    pub explain: Option<Explain>,

    /// The window the drain-timers step reads the fleet over, ending now
    /// (or --at). Default: --lifetime-soak, the soak step 2 just watched.
    #[arg(long, env = "DRAINSHIM_TIMERS_WINDOW")]
    pub timers_window: Option<Span>,

    /// The recommended parent shutdown time is the recommended drain time
    /// plus this margin: at least 6s, as the guard ends what is still open
    /// an ending's 5s bound plus 1s before the parent shutdown.
    #[arg(
        long,
        env = "DRAINSHIM_TIMER_MARGIN",
        default_value = "10s",
        allow_hyphen_values = true
    )]
    pub timer_margin: String,

    /// The most of the drain window a service's long streams are spread
    /// over (a service whose streams live less needs only their life).
    #[arg(long, env = "DRAINSHIM_STREAM_SPREAD", default_value = "30s")]
    pub stream_spread: Span,
}

/// What `--explain` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Explain {
    /// The drain-timers step's per-service table.
    Timers,
}

impl PlanArgs {
    /// The plan's options, every bad value reported at once (64).
    pub fn options(&self) -> Result<(crate::fleet::reach::Reach, PlanOptions), Invalid> {
        let mut invalid = Invalid::default();
        let reach = self
            .access
            .reach(&self.prometheus)
            .map_err(|e| invalid.0.extend(e.0))
            .ok();
        let tiers = std::fs::read_to_string(&self.tiers)
            .map_err(|e| format!("--tiers {}: {e}", self.tiers.display()))
            .and_then(|t| {
                crate::fleet::plan::parse_tiers(&t)
                    .map_err(|e| format!("--tiers {}: {e}", self.tiers.display()))
            })
            .map_err(|e| invalid.0.push(e))
            .unwrap_or_default();
        let mut revisions = BTreeMap::new();
        for r in self.revisions.iter().filter(|r| !r.trim().is_empty()) {
            match r.split_once('=') {
                Some((v, name)) if !name.trim().is_empty() => match v.parse::<Release>() {
                    Ok(v) => {
                        revisions.insert((v.major, v.minor), name.trim().to_string());
                    }
                    Err(e) => invalid.0.push(format!("--revision {r:?}: {e}")),
                },
                _ => invalid.0.push(format!(
                    "--revision {r:?}: expected X.Y=NAME, e.g. 1.40=1-40-2"
                )),
            }
        }
        const DECADE: std::time::Duration = std::time::Duration::from_secs(3650 * 86_400);
        for (flag, span, zero_ok) in [
            ("--stall-after", self.stall_after, false),
            ("--history", self.history, false),
            ("--soak", self.soak, true),
            ("--lifetime-soak", self.lifetime_soak, true),
            ("--suggest-max-age", self.suggest_max_age, false),
        ] {
            if span.get().is_zero() && !zero_ok {
                invalid.0.push(format!("{flag} must be more than 0"));
            }
            if span.get() > DECADE {
                invalid
                    .0
                    .push(format!("{flag} {span} is more than ten years"));
            }
        }
        let margin = match self.timer_margin.trim().parse::<Span>() {
            // The margin is what puts the parent shutdown above the drain
            // time; the guard's sweep ends what is left this long before
            // the parent shutdown, so a smaller one leaves those endings
            // less than their own bound.
            Ok(m) if m.get() < crate::fleet::timers::MIN_MARGIN => {
                invalid.0.push(format!(
                    "--timer-margin {m} is under {}: the guard ends what is still open that long \
                     before the parent shutdown (an ending's {} bound and {} of slack), so a \
                     smaller margin lets the parent shutdown cut those endings",
                    Span::from(crate::fleet::timers::MIN_MARGIN),
                    Span::from(crate::guard::DEFAULT_END_TIMEOUT),
                    Span::from(crate::guard::SWEEP_MARGIN),
                ));
                Default::default()
            }
            Ok(m) if m.get() > DECADE => {
                invalid
                    .0
                    .push(format!("--timer-margin {m} is more than ten years"));
                Default::default()
            }
            Ok(m) => m.get(),
            Err(e) => {
                let why = if self.timer_margin.trim_start().starts_with('-') {
                    "a margin cannot be negative".to_string()
                } else {
                    e.to_string()
                };
                invalid
                    .0
                    .push(format!("--timer-margin {:?}: {why}", self.timer_margin));
                Default::default()
            }
        };
        if self.stream_spread.get() < std::time::Duration::from_secs(1) {
            invalid.0.push(format!(
                "--stream-spread {} is under 1s: the guard spreads a service's stream endings over it",
                self.stream_spread
            ));
        }
        if self.stream_spread.get() > DECADE {
            invalid
                .0
                .push("--stream-spread is more than ten years".into());
        }
        if let Some(w) = self.timers_window {
            if w.get().is_zero() {
                invalid.0.push("--timers-window must be more than 0".into());
            }
        }
        let reach = match reach {
            Some(r) if invalid.0.is_empty() => r,
            _ => return Err(invalid),
        };
        Ok((
            reach,
            PlanOptions {
                control_plane: self.control_plane,
                target: self.target,
                max_skew: self.max_skew,
                tiers,
                version_label: self.version_label,
                stall_after: self.stall_after.get(),
                soak: self.soak.get(),
                lifetime_soak: self.lifetime_soak.get(),
                history: self.history.get(),
                at: self.at,
                commands: crate::fleet::plan::Commands {
                    mesh: self.mesh,
                    revisions,
                    suggest_max_age: self.suggest_max_age.get(),
                    prometheus_url: self.prometheus.clone(),
                },
                thresholds: self.thresholds.get(),
                timers: crate::fleet::timers::TimerRules {
                    window: self.timers_window.map(Span::get),
                    margin,
                    stream_spread: self.stream_spread.get(),
                    ..Default::default()
                },
            },
        ))
    }
}
