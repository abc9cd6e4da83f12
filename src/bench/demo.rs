//! `drainshim demo`: the main job end to end on one machine, with real parts:
//! a real Envoy, the tonic bench backend, long-lived gRPC streams, a drain
//! through drainshim, and then the kubelet's SIGTERM to Envoy.

use std::path::PathBuf;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::client::{self, Ending};
use super::envoy::{EnvoyOptions, EnvoyProcess};
use super::server::{self, BenchService};
use crate::config::Timers;
use crate::drain::{self, DrainSettings, Trigger};
use crate::metrics::Metrics;

/// Demo settings.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    pub envoy: PathBuf,
    pub streams: usize,
}

/// Short timers so the demo finishes in seconds; production defaults are 60 s / 90 s.
fn demo_timers() -> Timers {
    Timers {
        deregistration_delay: Duration::from_secs(1),
        min_drain_time: Duration::from_secs(1),
        drain_time: Duration::from_secs(3),
        parent_shutdown_time: Duration::from_secs(5),
        poll_interval: Duration::from_millis(250),
    }
}

fn step(n: u32, text: &str) {
    println!("\n[{n}/4] {text}");
}

pub async fn run(opts: DemoOptions) -> Result<(), String> {
    let timers = demo_timers();
    step(1, "starting the tonic bench backend and a real Envoy");
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind backend: {e}"))?;
    let backend = listener.local_addr().map_err(|e| e.to_string())?;
    let stop = CancellationToken::new();
    let backend_task = tokio::spawn(server::serve(
        listener,
        BenchService::default(),
        stop.clone().cancelled_owned(),
    ));
    let mut envoy_opts = EnvoyOptions::new(opts.envoy.clone(), backend);
    envoy_opts.drain_time = timers.drain_time;
    envoy_opts.parent_shutdown_time = timers.parent_shutdown_time;
    let envoy = EnvoyProcess::start(&envoy_opts)
        .await
        .map_err(|e| e.to_string())?;
    let admin = envoy.admin_client();
    let version = admin
        .server_info()
        .await
        .map(|i| i.release().to_string())
        .unwrap_or_default();
    println!(
        "      backend {backend}, Envoy {version} inbound {} admin {}",
        envoy.inbound, envoy.admin
    );

    step(
        2,
        &format!(
            "opening {} long-lived gRPC streams through Envoy",
            opts.streams
        ),
    );
    let streams = client::open_streams(
        envoy.inbound,
        opts.streams,
        "demo",
        Duration::from_secs(120),
    )
    .await?;
    println!("      all {} streams are receiving messages", opts.streams);

    step(
        3,
        &format!(
            "draining through drainshim (deregistration {}, drain {}, deadline {})",
            humantime::format_duration(timers.deregistration_delay),
            humantime::format_duration(timers.drain_time),
            humantime::format_duration(timers.parent_shutdown_time)
        ),
    );
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let (handle, _task) = drain::spawn(
        DrainSettings {
            timers,
            admin,
            guard: None,
        },
        metrics,
    );
    handle.trigger(Trigger::Prestop).await;
    let mut status = handle.subscribe();
    let mut progress = drain::Progress::new(Duration::from_secs(1));
    let report = loop {
        if status.changed().await.is_err() {
            return Err("the drain driver stopped unexpectedly".into());
        }
        let s = status.borrow_and_update().clone();
        if let Some(line) = progress.line(&s) {
            println!("      {line}");
        }
        if let Some(r) = s.report {
            break r;
        }
    };
    let json = serde_json::to_string(&report).map_err(|e| e.to_string())?;
    println!("      report: {json}");

    step(4, "the kubelet sends SIGTERM to Envoy");
    envoy.sigterm();
    let mut cut = 0;
    let mut graceful = 0;
    let mut lost_gaps = 0;
    for s in streams {
        let end = s.await.map_err(|e| e.to_string())?;
        match end.ending() {
            Ending::Cut => cut += 1,
            Ending::Graceful | Ending::Completed => graceful += 1,
            Ending::Other(_) => {}
        }
        if !end.gapless() {
            lost_gaps += 1;
        }
    }
    stop.cancel();
    let _ = backend_task.await;

    println!(
        "\nstreams: {} | ended gracefully: {graceful} | cut by the restart: {cut} | with gaps: {lost_gaps}",
        opts.streams
    );
    println!(
        "drainshim's report said cut={} before the restart, and the clients saw {cut} cut: the count is honest.",
        report.streams.cut
    );
    println!(
        "Envoy alone cannot end a long-lived stream gracefully (DESIGN.md §1), so without the stream guard every stream still open at the deadline is cut by the restart."
    );
    Ok(())
}
