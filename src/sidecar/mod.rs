//! `drainshim sidecar`: wires the admin client, the drain driver, the control
//! endpoints and the signals together.
//!
//! The first SIGTERM starts (or joins) the drain; the process exits once the
//! report is out. A second SIGTERM skips to the deadline.

pub mod oneshot;
pub mod prestop;
pub mod sigterm;

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::control::readiness::{self, DataPath};
use crate::control::recovery;
use crate::control::telemetry::Telemetry;
use crate::control::{self, Control};
use crate::drain::{self, DrainSettings, Report, StreamGuard, Trigger};
use crate::envoy::AdminClient;
use crate::guard::Guard;
use crate::metrics::{Metrics, SidecarMetrics};
use crate::settings::SidecarSettings;

#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    #[error("control endpoint: bind {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("stream guard: bind {addr}: {source}")]
    GuardBind {
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
pub async fn start(settings: SidecarSettings) -> Result<Sidecar, SidecarError> {
    let listener =
        TcpListener::bind(settings.listen)
            .await
            .map_err(|source| SidecarError::Bind {
                addr: settings.listen,
                source,
            })?;
    let local = listener.local_addr().unwrap_or(settings.listen);
    let admin = AdminClient::at(
        settings.envoy_admin.clone(),
        settings.budget.admin_timeout,
        Arc::new(crate::envoy::TcpDial),
    );
    let timers = settings.budget.timers;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    metrics.set_drain_timers(&timers, settings.budget.termination_grace_period);
    let sidecar_metrics = SidecarMetrics::register(&mut registry);
    let shutdown = CancellationToken::new();
    let mut guard_addr = None;
    let mut guard_task = None;
    let mut data_path = None;
    let guard: Option<Arc<dyn StreamGuard>> = match settings.guard {
        None => None,
        Some(gs) => {
            let (addr, config) = (gs.listen, gs.config);
            let gl = crate::guard::bind_listener(addr)
                .map_err(|source| SidecarError::GuardBind { addr, source })?;
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
                    readiness::ReadinessProbe {
                        guard: guard_addr.unwrap_or(addr),
                        app: upstream,
                        interval: gs.ready_interval,
                        failures: gs.ready_failures,
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
            timers,
            admin: admin.clone(),
            guard: guard.clone(),
        },
        metrics.clone(),
    );
    let identity = (
        settings
            .pod_namespace
            .or_else(|| std::env::var("POD_NAMESPACE").ok()),
        settings.pod_name.or_else(|| std::env::var("POD_NAME").ok()),
    );
    // Inspect Envoy for what an earlier drain (an earlier shim) left behind.
    let envoy_health = recovery::spawn(
        admin.clone(),
        drain.clone(),
        timers.poll_interval,
        sidecar_metrics,
        metrics.clone(),
        match &identity {
            (Some(ns), Some(pod)) => format!("{ns}/{pod}"),
            (_, Some(pod)) => pod.clone(),
            _ => String::new(),
        },
        guard,
    );
    // The sidecar shares the pod's network namespace: its own /proc/net
    // counters are the pod's, with no privileges needed.
    let telemetry = Telemetry::new(admin.clone(), identity, "/proc/self/net".into(), metrics);
    let control = Arc::new(Control {
        drain: drain.clone(),
        registry: Arc::new(registry),
        admin: Some(admin.clone()),
        allow_drain_from: settings.allow_drain_from,
        telemetry: Some(Arc::new(telemetry)),
        envoy_health: Some(envoy_health),
        data_path,
    });
    let server = tokio::spawn(control::serve(listener, control, shutdown.clone()));
    tracing::info!(listen = %local, envoy_admin = admin.authority(),
        guard = guard_addr.map(tracing::field::display), "sidecar ready");
    Ok(Sidecar {
        local,
        guard_addr,
        guard_task,
        linger: settings.linger,
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

impl From<crate::sidecar::SidecarError> for crate::error::Error {
    fn from(e: crate::sidecar::SidecarError) -> Self {
        use crate::error::Error;
        Error::Unavailable(e.to_string())
    }
}
