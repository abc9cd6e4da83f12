//! `drainshim drain`: one drain of one Envoy, no daemon and no guard, with
//! progress lines on stderr.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::sync::mpsc;

use crate::drain::{spawn, DrainSettings, Progress, Report, Trigger};
use crate::envoy::{AdminClient, TcpDial};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::settings::DrainOnceSettings;

/// Runs the drain to its end and returns the report. Each message on
/// `signals` (SIGTERM, Ctrl-C) skips to the deadline.
pub async fn drain(
    settings: DrainOnceSettings,
    mut signals: mpsc::UnboundedReceiver<()>,
) -> Result<Report, Error> {
    let metrics = Metrics::register(&mut Registry::default());
    let admin = AdminClient::at(
        settings.envoy_admin,
        settings.budget.admin_timeout,
        Arc::new(TcpDial),
    );
    let (handle, _task) = spawn(
        DrainSettings {
            timers: settings.budget.timers,
            admin,
            guard: None,
        },
        metrics,
    );
    handle.trigger(Trigger::Api).await;
    let mut status = handle.subscribe();
    let mut progress = Progress::new(Duration::from_secs(1));
    loop {
        tokio::select! {
            changed = status.changed() => {
                if changed.is_err() {
                    return Err(Error::Internal("the drain driver stopped unexpectedly".into()));
                }
                let s = status.borrow_and_update().clone();
                if let Some(line) = progress.line(&s) {
                    eprintln!("drainshim drain: {line}");
                }
                if let Some(report) = s.report {
                    return Ok(report);
                }
            }
            Some(()) = signals.recv() => {
                eprintln!("drainshim drain: interrupted: skipping to the deadline");
                handle.hurry();
            }
        }
    }
}
