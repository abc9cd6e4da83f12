//! Names (after the `drainshim_` prefix) and help texts: of the families in
//! `families::FAMILIES`, which `Metrics::register` and node mode's per-pod
//! collector both read, and of `SidecarMetrics`.

pub const DRAINS: (&str, &str) = ("drains", "Drains finished, by outcome");
pub const DRAINED_CONNECTIONS: (&str, &str) = (
    "drained_connections",
    "Inbound connections seen by drains, by how they ended",
);
pub const DRAINED_STREAMS: (&str, &str) = (
    "drained_streams",
    "Inbound streams seen by drains, by how they ended",
);
pub const DRAIN_DURATION: (&str, &str) = (
    "drain_duration_seconds",
    "How long drains took, trigger to report",
);
pub const DRAINING: (&str, &str) = ("draining", "1 while a drain is running");
pub const ENVOY_ACTIVE_CONNECTIONS: (&str, &str) = (
    "envoy_active_connections",
    "Active downstream connections on Envoy's inbound listeners",
);
pub const ENVOY_ACTIVE_STREAMS: (&str, &str) = (
    "envoy_active_streams",
    "Active downstream requests (streams) on Envoy's inbound HTTP connection managers",
);
pub const FAILOPEN_ACTIVE: (&str, &str) = (
    "failopen_active",
    "Requests and connections Envoy has active on the fail-open path (the app reached directly while the stream guard was down): no drain can end them gracefully",
);
pub const GUARD_PATHS: (&str, &str) = (
    "guard_paths",
    "Envoy clusters that send to the stream guard first, with the app as fallback, as last polled; 0 while a guard runs means its pod's traffic goes around it",
);
pub const PROXY_INFO: (&str, &str) = ("proxy_info", "The proxy's identity and version; always 1");
pub const GOAWAYS: (&str, &str) = (
    "goaways",
    "GOAWAY sequences the stream guard started, by reason",
);
pub const STREAMS_TERMINATED: (&str, &str) = (
    "streams_terminated",
    "Streams the stream guard ended gracefully, by reason and protocol",
);
pub const STREAMS_UNGRACEFUL: (&str, &str) = (
    "streams_ungraceful",
    "Streams the stream guard had to close without an in-protocol goodbye (an upgrade it cannot end gracefully, an ending that found no safe point in time, or one whose trailers never left before the connection closed), or ended without the application's confirmation that nothing was still on its way (the barrier not acked within end_timeout), by reason and protocol",
);
/// Contract extension (guard): see `guard::relay::ending`.
pub const STREAMS_BLIND_ENDED: (&str, &str) = (
    "streams_blind_ended",
    "Stream endings the stream guard had to begin at a moment no write of the application timed (quiet for all of end_settle, 4 s, with no learned cadence): a message the application handed its transport at that very instant would be lost. 0 for streams that write at least every 4 s; silent streams count here",
);
/// Contract extension (guard): see `guard::relay::ends`.
pub const STREAM_DATA_DROPPED: (&str, &str) = (
    "stream_data_dropped",
    "DATA frames the application sent that the stream guard dropped, by reason: after_end (the guard had already ended the stream to the client: its ending's barrier was not acked within end_timeout, or it was reset), partial_message (the start of a message the application's stack cut short after reading the guard's cancel). 0 is the promise: each is a message the client never got",
);
/// Contract extension (guard): the bytes of `STREAM_DATA_DROPPED`.
pub const STREAM_DATA_DROPPED_BYTES: (&str, &str) = (
    "stream_data_dropped_bytes",
    "Bytes of the DATA frames counted in drainshim_stream_data_dropped_total, by reason",
);
pub const ENVOY_CONFIG_UPDATES: (&str, &str) = (
    "envoy_config_updates",
    "xDS updates by resource and result, per Envoy version (mirrored from Envoy)",
);
pub const ENVOY_UPSTREAM_RETRIES: (&str, &str) = (
    "envoy_upstream_retries",
    "Upstream request retries, per Envoy version (mirrored from Envoy)",
);
/// Contract extension (sidecar): see `recovery`.
pub const ENVOY_STUCK_DRAINING: (&str, &str) = (
    "envoy_stuck_draining",
    "1 while Envoy has stopped listeners outside a drain of this shim: the pod can no longer serve and must be replaced",
);
/// Contract extension (sidecar): see `recovery`.
pub const ENVOY_RECOVERIES: (&str, &str) = (
    "envoy_recoveries",
    "Times the shim restored Envoy's health check left failed by an earlier drain (listeners still up)",
);
/// Contract extension: see `control::listener_drains`.
pub const ENVOY_LISTENER_DRAINS: (&str, &str) = (
    "envoy_listener_drains",
    "Listener drains Envoy began after a config update (LDS replaced or removed a listener: kind listener; changed filter chains in place: kind filter_chains), not the pod's own drain; Envoy closes what is left on them after its --drain-time-s",
);
/// Contract extension: see `control::listener_drains`.
pub const ENVOY_LISTENERS_DRAINING: (&str, &str) = (
    "envoy_listeners_draining",
    "Listeners (kind listener) and filter chains (kind filter_chains) Envoy is draining after config updates, as of the shim's last look",
);
/// Contract extension (guard): see `guard::limits`.
pub const GUARD_LIMITED: (&str, &str) = (
    "guard_limited",
    "Stream guard limits at work: connections closed at accept, streams refused (retryably), and connection reads paused by a PING, SETTINGS or RST_STREAM rate limit",
);
/// Contract extension (guard): see `guard::relay`'s barrier.
pub const GUARD_APP_GOAWAYS: (&str, &str) = (
    "guard_app_goaways",
    "GOAWAY frames the applications sent the stream guard, by HTTP/2 error code: NO_ERROR is an app's graceful stop; any other code means the app closed the guard's connection over an error (ENHANCE_YOUR_CALM: it found the guard's frames abusive, for example too many PINGs)",
);
pub const ENVOY_DOWNSTREAM_REQUESTS: (&str, &str) = (
    "envoy_downstream_requests",
    "Requests callers sent to Envoy's inbound listeners, per Envoy version (mirrored from Envoy): the callers' load, which no retry policy changes",
);
pub const GUARD_REQUESTS: (&str, &str) = (
    "guard_requests",
    "Requests the stream guard proxied to the application, by service, outcome (gRPC status name or HTTP status class) and protocol; streams the guard ended itself are not counted here but in streams_terminated and streams_ungraceful",
);
pub const GUARD_REQUEST_DURATION: (&str, &str) = (
    "guard_request_duration_seconds",
    "Request latency at the stream guard, by service: to the end of the response, or for streams to their first message",
);
pub const GUARD_STREAMS_OPENED: (&str, &str) = (
    "guard_streams_opened",
    "Streams opened through the stream guard (responses with a second message or event, HTTP/1.1 responses of unknown length, WebSocket upgrades), by service and protocol",
);
pub const GUARD_STREAM_LIFETIME: (&str, &str) = (
    "guard_stream_lifetime_seconds",
    "How long streams through the stream guard lived, request to end, by protocol",
);
/// Contract extension (guard): what `plan` reads for the connection
/// lifetime step.
pub const GUARD_MAX_CONNECTION_AGE: (&str, &str) = (
    "guard_max_connection_age_seconds",
    "The stream guard's maximum connection age (--max-connection-age), whole seconds; 0 when connections may live forever",
);
/// Contract extension (guard): whether `plan`'s drain-timers step can see
/// the pod's calls.
pub const GUARD_REQUEST_METRICS: (&str, &str) = (
    "guard_request_metrics",
    "1 when the stream guard records every request's signals (drainshim_guard_requests_total, request durations, streams), 0 when --guard-request-metrics is off",
);
/// Contract extension: what `plan`'s drain-timers step reads.
pub const DRAIN_TIMER: (&str, &str) = (
    "drain_timer_seconds",
    "The drain timers this proxy runs with, in seconds: deregistration_delay, min_drain_time, drain_time, parent_shutdown_time, and termination_grace_period when known",
);
pub const TCP_RESETS: (&str, &str) = (
    "tcp_resets",
    "TCP resets and aborts counted by the kernel in the pod's network namespace",
);
