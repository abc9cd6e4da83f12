//! The one `Metrics` struct, registered once from the table of its
//! families in `families.rs`; the names are the contract in docs/design.md
//! and must not change.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, EncodeLabelValue, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// How a drain ended, as a label value (the drain report's outcome).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum DrainOutcome {
    quiesced,
    deadline,
    envoy_unreachable,
}

/// Every drain outcome, for series created at 0.
pub const DRAIN_OUTCOMES: [DrainOutcome; 3] = [
    DrainOutcome::quiesced,
    DrainOutcome::deadline,
    DrainOutcome::envoy_unreachable,
];

/// How a drain ended (`drainshim_drains_total{outcome}`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// How the drain ended.
    pub outcome: DrainOutcome,
}

/// One finished drain as the metrics count it (the drain's report, reduced).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DrainCounts {
    /// How it ended; None counts no drain (never happens for a report).
    pub outcome: Option<DrainOutcome>,
    /// Connections by how they ended.
    pub connections_closed: u64,
    pub connections_idle_at_exit: u64,
    pub connections_cut: u64,
    /// Streams by how they ended.
    pub streams_completed: u64,
    pub streams_terminated: u64,
    pub streams_failed: u64,
    pub streams_cut: u64,
    pub streams_bypassed: u64,
    /// From the trigger to the report.
    pub duration_seconds: f64,
}

/// How a connection or stream ended during a drain.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum EndingOutcome {
    closed,
    idle_at_exit,
    completed,
    terminated,
    /// Ended by the guard without its graceful end (the application's
    /// connection lost, or no message boundary in time).
    failed,
    cut,
    /// On the fail-open path at the deadline: the guard was bypassed, so
    /// nothing could end it gracefully, and the restart cuts it.
    bypassed,
}

/// What `drainshim_failopen_active` counts on the fail-open path.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum FailopenKind {
    requests,
    connections,
}

impl FailopenKind {
    pub const ALL: [FailopenKind; 2] = [FailopenKind::requests, FailopenKind::connections];
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailopenLabels {
    /// Requests (streams) or Envoy's connections to the app directly.
    pub kind: FailopenKind,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndingLabels {
    /// How the connection or stream ended.
    pub outcome: EndingOutcome,
}

/// Why the guard sent a GOAWAY or ended a stream.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Reason {
    max_age,
    drain,
    /// The application sent GOAWAY itself (its own graceful stop).
    app_shutdown,
    /// Envoy drains the listener (or filter chain) the stream came in on
    /// after a config update: it would close the connection at the drain's end.
    config_push,
}

impl Reason {
    /// Every reason, for pre-registered series.
    pub const ALL: [Reason; 4] = [
        Reason::max_age,
        Reason::drain,
        Reason::app_shutdown,
        Reason::config_push,
    ];
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why.
    pub reason: Reason,
}

/// Which of the stream guard's limits acted (`drainshim_guard_limited_total{limit}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Limit {
    /// A connection closed at accept: `--guard-max-connections` were open.
    connections,
    /// A stream (HTTP/1.1: request) refused: `--guard-max-streams` were open.
    streams,
    /// A connection's reads paused by the PING rate limit.
    ping,
    /// A connection's reads paused by the SETTINGS rate limit.
    settings,
    /// A connection's reads paused by the RST_STREAM rate limit.
    rst_stream,
    /// A connection sent GOAWAY(ENHANCE_YOUR_CALM): most of its streams
    /// were reset before they were answered (rapid reset).
    rapid_reset,
}

/// A drain timer the shim runs with (`drainshim_drain_timer_seconds{timer}`):
/// `plan`'s drain-timers step compares them with what the fleet's own
/// latencies and streams need.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum DrainTimer {
    deregistration_delay,
    min_drain_time,
    drain_time,
    parent_shutdown_time,
    /// Only when the pod's grace period is known (a flag, or the pod's own).
    termination_grace_period,
}

impl DrainTimer {
    /// Every timer, for node mode.
    pub const ALL: [DrainTimer; 5] = [
        DrainTimer::deregistration_delay,
        DrainTimer::min_drain_time,
        DrainTimer::drain_time,
        DrainTimer::parent_shutdown_time,
        DrainTimer::termination_grace_period,
    ];
}

/// `drainshim_drain_timer_seconds{timer}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DrainTimerLabels {
    pub timer: DrainTimer,
}

/// A gauge of seconds with fractions (a timer may be `500ms`).
pub type SecondsGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

impl Limit {
    /// Every limit, for node mode.
    pub const ALL: [Limit; 6] = [
        Limit::connections,
        Limit::streams,
        Limit::ping,
        Limit::settings,
        Limit::rst_stream,
        Limit::rapid_reset,
    ];
}

/// Why the stream guard dropped DATA the application sent
/// (`drainshim_stream_data_dropped_total{reason}`): each is a message the
/// client never got. 0 is the promise; the peer matrix holds it there.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Dropped {
    /// DATA for a stream whose end the guard had already sent the client
    /// (an ending whose barrier was never acked in time, or a reset).
    after_end,
    /// The start of a message the application's stack cut short once it
    /// read the guard's cancel: the client never gets half a message.
    partial_message,
}

impl Dropped {
    /// Every reason, for node mode and the zeroed series.
    pub const ALL: [Dropped; 2] = [Dropped::after_end, Dropped::partial_message];
}

/// Why application DATA was dropped (`drainshim_stream_data_dropped_total`,
/// `drainshim_stream_data_dropped_bytes_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DroppedLabels {
    pub reason: Dropped,
}

/// An HTTP/2 error code by its RFC 9113 name (§7), for
/// `drainshim_guard_app_goaways_total{code}`; `unknown` for a code the RFC
/// does not name (a peer may send any, and the label set stays closed).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
pub enum H2Code {
    NO_ERROR,
    PROTOCOL_ERROR,
    INTERNAL_ERROR,
    FLOW_CONTROL_ERROR,
    SETTINGS_TIMEOUT,
    STREAM_CLOSED,
    FRAME_SIZE_ERROR,
    REFUSED_STREAM,
    CANCEL,
    COMPRESSION_ERROR,
    CONNECT_ERROR,
    ENHANCE_YOUR_CALM,
    INADEQUATE_SECURITY,
    HTTP_1_1_REQUIRED,
    unknown,
}

impl H2Code {
    /// Every code, in the RFC's order (the wire value is the index), then `unknown`.
    pub const ALL: [H2Code; 15] = [
        H2Code::NO_ERROR,
        H2Code::PROTOCOL_ERROR,
        H2Code::INTERNAL_ERROR,
        H2Code::FLOW_CONTROL_ERROR,
        H2Code::SETTINGS_TIMEOUT,
        H2Code::STREAM_CLOSED,
        H2Code::FRAME_SIZE_ERROR,
        H2Code::REFUSED_STREAM,
        H2Code::CANCEL,
        H2Code::COMPRESSION_ERROR,
        H2Code::CONNECT_ERROR,
        H2Code::ENHANCE_YOUR_CALM,
        H2Code::INADEQUATE_SECURITY,
        H2Code::HTTP_1_1_REQUIRED,
        H2Code::unknown,
    ];

    /// The name of the code on the wire.
    pub fn of(code: u32) -> Self {
        usize::try_from(code)
            .ok()
            .filter(|&i| i < Self::ALL.len() - 1)
            .map_or(H2Code::unknown, |i| Self::ALL[i])
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    /// The GOAWAY's error code.
    pub code: H2Code,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// Which limit.
    pub limit: Limit,
}

/// What kind of stream the guard ended: each has its own goodbye (gRPC
/// trailers, a WebSocket Close frame, an HTTP/1.1 `Connection: close`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum StreamProtocol {
    grpc,
    http,
    websocket,
    /// An HTTP/1.1 upgrade to anything but WebSocket: proxied as raw bytes.
    other,
}

/// Every [`StreamProtocol`], for zeroed series and node mode.
pub const STREAM_PROTOCOLS: [StreamProtocol; 4] = [
    StreamProtocol::grpc,
    StreamProtocol::http,
    StreamProtocol::websocket,
    StreamProtocol::other,
];

/// Why and what the guard ended (`streams_terminated_total`,
/// `streams_ungraceful_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TerminatedLabels {
    /// Why: max age or drain.
    pub reason: Reason,
    /// What kind of stream: the label ends graceful endings apart by protocol.
    pub protocol: StreamProtocol,
}

/// The service (and, behind `--guard-metrics-methods`, the method) of a
/// guard request. `method` is left out of the exposition when None.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServiceKey {
    /// `package.Service` from the gRPC path; `http` for requests that are
    /// not gRPC; `other` past the cardinality cap or for a path that names
    /// no service.
    pub service: Arc<str>,
    pub method: Option<Arc<str>>,
}

impl EncodeLabelSet for ServiceKey {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> std::fmt::Result {
        ("service", &*self.service).encode(encoder.encode_label())?;
        if let Some(m) = &self.method {
            ("method", &**m).encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

/// `drainshim_guard_requests_total{service,code,protocol}`: the app's
/// outcomes, never a stream the guard ended itself.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GuardRequestLabels {
    #[prometheus(flatten)]
    pub key: ServiceKey,
    pub code: Code,
    pub protocol: StreamProtocol,
}

/// `drainshim_guard_streams_opened_total{service,protocol}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GuardStreamLabels {
    #[prometheus(flatten)]
    pub key: ServiceKey,
    pub protocol: StreamProtocol,
}

/// `drainshim_guard_stream_lifetime_seconds{protocol}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProtocolLabels {
    pub protocol: StreamProtocol,
}

/// A histogram family's constructor (a fn pointer keeps the type nameable).
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Buckets for RPC latencies: 1 ms to 10 s, about three per decade; then
/// to 5 minutes at the drain timers' scale (`plan`'s drain-timers step sets
/// a drain from the highest bucket with calls, and a parent shutdown must
/// stay under the preStop hooks' 120 s), so a 40 s call reads as one, not
/// as "past 10 s".
pub const RPC_LATENCY_BUCKETS: [f64; 18] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 90.0,
    120.0, 300.0,
];

/// Buckets for stream lifetimes: 1 s to a day, around the max-age settings
/// people use (minutes to hours).
pub const STREAM_LIFETIME_BUCKETS: [f64; 11] = [
    1.0, 10.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0,
];

fn rpc_latency_histogram() -> Histogram {
    Histogram::new(RPC_LATENCY_BUCKETS)
}

fn stream_lifetime_histogram() -> Histogram {
    Histogram::new(STREAM_LIFETIME_BUCKETS)
}

/// One proxy in the version inventory (`drainshim_proxy_info`).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProxyLabels {
    /// The pod's namespace (flags, env, Envoy's node metadata or node id).
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// Envoy's release, e.g. `1.40.0`.
    pub version: String,
    /// The mesh's release (`ISTIO_VERSION`), empty without one.
    pub mesh_version: String,
}

/// Config acceptance per proxy version (`drainshim_envoy_config_updates_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigLabels {
    /// lds | cds | rds | eds
    pub resource: String,
    /// success | rejected | failure
    pub result: String,
    pub version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabels {
    /// The proxy release, e.g. `1.40.0`.
    pub version: String,
}

/// A kernel TCP counter name, e.g. `EstabResets` or `TCPAbortOnData`.
/// Kernel counters worth watching for resets, by file and section of
/// `/proc/net` (telemetry reads them there); the last is the `kind` label.
pub const TCP_RESET_KINDS: &[(&str, &str, &str)] = &[
    ("snmp", "Tcp", "EstabResets"),
    ("snmp", "Tcp", "OutRsts"),
    ("snmp", "Tcp", "AttemptFails"),
    ("netstat", "TcpExt", "TCPAbortOnClose"),
    ("netstat", "TcpExt", "TCPAbortOnData"),
    ("netstat", "TcpExt", "TCPAbortOnTimeout"),
    ("netstat", "TcpExt", "TCPAbortOnLinger"),
    ("netstat", "TcpExt", "TCPAbortOnMemory"),
    ("netstat", "TcpExt", "TCPAbortFailed"),
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// The counter, as `/proc/net/netstat` names it.
    pub kind: String,
}

mod code;
pub mod families;
pub mod help;

pub use code::{Code, CODES};

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

/// What a config update drains: `listener` (replaced or removed) or
/// `filter_chains` (updated in place).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ListenerDrainKind {
    listener,
    filter_chains,
}

/// Both kinds, for series created at 0.
pub const LISTENER_DRAIN_KINDS: [ListenerDrainKind; 2] = [
    ListenerDrainKind::listener,
    ListenerDrainKind::filter_chains,
];

/// `drainshim_envoy_listener_drains_total{kind}` and `drainshim_envoy_listeners_draining{kind}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerDrainLabels {
    pub kind: ListenerDrainKind,
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
