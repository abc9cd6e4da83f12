//! Every stream open through the guard, so a drain can end them all and a
//! connection can end its own at the end of its max-age grace.
//!
//! Registration and the switch to "terminating" happen under one lock, so a
//! stream is either in the snapshot `terminate_all` spreads, or refused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

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
}

/// Why a new stream was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The drain is ending every stream.
    Terminating,
    /// `Limits::max_streams` streams are open.
    Full,
}

/// The guard's handle on one open stream: how to ask it to end.
#[derive(Debug)]
pub struct StreamCtl {
    /// Connection the stream belongs to (max age ends a connection's streams).
    conn: u64,
    /// Only gRPC streams can be ended with trailers; others are let finish.
    pub grpc: bool,
    /// Cancelled when the stream should end; the stream task waits on it.
    end: CancellationToken,
    /// Why and when the end was asked; the first request wins.
    why: OnceLock<(Reason, Instant)>,
    /// Set once the stream is known to be long-lived (a WebSocket, or a
    /// response that streams): only such streams are ended early in a drain;
    /// short work in flight is left to finish.
    long_lived: AtomicBool,
}

impl StreamCtl {
    /// Asks the stream to end gracefully. Later calls change nothing.
    pub fn end(&self, reason: Reason) {
        if self.why.set((reason, Instant::now())).is_ok() {
            self.end.cancel();
        }
    }

    /// Resolves once the end was asked, with the reason and the moment.
    pub async fn ended(&self) -> (Reason, Instant) {
        self.end.cancelled().await;
        // `why` is always set before `end` is cancelled.
        self.why
            .get()
            .copied()
            .unwrap_or((Reason::drain, Instant::now()))
    }

    /// Whether the end was asked.
    pub fn is_ended(&self) -> bool {
        self.end.is_cancelled()
    }

    /// Marks the stream long-lived: a drain may end it early, spread over
    /// its window.
    pub fn set_long_lived(&self) {
        self.long_lived.store(true, Ordering::Relaxed);
    }

    /// Whether the stream was marked long-lived.
    pub fn is_long_lived(&self) -> bool {
        self.long_lived.load(Ordering::Relaxed)
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
            grpc,
            end: CancellationToken::new(),
            why: OnceLock::new(),
            long_lived: AtomicBool::new(false),
        });
        s.streams.insert(key, ctl.clone());
        Ok(Registered {
            registry: self.clone(),
            key,
            ctl,
        })
    }

    /// Refuses new streams from now on and returns every open stream that
    /// has not been asked to end yet, oldest first.
    pub fn begin_terminating(&self) -> Vec<Arc<StreamCtl>> {
        let mut s = self.lock();
        s.terminating = true;
        let mut open: Vec<_> = s
            .streams
            .iter()
            .filter(|(_, c)| !c.is_ended())
            .map(|(k, c)| (*k, c.clone()))
            .collect();
        open.sort_by_key(|(k, _)| *k);
        open.into_iter().map(|(_, c)| c).collect()
    }

    /// The streams of connection `conn` not yet asked to end, oldest first.
    pub fn connection_streams(&self, conn: u64) -> Vec<Arc<StreamCtl>> {
        let mut open: Vec<_> = self
            .lock()
            .streams
            .iter()
            .filter(|(_, c)| c.conn == conn && !c.is_ended())
            .map(|(k, c)| (*k, c.clone()))
            .collect();
        open.sort_by_key(|(k, _)| *k);
        open.into_iter().map(|(_, c)| c).collect()
    }

    /// Streams open right now.
    pub fn len(&self) -> usize {
        self.lock().streams.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn terminating_refuses_new_streams_and_snapshots_the_open_ones() {
        let r = Arc::new(Registry::default());
        let a = r.register(1, true).expect("admitted");
        let b = r.register(2, false).expect("admitted");
        b.ctl.end(Reason::max_age);
        let snapshot = r.begin_terminating();
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

    #[tokio::test]
    async fn the_first_reason_wins() {
        let r = Arc::new(Registry::default());
        let s = r.register(7, true).expect("admitted");
        let _other = r.register(8, true).expect("admitted");
        let of_7 = r.connection_streams(7);
        assert_eq!(of_7.len(), 1, "only connection 7's streams");
        of_7[0].end(Reason::max_age);
        s.ctl.end(Reason::drain);
        assert_eq!(s.ctl.ended().await.0, Reason::max_age);
        assert!(
            r.connection_streams(7).is_empty(),
            "ended streams are not listed again"
        );
    }
}
