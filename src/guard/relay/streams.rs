//! The relay's stream store: each relayed [`Stream`]. How a stream being
//! ended moves is the `ending` module's (its state is in `ending::state`).

use tokio::time::Instant;

use super::ending::cadence::Cadence;
use super::ending::state::{Ending, Held};
use crate::guard::body::{BodyKind, Boundaries};
use crate::guard::registry::Registered;
use crate::guard::signals;
use crate::metrics::StreamProtocol;

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
