//! Every stream open through the guard, so a drain can end them all and a
//! connection can end its own at the end of its max-age grace.
//!
//! Registration and the switch to "terminating" happen under one lock, so a
//! stream is either in the snapshot `terminate_all` spreads, or refused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use prometheus_client::metrics::counter::Counter;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::metrics::Reason;

/// All open streams, and whether new ones are still admitted.
#[derive(Debug, Default)]
pub struct Registry {
    /// Behind a lock: registration must see the terminating flag atomically.
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Set by `terminate_all`: from then on every new stream is refused.
    terminating: bool,
    /// Open streams allowed at once (`Limits::max_streams`); 0 is no limit.
    limit: usize,
    /// Counts the streams refused at `limit`.
    refused: Counter,
    /// Next stream key; keys are never reused.
    next: u64,
    /// Open streams by key.
    streams: HashMap<u64, Arc<StreamCtl>>,
    /// Each new highest origin connection id, with when it was first seen
    /// (the last [`ORIGINS_KEPT`]): a push's watermark is the highest seen
    /// before its drain began, streams since closed included.
    origins: std::collections::VecDeque<(Instant, u64)>,
}

/// How many new highest origin connection ids are kept: a push's drain
/// began seconds before it is seen, far within them.
const ORIGINS_KEPT: usize = 1024;

/// Why a new stream was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The drain is ending every stream.
    Terminating,
    /// `Limits::max_streams` streams are open.
    Full,
}

/// The request header Envoy's inbound route sets to `%CONNECTION_ID%`:
/// the downstream connection the stream came in on.
pub const ORIGIN_CONNECTION: &[u8] = b"x-drainshim-downstream-connection";
/// The request header Envoy's inbound route sets to `%FILTER_CHAIN_NAME%`.
pub const ORIGIN_FILTER_CHAIN: &[u8] = b"x-drainshim-filter-chain";
/// The request header Envoy's inbound route sets to `%LISTENER_NAME%`
/// (Envoy 1.40 and later; older releases refuse the formatter).
pub const ORIGIN_LISTENER: &[u8] = b"x-drainshim-listener";

/// Where Envoy says a stream came from (its route's request headers
/// [`ORIGIN_CONNECTION`] and [`ORIGIN_FILTER_CHAIN`]); empty without them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    /// Envoy's id of the downstream connection. Envoy numbers connections
    /// in the order it makes or accepts them, so a higher id is a newer one.
    pub connection: Option<u64>,
    /// The name of the listener filter chain that took the connection.
    pub filter_chain: Option<Box<str>>,
    /// The name of the listener that took the connection.
    pub listener: Option<Box<str>>,
}

/// Which streams a config push's listener drain ends: those on Envoy
/// connections that existed when the drain began (their listener, or
/// filter chain, is being drained), never those of connections made after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushScope {
    /// When Envoy began the drain (its `last_updated`), on this clock.
    pub started: Instant,
    /// A stream without an origin connection that opened this long after
    /// `started` may still ride an old connection: it is taken too.
    pub unsure_after: std::time::Duration,
    /// Only these filter chains drain (an in-place update); None: every chain.
    pub chains: Option<Vec<String>>,
    /// The listener that drains: a stream Envoy says came in on another
    /// listener is never taken.
    pub listener: String,
}

/// Why a stream is in a push's selection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Picked {
    /// Its origin connection is older than the drain.
    Known,
    /// Without an origin (or a chain name) it cannot be told apart: taken,
    /// since a graceful end costs a reconnect and a miss costs a cut.
    Unsure,
}

impl PushScope {
    /// The highest origin connection id seen before the drain began (in
    /// `origins`, the history of new highest ids, or among `streams`):
    /// every connection up to it existed then.
    fn watermark<'a>(
        &self,
        origins: &std::collections::VecDeque<(Instant, u64)>,
        streams: impl IntoIterator<Item = &'a StreamCtl>,
    ) -> Option<u64> {
        let seen = origins
            .iter()
            .take_while(|(at, _)| *at <= self.started)
            .map(|(_, id)| *id)
            .last();
        streams
            .into_iter()
            .filter(|c| c.opened <= self.started)
            .filter_map(|c| c.origin.get().and_then(|o| o.connection))
            .chain(seen)
            .max()
    }

    /// Whether the push's drain reaches `c`, given the `watermark`.
    pub fn picks(&self, c: &StreamCtl, watermark: Option<u64>) -> Option<Picked> {
        let origin = c.origin.get();
        if origin
            .and_then(|o| o.listener.as_deref())
            .is_some_and(|l| !l.is_empty() && l != self.listener)
        {
            return None;
        }
        let chain = origin.and_then(|o| o.filter_chain.as_deref());
        let mut unsure = false;
        if let Some(chains) = &self.chains {
            match chain {
                Some(name) if !name.is_empty() => {
                    if !chains.iter().any(|c| c == name) {
                        return None;
                    }
                }
                _ => unsure = true,
            }
        }
        let old = match (origin.and_then(|o| o.connection), watermark) {
            (Some(conn), Some(w)) => conn <= w,
            // An origin but no stream older than the drain to compare with:
            // only a stream that opened before it is surely old.
            (Some(_), None) => c.opened <= self.started,
            (None, _) => {
                unsure |= c.opened > self.started;
                c.opened <= self.started + self.unsure_after
            }
        };
        old.then_some(if unsure {
            Picked::Unsure
        } else {
            Picked::Known
        })
    }
}

/// The guard's handle on one open stream: how to ask it to end.
#[derive(Debug)]
pub struct StreamCtl {
    /// Connection the stream belongs to (max age ends a connection's streams).
    conn: u64,
    /// When it was registered: a config push's drain tells old streams from
    /// new ones by it when Envoy gives no origin.
    opened: Instant,
    /// Where Envoy says it came from, once its request head was read.
    origin: OnceLock<Origin>,
    /// Only gRPC streams can be ended with trailers; others are let finish.
    pub grpc: bool,
    /// Wakes whoever waits for the end, once `why` is set. (A `Notify`, not
    /// a cancellation token: the stream task looks at it several times per
    /// request, and a token's tree costs a lock each time.)
    end: Notify,
    /// Why and when the end was asked; the first request wins. Set means
    /// ended.
    why: OnceLock<(Reason, Instant)>,
    /// Set once the stream is known to be long-lived (a WebSocket, or a
    /// response that streams): only such streams are ended early in a drain;
    /// short work in flight is left to finish.
    long_lived: AtomicBool,
    /// When the application's response head was forwarded: an answered
    /// stream open longer than the long-stream age counts as long-lived.
    answered_at: OnceLock<Instant>,
    /// Already in a drain's schedule, so it is not scheduled twice.
    scheduled: AtomicBool,
    /// A stream of the frame relay has no task of its own: its end is
    /// queued here, with its HTTP/2 stream id, for its connection.
    relayed: Option<(Arc<EndQueue>, u32)>,
}

/// The ends asked of one frame-relay connection's streams, in order.
#[derive(Debug, Default)]
pub struct EndQueue {
    ids: Mutex<Vec<u32>>,
    ready: Notify,
}

impl EndQueue {
    fn push(&self, id: u32) {
        self.ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(id);
        // Stored as a permit if the connection is busy right now.
        self.ready.notify_one();
    }

    /// The stream ids queued since the last call.
    pub fn take(&self) -> Vec<u32> {
        std::mem::take(&mut *self.ids.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Resolves once an id may have been queued since the last call.
    pub async fn ready(&self) {
        self.ready.notified().await;
    }
}

impl StreamCtl {
    /// Asks the stream to end gracefully. Later calls change nothing.
    pub fn end(&self, reason: Reason) {
        if self.why.set((reason, Instant::now())).is_ok() {
            self.end.notify_waiters();
            if let Some((queue, id)) = &self.relayed {
                queue.push(*id);
            }
        }
    }

    /// Resolves once the end was asked, with the reason and the moment.
    pub async fn ended(&self) -> (Reason, Instant) {
        loop {
            if let Some(why) = self.why.get() {
                return *why;
            }
            // A `Notified` sees every `notify_waiters` from its creation on,
            // so looking at `why` once more after creating it misses none.
            let woken = self.end.notified();
            if let Some(why) = self.why.get() {
                return *why;
            }
            woken.await;
        }
    }

    /// Why the end was asked, if it was.
    pub fn reason(&self) -> Option<Reason> {
        self.why.get().map(|(r, _)| *r)
    }

    /// Whether the end was asked.
    pub fn is_ended(&self) -> bool {
        self.why.get().is_some()
    }

    /// Marks the stream long-lived: a drain may end it early, spread over
    /// its window.
    pub fn set_long_lived(&self) {
        self.long_lived.store(true, Ordering::Relaxed);
    }

    /// Records where Envoy says the stream came from (once).
    pub fn set_origin(&self, origin: Origin) {
        if origin != Origin::default() {
            let _ = self.origin.set(origin);
        }
    }

    /// Whether the stream was marked long-lived.
    pub fn is_long_lived(&self) -> bool {
        self.long_lived.load(Ordering::Relaxed)
    }

    /// Notes that the application's response head went to the client.
    pub fn set_answered(&self) {
        let _ = self.answered_at.set(Instant::now());
    }

    /// Whether a drain may end this stream early: it was marked long-lived,
    /// or the application answered it at least `long_after` ago. Calls the
    /// application has not answered, and unary calls, are never early.
    pub fn is_long_lived_at(&self, now: Instant, long_after: std::time::Duration) -> bool {
        self.is_long_lived()
            || self
                .answered_at
                .get()
                .is_some_and(|at| now.saturating_duration_since(*at) >= long_after)
    }
}

/// A registered stream; dropping it removes the stream from the registry.
#[derive(Debug)]
pub struct Registered {
    /// Where to remove the stream from on drop.
    registry: Arc<Registry>,
    /// The stream's key in the registry.
    key: u64,
    /// The control shared with the registry.
    pub ctl: Arc<StreamCtl>,
}

impl Registered {
    /// Records where Envoy says the stream came from, and its connection
    /// id in the registry's history of the highest ones.
    pub fn set_origin(&self, origin: Origin) {
        if let Some(conn) = origin.connection {
            let mut s = self.registry.lock();
            if s.origins.back().is_none_or(|(_, top)| conn > *top) {
                if s.origins.len() == ORIGINS_KEPT {
                    s.origins.pop_front();
                }
                s.origins.push_back((self.ctl.opened, conn));
            }
        }
        self.ctl.set_origin(origin);
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.lock().streams.remove(&self.key);
    }
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent even if a holder panicked: every update
        // is a single insert, remove or flag store.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits a new stream, or returns None while the guard is terminating.
    pub fn register(self: &Arc<Self>, conn: u64, grpc: bool) -> Option<Registered> {
        self.try_register(conn, grpc).ok()
    }

    /// A registry that admits at most `limit` open streams (0: no limit),
    /// counting each one refused in `refused`.
    pub fn with_limit(limit: usize, refused: Counter) -> Self {
        Self {
            state: Mutex::new(State {
                limit,
                refused,
                ..State::default()
            }),
        }
    }

    /// Like [`Registry::register`], saying why a stream is refused.
    pub fn try_register(self: &Arc<Self>, conn: u64, grpc: bool) -> Result<Registered, Refused> {
        self.register_with(conn, grpc, None)
    }

    /// Like [`Registry::try_register`], for a stream of the frame relay: its
    /// end is queued on `queue` as `id`.
    pub fn try_register_relayed(
        self: &Arc<Self>,
        conn: u64,
        grpc: bool,
        queue: &Arc<EndQueue>,
        id: u32,
    ) -> Result<Registered, Refused> {
        self.register_with(conn, grpc, Some((queue.clone(), id)))
    }

    fn register_with(
        self: &Arc<Self>,
        conn: u64,
        grpc: bool,
        relayed: Option<(Arc<EndQueue>, u32)>,
    ) -> Result<Registered, Refused> {
        let mut s = self.lock();
        if s.terminating {
            return Err(Refused::Terminating);
        }
        if s.limit > 0 && s.streams.len() >= s.limit {
            s.refused.inc();
            return Err(Refused::Full);
        }
        let key = s.next;
        s.next += 1;
        let ctl = Arc::new(StreamCtl {
            conn,
            opened: Instant::now(),
            origin: OnceLock::new(),
            grpc,
            end: Notify::new(),
            why: OnceLock::new(),
            long_lived: AtomicBool::new(false),
            answered_at: OnceLock::new(),
            scheduled: AtomicBool::new(false),
            relayed,
        });
        s.streams.insert(key, ctl.clone());
        Ok(Registered {
            registry: self.clone(),
            key,
            ctl,
        })
    }

    /// Refuses new streams from now on (registration and this switch share
    /// the lock, so no stream slips in between).
    pub fn begin_terminating(&self) {
        self.lock().terminating = true;
    }

    /// Open streams not yet asked to end that `pick` selects, oldest first.
    fn open_where(&self, pick: impl Fn(&StreamCtl) -> bool) -> Vec<Arc<StreamCtl>> {
        let mut open: Vec<_> = self
            .lock()
            .streams
            .iter()
            .filter(|(_, c)| !c.is_ended() && pick(c))
            .map(|(k, c)| (*k, c.clone()))
            .collect();
        open.sort_by_key(|(k, _)| *k);
        open.into_iter().map(|(_, c)| c).collect()
    }

    /// Long-lived streams not yet in a drain's schedule, oldest first; they
    /// are marked scheduled.
    pub fn take_long_lived(
        &self,
        now: Instant,
        long_after: std::time::Duration,
    ) -> Vec<Arc<StreamCtl>> {
        let picked = self.open_where(|c| {
            !c.scheduled.load(Ordering::Relaxed) && c.is_long_lived_at(now, long_after)
        });
        for c in &picked {
            c.scheduled.store(true, Ordering::Relaxed);
        }
        picked
    }

    /// The streams a config push's drain reaches and not yet asked to end,
    /// oldest first, each with its key (never reused) and why; `watermark`
    /// is computed on the first call from the streams open then and kept by
    /// the caller.
    pub fn push_selection(
        &self,
        scope: &PushScope,
        watermark: &mut Option<Option<u64>>,
    ) -> Vec<(u64, Arc<StreamCtl>, Picked)> {
        let s = self.lock();
        let w = *watermark
            .get_or_insert_with(|| scope.watermark(&s.origins, s.streams.values().map(|c| &**c)));
        let mut picked: Vec<_> = s
            .streams
            .iter()
            .filter(|(_, c)| !c.is_ended())
            .filter_map(|(k, c)| scope.picks(c, w).map(|p| (*k, c.clone(), p)))
            .collect();
        drop(s);
        picked.sort_by_key(|(k, _, _)| *k);
        picked
    }

    /// Every stream not yet asked to end, oldest first.
    pub fn open_streams(&self) -> Vec<Arc<StreamCtl>> {
        self.open_where(|_| true)
    }

    /// The streams of connection `conn` not yet asked to end: long-lived
    /// ones first (oldest first), then the rest, which so get the most time.
    pub fn connection_streams(
        &self,
        conn: u64,
        now: Instant,
        long_after: std::time::Duration,
    ) -> Vec<Arc<StreamCtl>> {
        let (mut long, short): (Vec<_>, Vec<_>) = self
            .open_where(|c| c.conn == conn)
            .into_iter()
            .partition(|c| c.is_long_lived_at(now, long_after));
        long.extend(short);
        long
    }

    /// Streams open right now.
    pub fn len(&self) -> usize {
        self.lock().streams.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const LONG: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn only_long_lived_streams_are_taken_and_each_once() {
        let r = Arc::new(Registry::default());
        let unanswered = r.register(1, true).expect("admitted");
        let streaming = r.register(1, true).expect("admitted");
        let answered = r.register(1, true).expect("admitted");
        streaming.ctl.set_answered();
        streaming.ctl.set_long_lived();
        answered.ctl.set_answered();
        let now = Instant::now();
        let first = r.take_long_lived(now, LONG);
        assert_eq!(first.len(), 1, "only the streaming one");
        assert!(Arc::ptr_eq(&first[0], &streaming.ctl));
        assert!(r.take_long_lived(now, LONG).is_empty(), "never taken twice");
        tokio::time::advance(LONG).await;
        let later = r.take_long_lived(Instant::now(), LONG);
        assert_eq!(later.len(), 1, "answered long ago counts as long-lived");
        assert!(Arc::ptr_eq(&later[0], &answered.ctl));
        assert!(
            !unanswered.ctl.is_long_lived_at(Instant::now(), LONG),
            "a call not answered never is"
        );
        let by_conn = r.connection_streams(1, Instant::now(), LONG);
        assert!(Arc::ptr_eq(&by_conn[2], &unanswered.ctl), "short ones last");
    }

    #[tokio::test]
    async fn terminating_refuses_new_streams_and_snapshots_the_open_ones() {
        let r = Arc::new(Registry::default());
        let a = r.register(1, true).expect("admitted");
        let b = r.register(2, false).expect("admitted");
        b.ctl.end(Reason::max_age);
        r.begin_terminating();
        let snapshot = r.open_streams();
        assert_eq!(
            snapshot.len(),
            1,
            "streams already ending are not rescheduled"
        );
        assert!(Arc::ptr_eq(&snapshot[0], &a.ctl));
        assert!(r.register(1, true).is_none());
        assert_eq!(r.len(), 2);
        drop(a);
        drop(b);
        assert_eq!(r.len(), 0);
    }

    fn scope(started: Instant, chains: Option<&[&str]>) -> PushScope {
        PushScope {
            started,
            unsure_after: Duration::from_millis(500),
            chains: chains.map(|c| c.iter().map(|s| s.to_string()).collect()),
            listener: "inbound".into(),
        }
    }

    fn origin(conn: u64, chain: &str, listener: &str) -> Origin {
        Origin {
            connection: Some(conn),
            filter_chain: Some(chain.into()),
            listener: Some(listener.into()),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_push_takes_the_streams_of_connections_older_than_its_drain() {
        let r = Arc::new(Registry::default());
        let old = r.register(1, true).expect("admitted");
        old.ctl.set_origin(origin(4, "fc", "inbound"));
        let other_listener = r.register(1, true).expect("admitted");
        other_listener
            .ctl
            .set_origin(origin(2, "fc", "outbound-ish"));
        tokio::time::advance(Duration::from_secs(1)).await;
        let started = Instant::now();
        tokio::time::advance(Duration::from_secs(1)).await;
        // Opened after the drain began, on an old connection (id 2 <= 4):
        // taken; on a new one (id 9): left alone.
        let again = r.register(1, true).expect("admitted");
        again.ctl.set_origin(origin(2, "fc", "inbound"));
        let fresh = r.register(1, true).expect("admitted");
        fresh.ctl.set_origin(origin(9, "fc", "inbound"));
        let sc = scope(started, None);
        let mut w = None;
        let picked: Vec<_> = r
            .push_selection(&sc, &mut w)
            .into_iter()
            .map(|(_, c, p)| (c, p))
            .collect();
        assert_eq!(
            w,
            Some(Some(4)),
            "the watermark: the newest connection seen before the drain"
        );
        assert_eq!(picked.len(), 2, "{picked:?}");
        assert!(Arc::ptr_eq(&picked[0].0, &old.ctl) && picked[0].1 == Picked::Known);
        assert!(Arc::ptr_eq(&picked[1].0, &again.ctl));
        // Ended streams are not listed again; the key is never reused.
        old.ctl.end(Reason::config_push);
        assert_eq!(r.push_selection(&sc, &mut w).len(), 1);
    }

    /// A connection whose streams all closed before the drain was seen, or
    /// that sat idle, is still old: the watermark remembers the highest id
    /// seen before the drain began, not only the open streams'.
    #[tokio::test(start_paused = true)]
    async fn the_watermark_remembers_connections_whose_streams_closed() {
        let r = Arc::new(Registry::default());
        let gone = r.register(1, true).expect("admitted");
        gone.set_origin(origin(7, "fc", "inbound"));
        drop(gone);
        tokio::time::advance(Duration::from_secs(1)).await;
        let started = Instant::now();
        tokio::time::advance(Duration::from_secs(1)).await;
        // Opened after the drain began on an old connection (5 < 7) that
        // had nothing open at the drain's start.
        let back = r.register(1, true).expect("admitted");
        back.set_origin(origin(5, "fc", "inbound"));
        let newer = r.register(1, true).expect("admitted");
        newer.set_origin(origin(11, "fc", "inbound"));
        let mut w = None;
        let picked = r.push_selection(&scope(started, None), &mut w);
        assert_eq!(w, Some(Some(7)));
        assert_eq!(picked.len(), 1);
        assert!(Arc::ptr_eq(&picked[0].1, &back.ctl));
    }

    #[tokio::test(start_paused = true)]
    async fn a_filter_chain_push_takes_only_its_chains_and_takes_the_unnamed_unsure() {
        let r = Arc::new(Registry::default());
        let one = r.register(1, true).expect("admitted");
        one.ctl.set_origin(origin(1, "one", "inbound"));
        let two = r.register(1, true).expect("admitted");
        two.ctl.set_origin(origin(3, "two", "inbound"));
        let unnamed = r.register(1, true).expect("admitted");
        unnamed.ctl.set_origin(Origin {
            connection: Some(5),
            ..Origin::default()
        });
        tokio::time::advance(Duration::from_secs(1)).await;
        let sc = scope(Instant::now(), Some(&["one"]));
        let picked = r.push_selection(&sc, &mut None);
        let got: Vec<_> = picked
            .iter()
            .map(|(_, c, p)| (Arc::as_ptr(c), *p))
            .collect();
        assert_eq!(
            got,
            vec![
                (Arc::as_ptr(&one.ctl), Picked::Known),
                (Arc::as_ptr(&unnamed.ctl), Picked::Unsure)
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn without_envoys_headers_time_tells_and_the_first_moments_are_unsure() {
        let r = Arc::new(Registry::default());
        let before = r.register(1, true).expect("admitted");
        tokio::time::advance(Duration::from_secs(1)).await;
        let sc = scope(Instant::now(), None);
        tokio::time::advance(Duration::from_millis(200)).await;
        let soon_after = r.register(1, true).expect("admitted");
        tokio::time::advance(Duration::from_secs(1)).await;
        let later = r.register(1, true).expect("admitted");
        let picked = r.push_selection(&sc, &mut None);
        let got: Vec<_> = picked
            .iter()
            .map(|(_, c, p)| (Arc::as_ptr(c), *p))
            .collect();
        assert_eq!(
            got,
            vec![
                (Arc::as_ptr(&before.ctl), Picked::Known),
                (Arc::as_ptr(&soon_after.ctl), Picked::Unsure)
            ],
            "a stream opened past the look interval is new"
        );
        drop(later);
    }

    #[tokio::test]
    async fn the_first_reason_wins() {
        let r = Arc::new(Registry::default());
        let s = r.register(7, true).expect("admitted");
        let _other = r.register(8, true).expect("admitted");
        let of_7 = r.connection_streams(7, Instant::now(), LONG);
        assert_eq!(of_7.len(), 1, "only connection 7's streams");
        of_7[0].end(Reason::max_age);
        s.ctl.end(Reason::drain);
        assert_eq!(s.ctl.ended().await.0, Reason::max_age);
        assert!(
            r.connection_streams(7, Instant::now(), LONG).is_empty(),
            "ended streams are not listed again"
        );
    }
}
