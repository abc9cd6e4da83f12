//! HTTP/2 frames as the frame-relay data path (the `relay` module) sees them:
//! whole frames split off a byte stream, the few fields of a header block
//! the guard reads, the frames the guard writes itself, and the checks of
//! a frame's own fields (RFC 9113 §6: which frames need a stream, each
//! setting's range, priority dependencies).
//!
//! The guard never re-encodes what it relays. What it adds it encodes as
//! HPACK literals *without indexing*, which leave both peers' dynamic tables
//! as they are (RFC 7541 §6.2.2), so the blocks it relays stay valid.

use bytes::{BufMut, BytesMut};

pub use super::hpack::{
    decode, literal_block, put_literal, put_size_update, BlockError, Field, Fields, Hpack,
};

/// Every frame starts with a 9-byte header.
pub const FRAME_HEADER: usize = 9;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
/// The PRIORITY frame type (the PRIORITY *flag* of HEADERS is [`PRIORITY`]).
pub const PRIORITY_FRAME: u8 = 0x2;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

// SETTINGS identifiers.
pub const HEADER_TABLE_SIZE: u16 = 0x1;
pub const ENABLE_PUSH: u16 = 0x2;
pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const MAX_FRAME_SIZE: u16 = 0x5;
pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
pub const ENABLE_CONNECT_PROTOCOL: u16 = 0x8;
/// RFC 9218 §2.1: 0 or 1, like ENABLE_PUSH.
pub const NO_RFC7540_PRIORITIES: u16 = 0x9;

// Error codes.
pub const NO_ERROR: u32 = 0x0;
pub const PROTOCOL_ERROR: u32 = 0x1;
pub const FLOW_CONTROL_ERROR: u32 = 0x3;
pub const STREAM_CLOSED: u32 = 0x5;
pub const FRAME_SIZE_ERROR: u32 = 0x6;
pub const CANCEL: u32 = 0x8;
pub const REFUSED_STREAM: u32 = 0x7;
pub const COMPRESSION_ERROR: u32 = 0x9;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// The largest stream id (and the first GOAWAY's "every stream" id).
pub const MAX_STREAM_ID: u32 = (1 << 31) - 1;

/// The values SETTINGS_MAX_FRAME_SIZE may take (RFC 9113 §6.5.2).
pub const FRAME_SIZES: std::ops::RangeInclusive<u32> = (1 << 14)..=(1 << 24) - 1;

/// The largest SETTINGS_INITIAL_WINDOW_SIZE (and window, RFC 9113 §6.9.1).
pub const MAX_INITIAL_WINDOW: u32 = (1 << 31) - 1;

/// A frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub id: u32,
}

/// The header of the frame at the start of `buf`, if all 9 bytes are there.
pub fn head(buf: &[u8]) -> Option<Head> {
    let h = buf.get(..FRAME_HEADER)?;
    Some(Head {
        len: usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]),
        kind: h[3],
        flags: h[4],
        id: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & MAX_STREAM_ID,
    })
}

/// A frame the peer got wrong; the connection cannot go on.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed {0} frame")]
pub struct Malformed(pub &'static str);

/// The data of a DATA frame, or the block fragment of a HEADERS frame:
/// padding (and HEADERS' priority fields) removed.
pub fn content(h: Head, payload: &[u8]) -> Result<&[u8], Malformed> {
    let what = if h.kind == DATA { "DATA" } else { "HEADERS" };
    let mut p = payload;
    let mut pad = 0;
    if h.flags & PADDED != 0 {
        pad = usize::from(*p.first().ok_or(Malformed(what))?);
        p = &p[1..];
    }
    if h.kind == HEADERS && h.flags & PRIORITY != 0 {
        p = p.get(5..).ok_or(Malformed(what))?;
    }
    p.get(..p.len().checked_sub(pad).ok_or(Malformed(what))?)
        .ok_or(Malformed(what))
}

/// Frame types that belong to a stream: on stream 0 each is a connection
/// error PROTOCOL_ERROR (RFC 9113 §6.1-§6.4, §6.6, §6.10).
pub fn needs_stream(kind: u8) -> bool {
    matches!(
        kind,
        DATA | HEADERS | PRIORITY_FRAME | RST_STREAM | PUSH_PROMISE | CONTINUATION
    )
}

/// The stream a PRIORITY frame's payload (or HEADERS' priority fields)
/// makes its stream depend on; the exclusive bit masked off.
pub fn dependency(fields: &[u8]) -> Option<u32> {
    let b: [u8; 4] = fields.get(..4)?.try_into().ok()?;
    Some(u32::from_be_bytes(b) & MAX_STREAM_ID)
}

/// The stream a HEADERS frame with the PRIORITY flag depends on (after the
/// pad length, if PADDED).
pub fn headers_dependency(h: Head, payload: &[u8]) -> Option<u32> {
    if h.kind != HEADERS || h.flags & PRIORITY == 0 {
        return None;
    }
    let skip = usize::from(h.flags & PADDED != 0);
    dependency(payload.get(skip..)?)
}

/// Each setting of a SETTINGS payload (a whole multiple of 6 bytes).
pub fn settings(payload: &[u8]) -> impl Iterator<Item = (u16, u32)> + '_ {
    payload.chunks_exact(6).map(|s| {
        (
            u16::from_be_bytes([s[0], s[1]]),
            u32::from_be_bytes([s[2], s[3], s[4], s[5]]),
        )
    })
}

/// The connection error a setting's value is (RFC 9113 §6.5.2, RFC 8441
/// §3, RFC 9218 §2.1), if it is out of its range. Unknown settings are
/// ignored (§6.5.2).
pub fn setting_error(id: u16, value: u32) -> Option<u32> {
    match id {
        ENABLE_PUSH | ENABLE_CONNECT_PROTOCOL | NO_RFC7540_PRIORITIES if value > 1 => {
            Some(PROTOCOL_ERROR)
        }
        INITIAL_WINDOW_SIZE if value > MAX_INITIAL_WINDOW => Some(FLOW_CONTROL_ERROR),
        MAX_FRAME_SIZE if !FRAME_SIZES.contains(&value) => Some(PROTOCOL_ERROR),
        _ => None,
    }
}

/// Appends one frame.
pub fn put(out: &mut BytesMut, kind: u8, flags: u8, id: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    out.reserve(FRAME_HEADER + payload.len());
    out.put_slice(&len.to_be_bytes()[1..]);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(id & MAX_STREAM_ID);
    out.put_slice(payload);
}

pub fn rst(out: &mut BytesMut, id: u32, code: u32) {
    put(out, RST_STREAM, 0, id, &code.to_be_bytes());
}

pub fn goaway(out: &mut BytesMut, last: u32, code: u32) {
    let mut p = [0u8; 8];
    p[..4].copy_from_slice(&(last & MAX_STREAM_ID).to_be_bytes());
    p[4..].copy_from_slice(&code.to_be_bytes());
    put(out, GOAWAY, 0, 0, &p);
}

pub fn ping(out: &mut BytesMut, ack: bool, opaque: [u8; 8]) {
    put(out, PING, if ack { ACK } else { 0 }, 0, &opaque);
}

pub fn window_update(out: &mut BytesMut, id: u32, increment: u32) {
    // An increment is at most 2^31-1; larger credit goes in several frames.
    let mut left = increment;
    while left > 0 {
        let n = left.min(MAX_STREAM_ID);
        put(out, WINDOW_UPDATE, 0, id, &n.to_be_bytes());
        left -= n;
    }
}

/// Calls `f` with each setting of a SETTINGS payload; `f` returns the value
/// to put in its place.
pub fn rewrite_settings(payload: &mut [u8], mut f: impl FnMut(u16, u32) -> u32) {
    for s in payload.chunks_exact_mut(6) {
        let id = u16::from_be_bytes([s[0], s[1]]);
        let v = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
        s[2..].copy_from_slice(&f(id, v).to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let mut out = BytesMut::new();
        rst(&mut out, 7, CANCEL);
        let h = head(&out).unwrap();
        assert_eq!(
            h,
            Head {
                len: 4,
                kind: RST_STREAM,
                flags: 0,
                id: 7
            }
        );
        assert_eq!(&out[FRAME_HEADER..], &CANCEL.to_be_bytes());
        assert!(head(&out[..8]).is_none(), "a partial header is not a frame");
    }

    #[test]
    fn padding_and_priority_are_removed() {
        // PADDED: pad length 2, then "ab", then 2 padding bytes.
        let h = Head {
            len: 5,
            kind: DATA,
            flags: PADDED,
            id: 1,
        };
        assert_eq!(content(h, &[2, b'a', b'b', 0, 0]).unwrap(), b"ab");
        let h = Head {
            len: 0,
            kind: HEADERS,
            flags: PRIORITY,
            id: 1,
        };
        assert_eq!(content(h, &[0, 0, 0, 0, 16, 0x82]).unwrap(), &[0x82]);
        assert!(content(h, &[0, 0]).is_err(), "priority fields cut short");
        let h = Head {
            len: 2,
            kind: DATA,
            flags: PADDED,
            id: 1,
        };
        assert!(content(h, &[5, b'a']).is_err(), "more padding than payload");
    }

    #[test]
    fn settings_are_rewritten_in_place() {
        let mut p = Vec::new();
        for (id, v) in [(MAX_CONCURRENT_STREAMS, 5000u32), (MAX_FRAME_SIZE, 16384)] {
            p.extend_from_slice(&id.to_be_bytes());
            p.extend_from_slice(&v.to_be_bytes());
        }
        rewrite_settings(&mut p, |id, v| {
            if id == MAX_CONCURRENT_STREAMS {
                v.min(100)
            } else {
                v
            }
        });
        assert_eq!(&p[2..6], &100u32.to_be_bytes());
        assert_eq!(&p[8..12], &16384u32.to_be_bytes());
    }

    #[test]
    fn settings_out_of_range_are_errors() {
        assert_eq!(setting_error(ENABLE_PUSH, 1), None);
        assert_eq!(setting_error(ENABLE_PUSH, 2), Some(PROTOCOL_ERROR));
        assert_eq!(
            setting_error(ENABLE_CONNECT_PROTOCOL, 2),
            Some(PROTOCOL_ERROR)
        );
        assert_eq!(
            setting_error(NO_RFC7540_PRIORITIES, 7),
            Some(PROTOCOL_ERROR)
        );
        assert_eq!(setting_error(MAX_FRAME_SIZE, 16_384), None);
        assert_eq!(setting_error(MAX_FRAME_SIZE, 16_383), Some(PROTOCOL_ERROR));
        assert_eq!(setting_error(MAX_FRAME_SIZE, (1 << 24) - 1), None);
        assert_eq!(setting_error(MAX_FRAME_SIZE, 1 << 24), Some(PROTOCOL_ERROR));
        assert_eq!(setting_error(INITIAL_WINDOW_SIZE, MAX_INITIAL_WINDOW), None);
        assert_eq!(
            setting_error(INITIAL_WINDOW_SIZE, 1 << 31),
            Some(FLOW_CONTROL_ERROR)
        );
        assert_eq!(setting_error(0x4242, u32::MAX), None, "unknown: ignored");
        let mut p = Vec::new();
        for (id, v) in [(ENABLE_PUSH, 0u32), (MAX_FRAME_SIZE, 1 << 20)] {
            p.extend_from_slice(&id.to_be_bytes());
            p.extend_from_slice(&v.to_be_bytes());
        }
        assert_eq!(
            settings(&p).collect::<Vec<_>>(),
            [(ENABLE_PUSH, 0), (MAX_FRAME_SIZE, 1 << 20)]
        );
    }

    #[test]
    fn a_dependency_is_read_past_the_padding() {
        let h = Head {
            len: 7,
            kind: HEADERS,
            flags: PRIORITY | PADDED,
            id: 3,
        };
        // Pad length 1, then E bit + stream 3, weight, a field, the padding.
        let p = [1, 0x80, 0, 0, 3, 16, 0x82, 0];
        assert_eq!(headers_dependency(h, &p), Some(3));
        let plain = Head { flags: 0, ..h };
        assert_eq!(headers_dependency(plain, &p), None);
        assert_eq!(dependency(&[0, 0, 0, 5, 16]), Some(5));
        assert!(needs_stream(PRIORITY_FRAME) && !needs_stream(WINDOW_UPDATE));
    }

    #[test]
    fn big_window_credit_is_split() {
        let mut out = BytesMut::new();
        window_update(&mut out, 0, (1 << 31) + 5);
        assert_eq!(out.len(), 2 * (FRAME_HEADER + 4));
        window_update(&mut out, 0, 0);
        assert_eq!(out.len(), 2 * (FRAME_HEADER + 4), "no credit, no frame");
    }
}
