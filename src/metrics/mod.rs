//! The one `Metrics` struct, registered once from the table of its
//! families in `families.rs`; the names are the contract in docs/design.md
//! and must not change.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

mod code;
pub mod families;
pub mod help;

pub use code::{Code, CODES};
mod labels;
use labels::{rpc_latency_histogram, stream_lifetime_histogram};
pub use labels::{
    CodeLabels, ConfigLabels, DrainCounts, DrainOutcome, DrainTimer, DrainTimerLabels, Dropped,
    DroppedLabels, EndingLabels, EndingOutcome, FailopenKind, FailopenLabels, GuardRequestLabels,
    GuardStreamLabels, H2Code, HistogramFamily, KindLabels, Limit, LimitLabels, ListenerDrainKind,
    ListenerDrainLabels, OutcomeLabels, ProtocolLabels, ProxyLabels, Reason, ReasonLabels,
    SecondsGauge, ServiceKey, StreamProtocol, TerminatedLabels, VersionLabels, DRAIN_OUTCOMES,
    LISTENER_DRAIN_KINDS, RPC_LATENCY_BUCKETS, STREAM_LIFETIME_BUCKETS, STREAM_PROTOCOLS,
    TCP_RESET_KINDS,
};

/// Every metric the shim exports, the families of the drain, of what is read
/// of Envoy and of the guard's golden signals each in a group of its own.
/// Cheap to clone: each field is an `Arc` inside.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// The drains: how they ended, what they ended, how long they took and
    /// the timers they run with.
    pub drain: DrainFamilies,
    /// What the shim reads of its Envoy and the pod, polled or read at scrape
    /// time.
    pub envoy: EnvoyFamilies,
    /// `drainshim_guard_max_connection_age_seconds`: the guard's configured
    /// max age; `plan` reads how long a tier has had one. A family with no
    /// labels (the empty set), so a shim without a guard exports no sample.
    pub guard_max_connection_age: Family<Vec<(String, String)>, Gauge>,
    /// `drainshim_guard_request_metrics`: 1 when the guard records each
    /// request's signals, 0 when `--guard-request-metrics` is off; `plan`
    /// tells a pod whose calls it cannot see from an idle one. No sample
    /// without a guard.
    pub guard_request_metrics: Family<Vec<(String, String)>, Gauge>,
    /// `drainshim_goaways_total{reason}`: GOAWAY sequences the guard sent.
    pub goaways: Family<ReasonLabels, Counter>,
    /// `drainshim_streams_terminated_total{reason,protocol}`: streams the guard ended gracefully.
    pub streams_terminated: Family<TerminatedLabels, Counter>,
    /// `drainshim_streams_ungraceful_total{reason,protocol}`: streams it could only reset or close.
    pub streams_ungraceful: Family<TerminatedLabels, Counter>,
    /// `drainshim_streams_blind_ended_total{reason,protocol}`: endings begun
    /// at a moment no write of the application timed.
    pub streams_blind_ended: Family<TerminatedLabels, Counter>,
    /// `drainshim_stream_data_dropped_total{reason}`: DATA frames of the
    /// application's the guard dropped, and their bytes (`_bytes_total`).
    pub stream_data_dropped: Family<DroppedLabels, Counter>,
    pub stream_data_dropped_bytes: Family<DroppedLabels, Counter>,
    /// The stream guard's process caps and frame rate limits at work.
    pub guard_limited: Family<LimitLabels, Counter>,
    /// `drainshim_guard_app_goaways_total{code}`: GOAWAY frames the
    /// applications sent the guard, by error code (ENHANCE_YOUR_CALM: the
    /// app found the guard abusive and dropped its connection).
    pub guard_app_goaways: Family<CodeLabels, Counter>,
    /// The guard's golden signals.
    pub signals: SignalFamilies,
}

/// The drains: how they ended, what they ended, how long they took and the
/// timers they run with.
#[derive(Clone, Debug)]
pub struct DrainFamilies {
    /// `drainshim_drains_total{outcome}`: drains finished, by how.
    pub drains: Family<OutcomeLabels, Counter>,
    /// `drainshim_drained_connections_total{outcome}`: connections by how they ended.
    pub drained_connections: Family<EndingLabels, Counter>,
    /// `drainshim_drained_streams_total{outcome}`: streams by how they ended; `cut` is what the mission keeps at 0.
    pub drained_streams: Family<EndingLabels, Counter>,
    /// `drainshim_drain_duration_seconds`: how long drains take, against the budget.
    pub duration: Histogram,
    /// `drainshim_draining`: 1 while a drain runs.
    pub draining: Gauge,
    /// `drainshim_drain_timer_seconds{timer}`: the drain timers this shim
    /// (or this pod, in node mode) runs with; `plan` reads them.
    pub timers: Family<DrainTimerLabels, SecondsGauge>,
}

/// What the shim reads of its Envoy and the pod: polled during a drain or
/// read at scrape time (the inventory, config acceptance, retries, kernel
/// resets, the fail-open path, config-push listener drains).
#[derive(Clone, Debug)]
pub struct EnvoyFamilies {
    /// `drainshim_envoy_active_connections`: Envoy's live inbound connections, as last polled.
    pub active_connections: Gauge,
    /// `drainshim_envoy_active_streams`: Envoy's live inbound streams, as last polled.
    pub active_streams: Gauge,
    /// `drainshim_failopen_active{kind}`: what bypasses the guard, as last polled.
    pub failopen_active: Family<FailopenLabels, Gauge>,
    /// `drainshim_guard_paths`: Envoy's clusters with the guard first, as last polled.
    pub guard_paths: Gauge,
    /// `drainshim_proxy_info`: 1 for this proxy; the version inventory reads its labels.
    pub proxy_info: Family<ProxyLabels, Gauge>,
    /// `drainshim_envoy_config_updates_total`: xDS acceptance per proxy version, mirrored from Envoy.
    pub config_updates: Family<ConfigLabels, Counter>,
    /// `drainshim_envoy_upstream_retries_total{version}`: Envoy's retry volume per version.
    pub upstream_retries: Family<VersionLabels, Counter>,
    /// Inbound requests callers sent to Envoy, per version: the denominator
    /// that exposes retries in the guard's request count.
    pub downstream_requests: Family<VersionLabels, Counter>,
    /// `drainshim_tcp_resets_total{kind}`: the pod's kernel reset counters, seen from outside the mesh.
    pub tcp_resets: Family<KindLabels, Counter>,
    /// `drainshim_envoy_listener_drains_total{kind}`: listener drains a
    /// config update began (not the pod's own drain), from Envoy's counters.
    pub listener_drains: Family<ListenerDrainLabels, Counter>,
    /// `drainshim_envoy_listeners_draining{kind}`: what Envoy drains after
    /// config updates now, as of the last look (Envoy's gauges).
    pub listeners_draining: Family<ListenerDrainLabels, Gauge>,
    /// Every Envoy version passed to `set_proxy`. prometheus-client cannot
    /// list a Family's label sets, and node mode must find the version-keyed
    /// series to re-label them per pod.
    pub versions_seen: Arc<Mutex<BTreeSet<String>>>,
}

/// The guard's golden signals: every request and stream it proxied, by service.
#[derive(Clone, Debug)]
pub struct SignalFamilies {
    /// Every request the guard proxied, by service, code and protocol.
    pub requests: Family<GuardRequestLabels, Counter>,
    /// Latency per service: unary to the end, streams to the first message.
    pub request_duration: HistogramFamily<ServiceKey>,
    /// Streams opened per service: the reconnect rate.
    pub streams_opened: Family<GuardStreamLabels, Counter>,
    /// Stream lifetimes per protocol.
    pub stream_lifetime: HistogramFamily<ProtocolLabels>,
    /// Every service key the guard has series for. prometheus-client cannot
    /// list a Family's label sets, and node mode enumerates them; the guard's
    /// cardinality cap bounds it.
    pub services_seen: Arc<Mutex<BTreeSet<ServiceKey>>>,
}

// === impl Metrics ===

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

// === impl Metrics ===

impl Metrics {
    /// The counter of one guard limit.
    pub fn guard_limited(&self, limit: Limit) -> Counter {
        self.guard_limited
            .get_or_create(&LimitLabels { limit })
            .clone()
    }

    /// The counter of the applications' GOAWAYs with `code` on the wire.
    pub fn guard_app_goaway(&self, code: u32) -> Counter {
        self.guard_app_goaways
            .get_or_create(&CodeLabels {
                code: H2Code::of(code),
            })
            .clone()
    }

    /// Metrics registered nowhere: node mode keeps one set per pod and
    /// encodes them itself, with pod labels.
    pub fn new() -> Self {
        Self::register(&mut Registry::default())
    }

    /// Creates the metrics and registers each family of
    /// [`families::FAMILIES`] under the `drainshim_` prefix, its known
    /// series created at 0 where the table says so.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            drain: DrainFamilies {
                drains: Family::default(),
                drained_connections: Family::default(),
                drained_streams: Family::default(),
                // 0.5 s .. ~256 s: covers a quick quiesce up to a long parent-shutdown budget.
                duration: Histogram::new(exponential_buckets(0.5, 2.0, 10)),
                draining: Gauge::default(),
                timers: Family::default(),
            },
            envoy: EnvoyFamilies {
                active_connections: Gauge::default(),
                active_streams: Gauge::default(),
                failopen_active: Family::default(),
                guard_paths: Gauge::default(),
                proxy_info: Family::default(),
                config_updates: Family::default(),
                upstream_retries: Family::default(),
                downstream_requests: Family::default(),
                tcp_resets: Family::default(),
                listener_drains: Family::default(),
                listeners_draining: Family::default(),
                versions_seen: Arc::default(),
            },
            guard_max_connection_age: Family::default(),
            guard_request_metrics: Family::default(),
            goaways: Family::default(),
            streams_terminated: Family::default(),
            streams_ungraceful: Family::default(),
            streams_blind_ended: Family::default(),
            stream_data_dropped: Family::default(),
            stream_data_dropped_bytes: Family::default(),
            guard_limited: Family::default(),
            guard_app_goaways: Family::default(),
            signals: SignalFamilies {
                requests: Family::default(),
                request_duration: Family::new_with_constructor(rpc_latency_histogram),
                streams_opened: Family::default(),
                stream_lifetime: Family::new_with_constructor(stream_lifetime_histogram),
                services_seen: Arc::default(),
            },
        };
        let r = registry.sub_registry_with_prefix("drainshim");
        for def in &families::FAMILIES {
            def.access.zero(&m);
            def.access.register(&m, r, def.desc);
        }
        m
    }

    /// The guard's service keys with series (bounded by its cardinality cap).
    pub fn guard_services(&self) -> Vec<ServiceKey> {
        self.signals
            .services_seen
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The Envoy versions passed to `set_proxy`.
    pub fn versions(&self) -> Vec<String> {
        self.envoy
            .versions_seen
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Counts one finished drain.
    pub fn record_drain(&self, d: &DrainCounts) {
        if let Some(outcome) = d.outcome {
            self.drain
                .drains
                .get_or_create(&OutcomeLabels { outcome })
                .inc();
        }
        for (outcome, n) in [
            (EndingOutcome::closed, d.connections_closed),
            (EndingOutcome::idle_at_exit, d.connections_idle_at_exit),
            (EndingOutcome::cut, d.connections_cut),
        ] {
            self.drain
                .drained_connections
                .get_or_create(&EndingLabels { outcome })
                .inc_by(n);
        }
        for (outcome, n) in [
            (EndingOutcome::completed, d.streams_completed),
            (EndingOutcome::terminated, d.streams_terminated),
            (EndingOutcome::failed, d.streams_failed),
            (EndingOutcome::cut, d.streams_cut),
            (EndingOutcome::bypassed, d.streams_bypassed),
        ] {
            self.drain
                .drained_streams
                .get_or_create(&EndingLabels { outcome })
                .inc_by(n);
        }
        self.drain.duration.observe(d.duration_seconds);
    }

    /// Sets the fail-open gauges from one poll.
    pub fn set_failopen(&self, requests: u64, connections: u64, paths: u64) {
        self.envoy
            .guard_paths
            .set(i64::try_from(paths).unwrap_or(i64::MAX));
        for (kind, n) in [
            (FailopenKind::requests, requests),
            (FailopenKind::connections, connections),
        ] {
            self.envoy
                .failopen_active
                .get_or_create(&FailopenLabels { kind })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Sets the drain timers the shim runs with; the grace period's series
    /// exists only while it is known.
    pub fn set_drain_timers(&self, t: &crate::config::Timers, grace: Option<std::time::Duration>) {
        let values = [
            (
                DrainTimer::deregistration_delay,
                Some(t.deregistration_delay),
            ),
            (DrainTimer::min_drain_time, Some(t.min_drain_time)),
            (DrainTimer::drain_time, Some(t.drain_time)),
            (
                DrainTimer::parent_shutdown_time,
                Some(t.parent_shutdown_time),
            ),
            (DrainTimer::termination_grace_period, grace),
        ];
        for (timer, value) in values {
            let labels = DrainTimerLabels { timer };
            match value {
                Some(d) => {
                    self.drain
                        .timers
                        .get_or_create(&labels)
                        .set(d.as_secs_f64());
                }
                None => {
                    self.drain.timers.remove(&labels);
                }
            }
        }
    }

    /// Replaces the inventory entry: a restarted Envoy may report a new version.
    pub fn set_proxy(&self, labels: ProxyLabels) {
        if let Ok(mut seen) = self.envoy.versions_seen.lock() {
            if !seen.contains(&labels.version) {
                seen.insert(labels.version.clone());
            }
        }
        if self.envoy.proxy_info.get_or_create(&labels).get() == 1 {
            return;
        }
        self.envoy.proxy_info.clear();
        self.envoy.proxy_info.get_or_create(&labels).set(1);
    }
}

/// The sidecar's own metrics beyond the per-pod set (a contract extension):
/// the Envoy watcher of `recovery` runs only in the sidecar, so node mode,
/// whose per-pod series mirror `Metrics` exactly, does not export these.
#[derive(Clone, Debug, Default)]
pub struct SidecarMetrics {
    /// `drainshim_envoy_stuck_draining`: 1 while Envoy has stopped listeners
    /// and no drain of this shim runs; the signal to replace the pod.
    pub envoy_stuck_draining: Gauge,
    /// `drainshim_envoy_recoveries_total`: failed health checks left by an
    /// earlier drain and restored.
    pub envoy_recoveries: Counter,
}

// === impl SidecarMetrics ===

impl SidecarMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("drainshim");
        r.register(
            help::ENVOY_STUCK_DRAINING.0,
            help::ENVOY_STUCK_DRAINING.1,
            m.envoy_stuck_draining.clone(),
        );
        r.register(
            help::ENVOY_RECOVERIES.0,
            help::ENVOY_RECOVERIES.1,
            m.envoy_recoveries.clone(),
        );
        m
    }
}

/// Renders the registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}
