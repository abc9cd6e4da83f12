//! `drainshim sidecar`: wires the admin client, the drain driver, the control
//! endpoints and the signals together.
//!
//! The first SIGTERM starts (or joins) the drain; the process exits once the
//! report is out. A second SIGTERM skips to the deadline.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::cli::{SidecarArgs, TimerArgs};
use crate::config::Timers;
use crate::control::{self, Control};
use crate::drain::{self, DrainSettings, Report, StreamGuard, Trigger};
use crate::envoy::AdminClient;
use crate::guard::{Guard, GuardConfig};
use crate::metrics::{Metrics, SidecarMetrics};
use crate::readiness::{self, DataPath};
use crate::recovery;
use crate::telemetry::Telemetry;

/// Settings that passed validation.
#[derive(Debug)]
pub struct Validated {
    pub admin: AdminClient,
    pub timers: Timers,
    /// The stream guard, when `--guard-listen` and `--guard-upstream` are set.
    pub guard: Option<(std::net::SocketAddr, GuardConfig)>,
}

/// Everything the sidecar takes, checked at once: the admin URL, the drain
/// budget, and the guard flags.
pub fn validate_sidecar(args: &SidecarArgs) -> Result<Validated, String> {
    let mut errs = Vec::new();
    let guard = match (args.guard_listen, args.guard_upstream) {
        (Some(listen), Some(upstream)) => {
            let mut config = GuardConfig::new(upstream);
            config.max_connection_age = args.max_connection_age;
            config.max_connection_age_grace = args.max_connection_age_grace;
            config.max_connection_age_spread = args.max_connection_age_spread;
            config.long_stream_age = args.long_stream_age;
            config.limits.write_stall_timeout = args.write_stall_timeout;
            if args.write_stall_timeout.is_zero() {
                errs.push("--write-stall-timeout must be greater than zero".into());
            }
            config.limits.max_connections = args.guard_max_connections;
            config.limits.max_streams = args.guard_max_streams;
            config.signals = crate::guard::SignalSettings {
                enabled: args.guard_request_metrics,
                methods: args.guard_metrics_methods,
                max_services: args.guard_metrics_max_services,
            };
            if args.max_connection_age.is_some_and(|a| a.is_zero()) {
                errs.push(
                    "--max-connection-age must be greater than zero (leave it out to turn it off)"
                        .into(),
                );
            }
            if listen == upstream {
                errs.push(format!(
                    "--guard-listen and --guard-upstream are the same address ({listen})"
                ));
            }
            Some((listen, config))
        }
        (None, None) => {
            if args.max_connection_age.is_some() {
                errs.push("--max-connection-age needs the stream guard: set --guard-listen and --guard-upstream".into());
            }
            None
        }
        (Some(_), None) => {
            errs.push("--guard-listen needs --guard-upstream (the application port the guard forwards to)".into());
            None
        }
        (None, Some(_)) => {
            errs.push(
                "--guard-upstream needs --guard-listen (where Envoy's inbound cluster connects)"
                    .into(),
            );
            None
        }
    };
    match validate(&args.envoy_admin, &args.timers, args.linger) {
        Ok(v) if errs.is_empty() => Ok(Validated { guard, ..v }),
        Ok(_) => Err(format!("invalid settings:\n  - {}", errs.join("\n  - "))),
        Err(mut e) => {
            for extra in errs {
                e.push_str(&format!("\n  - {extra}"));
            }
            Err(e)
        }
    }
}

/// Checks the admin URL and the drain budget together, so every bad value is
/// reported at once. `linger` is the sidecar's time after the report.
pub fn validate(envoy_admin: &str, t: &TimerArgs, linger: Duration) -> Result<Validated, String> {
    let mut errs = Vec::new();
    if let Some(grace) = t.termination_grace_period {
        // Checked: humantime takes durations up to u64::MAX seconds, and a sum
        // past Duration::MAX is past any grace period too.
        let end = t.parent_shutdown_time.checked_add(linger);
        if t.parent_shutdown_time < grace && end.is_none_or(|end| end >= grace) {
            errs.push(format!(
                "--parent-shutdown-time ({}) plus --linger ({}) must stay below --termination-grace-period ({})",
                humantime::format_duration(t.parent_shutdown_time),
                humantime::format_duration(linger),
                humantime::format_duration(grace)
            ));
        }
    }
    let admin = AdminClient::new(envoy_admin, t.admin_timeout)
        .map_err(|e| errs.push(format!("--envoy-admin: {e}")))
        .ok();
    let timers = t.timers();
    if let Err(e) = timers.validate(t.termination_grace_period) {
        errs.extend(e.0);
    }
    if t.admin_timeout.is_zero() {
        errs.push("--admin-timeout must be greater than zero".into());
    }
    match admin {
        Some(admin) if errs.is_empty() => Ok(Validated {
            admin,
            timers,
            guard: None,
        }),
        _ => Err(format!("invalid settings:\n  - {}", errs.join("\n  - "))),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    #[error("control endpoint: bind {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// A bound, running sidecar: control endpoints, drain driver, inventory refresh.
pub struct Sidecar {
    local: std::net::SocketAddr,
    /// Where the stream guard listens, when it runs.
    guard_addr: Option<std::net::SocketAddr>,
    /// Time to keep serving after a SIGTERM drain's report.
    linger: Duration,
    drain: drain::DrainHandle,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<()>,
    /// The guard's serve loop: at exit it ends what is left gracefully and
    /// flushes; `run` waits for it (it bounds its own wait).
    guard_task: Option<tokio::task::JoinHandle<()>>,
}

/// Binds `--listen` and starts serving. Nothing drains until a trigger.
pub async fn start(args: SidecarArgs, settings: Validated) -> Result<Sidecar, SidecarError> {
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|source| SidecarError::Bind {
            addr: args.listen,
            source,
        })?;
    let local = listener.local_addr().unwrap_or(args.listen);
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let sidecar_metrics = SidecarMetrics::register(&mut registry);
    let shutdown = CancellationToken::new();
    let mut guard_addr = None;
    let mut guard_task = None;
    let mut data_path = None;
    let guard: Option<Arc<dyn StreamGuard>> = match settings.guard {
        None => None,
        Some((addr, config)) => {
            let gl = TcpListener::bind(addr)
                .await
                .map_err(|source| SidecarError::Bind { addr, source })?;
            guard_addr = Some(gl.local_addr().unwrap_or(addr));
            tracing::info!(guard_listen = ?guard_addr, upstream = %config.upstream,
                max_connection_age = ?config.max_connection_age, "stream guard ready");
            let upstream = config.upstream;
            let g = Guard::new(config, metrics.clone());
            let serving = g.clone();
            let stop = shutdown.clone();
            guard_task = Some(tokio::spawn(async move { serving.serve(gl, stop).await }));
            data_path = Some(
                DataPath::spawn(
                    readiness::Settings {
                        guard: guard_addr.unwrap_or(addr),
                        app: upstream,
                        interval: args.ready_interval,
                        failures: args.ready_failures,
                    },
                    shutdown.clone(),
                )
                .await,
            );
            Some(Arc::new(g))
        }
    };
    let (drain, _driver) = drain::spawn(
        DrainSettings {
            timers: settings.timers,
            admin: settings.admin.clone(),
            guard,
        },
        metrics.clone(),
    );
    let identity = (
        args.pod_namespace
            .or_else(|| std::env::var("POD_NAMESPACE").ok()),
        args.pod_name.or_else(|| std::env::var("POD_NAME").ok()),
    );
    // Inspect Envoy for what an earlier drain (an earlier shim) left behind.
    let envoy_health = recovery::spawn(
        settings.admin.clone(),
        drain.clone(),
        settings.timers.poll_interval,
        sidecar_metrics,
        match &identity {
            (Some(ns), Some(pod)) => format!("{ns}/{pod}"),
            (_, Some(pod)) => pod.clone(),
            _ => String::new(),
        },
    );
    // The sidecar shares the pod's network namespace: its own /proc/net
    // counters are the pod's, with no privileges needed.
    let telemetry = Telemetry::new(
        settings.admin.clone(),
        identity,
        "/proc/self/net".into(),
        metrics,
    );
    let control = Arc::new(Control {
        drain: drain.clone(),
        registry: Arc::new(registry),
        admin: Some(settings.admin.clone()),
        allow_drain_from: args.allow_drain_from.clone(),
        telemetry: Some(Arc::new(telemetry)),
        envoy_health: Some(envoy_health),
        data_path,
    });
    let server = tokio::spawn(control::serve(listener, control, shutdown.clone()));
    tracing::info!(listen = %local, envoy_admin = settings.admin.authority(), "sidecar ready");
    Ok(Sidecar {
        local,
        guard_addr,
        guard_task,
        linger: args.linger,
        drain,
        shutdown,
        server,
    })
}

impl Sidecar {
    /// The bound control address (useful with port 0).
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.local
    }

    /// The stream guard's bound address (useful with port 0).
    pub fn guard_addr(&self) -> Option<std::net::SocketAddr> {
        self.guard_addr
    }

    pub fn drain(&self) -> &drain::DrainHandle {
        &self.drain
    }

    /// Runs until a SIGTERM-triggered (or joined) drain is done; returns its
    /// report. `signals` yields once per SIGTERM; tests inject it.
    pub async fn run(self, mut signals: mpsc::UnboundedReceiver<()>) -> Report {
        let Sidecar {
            drain,
            shutdown,
            server,
            guard_task,
            linger,
            ..
        } = self;
        // Wait for the first SIGTERM, then for the report, watching for a second.
        let mut sigterms = 0u32;
        let report = loop {
            let waiting = async {
                if sigterms == 0 {
                    std::future::pending::<Option<Report>>().await
                } else {
                    drain.report().await
                }
            };
            tokio::select! {
                sig = signals.recv() => match sig {
                    Some(()) => {
                        sigterms += 1;
                        if sigterms == 1 {
                            tracing::info!("SIGTERM: starting the drain (or joining the one running)");
                            drain.trigger(Trigger::Sigterm).await;
                        } else {
                            tracing::warn!("second SIGTERM: skipping to the deadline");
                            drain.hurry();
                        }
                    }
                    // No signal source any more: behave as if the kubelet sent SIGTERM.
                    None if sigterms == 0 => {
                        sigterms = 1;
                        drain.trigger(Trigger::Sigterm).await;
                    }
                    None => {}
                },
                report = waiting => match report {
                    Some(r) => break r,
                    None => std::future::pending().await,
                },
            }
        };
        if !linger.is_zero() {
            tracing::info!(
                ?linger,
                "drain done; serving the final metrics a little longer"
            );
            tokio::select! {
                _ = tokio::time::sleep(linger) => {}
                _ = signals.recv() => tracing::info!("SIGTERM: exiting now"),
            }
        }
        shutdown.cancel();
        if let Some(guard) = guard_task {
            // The guard ends what is still open gracefully and waits for its
            // connections to flush, bounded by its own limits.
            tracing::info!("stopping the stream guard: ending what is left gracefully");
            if guard.await.is_err() {
                tracing::warn!("the stream guard's task failed while stopping");
            }
        }
        let _ = server.await;
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn sidecar_args(argv: &[&str]) -> SidecarArgs {
        let argv = ["drainshim", "sidecar"].iter().chain(argv);
        match Cli::try_parse_from(argv).expect("parses").command {
            Command::Sidecar(a) => a,
            _ => unreachable!("sidecar"),
        }
    }

    /// Found while writing the fuzz/ target `cli` (which then reproduced it):
    /// --parent-shutdown-time plus --linger overflowed Duration and panicked
    /// instead of giving a usage error. The CLI now caps durations at
    /// MAX_DURATION; validation must not panic even without that cap.
    #[test]
    fn huge_linger_is_a_usage_error_not_a_panic() {
        let max = format!("{}s", u64::MAX);
        let argv = ["drainshim", "sidecar", "--linger", &max];
        assert!(Cli::try_parse_from(argv).is_err(), "the CLI refuses it");
        let mut a = sidecar_args(&["--parent-shutdown-time", "100s"]);
        a.timers.termination_grace_period = Some(Duration::MAX);
        a.linger = Duration::MAX;
        let err = validate_sidecar(&a).unwrap_err();
        assert!(err.contains("plus --linger"), "{err}");
    }

    #[test]
    fn linger_must_fit_before_the_grace_period() {
        let ok = sidecar_args(&["--termination-grace-period", "120s", "--linger", "10s"]);
        assert!(validate_sidecar(&ok).is_ok());
        let late = sidecar_args(&["--termination-grace-period", "120s", "--linger", "30s"]);
        assert!(validate_sidecar(&late)
            .unwrap_err()
            .contains("plus --linger"));
    }
}
