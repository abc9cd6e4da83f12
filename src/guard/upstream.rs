//! Connections to the application, one per downstream connection.
//!
//! `connect_tcp` opens them (through the node agent's [`Connect`] when
//! there is one). The frame relay holds its one HTTP/2 connection itself;
//! an HTTP/1.1 downstream connection gets one `H1Upstream` (the `h1`
//! wing's client to the application, `h1/app.rs`). Nothing is shared
//! across downstream connections, which keeps flow control end to end: one
//! slow client never stalls another's streams.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

/// Why the application could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream {addr}: connect: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("upstream {addr}: no connection after {after:?}")]
    ConnectTimeout { addr: SocketAddr, after: Duration },
    #[error("upstream {addr}: HTTP/1.1 handshake: {source}")]
    H1Handshake {
        addr: SocketAddr,
        #[source]
        source: hyper::Error,
    },
}

/// Opens TCP connections to the application. Without one the guard connects
/// from its own network namespace; the node agent's guards connect from
/// inside a pod's.
pub trait Connect: Send + Sync + std::fmt::Debug + 'static {
    fn connect(
        &self,
        addr: SocketAddr,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<TcpStream>> + Send>>;
}

/// How a guard reaches the application: `None` is a plain connect.
pub type Connector = Option<Arc<dyn Connect>>;

pub(crate) async fn connect_tcp(
    via: &Connector,
    addr: SocketAddr,
    after: Duration,
) -> Result<TcpStream, UpstreamError> {
    let connect = async {
        match via {
            Some(c) => c.connect(addr).await,
            None => TcpStream::connect(addr).await,
        }
    };
    let tcp = tokio::time::timeout(after, connect)
        .await
        .map_err(|_| UpstreamError::ConnectTimeout { addr, after })?
        .map_err(|source| UpstreamError::Connect { addr, source })?;
    // gRPC messages are small and latency matters more than packet count.
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}
