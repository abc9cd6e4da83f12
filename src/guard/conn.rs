//! What every connection driver shares: who a connection is, and the
//! count of streams it carries (which its lifecycle waits on).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;
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

/// Decrements the connection's stream count when a stream task ends.
pub struct CountGuard(pub Arc<watch::Sender<usize>>);

impl Drop for CountGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}
