//! The client's frames, on their way to the application: the preface, each
//! frame by type, header blocks gathered and decoded, and each new stream
//! decided (forwarded, refused, answered alone, or a WebSocket served here).
//!
//! The guard is the client's server, so what RFC 9113 makes an error of the
//! client's it answers itself, with the code the RFC names, and never
//! passes on: a frame on the wrong stream or of the wrong size, one on an
//! idle stream or after the client ended its side (§5.1), a setting out of
//! its range, a window past 2^31-1, a malformed request (§8.1, see
//! `super::admit`). A connection error is a GOAWAY (`Failure`); a stream
//! error a RST_STREAM to the client, with the application's stream, if it
//! had one, cancelled ([`Relay::stream_error`]).

use bytes::Buf;
use tokio::time::Instant;

use super::admit::{malformed_request, trailers_ok, Refusal};
use super::connect;
use super::ending::StreamOutcome;
use super::failure::Failure;
use super::limits::{BOMB_FACTOR, DEFAULT_FRAME, MAX_WINDOW};
use super::local::connect_head;
use super::peer::{Block, Gathered};
use super::rapid::PREMATURE_LIFETIME;
use super::settings::{Unacked, UNACKED_RETRY};
use super::streams::Stream;
use super::wire::{self, Head};
use super::Relay;
use crate::guard::lifecycle::Input;
use crate::guard::sniff::H2_PREFACE;

impl Relay<'_> {
    pub(super) fn client_frames(&mut self, now: Instant) -> Result<(), Failure> {
        // Offsets into `to_app` from before its last write are stale.
        self.forward.forget();
        if self.handshake.client_preface {
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
            self.handshake.client_preface = false;
            self.client.read.advance(H2_PREFACE.len());
        }
        if self.handshake.app_pending {
            // Held until the application shows it speaks HTTP/2.
            return Ok(());
        }
        let mut frames = self.client.frames(self.app.frame_max());
        while let Some((h, frame)) = frames.next()? {
            if self.settings_waits(h, now) {
                break;
            }
            // PING, SETTINGS and RST_STREAM cost the application work for
            // free: past their rate the relay stops reading the client
            // until the next token is due (see `super::flood`). Not
            // WINDOW_UPDATE: it is passed on one for one and costs O(1)
            // (some stacks send one per DATA frame: h2, oghttp2, Go's).
            if !self.defences.take(h.kind, now) {
                break;
            }
            self.client_frame(h, frame, now)?;
            frames.handled(h);
        }
        self.client.keep(frames);
        Ok(())
    }

    /// A client SETTINGS waits while `MAX_UNACKED_SETTINGS` of its SETTINGS
    /// are unacked: reading the client pauses, as for a flood bucket, and
    /// is tried again shortly (the application's acks do not wake it).
    fn settings_waits(&mut self, h: Head, now: Instant) -> bool {
        let waits = h.kind == wire::SETTINGS && h.flags & wire::ACK == 0 && self.settings.full();
        if waits {
            self.defences.pause_until(now + UNACKED_RETRY);
        }
        waits
    }

    pub(super) fn client_frame(
        &mut self,
        h: Head,
        frame: &[u8],
        now: Instant,
    ) -> Result<(), Failure> {
        let payload = &frame[wire::FRAME_HEADER..];
        if self.client.interrupts(h) {
            return Err(Failure::Protocol(
                "a header block was interrupted by another frame",
            ));
        }
        if std::mem::take(&mut self.handshake.settings_due)
            && (h.kind != wire::SETTINGS || h.flags & wire::ACK != 0)
        {
            return Err(Failure::Protocol(
                "the client's preface did not end with its SETTINGS",
            ));
        }
        if h.id == 0 && wire::needs_stream(h.kind) {
            return Err(Failure::Protocol("a stream's frame on stream 0"));
        }
        match h.kind {
            wire::HEADERS => {
                let fragment = wire::content(h, payload)?;
                let mut block = Block::start(h);
                block.self_dependent = wire::headers_dependency(h, payload) == Some(h.id);
                self.client_fragment(block, h, frame, fragment, now)
            }
            wire::CONTINUATION => {
                let block = self
                    .client
                    .continued(h)
                    .ok_or(Failure::Protocol("CONTINUATION without its HEADERS"))?;
                self.client_fragment(block, h, frame, payload, now)
            }
            wire::DATA => self.client_data(h, frame, now),
            wire::RST_STREAM => self.client_reset(h, frame, now),
            wire::PRIORITY_FRAME => self.client_priority(h, frame, now),
            // RFC 9113 §8.4: a client cannot push.
            wire::PUSH_PROMISE => Err(Failure::Protocol("a PUSH_PROMISE from the client")),
            wire::SETTINGS | wire::PING | wire::GOAWAY if h.id != 0 => Err(Failure::Protocol(
                "a connection-level frame (SETTINGS, PING or GOAWAY) on a stream",
            )),
            wire::SETTINGS if !settings_size_ok(h) => Err(Failure::FrameSize("SETTINGS")),
            wire::PING if h.len != 8 => Err(Failure::FrameSize("PING")),
            // Too short for its last stream and error code (RFC 9113 §4.2).
            wire::GOAWAY if h.len < 8 => Err(Failure::FrameSize("GOAWAY")),
            wire::SETTINGS if h.flags & wire::ACK == 0 => self.client_settings(h, payload),
            wire::PING if self.handshake.alone && h.flags & wire::ACK == 0 => {
                let mut opaque = [0u8; 8];
                opaque.copy_from_slice(payload);
                wire::ping(&mut self.client.write, true, opaque);
                Ok(())
            }
            wire::PING if h.flags & wire::ACK != 0 && self.life.probe_acked(payload) => {
                self.step(Input::Acked, now);
                Ok(())
            }
            wire::WINDOW_UPDATE => self.client_window_update(h, frame, now),
            wire::SETTINGS => {
                // The client's ack of the application's SETTINGS (passed on,
                // the app's to pair): a lower stream limit now binds.
                self.settings.client_acked_streams();
                self.app.write.extend_from_slice(frame);
                Ok(())
            }
            _ => {
                self.app.write.extend_from_slice(frame);
                Ok(())
            }
        }
    }

    /// A client DATA frame: to its relayed stream or its local one, or,
    /// on a stream that is over, its connection window given back.
    fn client_data(&mut self, h: Head, frame: &[u8], now: Instant) -> Result<(), Failure> {
        // Padding longer than the frame is PROTOCOL_ERROR (RFC 9113 §6.1),
        // whatever the stream.
        let data = wire::content(h, &frame[wire::FRAME_HEADER..])?;
        let end = h.flags & wire::END_STREAM != 0;
        if self.locals.contains_key(&h.id) {
            let local = self
                .locals
                .data(h, data, &mut self.client.write, &mut self.ids);
            if let Some(code) = local {
                self.stream_error(h.id, code, now);
            }
            return Ok(());
        }
        if let Some(req_done) = self.streams.get(&h.id).map(Stream::req_done) {
            let error = if req_done {
                // Half-closed (remote): RFC 9113 §5.1.
                Some(wire::STREAM_CLOSED)
            } else if !self.body_data(h.id, data.len(), end) {
                Some(wire::PROTOCOL_ERROR)
            } else {
                None
            };
            if let Some(code) = error {
                self.give_back(h);
                self.stream_error(h.id, code, now);
                return Ok(());
            }
            if self.app_cancelled(h.id) {
                // The guard is ending it and cancelled the application's
                // stream: there this would be DATA on a closed stream.
                self.give_back(h);
            } else {
                self.app.write.extend_from_slice(frame);
            }
            if end {
                self.ids.closed(h.id);
                if let Some(s) = self.streams.get_mut(&h.id) {
                    s.request_ended();
                }
                self.maybe_done(h.id);
            }
            return Ok(());
        }
        if self.ids.idle(h.id) {
            return Err(Failure::Protocol("DATA on an idle stream"));
        }
        // A stream that is over: the application never sees this data, so
        // the connection window it took is given back here.
        self.give_back(h);
        if self.ids.ended(h.id) {
            wire::rst(&mut self.client.write, h.id, wire::STREAM_CLOSED);
        }
        Ok(())
    }

    /// The connection window a client DATA frame took, given back: the
    /// application never sees the frame.
    fn give_back(&mut self, h: Head) {
        wire::window_update(&mut self.client.write, 0, h.len as u32);
    }

    /// A client RST_STREAM: its relayed stream reset at the application
    /// (or, not sent yet, taken back), its local stream dropped.
    fn client_reset(&mut self, h: Head, frame: &[u8], now: Instant) -> Result<(), Failure> {
        if h.len != 4 {
            return Err(Failure::FrameSize("RST_STREAM"));
        }
        if self.ids.idle(h.id) {
            return Err(Failure::Protocol("RST_STREAM on an idle stream"));
        }
        self.ids.cancelled(h.id);
        if self.locals.contains_key(&h.id) {
            self.locals.drop(h.id, &mut self.client.write);
            return Ok(());
        }
        let Some(s) = self.streams.remove(&h.id) else {
            return Ok(());
        };
        self.ids.reset(h.id);
        if !self.take_back(h.id) {
            self.app.write.extend_from_slice(frame);
        }
        if !s.answered() && now.saturating_duration_since(s.started()) < PREMATURE_LIFETIME {
            self.defences.premature();
        }
        self.finish(s, StreamOutcome::ClientGone);
        Ok(())
    }

    /// Takes back stream `id`'s request if it is the last thing in `to_app`
    /// and not written yet: the application never gets a stream the client
    /// reset before it was sent on. True if it was.
    fn take_back(&mut self, id: u32) -> bool {
        let Some(indexed) = self.forward.take_back(id, &mut self.app.write) else {
            return false;
        };
        self.dropped_block(&wire::Fields {
            indexed,
            ..wire::Fields::default()
        });
        true
    }

    /// A client PRIORITY frame: passed on (the application may use it),
    /// unless it is of the wrong size or makes its stream depend on itself
    /// (RFC 9113 §6.3, §5.3.1): a stream error on an open stream, a
    /// connection error where no RST_STREAM may go (idle, closed).
    fn client_priority(&mut self, h: Head, frame: &[u8], now: Instant) -> Result<(), Failure> {
        let payload = &frame[wire::FRAME_HEADER..];
        let (code, failure) = if h.len != 5 {
            (wire::FRAME_SIZE_ERROR, Failure::FrameSize("PRIORITY"))
        } else if wire::dependency(payload) == Some(h.id) {
            (
                wire::PROTOCOL_ERROR,
                Failure::Protocol("a stream that depends on itself"),
            )
        } else {
            self.app.write.extend_from_slice(frame);
            return Ok(());
        };
        if !self.open(h.id) {
            return Err(failure);
        }
        self.stream_error(h.id, code, now);
        Ok(())
    }

    /// A client WINDOW_UPDATE: the connection's (the guard owns that
    /// window), a local stream's, or a relayed stream's, passed on.
    fn client_window_update(&mut self, h: Head, frame: &[u8], now: Instant) -> Result<(), Failure> {
        let credit = window_increment(&frame[wire::FRAME_HEADER..])?;
        if h.id == 0 {
            return self.client_credit(credit);
        }
        if self.ids.idle(h.id) {
            return Err(Failure::Protocol("WINDOW_UPDATE on an idle stream"));
        }
        let window = if let Some(l) = self.locals.get_mut(&h.id) {
            l.window += i64::from(credit);
            l.window
        } else if let Some(s) = self.streams.get_mut(&h.id) {
            s.credit(i64::from(credit))
        } else {
            // A stream that is over: a WINDOW_UPDATE may still come (§5.1).
            return Ok(());
        };
        let error = if credit == 0 {
            // RFC 9113 §6.9: a stream error on a stream.
            Some(wire::PROTOCOL_ERROR)
        } else if window > MAX_WINDOW {
            // RFC 9113 §6.9.1.
            Some(wire::FLOW_CONTROL_ERROR)
        } else {
            None
        };
        if let Some(code) = error {
            self.stream_error(h.id, code, now);
            return Ok(());
        }
        if let Some(s) = self.streams.get(&h.id) {
            if s.window() > 0 {
                self.endings.stalled.remove(&h.id);
            }
            let ending = s.ending().is_some();
            // Not to a stream the guard cancelled at the app (§5.1).
            if !s.app_cancelled() {
                self.app.write.extend_from_slice(frame);
            }
            if ending {
                // An end of the guard's own may have waited for it.
                self.advance(h.id, now);
            }
        }
        Ok(())
    }

    /// The client's connection WINDOW_UPDATE: what the guard does not
    /// withhold of it goes to the application (see [`super::window`]).
    pub(super) fn client_credit(&mut self, credit: u32) -> Result<(), Failure> {
        let to_app = self.window.credit(credit)?;
        wire::window_update(&mut self.app.write, 0, to_app);
        Ok(())
    }

    /// A client SETTINGS (not an ack): judged, applied to what the guard
    /// keeps of the client, and passed on lowered to the guard's limits.
    fn client_settings(&mut self, h: Head, payload: &[u8]) -> Result<(), Failure> {
        for (id, v) in wire::settings(payload) {
            match wire::setting_error(id, v) {
                None => {}
                Some(wire::FLOW_CONTROL_ERROR) => {
                    tracing::debug!(
                        conn = self.info.id,
                        value = v,
                        "guard: the client's SETTINGS_INITIAL_WINDOW_SIZE is above 2^31-1"
                    );
                    return Err(Failure::FlowControl);
                }
                Some(_) => return Err(Failure::Protocol("a SETTINGS value out of its range")),
            }
        }
        let mut payload = payload.to_vec();
        let mut table = None;
        let mut grew = false;
        wire::rewrite_settings(&mut payload, |id, v| match id {
            wire::HEADER_TABLE_SIZE => {
                // The application's encoder may use up to this.
                table = Some(v);
                self.app.allow_table(v);
                v
            }
            wire::MAX_FRAME_SIZE => self.client.announce_frame(v),
            wire::INITIAL_WINDOW_SIZE => {
                let delta = self.window.set_initial(v);
                grew |= delta > 0;
                for l in self.locals.values_mut() {
                    l.window += delta;
                }
                for s in self.streams.values_mut() {
                    s.grow_window(delta);
                }
                v
            }
            _ => v,
        });
        let past_max = |w: i64| w > MAX_WINDOW;
        if grew
            && (self.streams.values().any(|s| past_max(s.window()))
                || self.locals.values().any(|l| past_max(l.window)))
        {
            // RFC 9113 §6.9.2: a connection error.
            tracing::debug!(conn = self.info.id, "guard: the client's SETTINGS_INITIAL_WINDOW_SIZE took a stream's window past 2^31-1");
            return Err(Failure::FlowControl);
        }
        wire::put(&mut self.app.write, wire::SETTINGS, h.flags, 0, &payload);
        // Every one is kept (`settings_waits` bounds them): each ack of the
        // application's pairs with its own frame.
        self.settings.sent(Unacked::Client(table));
        if self.handshake.alone {
            self.settings_acked();
        }
        Ok(())
    }

    /// One fragment of a client header block; the block is read, and its
    /// frames go on, once it is whole.
    pub(super) fn client_fragment(
        &mut self,
        block: Block,
        h: Head,
        frame: &[u8],
        fragment: &[u8],
        now: Instant,
    ) -> Result<(), Failure> {
        let limit = self.guard.config().limits.max_header_list_size as usize;
        let block = match self
            .client
            .gather(block, h, frame, fragment, 2 * limit + DEFAULT_FRAME)
        {
            Gathered::More => return Ok(()),
            Gathered::Flood => return Err(Failure::Calm),
            Gathered::Whole(block) => block,
        };
        // Whole: decode it (the application's table follows the client's).
        // Every field is kept: a re-encoded block, and a WebSocket the
        // guard serves itself, need them all.
        let (fields, all) = self.client.decode(limit * BOMB_FACTOR, true);
        let result = self.client_block_whole(block, frame, fields, &all, limit, now);
        self.client.reuse(all);
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
        let all = self.app.translates().then_some(all_fields);
        let fields = fields.map_err(|e| match e {
            wire::BlockError::Compression => Failure::Compression,
            wire::BlockError::TooLarge => Failure::Calm,
        })?;
        let id = block.id;
        let self_dependent = block.self_dependent;
        if id.is_multiple_of(2) {
            // Only the server opens even streams, and the guard passes no
            // push on (RFC 9113 §5.1.1).
            return Err(Failure::Protocol("a stream id the client may not open"));
        }
        if id <= self.ids.last() {
            let trailers = Trailers {
                fields: &fields,
                bad: self_dependent || !trailers_ok(all_fields),
            };
            return self.client_trailers(&block, frame, trailers, all, now);
        }
        self.ids.opened(id);
        self.step(Input::StreamAccepted, now);
        if self.life.busy_again() {
            self.step(Input::Streams(1), now);
        }
        if block.end_stream {
            self.ids.closed(id);
        }
        let malformed = malformed_request(all_fields, block.end_stream)
            .or(self_dependent.then_some("a stream that depends on itself"));
        let refusal = match malformed {
            Some(why) => {
                tracing::debug!(
                    conn = self.info.id,
                    stream = id,
                    why,
                    "guard: a malformed request; RST_STREAM(PROTOCOL_ERROR)"
                );
                Some(Refusal::Malformed)
            }
            None => self.admission(&fields, limit),
        };
        if let Some(refusal) = refusal {
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
            // RFC 8441: served here over HTTP/1.1 to the application
            // (see `super::connect`).
            self.dropped_block(&fields);
            self.websocket(id, block.end_stream, all_fields);
            return Ok(());
        }
        if self.handshake.alone {
            if self.admit(id, block.end_stream, &fields, now) {
                self.unavailable(id);
            }
            return Ok(());
        }
        let start = self.app.write.len();
        self.forward_block(&block, frame, all, true);
        if self.admit(id, block.end_stream, &fields, now) {
            self.forward
                .sent(id, start, self.app.write.len(), fields.indexed);
            self.body_start(id, all_fields, block.end_stream);
        } else {
            // Refused by the registry: take the request back.
            self.app.write.truncate(start);
            self.dropped_block(&fields);
        }
        Ok(())
    }

    /// A block on a stream the client opened before: trailers (passed on if
    /// they end a request properly), or an error of the client's.
    fn client_trailers(
        &mut self,
        block: &Block,
        frame: &[u8],
        t: Trailers<'_>,
        all: Option<&[wire::Field]>,
        now: Instant,
    ) -> Result<(), Failure> {
        let id = block.id;
        let open = self
            .streams
            .get(&id)
            .map(Stream::req_done)
            .or(self.locals.get(&id).map(|l| l.client_eof));
        let error = match open {
            // Half-closed (remote): RFC 9113 §5.1.
            Some(true) => Some(wire::STREAM_CLOSED),
            // Trailers end the stream and carry no pseudo-header (§8.1),
            // and the request's DATA added up to its content-length.
            Some(false) if t.bad || !block.end_stream || !self.body_data(id, 0, true) => {
                Some(wire::PROTOCOL_ERROR)
            }
            Some(false) => None,
            None => {
                self.dropped_block(t.fields);
                if self.ids.finished(id) {
                    return Err(Failure::StreamClosed(
                        "HEADERS on a stream the client ended and that is closed",
                    ));
                }
                if self.ids.skipped(id) {
                    return Err(Failure::Protocol(
                        "a stream id lower than one the client opened",
                    ));
                }
                if self.ids.ended(id) {
                    wire::rst(&mut self.client.write, id, wire::STREAM_CLOSED);
                } else if !block.end_stream {
                    // Not trailers (they end the stream): a request on an
                    // id used before (RFC 9113 §5.1.1).
                    return Err(Failure::Protocol("a stream id used before"));
                }
                // Otherwise trailers on a stream the guard (or the
                // application) reset, which the client may not have seen
                // yet: dropped.
                return Ok(());
            }
        };
        if block.end_stream {
            self.ids.closed(id);
        }
        if let Some(code) = error {
            self.dropped_block(t.fields);
            self.stream_error(id, code, now);
            return Ok(());
        }
        if let Some(l) = self.locals.get_mut(&id) {
            // The guard's own stream: its trailers go nowhere.
            l.client_eof = true;
            self.dropped_block(t.fields);
            return Ok(());
        }
        if let Some(s) = self.streams.get_mut(&id) {
            s.request_ended();
        }
        if self.app_cancelled(id) {
            // The guard cancelled the application's side while it ends the
            // stream: there the trailers would be a frame on a closed
            // stream (RFC 9113 §5.1), which the app may answer with a
            // connection error.
            self.dropped_block(t.fields);
        } else {
            self.forward_block(block, frame, all, false);
        }
        self.maybe_done(id);
        Ok(())
    }

    /// A stream error of the client's (RFC 9113 §5.4.2): RST_STREAM `code`
    /// to it, and its stream is over here. A relayed stream is cancelled at
    /// the application (or taken back, not sent yet) and counted as the
    /// client's, a local one dropped.
    pub(super) fn stream_error(&mut self, id: u32, code: u32, now: Instant) {
        tracing::debug!(
            conn = self.info.id,
            stream = id,
            code,
            "guard: a stream error of the client's; RST_STREAM"
        );
        wire::rst(&mut self.client.write, id, code);
        if self.locals.contains_key(&id) {
            self.locals.drop(id, &mut self.client.write);
        }
        let Some(s) = self.streams.remove(&id) else {
            return;
        };
        if !self.take_back(id) {
            wire::rst(&mut self.app.write, id, wire::CANCEL);
        }
        // The application got a request and its reset: as a client's
        // reset would, it counts for rapid reset.
        if !s.answered() && now.saturating_duration_since(s.started()) < PREMATURE_LIFETIME {
            self.defences.premature();
        }
        self.finish(s, StreamOutcome::ClientGone);
    }

    /// Passes a whole client block on: as it came (with the client's
    /// address added to a request's), or re-encoded while the application's
    /// table is the guard's own (see the module doc).
    fn forward_block(
        &mut self,
        block: &Block,
        last: &[u8],
        all: Option<&[wire::Field]>,
        request: bool,
    ) {
        let xff = request.then(|| self.forward.xff());
        match all {
            Some(all) => self.app.put_literals(block, all, None, xff),
            None => self.app.put_as_came(block, last, xff),
        }
    }

    /// A client block the application does not get: if it changed the
    /// client's table, the application's no longer follows it, and the
    /// guard re-encodes from now on.
    fn dropped_block(&mut self, fields: &wire::Fields) {
        if self.app.missed_block(fields.indexed) {
            tracing::debug!(conn = self.info.id, "guard: a client header block the application did not get changed its HPACK table; re-encoding the client's blocks from now on");
        }
    }

    /// Starts the task that serves a WebSocket over HTTP/2 (RFC 8441).
    fn websocket(&mut self, id: u32, end_stream: bool, fields: &[wire::Field]) {
        let guard = self.guard;
        let reg = match guard.try_register(self.info.id, false) {
            Ok(r) => r,
            Err(_) => return self.refuse(id, end_stream, Refusal::Reset),
        };
        let Some(head) = connect_head(fields) else {
            wire::rst(&mut self.client.write, id, wire::PROTOCOL_ERROR);
            return;
        };
        let (task_io, tx) = self.locals.open(id, end_stream, &self.window);
        guard.spawn(connect::proxy(
            guard.clone(),
            reg,
            head,
            task_io,
            tx,
            self.info,
        ));
    }

    /// Whether stream `id` is open here (relayed, or a local one).
    fn open(&self, id: u32) -> bool {
        self.streams.contains_key(&id) || self.locals.contains_key(&id)
    }
}

/// A decoded block on a stream the client opened before.
struct Trailers<'f> {
    fields: &'f wire::Fields,
    /// Malformed as trailers (a pseudo-header, RFC 9113 §8.1), or its
    /// HEADERS made the stream depend on itself.
    bad: bool,
}

/// A SETTINGS frame's length: a multiple of 6, and 0 for an ack (RFC 9113 §6.5).
pub(super) fn settings_size_ok(h: Head) -> bool {
    if h.flags & wire::ACK != 0 {
        h.len == 0
    } else {
        h.len.is_multiple_of(6)
    }
}

/// A WINDOW_UPDATE's increment; any length but 4 is FRAME_SIZE_ERROR
/// (RFC 9113 §6.9).
pub(super) fn window_increment(payload: &[u8]) -> Result<u32, Failure> {
    let b: [u8; 4] = payload
        .try_into()
        .map_err(|_| Failure::FrameSize("WINDOW_UPDATE"))?;
    Ok(u32::from_be_bytes(b) & wire::MAX_STREAM_ID)
}
