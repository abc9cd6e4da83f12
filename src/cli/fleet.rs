//! The fleet commands' flags (`inventory`, `skew`, `verify`, and what
//! `plan` shares with them): where proxies are read from, how Prometheus is
//! reached, and a wave's thresholds.

use clap::Args;

use super::parse_time;
use crate::config::{self, Invalid, Span};
use crate::fleet::verify::{VerifyOptions, VerifySource};

/// Exit codes of the read-only fleet commands.
pub const FLEET_EXIT_CODES: &str = "\
Exit codes:
  0   success
  64  usage error: a bad flag, an unreadable CA, token or password file, a bad header
  69  a source (admin API, shim, Prometheus) could not be read (inventory: after
      listing the proxies, UNREACHABLE among them); a TLS failure
  77  Prometheus refused the request (401, 403): the credentials or the tenant header";

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

    /// A Prometheus server scraping the shims (fleet scale): http:// or
    /// https://, with a path prefix if it has one (Mimir's /prometheus);
    /// without a port, the scheme's. See the --prometheus-* flags for TLS,
    /// credentials and a tenant.
    #[arg(long, env = "DRAINSHIM_PROMETHEUS")]
    pub prometheus: Option<String>,
}

impl SourceArgs {
    /// Where to read, with the Prometheus reached as `access` says.
    pub fn source(&self, access: &PromAccessArgs) -> Result<crate::fleet::Source, Invalid> {
        use crate::fleet::Source;
        Ok(match &self.prometheus {
            Some(p) => Source::Prometheus(Box::new(access.reach(p)?)),
            None => {
                access.unused()?;
                if self.targets.is_empty() {
                    Source::Admins(self.envoy_admin.clone())
                } else {
                    Source::Targets(self.targets.clone())
                }
            }
        })
    }
}

/// How to reach a Prometheus behind TLS, credentials or a tenant (Thanos,
/// Mimir, Cortex, a managed service). Secrets come from files, read again
/// for every request; no value is ever logged or echoed in an error.
#[derive(Debug, Clone, Args)]
pub struct PromAccessArgs {
    /// PEM file of the CA certificate(s) that signed Prometheus' certificate,
    /// trusted instead of the system roots (SSL_CERT_FILE, /etc/ssl/certs).
    /// https:// URLs only. The drainshim image has no system roots: give
    /// this, or mount a bundle and set SSL_CERT_FILE.
    #[arg(long, env = "DRAINSHIM_PROMETHEUS_CA", value_name = "FILE")]
    pub prometheus_ca: Option<std::path::PathBuf>,

    /// File holding a bearer token, sent as `Authorization: Bearer <token>`.
    /// Read again for every request: a rotated token (a projected service
    /// account token) is used at once.
    #[arg(
        long,
        env = "DRAINSHIM_PROMETHEUS_BEARER_TOKEN_FILE",
        value_name = "FILE",
        conflicts_with = "prometheus_basic_auth_file"
    )]
    pub prometheus_bearer_token_file: Option<std::path::PathBuf>,

    /// File holding one line `user:password`, sent as basic auth (what
    /// Prometheus' own --web.config.file checks). Read again for every
    /// request.
    #[arg(
        long,
        env = "DRAINSHIM_PROMETHEUS_BASIC_AUTH_FILE",
        value_name = "FILE"
    )]
    pub prometheus_basic_auth_file: Option<std::path::PathBuf>,

    /// A header sent with every request, `Name: value`, e.g.
    /// `X-Scope-OrgID: tenant-a` (the tenant of Mimir, Cortex, Thanos);
    /// repeatable. The environment variable holds one per line. Values are
    /// never logged or shown.
    #[arg(
        long,
        env = "DRAINSHIM_PROMETHEUS_HEADER",
        value_name = "NAME: VALUE",
        value_delimiter = '\n',
        hide_env_values = true
    )]
    pub prometheus_header: Vec<String>,

    /// Bound of each query to Prometheus. A store answering weeks of
    /// history for thousands of pods takes seconds; a query past this fails
    /// the command (69).
    #[arg(long, env = "DRAINSHIM_PROMETHEUS_TIMEOUT", default_value_t = crate::fleet::reach::DEFAULT_QUERY_TIMEOUT)]
    pub prometheus_timeout: Span,
}

impl PromAccessArgs {
    /// Without --prometheus these flags have nothing to apply to: an error
    /// naming them rather than silence. (clap's `requires` cannot say it:
    /// --prometheus shares a group with the other sources.)
    fn unused(&self) -> Result<(), Invalid> {
        let given = [
            (self.prometheus_ca.is_some(), "--prometheus-ca"),
            (
                self.prometheus_bearer_token_file.is_some(),
                "--prometheus-bearer-token-file",
            ),
            (
                self.prometheus_basic_auth_file.is_some(),
                "--prometheus-basic-auth-file",
            ),
            (!self.prometheus_header.is_empty(), "--prometheus-header"),
        ];
        let mut invalid = Invalid::default();
        for (_, flag) in given.iter().filter(|(set, _)| *set) {
            invalid.0.push(format!(
                "{flag} applies to --prometheus only, which is not given"
            ));
        }
        invalid.into_result()
    }

    /// The Prometheus at `url` reached as these flags say: the URL, the
    /// headers and the CA file checked, every bad value reported at once.
    pub fn reach(&self, url: &str) -> Result<crate::fleet::reach::Reach, Invalid> {
        use crate::fleet::reach::{Access, Credentials, Header, Reach};
        let mut invalid = Invalid::default();
        let url = url
            .parse()
            .map_err(|e: String| invalid.0.push(format!("--prometheus: {e}")))
            .ok();
        let headers: Vec<Header> = self
            .prometheus_header
            .iter()
            .filter(|h| !h.trim().is_empty())
            .filter_map(|h| Header::parse(h).map_err(|e| invalid.0.push(e)).ok())
            .collect();
        let credentials = match (
            &self.prometheus_bearer_token_file,
            &self.prometheus_basic_auth_file,
        ) {
            (Some(token), _) => Credentials::BearerTokenFile(token.clone()),
            (None, Some(basic)) => Credentials::BasicAuthFile(basic.clone()),
            (None, None) => Credentials::None,
        };
        let access = Access {
            ca_file: self.prometheus_ca.clone(),
            credentials,
            headers,
        };
        let Some(url) = url else {
            return Err(invalid);
        };
        match Reach::new(url, &access) {
            Ok(reach) => invalid
                .into_result()
                .map(|()| reach.with_timeout(self.prometheus_timeout.get())),
            Err(e) => {
                invalid.0.push(e.to_string());
                Err(invalid)
            }
        }
    }
}

/// How a command prints its result (`--format`, `-o` as kubectl's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns for a terminal.
    Table,
    /// JSON on one line on stdout, for scripts and `jq`.
    Json,
}

#[derive(Debug, Args)]
pub struct InventoryArgs {
    #[command(flatten)]
    pub source: SourceArgs,

    #[command(flatten)]
    pub access: PromAccessArgs,

    /// Output: `table` for people, `json` (on one line) for scripts.
    #[arg(short = 'o', long, env = "DRAINSHIM_FORMAT", value_enum, default_value_t = Format::Table)]
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

    #[command(flatten)]
    pub access: PromAccessArgs,

    /// Output: `table` for people, `json` (on one line) for scripts.
    #[arg(short = 'o', long, env = "DRAINSHIM_FORMAT", value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// A Prometheus server scraping the shims: http:// or https://, with a
    /// path prefix if it has one; without a port, the scheme's. See the
    /// --prometheus-* flags for TLS, credentials and a tenant.
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

    #[command(flatten)]
    pub access: PromAccessArgs,

    /// The wave's namespaces; repeatable (required with --prometheus).
    #[arg(long, env = "DRAINSHIM_NAMESPACE", value_delimiter = ',')]
    pub namespace: Vec<String>,

    /// The Envoy version every pod must run now, e.g. 1.40.0.
    #[arg(long, env = "DRAINSHIM_EXPECT_VERSION")]
    pub expect_version: String,

    /// How far back to look.
    #[arg(long, env = "DRAINSHIM_WINDOW", default_value_t = config::DEFAULT_VERIFY_WINDOW)]
    pub window: Span,

    /// Judge the wave as of this moment instead of now: the window ends here
    /// and the one before ends a window earlier. RFC 3339 (2026-11-30T14:05:00Z)
    /// or Unix seconds; to re-check a wave after the fact, or to pin both
    /// windows to the moment it ended. With --prometheus only.
    #[arg(long, env = "DRAINSHIM_AT", value_name = "TIME", value_parser = parse_time, conflicts_with = "targets")]
    pub at: Option<std::time::SystemTime>,

    #[command(flatten)]
    pub thresholds: WaveThresholdArgs,

    /// Output: `table` for people, `json` (on one line) for scripts.
    #[arg(short = 'o', long, env = "DRAINSHIM_FORMAT", value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

impl VerifyArgs {
    /// Where the wave's series come from.
    pub fn source(&self) -> Result<VerifySource, Invalid> {
        Ok(match &self.prometheus {
            Some(p) => VerifySource::Prometheus(Box::new(self.access.reach(p)?)),
            None => {
                self.access.unused()?;
                VerifySource::Targets(self.targets.clone())
            }
        })
    }

    /// The gates and their thresholds.
    pub fn options(&self) -> VerifyOptions {
        VerifyOptions {
            namespaces: self.namespace.clone(),
            expect_version: self.expect_version.clone(),
            window: self.window.get(),
            at: self.at,
            thresholds: self.thresholds.get(),
        }
    }
}

/// A wave's gates: how much each rate may move against the window before
/// (`verify`, and `plan` for every wave it judges).
#[derive(Debug, Clone, Args)]
pub struct WaveThresholdArgs {
    /// Allowed relative growth of the retry rate against the window before (0.2 = +20%).
    #[arg(long, env = "DRAINSHIM_MAX_RETRY_INCREASE", default_value_t = 0.2)]
    pub max_retry_increase: f64,

    /// Allowed relative growth of the kernel TCP reset rate against the window before.
    #[arg(long, env = "DRAINSHIM_MAX_RESET_INCREASE", default_value_t = 0.2)]
    pub max_reset_increase: f64,

    /// Absolute slack per second added to both limits, so near-zero rates do not fail on noise.
    #[arg(long, env = "DRAINSHIM_RATE_FLOOR", default_value_t = 0.05)]
    pub rate_floor: f64,

    /// Guard success rate per namespace and service: how many percentage
    /// points it may drop against the window before. Failures are gRPC
    /// UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE,
    /// DATA_LOSS and HTTP 5xx, as the app answered; the streams the guard
    /// ended itself (its UNAVAILABLE at max age or a drain) are not counted.
    #[arg(
        long,
        env = "DRAINSHIM_MAX_SUCCESS_DROP",
        default_value_t = 1.0,
        value_name = "POINTS"
    )]
    pub max_success_drop: f64,

    /// Guard p99 latency per namespace and service (unary calls to the end,
    /// streams to the first message): allowed relative growth (0.25 = +25%).
    #[arg(long, env = "DRAINSHIM_MAX_P99_INCREASE", default_value_t = 0.25)]
    pub max_p99_increase: f64,

    /// Requests reaching the app (the guard's count) per request callers
    /// sent (Envoy's inbound downstream_rq_total) per namespace and service:
    /// allowed relative growth (0.1 = +10%). Extra retries, e.g. a retry
    /// default that changed in the new Envoy, raise it; more load does not.
    #[arg(
        long,
        env = "DRAINSHIM_MAX_REQUESTS_PER_CALL_INCREASE",
        default_value_t = 0.1
    )]
    pub max_requests_per_call_increase: f64,

    /// Streams opened through the guard per second, per namespace and
    /// service (clients re-opening streams): allowed relative growth, plus
    /// --min-request-rate of slack.
    #[arg(long, env = "DRAINSHIM_MAX_REOPEN_INCREASE", default_value_t = 0.5)]
    pub max_reopen_increase: f64,

    /// Services with fewer guard requests per second than this in either
    /// window are not judged on success rate, p99 or requests per call.
    #[arg(
        long,
        env = "DRAINSHIM_MIN_REQUEST_RATE",
        default_value_t = 0.1,
        value_name = "PER_SECOND"
    )]
    pub min_request_rate: f64,
}

impl WaveThresholdArgs {
    pub fn get(&self) -> crate::fleet::verify::Thresholds {
        crate::fleet::verify::Thresholds {
            max_retry_increase: self.max_retry_increase,
            max_reset_increase: self.max_reset_increase,
            rate_floor: self.rate_floor,
            golden: crate::fleet::golden::GoldenThresholds {
                max_success_drop: self.max_success_drop,
                max_p99_increase: self.max_p99_increase,
                max_amplification_increase: self.max_requests_per_call_increase,
                max_reopen_increase: self.max_reopen_increase,
                min_rate: self.min_request_rate,
            },
        }
    }
}
