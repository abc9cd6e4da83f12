//! gRPC over HTTP/2, as far as the guard needs it: recognising gRPC
//! requests, following the length-prefixed message framing of a response
//! body (so a stream is only ever ended between two messages), and the
//! `grpc-status: 14` endings the guard sends.

use http::header::{HeaderMap, HeaderValue};

use crate::metrics::Reason;

/// `grpc-status` for UNAVAILABLE: clients treat it as "retry elsewhere".
pub const STATUS_UNAVAILABLE: &str = "14";

/// Bytes in a gRPC message prefix: 1 compressed flag + 4 length bytes (big endian).
const PREFIX_LEN: u8 = 5;

/// Why a stream was ended, as the client reads it in `grpc-message`.
pub fn end_message(reason: Reason) -> &'static str {
    match reason {
        Reason::drain => {
            "drainshim: the server is draining; the stream was ended gracefully, reconnect to continue"
        }
        Reason::max_age => {
            "drainshim: max connection age reached; the stream was ended gracefully, reconnect to continue"
        }
        Reason::app_shutdown => {
            "drainshim: the server is shutting down; the stream was ended gracefully, reconnect to continue"
        }
        Reason::config_push => {
            "drainshim: the proxy's listener is being replaced after a config update; the stream was ended gracefully, reconnect to continue"
        }
    }
}

/// Why a new stream was refused while the guard drains.
pub const REFUSED_MESSAGE: &str =
    "drainshim: the server is draining and accepts no new streams; retry on another endpoint";

/// Why a stream failed because the application could not be reached.
pub const UPSTREAM_UNAVAILABLE_MESSAGE: &str =
    "drainshim: the application is not reachable; retry later";

/// Why a stream ended because the application's connection failed mid-stream.
pub const UPSTREAM_LOST_MESSAGE: &str =
    "drainshim: the connection to the application was lost; reconnect to continue";

/// True for gRPC content types (`application/grpc[+proto|;...]`).
pub fn is_grpc_type(ct: &str) -> bool {
    ct.strip_prefix("application/grpc")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['+', ';']))
}

/// Trailers that end a stream with UNAVAILABLE and say why.
pub fn unavailable_trailers(message: &'static str) -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from_static(STATUS_UNAVAILABLE));
    // The messages are constant printable ASCII without '%', so they need no
    // percent-encoding (gRPC's rule for grpc-message).
    t.insert("grpc-message", HeaderValue::from_static(message));
    t
}

/// Follows the message framing of one direction of a gRPC body.
///
/// Each message is a 5-byte prefix (flag, u32 length) and `length` bytes. The
/// framer only counts; it never holds message bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Framer {
    /// Prefix bytes seen of the message being started (0 when between messages
    /// or inside a body).
    prefix_len: u8,
    /// The prefix bytes seen so far; the length is read once all 5 are in.
    prefix: [u8; PREFIX_LEN as usize],
    /// Body bytes still to come for the current message.
    remaining: u64,
}

impl Framer {
    /// True between two messages: ending the stream here loses no partial message.
    pub fn at_boundary(&self) -> bool {
        self.prefix_len == 0 && self.remaining == 0
    }

    /// Accounts for `data`, which follows what was consumed before.
    pub fn consume(&mut self, data: &[u8]) {
        let mut rest = data;
        while !rest.is_empty() {
            rest = &rest[self.step(rest)..];
        }
    }

    /// Accounts for `data` like [`Framer::consume`] and returns how many
    /// messages it completed.
    pub fn consume_messages(&mut self, data: &[u8]) -> u64 {
        let mut done = 0;
        let mut rest = data;
        while !rest.is_empty() {
            rest = &rest[self.step(rest)..];
            // Each step that lands on a boundary completed one message.
            if self.at_boundary() {
                done += 1;
            }
        }
        done
    }

    /// How many bytes of `data` complete the message in progress (or, at a
    /// boundary, the next message), if that message ends within `data`.
    pub fn bytes_to_boundary(&self, data: &[u8]) -> Option<usize> {
        let mut f = *self;
        let mut used = 0;
        while used < data.len() {
            used += f.step(&data[used..]);
            if f.at_boundary() {
                return Some(used);
            }
        }
        None
    }

    /// Consumes the next piece of `data` (non-empty) up to the next point
    /// where the state changes; returns the bytes used.
    fn step(&mut self, data: &[u8]) -> usize {
        if self.remaining > 0 {
            let n = usize::try_from(self.remaining).map_or(data.len(), |r| r.min(data.len()));
            self.remaining -= n as u64;
            return n;
        }
        let have = usize::from(self.prefix_len);
        let n = (usize::from(PREFIX_LEN) - have).min(data.len());
        self.prefix[have..have + n].copy_from_slice(&data[..n]);
        self.prefix_len += n as u8;
        if self.prefix_len == PREFIX_LEN {
            let [_, a, b, c, d] = self.prefix;
            self.remaining = u64::from(u32::from_be_bytes([a, b, c, d]));
            self.prefix_len = 0;
        }
        n
    }
}

/// Encodes one gRPC message frame.
#[cfg(test)]
pub fn frame(message: &[u8]) -> bytes::Bytes {
    let mut out = Vec::with_capacity(message.len() + usize::from(PREFIX_LEN));
    out.push(0);
    let len = u32::try_from(message.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    bytes::Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_counted_across_chunks() {
        let data = two_messages();
        let mut f = Framer::default();
        assert_eq!(f.consume_messages(&data[..3]), 0, "half a prefix");
        assert_eq!(
            f.consume_messages(&data[3..12]),
            1,
            "hello, then the empty one's prefix starts"
        );
        assert_eq!(
            f.consume_messages(&data[12..]),
            2,
            "the empty message and world!"
        );
        assert!(f.at_boundary());
    }

    fn two_messages() -> Vec<u8> {
        let mut v = frame(b"hello").to_vec();
        v.extend_from_slice(&frame(b""));
        v.extend_from_slice(&frame(b"world!"));
        v
    }

    #[test]
    fn boundaries_are_found_byte_by_byte() {
        let data = two_messages();
        let mut f = Framer::default();
        let mut boundaries = Vec::new();
        for (i, b) in data.iter().enumerate() {
            f.consume(std::slice::from_ref(b));
            if f.at_boundary() {
                boundaries.push(i + 1);
            }
        }
        assert_eq!(boundaries, vec![10, 15, 26]);
    }

    #[test]
    fn bytes_to_boundary_does_not_move_the_framer() {
        let data = two_messages();
        let mut f = Framer::default();
        f.consume(&data[..3]);
        assert_eq!(f.bytes_to_boundary(&data[3..]), Some(7));
        assert_eq!(f.bytes_to_boundary(&data[3..8]), None);
        f.consume(&data[3..10]);
        assert!(f.at_boundary());
        // The empty message ends right after its prefix.
        assert_eq!(f.bytes_to_boundary(&data[10..]), Some(5));
    }

    #[test]
    fn chunking_does_not_matter() {
        let data = two_messages();
        for split in 0..data.len() {
            let mut f = Framer::default();
            f.consume(&data[..split]);
            f.consume(&data[split..]);
            assert!(f.at_boundary(), "split at {split}");
        }
    }

    #[test]
    fn large_lengths_are_followed() {
        let mut f = Framer::default();
        f.consume(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(!f.at_boundary());
        f.consume(&vec![0u8; 1 << 16]);
        assert!(!f.at_boundary());
        assert_eq!(f.remaining, u64::from(u32::MAX) - (1 << 16));
    }

    #[test]
    fn grpc_content_types() {
        for (ct, grpc) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("application/grpc;charset=utf-8", true),
            ("application/grpc-web", false),
            ("application/json", false),
        ] {
            assert_eq!(is_grpc_type(ct), grpc, "{ct}");
        }
        assert!(!is_grpc_type(""));
    }

    #[test]
    fn messages_need_no_percent_encoding() {
        for m in [
            end_message(Reason::drain),
            end_message(Reason::max_age),
            end_message(Reason::app_shutdown),
            end_message(Reason::config_push),
            REFUSED_MESSAGE,
            UPSTREAM_UNAVAILABLE_MESSAGE,
            UPSTREAM_LOST_MESSAGE,
        ] {
            assert!(m.bytes().all(|b| (0x20..=0x7e).contains(&b) && b != b'%'));
            assert!(m.contains("reconnect") || m.contains("retry"));
        }
    }
}
