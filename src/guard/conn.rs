//! What every connection driver shares: who a connection is, and the
//! count of streams it carries (which its lifecycle waits on).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Who a connection is, for the drivers and the logs.
#[derive(Clone, Copy, Debug)]
pub struct ConnInfo {
    /// Unique per guard; ties streams to their connection.
    pub id: u64,
    /// The client (Envoy, usually), for logs.
    pub peer: SocketAddr,
    /// When the connection was accepted: the age and header timeouts count from here.
    pub accepted_at: Instant,
}

/// The streams one connection carries. The connection's lifecycle only
/// cares whether there are none (idle timer, close once quiet), so only the
/// last stream's end wakes the connection task: a busy connection is not
/// woken once per finished request.
#[derive(Debug, Default)]
pub struct StreamCount {
    /// Streams open right now.
    open: AtomicUsize,
    /// Notified when `open` drops to zero.
    zero: Notify,
}

impl StreamCount {
    /// Streams open right now.
    pub fn get(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Counts one more stream; the returned guard counts it out on drop.
    pub fn enter(self: &Arc<Self>) -> CountGuard {
        self.open.fetch_add(1, Ordering::AcqRel);
        CountGuard(self.clone())
    }

    /// Resolves when the count may have dropped to zero since the last call
    /// (spurious wake-ups are possible: check [`StreamCount::get`]).
    pub async fn emptied(&self) {
        self.zero.notified().await;
    }
}

/// Decrements the connection's stream count when a stream task ends.
pub struct CountGuard(Arc<StreamCount>);

impl Drop for CountGuard {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            // A permit is stored if the connection task is not waiting now.
            self.0.zero.notify_one();
        }
    }
}
