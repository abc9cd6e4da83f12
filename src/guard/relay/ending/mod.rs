//! How a relayed stream ends: its rules, outcomes and state, in one room,
//! below the stream store that keeps each stream's ending; the protocol
//! that carries them out over the store is `relay/ends.rs`, above it. The
//! guard's design document ("How a gRPC stream ends") describes it; this
//! module and `ends.rs` are that description in code.
//!
//! - **Who asks** (elsewhere, by design): a drain asks every long-lived
//!   stream of the process through the registry, spread over its window
//!   (`guard::terminator`); a connection asks its own streams at its max
//!   age and after the application's GOAWAY ([`plan`]: the relay's own
//!   timer, no task). Every ask lands in `begin_end`, in the protocol
//!   beside this room (`relay/ends.rs`), which carries these rules out over
//!   the stream store.
//! - **When** (`ends.rs`, [`cadence`]): at a message boundary, in the
//!   application's first pause ([`BURST_GAP`] after a message), or at once
//!   when the stream's learned cadence puts its next write well off; a
//!   quiet stream gets up to `end_settle` to write once more; past
//!   `end_timeout` a stream at a boundary ends there, one mid-message is
//!   reset (REFUSED_STREAM, retryable).
//! - **How** (`ends.rs`, its state in [`state`]): RST_STREAM(CANCEL) to
//!   the application, the barrier right behind it (two SETTINGS round
//!   trips), every DATA frame before the barrier's ack forwarded (a message
//!   begun after the cancel held until whole), then the client's trailers.
//!   Nothing but the ending's own bound cuts the wait short; past it the
//!   end is `Unconfirmed`, counted ungraceful.
//! - **What it counts as** ([`StreamOutcome`], [`record_outcome`]): graceful
//!   only once its trailers were written to the client; every DATA frame of
//!   the application's the guard drops is counted, with its reason.
//!
//! Invariants, whatever ends a stream:
//! - **Nothing the application's transport wrote before it read the
//!   cancel is dropped**, and half a message never reaches the client.
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
//! A stream is marked long-lived once its response carried two messages
//! (see [`crate::guard::registry`]): a drain ends only such streams early.
//! The HTTP/1.1 wing's endings are in `h1/`.

pub(super) mod cadence;
mod plan;
pub(super) mod state;

use std::time::Duration;

use http::StatusCode;

use crate::guard::signals;
use crate::metrics::{Code, Reason};

/// After a message, this long without more data means the application
/// paused between writes: the stream may end there (the cancel, then the
/// barrier's round trips, which collect whatever it had already queued). Short, because the
/// end should come as soon after a write as possible: a producer's next
/// write is then furthest away.
pub(in crate::guard::relay) const BURST_GAP: Duration = Duration::from_millis(2);

/// How a stream ended, for metrics and logs.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::guard::relay) enum StreamOutcome {
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
pub(in crate::guard::relay) fn record_outcome(
    s: &mut signals::Request,
    grpc: bool,
    outcome: &StreamOutcome,
) {
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
