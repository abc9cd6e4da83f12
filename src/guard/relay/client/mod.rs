//! The client's frames, on their way to the application, in two parts.
//!
//! Here, [`ClientSide`] judges each frame by what only the client's side
//! knows (its preface, its stream ids, the header block it is in the
//! middle of) and says what kind of frame it is ([`Judged`]); the loop
//! (`super::Relay::client_frame`) then hands it to the stream work in
//! [`streams`] (each frame by type on [`Conn`](super::goaway::Conn),
//! header blocks gathered and decoded, each new stream decided:
//! forwarded, refused, answered alone, or a WebSocket served here).
//!
//! The guard is the client's server, so what RFC 9113 makes an error of the
//! client's it answers itself, with the code the RFC names, and never
//! passes on: a frame on the wrong stream or of the wrong size, one on an
//! idle stream or after the client ended its side (§5.1), a setting out of
//! its range, a window past 2^31-1, a malformed request (§8.1, see
//! `super::admit`). A connection error is a GOAWAY (`Failure`); a stream
//! error a RST_STREAM to the client, with the application's stream, if it
//! had one, cancelled (`Conn::stream_error`).

pub(super) mod streams;

use bytes::{Buf, BytesMut};

use super::failure::Failure;
use super::peer::Block;
use super::sides::ClientSide;
use super::wire::{self, Head};
use crate::guard::sniff::H2_PREFACE;

/// What a client frame is, once [`ClientSide::judge`] let it through:
/// what the stream work does with it.
pub(super) enum Judged<'f> {
    /// Nothing more (the client's side answered it itself).
    Done,
    /// A fragment of a header block: its HEADERS, or a CONTINUATION.
    Fragment(Block, &'f [u8]),
    /// A DATA frame, its content (the padding off).
    Data(&'f [u8]),
    /// A RST_STREAM on a stream the client opened.
    Reset,
    /// A PRIORITY frame; with the stream error and the connection error it
    /// is, when it is of the wrong size or makes its stream depend on itself
    /// (RFC 9113 §6.3, §5.3.1).
    Priority(Option<(u32, Failure)>),
    /// A WINDOW_UPDATE on the connection, its increment.
    Credit(u32),
    /// A WINDOW_UPDATE on a stream the client opened, its increment.
    WindowUpdate(u32),
    /// A SETTINGS frame (not an ack) of the right size.
    Settings,
    /// The client's ack of the application's SETTINGS.
    SettingsAck,
    /// A PING ack: the guard's probe's, or the application's to pass on.
    PingAck,
    /// Anything else the client may send: passed on as it came.
    Pass,
}

impl ClientSide {
    /// The client's preface, checked and passed on to `to_app` once whole.
    /// True once it is behind: the client's frames may be read.
    pub(super) fn preface(&mut self, to_app: &mut BytesMut) -> Result<bool, Failure> {
        if !self.preface {
            return Ok(true);
        }
        let n = self.peer.read.len().min(H2_PREFACE.len());
        if self.peer.read[..n] != H2_PREFACE[..n] {
            return Err(Failure::Protocol(
                "the client did not start with the HTTP/2 preface",
            ));
        }
        if n < H2_PREFACE.len() {
            return Ok(false);
        }
        to_app.extend_from_slice(H2_PREFACE);
        self.preface = false;
        self.peer.read.advance(H2_PREFACE.len());
        Ok(true)
    }

    /// Frame `h` (`frame`, its header included) held to what RFC 9113 asks
    /// of it that the client's side can tell alone: a connection error, or
    /// what kind of frame it is. `alone`: there is no application, so the
    /// guard answers the client's PINGs itself.
    pub(super) fn judge<'f>(
        &mut self,
        h: Head,
        frame: &'f [u8],
        alone: bool,
    ) -> Result<Judged<'f>, Failure> {
        let payload = &frame[wire::FRAME_HEADER..];
        if self.peer.interrupts(h) {
            return Err(Failure::Protocol(
                "a header block was interrupted by another frame",
            ));
        }
        if std::mem::take(&mut self.settings_due)
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
                Ok(Judged::Fragment(block, fragment))
            }
            wire::CONTINUATION => {
                let block = self
                    .peer
                    .continued(h)
                    .ok_or(Failure::Protocol("CONTINUATION without its HEADERS"))?;
                Ok(Judged::Fragment(block, payload))
            }
            // Padding longer than the frame is PROTOCOL_ERROR (RFC 9113
            // §6.1), whatever the stream.
            wire::DATA => Ok(Judged::Data(wire::content(h, payload)?)),
            wire::RST_STREAM => {
                if h.len != 4 {
                    return Err(Failure::FrameSize("RST_STREAM"));
                }
                if self.ids.idle(h.id) {
                    return Err(Failure::Protocol("RST_STREAM on an idle stream"));
                }
                self.ids.cancelled(h.id);
                Ok(Judged::Reset)
            }
            wire::PRIORITY_FRAME => Ok(Judged::Priority(if h.len != 5 {
                Some((wire::FRAME_SIZE_ERROR, Failure::FrameSize("PRIORITY")))
            } else if wire::dependency(payload) == Some(h.id) {
                Some((
                    wire::PROTOCOL_ERROR,
                    Failure::Protocol("a stream that depends on itself"),
                ))
            } else {
                None
            })),
            // RFC 9113 §8.4: a client cannot push.
            wire::PUSH_PROMISE => Err(Failure::Protocol("a PUSH_PROMISE from the client")),
            wire::SETTINGS | wire::PING | wire::GOAWAY if h.id != 0 => Err(Failure::Protocol(
                "a connection-level frame (SETTINGS, PING or GOAWAY) on a stream",
            )),
            wire::SETTINGS if !settings_size_ok(h) => Err(Failure::FrameSize("SETTINGS")),
            wire::PING if h.len != 8 => Err(Failure::FrameSize("PING")),
            // Too short for its last stream and error code (RFC 9113 §4.2).
            wire::GOAWAY if h.len < 8 => Err(Failure::FrameSize("GOAWAY")),
            wire::SETTINGS if h.flags & wire::ACK == 0 => Ok(Judged::Settings),
            wire::PING if alone && h.flags & wire::ACK == 0 => {
                let mut opaque = [0u8; 8];
                opaque.copy_from_slice(payload);
                wire::ping(&mut self.peer.write, true, opaque);
                Ok(Judged::Done)
            }
            wire::PING if h.flags & wire::ACK != 0 => Ok(Judged::PingAck),
            wire::WINDOW_UPDATE => {
                let credit = window_increment(payload)?;
                if h.id == 0 {
                    return Ok(Judged::Credit(credit));
                }
                if self.ids.idle(h.id) {
                    return Err(Failure::Protocol("WINDOW_UPDATE on an idle stream"));
                }
                Ok(Judged::WindowUpdate(credit))
            }
            wire::SETTINGS => Ok(Judged::SettingsAck),
            _ => Ok(Judged::Pass),
        }
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

/// A WINDOW_UPDATE's increment; any length but 4 is FRAME_SIZE_ERROR
/// (RFC 9113 §6.9).
pub(super) fn window_increment(payload: &[u8]) -> Result<u32, Failure> {
    let b: [u8; 4] = payload
        .try_into()
        .map_err(|_| Failure::FrameSize("WINDOW_UPDATE"))?;
    Ok(u32::from_be_bytes(b) & wire::MAX_STREAM_ID)
}
