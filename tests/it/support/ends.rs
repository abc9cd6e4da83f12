//! How a stream through a drain ended.

use drainshim_bench::client::{Ending, StreamEnd};
use drainshim_bench::server::Ledger;

/// `end` was ended by a drain, gracefully (UNAVAILABLE saying "drain"),
/// with no gap and nothing lost of what the backend (`ledger`) wrote.
/// `at` starts every failure's message ("1.40.0 ", or "").
pub fn assert_drained_gracefully(end: &StreamEnd, ledger: &Ledger, at: &str) {
    let status = end.status.as_ref().expect("a status");
    assert_eq!(end.ending(), Ending::Graceful, "{at}{}: {status:?}", end.id);
    assert_eq!(status.code(), tonic::Code::Unavailable, "{at}");
    assert!(
        status.message().contains("drain"),
        "{at}{}: {:?}",
        end.id,
        status.message()
    );
    assert!(end.gapless(), "{at}{}: gaps in {:?}", end.id, end.seqs);
    // Nothing the backend handed to its transport was lost.
    let written = ledger.last_written(&end.id).expect("ledger entry");
    assert_eq!(
        written,
        *end.seqs.last().expect("some messages"),
        "{at}{}: lost messages",
        end.id
    );
}
