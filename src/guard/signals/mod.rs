//! The guard's golden signals: what every proxied request ended with, how
//! long it took, and how often streams are opened, seen from outside the
//! mesh (docs/design.md, "Metrics").
//!
//! - `drainshim_guard_requests_total{service,code,protocol}`: the
//!   application's outcomes. A stream the guard ended itself (a drain, max
//!   connection age, the application's own shutdown) is not one: it is
//!   counted by `drainshim_streams_terminated_total{reason,protocol}` (or
//!   `_ungraceful_total`) instead, so an ending's `grpc-status: 14` never
//!   reads as the application failing
//! - `drainshim_guard_request_duration_seconds{service}`: unary calls to the
//!   end of the response, streams to their first message (a quiet stream,
//!   answered and then silent past the long-stream age, to its head)
//! - `drainshim_guard_streams_opened_total{service,protocol}`
//! - `drainshim_guard_stream_lifetime_seconds{protocol}`
//!
//! `service` is `package.Service` from a gRPC path (`http` for requests that
//! are not gRPC). At most `max_services` services get series of their own;
//! later ones, and paths that name no service, share `other`. Method labels
//! are off unless asked for; they count against the same cap.
//!
//! The hot path stays cheap: a service's metric handles are resolved once
//! ([`ServiceSignals`]) and found again by the path's `&str` under a read
//! lock; a request allocates nothing for its metrics once its service is
//! known, and counters per code are created on first use.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use tokio::time::Instant;

use crate::metrics::{
    Code, GuardRequestLabels, GuardStreamLabels, Metrics, ProtocolLabels, ServiceKey,
    StreamProtocol, CODES, STREAM_PROTOCOLS,
};

/// Services with series of their own by default; the rest share `other`.
pub const DEFAULT_MAX_SERVICES: usize = 100;

/// The service label of requests that are not gRPC.
pub const HTTP_SERVICE: &str = "http";

/// The service label past the cap, or for a gRPC path naming no service.
pub const OTHER_SERVICE: &str = "other";

/// Longest service or method name taken from a path; longer ones are `other`.
const MAX_NAME_LEN: usize = 200;

/// What the guard records per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignalSettings {
    /// Off: nothing is recorded per request (the series stay absent).
    pub enabled: bool,
    /// Adds a `method` label (gRPC method name) to the service's series.
    pub methods: bool,
    /// Most service (or service/method) keys with series of their own.
    pub max_services: usize,
}

impl Default for SignalSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            methods: false,
            max_services: DEFAULT_MAX_SERVICES,
        }
    }
}

/// `package.Service` and `Method` of a gRPC path `/package.Service/Method`;
/// None when the path is not of that shape.
pub fn grpc_service(path: &str) -> Option<(&str, &str)> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= MAX_NAME_LEN
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
    };
    (name_ok(service) && name_ok(method)).then_some((service, method))
}

/// The gRPC status name for a `grpc-status` value; unknown numbers are
/// `UNKNOWN`, as gRPC clients read them.
pub fn grpc_code(status: &[u8]) -> Code {
    let n = std::str::from_utf8(status)
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok());
    match n {
        Some(n) if n <= 16 => CODES[n],
        _ => Code::UNKNOWN,
    }
}

/// The HTTP status class.
pub fn http_class(status: StatusCode) -> Code {
    match status.as_u16() {
        100..=199 => Code::Http1xx,
        200..=299 => Code::Http2xx,
        300..=399 => Code::Http3xx,
        400..=499 => Code::Http4xx,
        _ => Code::Http5xx,
    }
}

/// What a gRPC client makes of an HTTP status without `grpc-status` (the
/// mapping in gRPC's "HTTP to gRPC Status Code Mapping").
pub fn grpc_code_for_http(status: StatusCode) -> Code {
    match status.as_u16() {
        400 => Code::INTERNAL,
        401 => Code::UNAUTHENTICATED,
        403 => Code::PERMISSION_DENIED,
        404 => Code::UNIMPLEMENTED,
        429 | 502 | 503 | 504 => Code::UNAVAILABLE,
        _ => Code::UNKNOWN,
    }
}

/// What a gRPC client makes of an RST_STREAM it gets instead of trailers.
///
/// The code is an `h2::Reason`, not one of `relay::wire`'s numbers: this is
/// the core, which imports neither wing (`tests/it/layering.rs`), and
/// `h2::Reason` is a name for an RFC 9113 error code that both can use. The
/// h2 crate is otherwise only a test peer; nothing here runs h2.
pub fn grpc_code_for_reset(reason: h2::Reason) -> Code {
    match reason {
        h2::Reason::CANCEL => Code::CANCELLED,
        h2::Reason::REFUSED_STREAM => Code::UNAVAILABLE,
        _ => Code::INTERNAL,
    }
}

/// The guard's signals: the services known so far and their handles.
#[derive(Debug)]
pub struct Signals {
    settings: SignalSettings,
    /// A response answered and then quiet this long was a stream.
    long_stream_age: Duration,
    metrics: Metrics,
    /// Services (or `service/method` with methods on) and their handles;
    /// bounded by `max_services` plus `other` and `http`.
    services: RwLock<HashMap<Box<str>, Arc<ServiceSignals>>>,
    /// The shared handles past the cap.
    other: OnceLock<Arc<ServiceSignals>>,
    /// Lifetime histograms per protocol, resolved once.
    lifetimes: [Histogram; 4],
}

/// One service's metric handles.
#[derive(Debug)]
pub struct ServiceSignals {
    key: ServiceKey,
    metrics: Metrics,
    /// Per protocol, per code: created on first use (most never are).
    codes: [[OnceLock<Counter>; CODES.len()]; 4],
    /// Streams opened per protocol, created on first use.
    opened: [OnceLock<Counter>; 4],
    duration: Histogram,
}

fn protocol_index(p: StreamProtocol) -> usize {
    match p {
        StreamProtocol::grpc => 0,
        StreamProtocol::http => 1,
        StreamProtocol::websocket => 2,
        StreamProtocol::other => 3,
    }
}

fn code_index(c: Code) -> usize {
    CODES.iter().position(|x| *x == c).unwrap_or(0)
}

impl ServiceSignals {
    fn new(key: ServiceKey, metrics: &Metrics) -> Self {
        if let Ok(mut seen) = metrics.signals.services_seen.lock() {
            seen.insert(key.clone());
        }
        Self {
            duration: metrics.signals.request_duration.get_or_create_owned(&key),
            key,
            metrics: metrics.clone(),
            codes: Default::default(),
            opened: Default::default(),
        }
    }

    fn request(&self, code: Code, protocol: StreamProtocol) -> &Counter {
        self.codes[protocol_index(protocol)][code_index(code)].get_or_init(|| {
            self.metrics
                .signals
                .requests
                .get_or_create_owned(&GuardRequestLabels {
                    key: self.key.clone(),
                    code,
                    protocol,
                })
        })
    }

    fn opened(&self, protocol: StreamProtocol) -> &Counter {
        self.opened[protocol_index(protocol)].get_or_init(|| {
            self.metrics
                .signals
                .streams_opened
                .get_or_create_owned(&GuardStreamLabels {
                    key: self.key.clone(),
                    protocol,
                })
        })
    }
}

impl Signals {
    /// `long_stream_age`: a response answered and then quiet for this long
    /// before it ended was a stream, not a slow call (see [`Request`]).
    pub fn new(settings: SignalSettings, long_stream_age: Duration, metrics: Metrics) -> Self {
        let lifetimes = STREAM_PROTOCOLS.map(|protocol| {
            metrics
                .signals
                .stream_lifetime
                .get_or_create_owned(&ProtocolLabels { protocol })
        });
        Self {
            settings,
            long_stream_age,
            metrics,
            services: RwLock::new(HashMap::new()),
            other: OnceLock::new(),
            lifetimes,
        }
    }

    fn other(&self) -> Arc<ServiceSignals> {
        self.other
            .get_or_init(|| {
                let method = self.settings.methods.then(|| Arc::from(OTHER_SERVICE));
                Arc::new(ServiceSignals::new(
                    ServiceKey {
                        service: Arc::from(OTHER_SERVICE),
                        method,
                    },
                    &self.metrics,
                ))
            })
            .clone()
    }

    /// The handles of the service a request to `path` belongs to. `grpc`:
    /// the request is gRPC (or gRPC-Web), so its path names the service.
    pub fn service(&self, grpc: bool, path: &str) -> Arc<ServiceSignals> {
        let (service, method) = if grpc {
            match grpc_service(path) {
                Some(sm) => sm,
                None => return self.other(),
            }
        } else {
            (HTTP_SERVICE, "")
        };
        // The lookup key: the service, or `service/method` (the path without
        // its leading slash) with methods on.
        let lookup = if self.settings.methods && grpc {
            &path[1..]
        } else {
            service
        };
        if let Ok(map) = self.services.read() {
            if let Some(s) = map.get(lookup) {
                return s.clone();
            }
        }
        let Ok(mut map) = self.services.write() else {
            return self.other();
        };
        if let Some(s) = map.get(lookup) {
            return s.clone();
        }
        // `http` does not count against the cap: it is one series at most.
        if grpc && map.len() >= self.settings.max_services {
            return self.other();
        }
        let key = ServiceKey {
            service: Arc::from(service),
            method: self
                .settings
                .methods
                .then(|| Arc::from(if grpc { method } else { HTTP_SERVICE })),
        };
        let s = Arc::new(ServiceSignals::new(key, &self.metrics));
        map.insert(lookup.into(), s.clone());
        s
    }

    /// Starts recording one request; None when signals are off.
    pub fn start(&self, grpc: bool, path: &str, protocol: StreamProtocol) -> Option<Request> {
        if !self.settings.enabled {
            return None;
        }
        Some(Request {
            service: self.service(grpc, path),
            lifetime: self.lifetimes[protocol_index(protocol)].clone(),
            protocol,
            grpc,
            start: Instant::now(),
            status: None,
            code: None,
            long_stream_age: self.long_stream_age,
            head_at: None,
            first_message: None,
            app_error: false,
            request_done: false,
            stream: false,
            observed: false,
            ended_by_guard: false,
        })
    }
}

/// One request's signals, recorded when it is dropped: its code, its
/// latency (unless already observed at its first stream message) and, for a
/// stream, its lifetime.
#[derive(Debug)]
pub struct Request {
    service: Arc<ServiceSignals>,
    lifetime: Histogram,
    protocol: StreamProtocol,
    /// gRPC (or gRPC-Web): the code is a gRPC status name.
    grpc: bool,
    start: Instant,
    /// The response's HTTP status, once its head went out.
    status: Option<StatusCode>,
    /// The gRPC status (or the guard's own verdict), once known.
    code: Option<Code>,
    /// Answered, then quiet this long before the end: a stream.
    long_stream_age: Duration,
    /// When the response head went out.
    head_at: Option<Instant>,
    /// When the first response message (or event) arrived.
    first_message: Option<Instant>,
    /// The application's own trailers ended it with a status other than OK.
    app_error: bool,
    /// The client ended its request (END_STREAM passed to the app).
    request_done: bool,
    /// Counted as an opened stream.
    stream: bool,
    /// The latency was observed already.
    observed: bool,
    /// The guard ended it: not one of the application's outcomes.
    ended_by_guard: bool,
}

impl Request {
    /// The response head went out: its status, and for a trailers-only
    /// gRPC answer its `grpc-status`.
    pub fn head(&mut self, status: StatusCode, headers: &HeaderMap) {
        self.status = Some(status);
        self.head_at.get_or_insert_with(Instant::now);
        self.trailers(headers);
    }

    /// [`Request::head`] from the fields the frame relay read: the status,
    /// and `grpc-status` when the head carried one (trailers-only).
    pub fn head_status(&mut self, status: StatusCode, grpc_status: Option<&[u8]>) {
        self.status = Some(status);
        self.head_at.get_or_insert_with(Instant::now);
        self.grpc_status(grpc_status);
    }

    /// [`Request::trailers`] from the `grpc-status` the frame relay read.
    pub fn grpc_status(&mut self, status: Option<&[u8]>) {
        if let Some(s) = status {
            self.app_code(grpc_code(s));
        }
    }

    fn app_code(&mut self, code: Code) {
        self.code = Some(code);
        self.app_error = code != Code::OK;
    }

    /// The client ended its request. A stream that ends before this (the
    /// app's end, the guard's, a reset) was still being sent, or waited
    /// on its client.
    pub fn request_ended(&mut self) {
        self.request_done = true;
    }

    /// The application's trailers (or a trailers-only head).
    pub fn trailers(&mut self, trailers: &HeaderMap) {
        if let Some(s) = trailers.get("grpc-status") {
            self.app_code(grpc_code(s.as_bytes()));
        }
    }

    /// The client got this code from the guard itself (or from a reset),
    /// unless a code is known already.
    pub fn code_if_unset(&mut self, code: Code) {
        self.code.get_or_insert(code);
    }

    /// The guard ended this stream itself (a drain, max connection age, the
    /// application's own shutdown), gracefully or by a reset: whatever the
    /// client got, it is not the application's outcome, so it is left out
    /// of `drainshim_guard_requests_total` (the ending's own counters have
    /// it). Its latency and lifetime are still recorded.
    pub fn ended_by_guard(&mut self) {
        self.ended_by_guard = true;
    }

    /// The application reset the stream and the client got that reset: a
    /// gRPC client reads it as a status; an HTTP client has no status.
    pub fn reset(&mut self, reason: h2::Reason) {
        if self.grpc {
            self.code = Some(grpc_code_for_reset(reason));
        }
    }

    /// The guard answered with `status` where nothing else was sent.
    pub fn status_if_unset(&mut self, status: StatusCode) {
        self.status.get_or_insert(status);
    }

    /// A gRPC request gets `grpc` as its code, anything else `http`: the
    /// guard's own answer in each flavour.
    pub fn answered_by_guard(&mut self, grpc: Code, http: StatusCode) {
        if self.grpc {
            self.code = Some(grpc);
        } else {
            self.status = Some(http);
        }
    }

    /// The response has carried `messages` messages (or events) so far. The
    /// second makes it a stream: it is counted as opened and its latency is
    /// the time to its answer (see [`Request::answer`]).
    pub fn messages(&mut self, messages: u64) {
        if messages == 0 || self.stream {
            return;
        }
        let now = Instant::now();
        self.first_message.get_or_insert(now);
        if messages >= 2 {
            self.opened_at(self.answer());
        }
    }

    /// The response is a stream from the start (an HTTP/1.1 body of unknown
    /// length, a WebSocket): its latency is the time to its head.
    pub fn stream_from_head(&mut self) {
        if !self.stream {
            let now = Instant::now();
            self.first_message.get_or_insert(now);
            self.opened_at(Some(now));
        }
    }

    /// When a stream answered: its head when a silence of the long-stream
    /// age followed it (a watch that said it was listening, then waited for
    /// its first event), else its first message (or its head); `None`
    /// before any.
    fn answer(&self) -> Option<Instant> {
        match (self.head_at, self.first_message) {
            (Some(h), Some(m)) if m.saturating_duration_since(h) >= self.long_stream_age => Some(h),
            (h, m) => m.or(h),
        }
    }

    /// A response not yet counted as a stream that was one, by a silence
    /// of the long-stream age that a call does not have (a call answers at
    /// its end: its head, its message and its end come together):
    /// - after its first message (or event), before its end;
    /// - gRPC: after its head, with no message before its end, unless the
    ///   application then ended it with an error (a call that sent its
    ///   headers early and failed);
    /// - gRPC: with no answer at all while the client had not ended its
    ///   request (a stream waiting on its client).
    ///
    /// A head, a long silence, then one message and the end at once is a
    /// call that sent its headers early: a call, its whole duration kept.
    /// Counted as calls, the others' hours would read as the service's
    /// latency and ask `plan` for a drain time no grace period fits.
    fn quiet_stream(&self, now: Instant) -> bool {
        let long = self.long_stream_age;
        let quiet_since = |t: Instant, until: Instant| until.saturating_duration_since(t) >= long;
        if self.stream {
            return false;
        }
        if self.first_message.is_some_and(|m| quiet_since(m, now)) {
            return true;
        }
        if !self.grpc {
            return false;
        }
        match (self.head_at, self.first_message) {
            (_, Some(_)) => false,
            (Some(h), None) => quiet_since(h, now) && !self.app_error,
            (None, None) => !self.request_done && quiet_since(self.start, now),
        }
    }

    /// Counted as an opened stream; its latency is the time to `answer`,
    /// unless it never answered or that took the long-stream age: a stream
    /// that waited that long for its first word was waiting for an event,
    /// and the wait is not the service's latency (nor a call `plan` must
    /// let finish).
    fn opened_at(&mut self, answer: Option<Instant>) {
        self.stream = true;
        self.service.opened(self.protocol).inc();
        if !self.observed {
            self.observed = true;
            let latency = answer.map(|a| a.saturating_duration_since(self.start));
            if let Some(l) = latency.filter(|l| *l < self.long_stream_age) {
                self.service.duration.observe(l.as_secs_f64());
            }
        }
    }

    /// The code this request is counted with.
    fn final_code(&self) -> Code {
        match (self.code, self.status) {
            (Some(c), _) => c,
            // gRPC without grpc-status: what a gRPC client makes of it.
            (None, Some(s)) if self.grpc && s == StatusCode::OK => Code::UNKNOWN,
            (None, Some(s)) if self.grpc => grpc_code_for_http(s),
            (None, Some(s)) => http_class(s),
            // No answer at all: the client went away first.
            (None, None) => Code::CANCELLED,
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        let now = Instant::now();
        if self.quiet_stream(now) {
            self.opened_at(self.answer());
        }
        if !self.ended_by_guard {
            self.service.request(self.final_code(), self.protocol).inc();
        }
        let elapsed = now.saturating_duration_since(self.start).as_secs_f64();
        if !self.observed {
            self.service.duration.observe(elapsed);
        }
        if self.stream {
            self.lifetime.observe(elapsed);
        }
    }
}

#[cfg(test)]
mod tests;
