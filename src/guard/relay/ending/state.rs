//! The state of the streams being ended ([`EndProgress`], [`Cancelled`], a
//! message [`Held`] after the cancel), the [`Barrier`] their ends wait
//! for, and the ends a connection planned for itself ([`Planned`]); all in
//! [`Endings`]. (The graceful ends not written yet are the stream store's.)

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use bytes::BytesMut;
use tokio::time::Instant;

use crate::guard::body::Boundaries;
use crate::guard::registry::{EndQueue, StreamCtl};
use crate::guard::relay::wire;
use crate::metrics::Reason;

/// Most bytes of one message held back after the cancel (gRPC's default
/// largest message is 4 MiB; the application's stream window bounds it
/// too). A message past it goes on as it comes, and if the application's
/// stack cuts it short the stream is reset, as no end can be whole.
pub(in crate::guard::relay) const HOLD_MAX: usize = 4 << 20;
/// The least time the application gets to ack the barrier after a cancel,
/// however late in its bound the cancel went: an app frozen by its CPU
/// quota or a GC pause for up to this long still confirms its end.
/// Two round trips to an app that reads its socket every 500 ms take up to
/// about 1.5 s. (A quiet stream asked at the drain's sweep, 6 s before the
/// deadline, is cancelled 4 s later: its end comes by the deadline.)
pub(in crate::guard::relay) const ACK_MIN: std::time::Duration = std::time::Duration::from_secs(2);
/// Streams the guard ended remembered, so DATA the application still sends
/// on one is counted as dropped (not taken for a stream the client reset).
pub(in crate::guard::relay) const ENDED_KEPT: usize = 1024;

/// A stream being ended, and how far it got.
#[derive(Clone, Copy, Debug)]
pub(in crate::guard::relay) struct EndProgress {
    pub(in crate::guard::relay) reason: Reason,
    /// When the end was asked: `end_timeout` counts from here.
    pub(in crate::guard::relay) asked: Instant,
    /// At a boundary: the cancel goes then, unless data comes first.
    pub(in crate::guard::relay) quiet_at: Option<Instant>,
    /// Past `end_timeout` mid-message: the next boundary ends it, but no
    /// later than this.
    pub(in crate::guard::relay) forced_by: Option<Instant>,
    /// The stream was quiet when asked: its end may meet its next message
    /// at any moment.
    pub(in crate::guard::relay) quiet: bool,
    /// Waiting `end_settle` for a write that would time the end: if none
    /// comes, the end begins at a moment nothing timed (counted).
    pub(in crate::guard::relay) settling: bool,
    /// RST_STREAM(CANCEL) went to the application, the barrier behind it.
    pub(in crate::guard::relay) cancelled: Option<Cancelled>,
}

/// The cancel of a stream being ended, and what the client's end waits for.
#[derive(Clone, Copy, Debug)]
pub(in crate::guard::relay) struct Cancelled {
    /// The barrier round trip whose ack follows all the application wrote
    /// before it read the cancel.
    pub(in crate::guard::relay) barrier: u64,
    /// The ending's bound: past it the end goes out unconfirmed.
    pub(in crate::guard::relay) by: Instant,
    /// The barrier was acked (the end may still wait for the client's
    /// stream window: gRPC-Web's trailer frame is DATA).
    pub(in crate::guard::relay) acked: bool,
}

/// A message the application began after the guard's cancel: its DATA
/// frames, held back until it is whole. Its stack may cut it short once it
/// reads the cancel; then it is dropped (counted), and the client's end
/// comes at the boundary before it.
#[derive(Debug)]
pub(in crate::guard::relay) struct Held {
    /// Its DATA frames, as they came.
    pub(in crate::guard::relay) frames: BytesMut,
    /// Their length as flow control counts it (padding too).
    pub(in crate::guard::relay) window: usize,
    /// The response's boundaries before it began.
    pub(in crate::guard::relay) from: Boundaries,
}

impl Held {
    /// A message begins at `from`.
    pub(in crate::guard::relay) fn new(from: Boundaries) -> Self {
        Self {
            frames: BytesMut::new(),
            window: 0,
            from,
        }
    }

    /// One more DATA frame of it, which took `window` of flow control.
    pub(in crate::guard::relay) fn push(&mut self, window: usize, frame: &[u8]) {
        self.frames.extend_from_slice(frame);
        self.window += window;
    }

    /// Whether it may grow no more.
    pub(in crate::guard::relay) fn full(&self) -> bool {
        self.frames.len() >= HOLD_MAX
    }
}

/// The streams of a connection being ended, and what their ends wait for.
#[derive(Debug, Default)]
pub(in crate::guard::relay) struct Endings {
    /// Where the registry puts the ids of this connection's streams a
    /// drain or the max age asks to end.
    pub(in crate::guard::relay) queue: Arc<EndQueue>,
    /// Streams being ended.
    pub(in crate::guard::relay) asked: Vec<u32>,
    /// Streams whose client window was shut (some may have opened since):
    /// a set, so a client that opens and shuts a window by the byte keeps
    /// one entry per stream.
    pub(in crate::guard::relay) stalled: BTreeSet<u32>,
    /// The barrier on the application connection (SETTINGS round trips).
    pub(in crate::guard::relay) barrier: Barrier,
    /// Streams the guard ended lately while the application's side was
    /// open (the last [`ENDED_KEPT`]).
    pub(in crate::guard::relay) ended: VecDeque<u32>,
    /// The client's write buffer as `settle_written` last looked
    /// ([`super::window::Window::drained`]).
    pub(in crate::guard::relay) settled: Option<u64>,
    /// Ends this connection planned for itself (its max age, the app's
    /// GOAWAY), spread over a window, soonest first: asked by the relay's
    /// own timer when due.
    pub(in crate::guard::relay) planned: VecDeque<Planned>,
}

impl Endings {
    /// Only streams `still_shut` (open, their client window still shut)
    /// keep a stall timer: the set never outgrows the table, whether or not
    /// a timer ran since.
    pub(in crate::guard::relay) fn prune_stalled(&mut self, still_shut: impl Fn(u32) -> bool) {
        self.stalled.retain(|&id| still_shut(id));
    }

    /// Whether a stream's ending waits for the barrier's ack: the
    /// application is then read even while the client is backed up.
    pub(in crate::guard::relay) fn awaits_ack(&self) -> bool {
        self.barrier.acked < self.barrier.wanted
    }
}

/// An end the connection planned for one of its streams.
#[derive(Debug)]
pub(in crate::guard::relay) struct Planned {
    pub(in crate::guard::relay) at: Instant,
    pub(in crate::guard::relay) ctl: Arc<StreamCtl>,
    pub(in crate::guard::relay) reason: Reason,
}

/// The barrier on the application connection: round trips of empty
/// SETTINGS frames, one in flight at a time, shared by every stream waiting
/// for one. A SETTINGS ack, like a PING ack, follows what the application
/// had written before it, but an application's HTTP/2 stack may write an
/// ack ahead of DATA it already queued (h2 does, so a tonic app under load
/// did, and a message was lost); it writes that DATA before it has even
/// read the next frame. So a stream waits for two round trips begun after
/// its cancel was written (a stream cancelled while one is in flight waits
/// for the next two), the second
/// sent on the first one's ack.
///
/// SETTINGS, not PING: every gRPC server counts a PING that comes less than
/// five minutes after the last one, with no DATA or HEADERS written since,
/// as a strike, and closes the connection at the third (grpc-go, grpc-java,
/// C-core: GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings")). A quiet stream's
/// ending would spend that budget at once. No server limits SETTINGS so
/// (RFC 9113 §6.5: an empty SETTINGS frame changes nothing and must be
/// acked), and the acks come in order, in the queue of what the relay sent
/// (`PeerSettings::sent`). The guard sends no PING to the application.
#[derive(Debug, Default)]
pub(in crate::guard::relay) struct Barrier {
    /// Round trips started, and the highest one acked.
    pub(in crate::guard::relay) sent: u64,
    pub(in crate::guard::relay) acked: u64,
    /// The highest round trip a waiting stream needs acked; another is
    /// started on each ack until it has been.
    pub(in crate::guard::relay) wanted: u64,
    /// An ack came in the read being handled: the endings move on once all
    /// of that read is (a frame behind the ack is forwarded first).
    pub(in crate::guard::relay) moved: bool,
}

/// At the close, where each graceful end still queued lies (before the
/// window's cut and the last flush): those these do not get out are cut.
#[derive(Debug)]
pub(in crate::guard::relay) struct ClosingEnds {
    /// Where the first whole frame of the client's write buffer starts.
    pub(in crate::guard::relay) front: usize,
    /// Each end queued from there, with where its frame ends.
    pub(in crate::guard::relay) ends: Vec<(u32, usize)>,
    /// The end a write stopped inside, before `front`.
    pub(in crate::guard::relay) partial: Option<u32>,
}

/// The streams whose end (a frame with END_STREAM) still waits in `buf`,
/// which holds whole frames, with where in `buf` each end's frame ends.
pub(in crate::guard::relay) fn ends_in(buf: &[u8]) -> Vec<(u32, usize)> {
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
