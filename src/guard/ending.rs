//! How a stream through the HTTP/2 relay ends: its rules, and the outcome
//! each ending is counted as. (Only `relay/` uses this module; the
//! HTTP/1.1 wing's endings are in `h1/`.)
//!
//! Invariants, whatever ends a stream:
//! - **Nothing received is dropped.** Every byte the application sent and
//!   the guard received is forwarded; a message in progress is finished
//!   (within `end_timeout`) before anything ends the stream.
//! - **The application's own answer wins.** If its trailers (or END_STREAM,
//!   or its own RST_STREAM) arrive, they are what the client gets; the
//!   guard's `grpc-status: 14` is only ever sent where the application has
//!   not finished.
//! - **Degraded paths stay retryable.** Where the application did not answer
//!   (no response head), a gRPC client gets a trailers-only UNAVAILABLE and
//!   an HTTP client a 502, 503 or REFUSED_STREAM; where a response cannot
//!   reach a message boundary in time, RST_STREAM(REFUSED_STREAM), which
//!   gRPC maps to UNAVAILABLE. CANCEL is only ever passed on from a peer, or
//!   ends a non-gRPC response that could not end whole.
//!
//! The graceful end of a gRPC stream, once asked: everything received is
//! forwarded and the message in progress is completed. The stream then ends
//! in the application's first pause: at a message boundary, when nothing
//! more has arrived for [`BURST_GAP`] after a message (a producer that just
//! wrote is between writes, so the cancel that follows cannot catch a
//! message on its way), and after the barrier: two round trips of an empty
//! SETTINGS frame to the application ([`BARRIER_WAIT`] at most for each),
//! whose acks follow everything it had queued.
//! A stream of the HTTP/2 relay asked between two writes ends at once when
//! its learned cadence puts the next write well off (`relay::cadence`);
//! any other application that was already quiet gets up to `end_settle` to
//! write once more, so the end lands right after a write rather than at a
//! moment that may meet one. Past `end_timeout` a stream at a boundary is
//! ended there (a producer that never pauses for 2 ms: what it handed its
//! transport after the cancel left is lost, which no proxy can avoid
//! without the application's help), and one mid-message is reset.
//!
//! A stream is marked long-lived once its response carried two messages
//! (see [`super::registry`]): a drain ends only such streams early.

use std::time::Duration;

use http::StatusCode;

use super::signals;
use crate::metrics::{Code, Reason};

/// After a message, this long without more data means the application
/// paused between writes: the stream may end there (after the barrier's
/// round trips, which collect whatever it had already queued). Short, because the
/// end should come as soon after a write as possible: a producer's next
/// write is then furthest away.
pub(super) const BURST_GAP: Duration = Duration::from_millis(2);

/// How a stream ended, for metrics and logs.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum StreamOutcome {
    /// The application finished the response (its own status, whatever it is).
    Completed,
    /// The guard ended it gracefully (trailers or trailers-only).
    Ended(Reason),
    /// The guard ended it with trailers, but without the application's
    /// ack of its cancel within the ending's bound: counted ungraceful.
    Unconfirmed(Reason),
    /// Ended before it reached the application: refused, safe to retry.
    Refused,
    /// The client reset it or went away.
    ClientGone,
    /// The application could not be reached or failed the stream.
    UpstreamFailed,
    /// No safe end point in time: reset (retryably for gRPC).
    Reset,
}

/// What the client got, for the guard's request signals, where the stream's
/// end decided it rather than the application's head or trailers. A stream
/// the guard ended itself, gracefully or by a reset, is not the
/// application's outcome: it is left out of the request counter (the
/// ending is counted by `record_termination` or `record_ungraceful`).
pub(super) fn record_outcome(s: &mut signals::Request, grpc: bool, outcome: &StreamOutcome) {
    match outcome {
        StreamOutcome::Completed => {}
        // gRPC: the guard's `grpc-status: 14`; SSE: a clean end of the body.
        // REFUSED_STREAM: the ending found no safe point in time.
        StreamOutcome::Ended(_) | StreamOutcome::Unconfirmed(_) | StreamOutcome::Reset => {
            s.ended_by_guard()
        }
        StreamOutcome::Refused => {
            s.answered_by_guard(Code::UNAVAILABLE, StatusCode::SERVICE_UNAVAILABLE)
        }
        StreamOutcome::UpstreamFailed if grpc => s.code_if_unset(Code::UNAVAILABLE),
        StreamOutcome::UpstreamFailed => s.status_if_unset(StatusCode::BAD_GATEWAY),
        StreamOutcome::ClientGone if grpc => s.code_if_unset(Code::CANCELLED),
        StreamOutcome::ClientGone => {}
    }
}
