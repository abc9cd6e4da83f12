//! HTTP/2 frames as the frame-relay data path ([`super::frames`]) sees them:
//! whole frames split off a byte stream, the few fields of a header block
//! the guard reads, and the frames the guard writes itself (RFC 9113 §6).
//!
//! The guard never re-encodes what it relays. What it adds it encodes as
//! HPACK literals *without indexing*, which leave both peers' dynamic tables
//! as they are (RFC 7541 §6.2.2), so the blocks it relays stay valid.

use bytes::{BufMut, BytesMut};

/// Every frame starts with a 9-byte header.
pub const FRAME_HEADER: usize = 9;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
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
pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const MAX_FRAME_SIZE: u16 = 0x5;
pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
pub const ENABLE_CONNECT_PROTOCOL: u16 = 0x8;

// Error codes.
pub const NO_ERROR: u32 = 0x0;
pub const PROTOCOL_ERROR: u32 = 0x1;
pub const FLOW_CONTROL_ERROR: u32 = 0x3;
pub const FRAME_SIZE_ERROR: u32 = 0x6;
pub const CANCEL: u32 = 0x8;
pub const REFUSED_STREAM: u32 = 0x7;
pub const COMPRESSION_ERROR: u32 = 0x9;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// The largest stream id (and the first GOAWAY's "every stream" id).
pub const MAX_STREAM_ID: u32 = (1 << 31) - 1;

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

/// A header block of `fields`, every one a literal without indexing and
/// without Huffman coding: it changes no dynamic table.
pub fn literal_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in fields {
        put_literal(&mut block, name.as_bytes(), value.as_bytes(), false);
    }
    block
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

/// The fields of a header block the guard reads; the rest is only counted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Fields {
    pub status: Option<u16>,
    pub method: Option<String>,
    pub protocol: Option<String>,
    pub path: Option<String>,
    pub content_type: Option<String>,
    pub grpc_status: Option<Vec<u8>>,
    /// The block changed the dynamic table (an entry added, or a size
    /// update).
    pub indexed: bool,
    /// RFC 9113 §6.5.2's size: names, values and 32 bytes per field.
    pub list_size: usize,
}

/// One decoded header field, kept whole for a block the guard re-encodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
    /// Sent as "never indexed" (RFC 7541 §6.2.3, a secret such as a token):
    /// an intermediary re-encodes it so too.
    pub never_indexed: bool,
}

/// Why a header block could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockError {
    /// Not valid HPACK: the dynamic tables can no longer be followed.
    Compression,
    /// Decoded, the block outgrew `limit` (an HPACK bomb, or just huge).
    TooLarge,
}

/// One peer's HPACK encoder as the guard follows it: the dynamic table its
/// blocks build, and the largest table the other peer's SETTINGS let it
/// use. Decoding is `loona-hpack`'s (tables, Huffman, integers); what the
/// guard adds on top is the block's shape ([`shape`]): a size update only
/// at the start, and which fields were sent never-indexed.
pub struct Hpack {
    decoder: loona_hpack::Decoder<'static>,
    allowed: usize,
}

impl Hpack {
    /// A decoder whose peer may use a table of up to `table` bytes.
    pub fn new(table: usize) -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(table);
        Self {
            decoder,
            allowed: table,
        }
    }

    /// The other peer's HEADER_TABLE_SIZE changed to `size`. Until the
    /// change is acknowledged the encoder may still use the old one, so
    /// the limit only ever grows.
    pub fn allow(&mut self, size: u32) {
        let size = size as usize;
        if size > self.allowed {
            self.allowed = size;
            self.decoder.set_max_allowed_table_size(size);
        }
    }
}

/// Decodes `block` with `hpack` (which follows the sender's dynamic
/// table); past `limit` (RFC 9113 §6.5.2's size) the block is refused.
/// `block` is left empty, ready for reuse; with `all`, every field is kept.
pub fn decode(
    hpack: &mut Hpack,
    block: &mut Vec<u8>,
    limit: usize,
    mut all: Option<&mut Vec<Field>>,
) -> Result<Fields, BlockError> {
    let Some(shape) = shape(block) else {
        block.clear();
        return Err(BlockError::Compression);
    };
    let mut f = Fields {
        indexed: shape.indexed,
        ..Fields::default()
    };
    if shape.fields == 0 {
        // Only size updates (an empty trailer block can carry one). The
        // decoder takes a size update only before a field, so one that
        // changes no table (static index 2, `:method: GET`) follows, and
        // its callback is ignored.
        block.push(0x82);
    }
    let mut at = 0;
    let mut over = false;
    let encoded = &block[..];
    let result = hpack.decoder.decode_with_cb(encoded, |name, value| {
        // The callbacks come in the block's order, one per field.
        let Some(kind) = next_field(encoded, &mut at) else {
            return;
        };
        if over || shape.fields == 0 {
            return;
        }
        f.list_size += name.len() + value.len() + 32;
        if f.list_size > limit {
            over = true;
            return;
        }
        let text = || String::from_utf8_lossy(&value).into_owned();
        match &*name {
            b":status" => {
                f.status = std::str::from_utf8(&value)
                    .ok()
                    .and_then(|s| s.parse().ok())
            }
            b":method" => f.method = Some(text()),
            b":protocol" => f.protocol = Some(text()),
            b":path" => f.path = Some(text()),
            b"content-type" => f.content_type = Some(text()),
            b"grpc-status" => f.grpc_status = Some(value.to_vec()),
            _ => {}
        }
        if let Some(all) = all.as_mut() {
            all.push(Field {
                name: name.into_owned(),
                value: value.into_owned(),
                never_indexed: kind == Kind::NeverIndexed,
            });
        }
    });
    block.clear();
    result.map_err(|_| BlockError::Compression)?;
    if over {
        return Err(BlockError::TooLarge);
    }
    Ok(f)
}

/// An HPACK representation (RFC 7541 §6), told by its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Indexed,
    WithIndexing,
    WithoutIndexing,
    NeverIndexed,
    SizeUpdate,
}

impl Kind {
    fn of(b: u8) -> (Kind, u8) {
        match b {
            b if b & 0x80 != 0 => (Kind::Indexed, 7),
            b if b & 0x40 != 0 => (Kind::WithIndexing, 6),
            b if b & 0x20 != 0 => (Kind::SizeUpdate, 5),
            b if b & 0x10 != 0 => (Kind::NeverIndexed, 4),
            _ => (Kind::WithoutIndexing, 4),
        }
    }
}

/// What a block holds, read without decoding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Header fields (every representation but a size update).
    pub fields: usize,
    /// It changes the dynamic table: an entry added, or a size update.
    pub indexed: bool,
}

/// The shape of `block` if it is a sequence of whole representations
/// (every integer and string complete, integers within 32 bits) with its
/// size updates first (RFC 7541 §4.2); None otherwise.
pub fn shape(block: &[u8]) -> Option<Shape> {
    let mut s = Shape {
        fields: 0,
        indexed: false,
    };
    let mut at = 0;
    while at < block.len() {
        let kind = representation(block, &mut at)?;
        match kind {
            Kind::SizeUpdate if s.fields > 0 => return None,
            Kind::SizeUpdate => s.indexed = true,
            Kind::WithIndexing => {
                s.indexed = true;
                s.fields += 1;
            }
            _ => s.fields += 1,
        }
    }
    Some(s)
}

/// The kind of the next field at or after `*at`, skipping size updates;
/// `*at` moves past it.
fn next_field(block: &[u8], at: &mut usize) -> Option<Kind> {
    loop {
        match representation(block, at)? {
            Kind::SizeUpdate => continue,
            kind => return Some(kind),
        }
    }
}

/// The representation at `*at`, which moves past it; None if cut short.
fn representation(block: &[u8], at: &mut usize) -> Option<Kind> {
    let (kind, prefix) = Kind::of(*block.get(*at)?);
    let (index, next) = integer(block, *at, prefix)?;
    *at = next;
    let literal = matches!(
        kind,
        Kind::WithIndexing | Kind::WithoutIndexing | Kind::NeverIndexed
    );
    if literal {
        let strings = if index == 0 { 2 } else { 1 };
        for _ in 0..strings {
            let (len, next) = integer(block, *at, 7)?;
            *at = next
                .checked_add(len as usize)
                .filter(|&e| e <= block.len())?;
        }
    }
    Some(kind)
}

/// The HPACK integer with an `n`-bit prefix at `block[at]`, and where the
/// next byte is; None if it is cut short or past 32 bits.
fn integer(block: &[u8], at: usize, n: u8) -> Option<(u32, usize)> {
    let mask = (1u16 << n) as u8 - 1;
    let first = *block.get(at)? & mask;
    if first < mask {
        return Some((u32::from(first), at + 1));
    }
    let mut value = u64::from(mask);
    // At most four continuation bytes, as the decoder allows.
    for (i, &b) in block.get(at + 1..)?.iter().take(4).enumerate() {
        value += u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return u32::try_from(value).ok().map(|v| (v, at + 2 + i));
        }
    }
    None
}

/// Appends an HPACK integer with an `n`-bit prefix and the
/// representation's bits `mask` (RFC 7541 §5.1).
pub fn put_integer(out: &mut Vec<u8>, mask: u8, n: u8, mut v: u64) {
    let max = (1u64 << n) - 1;
    if v < max {
        out.push(mask | v as u8);
        return;
    }
    out.push(mask | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// Appends a dynamic table size update to `size` (RFC 7541 §6.3).
pub fn put_size_update(out: &mut Vec<u8>, size: u32) {
    put_integer(out, 0x20, 5, u64::from(size));
}

/// Appends one field as a literal with a literal name, not Huffman coded:
/// without indexing, or never indexed (RFC 7541 §6.2.2, §6.2.3). Neither
/// touches a dynamic table, so the blocks the guard relays stay valid.
pub fn put_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8], never_indexed: bool) {
    out.push(if never_indexed { 0x10 } else { 0x00 });
    for s in [name, value] {
        put_integer(out, 0x00, 7, s.len() as u64);
        out.extend_from_slice(s);
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
    fn literals_decode_and_leave_the_table_alone() {
        let block = literal_block(&[("grpc-status", "14"), ("grpc-message", "bye")]);
        let mut dec = Hpack::new(4096);
        let f = decode(&mut dec, &mut block.clone(), 1 << 16, None).unwrap();
        assert_eq!(f.grpc_status.as_deref(), Some(&b"14"[..]));
        // Index 62 would be the first dynamic entry: still absent.
        let mut indexed = vec![0x80 | 62];
        assert_eq!(
            decode(&mut dec, &mut indexed, 1 << 16, None),
            Err(BlockError::Compression)
        );
    }

    #[test]
    fn a_block_past_the_limit_stops_decoding() {
        let block = literal_block(&[("a", &"x".repeat(100)), ("b", &"y".repeat(100))]);
        let mut dec = Hpack::new(4096);
        assert_eq!(
            decode(&mut dec, &mut block.clone(), 150, None),
            Err(BlockError::TooLarge)
        );
        let f = decode(&mut Hpack::new(4096), &mut block.clone(), 1000, None).unwrap();
        assert_eq!(f.list_size, 2 * (1 + 100 + 32));
    }

    #[test]
    fn truncated_representations_are_malformed_not_a_panic() {
        let good = literal_block(&[("grpc-status", "14")]);
        assert!(shape(&good).is_some());
        for cut in 1..good.len() {
            assert!(shape(&good[..cut]).is_none(), "cut at {cut}");
            let mut block = good[..cut].to_vec();
            assert_eq!(
                decode(&mut Hpack::new(4096), &mut block, 1 << 16, None),
                Err(BlockError::Compression)
            );
        }
        // A size update, then an indexed field, each one byte.
        assert_eq!(
            shape(&[0x20, 0x82]),
            Some(Shape {
                fields: 1,
                indexed: true
            })
        );
        // Integers: 1337 with a 5-bit prefix is whole; cut, or past 32 bits, is not.
        assert_eq!(integer(&[0x1f, 0x9a, 0x0a], 0, 5), Some((1337, 3)));
        assert_eq!(integer(&[0x1f, 0x9a], 0, 5), None);
        assert_eq!(integer(&[0x7f, 0xff, 0xff, 0xff, 0xff, 0x7f], 0, 7), None);
        // A literal whose value is missing (the fuzzer's first find).
        assert!(shape(&[0x40, 0x01, b'a']).is_none());
    }

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn fields_of(dec: &mut Hpack, block: &[u8]) -> Vec<(String, String)> {
        let mut all = Vec::new();
        decode(dec, &mut block.to_vec(), 1 << 16, Some(&mut all)).unwrap();
        all.into_iter()
            .map(|f| {
                (
                    String::from_utf8(f.name).unwrap(),
                    String::from_utf8(f.value).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn rfc_7541_appendix_c_examples_decode_with_their_tables() {
        // C.3: three requests, without Huffman, sharing one table.
        let mut dec = Hpack::new(4096);
        let get = |p: &str, a: &str| {
            vec![
                (":method".to_string(), "GET".to_string()),
                (":scheme".to_string(), p.to_string()),
                (":path".to_string(), a.to_string()),
                (":authority".to_string(), "www.example.com".to_string()),
            ]
        };
        let c31 = hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d");
        assert_eq!(fields_of(&mut dec, &c31), get("http", "/"));
        let c32 = hex("8286 84be 5808 6e6f 2d63 6163 6865");
        let mut want = get("http", "/");
        want.push(("cache-control".into(), "no-cache".into()));
        assert_eq!(fields_of(&mut dec, &c32), want);
        let c33 = hex("8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65");
        let mut want = get("https", "/index.html");
        want.push(("custom-key".into(), "custom-value".into()));
        assert_eq!(fields_of(&mut dec, &c33), want);

        // C.5: responses with a 256-byte table (set here by a size update),
        // the second evicting the first's `:status: 302`.
        let mut dec = Hpack::new(4096);
        let mut c51 = hex("3fe1 01");
        c51.extend(hex(
            "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230
             3133 2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65
             7861 6d70 6c65 2e63 6f6d",
        ));
        let date = "Mon, 21 Oct 2013 20:13:21 GMT";
        let resp = |status: &str| {
            vec![
                (":status".to_string(), status.to_string()),
                ("cache-control".to_string(), "private".to_string()),
                ("date".to_string(), date.to_string()),
                (
                    "location".to_string(),
                    "https://www.example.com".to_string(),
                ),
            ]
        };
        assert_eq!(fields_of(&mut dec, &c51), resp("302"));
        assert_eq!(
            fields_of(&mut dec, &hex("4803 3330 37c1 c0bf")),
            resp("307")
        );
        // C.4.1: the first request again, Huffman coded.
        let c41 = hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff");
        assert_eq!(fields_of(&mut Hpack::new(4096), &c41), get("http", "/"));
    }

    #[test]
    fn never_indexed_is_reported_and_size_updates_come_first() {
        let mut block = Vec::new();
        put_literal(&mut block, b"authorization", b"s3cret", true);
        put_literal(&mut block, b"x", b"y", false);
        let mut all = Vec::new();
        decode(&mut Hpack::new(4096), &mut block, 1 << 16, Some(&mut all)).unwrap();
        assert!(all[0].never_indexed && !all[1].never_indexed);
        // RFC 7541 §4.2: a size update after a field is a decoding error.
        let mut late = vec![0x82];
        put_size_update(&mut late, 0);
        assert_eq!(shape(&late), None);
        assert_eq!(
            decode(&mut Hpack::new(4096), &mut late, 1 << 16, None),
            Err(BlockError::Compression)
        );
        // A block of size updates alone (an empty trailer block) applies them.
        let mut dec = Hpack::new(4096);
        let mut seed = vec![0x40, 1, b'a', 1, b'b'];
        decode(&mut dec, &mut seed, 1 << 16, None).unwrap();
        let mut updates = Vec::new();
        put_size_update(&mut updates, 0);
        put_size_update(&mut updates, 4096);
        let f = decode(&mut dec, &mut updates, 1 << 16, None).unwrap();
        assert!(f.indexed && f.list_size == 0);
        assert_eq!(
            decode(&mut dec, &mut vec![0x80 | 62], 1 << 16, None),
            Err(BlockError::Compression),
            "the entry was evicted"
        );
        // A size update past what SETTINGS allowed is an error.
        let mut big = Vec::new();
        put_size_update(&mut big, 8192);
        big.push(0x82);
        assert!(decode(&mut Hpack::new(4096), &mut big.clone(), 1 << 16, None).is_err());
        let mut dec = Hpack::new(4096);
        dec.allow(8192);
        assert!(decode(&mut dec, &mut big, 1 << 16, None).is_ok());
    }

    #[test]
    fn invalid_huffman_padding_is_refused() {
        // `:path` with a Huffman-coded value: "/" (011000), then "0"
        // (00000), then three padding bits of zeros. Padding must be the
        // EOS prefix, all ones (RFC 7541 §5.2).
        let mut block = vec![0x04, 0x82, 0x63, 0x00];
        assert_eq!(
            decode(&mut Hpack::new(4096), &mut block, 1 << 16, None),
            Err(BlockError::Compression)
        );
    }

    #[test]
    fn hpack_integers_follow_rfc_7541() {
        // C.1.1 and C.1.2: 10 and 1337 with a 5-bit prefix, and back.
        let mut out = Vec::new();
        put_integer(&mut out, 0, 5, 10);
        assert_eq!(out, [0x0a]);
        out.clear();
        put_integer(&mut out, 0, 5, 1337);
        assert_eq!(out, [0x1f, 0x9a, 0x0a]);
        assert_eq!(integer(&out, 0, 5), Some((1337, 3)));
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
    fn big_window_credit_is_split() {
        let mut out = BytesMut::new();
        window_update(&mut out, 0, (1 << 31) + 5);
        assert_eq!(out.len(), 2 * (FRAME_HEADER + 4));
        window_update(&mut out, 0, 0);
        assert_eq!(out.len(), 2 * (FRAME_HEADER + 4), "no credit, no frame");
    }
}
