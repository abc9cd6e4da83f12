//! The client's connection window, which the guard owns: every DATA frame to
//! the client, the application's and the guard's own, is charged to it as it
//! is cleared for writing, so nothing ever exceeds it. And the client's
//! initial stream window, both ways.
//!
//! The application's view of the window is the real window plus the guard's
//! unrepaid DATA (`debt`): what it sends beyond the real window waits in the
//! client's write buffer (bounded by its high-water mark) until credit comes.
//! The guard keeps nothing back beforehand, so with nothing of its own to
//! send it passes every byte of credit on, and a client that refills its
//! window only once it ran dry still gets all the data it was promised.

use std::collections::HashSet;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::AsyncWrite;

use super::failure::Failure;
use super::limits::{DEFAULT_WINDOW, MAX_WINDOW};
use super::wire::{self, Head};

/// The client's windows, as the guard keeps them.
#[derive(Debug)]
pub(super) struct Window {
    /// The client's connection window for DATA to it.
    conn: i64,
    /// The front of the client's write buffer already charged to `conn`:
    /// only that much may be written.
    cleared: usize,
    /// The guard's own DATA bytes the application's view of the window does
    /// not know of yet: withheld from the client's next WINDOW_UPDATEs.
    debt: i64,
    /// The client's SETTINGS_INITIAL_WINDOW_SIZE: each local stream's
    /// window for the guard's DATA starts there.
    initial: i64,
    /// The SETTINGS_INITIAL_WINDOW_SIZE the client was last told (the
    /// application's, passed on): a local stream's window for the client's
    /// DATA starts there.
    told: i64,
    /// Where the first whole frame of the client's write buffer starts: a
    /// write may stop inside a frame.
    front: usize,
    /// The stream whose end (a frame with END_STREAM) a write stopped
    /// inside: the rest of that frame is the buffer's front.
    partial_end: Option<u32>,
    /// How many times bytes left the client's write buffer: what waits
    /// there changed only if this did.
    drained: u64,
    /// What is known of the frames behind the gate while the window is
    /// shut, so each wait scans only what was queued since.
    held: HeldScan,
}

/// The frames right behind the gate that were scanned and must wait for
/// the window (see [`pass_held`]).
#[derive(Debug, Default)]
struct HeldScan {
    /// How many bytes behind the gate are known to wait.
    bytes: usize,
    /// The streams with a frame that waits.
    streams: HashSet<u32>,
    /// A header block waits.
    block: bool,
}

impl Default for Window {
    fn default() -> Self {
        let w = i64::from(DEFAULT_WINDOW);
        Self {
            conn: w,
            cleared: 0,
            debt: 0,
            initial: w,
            told: w,
            front: 0,
            partial_end: None,
            drained: 0,
            held: HeldScan::default(),
        }
    }
}

impl Window {
    /// The client's connection WINDOW_UPDATE of `credit`: what of it goes to
    /// the application (the guard's own DATA sent since the last one is
    /// withheld: the application's view of the window never counted it).
    pub(super) fn credit(&mut self, credit: u32) -> Result<u32, Failure> {
        let credit = i64::from(credit);
        if credit == 0 {
            return Err(Failure::Protocol("a connection WINDOW_UPDATE of 0"));
        }
        self.conn += credit;
        if self.conn > MAX_WINDOW {
            return Err(Failure::FlowControl);
        }
        let repaid = self.debt.min(credit);
        self.debt -= repaid;
        Ok((credit - repaid) as u32)
    }

    /// While closing, the client is read for its connection WINDOW_UPDATEs
    /// alone: what waits for its window (the last DATA, trailers behind it)
    /// can still go out before the close. Every other frame in `read` is
    /// dropped; an incomplete one stays.
    pub(super) fn credit_while_closing(&mut self, read: &mut BytesMut) {
        let mut at = 0;
        while let Some(h) = wire::head(&read[at..]) {
            let end = at + wire::FRAME_HEADER + h.len;
            if read.len() < end {
                break;
            }
            if h.kind == wire::WINDOW_UPDATE && h.id == 0 && h.len == 4 {
                let b = [read[at + 9], read[at + 10], read[at + 11], read[at + 12]];
                let credit = i64::from(u32::from_be_bytes(b) & wire::MAX_STREAM_ID);
                self.conn = (self.conn + credit).min(MAX_WINDOW);
            }
            at = end;
        }
        read.advance(at);
    }

    /// Charges the DATA frames waiting in `to_client`, from `cleared` on, to
    /// the connection window as far as it goes. A frame larger than what is
    /// left is split (its padding dropped: returned as `(stream, bytes)` to
    /// give back to the application), so the window is always used up: a
    /// client may wait for it to run dry before it sends a WINDOW_UPDATE.
    /// Once a DATA frame must wait, the frames behind it that do not depend
    /// on it go ahead of it ([`pass_held`]).
    pub(super) fn clear_gate(&mut self, to_client: &mut BytesMut) -> Vec<(u32, u32)> {
        let mut padding = Vec::new();
        if self.conn > 0 {
            // Credit came: what waited may go now, and is scanned anew.
            self.held = HeldScan::default();
        }
        while let Some(h) = wire::head(&to_client[self.cleared..]) {
            let len = h.len as i64;
            if h.kind != wire::DATA || len <= self.conn {
                if h.kind == wire::DATA {
                    self.conn -= len;
                }
                self.cleared += wire::FRAME_HEADER + h.len;
                continue;
            }
            if self.conn <= 0 {
                self.cleared += pass_held(to_client, self.cleared, &mut self.held);
                break;
            }
            padding.extend(split_data(to_client, self.cleared, h, self.conn as usize));
        }
        padding
    }

    /// Writes the cleared front of `buf` to `io`, until it is gone or the
    /// socket is full, following where its first whole frame starts.
    pub(super) fn write<W: AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut W,
        buf: &mut BytesMut,
    ) -> std::io::Result<()> {
        while self.cleared > 0 {
            match Pin::new(&mut *io).poll_write(cx, &buf[..self.cleared]) {
                Poll::Ready(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => {
                    self.drained += 1;
                    (self.front, self.partial_end) =
                        next_front(buf, self.front, self.partial_end, n);
                    buf.advance(n);
                    self.cleared -= n;
                }
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => break,
            }
        }
        Ok(())
    }

    /// The stream whose end a write stopped inside, if one did: not yet
    /// written, though its frame starts before [`Self::front`].
    pub(super) fn partial_end(&self) -> Option<u32> {
        self.partial_end.filter(|_| self.front > 0)
    }

    /// How many times bytes left the client's write buffer.
    pub(super) fn drained(&self) -> u64 {
        self.drained
    }

    /// Where the first whole frame of the client's write buffer starts
    /// (the front may be the rest of a frame partly written).
    pub(super) fn front(&self) -> usize {
        self.front
    }

    /// Whether frames in a client write buffer of `len` bytes wait for the
    /// window.
    pub(super) fn holds_back(&self, len: usize) -> bool {
        self.cleared < len
    }

    /// At the close: what the window never cleared is dropped.
    pub(super) fn drop_uncleared(&self, to_client: &mut BytesMut) {
        to_client.truncate(self.cleared);
    }

    /// The client's write buffer was emptied without writing it.
    pub(super) fn buffer_dropped(&mut self) {
        self.held = HeldScan::default();
        self.cleared = 0;
        self.front = 0;
        self.partial_end = None;
        self.drained += 1;
    }

    /// Connection window left for DATA not yet cleared.
    pub(super) fn available(&self) -> i64 {
        self.conn
    }

    /// The guard sent `n` bytes of DATA of its own: withheld from the
    /// application's next credit.
    pub(super) fn owe(&mut self, n: usize) {
        self.debt += n as i64;
    }

    pub(super) fn cleared(&self) -> usize {
        self.cleared
    }

    pub(super) fn debt(&self) -> i64 {
        self.debt
    }

    /// The client's initial stream window (its SETTINGS_INITIAL_WINDOW_SIZE).
    pub(super) fn initial(&self) -> i64 {
        self.initial
    }

    /// The client set SETTINGS_INITIAL_WINDOW_SIZE `v`: by how much each open
    /// stream's window changes.
    pub(super) fn set_initial(&mut self, v: u32) -> i64 {
        let delta = i64::from(v) - self.initial;
        self.initial = i64::from(v);
        delta
    }

    /// The initial window the client was last told (the application's).
    pub(super) fn told(&self) -> i64 {
        self.told
    }

    /// The client is told SETTINGS_INITIAL_WINDOW_SIZE `v`: the change.
    pub(super) fn set_told(&mut self, v: u32) -> i64 {
        let delta = i64::from(v) - self.told;
        self.told = i64::from(v);
        delta
    }

    #[cfg(test)]
    pub(super) fn set_available(&mut self, conn: i64) {
        self.conn = conn;
    }
}

/// `to_client` is held at `cleared` by DATA the client's window cannot
/// take: the frames behind it that need not wait go first; returns how many
/// bytes that is (cleared now). Those are the connection's own (SETTINGS
/// and PING acks, GOAWAY, the connection's WINDOW_UPDATEs) and other
/// streams' frames, but never a stream's frame behind one of its own that
/// waits (its trailers behind its DATA), nor a header block behind one that
/// waits (HPACK decodes blocks in the order they were encoded). Without
/// this, a client that waits for a PING or SETTINGS ack before it sends
/// credit, or a GOAWAY held at the close, would wait for good.
///
/// `known` holds what an earlier call found waiting right behind the gate:
/// only the frames queued since are scanned, and nothing is copied unless
/// one of them may go, so a shut window costs nothing per poll.
fn pass_held(to_client: &mut BytesMut, cleared: usize, known: &mut HeldScan) -> usize {
    let queued = &to_client[cleared..];
    if known.bytes > queued.len() {
        *known = HeldScan::default();
    }
    let start = known.bytes;
    // Each frame queued since: (start, end, goes now).
    let mut frames = Vec::new();
    let mut at = start;
    while let Some(h) = wire::head(&queued[at..]) {
        let end = at + wire::FRAME_HEADER + h.len;
        let header_block = matches!(
            h.kind,
            wire::HEADERS | wire::CONTINUATION | wire::PUSH_PROMISE
        );
        let waits = h.kind == wire::DATA
            || (h.id != 0 && known.streams.contains(&h.id))
            || (header_block && known.block);
        if waits {
            if h.id != 0 {
                known.streams.insert(h.id);
            }
            known.block |= header_block;
        }
        frames.push((at, end, !waits));
        at = end;
    }
    if !frames.iter().any(|f| f.2) {
        known.bytes = at;
        return 0;
    }
    let mut order = BytesMut::with_capacity(queued.len() - start);
    for &(from, to, _) in frames.iter().filter(|f| f.2) {
        order.extend_from_slice(&queued[from..to]);
    }
    let passed = order.len();
    order.extend_from_slice(&queued[..start]);
    for &(from, to, _) in frames.iter().filter(|f| !f.2) {
        order.extend_from_slice(&queued[from..to]);
    }
    known.bytes = order.len() - passed;
    // An incomplete frame never waits here, but keep any tail as it is.
    order.extend_from_slice(&queued[at..]);
    to_client.truncate(cleared);
    to_client.extend_from_slice(&order);
    passed
}

/// Where the first whole frame starts once the first `n` bytes of `buf`
/// are written, it starting at `front` now (`buf` holds whole frames from
/// `front` on, each head read once as the write passes it), and the stream
/// whose end the write stopped inside, if it did (`partial` is that of the
/// frame before `front`).
fn next_front(buf: &[u8], front: usize, partial: Option<u32>, n: usize) -> (usize, Option<u32>) {
    if n < front {
        // Still inside the frame a write stopped in before.
        return (front - n, partial);
    }
    let mut at = front;
    let mut last = None;
    while at < n {
        match wire::head(&buf[at..]) {
            Some(h) => {
                let end =
                    matches!(h.kind, wire::HEADERS | wire::DATA) && h.flags & wire::END_STREAM != 0;
                last = end.then_some(h.id);
                at += wire::FRAME_HEADER + h.len;
            }
            None => return (0, None),
        }
    }
    (at - n, if at > n { last } else { None })
}

/// Splits the DATA frame at `at` so its first piece takes at most `room`
/// bytes of window. Its padding goes: returned, to give back.
fn split_data(to_client: &mut BytesMut, at: usize, h: Head, room: usize) -> Option<(u32, u32)> {
    let rest = to_client.split_off(at);
    let frame_end = wire::FRAME_HEADER + h.len;
    // Frames in `to_client` were checked when they came in.
    let data = wire::content(h, &rest[wire::FRAME_HEADER..frame_end]).unwrap_or(&[]);
    let padding = (h.len - data.len()) as u32;
    let flags = h.flags & wire::END_STREAM;
    let first = room.min(data.len());
    if first == data.len() {
        wire::put(to_client, wire::DATA, flags, h.id, data);
    } else {
        wire::put(to_client, wire::DATA, 0, h.id, &data[..first]);
        wire::put(to_client, wire::DATA, flags, h.id, &data[first..]);
    }
    to_client.extend_from_slice(&rest[frame_end..]);
    (padding > 0).then_some((h.id, padding))
}

/// `data` as DATA frames of at most `max_frame` bytes, END_STREAM on the last.
pub(super) fn put_data(
    out: &mut BytesMut,
    id: u32,
    data: &[u8],
    end_stream: bool,
    max_frame: usize,
) {
    let mut chunks = data.chunks(max_frame.max(1)).peekable();
    if chunks.peek().is_none() {
        let flags = if end_stream { wire::END_STREAM } else { 0 };
        return wire::put(out, wire::DATA, flags, id, &[]);
    }
    while let Some(chunk) = chunks.next() {
        let last = chunks.peek().is_none();
        let flags = if last && end_stream {
            wire::END_STREAM
        } else {
            0
        };
        wire::put(out, wire::DATA, flags, id, chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 55 review: while the window is shut, each wait scans only what
    /// was queued since the last, and orders the buffer exactly as a scan
    /// of the whole queue would.
    #[test]
    fn frames_held_by_a_shut_window_are_scanned_once_in_the_same_order() {
        let mut seed = 0x2545_f491_u32;
        let mut next = move |n: u32| {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed % n
        };
        let mut kept = Window::default();
        kept.set_available(0);
        let (mut a, mut b, mut b_out) = (BytesMut::new(), BytesMut::new(), BytesMut::new());
        for round in 0..400 {
            for _ in 0..1 + next(4) {
                let id = 1 + 2 * next(4);
                let (kind, id) = match next(6) {
                    0 | 1 => (wire::DATA, id),
                    2 => (wire::HEADERS, id),
                    3 => (wire::WINDOW_UPDATE, id),
                    4 => (wire::PING, 0),
                    _ => (wire::RST_STREAM, id),
                };
                let payload = [round as u8; 4];
                let flags = if kind == wire::HEADERS {
                    wire::END_HEADERS
                } else {
                    0
                };
                wire::put(&mut a, kind, flags, id, &payload);
                wire::put(&mut b, kind, flags, id, &payload);
            }
            kept.clear_gate(&mut a);
            let mut fresh = Window::default();
            fresh.set_available(0);
            fresh.clear_gate(&mut b);
            b_out.extend_from_slice(&b.split_to(fresh.cleared()));
            let mut whole = b_out.clone();
            whole.extend_from_slice(&b);
            assert_eq!(a, whole, "round {round}");
            assert_eq!(kept.cleared(), b_out.len(), "round {round}");
        }
        assert!(kept.held.bytes > 0, "DATA waits at the end");
    }
}
