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
mod tests {
    use super::*;
    use http::HeaderValue;

    const LONG: Duration = Duration::from_secs(10);

    fn signals(max_services: usize, methods: bool) -> (Metrics, Signals) {
        let m = Metrics::new();
        let s = Signals::new(
            SignalSettings {
                enabled: true,
                methods,
                max_services,
            },
            LONG,
            m.clone(),
        );
        (m, s)
    }

    fn count(m: &Metrics, service: &str, method: Option<&str>, code: Code) -> u64 {
        m.signals
            .requests
            .get(&GuardRequestLabels {
                key: ServiceKey {
                    service: Arc::from(service),
                    method: method.map(Arc::from),
                },
                code,
                protocol: StreamProtocol::grpc,
            })
            .map_or(0, |c| c.get())
    }

    #[test]
    fn service_names_come_from_grpc_paths() {
        assert_eq!(
            grpc_service("/drainshim.bench.v1.Stream/Echo"),
            Some(("drainshim.bench.v1.Stream", "Echo"))
        );
        assert_eq!(
            grpc_service("/Greeter/SayHello"),
            Some(("Greeter", "SayHello"))
        );
        for bad in [
            "",
            "/",
            "/only",
            "/a.B/",
            "//Echo",
            "/a.B/Echo/extra",
            "/a B/Echo",
            "no-slash/Echo",
        ] {
            assert_eq!(grpc_service(bad), None, "{bad:?}");
        }
        let long = format!("/{}/M", "s".repeat(MAX_NAME_LEN + 1));
        assert_eq!(grpc_service(&long), None);
    }

    #[test]
    fn codes_map_like_grpc_clients_read_them() {
        assert_eq!(grpc_code(b"0"), Code::OK);
        assert_eq!(grpc_code(b"14"), Code::UNAVAILABLE);
        assert_eq!(grpc_code(b"16"), Code::UNAUTHENTICATED);
        assert_eq!(grpc_code(b"17"), Code::UNKNOWN);
        assert_eq!(grpc_code(b"x"), Code::UNKNOWN);
        assert_eq!(http_class(StatusCode::OK), Code::Http2xx);
        assert_eq!(http_class(StatusCode::SWITCHING_PROTOCOLS), Code::Http1xx);
        assert_eq!(http_class(StatusCode::NOT_FOUND), Code::Http4xx);
        assert_eq!(http_class(StatusCode::BAD_GATEWAY), Code::Http5xx);
        assert_eq!(
            grpc_code_for_http(StatusCode::SERVICE_UNAVAILABLE),
            Code::UNAVAILABLE
        );
        assert_eq!(
            grpc_code_for_http(StatusCode::NOT_FOUND),
            Code::UNIMPLEMENTED
        );
        assert_eq!(grpc_code_for_reset(h2::Reason::CANCEL), Code::CANCELLED);
        assert_eq!(
            grpc_code_for_reset(h2::Reason::REFUSED_STREAM),
            Code::UNAVAILABLE
        );
        assert_eq!(
            grpc_code_for_reset(h2::Reason::PROTOCOL_ERROR),
            Code::INTERNAL
        );
        for (i, c) in CODES.iter().enumerate().take(17) {
            assert_eq!(grpc_code(i.to_string().as_bytes()), *c);
        }
        assert_eq!(Code::Http2xx.as_str(), "2xx");
    }

    #[tokio::test]
    async fn trailers_decide_the_code_and_the_head_stands_in() {
        let (m, s) = signals(10, false);
        let path = "/pkg.Svc/Call";
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("14"));
        // Unary: head, then trailers.
        let mut r = s.start(true, path, StreamProtocol::grpc).expect("on");
        r.head(StatusCode::OK, &HeaderMap::new());
        r.trailers(&trailers);
        drop(r);
        // Trailers-only OK.
        let mut r = s.start(true, path, StreamProtocol::grpc).expect("on");
        let mut ok = HeaderMap::new();
        ok.insert("grpc-status", HeaderValue::from_static("0"));
        r.head(StatusCode::OK, &ok);
        drop(r);
        // A client that went away before any answer.
        drop(s.start(true, path, StreamProtocol::grpc));
        // A 503 without grpc-status.
        let mut r = s.start(true, path, StreamProtocol::grpc).expect("on");
        r.head(StatusCode::SERVICE_UNAVAILABLE, &HeaderMap::new());
        drop(r);
        assert_eq!(count(&m, "pkg.Svc", None, Code::UNAVAILABLE), 2);
        assert_eq!(count(&m, "pkg.Svc", None, Code::OK), 1);
        assert_eq!(count(&m, "pkg.Svc", None, Code::CANCELLED), 1);
        let key = ServiceKey {
            service: Arc::from("pkg.Svc"),
            method: None,
        };
        let text = crate::metrics::render(&{
            let mut r = prometheus_client::registry::Registry::default();
            r.register("d", "d", m.signals.request_duration.clone());
            r
        });
        assert!(text.contains("d_count{service=\"pkg.Svc\"} 4"), "{text}");
        assert!(m.signals.services_seen.lock().expect("lock").contains(&key));
    }

    #[tokio::test]
    async fn streams_are_counted_at_their_second_message() {
        let (m, s) = signals(10, false);
        let mut r = s
            .start(true, "/pkg.Feed/Watch", StreamProtocol::grpc)
            .expect("on");
        r.head(StatusCode::OK, &HeaderMap::new());
        r.messages(1);
        let opened = |m: &Metrics| {
            m.signals
                .streams_opened
                .get(&GuardStreamLabels {
                    key: ServiceKey {
                        service: Arc::from("pkg.Feed"),
                        method: None,
                    },
                    protocol: StreamProtocol::grpc,
                })
                .map_or(0, |c| c.get())
        };
        assert_eq!(opened(&m), 0, "one message is a unary answer so far");
        r.messages(3);
        r.messages(5);
        assert_eq!(opened(&m), 1);
        drop(r);
        let lifetime = m
            .signals
            .stream_lifetime
            .get_or_create_owned(&ProtocolLabels {
                protocol: StreamProtocol::grpc,
            });
        let text = crate::metrics::render(&{
            let mut reg = prometheus_client::registry::Registry::default();
            reg.register("l", "l", lifetime);
            reg
        });
        assert!(text.contains("l_count 1"), "{text}");
    }

    /// The opened count and the duration histogram's count and sum for
    /// `pkg.Feed`, and the gRPC lifetime count.
    fn feed_figures(m: &Metrics) -> (u64, String) {
        let key = ServiceKey {
            service: Arc::from("pkg.Feed"),
            method: None,
        };
        let opened = m
            .signals
            .streams_opened
            .get(&GuardStreamLabels {
                key,
                protocol: StreamProtocol::grpc,
            })
            .map_or(0, |c| c.get());
        let text = crate::metrics::render(&{
            let mut r = prometheus_client::registry::Registry::default();
            r.register("d", "d", m.signals.request_duration.clone());
            r.register("l", "l", m.signals.stream_lifetime.clone());
            r
        });
        (opened, text)
    }

    #[tokio::test(start_paused = true)]
    async fn an_answered_stream_quiet_past_the_long_age_is_a_stream_not_a_slow_call() {
        let (m, s) = signals(10, false);
        // A watch: its head at once, then nothing for an hour.
        let mut r = s
            .start(true, "/pkg.Feed/Watch", StreamProtocol::grpc)
            .expect("on");
        tokio::time::advance(Duration::from_millis(20)).await;
        r.head(StatusCode::OK, &HeaderMap::new());
        tokio::time::advance(Duration::from_secs(3600)).await;
        drop(r);
        let (opened, text) = feed_figures(&m);
        assert_eq!(opened, 1, "{text}");
        assert!(text.contains("l_count{protocol=\"grpc\"} 1"), "{text}");
        // Its latency is the time to its head, not the hour.
        assert!(text.contains("d_sum{service=\"pkg.Feed\"} 0.02"), "{text}");
        // One message, then quiet for twice the long age: a stream too.
        let mut r = s
            .start(true, "/pkg.Feed/Watch", StreamProtocol::grpc)
            .expect("on");
        r.head(StatusCode::OK, &HeaderMap::new());
        tokio::time::advance(Duration::from_millis(30)).await;
        r.messages(1);
        tokio::time::advance(LONG * 2).await;
        drop(r);
        let (opened, text) = feed_figures(&m);
        assert_eq!(opened, 2, "{text}");
        assert!(text.contains("d_sum{service=\"pkg.Feed\"} 0.05"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_call_answers_at_its_end_and_stays_a_call() {
        let (m, s) = signals(10, false);
        // 40 s of work, then the head, the message and the trailers.
        let mut r = s
            .start(true, "/pkg.Feed/Compute", StreamProtocol::grpc)
            .expect("on");
        tokio::time::advance(Duration::from_secs(40)).await;
        r.head(StatusCode::OK, &HeaderMap::new());
        r.messages(1);
        let mut ok = HeaderMap::new();
        ok.insert("grpc-status", HeaderValue::from_static("0"));
        r.trailers(&ok);
        drop(r);
        // A call whose request was whole, never answered, however long: a
        // call (the limit: a server stream that never sent its head is one
        // too).
        let mut r = s
            .start(true, "/pkg.Feed/Compute", StreamProtocol::grpc)
            .expect("on");
        r.request_ended();
        tokio::time::advance(LONG * 3).await;
        drop(r);
        // Answered, quiet just under the long age: a call.
        let mut r = s
            .start(true, "/pkg.Feed/Compute", StreamProtocol::grpc)
            .expect("on");
        r.head(StatusCode::OK, &HeaderMap::new());
        tokio::time::advance(LONG - Duration::from_millis(1)).await;
        drop(r);
        let (opened, text) = feed_figures(&m);
        assert_eq!(opened, 0, "{text}");
        assert!(text.contains("d_count{service=\"pkg.Feed\"} 3"), "{text}");
        assert!(
            text.contains("d_sum{service=\"pkg.Feed\"} 79.999"),
            "{text}"
        );
    }

    /// The streams a one-histogram view could take for calls of their whole
    /// life, and the calls it could take for streams.
    #[tokio::test(start_paused = true)]
    async fn streams_that_waited_for_their_first_event_are_streams_and_calls_stay_calls() {
        let (m, s) = signals(10, false);
        let watch = || {
            s.start(true, "/pkg.Feed/Watch", StreamProtocol::grpc)
                .expect("on")
        };
        // Its head at once, its first event an hour later, then more: the
        // latency is the time to its head.
        let mut r = watch();
        tokio::time::advance(Duration::from_millis(20)).await;
        r.head(StatusCode::OK, &HeaderMap::new());
        tokio::time::advance(Duration::from_secs(3600)).await;
        r.messages(1);
        r.messages(2);
        drop(r);
        let (opened, text) = feed_figures(&m);
        assert_eq!(opened, 1, "{text}");
        assert!(text.contains("d_sum{service=\"pkg.Feed\"} 0.02"), "{text}");
        // A lazy head (grpc-go, grpc-java): head and first event together an
        // hour in, then a second event: a stream whose wait is no latency.
        let mut r = watch();
        tokio::time::advance(Duration::from_secs(3600)).await;
        r.head(StatusCode::OK, &HeaderMap::new());
        r.messages(1);
        r.messages(2);
        drop(r);
        // A bidi stream waiting on its client, never answered, ended after
        // twice the long age with the client's side still open.
        let r = watch();
        tokio::time::advance(LONG * 2).await;
        drop(r);
        let (opened, text) = feed_figures(&m);
        assert_eq!(opened, 3, "{text}");
        assert!(
            text.contains("d_count{service=\"pkg.Feed\"} 1"),
            "only the one with a prompt answer has a latency: {text}"
        );
        assert!(text.contains("d_sum{service=\"pkg.Feed\"} 0.02"), "{text}");
        assert!(text.contains("l_count{protocol=\"grpc\"} 3"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn long_bodies_and_calls_that_answered_early_and_failed_stay_calls() {
        let (m, s) = signals(10, false);
        // An HTTP download whose head came at once, its body for 40 s: the
        // guard counts no messages in it, so no silence can be told.
        let mut r = s.start(false, "/export", StreamProtocol::http).expect("on");
        r.head(StatusCode::OK, &HeaderMap::new());
        tokio::time::advance(Duration::from_secs(40)).await;
        drop(r);
        // A gRPC call that sent its headers early, then failed after 40 s
        // with no message.
        let mut r = s
            .start(true, "/pkg.Feed/Compute", StreamProtocol::grpc)
            .expect("on");
        r.head(StatusCode::OK, &HeaderMap::new());
        tokio::time::advance(Duration::from_secs(40)).await;
        let mut failed = HeaderMap::new();
        failed.insert("grpc-status", HeaderValue::from_static("13"));
        r.trailers(&failed);
        drop(r);
        // A call whose client was still sending (an upload) when it ended,
        // before the long age: a call.
        let r = s
            .start(true, "/pkg.Feed/Compute", StreamProtocol::grpc)
            .expect("on");
        tokio::time::advance(LONG / 2).await;
        drop(r);
        // A call that sent its headers early (grpc-go's SendHeader), worked
        // 40 s, then answered and ended: its head, a silence, one message
        // and the end at once, as a watch that got one event and ended
        // would; taken as the call, its whole duration kept.
        let mut r = s
            .start(true, "/pkg.Feed/Compute", StreamProtocol::grpc)
            .expect("on");
        r.request_ended();
        r.head(StatusCode::OK, &HeaderMap::new());
        tokio::time::advance(Duration::from_secs(40)).await;
        r.messages(1);
        let mut ok = HeaderMap::new();
        ok.insert("grpc-status", HeaderValue::from_static("0"));
        r.trailers(&ok);
        drop(r);
        let (opened, text) = feed_figures(&m);
        assert_eq!(opened, 0, "{text}");
        let http = ServiceKey {
            service: Arc::from(HTTP_SERVICE),
            method: None,
        };
        let opened_http = m
            .signals
            .streams_opened
            .get(&GuardStreamLabels {
                key: http,
                protocol: StreamProtocol::http,
            })
            .map_or(0, |c| c.get());
        assert_eq!(opened_http, 0, "{text}");
        assert!(text.contains("d_sum{service=\"http\"} 40.0"), "{text}");
        assert!(text.contains("d_sum{service=\"pkg.Feed\"} 85.0"), "{text}");
    }

    #[test]
    fn the_cap_sends_later_services_to_other() {
        let (m, s) = signals(2, false);
        for svc in ["a.A", "b.B", "c.C", "d.D", "a.A"] {
            drop(s.start(true, &format!("/{svc}/M"), StreamProtocol::grpc));
        }
        drop(s.start(true, "/not a path", StreamProtocol::grpc));
        // Requests that are not gRPC do not take a slot.
        drop(s.start(false, "/index.html", StreamProtocol::http));
        assert_eq!(count(&m, "a.A", None, Code::CANCELLED), 2);
        assert_eq!(count(&m, "b.B", None, Code::CANCELLED), 1);
        assert_eq!(count(&m, "c.C", None, Code::CANCELLED), 0);
        assert_eq!(count(&m, OTHER_SERVICE, None, Code::CANCELLED), 3);
        let seen = m.signals.services_seen.lock().expect("lock").len();
        assert_eq!(seen, 4, "a.A, b.B, other and http");
    }

    #[test]
    fn methods_are_labels_only_when_asked_and_count_against_the_cap() {
        let (m, s) = signals(2, true);
        for path in ["/a.A/One", "/a.A/Two", "/a.A/Three", "/a.A/One"] {
            drop(s.start(true, path, StreamProtocol::grpc));
        }
        assert_eq!(count(&m, "a.A", Some("One"), Code::CANCELLED), 2);
        assert_eq!(count(&m, "a.A", Some("Two"), Code::CANCELLED), 1);
        assert_eq!(
            count(&m, OTHER_SERVICE, Some(OTHER_SERVICE), Code::CANCELLED),
            1
        );
        let mut reg = prometheus_client::registry::Registry::default();
        reg.register("r", "r", m.signals.requests.clone());
        let text = crate::metrics::render(&reg);
        assert!(
            text.contains(
                "r_total{service=\"a.A\",method=\"One\",code=\"CANCELLED\",protocol=\"grpc\"} 2"
            ),
            "{text}"
        );
        let (m, s) = signals(2, false);
        drop(s.start(true, "/a.A/One", StreamProtocol::grpc));
        let mut reg = prometheus_client::registry::Registry::default();
        reg.register("r", "r", m.signals.requests.clone());
        let text = crate::metrics::render(&reg);
        assert!(!text.contains("method"), "{text}");
    }

    #[test]
    fn off_records_nothing() {
        let m = Metrics::new();
        let s = Signals::new(
            SignalSettings {
                enabled: false,
                ..SignalSettings::default()
            },
            LONG,
            m.clone(),
        );
        assert!(s.start(true, "/a.A/B", StreamProtocol::grpc).is_none());
        assert!(m.signals.services_seen.lock().expect("lock").is_empty());
    }
}
