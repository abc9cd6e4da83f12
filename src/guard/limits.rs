//! Resource limits of the stream guard, with defaults an SRE can leave alone.
//!
//! Every limit bounds either memory (windows, buffers, header sizes), time
//! (slow or idle peers, endings that cannot reach a safe point), or how much
//! one client can take from everyone else (concurrent streams, resets).

use std::time::Duration;

/// Default for [`Limits::max_connections`]. Behind Envoy the guard sees one
/// connection per Envoy worker plus a health check now and then, but each
/// WebSocket (an HTTP/1.1 upgrade) takes one: twice the 1,024 that Envoy's
/// default circuit breaker lets a cluster open, so a pod can take a drained
/// neighbour's WebSockets on top of its own (512 could not, and the rest
/// went around the guard). Sized with [`DEFAULT_MAX_STREAMS`] so the shim's
/// peak stays under its 128 MiB container limit under every attack in
/// tests/it/guard_abuse/ (2,048 connections with a stream each: 62 MiB).
pub const DEFAULT_MAX_CONNECTIONS: usize = 2048;
/// Default for [`Limits::max_streams`]. An idle stream costs the guard about
/// 6 KiB (docs/benchmarks.md); a stream whose client opened its windows and
/// never reads holds up to one send buffer (16 KiB) more. Measured
/// (tests/it/guard_abuse/caps.rs): 10,000 such streams took the shim to 111-128 MiB,
/// its whole 128 MiB container limit; 5,000 keep it well below.
pub const DEFAULT_MAX_STREAMS: usize = 5_000;
/// Default for [`Limits::max_concurrent_streams`].
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 1_000;
/// Default for [`Limits::max_header_list_size`]: Envoy's own default is 60 KiB,
/// so anything Envoy forwards fits.
pub const DEFAULT_MAX_HEADER_LIST_SIZE: u32 = 64 * 1024;
/// Default for [`Limits::header_read_timeout`].
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default for [`Limits::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Default for [`BufferLimits::stream_window`]: large enough that one stream is not
/// latency-bound on a pod-local hop, small enough that 1,000 streams fit in memory.
pub const DEFAULT_STREAM_WINDOW: u32 = 256 * 1024;
/// Default for [`BufferLimits::connection_window`].
pub const DEFAULT_CONNECTION_WINDOW: u32 = 4 * 1024 * 1024;
/// Default for [`BufferLimits::max_send_buffer_size`]: one default-size DATA frame
/// (SETTINGS_MAX_FRAME_SIZE is 16 KiB). A peer that opens its windows wide
/// and never reads holds this much per stream, so a connection holds at most
/// 1,000 x 16 KiB = 16 MiB (256 KiB per stream made that 256 MiB); on a
/// pod-local hop a frame in flight per stream is enough to keep a stream busy.
pub const DEFAULT_MAX_SEND_BUFFER_SIZE: usize = 16 * 1024;
/// Default for [`BufferLimits::max_h1_buf_size`]: hyper's minimum is 8 KiB.
pub const DEFAULT_MAX_H1_BUF_SIZE: usize = 64 * 1024;
/// Default for [`Limits::goaway_ack_timeout`].
pub const DEFAULT_GOAWAY_ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// Default for [`Limits::end_timeout`].
pub const DEFAULT_END_TIMEOUT: Duration = Duration::from_secs(5);
/// Default for [`Limits::end_settle`].
pub const DEFAULT_END_SETTLE: Duration = Duration::from_secs(4);
/// Default for [`Limits::shutdown_timeout`].
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Default for [`Limits::upstream_connect_timeout`].
pub const DEFAULT_UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default for [`Limits::max_pending_accept_reset_streams`]. The h2 crate's
/// default (20) is made for a connection per client; behind Envoy one
/// connection carries a whole worker's callers, and one caller's burst of
/// cancelled requests would tear it down for everyone (the relay's `rapid`
/// module counts them).
pub const DEFAULT_MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 1_000;

/// Limits applied to every connection the guard accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, whoever opened them; one more is closed as
    /// soon as it is accepted (Envoy retries it elsewhere: on the app, when
    /// it fails open). Bounds the process, not just each connection.
    pub max_connections: usize,
    /// Streams (and HTTP/1.1 requests) open at once over all connections;
    /// one more is refused before it reaches the app: REFUSED_STREAM on
    /// HTTP/2, 503 with Retry-After on HTTP/1.1, both safe to retry.
    pub max_streams: usize,
    /// Per-connection rates of PING, SETTINGS and RST_STREAM frames
    /// (the relay's `flood` module); a faster peer is slowed down, not closed.
    pub flood: FloodLimits,
    /// Streams one client may have open on one connection (HTTP/2
    /// SETTINGS_MAX_CONCURRENT_STREAMS); more are refused, so one caller
    /// cannot pin every upstream slot.
    pub max_concurrent_streams: u32,
    /// Largest request (and upstream response) header block, decoded; a larger
    /// one gets 431 or is refused, so headers cannot exhaust memory.
    pub max_header_list_size: u32,
    /// From accept until the first request head is complete (HTTP/1.1: every
    /// request head; HTTP/2: preface, SETTINGS and the first HEADERS); defeats
    /// slowloris clients that trickle bytes.
    pub header_read_timeout: Duration,
    /// An HTTP/2 connection with no open stream for this long is closed with
    /// GOAWAY, so abandoned connections do not accumulate.
    pub idle_timeout: Duration,
    /// What one stream or connection can make the guard hold in memory.
    pub buffers: BufferLimits,
    /// How long to wait for the PING ack after GOAWAY(2^31-1) before moving
    /// on, so a peer that never answers cannot hold the connection's end.
    pub goaway_ack_timeout: Duration,
    /// How long a stream being ended may take to reach a safe end point (a
    /// gRPC message boundary, or the natural end of a non-gRPC body) before it
    /// is reset instead; bounds endings against stalled upstreams and clients.
    pub end_timeout: Duration,
    /// An ending that finds the application quiet, with no learned cadence
    /// to time it by (or its next write due soon), waits up to this long for
    /// its next write, forwards it, and ends in the pause right after it: a
    /// producer that writes at least this often is then between writes when
    /// the cancel reaches it, so nothing it handed to its transport is lost.
    /// Ending at a moment no write timed instead may meet a write on its way
    /// (counted in `drainshim_streams_blind_ended_total`). Streams with a
    /// cadence end at their own slot, so waiting here does not bunch them;
    /// below `end_timeout`, which bounds the whole ending.
    pub end_settle: Duration,
    /// How long a connection that has nothing left to serve is still polled
    /// (to flush trailers and GOAWAY) before it is dropped.
    pub shutdown_timeout: Duration,
    /// Connecting to the upstream (the application); it is on the same pod,
    /// so a slow connect means it is not listening.
    pub upstream_connect_timeout: Duration,
    /// Streams a client may open and reset before the guard accepts them
    /// (rapid reset, CVE-2023-44487; the relay's `rapid` module).
    pub max_pending_accept_reset_streams: usize,
    /// A stream whose client takes no response data for this long (its
    /// window stays shut) is reset, so a peer that stopped reading does not
    /// hold the stream and its buffers until max age.
    pub write_stall_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_streams: DEFAULT_MAX_STREAMS,
            flood: DEFAULT_FLOOD_LIMITS,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            max_header_list_size: DEFAULT_MAX_HEADER_LIST_SIZE,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            buffers: DEFAULT_BUFFER_LIMITS,
            goaway_ack_timeout: DEFAULT_GOAWAY_ACK_TIMEOUT,
            end_timeout: DEFAULT_END_TIMEOUT,
            end_settle: DEFAULT_END_SETTLE,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            upstream_connect_timeout: DEFAULT_UPSTREAM_CONNECT_TIMEOUT,
            max_pending_accept_reset_streams: DEFAULT_MAX_PENDING_ACCEPT_RESET_STREAMS,
            write_stall_timeout: crate::config::DEFAULT_WRITE_STALL_TIMEOUT.get(),
        }
    }
}

/// The windows and buffers that bound what the guard holds for one stream
/// or one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferLimits {
    /// Per-stream flow-control window, both directions; bounds what one
    /// stream can make the guard buffer.
    pub stream_window: u32,
    /// Per-connection flow-control window, both directions; bounds what one
    /// connection can make the guard buffer in total.
    pub connection_window: u32,
    /// The per-stream allowance the guard's abuse test holds a never-reading
    /// client to (`tests/it/guard_abuse/slow_readers.rs`: times `max_concurrent_streams`,
    /// plus the connection window). No relay code reads it: the relay bounds
    /// what it holds for the client by the flow-control windows and the
    /// high-water mark of its queue to the client (`relay/flow.rs`).
    pub max_send_buffer_size: usize,
    /// Largest HTTP/1.1 read buffer (request head included); a bigger head is
    /// rejected with 431.
    pub max_h1_buf_size: usize,
}

/// The defaults: each bound's constant above.
pub const DEFAULT_BUFFER_LIMITS: BufferLimits = BufferLimits {
    stream_window: DEFAULT_STREAM_WINDOW,
    connection_window: DEFAULT_CONNECTION_WINDOW,
    max_send_buffer_size: DEFAULT_MAX_SEND_BUFFER_SIZE,
    max_h1_buf_size: DEFAULT_MAX_H1_BUF_SIZE,
};

/// A token bucket: `rate` per second, up to `burst` saved up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub per_second: u32,
    pub burst: u32,
}

/// Per-connection rates of the control frames a client sends outside any
/// stream (PING, SETTINGS) and of its RST_STREAMs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FloodLimits {
    pub ping: Rate,
    pub settings: Rate,
    pub rst_stream: Rate,
}

/// The defaults, and why they never trip for Envoy: see the relay's `flood`
/// module.
pub const DEFAULT_FLOOD_LIMITS: FloodLimits = FloodLimits {
    ping: Rate {
        per_second: 100,
        burst: 1_000,
    },
    settings: Rate {
        per_second: 10,
        burst: 100,
    },
    rst_stream: Rate {
        per_second: 1_000,
        burst: 10_000,
    },
};
