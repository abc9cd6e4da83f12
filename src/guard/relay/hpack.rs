//! HPACK decoding (RFC 7541) for the frame relay: the dynamic table each
//! peer's encoder builds, followed block by block, and the fields the guard
//! reads. Why it is the guard's own and not a crate's: docs/design.md,
//! "HPACK". The `hpack` fuzz target holds it against `loona-hpack`.
//!
//! Encoding is only literals (`put_literal`), which touch no table.

use std::collections::VecDeque;

use crate::guard::registry::{Origin, ORIGIN_CONNECTION, ORIGIN_FILTER_CHAIN, ORIGIN_LISTENER};

/// Why a header block could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockError {
    /// Not valid HPACK: the dynamic tables can no longer be followed.
    Compression,
    /// Decoded, the block outgrew `limit` (an HPACK bomb, or just huge):
    /// decoding stopped there, so the table can no longer be followed.
    TooLarge,
}

/// One peer's HPACK encoder as the guard follows it: the dynamic table its
/// blocks build, and the largest table the other peer's SETTINGS let it use.
pub struct Hpack {
    table: Table,
    allowed: usize,
    /// Huffman-decoded strings, reused.
    name: Vec<u8>,
    value: Vec<u8>,
}

impl Hpack {
    /// A decoder whose peer may use a table of up to `table` bytes (its
    /// starting size, RFC 7541 §4.2).
    pub fn new(table: usize) -> Self {
        Self {
            table: Table {
                entries: VecDeque::new(),
                size: 0,
                max: table,
            },
            allowed: table,
            name: Vec::new(),
            value: Vec::new(),
        }
    }

    /// The other peer's HEADER_TABLE_SIZE changed to `size`. Until the
    /// change is acknowledged the encoder may still use the old one, so
    /// the limit only ever grows.
    pub fn allow(&mut self, size: u32) {
        self.allowed = self.allowed.max(size as usize);
    }
}

/// Decodes `block` with `hpack`, which follows the sender's dynamic table;
/// past `limit` (RFC 9113 §6.5.2's size) decoding stops. `block` is left
/// empty, ready for reuse; with `all`, every field is kept.
pub fn decode(
    hpack: &mut Hpack,
    block: &mut Vec<u8>,
    limit: usize,
    all: Option<&mut Vec<Field>>,
) -> Result<Fields, BlockError> {
    let result = decode_block(hpack, block, limit, all);
    block.clear();
    result
}

fn decode_block(
    h: &mut Hpack,
    block: &[u8],
    limit: usize,
    mut all: Option<&mut Vec<Field>>,
) -> Result<Fields, BlockError> {
    use BlockError::Compression;
    let mut f = Fields::default();
    let mut at = 0;
    let mut any_field = false;
    while let Some(&first) = block.get(at) {
        if first & 0x80 != 0 {
            // Indexed field (§6.1).
            let (index, next) = integer(block, at, 7).ok_or(Compression)?;
            at = next;
            let (name, value) = h.table.get(index).ok_or(Compression)?;
            note(&mut f, &mut all, name, value, false, limit)?;
            any_field = true;
            continue;
        }
        if first & 0xe0 == 0x20 {
            // Dynamic table size update (§6.3): only before the first field
            // (§4.2), and within what SETTINGS allowed.
            let (size, next) = integer(block, at, 5).ok_or(Compression)?;
            at = next;
            if any_field || size as usize > h.allowed {
                return Err(Compression);
            }
            h.table.resize(size as usize);
            f.indexed = true;
            continue;
        }
        // A literal (§6.2): with incremental indexing (01), or without
        // (0000) or never (0001) indexed.
        let indexing = first & 0x40 != 0;
        let never = !indexing && first & 0x10 != 0;
        let (index, next) = integer(block, at, if indexing { 6 } else { 4 }).ok_or(Compression)?;
        at = next;
        let literal_name = if index == 0 {
            let (s, next) = string(block, at, &mut h.name).ok_or(Compression)?;
            at = next;
            Some(s)
        } else {
            None
        };
        let (value_at, value_end, value_huffman) = string_span(block, at).ok_or(Compression)?;
        at = value_end;
        let value: &[u8] = if value_huffman {
            h.value.clear();
            huffman(&block[value_at..value_end], &mut h.value).ok_or(Compression)?;
            &h.value
        } else {
            &block[value_at..value_end]
        };
        let name: &[u8] = match literal_name {
            Some(Span::Raw(a, b)) => &block[a..b],
            Some(Span::Decoded) => &h.name,
            None => h.table.get(index).ok_or(Compression)?.0,
        };
        note(&mut f, &mut all, name, value, never, limit)?;
        any_field = true;
        if indexing {
            let entry = (Box::from(name), Box::from(value));
            h.table.insert(entry);
            f.indexed = true;
        }
    }
    // A block of size updates alone (an empty trailer block may carry
    // one) is legal.
    Ok(f)
}

/// Counts one field, reads the few the guard uses, and keeps it in `all`.
fn note(
    f: &mut Fields,
    all: &mut Option<&mut Vec<Field>>,
    name: &[u8],
    value: &[u8],
    never_indexed: bool,
    limit: usize,
) -> Result<(), BlockError> {
    f.list_size += name.len() + value.len() + 32;
    if f.list_size > limit {
        return Err(BlockError::TooLarge);
    }
    let text = || String::from_utf8_lossy(value).into_owned();
    match name {
        b":status" => f.status = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok()),
        b":method" => f.method = Some(text()),
        b":protocol" => f.protocol = Some(text()),
        b":path" => f.path = Some(text()),
        b"content-type" => f.content_type = Some(text()),
        b"grpc-status" => f.grpc_status = Some(value.to_vec()),
        ORIGIN_CONNECTION => {
            f.origin.connection = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok())
        }
        ORIGIN_FILTER_CHAIN => f.origin.filter_chain = Some(text().into()),
        ORIGIN_LISTENER => f.origin.listener = Some(text().into()),
        _ => {}
    }
    if let Some(all) = all.as_mut() {
        all.push(Field {
            name: name.to_vec(),
            value: value.to_vec(),
            never_indexed,
        });
    }
    Ok(())
}

/// Where a string literal's octets are: in the block, or decoded.
enum Span {
    Raw(usize, usize),
    Decoded,
}

/// The string literal at `block[at]` (§5.2): raw, or Huffman-decoded into
/// `buf`; and where the next byte is.
fn string(block: &[u8], at: usize, buf: &mut Vec<u8>) -> Option<(Span, usize)> {
    let (start, end, huffman_coded) = string_span(block, at)?;
    if !huffman_coded {
        return Some((Span::Raw(start, end), end));
    }
    buf.clear();
    huffman(&block[start..end], buf)?;
    Some((Span::Decoded, end))
}

/// A string literal's octets (`start..end`) and whether they are Huffman
/// coded; None if it is cut short.
fn string_span(block: &[u8], at: usize) -> Option<(usize, usize, bool)> {
    let huffman_coded = *block.get(at)? & 0x80 != 0;
    let (len, start) = integer(block, at, 7)?;
    let end = start
        .checked_add(len as usize)
        .filter(|&e| e <= block.len())?;
    Some((start, end, huffman_coded))
}

/// The HPACK integer with an `n`-bit prefix at `block[at]` (§5.1), and
/// where the next byte is; None if it is cut short or past 32 bits.
pub(super) fn integer(block: &[u8], at: usize, n: u8) -> Option<(u32, usize)> {
    let mask = (1u16 << n) as u8 - 1;
    let first = *block.get(at)? & mask;
    if first < mask {
        return Some((u32::from(first), at + 1));
    }
    let mut value = u64::from(mask);
    // At most five continuation bytes: 7 × 5 bits covers 32.
    for (i, &b) in block.get(at + 1..)?.iter().take(5).enumerate() {
        value += u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return u32::try_from(value).ok().map(|v| (v, at + 2 + i));
        }
    }
    None
}

/// A dynamic table entry: name and value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// The dynamic table (§2.3.2, §4): newest first, sizes as §4.1 counts them.
struct Table {
    entries: VecDeque<Entry>,
    size: usize,
    max: usize,
}

impl Table {
    /// Entry `index` of the static table then this one (§2.3.3).
    fn get(&self, index: u32) -> Option<(&[u8], &[u8])> {
        let index = index as usize;
        match index {
            0 => None,
            1..=STATIC_LEN => Some(STATIC[index - 1]),
            _ => self
                .entries
                .get(index - STATIC_LEN - 1)
                .map(|(n, v)| (&n[..], &v[..])),
        }
    }

    /// Adds an entry, evicting the oldest until it fits (§4.4); one larger
    /// than the table empties it.
    fn insert(&mut self, (name, value): Entry) {
        let size = name.len() + value.len() + 32;
        self.evict_to(self.max.saturating_sub(size));
        if size <= self.max {
            self.entries.push_front((name, value));
            self.size += size;
        }
    }

    /// A size update (§4.3).
    fn resize(&mut self, max: usize) {
        self.max = max;
        self.evict_to(max);
    }

    fn evict_to(&mut self, target: usize) {
        while self.size > target {
            match self.entries.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + 32,
                None => {
                    self.size = 0;
                    return;
                }
            }
        }
    }
}

/// Decodes a Huffman-coded string (§5.2, Appendix B) into `out`. The code
/// is canonical, so a code of each length is found from that length's first
/// code and count, with no tree. None on EOS in the string, or padding that
/// is longer than 7 bits or not EOS's leading ones.
fn huffman(src: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let mut code: u32 = 0;
    let mut len = 0usize;
    for &byte in src {
        for shift in (0..8).rev() {
            code = code << 1 | u32::from(byte >> shift & 1);
            len += 1;
            let first = CANON.first[len];
            let count = u32::from(CANON.count[len]);
            if code >= first && code - first < count {
                let symbol =
                    CANON.symbols[usize::from(CANON.offset[len]) + (code - first) as usize];
                if symbol == EOS {
                    return None;
                }
                out.push(symbol as u8);
                code = 0;
                len = 0;
            } else if len == MAX_CODE_LEN {
                return None;
            }
        }
    }
    (len <= 7 && code == (1u32 << len) - 1).then_some(())
}

const EOS: u16 = 256;
const MAX_CODE_LEN: usize = 30;

/// The canonical Huffman code, derived at compile time from its lengths.
struct Canon {
    /// Per code length: the first code, how many codes, and where their
    /// symbols start in `symbols`.
    first: [u32; MAX_CODE_LEN + 1],
    count: [u16; MAX_CODE_LEN + 1],
    offset: [u16; MAX_CODE_LEN + 1],
    /// Every symbol, by code length, then by value.
    symbols: [u16; 257],
}

const CANON: Canon = canon();

const fn canon() -> Canon {
    let mut count = [0u16; MAX_CODE_LEN + 1];
    let mut s = 0;
    while s < 257 {
        count[CODE_LEN[s] as usize] += 1;
        s += 1;
    }
    let mut first = [0u32; MAX_CODE_LEN + 1];
    let mut offset = [0u16; MAX_CODE_LEN + 1];
    let (mut code, mut at, mut len) = (0u32, 0u16, 1);
    while len <= MAX_CODE_LEN {
        first[len] = code;
        offset[len] = at;
        code = (code + count[len] as u32) << 1;
        at += count[len];
        len += 1;
    }
    let mut fill = offset;
    let mut symbols = [0u16; 257];
    s = 0;
    while s < 257 {
        let l = CODE_LEN[s] as usize;
        symbols[fill[l] as usize] = s as u16;
        fill[l] += 1;
        s += 1;
    }
    Canon {
        first,
        count,
        offset,
        symbols,
    }
}

/// Each symbol's code length in bits (RFC 7541 Appendix B; 256 is EOS).
const CODE_LEN: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
];

const STATIC_LEN: usize = 61;

/// The static table (RFC 7541 Appendix A).
const STATIC: [(&[u8], &[u8]); STATIC_LEN] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// The fields of a header block the guard reads; the rest is only counted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Fields {
    pub status: Option<u16>,
    pub method: Option<String>,
    pub protocol: Option<String>,
    pub path: Option<String>,
    pub content_type: Option<String>,
    pub grpc_status: Option<Vec<u8>>,
    /// Which downstream connection and filter chain of Envoy's the request
    /// came in on, when Envoy's route says so (a config push's drain ends
    /// the streams of the connections it drains).
    pub origin: Origin,
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

/// A header block of `fields`, every one a literal without indexing and
/// without Huffman coding: it changes no dynamic table.
pub fn literal_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in fields {
        put_literal(&mut block, name.as_bytes(), value.as_bytes(), false);
    }
    block
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(decode(&mut Hpack::new(4096), &mut good.clone(), 1 << 16, None).is_ok());
        for cut in 1..good.len() {
            let mut block = good[..cut].to_vec();
            assert_eq!(
                decode(&mut Hpack::new(4096), &mut block, 1 << 16, None),
                Err(BlockError::Compression)
            );
        }
        // A size update, then an indexed field, each one byte.
        let f = decode(&mut Hpack::new(4096), &mut vec![0x20, 0x82], 1 << 16, None).unwrap();
        assert!(f.indexed && f.method.as_deref() == Some("GET"));
        // Integers: 1337 with a 5-bit prefix is whole; cut, or past 32 bits, is not.
        assert_eq!(integer(&[0x1f, 0x9a, 0x0a], 0, 5), Some((1337, 3)));
        assert_eq!(integer(&[0x1f, 0x9a], 0, 5), None);
        assert_eq!(
            integer(&[0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f], 0, 7),
            None
        );
        // A literal whose value is missing (the fuzzer's first find).
        assert!(decode(
            &mut Hpack::new(4096),
            &mut vec![0x40, 0x01, b'a'],
            1 << 16,
            None
        )
        .is_err());
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
        // The largest 32-bit value fits; one more does not.
        out.clear();
        put_integer(&mut out, 0, 5, u64::from(u32::MAX));
        assert_eq!(integer(&out, 0, 5), Some((u32::MAX, out.len())));
        out.clear();
        put_integer(&mut out, 0, 5, u64::from(u32::MAX) + 1);
        assert_eq!(integer(&out, 0, 5), None);
    }

    #[test]
    fn the_canonical_code_has_the_rfc_codes() {
        // Appendix B: '0' 00000, 'a' 00011, ':' 1011100, '&' 11111000,
        // EOS thirty ones.
        let code_of = |sym: u16| {
            let len = CODE_LEN[usize::from(sym)] as usize;
            let at = CANON.symbols.iter().position(|&s| s == sym).unwrap();
            (
                CANON.first[len] + (at - usize::from(CANON.offset[len])) as u32,
                len,
            )
        };
        assert_eq!(code_of(u16::from(b'0')), (0b00000, 5));
        assert_eq!(code_of(u16::from(b'a')), (0b00011, 5));
        assert_eq!(code_of(u16::from(b':')), (0b1011100, 7));
        assert_eq!(code_of(u16::from(b'&')), (0b11111000, 8));
        assert_eq!(code_of(EOS), ((1 << 30) - 1, 30));
        // Every byte value decodes: the code of each, alone, padded with ones.
        for sym in 0..=255u16 {
            let (code, len) = code_of(sym);
            let pad = (8 - len % 8) % 8;
            let bits = u64::from(code) << pad | ((1u64 << pad) - 1);
            let bytes = (len + pad) / 8;
            let src: Vec<u8> = (0..bytes).rev().map(|i| (bits >> (8 * i)) as u8).collect();
            let mut out = Vec::new();
            assert_eq!(huffman(&src, &mut out), Some(()), "symbol {sym}");
            assert_eq!(out, [sym as u8]);
        }
    }

    #[test]
    fn a_field_larger_than_the_table_empties_it() {
        let mut dec = Hpack::new(64);
        // `a: b` (34 bytes) fits; a 40-byte value does not, and evicts it.
        let mut seed = vec![0x40, 1, b'a', 1, b'b'];
        decode(&mut dec, &mut seed, 1 << 16, None).unwrap();
        assert!(decode(&mut dec, &mut vec![0x80 | 62], 1 << 16, None).is_ok());
        let mut big = vec![0x40, 1, b'c', 40];
        big.extend([b'x'; 40]);
        decode(&mut dec, &mut big, 1 << 16, None).unwrap();
        assert!(decode(&mut dec, &mut vec![0x80 | 62], 1 << 16, None).is_err());
    }
}
