//! The guard's HPACK decoder (`src/guard/relay/hpack.rs`) on arbitrary blocks, one
//! connection's worth in a row, held against an independent one
//! (`loona-hpack`) fed the same blocks. Invariants: no panic whatever the
//! bytes; whatever the guard decodes, the reference decodes to the same
//! fields (so both tables stay the same); the guard refuses only what the
//! RFC or its limit makes it refuse; a block the guard encodes itself
//! (literals, never-indexed kept, size updates first) decodes to exactly its
//! fields on a table in any state valid blocks left.
#![no_main]

use arbitrary::Arbitrary;
use drainshim::guard::wire::{self, BlockError, Field, Hpack};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum Step {
    /// Bytes from the peer, as they come.
    Raw(Vec<u8>),
    /// A block the guard encodes: optional size updates, then literals.
    Own {
        updates: Vec<u16>,
        fields: Vec<(Vec<u8>, Vec<u8>, bool)>,
    },
    /// The other peer's SETTINGS_HEADER_TABLE_SIZE.
    Allow(u16),
}

#[derive(Debug, Arbitrary)]
struct Input {
    table: u16,
    limit: u16,
    steps: Vec<Step>,
}

struct Both {
    ours: Hpack,
    reference: loona_hpack::Decoder<'static>,
}

impl Both {
    fn new(table: u32, allowed: u32) -> Self {
        let mut reference = loona_hpack::Decoder::new();
        reference.set_max_allowed_table_size(allowed as usize);
        reference.set_max_table_size(table as usize);
        let mut ours = Hpack::new(table as usize);
        ours.allow(allowed);
        Self { ours, reference }
    }
}

/// The reference's fields for `block`, or None if it refuses it. Its
/// integers stop at five octets (2^28), where the guard's go on to 32 bits:
/// there it cannot judge, and the run starts both afresh (`Unjudged`).
fn reference(
    dec: &mut loona_hpack::Decoder<'static>,
    block: &[u8],
) -> Result<Option<Vec<(Vec<u8>, Vec<u8>)>>, Unjudged> {
    let mut out = Vec::new();
    match dec.decode_with_cb(block, |n, v| out.push((n.into_owned(), v.into_owned()))) {
        Ok(()) => Ok(Some(out)),
        Err(loona_hpack::decoder::DecoderError::IntegerDecodingError(_)) => Err(Unjudged),
        Err(_) => Ok(None),
    }
}

struct Unjudged;

fuzz_target!(|input: Input| {
    let limit = usize::from(input.limit);
    let start = u32::from(input.table);
    let mut allowed = start;
    let mut both = Both::new(start, allowed);
    for step in input.steps.into_iter().take(64) {
        match step {
            Step::Raw(block) => {
                let mut ours_block = block.clone();
                let mut all = Vec::new();
                let decoded = wire::decode(&mut both.ours, &mut ours_block, limit, Some(&mut all));
                assert!(ours_block.is_empty(), "the block is left for reuse");
                match decoded {
                    Ok(f) => {
                        let size: usize =
                            all.iter().map(|f| f.name.len() + f.value.len() + 32).sum();
                        assert_eq!(size, f.list_size);
                        assert!(f.list_size <= limit);
                        if all.is_empty() {
                            // Size updates alone: the reference refuses a
                            // block that ends in one; apply them with a
                            // static field after.
                            let mut padded = block.clone();
                            padded.push(0x82);
                            match reference(&mut both.reference, &padded) {
                                Ok(r) => assert!(
                                    r.is_some(),
                                    "reference refused size updates the guard took"
                                ),
                                Err(Unjudged) => both = Both::new(start, allowed),
                            }
                            continue;
                        }
                        let want: Vec<(Vec<u8>, Vec<u8>)> =
                            all.into_iter().map(|f| (f.name, f.value)).collect();
                        match reference(&mut both.reference, &block) {
                            Ok(got) => {
                                assert_eq!(got.as_ref(), Some(&want), "the two decoders disagree")
                            }
                            Err(Unjudged) => both = Both::new(start, allowed),
                        }
                    }
                    Err(BlockError::TooLarge) => both = Both::new(start, allowed),
                    Err(BlockError::Compression) => {
                        // The guard refuses more than the reference only
                        // for a size update after a field (RFC 7541 §4.2),
                        // or an integer past 32 bits.
                        if let Ok(Some(fields)) = reference(&mut both.reference, &block) {
                            let late = late_size_update(&block);
                            assert!(
                                late,
                                "the guard refused a block the reference took: {fields:?}"
                            );
                        }
                        // A connection error: the relay starts no table
                        // afresh, it ends the connection. So does this run.
                        both = Both::new(start, allowed);
                    }
                }
            }
            Step::Own { updates, fields } => {
                let mut block = Vec::new();
                for size in updates.iter().take(2) {
                    wire::put_size_update(&mut block, u32::from(*size).min(allowed));
                }
                let want: Vec<Field> = fields
                    .into_iter()
                    .take(32)
                    .map(|(name, value, never_indexed)| Field {
                        name,
                        value,
                        never_indexed,
                    })
                    .collect();
                for f in &want {
                    wire::put_literal(&mut block, &f.name, &f.value, f.never_indexed);
                }
                let size: usize = want.iter().map(|f| f.name.len() + f.value.len() + 32).sum();
                let mut all = Vec::new();
                let mut ours_block = block.clone();
                match wire::decode(&mut both.ours, &mut ours_block, usize::MAX, Some(&mut all)) {
                    Ok(f) => {
                        assert_eq!(all, want);
                        assert_eq!(f.list_size, size);
                        assert_eq!(f.indexed, !updates.is_empty());
                    }
                    Err(e) => panic!("the guard's own block failed to decode: {e:?}"),
                }
                block.push(0x82);
                match reference(&mut both.reference, &block) {
                    Ok(r) => assert!(r.is_some(), "the reference refused the guard's own block"),
                    Err(Unjudged) => both = Both::new(start, allowed),
                }
            }
            Step::Allow(size) => {
                allowed = allowed.max(u32::from(size));
                both.ours.allow(u32::from(size));
                both.reference.set_max_allowed_table_size(allowed as usize);
            }
        }
    }
});

/// Whether `block` has a size update after a field representation, read
/// as far as its representations are whole.
fn late_size_update(block: &[u8]) -> bool {
    let mut at = 0;
    let mut field = false;
    while let Some(&b) = block.get(at) {
        let (prefix, literal) = match b {
            b if b & 0x80 != 0 => (7, false),
            b if b & 0x40 != 0 => (6, true),
            b if b & 0x20 != 0 => {
                if field {
                    return true;
                }
                (5, false)
            }
            _ => (4, true),
        };
        if b & 0xe0 != 0x20 {
            field = true;
        }
        let Some((index, next)) = integer(block, at, prefix) else {
            return false;
        };
        at = next;
        if literal {
            for _ in 0..if index == 0 { 2 } else { 1 } {
                let Some((len, next)) = integer(block, at, 7) else {
                    return false;
                };
                at = next + len as usize;
            }
        }
    }
    false
}

fn integer(block: &[u8], at: usize, n: u8) -> Option<(u64, usize)> {
    let mask = (1u16 << n) as u8 - 1;
    let first = *block.get(at)? & mask;
    if first < mask {
        return Some((u64::from(first), at + 1));
    }
    let mut value = u64::from(mask);
    for (i, &b) in block.get(at + 1..)?.iter().take(8).enumerate() {
        value += u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, at + 2 + i));
        }
    }
    None
}
