//! The stream guard the agent serves for one pod: the sidecar's guard
//! (`crate::guard`), with its listener bound inside the pod's network
//! namespace and its application connections made from inside it too.
//!
//! A pod opts in through its Envoy's node metadata, read from `/server_info`
//! like its identity: `DRAINSHIM_GUARD: "LISTEN=UPSTREAM"`, both addresses in
//! the pod (e.g. `127.0.0.1:15097=127.0.0.1:8080`); Envoy's inbound cluster
//! points at LISTEN. `--guard` gives the same for pods without the key.
//!
//! Each pod's guard is its own [`Guard`], with its own connection and stream
//! caps, metrics and drain: one pod's load or abuse hits that pod's caps,
//! never another pod's. The drain driver is made before the guard is known
//! (the metadata comes later), so it holds a [`PodGuardSlot`] that the guard
//! fills once bound.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::netns::Netns;
use crate::drain::StreamGuard;
use crate::guard::{Connect, Guard};
pub use crate::settings::GuardSpec;

/// The node metadata key a pod opts in with.
pub const METADATA_KEY: &str = "DRAINSHIM_GUARD";

/// Pending connections on a guard listener: bursts of Envoy's connects
/// (see [`crate::guard::LISTEN_BACKLOG`]), and during a hand-over the new
/// ones that wait here until the next agent accepts them.
pub const GUARD_BACKLOG: i32 = crate::guard::LISTEN_BACKLOG as i32;

/// What a pod's Envoy asks for: its metadata key, else the node default.
/// A malformed key is an error (logged per pod), not a silent default.
pub fn spec_for(
    metadata: Option<&str>,
    default: Option<GuardSpec>,
) -> Result<Option<GuardSpec>, String> {
    match metadata {
        Some(v) if !v.trim().is_empty() => v.parse().map(Some),
        _ => Ok(default),
    }
}

/// Connects from inside the pod: the guard's way to the pod's loopback.
#[derive(Clone, Debug)]
pub struct NetnsConnect {
    /// The pod's namespace.
    pub netns: Netns,
    /// Bound on the blocking connect, so a netns thread never lingers.
    pub timeout: Duration,
}

impl Connect for NetnsConnect {
    fn connect(
        &self,
        addr: SocketAddr,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<TcpStream>> + Send>>
    {
        let netns = self.netns.clone();
        let timeout = self.timeout;
        Box::pin(async move { netns.connect(addr, timeout).await })
    }
}

/// Binds `addr` inside the pod (SO_REUSEADDR and SO_REUSEPORT, [`GUARD_BACKLOG`]).
pub async fn bind_in(netns: &Netns, addr: SocketAddr) -> std::io::Result<TcpListener> {
    let std = netns
        .run(move || {
            let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
            socket.set_reuse_address(true)?;
            // A second agent binds it beside this one when there is no
            // hand-over socket (netns::TCP_MIGRATE_REQ).
            socket.set_reuse_port(true)?;
            socket.bind(&addr.into())?;
            socket.listen(GUARD_BACKLOG)?;
            socket.set_nonblocking(true)?;
            Ok(std::net::TcpListener::from(socket))
        })
        .await?;
    TcpListener::from_std(std)
}

/// A pod's guard once it serves.
#[derive(Clone, Debug)]
pub struct PodGuard {
    /// What it was made from (a changed metadata value is logged, not applied).
    pub spec: GuardSpec,
    /// The guard itself.
    pub guard: Guard,
    /// Cancelled to stop accepting (the listener went to the next agent).
    pub accepting: CancellationToken,
    /// Cancelled to end what is left at once and stop.
    pub shutdown: CancellationToken,
}

/// The pod's guard as the drain driver sees it: empty until the guard is
/// bound. A drain that starts before then has nothing to end here.
#[derive(Clone, Debug, Default)]
pub struct PodGuardSlot(Arc<RwLock<Option<PodGuard>>>);

impl PodGuardSlot {
    pub fn get(&self) -> Option<PodGuard> {
        self.0.read().ok().and_then(|g| g.clone())
    }

    pub fn set(&self, guard: PodGuard) {
        if let Ok(mut g) = self.0.write() {
            *g = Some(guard);
        }
    }

    fn with<T>(&self, f: impl FnOnce(&Guard) -> T) -> Option<T> {
        self.0.read().ok()?.as_ref().map(|g| f(&g.guard))
    }
}

impl StreamGuard for PodGuardSlot {
    fn goaway_all(&self) {
        self.with(|g| g.goaway_all());
    }

    fn terminate_all(&self, window: Duration) {
        self.with(|g| g.terminate_all(window));
    }

    fn terminate_within(&self, window: Duration, deadline: Duration) {
        self.with(|g| g.terminate_within(window, deadline));
    }

    fn end_config_push(&self, push: &crate::drain::PushDrain) {
        self.with(|g| g.end_config_push(push));
    }

    fn active_streams(&self) -> u64 {
        self.with(|g| g.active_streams()).unwrap_or(0)
    }

    fn terminated_by_drain(&self) -> u64 {
        self.with(|g| g.terminated_by_drain()).unwrap_or(0)
    }

    fn failed_total(&self) -> u64 {
        self.with(|g| g.failed_total()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_wins_over_the_node_default() {
        let d: GuardSpec = "127.0.0.1:1=127.0.0.1:2".parse().unwrap();
        let m: GuardSpec = "127.0.0.1:3=127.0.0.1:4".parse().unwrap();
        assert_eq!(spec_for(None, Some(d)), Ok(Some(d)));
        assert_eq!(spec_for(Some(""), Some(d)), Ok(Some(d)));
        assert_eq!(
            spec_for(Some("127.0.0.1:3=127.0.0.1:4"), Some(d)),
            Ok(Some(m))
        );
        assert_eq!(spec_for(None, None), Ok(None));
        assert!(spec_for(Some("nonsense"), Some(d)).is_err());
    }
}
