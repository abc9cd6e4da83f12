//! Where a response body may be ended, for each long-lived stream kind the
//! guard can end in-protocol over HTTP/2:
//!
//! - **gRPC** (`application/grpc…`): between length-prefixed messages; the
//!   end is trailers `grpc-status: 14`.
//! - **gRPC-Web** (`application/grpc-web…`): the same message framing, but
//!   trailers travel in the body as a final frame flagged 0x80; for
//!   `application/grpc-web-text…` the body is base64, so the framing is
//!   followed on the decoded bytes and an end is only possible where the
//!   base64 is complete (no quad half-sent).
//! - **Server-Sent Events** (`text/event-stream`): between events, i.e. right
//!   after a blank line; the end is the body's end, which EventSource
//!   clients answer by reconnecting on their own.
//!
//! Anything else is opaque: it is never ended early, only let finish or
//! reset, so an incomplete body never looks complete.

use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use http::header::CONTENT_TYPE;
use http::HeaderMap;

use super::grpc::{self, Framer};

/// What a request or response speaks, as far as ending it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// gRPC over HTTP/2.
    Grpc,
    /// gRPC-Web; `text`: base64 bodies.
    GrpcWeb { text: bool },
    /// Server-Sent Events.
    Sse,
    /// Anything else.
    Opaque,
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// The gRPC flavour of a request (Opaque when it is not gRPC at all).
pub fn request_kind(headers: &HeaderMap) -> BodyKind {
    request_kind_of(content_type(headers))
}

/// [`request_kind`] of a `content-type` value.
pub fn request_kind_of(ct: &str) -> BodyKind {
    if grpc::is_grpc_type(ct) {
        BodyKind::Grpc
    } else if let Some(rest) = ct.strip_prefix("application/grpc-web-text") {
        if web_suffix(rest) {
            BodyKind::GrpcWeb { text: true }
        } else {
            BodyKind::Opaque
        }
    } else if let Some(rest) = ct.strip_prefix("application/grpc-web") {
        if web_suffix(rest) {
            BodyKind::GrpcWeb { text: false }
        } else {
            BodyKind::Opaque
        }
    } else {
        BodyKind::Opaque
    }
}

fn web_suffix(rest: &str) -> bool {
    rest.is_empty() || rest.starts_with(['+', ';'])
}

/// The kind of a response to a request of kind `request`, by the
/// response's `content-type`: framing is only trusted where both sides agree.
pub fn response_kind_of(request: BodyKind, ct: &str) -> BodyKind {
    match request {
        BodyKind::Grpc if grpc::is_grpc_type(ct) => BodyKind::Grpc,
        BodyKind::GrpcWeb { .. } => match request_kind_of(ct) {
            k @ BodyKind::GrpcWeb { .. } => k,
            _ => BodyKind::Opaque,
        },
        _ if ct
            .split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream")) =>
        {
            BodyKind::Sse
        }
        _ => BodyKind::Opaque,
    }
}

/// Follows event boundaries of an SSE body: an event ends with a blank line;
/// lines end with CRLF, LF or CR.
#[derive(Clone, Copy, Debug, Default)]
struct Sse {
    /// Bytes on the current line so far.
    line_len: usize,
    /// A CR ended the last line; an LF right after belongs to it.
    pending_cr: bool,
    /// Lines with content since the last event ended.
    lines: usize,
    /// Something was consumed since the stream began.
    started: bool,
}

impl Sse {
    /// Returns the events completed in `data`.
    fn consume(&mut self, data: &[u8]) -> u64 {
        let mut events = 0;
        for &b in data {
            self.started = true;
            if std::mem::take(&mut self.pending_cr) && b == b'\n' {
                continue;
            }
            if b == b'\r' || b == b'\n' {
                if self.line_len == 0 {
                    if self.lines > 0 {
                        events += 1;
                    }
                    self.lines = 0;
                } else {
                    self.lines += 1;
                }
                self.line_len = 0;
                self.pending_cr = b == b'\r';
            } else {
                self.line_len += 1;
            }
        }
        events
    }

    /// Right after a blank line (or before anything): no event is half-sent.
    fn at_boundary(&self) -> bool {
        self.line_len == 0 && self.lines == 0
    }
}

/// Follows one response body's boundaries.
#[derive(Clone, Debug)]
pub struct Boundaries {
    kind: BodyKind,
    /// gRPC and gRPC-Web message framing (on decoded bytes for -text).
    framer: Framer,
    /// gRPC-Web-text: base64 characters not yet forming a whole quad.
    pending: Vec<u8>,
    /// SSE event framing.
    sse: Sse,
}

impl Boundaries {
    pub fn new(kind: BodyKind) -> Self {
        Self {
            kind,
            framer: Framer::default(),
            pending: Vec::new(),
            sse: Sse::default(),
        }
    }

    /// Whether the guard can end this body in-protocol.
    pub fn endable(&self) -> bool {
        self.kind != BodyKind::Opaque
    }

    /// Accounts for `chunk` and returns the messages or events it completed.
    pub fn consume(&mut self, chunk: &[u8]) -> u64 {
        match self.kind {
            BodyKind::Grpc | BodyKind::GrpcWeb { text: false } => {
                self.framer.consume_messages(chunk)
            }
            BodyKind::GrpcWeb { text: true } => {
                let mut done = 0;
                for &c in chunk.iter().filter(|c| !c.is_ascii_whitespace()) {
                    self.pending.push(c);
                    if self.pending.len() == 4 {
                        // A malformed quad cannot be followed: treat it as
                        // opaque bytes of a message, so no end lands there.
                        let decoded = base64::engine::general_purpose::STANDARD
                            .decode(&self.pending)
                            .unwrap_or_else(|_| vec![0xff; 3]);
                        done += self.framer.consume_messages(&decoded);
                        self.pending.clear();
                    }
                }
                done
            }
            BodyKind::Sse => self.sse.consume(chunk),
            BodyKind::Opaque => 0,
        }
    }

    /// How many bytes of `chunk`, from here, end at the last boundary
    /// inside it (0: none does): what of it is whole messages or events.
    pub fn whole_prefix(&self, chunk: &[u8]) -> usize {
        if let BodyKind::Grpc | BodyKind::GrpcWeb { text: false } = self.kind {
            let mut f = self.framer;
            let mut at = 0;
            while let Some(n) = f.bytes_to_boundary(&chunk[at..]) {
                f.consume(&chunk[at..at + n]);
                at += n;
            }
            return at;
        }
        let mut b = self.clone();
        let mut whole = 0;
        for (i, byte) in chunk.iter().enumerate() {
            b.consume(std::slice::from_ref(byte));
            if b.at_boundary() {
                whole = i + 1;
            }
        }
        whole
    }

    /// Between two messages or events: ending here cuts nothing.
    pub fn at_boundary(&self) -> bool {
        match self.kind {
            BodyKind::Grpc | BodyKind::GrpcWeb { text: false } => self.framer.at_boundary(),
            BodyKind::GrpcWeb { text: true } => {
                self.framer.at_boundary() && self.pending.is_empty()
            }
            BodyKind::Sse => self.sse.at_boundary(),
            BodyKind::Opaque => false,
        }
    }

    /// How the guard ends this body for `message`: trailers (gRPC), or a
    /// last chunk that ends the stream (gRPC-Web's trailer frame; nothing
    /// for SSE). None for opaque bodies.
    pub fn ending(&self, message: &'static str) -> Option<End> {
        match self.kind {
            BodyKind::Grpc => Some(End::Trailers(grpc::unavailable_trailers(message))),
            BodyKind::GrpcWeb { text } => Some(End::Last(web_trailer_frame(message, text))),
            BodyKind::Sse => Some(End::Last(Bytes::new())),
            BodyKind::Opaque => None,
        }
    }
}

/// The guard's last words on a stream.
#[derive(Debug)]
pub enum End {
    /// HTTP/2 trailers (END_STREAM).
    Trailers(HeaderMap),
    /// A last DATA frame with END_STREAM.
    Last(Bytes),
}

/// gRPC-Web's trailer frame: flag 0x80, length, then the trailers as an
/// HTTP/1-style header block; base64 for the -text flavour.
pub fn web_trailer_frame(message: &str, text: bool) -> Bytes {
    let block = format!(
        "grpc-status:{}\r\ngrpc-message:{}\r\n",
        grpc::STATUS_UNAVAILABLE,
        message
    );
    let mut frame = BytesMut::with_capacity(5 + block.len());
    frame.put_u8(0x80);
    frame.put_u32(u32::try_from(block.len()).unwrap_or(u32::MAX));
    frame.put_slice(block.as_bytes());
    if text {
        Bytes::from(base64::engine::general_purpose::STANDARD.encode(&frame))
    } else {
        frame.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(ct: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
        h
    }

    #[test]
    fn kinds_follow_the_content_types() {
        assert_eq!(request_kind(&headers("application/grpc")), BodyKind::Grpc);
        assert_eq!(
            request_kind(&headers("application/grpc-web+proto")),
            BodyKind::GrpcWeb { text: false }
        );
        assert_eq!(
            request_kind(&headers("application/grpc-web-text")),
            BodyKind::GrpcWeb { text: true }
        );
        assert_eq!(
            request_kind(&headers("application/grpc-webby")),
            BodyKind::Opaque
        );
        assert_eq!(
            response_kind_of(BodyKind::Opaque, "text/event-stream; charset=utf-8"),
            BodyKind::Sse
        );
        assert_eq!(
            response_kind_of(BodyKind::Grpc, "text/plain"),
            BodyKind::Opaque,
            "a gRPC request answered with something else is not framed"
        );
    }

    #[test]
    fn sse_boundaries_are_blank_lines_with_any_line_ending() {
        let mut b = Boundaries::new(BodyKind::Sse);
        assert!(b.at_boundary(), "nothing sent yet");
        assert_eq!(b.consume(b"data: one\n"), 0);
        assert!(!b.at_boundary(), "an event without its blank line");
        assert_eq!(b.consume(b"\n"), 1);
        assert!(b.at_boundary());
        assert_eq!(b.consume(b"id: 2\r\ndata: two\r\n\r\ndata: thr"), 1);
        assert!(!b.at_boundary(), "mid-line");
        assert_eq!(b.consume(b"ee\r\r: comment\n\n"), 2);
        assert!(b.at_boundary());
        assert_eq!(b.consume(b"\n\n"), 0, "blank lines alone are no events");
        assert!(b.at_boundary());
    }

    #[test]
    fn grpc_web_text_is_followed_through_base64() {
        let mut frame = vec![0u8, 0, 0, 0, 3];
        frame.extend_from_slice(b"abc");
        let text = base64::engine::general_purpose::STANDARD.encode(&frame);
        let mut b = Boundaries::new(BodyKind::GrpcWeb { text: true });
        let (head, tail) = text.as_bytes().split_at(5);
        assert_eq!(b.consume(head), 0);
        assert!(!b.at_boundary(), "a quad half-received");
        assert_eq!(b.consume(tail), 1);
        assert!(b.at_boundary());
        let end = web_trailer_frame("bye", true);
        let raw = base64::engine::general_purpose::STANDARD
            .decode(&end)
            .expect("base64");
        assert_eq!(raw[0], 0x80);
        assert!(String::from_utf8_lossy(&raw[5..]).contains("grpc-status:14\r\n"));
    }
}
