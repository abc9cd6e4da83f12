//! The signals' unit tests: codes, services and the cap, and what is a
//! stream and what a call (a paused clock).

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
