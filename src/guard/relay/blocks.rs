//! Header blocks, once their peer gathered them (`super::peer`): passed on
//! as they came
//! or re-encoded as literals once a dropped block left a receiver's HPACK
//! table behind (see the module doc), and the guard's own blocks
//! (trailers-only answers, 431, 502, a WebSocket's head).

use bytes::BytesMut;

use super::wire;
use crate::guard::body::BodyKind;
use crate::guard::grpc;

/// What goes with each request the relay forwards: the client's address,
/// and the last request while it can still be taken back.
pub(super) struct Forward {
    /// The client's `x-forwarded-for` entry, as a CONTINUATION's block.
    xff: Vec<u8>,
    /// The last request forwarded, while still unwritten and last in the
    /// application's write buffer: its stream, where it starts and ends,
    /// and whether its block changed the table.
    unsent: Option<(u32, usize, usize, bool)>,
}

impl Forward {
    /// For a client at `peer` (its address as text).
    pub(super) fn new(peer: &str) -> Self {
        Self {
            xff: wire::literal_block(&[("x-forwarded-for", peer)]),
            unsent: None,
        }
    }

    /// The client's `x-forwarded-for` entry, as a CONTINUATION's block.
    pub(super) fn xff(&self) -> &[u8] {
        &self.xff
    }

    /// Stream `id`'s request went to `to_app[start..end]`.
    pub(super) fn sent(&mut self, id: u32, start: usize, end: usize, indexed: bool) {
        self.unsent = Some((id, start, end, indexed));
    }

    /// The application's write buffer was written from: offsets from
    /// before are stale.
    pub(super) fn forget(&mut self) {
        self.unsent = None;
    }

    /// Takes stream `id`'s request back out of `to_app` if it is the last
    /// thing there and not written yet: whether its block changed the
    /// client's table, or `None` if it could not be taken back.
    pub(super) fn take_back(&mut self, id: u32, to_app: &mut BytesMut) -> Option<bool> {
        match self.unsent {
            Some((unsent, start, end, indexed)) if unsent == id && end == to_app.len() => {
                self.unsent = None;
                to_app.truncate(start);
                Some(indexed)
            }
            _ => None,
        }
    }
}

/// A trailers-only UNAVAILABLE block for the gRPC kinds, as literals.
pub(super) fn trailers_only(kind: BodyKind, message: &'static str) -> Option<Vec<u8>> {
    let ct = match kind {
        BodyKind::Grpc => "application/grpc",
        BodyKind::GrpcWeb { text: false } => "application/grpc-web+proto",
        BodyKind::GrpcWeb { text: true } => "application/grpc-web-text+proto",
        BodyKind::Sse | BodyKind::Opaque => return None,
    };
    Some(wire::literal_block(&[
        (":status", "200"),
        ("content-type", ct),
        ("grpc-status", grpc::STATUS_UNAVAILABLE),
        ("grpc-message", message),
    ]))
}

/// Trailers `grpc-status: 14` with `message`, as literals.
pub(super) fn unavailable_block(message: &'static str) -> Vec<u8> {
    wire::literal_block(&[
        ("grpc-status", grpc::STATUS_UNAVAILABLE),
        ("grpc-message", message),
    ])
}
