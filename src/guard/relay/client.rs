//! The client's frames, on their way to the application: the preface, each
//! frame by type, header blocks gathered and decoded, and each new stream
//! decided (forwarded, refused, answered alone, or a WebSocket served here).

use super::*;

impl Relay<'_> {
    pub(super) fn client_frames(&mut self, now: Instant) -> Result<(), Failure> {
        // Offsets into `to_app` from before its last write are stale.
        self.unsent = None;
        if self.preface {
            let n = self.client.read.len().min(H2_PREFACE.len());
            if self.client.read[..n] != H2_PREFACE[..n] {
                return Err(Failure::Protocol(
                    "the client did not start with the HTTP/2 preface",
                ));
            }
            if n < H2_PREFACE.len() {
                return Ok(());
            }
            self.app.write.extend_from_slice(H2_PREFACE);
            self.preface = false;
            self.client.read.advance(H2_PREFACE.len());
        }
        if self.handshake {
            // Held until the application shows it speaks HTTP/2.
            return Ok(());
        }
        let buf = std::mem::take(&mut self.client.read);
        let result = self.each_frame(&buf, MAX_FRAME as usize, |relay, h, frame| {
            // PING, SETTINGS and RST_STREAM cost the application work for
            // free: past their rate the relay stops reading the client
            // until the next token is due (see `super::flood`).
            if let Err(until) = relay.buckets.take(h.kind, now) {
                relay.throttled_until = Some(until);
                return Ok(false);
            }
            relay.client_frame(h, frame, now).map(|()| true)
        });
        self.client.read = keep_rest(buf, result?);
        Ok(())
    }

    /// Calls `f` on each whole frame of `buf`; returns where the first
    /// incomplete frame starts. A frame larger than `max` is the sender's
    /// FRAME_SIZE_ERROR (for the application's frames, see `app_frames`).
    pub(super) fn each_frame(
        &mut self,
        buf: &[u8],
        max: usize,
        mut f: impl FnMut(&mut Self, Head, &[u8]) -> Result<bool, Failure>,
    ) -> Result<usize, Failure> {
        let mut at = 0;
        while let Some(h) = wire::head(&buf[at..]) {
            if h.len > max {
                return Err(Failure::FrameSize(
                    "a frame larger than SETTINGS_MAX_FRAME_SIZE",
                ));
            }
            let end = at + wire::FRAME_HEADER + h.len;
            if buf.len() < end {
                break;
            }
            if !f(self, h, &buf[at..end])? {
                break;
            }
            at = end;
        }
        Ok(at)
    }

    pub(super) fn client_frame(
        &mut self,
        h: Head,
        frame: &[u8],
        now: Instant,
    ) -> Result<(), Failure> {
        let payload = &frame[wire::FRAME_HEADER..];
        if self.client.block.is_some() && h.kind != wire::CONTINUATION {
            return Err(Failure::Protocol(
                "a header block was interrupted by another frame",
            ));
        }
        match h.kind {
            wire::HEADERS => {
                let fragment = wire::content(h, payload)?;
                self.client_fragment(Block::start(h), h, frame, fragment, now)
            }
            wire::CONTINUATION => {
                let block = self
                    .client
                    .block
                    .take()
                    .filter(|b| b.id == h.id)
                    .ok_or(Failure::Protocol("CONTINUATION without its HEADERS"))?;
                self.client_fragment(block, h, frame, payload, now)
            }
            wire::DATA if self.locals.contains_key(&h.id) => {
                let data = wire::content(h, payload)?;
                // Padding is given back at once, the data as the task takes it.
                let padding = (h.len - data.len()) as u32;
                wire::window_update(&mut self.client.write, h.id, padding);
                wire::window_update(&mut self.client.write, 0, padding);
                if let Some(l) = self.locals.get_mut(&h.id) {
                    l.to_task.extend_from_slice(data);
                    l.client_eof |= h.flags & wire::END_STREAM != 0;
                }
                Ok(())
            }
            wire::DATA => {
                match self.streams.get_mut(&h.id) {
                    Some(s) => {
                        self.app.write.extend_from_slice(frame);
                        if h.flags & wire::END_STREAM != 0 {
                            s.req_done = true;
                            self.maybe_done(h.id);
                        }
                    }
                    // A stream the guard ended or refused: the application
                    // never sees this data, so the connection window it took
                    // is given back here.
                    None if h.id <= self.last_id => {
                        wire::window_update(&mut self.client.write, 0, h.len as u32)
                    }
                    // Alone, the guard is the server that judges it.
                    None if self.alone => {
                        return Err(Failure::Protocol("DATA on an idle stream"));
                    }
                    None => self.app.write.extend_from_slice(frame),
                }
                Ok(())
            }
            wire::RST_STREAM if self.locals.remove(&h.id).is_some() => Ok(()),
            wire::RST_STREAM => {
                if let Some(s) = self.streams.remove(&h.id) {
                    if self.client_reset.len() >= 64 {
                        self.client_reset.pop_front();
                    }
                    self.client_reset.push_back(h.id);
                    match self.unsent.take() {
                        // Reset before its request left: the application
                        // never gets it (as the h2 path never forwards a
                        // stream the client reset before it was taken).
                        Some((id, start, end, indexed))
                            if id == h.id && end == self.app.write.len() =>
                        {
                            self.app.write.truncate(start);
                            self.dropped_block(&wire::Fields {
                                indexed,
                                ..wire::Fields::default()
                            });
                        }
                        _ => self.app.write.extend_from_slice(frame),
                    }
                    if !s.answered()
                        && now.saturating_duration_since(s.started) < PREMATURE_LIFETIME
                    {
                        self.resets.premature();
                    }
                    self.finish(s, Outcome::ClientGone);
                }
                Ok(())
            }
            wire::SETTINGS | wire::PING | wire::GOAWAY if h.id != 0 => Err(Failure::Protocol(
                "a connection-level frame (SETTINGS, PING or GOAWAY) on a stream",
            )),
            wire::SETTINGS if !settings_size_ok(h) => Err(Failure::FrameSize("SETTINGS")),
            wire::PING if h.len != 8 => Err(Failure::FrameSize("PING")),
            wire::SETTINGS if h.flags & wire::ACK == 0 => {
                let mut payload = payload.to_vec();
                let mut table = None;
                wire::rewrite_settings(&mut payload, |id, v| match id {
                    wire::HEADER_TABLE_SIZE => {
                        // The application's encoder may use up to this.
                        table = Some(v);
                        self.app.hpack.allow(v);
                        v
                    }
                    wire::MAX_FRAME_SIZE => {
                        let v = v.min(MAX_FRAME);
                        self.client.frame = v as usize;
                        self.client_frame_max = self.client_frame_max.max(v as usize);
                        v
                    }
                    wire::INITIAL_WINDOW_SIZE => {
                        let delta = i64::from(v) - self.client_window;
                        self.client_window = i64::from(v);
                        for l in self.locals.values_mut() {
                            l.window += delta;
                        }
                        for s in self.streams.values_mut() {
                            s.window += delta;
                        }
                        v
                    }
                    _ => v,
                });
                if self.settings_unacked.len() >= SETTINGS_UNACKED_MAX {
                    return Err(Failure::Calm);
                }
                wire::put(&mut self.app.write, wire::SETTINGS, h.flags, 0, &payload);
                self.settings_unacked.push_back(Unacked::Client(table));
                if self.alone {
                    self.settings_acked(now);
                }
                Ok(())
            }
            wire::PING if self.alone && h.flags & wire::ACK == 0 => {
                let mut opaque = [0u8; 8];
                opaque.copy_from_slice(payload);
                wire::ping(&mut self.client.write, true, opaque);
                Ok(())
            }
            wire::PING if h.flags & wire::ACK != 0 && payload == self.probe && self.probe_out => {
                self.probe_out = false;
                self.step(Input::Acked, now);
                Ok(())
            }
            wire::WINDOW_UPDATE if h.id == 0 => {
                let credit = window_increment(payload)?;
                self.client_credit(credit)
            }
            wire::WINDOW_UPDATE if self.locals.contains_key(&h.id) => {
                let credit = window_increment(payload)?;
                if let Some(l) = self.locals.get_mut(&h.id) {
                    l.window += i64::from(credit);
                }
                Ok(())
            }
            wire::WINDOW_UPDATE if h.id != 0 => {
                let credit = window_increment(payload)?;
                if let Some(s) = self.streams.get_mut(&h.id) {
                    s.window += i64::from(credit);
                    if s.window > 0 {
                        s.shut_since = None;
                    }
                    let ending = s.ending.is_some();
                    self.app.write.extend_from_slice(frame);
                    if ending {
                        // An end of the guard's own may have waited for it.
                        self.advance(h.id, now);
                    }
                }
                Ok(())
            }
            _ => {
                self.app.write.extend_from_slice(frame);
                Ok(())
            }
        }
    }

    /// One fragment of a client header block; the block is read, and its
    /// frames go on, once it is whole.
    pub(super) fn client_fragment(
        &mut self,
        mut block: Block,
        h: Head,
        frame: &[u8],
        fragment: &[u8],
        now: Instant,
    ) -> Result<(), Failure> {
        let limit = self.guard.config().limits.max_header_list_size as usize;
        if h.flags & wire::END_HEADERS == 0 {
            block.gather(frame, fragment);
            // A block this large, or in this many pieces, is a flood: h2
            // stacks buffer it whole before they can refuse it.
            if block.fragment.len() > 2 * limit + DEFAULT_FRAME
                || block.continuations > MAX_CONTINUATIONS
            {
                return Err(Failure::Calm);
            }
            self.client.block = Some(block);
            return Ok(());
        }
        // Whole: decode it (the application's table follows the client's).
        let mut encoded = std::mem::take(&mut self.scratch);
        block.whole_into(fragment, &mut encoded);
        // Every field is kept: a re-encoded block, and a WebSocket the
        // guard serves itself, need them all.
        let mut all = std::mem::take(&mut self.all);
        all.clear();
        let fields = wire::decode(
            &mut self.client.hpack,
            &mut encoded,
            limit * BOMB_FACTOR,
            Some(&mut all),
        );
        self.scratch = encoded;
        let result = self.client_block_whole(block, frame, fields, &all, limit, now);
        self.all = all;
        result
    }

    /// A whole client block, decoded: forwarded, answered, or served here.
    pub(super) fn client_block_whole(
        &mut self,
        block: Block,
        frame: &[u8],
        fields: Result<wire::Fields, wire::BlockError>,
        all_fields: &[wire::Field],
        limit: usize,
        now: Instant,
    ) -> Result<(), Failure> {
        let all = self.app.translate.is_some().then_some(all_fields);
        let fields = fields.map_err(|e| match e {
            wire::BlockError::Compression => Failure::Compression,
            wire::BlockError::TooLarge => Failure::Calm,
        })?;
        let id = block.id;
        let fresh = id > self.last_id && id % 2 == 1;
        if self.alone && !fresh && id > self.last_id {
            return Err(Failure::Protocol("a stream id the client may not open"));
        }
        if !fresh {
            // Trailers (or a bad block, which the application judges).
            match self.streams.get_mut(&id) {
                Some(s) => {
                    if block.end_stream {
                        s.req_done = true;
                    }
                    self.forward_block(&block, frame, all, false);
                    self.maybe_done(id);
                }
                None if id <= self.last_id => {
                    if let Some(l) = self.locals.get_mut(&id) {
                        l.client_eof |= block.end_stream;
                    }
                    self.dropped_block(&fields)
                }
                None => self.forward_block(&block, frame, all, false),
            }
            return Ok(());
        }
        self.last_id = id;
        self.step(Input::StreamAccepted, now);
        if self.told_empty {
            // Busy again (the idle timer stops), even if this stream ends
            // in this same batch: the next turn reports "none" afresh.
            self.told_empty = false;
            self.step(Input::Streams(1), now);
        }
        if let Some(refusal) = self.admission(&fields, limit) {
            // Never forwarded: a refused stream is one the application
            // never saw, so the client may retry it anywhere.
            self.dropped_block(&fields);
            self.refuse(id, block.end_stream, refusal);
            return Ok(());
        }
        if fields.method.as_deref() == Some("CONNECT")
            && fields
                .protocol
                .as_deref()
                .is_some_and(|p| p.eq_ignore_ascii_case("websocket"))
        {
            // RFC 8441: served here over HTTP/1.1 to the application, as
            // the h2 path does (see `super::connect`).
            self.dropped_block(&fields);
            self.websocket(id, block.end_stream, all_fields);
            return Ok(());
        }
        if self.alone {
            if self.admit(id, block.end_stream, &fields, now) {
                self.unavailable(id);
            }
            return Ok(());
        }
        let start = self.app.write.len();
        self.forward_block(&block, frame, all, true);
        if self.admit(id, block.end_stream, &fields, now) {
            self.unsent = Some((id, start, self.app.write.len(), fields.indexed));
        } else {
            // Refused by the registry: take the request back.
            self.app.write.truncate(start);
            self.dropped_block(&fields);
        }
        Ok(())
    }
}

/// A SETTINGS frame's length: a multiple of 6, and 0 for an ack (RFC 9113 §6.5).
pub(super) fn settings_size_ok(h: Head) -> bool {
    if h.flags & wire::ACK != 0 {
        h.len == 0
    } else {
        h.len.is_multiple_of(6)
    }
}

/// A WINDOW_UPDATE's increment.
pub(super) fn window_increment(payload: &[u8]) -> Result<u32, Failure> {
    let b: [u8; 4] = payload
        .try_into()
        .map_err(|_| Failure::Protocol("malformed WINDOW_UPDATE frame"))?;
    Ok(u32::from_be_bytes(b) & wire::MAX_STREAM_ID)
}
