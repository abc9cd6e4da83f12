//! Header blocks, once their peer gathered them (`super::peer`): passed on
//! as they came
//! or re-encoded as literals once a dropped block left a receiver's HPACK
//! table behind (see the module doc), and the guard's own blocks
//! (trailers-only answers, 431, 502, a WebSocket's head).

use bytes::BytesMut;

use super::peer::Block;
use super::wire;
use super::Relay;
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

impl Relay<'_> {
    /// Passes a whole client block on: as it came (with the client's
    /// address added to a request's), or re-encoded while the application's
    /// table is the guard's own (see the module doc).
    pub(super) fn forward_block(
        &mut self,
        block: &Block,
        last: &[u8],
        all: Option<&[wire::Field]>,
        request: bool,
    ) {
        match all {
            Some(all) => {
                let clear = self.app.translate == Some(true);
                self.app.translate = Some(false);
                let mut encoded = literals(clear, all);
                if request {
                    encoded.extend_from_slice(&self.forward.xff);
                }
                self.app.put_block(block.id, block.end_stream, &encoded);
            }
            None => {
                self.app.write.extend_from_slice(&block.frames);
                let at = self.app.write.len();
                self.app.write.extend_from_slice(last);
                if request {
                    // The client's address, in a CONTINUATION of its own:
                    // the last frame's END_HEADERS moves to it.
                    self.app.write[at + 4] &= !wire::END_HEADERS;
                    wire::put(
                        &mut self.app.write,
                        wire::CONTINUATION,
                        wire::END_HEADERS,
                        block.id,
                        &self.forward.xff,
                    );
                }
            }
        }
    }

    /// A client block the application does not get: if it changed the
    /// client's table, the application's no longer follows it, and the
    /// guard re-encodes from now on.
    pub(super) fn dropped_block(&mut self, fields: &wire::Fields) {
        if fields.indexed && self.app.translate.is_none() {
            tracing::debug!(conn = self.info.id, "guard: a client header block the application did not get changed its HPACK table; re-encoding the client's blocks from now on");
            self.app.translate = Some(true);
        }
    }

    /// A block re-encoded as literals (see the module doc), the first one
    /// after clearing the client's table.
    pub(super) fn put_translated(&mut self, block: &Block, all: &[wire::Field]) {
        let clear = self.client.translate == Some(true);
        self.client.translate = Some(false);
        if clear {
            // The update to 0 is below any size the client may have
            // lowered its table to: it is the one update that is due.
            self.settings.take_update_due();
        }
        let encoded = literals(clear, all);
        self.own_block(block.id, &encoded, block.end_stream);
    }

    /// A header block the guard encoded (its own, or re-encoded) to the
    /// client, after the table size update that is due, if one is.
    pub(super) fn own_block(&mut self, id: u32, block: &[u8], end_stream: bool) {
        match self.settings.take_update_due() {
            None => self.client.put_block(id, end_stream, block),
            Some(size) => {
                let mut encoded = Vec::with_capacity(block.len() + 6);
                wire::put_size_update(&mut encoded, size);
                encoded.extend_from_slice(block);
                self.client.put_block(id, end_stream, &encoded);
            }
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

/// `fields` as literals without indexing; with `clear`, first one table
/// size update to 0, which evicts every entry. The table stays at 0: every
/// later block this way is literals too, which need none, and a size is
/// never raised to one the receiver has not acked (RFC 7541 §4.2, §6.3).
/// So a block carries at most one size update (some decoders take no more
/// than two).
pub(super) fn literals(clear: bool, fields: &[wire::Field]) -> Vec<u8> {
    let mut out = Vec::new();
    if clear {
        wire::put_size_update(&mut out, 0);
    }
    for f in fields {
        // A field sent never-indexed stays so (RFC 7541 §6.2.3).
        wire::put_literal(&mut out, &f.name, &f.value, f.never_indexed);
    }
    out
}
