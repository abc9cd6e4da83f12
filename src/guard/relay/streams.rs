//! The relay's stream store: each relayed [`Stream`], the state of a
//! stream being ended ([`Ending`], [`Cancelled`], a message [`Held`] after
//! the cancel), the graceful ends not written yet ([`Unwritten`]), and the
//! [`Barrier`] their ends wait for ([`Endings`]). How they move is
//! `stream_end`'s: docs/design.md, "How a gRPC stream ends".

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use bytes::BytesMut;
use tokio::time::Instant;

use super::cadence::Cadence;
use super::wire;
use crate::guard::body::{BodyKind, Boundaries};
use crate::guard::registry::{EndQueue, Registered};
use crate::guard::signals;
use crate::metrics::{Reason, StreamProtocol};

/// Most bytes of one message held back after the cancel (gRPC's default
/// largest message is 4 MiB; the application's stream window bounds it
/// too). A message past it goes on as it comes, and if the application's
/// stack cuts it short the stream is reset, as no end can be whole.
pub(super) const HOLD_MAX: usize = 4 << 20;
/// The least time the application gets to ack the barrier after a cancel,
/// however late in its bound the cancel went: an app frozen by its CPU
/// quota or a GC pause for up to this long still confirms its end.
/// Two round trips to an app that reads its socket every 500 ms take up to
/// about 1.5 s. (A quiet stream asked at the drain's sweep, 6 s before the
/// deadline, is cancelled 4 s later: its end comes by the deadline.)
pub(super) const ACK_MIN: std::time::Duration = std::time::Duration::from_secs(2);
/// Streams the guard ended remembered, so DATA the application still sends
/// on one is counted as dropped (not taken for a stream the client reset).
pub(super) const ENDED_KEPT: usize = 1024;

/// One relayed stream.
pub(super) struct Stream {
    /// Its entry in the guard's registry (dropped: removed).
    pub(super) reg: Registered,
    /// The request's kind, by its content type.
    pub(super) kind: BodyKind,
    /// The response's boundaries, once its head arrived.
    pub(super) bounds: Option<Boundaries>,
    /// The client ended its request (END_STREAM).
    pub(super) req_done: bool,
    /// The application ended its response (END_STREAM).
    pub(super) resp_done: bool,
    pub(super) started: Instant,
    /// Response messages (or events) so far.
    pub(super) messages: u64,
    /// When the application sends data on it.
    pub(super) cadence: Cadence,
    pub(super) ending: Option<Ending>,
    pub(super) sig: Option<signals::Request>,
    /// The client's window for this stream's response data, and since when
    /// it has been shut (the client takes nothing: `write_stall_timeout`).
    pub(super) window: i64,
    pub(super) shut_since: Option<Instant>,
    /// A message of its response spanned DATA frames: one could be half
    /// on its way when the application reads a cancel.
    pub(super) split: bool,
    /// With a content-length, the bytes of the request still to come: its
    /// DATA must add up to it (RFC 9113 §8.1.1).
    pub(super) body_left: Option<u64>,
    /// A message begun after the guard's cancel, held until it is whole.
    pub(super) held: Option<Held>,
}

impl Stream {
    pub(super) fn answered(&self) -> bool {
        self.bounds.is_some()
    }

    pub(super) fn at_boundary(&self) -> bool {
        self.bounds.as_ref().is_some_and(Boundaries::at_boundary)
    }

    pub(super) fn endable(&self) -> bool {
        self.bounds.as_ref().is_some_and(Boundaries::endable)
    }

    pub(super) fn grpc(&self) -> bool {
        self.reg.ctl.grpc
    }

    pub(super) fn protocol(&self) -> StreamProtocol {
        if self.grpc() {
            StreamProtocol::grpc
        } else {
            StreamProtocol::http
        }
    }
}

/// A stream being ended, and how far it got.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ending {
    pub(super) reason: Reason,
    /// When the end was asked: `end_timeout` counts from here.
    pub(super) asked: Instant,
    /// At a boundary: the cancel goes then, unless data comes first.
    pub(super) quiet_at: Option<Instant>,
    /// Past `end_timeout` mid-message: the next boundary ends it, but no
    /// later than this.
    pub(super) forced_by: Option<Instant>,
    /// The stream was quiet when asked: its end may meet its next message
    /// at any moment.
    pub(super) quiet: bool,
    /// Waiting `end_settle` for a write that would time the end: if none
    /// comes, the end begins at a moment nothing timed (counted).
    pub(super) settling: bool,
    /// RST_STREAM(CANCEL) went to the application, the barrier behind it.
    pub(super) cancelled: Option<Cancelled>,
}

/// The cancel of a stream being ended, and what the client's end waits for.
#[derive(Clone, Copy, Debug)]
pub(super) struct Cancelled {
    /// The barrier round trip whose ack follows all the application wrote
    /// before it read the cancel.
    pub(super) barrier: u64,
    /// The ending's bound: past it the end goes out unconfirmed.
    pub(super) by: Instant,
    /// The barrier was acked (the end may still wait for the client's
    /// stream window: gRPC-Web's trailer frame is DATA).
    pub(super) acked: bool,
}

/// A message the application began after the guard's cancel: its DATA
/// frames, held back until it is whole. Its stack may cut it short once it
/// reads the cancel; then it is dropped (counted), and the client's end
/// comes at the boundary before it.
#[derive(Debug)]
pub(super) struct Held {
    /// Its DATA frames, as they came.
    pub(super) frames: BytesMut,
    /// Their length as flow control counts it (padding too).
    pub(super) window: usize,
    /// The response's boundaries before it began.
    pub(super) from: Boundaries,
}

impl Held {
    /// A message begins at `from`.
    pub(super) fn new(from: Boundaries) -> Self {
        Self {
            frames: BytesMut::new(),
            window: 0,
            from,
        }
    }

    /// One more DATA frame of it, which took `window` of flow control.
    pub(super) fn push(&mut self, window: usize, frame: &[u8]) {
        self.frames.extend_from_slice(frame);
        self.window += window;
    }

    /// Whether it may grow no more.
    pub(super) fn full(&self) -> bool {
        self.frames.len() >= HOLD_MAX
    }
}

/// A stream the guard ended gracefully, its end queued to the client: it
/// counts as graceful once that end has been written, and as cut if the
/// connection closes first. Its registry entry stays until then, so a
/// drain waits for it.
pub(super) struct Unwritten {
    pub(super) id: u32,
    pub(super) reason: Reason,
    pub(super) stream: Stream,
}

impl std::fmt::Debug for Unwritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unwritten")
            .field("id", &self.id)
            .field("reason", &self.reason)
            .finish_non_exhaustive()
    }
}

/// The streams of a connection being ended, and what their ends wait for.
#[derive(Debug, Default)]
pub(super) struct Endings {
    /// Where the registry puts the ids of this connection's streams a
    /// drain or the max age asks to end.
    pub(super) queue: Arc<EndQueue>,
    /// Streams being ended.
    pub(super) asked: Vec<u32>,
    /// Streams whose client window was shut (some may have opened since):
    /// a set, so a client that opens and shuts a window by the byte keeps
    /// one entry per stream.
    pub(super) stalled: BTreeSet<u32>,
    /// The barrier on the application connection (SETTINGS round trips).
    pub(super) barrier: Barrier,
    /// Graceful ends not written to the client yet.
    pub(super) unwritten: Vec<Unwritten>,
    /// Streams the guard ended lately while the application's side was
    /// open (the last [`ENDED_KEPT`]).
    pub(super) ended: VecDeque<u32>,
    /// Bytes held in every stream's [`Held`]: the application is not read
    /// while they reach [`HOLD_MAX`].
    pub(super) held: usize,
    /// The client's write buffer as `settle_written` last looked
    /// ([`super::window::Window::drained`]).
    pub(super) settled: Option<u64>,
}

/// The barrier on the application connection: round trips of empty
/// SETTINGS frames, one in flight at a time, shared by every stream waiting
/// for one. A SETTINGS ack, like a PING ack, follows what the application
/// had written before it, but an application's HTTP/2 stack may write an
/// ack ahead of DATA it already queued (h2 does, so a tonic app under load
/// did, and a message was lost); it writes that DATA before it has even
/// read the next frame. So a stream waits for two round trips, the second
/// sent on the first one's ack.
///
/// SETTINGS, not PING: every gRPC server counts a PING that comes less than
/// five minutes after the last one, with no DATA or HEADERS written since,
/// as a strike, and closes the connection at the third (grpc-go, grpc-java,
/// C-core: GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings")). A quiet stream's
/// ending would spend that budget at once. No server limits SETTINGS so
/// (RFC 9113 §6.5: an empty SETTINGS frame changes nothing and must be
/// acked), and the acks come in order, in the queue of what the relay sent
/// (`Settings::sent`). The guard sends no PING to the application.
#[derive(Debug, Default)]
pub(super) struct Barrier {
    /// Round trips started, and the highest one acked.
    pub(super) sent: u64,
    pub(super) acked: u64,
    /// The highest round trip a waiting stream needs acked; another is
    /// started on each ack until it has been.
    pub(super) wanted: u64,
    /// When the last one started: one started in the same turn as a
    /// stream's ask counts as started after it.
    pub(super) started_at: Option<Instant>,
    /// An ack came in the read being handled: the endings move on once all
    /// of that read is (a frame behind the ack is forwarded first).
    pub(super) moved: bool,
}

/// The streams whose end (a frame with END_STREAM) still waits in `buf`,
/// which holds whole frames, with where in `buf` each end's frame ends.
pub(super) fn ends_in(buf: &[u8]) -> Vec<(u32, usize)> {
    let mut ends = Vec::new();
    let mut at = 0;
    while let Some(h) = wire::head(&buf[at..]) {
        at += wire::FRAME_HEADER + h.len;
        if at > buf.len() {
            break;
        }
        if matches!(h.kind, wire::HEADERS | wire::DATA) && h.flags & wire::END_STREAM != 0 {
            ends.push((h.id, at));
        }
    }
    ends
}
