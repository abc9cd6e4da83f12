//! WebSocket frames as the guard sees them: the boundaries of one
//! direction's byte stream ([`Scanner`]), and the Close frames it writes.

use std::io::Cursor;

use tungstenite::protocol::frame::coding::{CloseCode, Control, OpCode};
use tungstenite::protocol::frame::{CloseFrame, Frame, FrameHeader};
use tungstenite::Utf8Bytes;

/// Where the frame scanner stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Everything given was scanned; more bytes are needed to go on.
    NeedMore,
    /// At a frame boundary, as asked.
    Boundary,
    /// A Close frame starts here, `len` bytes long (header and payload); not
    /// passed.
    Close { len: usize },
}

/// Follows one direction of a WebSocket byte stream frame by frame.
#[derive(Debug, Default)]
pub(crate) struct Scanner {
    /// Payload bytes of the current frame not seen yet; 0 at a boundary
    /// (then the next byte starts a frame header).
    remaining: u64,
    /// A Close frame was passed (a close handshake is under way).
    pub(crate) saw_close: bool,
}

impl Scanner {
    /// Whether the next byte starts a new frame.
    pub(crate) fn at_boundary(&self) -> bool {
        self.remaining == 0
    }

    /// Scans `buf` from its start and returns how many bytes may be passed
    /// on, and why it stopped: at the end of `buf`, at the first frame
    /// boundary if `stop_at_boundary`, or before a Close frame if
    /// `stop_at_close`. A frame header split across reads is left in `buf`.
    pub(crate) fn scan(
        &mut self,
        buf: &[u8],
        stop_at_boundary: bool,
        stop_at_close: bool,
    ) -> Result<(usize, Stop), tungstenite::Error> {
        let mut pos = 0usize;
        loop {
            if self.remaining > 0 {
                let left = (buf.len() - pos) as u64;
                let n = self.remaining.min(left);
                // n <= left, which came from a usize.
                pos += n as usize;
                self.remaining -= n;
                if self.remaining > 0 {
                    return Ok((pos, Stop::NeedMore));
                }
            }
            if stop_at_boundary {
                return Ok((pos, Stop::Boundary));
            }
            let mut cursor = Cursor::new(&buf[pos..]);
            let Some((header, len)) = FrameHeader::parse(&mut cursor)? else {
                return Ok((pos, Stop::NeedMore));
            };
            let header_len = cursor.position() as usize;
            let close = header.opcode == OpCode::Control(Control::Close);
            if close && stop_at_close {
                let len = usize::try_from(len)
                    .ok()
                    .and_then(|l| l.checked_add(header_len))
                    .ok_or(tungstenite::Error::Protocol(
                        tungstenite::error::ProtocolError::ControlFrameTooBig,
                    ))?;
                return Ok((pos, Stop::Close { len }));
            }
            self.saw_close |= close;
            pos += header_len;
            self.remaining = len;
        }
    }
}

/// A Close frame with `code`, masked with a random key if `masked` (frames
/// from a client must be; RFC 6455 §5.3).
pub(crate) fn close_frame(code: CloseCode, reason: &'static str, masked: bool) -> Vec<u8> {
    let mut frame = Frame::close(Some(CloseFrame {
        code,
        reason: Utf8Bytes::from_static(reason),
    }));
    if masked {
        frame.header_mut().mask = Some(fastrand::u32(..).to_ne_bytes());
    }
    let mut out = Vec::with_capacity(frame.len());
    // Writing into a Vec cannot fail.
    let _ = frame.format(&mut out);
    out
}

/// The close code in a Close frame's bytes (header and payload), if any.
pub(crate) fn close_code(frame: &[u8]) -> Option<u16> {
    let mut cursor = Cursor::new(frame);
    let (header, len) = FrameHeader::parse(&mut cursor).ok()??;
    let start = cursor.position() as usize;
    if len < 2 || frame.len() < start + 2 {
        return None;
    }
    let mut code = [frame[start], frame[start + 1]];
    if let Some(mask) = header.mask {
        code[0] ^= mask[0];
        code[1] ^= mask[1];
    }
    Some(u16::from_be_bytes(code))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::websocket::{APP_CLOSE_REASON, CLIENT_CLOSE_REASON};
    use tungstenite::protocol::frame::coding::Data;

    fn frame(op: OpCode, payload: &[u8], fin: bool, masked: bool) -> Vec<u8> {
        let mut f = Frame::message(payload.to_vec(), op, fin);
        if masked {
            f.header_mut().mask = Some([1, 2, 3, 4]);
        }
        let mut out = Vec::new();
        f.format(&mut out).expect("format");
        out
    }

    #[test]
    fn passes_whole_frames_and_stops_at_boundaries_and_closes() {
        let text = OpCode::Data(Data::Text);
        let mut bytes = frame(text, b"hello", false, true);
        bytes.extend(frame(
            OpCode::Data(Data::Continue),
            &[7u8; 70_000],
            true,
            true,
        ));
        let first = frame(text, b"hello", false, true).len();
        let close = close_frame(CloseCode::Away, "bye", true);
        bytes.extend(&close);

        // Everything up to the Close, which is not passed.
        let mut s = Scanner::default();
        let (n, stop) = s.scan(&bytes, false, true).expect("scan");
        assert_eq!(n, bytes.len() - close.len());
        assert_eq!(stop, Stop::Close { len: close.len() });
        assert_eq!(close_code(&bytes[n..]), Some(1001));

        // Byte by byte: the same boundaries, and headers split across reads.
        let mut s = Scanner::default();
        let mut passed = 0;
        let mut buf = Vec::new();
        for b in &bytes {
            buf.push(*b);
            let (n, stop) = s.scan(&buf, false, true).expect("scan");
            passed += n;
            buf.drain(..n);
            if let Stop::Close { len } = stop {
                assert_eq!(len, close.len());
                break;
            }
        }
        assert_eq!(passed, bytes.len() - close.len());

        // Asked to stop at a boundary mid-frame: the rest of the frame first.
        let mut s = Scanner::default();
        let (n, _) = s.scan(&bytes[..first + 100], false, false).expect("scan");
        assert_eq!(n, first + 100);
        assert!(!s.at_boundary());
        let (n, stop) = s.scan(&bytes[first + 100..], true, false).expect("scan");
        assert_eq!(stop, Stop::Boundary);
        assert_eq!(first + 100 + n, bytes.len() - close.len());
        assert!(s.at_boundary());

        // Passing a Close through is noticed.
        let (n, _) = s.scan(&close, false, false).expect("scan");
        assert_eq!(n, close.len());
        assert!(s.saw_close);
    }

    #[test]
    fn close_frames_carry_their_code_and_the_client_mask() {
        let masked = close_frame(CloseCode::Away, APP_CLOSE_REASON, true);
        assert_eq!(masked[1] & 0x80, 0x80, "masked");
        assert_eq!(close_code(&masked), Some(1001));
        let plain = close_frame(CloseCode::Restart, CLIENT_CLOSE_REASON, false);
        assert_eq!(plain[1] & 0x80, 0, "a server's frames are not masked");
        assert_eq!(plain[0], 0x88, "FIN + Close");
        assert_eq!(close_code(&plain), Some(1012));
    }

    #[test]
    fn reserved_opcodes_are_a_protocol_error() {
        let mut s = Scanner::default();
        assert!(s.scan(&[0x83, 0x00], false, false).is_err());
    }
}
