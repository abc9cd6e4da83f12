//! Whether a new stream goes on to the application, and the guard's own
//! answer when it does not (refused retryably, too large, malformed, or no
//! application). And the message rules of RFC 9113 §8.1 a frame relay
//! holds the client to: a malformed request is a stream error
//! PROTOCOL_ERROR, and an intermediary never forwards it (§8.1.1).

use std::sync::Arc;

use tokio::time::Instant;

use super::blocks::trailers_only;
use super::ids::StreamIds;
use super::life::Life;
use super::peer::Peer;
use super::settings::PeerSettings;
use super::streams::{Stream, Streams};
use super::wire;
use crate::guard::body::{request_kind_of, BodyKind};
use crate::guard::grpc;
use crate::guard::handle::Handle;
use crate::guard::registry::{EndQueue, Refused, Registered};
use crate::guard::signals;
use crate::metrics::StreamProtocol;

/// Why a new stream was refused.
pub(super) enum Refusal {
    /// Past the header list limit: 431.
    TooLarge,
    /// Not processed, safe to retry (REFUSED_STREAM).
    Reset,
    /// The drain refuses new streams: trailers-only UNAVAILABLE for gRPC.
    Draining(BodyKind),
    /// A malformed request (RFC 9113 §8.1.1): RST_STREAM(PROTOCOL_ERROR).
    Malformed,
}

/// Why a new stream is not admitted, if it is not: its head is past
/// `limit`, the connection refuses new streams (its lifecycle, or a
/// GOAWAY's last-stream id), or `open` streams already reach the limit
/// the client was told.
pub(super) fn admission(
    fields: &wire::Fields,
    limit: usize,
    life: &Life,
    ids: &StreamIds,
    open: usize,
    settings: &PeerSettings,
) -> Option<Refusal> {
    if fields.list_size > limit {
        return Some(Refusal::TooLarge);
    }
    if life.machine().refuses_streams() || life.refuses(ids.last()) {
        return Some(Refusal::Reset);
    }
    // RFC 9113 §5.1.2: past the limit the client was told (the
    // application's, or the guard's if lower), REFUSED_STREAM; a lower
    // limit binds once the client acked it (§6.5.3).
    (open >= settings.streams_limit() as usize).then_some(Refusal::Reset)
}

/// A stream the registry let in, to be opened.
pub(super) struct Admitted {
    /// Its entry in the guard's registry.
    reg: Registered,
    /// What its body is (gRPC or opaque), for its boundaries.
    kind: BodyKind,
    /// Its request signals, if the guard keeps them.
    sig: Option<signals::Request>,
}

impl Admitted {
    /// The open stream: `window` its initial send window.
    pub(super) fn open(self, end_stream: bool, window: i64, now: Instant) -> Stream {
        Stream::new(self.reg, self.kind, end_stream, self.sig, window, now)
    }
}

/// Registers stream `id` of connection `conn` with the guard, its ends
/// asked through `queue`; or why the registry refused it.
pub(super) fn register(
    guard: &Handle,
    conn: u64,
    queue: &Arc<EndQueue>,
    id: u32,
    fields: &wire::Fields,
) -> Result<Admitted, Refusal> {
    let ct = fields.content_type.as_deref().unwrap_or("");
    let kind = request_kind_of(ct);
    let grpc = kind != BodyKind::Opaque;
    let reg = match guard.try_register_relayed(conn, grpc, queue, id) {
        Ok(r) => r,
        Err(Refused::Terminating) => return Err(Refusal::Draining(kind)),
        Err(Refused::Full) => return Err(Refusal::Reset),
    };
    reg.set_origin(fields.origin.clone());
    let protocol = if grpc {
        StreamProtocol::grpc
    } else {
        StreamProtocol::http
    };
    let sig = guard
        .signals()
        .start(grpc, fields.path.as_deref().unwrap_or("/"), protocol);
    Ok(Admitted { reg, kind, sig })
}

/// A stream the application never sees, answered to the client here.
pub(super) fn refuse(
    client: &mut Peer,
    settings: &mut PeerSettings,
    id: u32,
    end_stream: bool,
    refusal: Refusal,
) {
    match refusal {
        Refusal::TooLarge => {
            let block = wire::literal_block(&[(":status", "431")]);
            client.put_own_block(id, &block, true, settings.take_update_due());
        }
        Refusal::Reset => wire::rst(&mut client.write, id, wire::REFUSED_STREAM),
        Refusal::Malformed => wire::rst(&mut client.write, id, wire::PROTOCOL_ERROR),
        Refusal::Draining(kind) => match trailers_only(kind, grpc::REFUSED_MESSAGE) {
            Some(block) => client.put_own_block(id, &block, true, settings.take_update_due()),
            None => wire::rst(&mut client.write, id, wire::REFUSED_STREAM),
        },
    }
    if !end_stream && !matches!(refusal, Refusal::Reset | Refusal::Malformed) {
        // Answered in full before the request's end: stop it, no error.
        wire::rst(&mut client.write, id, wire::NO_ERROR);
    }
}

/// A relayed request's body starts: with a content-length, its DATA is
/// counted against it (`body_data`).
pub(super) fn body_start(streams: &mut Streams, id: u32, fields: &[wire::Field], end_stream: bool) {
    let Ok(Some(length)) = content_length(fields) else {
        return;
    };
    if let Some(s) = streams.get_mut(&id).filter(|_| !end_stream) {
        s.expect_body(length);
    }
}

/// `n` more bytes of stream `id`'s request body, and whether it ends
/// here: false if that breaks its content-length (RFC 9113 §8.1.1).
pub(super) fn body_data(streams: &mut Streams, id: u32, n: usize, end: bool) -> bool {
    streams.get_mut(&id).is_none_or(|s| s.body_data(n, end))
}

/// Why a request head is malformed (RFC 9113 §8.1.1), if it is: a field
/// no header section may carry (see `field_malformed`); a pseudo-header
/// that is unknown or a response's, one after a regular field, or one
/// twice (§8.3); :method, :scheme or :path missing, or :path empty
/// (§8.3.1); a CONNECT with :scheme or :path, or without :authority
/// (§8.5), an extended one without all three (RFC 8441 §4), :protocol on
/// any other method; a content-length that is not a number, or not 0 on a
/// request that ends with its head.
pub(super) fn malformed_request(fields: &[wire::Field], end_stream: bool) -> Option<&'static str> {
    // :method, :scheme, :path, :authority, :protocol
    let mut seen = [false; 5];
    let (mut regular, mut connect, mut empty_path) = (false, false, false);
    for f in fields {
        if let Some(why) = field_malformed(f) {
            return Some(why);
        }
        let i = match f.name.as_slice() {
            b":method" => 0,
            b":scheme" => 1,
            b":path" => 2,
            b":authority" => 3,
            b":protocol" => 4,
            n if n.starts_with(b":") => return Some("an unknown or response pseudo-header"),
            _ => {
                regular = true;
                continue;
            }
        };
        if regular {
            return Some("a pseudo-header after a regular field");
        }
        if std::mem::replace(&mut seen[i], true) {
            return Some("a pseudo-header twice");
        }
        connect |= i == 0 && f.value == b"CONNECT";
        empty_path |= i == 2 && f.value.is_empty();
    }
    let [method, scheme, path, authority, protocol] = seen;
    let why = match (connect, protocol) {
        _ if !method => "no :method",
        (true, false) if scheme || path || !authority => {
            "a CONNECT with :scheme or :path, or without :authority"
        }
        (true, true) if !(scheme && path && authority) => {
            "an extended CONNECT without :scheme, :path or :authority"
        }
        (false, true) => ":protocol on a method other than CONNECT",
        (false, false) if !scheme || !path => "no :scheme or :path",
        _ if empty_path => "an empty :path",
        _ => match content_length(fields) {
            Err(()) => "a content-length that is not one number",
            Ok(Some(n)) if end_stream && n > 0 => "a content-length, and no DATA",
            Ok(_) => return None,
        },
    };
    Some(why)
}

/// Whether a trailer section is well-formed: no pseudo-header (RFC 9113
/// §8.1), and no field `field_malformed` refuses.
pub(super) fn trailers_ok(fields: &[wire::Field]) -> bool {
    fields
        .iter()
        .all(|f| !f.name.starts_with(b":") && field_malformed(f).is_none())
}

/// Why a field is malformed in any header section, if it is: an uppercase
/// name (RFC 9113 §8.2, a MUST); a connection-specific field, or TE other
/// than `trailers` (§8.2.2); and what §8.2.1 says implementations SHOULD
/// check: a name with a control character, a space, DEL, a non-ASCII
/// byte or a colon past its first byte, a value with NUL, CR or LF.
/// (Leading or trailing whitespace in a value, also a SHOULD, is let
/// through: the application may judge it.)
fn field_malformed(f: &wire::Field) -> Option<&'static str> {
    let name = f.name.strip_prefix(b":").unwrap_or(&f.name);
    if name.iter().any(u8::is_ascii_uppercase) {
        return Some("an uppercase field name");
    }
    if name.is_empty() || name.iter().any(|&b| b <= b' ' || b >= 0x7f || b == b':') {
        return Some("a field name with a character RFC 9113 §8.2.1 excludes");
    }
    if f.value.iter().any(|&b| matches!(b, 0 | b'\r' | b'\n')) {
        return Some("a field value with NUL, CR or LF");
    }
    match f.name.as_slice() {
        b"connection" | b"proxy-connection" | b"keep-alive" | b"transfer-encoding" | b"upgrade" => {
            Some("a connection-specific field")
        }
        b"te" if !f.value.eq_ignore_ascii_case(b"trailers") => Some("TE other than trailers"),
        _ => None,
    }
}

/// The request's content-length, if it has one; every value (a field may
/// be repeated, or a list) must be the same number (RFC 9110 §8.6).
fn content_length(fields: &[wire::Field]) -> Result<Option<u64>, ()> {
    let mut length = None;
    for f in fields.iter().filter(|f| f.name == b"content-length") {
        for part in f.value.split(|&b| b == b',') {
            let digits = part.trim_ascii();
            if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                return Err(());
            }
            let n = std::str::from_utf8(digits)
                .ok()
                .and_then(|d| d.parse::<u64>().ok())
                .ok_or(())?;
            if length.is_some_and(|l| l != n) {
                return Err(());
            }
            length = Some(n);
        }
    }
    Ok(length)
}
