//! The client's connection window, which the guard owns: every DATA frame to
//! the client, the application's and the guard's own, is charged to it as it
//! is cleared for writing. And the relay's socket reads and writes.

use super::*;

impl Relay<'_> {
    /// The client's connection WINDOW_UPDATE: the guard's own DATA sent
    /// since the last one is withheld (the application's view of the window
    /// never counted it), the rest goes to the application.
    ///
    /// The guard owns the client's connection window: every DATA frame to
    /// the client, the application's and its own, is charged to it as it is
    /// cleared for writing ([`Relay::clear_gate`]), so nothing ever exceeds
    /// it. The application's view is the real window plus the guard's
    /// unrepaid DATA (`debt`): what it sends beyond the real window waits in
    /// `to_client` (bounded by its high-water mark) until credit comes. The
    /// guard keeps nothing back beforehand, so with nothing of its own to
    /// send it passes every byte of credit on, and a client that refills its
    /// window only once it ran dry still gets all the data it was promised.
    pub(super) fn client_credit(&mut self, credit: u32) -> Result<(), Failure> {
        let credit = i64::from(credit);
        if credit == 0 {
            return Err(Failure::Protocol("a connection WINDOW_UPDATE of 0"));
        }
        self.conn_window += credit;
        if self.conn_window > MAX_WINDOW {
            return Err(Failure::FlowControl);
        }
        let repaid = self.debt.min(credit);
        self.debt -= repaid;
        wire::window_update(&mut self.app.write, 0, (credit - repaid) as u32);
        Ok(())
    }

    /// Charges the DATA frames waiting in `to_client`, from `cleared` on, to
    /// the client's connection window as far as it goes. A frame larger than
    /// what is left is split (its padding dropped and given back to the
    /// application), so the window is always used up: a client may wait for
    /// it to run dry before it sends a WINDOW_UPDATE. Once a DATA frame must
    /// wait, the frames behind it that do not depend on it go ahead of it
    /// ([`Relay::pass_held`]).
    pub(super) fn clear_gate(&mut self) {
        while let Some(h) = wire::head(&self.client.write[self.cleared..]) {
            let len = h.len as i64;
            if h.kind != wire::DATA || len <= self.conn_window {
                if h.kind == wire::DATA {
                    self.conn_window -= len;
                }
                self.cleared += wire::FRAME_HEADER + h.len;
                continue;
            }
            if self.conn_window <= 0 {
                return self.pass_held();
            }
            self.split_data(h, self.conn_window as usize);
        }
    }

    /// `to_client` is held at `cleared` by DATA the client's window cannot
    /// take: the frames behind it that need not wait go first, and are
    /// cleared. Those are the connection's own (SETTINGS and PING acks,
    /// GOAWAY, the connection's WINDOW_UPDATEs) and other streams' frames,
    /// but never a stream's frame behind one of its own that waits (its
    /// trailers behind its DATA), nor a header block behind one that waits
    /// (HPACK decodes blocks in the order they were encoded). Without this,
    /// a client that waits for a PING or SETTINGS ack before it sends
    /// credit, or a GOAWAY held at the close, would wait for good.
    pub(super) fn pass_held(&mut self) {
        let queued = &self.client.write[self.cleared..];
        let mut waiting = std::collections::HashSet::new();
        let mut block_waits = false;
        // Each frame behind the gate: (start, end, goes now).
        let mut frames = Vec::new();
        let mut at = 0;
        while let Some(h) = wire::head(&queued[at..]) {
            let end = at + wire::FRAME_HEADER + h.len;
            let header_block = matches!(
                h.kind,
                wire::HEADERS | wire::CONTINUATION | wire::PUSH_PROMISE
            );
            let waits = h.kind == wire::DATA
                || (h.id != 0 && waiting.contains(&h.id))
                || (header_block && block_waits);
            if waits {
                if h.id != 0 {
                    waiting.insert(h.id);
                }
                block_waits |= header_block;
            }
            frames.push((at, end, !waits));
            at = end;
        }
        if !frames.iter().any(|f| f.2) {
            return;
        }
        let mut order = BytesMut::with_capacity(queued.len());
        for &(from, to, _) in frames.iter().filter(|f| f.2) {
            order.extend_from_slice(&queued[from..to]);
        }
        let passed = order.len();
        for &(from, to, _) in frames.iter().filter(|f| !f.2) {
            order.extend_from_slice(&queued[from..to]);
        }
        // An incomplete frame never waits here, but keep any tail as it is.
        order.extend_from_slice(&queued[at..]);
        self.client.write.truncate(self.cleared);
        self.client.write.extend_from_slice(&order);
        self.cleared += passed;
    }

    /// While closing, the client is read for its connection WINDOW_UPDATEs
    /// alone: what waits for its window (the last DATA, trailers behind it)
    /// can still go out before the close. Every other frame is dropped.
    pub(super) fn credit_while_closing(&mut self) {
        let buf = std::mem::take(&mut self.client.read);
        let mut at = 0;
        while let Some(h) = wire::head(&buf[at..]) {
            let end = at + wire::FRAME_HEADER + h.len;
            if buf.len() < end {
                break;
            }
            if h.kind == wire::WINDOW_UPDATE && h.id == 0 && h.len == 4 {
                let b = [buf[at + 9], buf[at + 10], buf[at + 11], buf[at + 12]];
                let credit = i64::from(u32::from_be_bytes(b) & wire::MAX_STREAM_ID);
                self.conn_window = (self.conn_window + credit).min(MAX_WINDOW);
            }
            at = end;
        }
        self.client.read = keep_rest(buf, at);
    }

    /// Splits the DATA frame at `cleared` so its first piece takes at most
    /// `room` bytes of window; padding goes (window given back to the app).
    pub(super) fn split_data(&mut self, h: Head, room: usize) {
        let at = self.cleared;
        let rest = self.client.write.split_off(at);
        let frame_end = wire::FRAME_HEADER + h.len;
        // Frames in `to_client` were checked when they came in.
        let data = wire::content(h, &rest[wire::FRAME_HEADER..frame_end]).unwrap_or(&[]);
        let padding = (h.len - data.len()) as u32;
        if padding > 0 {
            wire::window_update(&mut self.app.write, 0, padding);
            wire::window_update(&mut self.app.write, h.id, padding);
            if let Some(s) = self.streams.get_mut(&h.id) {
                s.window += i64::from(padding);
            }
        }
        let flags = h.flags & wire::END_STREAM;
        let first = room.min(data.len());
        if first == data.len() {
            wire::put(&mut self.client.write, wire::DATA, flags, h.id, data);
        } else {
            wire::put(&mut self.client.write, wire::DATA, 0, h.id, &data[..first]);
            wire::put(
                &mut self.client.write,
                wire::DATA,
                flags,
                h.id,
                &data[first..],
            );
        }
        self.client.write.extend_from_slice(&rest[frame_end..]);
    }

    /// DATA of the guard's own to the client, in frames the client takes;
    /// the application's view of the connection window does not know of it.
    pub(super) fn own_data(&mut self, id: u32, data: &[u8], end_stream: bool) {
        put_data(
            &mut self.client.write,
            id,
            data,
            end_stream,
            self.client.frame,
        );
        self.debt += data.len() as i64;
    }
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

/// What is left of `buf` from `at` (an incomplete frame), as the next read's
/// buffer, with room for the read.
pub(super) fn keep_rest(mut buf: BytesMut, at: usize) -> BytesMut {
    buf.advance(at);
    if buf.capacity() - buf.len() < READ_BUF / 4 {
        buf.reserve(READ_BUF);
    }
    buf
}

/// Writes the first `cleared` bytes of `buf` until they are gone or the
/// socket is full.
pub(super) fn write_cleared<W: AsyncWrite + Unpin>(
    cx: &mut Context<'_>,
    io: &mut W,
    buf: &mut BytesMut,
    cleared: &mut usize,
) -> std::io::Result<()> {
    while *cleared > 0 {
        match Pin::new(&mut *io).poll_write(cx, &buf[..*cleared]) {
            Poll::Ready(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Poll::Ready(Ok(n)) => {
                buf.advance(n);
                *cleared -= n;
            }
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => break,
        }
    }
    Ok(())
}

/// Writes from `buf` until it is empty or the socket is full.
pub(super) fn write_some<W: AsyncWrite + Unpin>(
    cx: &mut Context<'_>,
    io: &mut W,
    buf: &mut BytesMut,
) -> std::io::Result<()> {
    while !buf.is_empty() {
        match Pin::new(&mut *io).poll_write(cx, buf) {
            Poll::Ready(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Poll::Ready(Ok(n)) => buf.advance(n),
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => break,
        }
    }
    Ok(())
}

pub(super) fn read_some<R: AsyncRead + Unpin>(
    cx: &mut Context<'_>,
    io: &mut R,
    buf: &mut BytesMut,
) -> Poll<std::io::Result<usize>> {
    if buf.capacity() - buf.len() < READ_BUF / 4 {
        buf.reserve(READ_BUF);
    }
    poll_read_buf(Pin::new(io), cx, buf)
}

/// Writes all of `buf`, bounded by the caller.
pub(super) async fn flush<W: AsyncWrite + Unpin>(
    io: &mut W,
    buf: &mut BytesMut,
) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let bound = std::time::Duration::from_secs(1);
    let _ = tokio::time::timeout(bound, async {
        while !buf.is_empty() {
            let n = io.write(buf).await?;
            if n == 0 {
                break;
            }
            buf.advance(n);
        }
        io.flush().await
    })
    .await;
    Ok(())
}
