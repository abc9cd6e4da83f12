//! One peer of the relay, the client or the application, as the relay
//! sees it: the bytes each way, its frames split out of what was read, and
//! its header blocks gathered over CONTINUATION frames and decoded with its
//! own HPACK table. Both directions use the one [`Peer`] type (h2 splits a
//! connection the same way, into its receiving and its sending half).

use bytes::BytesMut;

use super::failure::Failure;
use super::io::keep_rest;
use super::limits::{DEFAULT_FRAME, DEFAULT_TABLE, MAX_CONTINUATIONS, MAX_FRAME, READ_BUF};
use super::window::put_data;
use super::wire::{self, Head};

/// One peer: the bytes read from it and to be written to it, and the
/// HTTP/2 state of that peer that the relay follows.
pub(super) struct Peer {
    /// Read from this peer and not handled yet (a frame in part stays).
    pub(super) read: BytesMut,
    /// To be written to this peer: the other peer's frames and the guard's
    /// own.
    pub(super) write: BytesMut,
    /// Decodes this peer's header blocks: its encoder's dynamic table.
    hpack: wire::Hpack,
    /// This peer's header block being gathered over CONTINUATION frames.
    block: Option<Block>,
    /// This peer's SETTINGS_MAX_FRAME_SIZE (lowered to `MAX_FRAME`): the
    /// largest frame written to it.
    frame: usize,
    /// The largest SETTINGS_MAX_FRAME_SIZE this peer ever announced: the
    /// other peer may have been told it (and not yet the lower one since),
    /// so a frame from the other peer up to it is no error of its own.
    frame_max: usize,
    /// Blocks to this peer are re-encoded as literals (see the module doc):
    /// set once the guard dropped a block that changed the other peer's
    /// table; `Some(true)` until the first, which clears this peer's table.
    translate: Option<bool>,
    /// A header block's bytes, and its fields, kept between blocks to reuse
    /// the allocations.
    scratch: Vec<u8>,
    fields: Vec<wire::Field>,
}

impl Peer {
    /// A peer at the start: nothing read, the RFC's default SETTINGS.
    pub(super) fn new() -> Self {
        Self {
            read: BytesMut::with_capacity(READ_BUF),
            write: BytesMut::new(),
            hpack: wire::Hpack::new(DEFAULT_TABLE as usize),
            block: None,
            frame: DEFAULT_FRAME,
            frame_max: DEFAULT_FRAME,
            translate: None,
            scratch: Vec::new(),
            fields: Vec::new(),
        }
    }

    /// The other peer allowed this peer's encoder a dynamic table of up to
    /// `size` (its SETTINGS_HEADER_TABLE_SIZE): this peer's blocks are
    /// decoded with a table that may grow to it.
    pub(super) fn allow_table(&mut self, size: u32) {
        self.hpack.allow(size);
    }

    /// This peer announced SETTINGS_MAX_FRAME_SIZE `v`; the relay holds
    /// no frame larger than `MAX_FRAME`, so that is what the other peer is
    /// told (returned).
    pub(super) fn announce_frame(&mut self, v: u32) -> u32 {
        let v = v.min(MAX_FRAME);
        self.frame = v as usize;
        self.frame_max = self.frame_max.max(self.frame);
        v
    }

    /// The largest frame to write to this peer.
    pub(super) fn frame(&self) -> usize {
        self.frame
    }

    /// The largest frame the other peer may send this one (see `frame_max`).
    pub(super) fn frame_max(&self) -> usize {
        self.frame_max
    }

    /// A header block to this peer, as HEADERS and the CONTINUATIONs its
    /// frame size needs.
    pub(super) fn put_block(&mut self, id: u32, end_stream: bool, block: &[u8]) {
        put_block(&mut self.write, id, end_stream, block, self.frame);
    }

    /// A header block the guard encoded (its own, or re-encoded) to this
    /// peer, after the table size update `due` to it, if one is.
    pub(super) fn put_own_block(
        &mut self,
        id: u32,
        block: &[u8],
        end_stream: bool,
        due: Option<u32>,
    ) {
        match due {
            None => self.put_block(id, end_stream, block),
            Some(size) => {
                let mut encoded = Vec::with_capacity(block.len() + 6);
                wire::put_size_update(&mut encoded, size);
                encoded.extend_from_slice(block);
                self.put_block(id, end_stream, &encoded);
            }
        }
    }

    /// A whole block of the other peer's (`all` its fields) re-encoded as
    /// literals to this one (see the module doc): the first one after
    /// clearing this peer's table (an update to 0, below any size it may
    /// have lowered its table to: the one update that is due), any other
    /// after the update `due`; `extra` (a request's `x-forwarded-for`)
    /// at its end.
    pub(super) fn put_literals(
        &mut self,
        block: &Block,
        all: &[wire::Field],
        due: Option<u32>,
        extra: Option<&[u8]>,
    ) {
        let clear = self.translate == Some(true);
        self.translate = Some(false);
        let mut encoded = literals(clear, all);
        if let Some(extra) = extra {
            encoded.extend_from_slice(extra);
        }
        let due = if clear { None } else { due };
        self.put_own_block(block.id, &encoded, block.end_stream, due);
    }

    /// A whole block of the other peer's passed on as it came (`last` its
    /// last frame); `extra` (a request's `x-forwarded-for`) in a
    /// CONTINUATION of its own, to which the last frame's END_HEADERS moves.
    pub(super) fn put_as_came(&mut self, block: &Block, last: &[u8], extra: Option<&[u8]>) {
        self.write.extend_from_slice(&block.frames);
        let at = self.write.len();
        self.write.extend_from_slice(last);
        if let Some(extra) = extra {
            self.write[at + 4] &= !wire::END_HEADERS;
            wire::put(
                &mut self.write,
                wire::CONTINUATION,
                wire::END_HEADERS,
                block.id,
                extra,
            );
        }
    }

    /// Blocks to this peer are re-encoded (see `translate`).
    pub(super) fn translates(&self) -> bool {
        self.translate.is_some()
    }

    /// A block of the other peer's this one does not get: if it changed
    /// the other peer's table, this peer's decoder no longer follows it,
    /// and the blocks to it are re-encoded from now on. True if that
    /// starts now.
    pub(super) fn missed_block(&mut self, indexed: bool) -> bool {
        let starts = indexed && self.translate.is_none();
        if starts {
            self.translate = Some(true);
        }
        starts
    }

    /// DATA to this peer, in frames it takes.
    pub(super) fn put_data(&mut self, id: u32, data: &[u8], end_stream: bool) {
        put_data(&mut self.write, id, data, end_stream, self.frame);
    }

    /// What was read from this peer, to be split into frames no larger
    /// than `max`; what is left of it goes back with [`Peer::keep`]. Until
    /// then the peer's read buffer is empty (if the frames fail the
    /// connection, what was read is dropped).
    pub(super) fn frames(&mut self, max: usize) -> Frames {
        Frames {
            buf: std::mem::take(&mut self.read),
            at: 0,
            max,
        }
    }

    /// The frames not handled (an incomplete one, or those after a pause),
    /// kept for the next read.
    pub(super) fn keep(&mut self, frames: Frames) {
        self.read = keep_rest(frames.buf, frames.at);
    }

    /// Whether frame `h` interrupts a header block of this peer's (only
    /// its CONTINUATIONs may follow a block's first frame, RFC 9113 §6.10).
    pub(super) fn interrupts(&self, h: Head) -> bool {
        self.block.is_some() && h.kind != wire::CONTINUATION
    }

    /// The block CONTINUATION `h` continues: this peer's block being
    /// gathered, if it is on the same stream.
    pub(super) fn continued(&mut self, h: Head) -> Option<Block> {
        self.block.take().filter(|b| b.id == h.id)
    }

    /// One frame of a header block (`fragment`, the block's bytes in
    /// `frame`). While the block is not whole it is kept, and `More`; more
    /// than `max_bytes` or `MAX_CONTINUATIONS` frames of it is a flood
    /// (an HTTP/2 stack would buffer it whole before it could refuse it).
    /// Whole, its bytes (the fragments so far, then `fragment`) wait in
    /// the peer for [`Peer::decode`].
    pub(super) fn gather(
        &mut self,
        mut block: Block,
        h: Head,
        frame: &[u8],
        fragment: &[u8],
        max_bytes: usize,
    ) -> Gathered {
        if h.flags & wire::END_HEADERS == 0 {
            block.gather(frame, fragment);
            if block.fragment.len() > max_bytes || block.continuations > MAX_CONTINUATIONS {
                return Gathered::Flood;
            }
            self.block = Some(block);
            return Gathered::More;
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(&block.fragment);
        self.scratch.extend_from_slice(fragment);
        Gathered::Whole(block)
    }

    /// The whole block [`Peer::gather`] gave, decoded with this peer's
    /// table (at most `max` bytes of fields): what the relay reads of it,
    /// and with `keep_all` every field, in order (give the list back with
    /// [`Peer::reuse`]).
    pub(super) fn decode(
        &mut self,
        max: usize,
        keep_all: bool,
    ) -> (Result<wire::Fields, wire::BlockError>, Vec<wire::Field>) {
        let mut all = std::mem::take(&mut self.fields);
        all.clear();
        let fields = wire::decode(
            &mut self.hpack,
            &mut self.scratch,
            max,
            keep_all.then_some(&mut all),
        );
        (fields, all)
    }

    /// A field list [`Peer::decode`] gave, back for the next block.
    pub(super) fn reuse(&mut self, fields: Vec<wire::Field>) {
        self.fields = fields;
    }
}

/// What one frame of a header block made of it.
pub(super) enum Gathered {
    /// Not whole yet: the peer keeps it.
    More,
    /// Whole: its bytes wait in the peer, to be decoded.
    Whole(Block),
    /// Too large, or in too many pieces.
    Flood,
}

/// A peer's read bytes, split into frames (see [`Peer::frames`]).
pub(super) struct Frames {
    buf: BytesMut,
    /// Where the first frame not handled yet starts.
    at: usize,
    /// The largest frame the peer may send (its SETTINGS_MAX_FRAME_SIZE as
    /// it was told).
    max: usize,
}

impl Frames {
    /// The next whole frame (its head, and its bytes with the head), or
    /// `None` when the rest is incomplete. A frame larger than the peer
    /// was allowed is its FRAME_SIZE_ERROR. The frame stays the next one
    /// until [`Frames::handled`].
    pub(super) fn next(&self) -> Result<Option<(Head, &[u8])>, Failure> {
        let Some(h) = wire::head(&self.buf[self.at..]) else {
            return Ok(None);
        };
        if h.len > self.max {
            return Err(Failure::FrameSize(
                "a frame larger than SETTINGS_MAX_FRAME_SIZE",
            ));
        }
        let end = self.at + wire::FRAME_HEADER + h.len;
        if self.buf.len() < end {
            return Ok(None);
        }
        Ok(Some((h, &self.buf[self.at..end])))
    }

    /// The frame [`Frames::next`] gave, `h`, is handled.
    pub(super) fn handled(&mut self, h: Head) {
        self.at += wire::FRAME_HEADER + h.len;
    }
}

/// A header block split over CONTINUATION frames, being gathered.
pub(super) struct Block {
    pub(super) id: u32,
    /// The HEADERS (or PUSH_PROMISE) ended the stream.
    pub(super) end_stream: bool,
    /// A PUSH_PROMISE's promised stream (never relayed: see `app_fragment`).
    pub(super) promised: Option<u32>,
    /// The frames as they came, and the block fragments from them.
    pub(super) frames: BytesMut,
    fragment: Vec<u8>,
    /// CONTINUATION frames so far.
    continuations: usize,
    /// Its HEADERS' priority makes its stream depend on itself (RFC 9113
    /// §5.3.1): a client block is then malformed.
    pub(super) self_dependent: bool,
}

impl Block {
    /// The block a HEADERS (or PUSH_PROMISE) frame starts.
    pub(super) fn start(h: Head) -> Self {
        Self {
            id: h.id,
            end_stream: h.kind == wire::HEADERS && h.flags & wire::END_STREAM != 0,
            promised: None,
            frames: BytesMut::new(),
            fragment: Vec::new(),
            continuations: 0,
            self_dependent: false,
        }
    }

    /// Keeps a frame of a block not yet whole, and its fragment.
    fn gather(&mut self, frame: &[u8], fragment: &[u8]) {
        self.frames.extend_from_slice(frame);
        self.fragment.extend_from_slice(fragment);
        self.continuations += 1;
    }
}

/// A header block as HEADERS and as many CONTINUATIONs as `max_frame` needs.
pub(super) fn put_block(
    out: &mut BytesMut,
    id: u32,
    end_stream: bool,
    block: &[u8],
    max_frame: usize,
) {
    let mut chunks = block.chunks(max_frame.max(1)).peekable();
    let mut kind = wire::HEADERS;
    let mut flags = if end_stream { wire::END_STREAM } else { 0 };
    loop {
        let chunk = chunks.next().unwrap_or(&[]);
        let last = chunks.peek().is_none();
        if last {
            flags |= wire::END_HEADERS;
        }
        wire::put(out, kind, flags, id, chunk);
        if last {
            return;
        }
        kind = wire::CONTINUATION;
        flags = 0;
    }
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
