//! The guard's HTTP/2 frame relay (`src/guard/relay/`) fed frames from
//! both peers. Invariant: the relay never panics, whatever either peer
//! sends, and holds no more than its bounds (asserted inside `feed`).
//!
//! Arbitrary bytes alone seldom make a frame the relay acts on, least of
//! all from the application, whose bytes are only read once its SETTINGS
//! came. So the input is mostly *structured frames* from either side, built
//! here with valid framing (length, padding, priority fields), and written
//! in reads of their own, batched with the previous read, split over two
//! reads, or repeated; now and then a read of raw bytes. Every frame type
//! comes up: DATA (gRPC messages, SSE events, window-filling zeros, raw),
//! HEADERS (with PRIORITY fields, padding, split over CONTINUATIONs),
//! PRIORITY, RST_STREAM, SETTINGS (any list of any parameters),
//! PUSH_PROMISE, PING (any length; the acks the relay waits for: its
//! barrier and its GOAWAY probe), GOAWAY (any last stream, any code),
//! WINDOW_UPDATE (0, small, 2^31-1, raw), CONTINUATION, a known type with
//! any payload, and unknown types. Stream ids are mostly small (0..16,
//! where both peers' streams meet), sometimes 2^31-1 or raw.
//!
//! Header blocks are mostly valid HPACK: the heads a gRPC call is made of
//! (a request POST /x.Y/Z application/grpc, a response 200
//! application/grpc, trailers grpc-status 0) and a few others (gRPC-Web,
//! GET, a WebSocket's extended CONNECT, SSE, 100, 404, trailers-only), each
//! field as the fuzzer picks: an indexed static entry, a literal with or
//! without indexing, never indexed, a dynamic table entry (that may not
//! exist), after a table size update. Strings are never Huffman-coded here
//! (raw blocks cover that decoder). So streams open, get answered and end
//! (or are reset or refused), and the relay's stream table, the
//! application's GOAWAY, the client's connection window (`clear_gate`,
//! `split_data`) and the refusal of a PUSH_PROMISE are reached.
//!
//! Two steps are not frames: a drain (every stream of the connection is
//! asked to end, so the guard's own graceful ends and its SETTINGS barrier
//! to the application are reached, and the application's SETTINGS acks pair
//! with them) and a wait (the relay's clock moves on, so quiet moments,
//! the barrier's bound, `end_timeout` and the GOAWAY timers fire; the
//! runtime's clock itself stands still).
//!
//! Each run starts with a well-formed client preface and both (empty)
//! SETTINGS frames, or with the preface alone, or with nothing; or with the
//! client's preface and SETTINGS to a relay that has no application and
//! serves the client alone (as when the application cannot be reached or
//! does not speak HTTP/2). The seeds
//! (fuzz/seeds/frame_relay/: a unary call, the application's GOAWAY, the
//! connection window run dry, a push, SSE, a WebSocket, the client's errors
//! the guard answers itself, a WebSocket past its window) are written by
//! fuzz/seeds/frame_relay.py, which encodes `Input` as `arbitrary` reads
//! it: change both together.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use drainshim::guard::{FeedStep, Guard, GuardConfig};
use drainshim::metrics::Metrics;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    prelude: Prelude,
    steps: Vec<Step>,
}

/// What is sent before the fuzzer's steps.
#[derive(Debug, Arbitrary)]
enum Prelude {
    /// Past the handshake: the client's preface and both SETTINGS.
    Handshake,
    /// The client's preface; the SETTINGS are the fuzzer's.
    Preface,
    /// Nothing: the fuzzer's bytes are the first.
    Nothing,
    /// The client's preface and SETTINGS to a relay with no application
    /// (the guard is the client's server); the application's reads are
    /// dropped.
    Alone,
}

/// One step of the conversation.
#[derive(Debug)]
enum Step {
    /// A frame in a read of its own.
    Frame(Frame),
    /// A frame added to the previous read if that came from the same side
    /// (the relay handles the whole batch at once), else a read of its own.
    Batched(Frame),
    /// A frame over two reads: its first `at % (len + 1)` bytes, then the
    /// rest.
    Split(Frame, u16),
    /// A frame `2 + n % 15` times in one read: DATA that runs a window dry,
    /// a burst of PINGs or RST_STREAMs.
    Repeat(Frame, u8),
    /// A read of raw bytes from the client (true) or the application.
    Raw(bool, Vec<u8>),
    /// A drain asks every stream of the connection to end: the guard's own
    /// graceful ends, and its SETTINGS barrier to the application.
    Drain,
    /// The clock moves on `n` ms (a stream's quiet moment, the barrier's
    /// wait, `end_timeout`, the GOAWAY timers).
    Wait(u16),
}

impl<'a> Arbitrary<'a> for Step {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        // Mostly whole frames; raw bytes one step in ten.
        Ok(match u8::arbitrary(u)? {
            0..=139 => Step::Frame(u.arbitrary()?),
            140..=184 => Step::Batched(u.arbitrary()?),
            185..=209 => Step::Split(u.arbitrary()?, u.arbitrary()?),
            210..=229 => Step::Repeat(u.arbitrary()?, u.arbitrary()?),
            230..=239 => Step::Drain,
            240..=244 => Step::Wait(u.arbitrary()?),
            _ => Step::Raw(u.arbitrary()?, u.arbitrary()?),
        })
    }
}

#[derive(Debug, Arbitrary)]
struct Frame {
    /// Sent by the client (true) or the application.
    from_client: bool,
    /// The frame's flags. PADDED and PRIORITY follow the frame's own
    /// fields; the acks of the relay's own PINGs always have ACK.
    flags: u8,
    /// The stream. SETTINGS, PING and GOAWAY go on stream 0 unless the id
    /// is a raw one.
    stream: StreamId,
    kind: Kind,
}

#[derive(Debug, Arbitrary)]
enum Kind {
    Data {
        body: Body,
        padding: Option<u8>,
    },
    Headers {
        block: Block,
        padding: Option<u8>,
        priority: Option<[u8; 5]>,
        /// Usually none; one time in four the block is split over 1 to 3
        /// CONTINUATION frames (END_HEADERS, if the flags have it, moves to
        /// the last).
        continuations: u8,
    },
    Priority([u8; 5]),
    RstStream(u32),
    Settings(Vec<(Setting, Value)>),
    PushPromise {
        promised: StreamId,
        block: Block,
        padding: Option<u8>,
    },
    Ping(Ping),
    Goaway {
        last: StreamId,
        code: u32,
        debug: Vec<u8>,
    },
    WindowUpdate {
        /// On the connection (stream 0, unless the id is a raw one), or on
        /// the frame's stream.
        connection: bool,
        increment: Increment,
    },
    Continuation(Block),
    /// A known frame type (`kind % 10`) with any payload: a short GOAWAY,
    /// a 3-byte RST_STREAM, an uneven SETTINGS...
    Malformed {
        kind: u8,
        payload: Vec<u8>,
    },
    /// An extension frame type (0x0a..=0xff): passed on, never read.
    Unknown {
        kind: u8,
        payload: Vec<u8>,
    },
}

/// A stream id: mostly 0..16, where both peers' streams meet.
#[derive(Debug, Clone, Copy)]
enum StreamId {
    Small(u8),
    /// 2^31-1: the "every stream" of a first GOAWAY.
    Max,
    /// Any 32 bits (the reserved bit too).
    Raw(u32),
}

impl<'a> Arbitrary<'a> for StreamId {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match u8::arbitrary(u)? {
            s @ 0..=223 => StreamId::Small(s % 16),
            224..=239 => StreamId::Max,
            _ => StreamId::Raw(u.arbitrary()?),
        })
    }
}

impl StreamId {
    fn get(self) -> u32 {
        match self {
            StreamId::Small(id) => u32::from(id),
            StreamId::Max => (1 << 31) - 1,
            StreamId::Raw(id) => id,
        }
    }

    /// For a connection-level frame: 0 unless raw.
    fn connection(self) -> u32 {
        match self {
            StreamId::Raw(id) => id,
            _ => 0,
        }
    }
}

/// A DATA frame's data.
#[derive(Debug, Arbitrary)]
enum Body {
    /// gRPC messages, each whole behind its 5-byte prefix (a message cut
    /// across frames comes from `Raw`).
    Grpc(Vec<Vec<u8>>),
    /// Server-sent events, each `data: ...` and a blank line.
    Sse(Vec<Vec<u8>>),
    /// That many zero bytes: fills windows (the default connection window
    /// is 65,535; a frame over 16,384 needs a larger MAX_FRAME_SIZE).
    Zeros(u16),
    Raw(Vec<u8>),
}

#[derive(Debug, Arbitrary)]
enum Ping {
    /// Any 8 bytes.
    Opaque([u8; 8]),
    /// An ack with the data the relay's PING barrier once used (`dsb\0`
    /// and a number): the app's or the client's, never the guard's own now.
    BarrierAck(u32),
    /// The ack of the relay's GOAWAY probe to the client.
    ProbeAck,
    /// Any length (8 is the only right one).
    Any(Vec<u8>),
}

#[derive(Debug, Arbitrary)]
enum Increment {
    /// A protocol error on the connection, ignored on a stream.
    Zero,
    Small(u16),
    /// The largest (2^31-1): overflows a window with anything in it.
    Max,
    /// Any 32 bits (the reserved bit too).
    Raw(u32),
}

#[derive(Debug, Arbitrary)]
enum Setting {
    HeaderTableSize,
    EnablePush,
    MaxConcurrentStreams,
    InitialWindowSize,
    MaxFrameSize,
    MaxHeaderListSize,
    EnableConnectProtocol,
    Other(u16),
}

impl Setting {
    fn id(&self) -> u16 {
        match self {
            Setting::HeaderTableSize => 0x1,
            Setting::EnablePush => 0x2,
            Setting::MaxConcurrentStreams => 0x3,
            Setting::InitialWindowSize => 0x4,
            Setting::MaxFrameSize => 0x5,
            Setting::MaxHeaderListSize => 0x6,
            Setting::EnableConnectProtocol => 0x8,
            Setting::Other(id) => *id,
        }
    }
}

/// A SETTINGS value: small, at an edge of some parameter's range, or any.
#[derive(Debug, Arbitrary)]
enum Value {
    Small(u8),
    Edge(u8),
    Raw(u32),
}

impl Value {
    fn get(&self) -> u32 {
        const EDGES: &[u32] = &[
            0,
            1,
            4_096,
            16_383,
            16_384,
            16_385,
            65_535,
            65_536,
            1 << 20,
            (1 << 20) + 1,
            (1 << 24) - 1,
            1 << 24,
            (1 << 31) - 1,
            1 << 31,
            u32::MAX,
        ];
        match self {
            Value::Small(v) => u32::from(*v),
            Value::Edge(i) => EDGES[usize::from(*i) % EDGES.len()],
            Value::Raw(v) => *v,
        }
    }
}

/// A header block.
#[derive(Debug)]
enum Block {
    /// A common head, its fields encoded as `reprs` says (in order; fields
    /// past its end are `Repr::Static`).
    Head(Head, Vec<Repr>),
    /// Fields picked from `FIELDS`.
    Fields(Vec<(u8, Repr)>),
    /// Any bytes (rarely valid HPACK).
    Raw(Vec<u8>),
}

impl<'a> Arbitrary<'a> for Block {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match u8::arbitrary(u)? {
            0..=191 => Block::Head(u.arbitrary()?, u.arbitrary()?),
            192..=231 => Block::Fields(u.arbitrary()?),
            _ => Block::Raw(u.arbitrary()?),
        })
    }
}

#[derive(Debug, Arbitrary, Clone, Copy)]
enum Head {
    GrpcRequest,
    GrpcWebRequest,
    GetRequest,
    WebSocket,
    GrpcResponse,
    SseResponse,
    Continue,
    NotFound,
    Trailers,
    TrailersOnly,
}

type Fields = &'static [(&'static str, &'static str)];

impl Head {
    fn fields(self) -> Fields {
        match self {
            Head::GrpcRequest => &[
                (":method", "POST"),
                (":scheme", "http"),
                (":path", "/x.Y/Z"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
            Head::GrpcWebRequest => &[
                (":method", "POST"),
                (":scheme", "http"),
                (":path", "/x.Y/Z"),
                ("content-type", "application/grpc-web+proto"),
            ],
            Head::GetRequest => &[(":method", "GET"), (":scheme", "http"), (":path", "/")],
            Head::WebSocket => &[
                (":method", "CONNECT"),
                (":protocol", "websocket"),
                (":scheme", "http"),
                (":path", "/ws"),
                (":authority", "app"),
            ],
            Head::GrpcResponse => &[(":status", "200"), ("content-type", "application/grpc")],
            Head::SseResponse => &[(":status", "200"), ("content-type", "text/event-stream")],
            Head::Continue => &[(":status", "100")],
            Head::NotFound => &[(":status", "404")],
            Head::Trailers => &[("grpc-status", "0"), ("grpc-message", "done")],
            Head::TrailersOnly => &[
                (":status", "200"),
                ("content-type", "application/grpc"),
                ("grpc-status", "14"),
            ],
        }
    }
}

/// The fields `Block::Fields` picks from.
const FIELDS: Fields = &[
    (":method", "POST"),
    (":method", "GET"),
    (":method", "CONNECT"),
    (":scheme", "http"),
    (":path", "/x.Y/Z"),
    (":path", "/"),
    (":protocol", "websocket"),
    (":authority", "app"),
    (":status", "200"),
    (":status", "100"),
    (":status", "404"),
    ("content-type", "application/grpc"),
    ("content-type", "application/grpc-web-text"),
    ("content-type", "text/event-stream"),
    ("te", "trailers"),
    ("grpc-status", "0"),
    ("grpc-status", "14"),
    ("x-fuzz", "1"),
];

/// How one field is encoded (RFC 7541 §6).
#[derive(Debug, Arbitrary, Clone, Copy)]
enum Repr {
    /// The static table's entry for the field if it has one, else a
    /// literal without indexing naming the static entry for the name (or
    /// with the name as a string).
    Static,
    /// A literal with incremental indexing: it adds a dynamic entry.
    Indexing,
    /// A literal without indexing, the name as a string.
    Literal,
    /// A literal never indexed.
    NeverIndexed,
    /// Instead of the field: dynamic table entry `n % 8` (62 onwards),
    /// which may not exist.
    Dynamic(u8),
    /// A dynamic table size update, then the field as `Static`.
    Resize(u16),
}

/// RFC 7541 Appendix A: the entries the fields above can use.
const STATIC: &[(u8, &str, &str)] = &[
    (1, ":authority", ""),
    (2, ":method", "GET"),
    (3, ":method", "POST"),
    (4, ":path", "/"),
    (6, ":scheme", "http"),
    (8, ":status", "200"),
    (13, ":status", "404"),
    (31, "content-type", ""),
];

fn encode_block(block: &Block, out: &mut Vec<u8>) {
    match block {
        Block::Head(head, reprs) => {
            for (i, field) in head.fields().iter().enumerate() {
                let repr = reprs.get(i).copied().unwrap_or(Repr::Static);
                encode_field(*field, repr, out);
            }
        }
        Block::Fields(fields) => {
            for &(i, repr) in fields {
                encode_field(FIELDS[usize::from(i) % FIELDS.len()], repr, out);
            }
        }
        Block::Raw(bytes) => out.extend_from_slice(bytes),
    }
}

fn encode_field((name, value): (&str, &str), repr: Repr, out: &mut Vec<u8>) {
    let pair = STATIC.iter().find(|e| e.1 == name && e.2 == value);
    let name_index = STATIC.iter().find(|e| e.1 == name).map_or(0, |e| e.0);
    match repr {
        Repr::Static | Repr::Resize(_) => {
            if let Repr::Resize(size) = repr {
                hpack_int(out, 0x20, 5, u32::from(size));
            }
            match pair {
                Some(e) => hpack_int(out, 0x80, 7, u32::from(e.0)),
                None => literal(out, 0x00, 4, name_index, name, value),
            }
        }
        Repr::Indexing => literal(out, 0x40, 6, name_index, name, value),
        Repr::Literal => literal(out, 0x00, 4, 0, name, value),
        Repr::NeverIndexed => literal(out, 0x10, 4, name_index, name, value),
        Repr::Dynamic(n) => hpack_int(out, 0x80, 7, 62 + u32::from(n % 8)),
    }
}

/// A literal field: the name by its static index, or as a string (index
/// 0), then the value; strings without Huffman coding.
fn literal(out: &mut Vec<u8>, mask: u8, prefix: u8, index: u8, name: &str, value: &str) {
    hpack_int(out, mask, prefix, u32::from(index));
    if index == 0 {
        hpack_string(out, name);
    }
    hpack_string(out, value);
}

fn hpack_string(out: &mut Vec<u8>, s: &str) {
    hpack_int(out, 0x00, 7, s.len() as u32);
    out.extend_from_slice(s.as_bytes());
}

/// An integer with an `n`-bit prefix (RFC 7541 §5.1).
fn hpack_int(out: &mut Vec<u8>, mask: u8, n: u8, v: u32) {
    let max = (1u32 << n) - 1;
    if v < max {
        out.push(mask | v as u8);
        return;
    }
    out.push(mask | max as u8);
    let mut v = v - max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

// Frame types and flags (RFC 9113 §6).
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY_FLAG: u8 = 0x20;

/// Appends one frame; the length is the payload's (mod 2^24).
fn put(out: &mut Vec<u8>, kind: u8, flags: u8, id: u32, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(payload);
}

/// `content` with PADDED's pad length in front and the padding behind.
fn padded(flags: u8, padding: Option<u8>, content: &mut Vec<u8>) -> u8 {
    match padding {
        Some(pad) => {
            content.insert(0, pad);
            content.resize(content.len() + usize::from(pad), 0);
            flags | PADDED
        }
        None => flags & !PADDED,
    }
}

impl Frame {
    /// The frame's bytes (a HEADERS with its CONTINUATIONs: several frames).
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let id = self.stream.get();
        let flags = self.flags;
        let mut p = Vec::new();
        match &self.kind {
            Kind::Data { body, padding } => {
                match body {
                    Body::Grpc(messages) => {
                        for m in messages {
                            p.push(0);
                            p.extend_from_slice(&(m.len() as u32).to_be_bytes());
                            p.extend_from_slice(m);
                        }
                    }
                    Body::Sse(events) => {
                        for e in events {
                            p.extend_from_slice(b"data: ");
                            p.extend_from_slice(e);
                            p.extend_from_slice(b"\n\n");
                        }
                    }
                    Body::Zeros(n) => p.resize(usize::from(*n), 0),
                    Body::Raw(bytes) => p.extend_from_slice(bytes),
                }
                let flags = padded(flags, *padding, &mut p);
                put(&mut out, DATA, flags, id, &p);
            }
            Kind::Headers {
                block,
                padding,
                priority,
                continuations,
            } => {
                let mut encoded = Vec::new();
                encode_block(block, &mut encoded);
                let pieces = match continuations {
                    0..=191 => 1,
                    c => 2 + usize::from(c % 3),
                };
                let first = encoded.len() / pieces;
                let rest = encoded.split_off(first);
                let mut flags = flags & !PRIORITY_FLAG;
                if let Some(fields) = priority {
                    p.extend_from_slice(fields);
                    flags |= PRIORITY_FLAG;
                }
                p.extend_from_slice(&encoded);
                let mut flags = padded(flags, *padding, &mut p);
                if pieces > 1 {
                    flags &= !END_HEADERS;
                }
                put(&mut out, HEADERS, flags, id, &p);
                let n = pieces - 1;
                for i in 0..n {
                    let piece = &rest[rest.len() * i / n..rest.len() * (i + 1) / n];
                    let last = i + 1 == n;
                    put(
                        &mut out,
                        CONTINUATION,
                        if last { self.flags & END_HEADERS } else { 0 },
                        id,
                        piece,
                    );
                }
            }
            Kind::Priority(fields) => put(&mut out, PRIORITY, flags, id, fields),
            Kind::RstStream(code) => put(&mut out, RST_STREAM, flags, id, &code.to_be_bytes()),
            Kind::Settings(settings) => {
                for (setting, value) in settings {
                    p.extend_from_slice(&setting.id().to_be_bytes());
                    p.extend_from_slice(&value.get().to_be_bytes());
                }
                put(&mut out, SETTINGS, flags, self.stream.connection(), &p);
            }
            Kind::PushPromise {
                promised,
                block,
                padding,
            } => {
                p.extend_from_slice(&promised.get().to_be_bytes());
                encode_block(block, &mut p);
                let flags = padded(flags, *padding, &mut p);
                put(&mut out, PUSH_PROMISE, flags, id, &p);
            }
            Kind::Ping(ping) => {
                let (flags, opaque) = match ping {
                    Ping::Opaque(o) => (flags, o.to_vec()),
                    Ping::BarrierAck(seq) => {
                        let mut o = b"dsb\0".to_vec();
                        o.extend_from_slice(&seq.to_be_bytes());
                        (flags | ACK, o)
                    }
                    Ping::ProbeAck => (flags | ACK, b"dsgoaway".to_vec()),
                    Ping::Any(bytes) => (flags, bytes.clone()),
                };
                put(&mut out, PING, flags, self.stream.connection(), &opaque);
            }
            Kind::Goaway { last, code, debug } => {
                p.extend_from_slice(&last.get().to_be_bytes());
                p.extend_from_slice(&code.to_be_bytes());
                p.extend_from_slice(debug);
                put(&mut out, GOAWAY, flags, self.stream.connection(), &p);
            }
            Kind::WindowUpdate {
                connection,
                increment,
            } => {
                let n: u32 = match increment {
                    Increment::Zero => 0,
                    Increment::Small(n) => u32::from(*n),
                    Increment::Max => (1 << 31) - 1,
                    Increment::Raw(n) => *n,
                };
                let id = if *connection {
                    self.stream.connection()
                } else {
                    id
                };
                put(&mut out, WINDOW_UPDATE, flags, id, &n.to_be_bytes());
            }
            Kind::Continuation(block) => {
                encode_block(block, &mut p);
                put(&mut out, CONTINUATION, flags, id, &p);
            }
            Kind::Malformed { kind, payload } => put(&mut out, kind % 10, flags, id, payload),
            Kind::Unknown { kind, payload } => {
                put(&mut out, 0x0a + kind % 0xf6, flags, id, payload)
            }
        }
        out
    }
}

/// One step of the relay's input, owned.
enum Read {
    Bytes(bool, Vec<u8>),
    Drain,
    Wait(u16),
}

/// The steps the relay gets: reads from the client (true) or the
/// application, drains, and the clock moving on.
fn reads(input: &Input) -> Vec<Read> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    // An empty SETTINGS frame from each side.
    const SETTINGS_FRAME: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];
    let mut reads: Vec<Read> = Vec::new();
    match input.prelude {
        Prelude::Handshake => {
            reads.push(Read::Bytes(true, PREFACE.to_vec()));
            reads.push(Read::Bytes(true, SETTINGS_FRAME.to_vec()));
            reads.push(Read::Bytes(false, SETTINGS_FRAME.to_vec()));
        }
        Prelude::Preface => reads.push(Read::Bytes(true, PREFACE.to_vec())),
        Prelude::Alone => {
            reads.push(Read::Bytes(true, PREFACE.to_vec()));
            reads.push(Read::Bytes(true, SETTINGS_FRAME.to_vec()));
        }
        Prelude::Nothing => {}
    }
    for step in &input.steps {
        match step {
            Step::Frame(f) => reads.push(Read::Bytes(f.from_client, f.encode())),
            Step::Batched(f) => match reads.last_mut() {
                Some(Read::Bytes(side, bytes)) if *side == f.from_client => {
                    bytes.extend_from_slice(&f.encode())
                }
                _ => reads.push(Read::Bytes(f.from_client, f.encode())),
            },
            Step::Split(f, at) => {
                let mut first = f.encode();
                let second = first.split_off(usize::from(*at) % (first.len() + 1));
                reads.push(Read::Bytes(f.from_client, first));
                reads.push(Read::Bytes(f.from_client, second));
            }
            Step::Repeat(f, n) => {
                let frame = f.encode();
                reads.push(Read::Bytes(
                    f.from_client,
                    frame.repeat(2 + usize::from(n % 15)),
                ));
            }
            Step::Raw(side, bytes) => reads.push(Read::Bytes(*side, bytes.clone())),
            Step::Drain => reads.push(Read::Drain),
            Step::Wait(ms) => reads.push(Read::Wait(*ms)),
        }
    }
    reads
}

fn guard() -> &'static (tokio::runtime::Runtime, Guard) {
    static GUARD: OnceLock<(tokio::runtime::Runtime, Guard)> = OnceLock::new();
    GUARD.get_or_init(|| {
        // Paused time: every run sees one instant (deterministic), and the
        // tasks a run leaves (a spread of endings after the application's
        // GOAWAY, a WebSocket's task) finish when it is advanced below.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        let metrics = Metrics::register(&mut prometheus_client::registry::Registry::default());
        // A WebSocket's task dials the application here, and is refused.
        let config = GuardConfig::new(([127, 0, 0, 1], 9).into());
        (rt, Guard::new(config, metrics))
    })
}

fuzz_target!(|input: Input| {
    let (rt, guard) = guard();
    let reads = reads(&input);
    let steps: Vec<FeedStep<'_>> = reads
        .iter()
        .map(|r| match r {
            Read::Bytes(c, b) => FeedStep::Read(*c, b.as_slice()),
            Read::Drain => FeedStep::EndAll,
            Read::Wait(ms) => FeedStep::Wait(Duration::from_millis(u64::from(*ms))),
        })
        .collect();
    rt.block_on(async {
        guard.fuzz_frame_relay(&steps, matches!(input.prelude, Prelude::Alone));
        // The relay is gone: what it spawned runs out (the guard's spreads
        // and connect timeouts are seconds), so nothing piles up run after run.
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
});
