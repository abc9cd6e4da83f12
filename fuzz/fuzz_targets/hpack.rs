//! The guard's HPACK reading (`guard::wire`: `loona-hpack` for tables and
//! Huffman, the guard's own check of a block's shape) on arbitrary blocks,
//! one connection's worth in a row. Invariants: no panic whatever the bytes;
//! a block the guard encodes itself (literals, never-indexed kept, size
//! updates first) decodes to exactly its fields on a table in any state a
//! valid block left; `shape` and `decode` agree on what is malformed.
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

fuzz_target!(|input: Input| {
    let limit = usize::from(input.limit);
    let mut allowed = u32::from(input.table);
    let mut hpack = Hpack::new(allowed as usize);
    for step in input.steps.into_iter().take(64) {
        match step {
            Step::Raw(mut block) => {
                let shaped = wire::shape(&block).is_some();
                let mut all = Vec::new();
                let decoded = wire::decode(&mut hpack, &mut block, limit, Some(&mut all));
                assert!(block.is_empty(), "the block is left for reuse");
                if !shaped {
                    assert_eq!(decoded, Err(BlockError::Compression));
                }
                if let Ok(f) = &decoded {
                    assert!(f.list_size <= limit);
                    let size: usize = all.iter().map(|f| f.name.len() + f.value.len() + 32).sum();
                    assert_eq!(size, f.list_size);
                }
                if decoded.is_err() {
                    // A connection error: the relay starts no table afresh,
                    // it ends the connection. So does this run.
                    hpack = Hpack::new(allowed as usize);
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
                match wire::decode(&mut hpack, &mut block, usize::MAX, Some(&mut all)) {
                    Ok(f) => {
                        assert_eq!(all, want);
                        assert_eq!(f.list_size, size);
                        assert_eq!(f.indexed, !updates.is_empty());
                    }
                    Err(e) => panic!("the guard's own block failed to decode: {e:?}"),
                }
            }
            Step::Allow(size) => {
                allowed = allowed.max(u32::from(size));
                hpack.allow(u32::from(size));
            }
        }
    }
});
