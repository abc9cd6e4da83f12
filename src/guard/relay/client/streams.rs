//! The client's frames on its streams, once its side judged them (see
//! `super`): DATA, RST_STREAM, PRIORITY and WINDOW_UPDATE to their
//! streams, a SETTINGS applied and passed on, header blocks gathered and
//! decoded, and each new stream decided (forwarded, refused, answered
//! alone, or a WebSocket served here). They work on [`Conn`], with what
//! the client's side keeps of its requests beside it ([`Kept`]).

use tokio::time::Instant;

use crate::guard::grpc;
use crate::guard::lifecycle::Input;
use crate::guard::relay::admit;
use crate::guard::relay::admit::{
    admission, body_data, body_start, malformed_request, register, trailers_ok, Refusal,
};
use crate::guard::relay::blocks::{trailers_only, Forward};
use crate::guard::relay::connect;
use crate::guard::relay::defences::Defences;
use crate::guard::relay::ending::StreamOutcome;
use crate::guard::relay::failure::Failure;
use crate::guard::relay::goaway::Conn;
use crate::guard::relay::limits::{BOMB_FACTOR, DEFAULT_FRAME, MAX_WINDOW};
use crate::guard::relay::local::connect_head;
use crate::guard::relay::peer::{Block, Gathered};
use crate::guard::relay::rapid::PREMATURE_LIFETIME;
use crate::guard::relay::settings::Unacked;
use crate::guard::relay::streams::Stream;
use crate::guard::relay::wire::{self, Head};

/// What the client's side keeps of its requests, beyond their ids, lent
/// beside [`Conn`] for one frame: what goes with each forwarded request
/// (its `x-forwarded-for`, the last one still takable back), and the
/// defences its streams' resets and admissions feed (rapid reset).
pub(in crate::guard::relay) struct Kept<'a> {
    pub(in crate::guard::relay) forward: &'a mut Forward,
    pub(in crate::guard::relay) defences: &'a mut Defences,
}

impl Conn<'_> {
    /// A client DATA frame (`data`, its content): to its relayed stream or
    /// its local one, or, on a stream that is over, its connection window
    /// given back.
    pub(in crate::guard::relay) fn client_data(
        &mut self,
        h: Head,
        frame: &[u8],
        data: &[u8],
        now: Instant,
        k: &mut Kept<'_>,
    ) -> Result<(), Failure> {
        let end = h.flags & wire::END_STREAM != 0;
        if self.locals.contains_key(&h.id) {
            let local = self
                .locals
                .data(h, data, &mut self.ends.client.write, self.ids);
            if let Some(code) = local {
                self.stream_error(h.id, code, now, k);
            }
            return Ok(());
        }
        if let Some(req_done) = self.ends.streams.get(&h.id).map(Stream::req_done) {
            let error = if req_done {
                // Half-closed (remote): RFC 9113 §5.1.
                Some(wire::STREAM_CLOSED)
            } else if !body_data(self.ends.streams, h.id, data.len(), end) {
                Some(wire::PROTOCOL_ERROR)
            } else {
                None
            };
            if let Some(code) = error {
                self.give_back(h);
                self.stream_error(h.id, code, now, k);
                return Ok(());
            }
            if self.ends.streams.app_cancelled(h.id) {
                // The guard is ending it and cancelled the application's
                // stream: there this would be DATA on a closed stream.
                self.give_back(h);
            } else {
                self.ends.app.write.extend_from_slice(frame);
            }
            if end {
                self.ids.closed(h.id);
                if let Some(s) = self.ends.streams.get_mut(&h.id) {
                    s.request_ended();
                }
                self.ends.maybe_done(h.id);
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
            wire::rst(&mut self.ends.client.write, h.id, wire::STREAM_CLOSED);
        }
        Ok(())
    }

    /// The connection window a client DATA frame took, given back: the
    /// application never sees the frame.
    fn give_back(&mut self, h: Head) {
        wire::window_update(&mut self.ends.client.write, 0, h.len as u32);
    }

    /// A client RST_STREAM, judged (`ClientSide::judge`): its relayed
    /// stream reset at the application (or, not sent yet, taken back), its
    /// local stream dropped.
    pub(in crate::guard::relay) fn client_reset(
        &mut self,
        h: Head,
        frame: &[u8],
        now: Instant,
        k: &mut Kept<'_>,
    ) {
        if self.locals.contains_key(&h.id) {
            self.locals.drop(h.id, &mut self.ends.client.write);
            return;
        }
        let Some(s) = self.ends.streams.remove(&h.id) else {
            return;
        };
        self.ids.reset(h.id);
        // Not to a stream the guard already reset at the application: it
        // may not answer a reset, nor take one after its own (§5.1, §5.4.2).
        if !s.app_cancelled() && !self.take_back(h.id, k.forward) {
            self.ends.app.write.extend_from_slice(frame);
        }
        if !s.answered() && now.saturating_duration_since(s.started()) < PREMATURE_LIFETIME {
            k.defences.premature();
        }
        self.ends.finish(s, StreamOutcome::ClientGone);
    }

    /// Takes back stream `id`'s request if it is the last thing in `to_app`
    /// and not written yet: the application never gets a stream the client
    /// reset before it was sent on. True if it was.
    fn take_back(&mut self, id: u32, forward: &mut Forward) -> bool {
        let Some(indexed) = forward.take_back(id, &mut self.ends.app.write) else {
            return false;
        };
        self.dropped_block(&wire::Fields {
            indexed,
            ..wire::Fields::default()
        });
        true
    }

    /// A client PRIORITY frame: passed on (the application may use it),
    /// unless its side found it of the wrong size or making its stream
    /// depend on itself (`error`, RFC 9113 §6.3, §5.3.1): a stream error on
    /// an open stream, a connection error where no RST_STREAM may go (idle,
    /// closed).
    pub(in crate::guard::relay) fn client_priority(
        &mut self,
        h: Head,
        frame: &[u8],
        error: Option<(u32, Failure)>,
        now: Instant,
        k: &mut Kept<'_>,
    ) -> Result<(), Failure> {
        let Some((code, failure)) = error else {
            self.ends.app.write.extend_from_slice(frame);
            return Ok(());
        };
        if !self.open(h.id) {
            return Err(failure);
        }
        self.stream_error(h.id, code, now, k);
        Ok(())
    }

    /// A client WINDOW_UPDATE on a stream it opened (`credit`, its
    /// increment): a local stream's, or a relayed stream's, passed on.
    pub(in crate::guard::relay) fn client_window_update(
        &mut self,
        h: Head,
        frame: &[u8],
        credit: u32,
        now: Instant,
        k: &mut Kept<'_>,
    ) {
        let window = if let Some(l) = self.locals.get_mut(&h.id) {
            l.window += i64::from(credit);
            l.window
        } else if let Some(s) = self.ends.streams.get_mut(&h.id) {
            s.credit(i64::from(credit))
        } else {
            // A stream that is over: a WINDOW_UPDATE may still come (§5.1).
            return;
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
            self.stream_error(h.id, code, now, k);
            return;
        }
        if let Some(s) = self.ends.streams.get(&h.id) {
            if s.window() > 0 {
                self.ends.endings.stalled.remove(&h.id);
            }
            let ending = s.ending().is_some();
            // Not to a stream the guard cancelled at the app (§5.1).
            if !s.app_cancelled() {
                self.ends.app.write.extend_from_slice(frame);
            }
            if ending {
                // An end of the guard's own may have waited for it.
                self.ends.advance(h.id, now);
            }
        }
    }

    /// The client's connection WINDOW_UPDATE: what the guard does not
    /// withhold of it goes to the application (see [`window`](crate::guard::relay::window)).
    pub(in crate::guard::relay) fn client_credit(&mut self, credit: u32) -> Result<(), Failure> {
        let to_app = self.ends.window.credit(credit)?;
        wire::window_update(&mut self.ends.app.write, 0, to_app);
        Ok(())
    }

    /// A client SETTINGS (not an ack): judged, applied to what the guard
    /// keeps of the client, and passed on lowered to the guard's limits.
    pub(in crate::guard::relay) fn client_settings(
        &mut self,
        h: Head,
        payload: &[u8],
    ) -> Result<(), Failure> {
        for (id, v) in wire::settings(payload) {
            match wire::setting_error(id, v) {
                None => {}
                Some(wire::FLOW_CONTROL_ERROR) => {
                    tracing::debug!(
                        conn = self.ends.info.id,
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
                self.ends.app.allow_table(v);
                v
            }
            wire::MAX_FRAME_SIZE => self.ends.client.announce_frame(v),
            wire::INITIAL_WINDOW_SIZE => {
                let delta = self.ends.window.set_initial(v);
                grew |= delta > 0;
                for l in self.locals.values_mut() {
                    l.window += delta;
                }
                for s in self.ends.streams.values_mut() {
                    s.grow_window(delta);
                }
                v
            }
            _ => v,
        });
        let past_max = |w: i64| w > MAX_WINDOW;
        if grew
            && (self.ends.streams.values().any(|s| past_max(s.window()))
                || self.locals.values().any(|l| past_max(l.window)))
        {
            // RFC 9113 §6.9.2: a connection error.
            tracing::debug!(conn = self.ends.info.id, "guard: the client's SETTINGS_INITIAL_WINDOW_SIZE took a stream's window past 2^31-1");
            return Err(Failure::FlowControl);
        }
        wire::put(
            &mut self.ends.app.write,
            wire::SETTINGS,
            h.flags,
            0,
            &payload,
        );
        // Every one is kept (`settings_waits` bounds them): each ack of the
        // application's pairs with its own frame.
        self.ends.settings.sent(Unacked::Client(table));
        if self.handshake.alone {
            self.settings_acked();
        }
        Ok(())
    }

    /// One fragment of a client header block; the block is read, and its
    /// frames go on, once it is whole.
    pub(in crate::guard::relay) fn client_fragment(
        &mut self,
        block: Block,
        h: Head,
        frame: &[u8],
        fragment: &[u8],
        now: Instant,
        k: &mut Kept<'_>,
    ) -> Result<(), Failure> {
        let limit = self.ends.guard.config().limits.max_header_list_size as usize;
        let block =
            match self
                .ends
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
        let (fields, all) = self.ends.client.decode(limit * BOMB_FACTOR, true);
        let result = self.client_block_whole(block, frame, fields, &all, now, k);
        self.ends.client.reuse(all);
        result
    }

    /// A whole client block, decoded: forwarded, answered, or served here.
    fn client_block_whole(
        &mut self,
        block: Block,
        frame: &[u8],
        fields: Result<wire::Fields, wire::BlockError>,
        all_fields: &[wire::Field],
        now: Instant,
        k: &mut Kept<'_>,
    ) -> Result<(), Failure> {
        let limit = self.ends.guard.config().limits.max_header_list_size as usize;
        let all = self.ends.app.translates().then_some(all_fields);
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
            return self.client_trailers(&block, frame, trailers, all, now, k);
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
                    conn = self.ends.info.id,
                    stream = id,
                    why,
                    "guard: a malformed request; RST_STREAM(PROTOCOL_ERROR)"
                );
                Some(Refusal::Malformed)
            }
            None => admission(
                &fields,
                limit,
                self.life,
                self.ids,
                self.ends.streams.len() + self.locals.len(),
                self.ends.settings,
            ),
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
            // (see `connect.rs`).
            self.dropped_block(&fields);
            self.websocket(id, block.end_stream, all_fields);
            return Ok(());
        }
        if self.handshake.alone {
            if self.admit(id, block.end_stream, &fields, now, k.defences) {
                self.unavailable(id);
            }
            return Ok(());
        }
        let start = self.ends.app.write.len();
        self.forward_block(&block, frame, all, Some(k.forward.xff()));
        if self.admit(id, block.end_stream, &fields, now, k.defences) {
            k.forward
                .sent(id, start, self.ends.app.write.len(), fields.indexed);
            body_start(self.ends.streams, id, all_fields, block.end_stream);
        } else {
            // Refused by the registry: take the request back.
            self.ends.app.write.truncate(start);
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
        k: &mut Kept<'_>,
    ) -> Result<(), Failure> {
        let id = block.id;
        let open = self
            .ends
            .streams
            .get(&id)
            .map(Stream::req_done)
            .or(self.locals.get(&id).map(|l| l.client_eof));
        let error = match open {
            // Half-closed (remote): RFC 9113 §5.1.
            Some(true) => Some(wire::STREAM_CLOSED),
            // Trailers end the stream and carry no pseudo-header (§8.1),
            // and the request's DATA added up to its content-length.
            Some(false)
                if t.bad || !block.end_stream || !body_data(self.ends.streams, id, 0, true) =>
            {
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
                    wire::rst(&mut self.ends.client.write, id, wire::STREAM_CLOSED);
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
            self.stream_error(id, code, now, k);
            return Ok(());
        }
        if let Some(l) = self.locals.get_mut(&id) {
            // The guard's own stream: its trailers go nowhere.
            l.client_eof = true;
            self.dropped_block(t.fields);
            return Ok(());
        }
        if let Some(s) = self.ends.streams.get_mut(&id) {
            s.request_ended();
        }
        if self.ends.streams.app_cancelled(id) {
            // The guard cancelled the application's side while it ends the
            // stream: there the trailers would be a frame on a closed
            // stream (RFC 9113 §5.1), which the app may answer with a
            // connection error.
            self.dropped_block(t.fields);
        } else {
            self.forward_block(block, frame, all, None);
        }
        self.ends.maybe_done(id);
        Ok(())
    }

    /// A stream error of the client's (RFC 9113 §5.4.2): RST_STREAM `code`
    /// to it, and its stream is over here. A relayed stream is cancelled at
    /// the application (or taken back, not sent yet) and counted as the
    /// client's, a local one dropped.
    pub(in crate::guard::relay) fn stream_error(
        &mut self,
        id: u32,
        code: u32,
        now: Instant,
        k: &mut Kept<'_>,
    ) {
        tracing::debug!(
            conn = self.ends.info.id,
            stream = id,
            code,
            "guard: a stream error of the client's; RST_STREAM"
        );
        wire::rst(&mut self.ends.client.write, id, code);
        if self.locals.contains_key(&id) {
            self.locals.drop(id, &mut self.ends.client.write);
        }
        let Some(s) = self.ends.streams.remove(&id) else {
            return;
        };
        if !s.app_cancelled() && !self.take_back(id, k.forward) {
            wire::rst(&mut self.ends.app.write, id, wire::CANCEL);
        }
        // The application got a request and its reset: as a client's
        // reset would, it counts for rapid reset.
        if !s.answered() && now.saturating_duration_since(s.started()) < PREMATURE_LIFETIME {
            k.defences.premature();
        }
        self.ends.finish(s, StreamOutcome::ClientGone);
    }

    /// Passes a whole client block on: as it came (with the client's
    /// address, `xff`, added to a request's), or re-encoded while the application's
    /// table is the guard's own (see the module doc).
    fn forward_block(
        &mut self,
        block: &Block,
        last: &[u8],
        all: Option<&[wire::Field]>,
        xff: Option<&[u8]>,
    ) {
        match all {
            Some(all) => self.ends.app.put_literals(block, all, None, xff),
            None => self.ends.app.put_as_came(block, last, xff),
        }
    }

    /// Registers and opens a stream (true), or answers it (false).
    fn admit(
        &mut self,
        id: u32,
        end_stream: bool,
        fields: &wire::Fields,
        now: Instant,
        defences: &mut Defences,
    ) -> bool {
        defences.accepted();
        let queue = &self.ends.endings.queue;
        match register(self.ends.guard, self.ends.info.id, queue, id, fields) {
            Ok(admitted) => {
                let s = admitted.open(end_stream, self.ends.window.initial(), now);
                self.ends.streams.insert(id, s);
                true
            }
            Err(refusal) => {
                self.refuse(id, end_stream, refusal);
                false
            }
        }
    }

    /// A stream the application never sees, answered here.
    fn refuse(&mut self, id: u32, end_stream: bool, refusal: Refusal) {
        admit::refuse(
            self.ends.client,
            self.ends.settings,
            id,
            end_stream,
            refusal,
        );
    }

    /// Alone, an admitted stream's answer: the application could not be
    /// reached, so gRPC gets a trailers-only UNAVAILABLE (retryable), and
    /// HTTP a 502, as Envoy answers a failed upstream connect.
    fn unavailable(&mut self, id: u32) {
        let Some(s) = self.ends.streams.get(&id) else {
            return;
        };
        let block = trailers_only(s.kind(), grpc::UPSTREAM_UNAVAILABLE_MESSAGE)
            .unwrap_or_else(|| wire::literal_block(&[(":status", "502")]));
        self.ends.own_block(id, &block, true);
        if let Some(s) = self.ends.streams.get_mut(&id) {
            s.response_ended();
        }
        self.ends.end_here(id, StreamOutcome::UpstreamFailed);
    }

    /// A client block the application does not get: if it changed the
    /// client's table, the application's no longer follows it, and the
    /// guard re-encodes from now on.
    fn dropped_block(&mut self, fields: &wire::Fields) {
        if self.ends.app.missed_block(fields.indexed) {
            tracing::debug!(conn = self.ends.info.id, "guard: a client header block the application did not get changed its HPACK table; re-encoding the client's blocks from now on");
        }
    }

    /// Starts the task that serves a WebSocket over HTTP/2 (RFC 8441).
    fn websocket(&mut self, id: u32, end_stream: bool, fields: &[wire::Field]) {
        let guard = self.ends.guard;
        let reg = match guard.try_register(self.ends.info.id, false) {
            Ok(r) => r,
            Err(_) => return self.refuse(id, end_stream, Refusal::Reset),
        };
        let Some(head) = connect_head(fields) else {
            wire::rst(&mut self.ends.client.write, id, wire::PROTOCOL_ERROR);
            return;
        };
        let (task_io, tx) = self.locals.open(id, end_stream, self.ends.window);
        guard.spawn(connect::proxy(
            guard.clone(),
            reg,
            head,
            task_io,
            tx,
            *self.ends.info,
        ));
    }

    /// Whether stream `id` is open here (relayed, or a local one).
    fn open(&self, id: u32) -> bool {
        self.ends.streams.contains_key(&id) || self.locals.contains_key(&id)
    }
}

/// A decoded block on a stream the client opened before.
struct Trailers<'f> {
    fields: &'f wire::Fields,
    /// Malformed as trailers (a pseudo-header, RFC 9113 §8.1), or its
    /// HEADERS made the stream depend on itself.
    bad: bool,
}
