//! The relay's stream store ([`Streams`]): each relayed [`Stream`], its
//! fields its own, and the bytes held across them. What happens to a
//! stream is said by its methods (its request and response ending, its
//! window taken and given, its messages counted, a message held); how a
//! stream being ended moves is the `ending` module's (its state is in
//! `ending::state`).

use std::collections::HashMap;

use tokio::time::Instant;

use super::ending::cadence::Cadence;
use super::ending::state::{EndProgress, Held, HOLD_MAX};
use super::ending::{record_outcome, StreamOutcome};
use crate::guard::body::{BodyKind, Boundaries};
use crate::guard::registry::Registered;
use crate::guard::signals;
use crate::metrics::{Reason, StreamProtocol};

/// The relayed streams still open, by id, and what they hold.
#[derive(Default)]
pub(super) struct Streams {
    open: HashMap<u32, Stream>,
    /// Bytes held in every stream's [`Held`] (the sum of their windows):
    /// the application is not read while they reach [`HOLD_MAX`].
    held: usize,
    /// Graceful ends not written to the client yet.
    unwritten: Vec<Unwritten>,
}

impl Streams {
    /// Whether the guard cancelled the application's side of stream `id`
    /// while it ends it (its client's frames no longer go there).
    pub(super) fn app_cancelled(&self, id: u32) -> bool {
        self.get(&id).is_some_and(Stream::app_cancelled)
    }

    /// Whether stream `id` is open and its client window shut.
    pub(super) fn shut(&self, id: u32) -> bool {
        self.get(&id).is_some_and(|s| s.shut_since().is_some())
    }

    pub(super) fn get(&self, id: &u32) -> Option<&Stream> {
        self.open.get(id)
    }

    pub(super) fn get_mut(&mut self, id: &u32) -> Option<&mut Stream> {
        self.open.get_mut(id)
    }

    pub(super) fn contains_key(&self, id: &u32) -> bool {
        self.open.contains_key(id)
    }

    pub(super) fn insert(&mut self, id: u32, stream: Stream) {
        self.open.insert(id, stream);
    }

    /// Stream `id` is over here: out of the store, with what it held (the
    /// caller gives that back).
    pub(super) fn remove(&mut self, id: &u32) -> Option<Stream> {
        let s = self.open.remove(id)?;
        self.held -= s.held.as_ref().map_or(0, |h| h.window);
        Some(s)
    }

    /// Every stream, out of the store (the connection closes).
    pub(super) fn drain(&mut self) -> impl Iterator<Item = Stream> + '_ {
        self.held = 0;
        self.open.drain().map(|(_, s)| s)
    }

    pub(super) fn len(&self) -> usize {
        self.open.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = &u32> {
        self.open.keys()
    }

    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = (&u32, &Stream)> {
        self.open.iter()
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Stream> {
        self.open.values()
    }

    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut Stream> {
        self.open.values_mut()
    }

    /// Stream `id` was ended gracefully for `reason`, its end queued to
    /// the client: out of the open streams, until the end is written.
    pub(super) fn end_unwritten(&mut self, id: u32, reason: Reason, stream: Stream) {
        self.unwritten.push(Unwritten { id, reason, stream });
    }

    /// Whether a graceful end waits to be written.
    pub(super) fn has_unwritten(&self) -> bool {
        !self.unwritten.is_empty()
    }

    /// Keeps the graceful ends not written yet for which `keep` is true.
    pub(super) fn retain_unwritten(&mut self, keep: impl FnMut(&Unwritten) -> bool) {
        self.unwritten.retain(keep);
    }

    /// Bytes held across the streams.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.held
    }

    /// Whether they reach [`HOLD_MAX`] (the application is then not read
    /// until some are released). Never while no stream holds anything: a
    /// count that drifted (a bug) must not stop the application's reads
    /// for good.
    pub(super) fn holds_too_much(&self) -> bool {
        self.held >= HOLD_MAX && self.open.values().any(|s| s.held.is_some())
    }

    /// A count that drifted, for the test of [`Streams::holds_too_much`].
    #[cfg(test)]
    pub(super) fn drift_held(&mut self, bytes: usize) {
        self.held += bytes;
    }

    /// The stream holding the most, if one holds anything.
    pub(super) fn largest_held(&self) -> Option<u32> {
        self.open
            .iter()
            .filter_map(|(id, s)| Some((s.held.as_ref()?.window, *id)))
            .max()
            .map(|(_, id)| id)
    }

    /// A frame of `window` bytes goes with stream `id`'s message held, if
    /// it holds one.
    pub(super) fn hold_more(&mut self, id: u32, window: usize, frame: &[u8]) {
        if let Some(held) = self.open.get_mut(&id).and_then(|s| s.held.as_mut()) {
            held.push(window, frame);
            self.held += window;
        }
    }

    /// A frame of `window` bytes goes with stream `id`'s message held,
    /// begun (from the boundaries `from`) if none was.
    pub(super) fn hold(&mut self, id: u32, from: Boundaries, window: usize, frame: &[u8]) {
        if let Some(s) = self.open.get_mut(&id) {
            s.held
                .get_or_insert_with(|| Held::new(from))
                .push(window, frame);
            self.held += window;
        }
    }

    /// Stream `id`'s message held goes (on, or dropped by the caller).
    pub(super) fn take_held(&mut self, id: u32) -> Option<Held> {
        let held = self.open.get_mut(&id)?.held.take()?;
        self.held -= held.window;
        Some(held)
    }

    /// Stream `id`'s message held is dropped, cut short: the stream is
    /// back at the boundary before it. What it took of the connection
    /// window.
    pub(super) fn drop_held(&mut self, id: u32) -> Option<usize> {
        let s = self.open.get_mut(&id)?;
        let held = s.held.take()?;
        s.bounds = Some(held.from);
        self.held -= held.window;
        Some(held.window)
    }
}

/// A stream the guard ended gracefully, its end queued to the client: it
/// counts as graceful once that end has been written, and as cut if the
/// connection closes first. Its registry entry stays until then, so a
/// drain waits for it.
pub(super) struct Unwritten {
    pub(super) id: u32,
    pub(super) reason: Reason,
    pub(super) stream: Stream,
}

impl std::fmt::Debug for Unwritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unwritten")
            .field("id", &self.id)
            .field("reason", &self.reason)
            .finish_non_exhaustive()
    }
}

/// Which halves of a stream are over.
#[derive(Clone, Copy, Default)]
struct Halves {
    /// The client ended its request (END_STREAM).
    request: bool,
    /// The application ended its response (END_STREAM).
    response: bool,
    /// The guard sent RST_STREAM(CANCEL) to the application (an ending's
    /// cancel). It stays set whatever the application does next, its own
    /// END_STREAM included: to the application the stream is closed, and
    /// nothing of the client's may follow there (RFC 9113 §5.1).
    app_reset: bool,
}

/// One relayed stream.
pub(super) struct Stream {
    /// Its entry in the guard's registry (dropped: removed).
    reg: Registered,
    /// The request's kind, by its content type.
    kind: BodyKind,
    /// The response's boundaries, once its head arrived.
    bounds: Option<Boundaries>,
    /// Which of its halves are over, and whether the guard reset the
    /// application's.
    halves: Halves,
    started: Instant,
    /// Response messages (or events) so far.
    messages: u64,
    /// When the application sends data on it.
    cadence: Cadence,
    ending: Option<EndProgress>,
    sig: Option<signals::Request>,
    /// The client's window for this stream's response data, and since when
    /// it has been shut (the client takes nothing: `write_stall_timeout`).
    window: i64,
    shut_since: Option<Instant>,
    /// A message of its response spanned DATA frames: one could be half
    /// on its way when the application reads a cancel.
    split: bool,
    /// With a content-length, the bytes of the request still to come: its
    /// DATA must add up to it (RFC 9113 §8.1.1).
    body_left: Option<u64>,
    /// A message begun after the guard's cancel, held until it is whole.
    held: Option<Held>,
}

impl Stream {
    /// A stream just admitted: registered as `reg`, its request of `kind`
    /// (ended already with `req_done`), the client's window for it `window`.
    pub(super) fn new(
        reg: Registered,
        kind: BodyKind,
        req_done: bool,
        sig: Option<signals::Request>,
        window: i64,
        now: Instant,
    ) -> Self {
        let mut sig = sig;
        if req_done {
            if let Some(sig) = sig.as_mut() {
                sig.request_ended();
            }
        }
        Self {
            reg,
            kind,
            bounds: None,
            halves: Halves {
                request: req_done,
                ..Halves::default()
            },
            started: now,
            messages: 0,
            cadence: Cadence::default(),
            split: false,
            held: None,
            ending: None,
            sig,
            window,
            shut_since: None,
            body_left: None,
        }
    }

    pub(super) fn kind(&self) -> BodyKind {
        self.kind
    }

    pub(super) fn started(&self) -> Instant {
        self.started
    }

    /// The client ended its request.
    pub(super) fn req_done(&self) -> bool {
        self.halves.request
    }

    /// The application ended its response.
    pub(super) fn resp_done(&self) -> bool {
        self.halves.response
    }

    /// Why the guard was asked to end it, if it was.
    pub(super) fn end_reason(&self) -> Option<Reason> {
        self.reg.ctl.reason()
    }

    pub(super) fn answered(&self) -> bool {
        self.bounds.is_some()
    }

    pub(super) fn bounds(&self) -> Option<&Boundaries> {
        self.bounds.as_ref()
    }

    pub(super) fn at_boundary(&self) -> bool {
        self.bounds.as_ref().is_some_and(Boundaries::at_boundary)
    }

    pub(super) fn endable(&self) -> bool {
        self.bounds.as_ref().is_some_and(Boundaries::endable)
    }

    pub(super) fn grpc(&self) -> bool {
        self.reg.ctl.grpc
    }

    pub(super) fn protocol(&self) -> StreamProtocol {
        if self.grpc() {
            StreamProtocol::grpc
        } else {
            StreamProtocol::http
        }
    }

    /// A message of its response spanned DATA frames.
    pub(super) fn split(&self) -> bool {
        self.split
    }

    /// When the application sends data on it.
    pub(super) fn cadence(&self) -> Cadence {
        self.cadence
    }

    /// The client's window for this stream.
    pub(super) fn window(&self) -> i64 {
        self.window
    }

    /// Since when the client's window for it has been shut, if it is.
    pub(super) fn shut_since(&self) -> Option<Instant> {
        self.shut_since
    }

    /// Its ending, if the guard is ending it.
    pub(super) fn ending(&self) -> Option<EndProgress> {
        self.ending
    }

    pub(super) fn ending_mut(&mut self) -> Option<&mut EndProgress> {
        self.ending.as_mut()
    }

    /// The guard ends it: asked now, for `reason`.
    pub(super) fn begin_ending(&mut self, reason: Reason, now: Instant) {
        self.ending = Some(EndProgress {
            reason,
            asked: now,
            quiet_at: None,
            forced_by: None,
            quiet: false,
            settling: false,
            cancelled: None,
        });
    }

    /// The guard cancelled the application's side while it ended it: the
    /// client's frames no longer go there, even once the application's own
    /// END_STREAM has ended the ending (its answer won, but to it the
    /// stream was reset).
    pub(super) fn app_cancelled(&self) -> bool {
        self.halves.app_reset
    }

    /// The guard wrote RST_STREAM(CANCEL) to the application for it.
    pub(super) fn app_reset_sent(&mut self) {
        self.halves.app_reset = true;
    }

    /// The client ended its request.
    pub(super) fn request_ended(&mut self) {
        self.halves.request = true;
        if let Some(sig) = self.sig.as_mut() {
            sig.request_ended();
        }
    }

    /// The response is over (the application's END_STREAM, or the guard's
    /// whole answer): the application's own end wins over the guard's.
    pub(super) fn response_ended(&mut self) {
        self.halves.response = true;
        self.ending = None;
    }

    /// The response's head (`status`, not informational) arrived: its
    /// messages are counted from now on, and the registry and the signals
    /// know it is answered.
    pub(super) fn response_head(
        &mut self,
        status: u16,
        content_type: &str,
        grpc_status: Option<&[u8]>,
    ) {
        self.bounds = Some(Boundaries::new(crate::guard::body::response_kind_of(
            self.kind,
            content_type,
        )));
        self.reg.ctl.set_answered();
        if let (Some(sig), Ok(code)) = (self.sig.as_mut(), http::StatusCode::from_u16(status)) {
            sig.head_status(code, grpc_status);
        }
    }

    /// Trailers (or a later head) of the response: their grpc-status.
    pub(super) fn response_trailers(&mut self, grpc_status: Option<&[u8]>) {
        if let Some(sig) = self.sig.as_mut() {
            sig.grpc_status(grpc_status);
        }
    }

    /// The application reset it with `code`.
    pub(super) fn app_reset(&mut self, code: u32) {
        if let Some(sig) = self.sig.as_mut() {
            // The core's signals take an `h2::Reason` (they cannot name
            // `wire`: see `signals::grpc_code_for_reset`).
            sig.reset(h2::Reason::from(code));
        }
    }

    /// How it ended, to its signals.
    pub(super) fn record(&mut self, outcome: &StreamOutcome) {
        let grpc = self.grpc();
        if let Some(sig) = self.sig.as_mut() {
            record_outcome(sig, grpc, outcome);
        }
    }

    /// The request has a content-length of `length`: its DATA is counted
    /// against it.
    pub(super) fn expect_body(&mut self, length: u64) {
        self.body_left = Some(length);
    }

    /// `n` more bytes of its request body, and whether it ends here: false
    /// if that breaks its content-length (RFC 9113 §8.1.1).
    pub(super) fn body_data(&mut self, n: usize, end: bool) -> bool {
        let Some(left) = self.body_left else {
            return true;
        };
        let Some(rest) = left.checked_sub(n as u64) else {
            self.body_left = None;
            return false;
        };
        self.body_left = (!end).then_some(rest);
        !end || rest == 0
    }

    /// The client's WINDOW_UPDATE for it: its window, which, open, is no
    /// longer stalled.
    pub(super) fn credit(&mut self, n: i64) -> i64 {
        self.window += n;
        if self.window > 0 {
            self.shut_since = None;
        }
        self.window
    }

    /// Its window grew by `n` without the client taking anything (its
    /// INITIAL_WINDOW_SIZE changed, or padding was given back).
    pub(super) fn grow_window(&mut self, n: i64) {
        self.window += n;
    }

    /// A DATA frame of `len` bytes (`data` of them content) went to the
    /// client at `now`: its window paid, the application's cadence noted.
    /// True if the window just shut (the stall timer starts).
    pub(super) fn sent(&mut self, len: usize, data: bool, now: Instant) -> bool {
        if data {
            self.cadence.data(now);
        }
        self.window -= len as i64;
        let shut = self.window <= 0 && self.shut_since.is_none() && len > 0;
        if shut {
            self.shut_since = Some(now);
        }
        shut
    }

    /// The guard's own DATA of `n` bytes to the client: its window paid.
    pub(super) fn spend(&mut self, n: usize) {
        self.window -= n as i64;
    }

    /// `data` of the response goes on: its messages counted (a second one
    /// makes the stream long-lived). With `hold` (after the guard's
    /// cancel, and not the response's end), what of it must be held: where
    /// its whole messages end, and the boundaries from there.
    pub(super) fn count_messages(
        &mut self,
        data: &[u8],
        hold: bool,
    ) -> Option<(usize, Boundaries)> {
        let b = self.bounds.as_mut()?;
        if !b.endable() || data.is_empty() {
            return None;
        }
        let mut held = None;
        if hold {
            let whole = b.whole_prefix(data);
            if whole < data.len() {
                let mut from = b.clone();
                from.consume(&data[..whole]);
                held = Some((whole, from));
            }
        }
        self.messages += b.consume(data);
        self.split |= !b.at_boundary();
        if self.messages >= 2 {
            self.reg.ctl.set_long_lived();
        }
        if let Some(sig) = self.sig.as_mut() {
            sig.messages(self.messages);
        }
        held
    }

    /// The message held, if one is.
    pub(super) fn held(&self) -> Option<&Held> {
        self.held.as_ref()
    }

    /// The message held goes with the stream, which is over (`Streams::remove`
    /// counted it out).
    pub(super) fn take_held(&mut self) -> Option<Held> {
        self.held.take()
    }

    /// A test's stream whose client's window is shut since `now`.
    #[cfg(test)]
    pub(super) fn shut_at(&mut self, now: Instant) {
        self.window = 0;
        self.shut_since = Some(now);
    }
}
