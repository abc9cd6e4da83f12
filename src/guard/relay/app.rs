//! The application's frames, on their way to the client: its SETTINGS
//! lowered to the guard's limits, its header blocks decoded for each
//! response's kind and status, its DATA counted into messages, and its
//! GOAWAY taken as its graceful stop.

use tokio::time::Instant;

use super::client::settings_size_ok;
use super::ending::StreamOutcome;
use super::failure::Failure;
use super::goaway::Conn;
use super::limits::{APP_BLOCK_MAX, MAX_CLIENT_TABLE, MAX_FRAME};
use super::next::Next;
use super::peer::{Block, Gathered};
use super::settings::Unacked;
use super::wire::{self, Head};

impl Conn<'_> {
    /// The application's frames read so far; the client's held frames go
    /// on next once its first SETTINGS came.
    pub(super) fn app_read(&mut self, now: Instant) -> Result<Next, Failure> {
        let mut released = false;
        if self.handshake.pending {
            match wire::head(&self.ends.app.read) {
                Some(h) if h.kind == wire::SETTINGS && h.flags & wire::ACK == 0 => {
                    // It speaks HTTP/2: the client's frames held so far go
                    // on, after its SETTINGS (the server's preface comes first).
                    self.handshake.pending = false;
                    self.handshake.replay = None;
                    released = true;
                }
                Some(_) => return Err(Failure::NotHttp2),
                None if self.ends.app.read.len() >= wire::FRAME_HEADER => {
                    return Err(Failure::NotHttp2)
                }
                None => return Ok(Next::Done),
            }
        }
        // Frames go on whole: one larger than the client ever allowed is the
        // application's error (its streams end retryably), not the client's.
        let mut frames = self.ends.app.frames(self.ends.client.frame_max());
        while let Some((h, frame)) = frames.next().map_err(|_| Failure::AppProtocol)? {
            self.app_frame(h, frame, now).map_err(Failure::of_the_app)?;
            frames.handled(h);
        }
        self.ends.app.keep(frames);
        if std::mem::take(&mut self.ends.endings.barrier.moved) {
            self.ends.check_endings(now);
        }
        if released && std::mem::take(&mut self.handshake.goaway_held) {
            self.life.first_goaway(&mut self.ends.client.write);
        }
        Ok(if released {
            Next::ClientFrames
        } else {
            Next::Done
        })
    }

    pub(super) fn app_frame(&mut self, h: Head, frame: &[u8], now: Instant) -> Result<(), Failure> {
        let payload = &frame[wire::FRAME_HEADER..];
        if self.ends.app.interrupts(h) {
            return Err(Failure::AppProtocol);
        }
        match h.kind {
            wire::HEADERS | wire::PUSH_PROMISE => {
                let mut fragment = wire::content(h, payload).map_err(|_| Failure::AppProtocol)?;
                let mut block = Block::start(h);
                if h.kind == wire::PUSH_PROMISE {
                    // The promised stream id, then the block.
                    let promised = fragment.get(..4).ok_or(Failure::AppProtocol)?;
                    block.promised = Some(
                        u32::from_be_bytes([promised[0], promised[1], promised[2], promised[3]])
                            & wire::MAX_STREAM_ID,
                    );
                    fragment = &fragment[4..];
                }
                self.app_fragment(block, h, frame, fragment, now)
            }
            wire::CONTINUATION => {
                let block = self.ends.app.continued(h).ok_or(Failure::AppProtocol)?;
                self.app_fragment(block, h, frame, payload, now)
            }
            wire::DATA => {
                if !self.ends.streams.contains_key(&h.id) {
                    self.ends.app_data_after_end(h);
                    return Ok(());
                }
                // Checked before it goes on: padding longer than the frame
                // is the application's error, never the client's to see.
                let data = wire::content(h, payload).map_err(|_| Failure::AppProtocol)?;
                self.ends.app_data(h.id, h, frame, data, now);
                Ok(())
            }
            wire::SETTINGS | wire::PING | wire::GOAWAY if h.id != 0 => Err(Failure::AppProtocol),
            wire::SETTINGS if !settings_size_ok(h) => Err(Failure::AppProtocol),
            wire::PING if h.len != 8 => Err(Failure::AppProtocol),
            wire::GOAWAY if h.len < 8 => Err(Failure::AppProtocol),
            wire::RST_STREAM => {
                self.ends.release_held(h.id);
                if let Some(mut s) = self.ends.streams.remove(&h.id) {
                    self.ends.client.write.extend_from_slice(frame);
                    if let Ok(code) = <[u8; 4]>::try_from(payload) {
                        s.app_reset(u32::from_be_bytes(code));
                    }
                    self.ends.finish(s, StreamOutcome::UpstreamFailed);
                }
                Ok(())
            }
            wire::SETTINGS if h.flags & wire::ACK == 0 => {
                self.app_settings(h.flags, payload);
                Ok(())
            }
            wire::SETTINGS => {
                self.settings_acked();
                Ok(())
            }
            wire::GOAWAY => {
                let last = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                    & wire::MAX_STREAM_ID;
                let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                self.ends.guard.record_app_goaway(code);
                if code != wire::NO_ERROR {
                    // `h2::Reason`'s Debug names the code (PROTOCOL_ERROR,
                    // ...); `wire` keeps only the numbers it sends.
                    tracing::warn!(peer = %self.ends.info.peer, conn = self.ends.info.id, code = ?h2::Reason::from(code),
                        debug = %String::from_utf8_lossy(&payload[8..]),
                        "guard: the application sent GOAWAY with an error; it is closing the guard's connection");
                }
                self.app_goaway(last, code, now);
                Ok(())
            }
            wire::WINDOW_UPDATE if h.id != 0 && !self.ends.streams.contains_key(&h.id) => Ok(()),
            _ => {
                self.ends.client.write.extend_from_slice(frame);
                Ok(())
            }
        }
    }

    /// The application's SETTINGS (or, alone, the guard's own: none), on to
    /// the client lowered to the guard's limits; the first also gets the
    /// guard's limits where the application set none, and extended CONNECT
    /// (the guard serves WebSockets over HTTP/2 itself).
    pub(super) fn app_settings(&mut self, flags: u8, payload: &[u8]) {
        let l = self.ends.guard.config().limits;
        let mut payload = payload.to_vec();
        let (mut streams_seen, mut list_seen, mut connect_seen) = (None, false, false);
        wire::rewrite_settings(&mut payload, |id, v| match id {
            wire::HEADER_TABLE_SIZE => {
                // The client's table is the guard's memory too: capped, and
                // the client told so (a smaller table suits the app's too).
                let v = v.min(MAX_CLIENT_TABLE);
                self.ends.client.allow_table(v);
                v
            }
            wire::MAX_CONCURRENT_STREAMS => {
                let v = v.min(l.max_concurrent_streams);
                streams_seen = Some(v);
                v
            }
            wire::MAX_HEADER_LIST_SIZE => {
                list_seen = true;
                v.min(l.max_header_list_size)
            }
            // The guard serves WebSockets over HTTP/2 itself.
            wire::ENABLE_CONNECT_PROTOCOL => {
                connect_seen = true;
                1
            }
            wire::MAX_FRAME_SIZE => self.ends.app.announce_frame(v),
            // Passed on as it is: what the client may send a local stream.
            wire::INITIAL_WINDOW_SIZE => {
                let delta = self.ends.window.set_told(v);
                self.locals.window_told(delta);
                v
            }
            _ => v,
        });
        if self.ends.settings.first_from_app() {
            // The guard's own limits, where the application set none.
            for (seen, id, v) in [
                (
                    streams_seen.is_some(),
                    wire::MAX_CONCURRENT_STREAMS,
                    l.max_concurrent_streams,
                ),
                (
                    list_seen,
                    wire::MAX_HEADER_LIST_SIZE,
                    l.max_header_list_size,
                ),
                (connect_seen, wire::ENABLE_CONNECT_PROTOCOL, 1),
            ] {
                if !seen {
                    payload.extend_from_slice(&id.to_be_bytes());
                    payload.extend_from_slice(&v.to_be_bytes());
                }
            }
            streams_seen = Some(streams_seen.unwrap_or(l.max_concurrent_streams));
        }
        self.ends.settings.tell_streams(streams_seen);
        wire::put(
            &mut self.ends.client.write,
            wire::SETTINGS,
            flags,
            0,
            &payload,
        );
    }

    /// The application acked the oldest SETTINGS it had from the relay
    /// (alone: the guard acks the client's itself). A barrier round trip
    /// moves endings on; a client's goes back to the client, and a lower
    /// table size now binds, so the next block must say so.
    pub(super) fn settings_acked(&mut self) {
        match self.ends.settings.acked() {
            Some(Unacked::Barrier(n)) => self.ends.barrier_acked(n),
            Some(Unacked::Client(table)) => {
                self.ends.settings.client_acked(table);
                wire::put(
                    &mut self.ends.client.write,
                    wire::SETTINGS,
                    wire::ACK,
                    0,
                    &[],
                );
            }
            None => {
                // Nothing was sent to ack: the application's error, and
                // nothing the client asked for.
                tracing::debug!(
                    conn = self.ends.info.id,
                    "guard: the application acked SETTINGS it was never sent; dropped"
                );
            }
        }
    }

    pub(super) fn app_fragment(
        &mut self,
        block: Block,
        h: Head,
        frame: &[u8],
        fragment: &[u8],
        now: Instant,
    ) -> Result<(), Failure> {
        // Endless (empty) CONTINUATIONs are a flood, as the client's.
        let block = match self
            .ends
            .app
            .gather(block, h, frame, fragment, MAX_FRAME as usize * 4)
        {
            Gathered::More => return Ok(()),
            Gathered::Flood => return Err(Failure::AppProtocol),
            Gathered::Whole(block) => block,
        };
        // A push is never relayed: every client of the guard is Envoy or
        // another proxy, and a client that disabled push (Envoy does) treats
        // a PUSH_PROMISE as a connection error.
        let forward = block.promised.is_none()
            && (self.ends.streams.contains_key(&block.id) || self.ids.reset_lately(block.id));
        let keep_all = forward && self.ends.client.translates();
        let (decoded, all) = self.ends.app.decode(APP_BLOCK_MAX, keep_all);
        let fields = decoded.map_err(|_| Failure::AppProtocol)?;
        if let Some(promised) = block.promised {
            tracing::debug!(
                conn = self.ends.info.id,
                stream = block.id,
                promised,
                "guard: the application pushed; refusing the pushed stream"
            );
            wire::rst(&mut self.ends.app.write, promised, wire::REFUSED_STREAM);
        }
        if !forward {
            // The client saw this stream end (or it is a push). Dropped; if
            // the block changed the application's table, the client's no
            // longer follows it.
            if self.ends.client.missed_block(fields.indexed) {
                tracing::debug!(conn = self.ends.info.id, stream = block.id, "guard: an application header block the client does not get changed its HPACK table; re-encoding its blocks from now on");
            }
            self.ends.app.reuse(all);
            return Ok(());
        }
        self.ends.release_held(block.id);
        if keep_all {
            self.put_translated(&block, &all);
        } else {
            // It starts with the size update that may be due (the
            // application's encoder owes it too).
            self.ends.settings.take_update_due();
            self.ends.client.put_as_came(&block, frame, None);
        }
        self.ends.app.reuse(all);
        self.app_head(block.id, block.end_stream, &fields, now);
        Ok(())
    }

    /// An application block re-encoded as literals to the client (see the
    /// module doc), after the table size update that is due.
    pub(super) fn put_translated(&mut self, block: &Block, all: &[wire::Field]) {
        let due = self.ends.settings.take_update_due();
        self.ends.client.put_literals(block, all, due, None);
    }

    /// An application header block on an open stream, after it went on.
    pub(super) fn app_head(
        &mut self,
        id: u32,
        end_stream: bool,
        fields: &wire::Fields,
        now: Instant,
    ) {
        let Some(s) = self.ends.streams.get_mut(&id) else {
            return;
        };
        match fields.status {
            // Informational (100-continue): the real head is still to come.
            Some(status) if status < 200 => {}
            Some(status) if !s.answered() => {
                let ct = fields.content_type.as_deref().unwrap_or("");
                s.response_head(status, ct, fields.grpc_status.as_deref());
            }
            _ => s.response_trailers(fields.grpc_status.as_deref()),
        }
        if end_stream {
            self.ends.app_ended(id);
        } else if s.app_cancelled() {
            // Its end waits for the whole read to be handled: a frame
            // behind this head in the same read is forwarded first.
            self.ends.endings.barrier.moved = true;
        } else if s.ending().is_some() {
            self.ends.advance(id, now);
        }
    }
}
