//! The label sets and label values of the shim's metric families, their
//! buckets, and the constant lists series are created from at 0.

use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, EncodeLabelValue, LabelSetEncoder};
use std::sync::Arc;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use super::Code;

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

pub(super) fn rpc_latency_histogram() -> Histogram {
    Histogram::new(RPC_LATENCY_BUCKETS)
}

pub(super) fn stream_lifetime_histogram() -> Histogram {
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
