//! The guard's gRPC message framer on arbitrary bodies cut into arbitrary
//! chunks. Invariants: chunking never changes where the message boundaries
//! are, `bytes_to_boundary` finds exactly the next one, and both agree with
//! a plain reading of the length-prefixed framing.
#![no_main]

use arbitrary::Arbitrary;
use drainshim::guard::Framer;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    /// The body, one direction of a stream.
    body: Vec<u8>,
    /// Chunk sizes to cut it into (0 means an empty DATA frame); the rest goes last.
    cuts: Vec<u8>,
}

/// Offsets just after each complete message, read straight from the framing.
fn reference_boundaries(body: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while let Some(prefix) = body.get(at..at + 5) {
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        let end = at + 5 + len;
        if end > body.len() {
            break;
        }
        out.push(end);
        at = end;
    }
    out
}

fuzz_target!(|input: Input| {
    let body = &input.body;
    let expected = reference_boundaries(body);

    // Chunk by chunk, finding boundaries inside each chunk with bytes_to_boundary.
    let mut f = Framer::default();
    let mut found = Vec::new();
    let mut offset = 0usize;
    let mut chunks: Vec<&[u8]> = Vec::new();
    let mut rest = &body[..];
    for &c in &input.cuts {
        let n = usize::from(c).min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        chunks.push(chunk);
        rest = tail;
    }
    chunks.push(rest);
    for chunk in chunks {
        let mut pos = 0;
        while pos < chunk.len() {
            let before = f;
            match f.bytes_to_boundary(&chunk[pos..]) {
                Some(n) => {
                    assert_eq!(f, before, "bytes_to_boundary moved the framer");
                    assert!(n >= 1 && n <= chunk.len() - pos);
                    // Byte by byte (another chunking), the boundary is there and
                    // nowhere earlier.
                    let mut g = f;
                    for (k, b) in chunk[pos..pos + n].iter().enumerate() {
                        g.consume(std::slice::from_ref(b));
                        assert_eq!(g.at_boundary(), k + 1 == n, "boundary misplaced");
                    }
                    f.consume(&chunk[pos..pos + n]);
                    assert_eq!(f, g);
                    pos += n;
                    found.push(offset + pos);
                }
                None => {
                    f.consume(&chunk[pos..]);
                    pos = chunk.len();
                    assert!(!f.at_boundary());
                }
            }
        }
        offset += chunk.len();
    }
    assert_eq!(found, expected, "chunking changed the boundaries");

    // The whole body in one go ends in the same state as chunk by chunk.
    let mut whole = Framer::default();
    whole.consume(body);
    assert_eq!(whole, f);
    assert_eq!(
        whole.at_boundary(),
        expected.last().copied().unwrap_or(0) == body.len()
    );
});
