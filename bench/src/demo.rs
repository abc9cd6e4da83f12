//! `drainshim demo`: the main job end to end on one machine, with real parts.
//! Two "pods" (real Envoy inbound in front of the bench app: the tonic
//! streaming backend and a WebSocket ticker), a population of long-lived
//! gRPC streams and WebSockets (`--protocol`, default half of each), and pod
//! A restarted three ways: plain Envoy SIGTERM, Istio's default drain, and
//! drainshim. Side by side, one row per mode and protocol.

use std::path::PathBuf;

use super::measure;
use super::population::Protocol;
use super::reconnect::{self, Mode, ReconnectOptions};

/// Demo settings.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    pub envoy: PathBuf,
    pub streams: usize,
    pub plot: PathBuf,
    pub protocol: Protocol,
}

pub async fn run(opts: DemoOptions) -> Result<(), String> {
    let mut ro = ReconnectOptions::new(opts.envoy.clone());
    ro.streams = opts.streams;
    ro.protocol = opts.protocol;
    ro.modes = vec![Mode::EnvoySigterm, Mode::IstioDefault, Mode::Drainshim];
    println!(
        "drainshim demo: {} long-lived {} over two pods (real Envoy in front of a gRPC + WebSocket app).\n\
         Pod A is restarted three ways; clients reconnect with backoff, as real clients do.\n\
         drainshim timers (short for the demo): deregistration {}, drain {}, deadline {}.\n",
        opts.streams,
        match opts.protocol {
            Protocol::Grpc => "gRPC streams",
            Protocol::Websocket => "WebSockets",
            Protocol::Mixed => "streams (half gRPC streams, half WebSockets)",
        },
        humantime::format_duration(ro.deregistration_delay),
        humantime::format_duration(ro.drain_time),
        humantime::format_duration(ro.parent_shutdown_time),
    );
    let results = reconnect::run(&ro).await?;
    println!("\n{}", measure::render_table(&results));
    measure::plot(&results, &opts.plot)?;
    println!("plot: {}", opts.plot.display());
    for kind in ro.protocol.kinds() {
        let p = kind.name();
        let by = |m: Mode| {
            results
                .iter()
                .find(|r| r.mode == m.name() && r.protocol == p)
        };
        let signal = match kind {
            super::population::StreamKind::Grpc => "a retryable grpc-status 14",
            super::population::StreamKind::Websocket => "a WebSocket Close 1012 (service restart)",
        };
        if let (Some(base), Some(ds)) = (by(Mode::EnvoySigterm), by(Mode::Drainshim)) {
            println!(
                "\n{p}: a plain restart cut {} of the {} on pod A, and Istio's default drain cut {}; \
                 with drainshim {} were cut and {} ended with {signal}, spread over the drain window (peak/mean {:.2} reconnects per 100 ms).\n\
                 The clients reconnected to pod B with p99 {:.0} ms under drainshim against {:.0} ms after the plain restart, and lost {} messages against {}.",
                base.cut,
                base.streams_on_restarted_pod,
                by(Mode::IstioDefault).map_or(0, |r| r.cut),
                ds.cut,
                ds.graceful,
                ds.storm_peak_to_mean,
                ds.reconnect_p99_ms,
                base.reconnect_p99_ms,
                ds.lost_messages,
                base.lost_messages,
            );
        }
    }
    Ok(())
}
