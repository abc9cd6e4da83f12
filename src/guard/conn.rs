//! Who a connection is, for every connection driver.

use std::net::SocketAddr;

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
