//! The netns connector: sockets made inside a pod's network namespace.
//!
//! `setns(CLONE_NEWNET)` changes the namespace of the calling *thread*, so
//! every operation runs on a fresh std thread that enters the pod's namespace
//! through the namespace fd held open since discovery, creates its socket
//! there (socket2), and then ends: a thread that called setns is never reused
//! for host work. The socket keeps its namespace for life and is handed to
//! tokio. No `unsafe`: nix's `setns` takes an `AsFd`.

use std::fs::File;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use nix::sched::{setns, CloneFlags};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream};

use crate::envoy::Dial;

/// Pending connections on a pod's preStop listener; the kubelet sends few.
const LISTEN_BACKLOG: i32 = 64;

/// `net.ipv4.tcp_migrate_req`, per network namespace (Linux 5.14 and
/// later): when a listener of an SO_REUSEPORT group closes, the connections
/// in its accept queue (and those still in their handshake) move to another
/// listener of the group instead of being reset.
pub const TCP_MIGRATE_REQ: &str = "/proc/sys/net/ipv4/tcp_migrate_req";

/// An open handle on one network namespace. Holding the fd pins exactly that
/// namespace: a recycled pid can never send us into another pod.
#[derive(Clone, Debug)]
pub struct Netns {
    /// The `ns/net` file, open since discovery.
    file: Arc<File>,
    /// Its inode, the pod's key on this node.
    inode: u64,
    /// Where it was opened from, for error messages.
    path: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("open {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("{path} is network namespace {found}, not {expected}: the process changed under us")]
    Changed {
        path: PathBuf,
        expected: u64,
        found: u64,
    },
}

impl Netns {
    /// Opens `<proc>/<pid>/ns/net` and checks it is still namespace `inode`.
    pub fn open(path: &Path, inode: u64) -> Result<Self, NetnsError> {
        let open_err = |source| NetnsError::Open {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(open_err)?;
        let found = file.metadata().map_err(open_err)?.ino();
        if found != inode {
            return Err(NetnsError::Changed {
                path: path.to_path_buf(),
                expected: inode,
                found,
            });
        }
        Ok(Self {
            file: Arc::new(file),
            inode,
            path: path.to_path_buf(),
        })
    }

    pub fn inode(&self) -> u64 {
        self.inode
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on a new thread inside this namespace; the thread then ends.
    pub async fn run<T, F>(&self, f: F) -> io::Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> io::Result<T> + Send + 'static,
    {
        let file = self.file.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(format!("netns-{}", self.inode))
            .spawn(move || {
                let result = setns(&*file, CloneFlags::CLONE_NEWNET)
                    .map_err(|e| io::Error::other(format!("setns into the pod's netns: {e}")))
                    .and_then(|()| f());
                // The receiver may be gone (the caller timed out); nothing to do.
                let _ = tx.send(result);
            })?;
        rx.await
            .map_err(|_| io::Error::other("the netns thread ended without an answer"))?
    }

    /// Connects to `addr` from inside the namespace, within `timeout`.
    pub async fn connect(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        let std = self
            .run(move || {
                let socket =
                    Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
                socket.connect_timeout(&addr.into(), timeout)?;
                socket.set_nonblocking(true)?;
                Ok(std::net::TcpStream::from(socket))
            })
            .await?;
        TcpStream::from_std(std)
    }

    /// Binds a listener inside the namespace on all addresses at `port`:
    /// dual-stack `[::]` where the pod has IPv6, else `0.0.0.0`.
    pub async fn listen(&self, port: u16) -> io::Result<TcpListener> {
        let std = self
            .run(move || {
                let bind = |addr: SocketAddr| -> io::Result<Socket> {
                    let socket =
                        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
                    if addr.is_ipv6() {
                        socket.set_only_v6(false)?;
                    }
                    socket.set_reuse_address(true)?;
                    // Two agents side by side (a rolling update without
                    // --handover-socket) both bind it: see `TCP_MIGRATE_REQ`.
                    socket.set_reuse_port(true)?;
                    socket.bind(&addr.into())?;
                    socket.listen(LISTEN_BACKLOG)?;
                    Ok(socket)
                };
                let socket = match bind(SocketAddr::from(([0u16; 8], port))) {
                    Ok(s) => s,
                    // No IPv6 in this pod (or the port is taken on v6 only).
                    Err(_) => bind(SocketAddr::from(([0u8; 4], port)))?,
                };
                socket.set_nonblocking(true)?;
                Ok(std::net::TcpListener::from(socket))
            })
            .await?;
        TcpListener::from_std(std)
    }
}

impl Netns {
    /// Sets `net.ipv4.tcp_migrate_req` to 1 inside the namespace (the
    /// `/proc/sys/net` a thread opens is its own namespace's), so that an
    /// agent that closes its listeners while another agent listens beside it
    /// hands the queued connections over instead of resetting them. The
    /// error says why it could not, naming the kernel when it has no such
    /// setting.
    pub async fn enable_tcp_migrate_req(&self) -> Result<(), String> {
        let set = self
            .run(|| match std::fs::read_to_string(TCP_MIGRATE_REQ) {
                Ok(v) if v.trim() == "1" => Ok(()),
                Ok(_) => std::fs::write(TCP_MIGRATE_REQ, "1"),
                Err(e) => Err(e),
            })
            .await;
        match set {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(format!(
                "{TCP_MIGRATE_REQ} does not exist: kernel {} has no net.ipv4.tcp_migrate_req (Linux 5.14 and later have it)",
                nix::sys::utsname::uname()
                    .map(|u| u.release().to_string_lossy().into_owned())
                    .unwrap_or_else(|_| "(unknown release)".into())
            )),
            Err(e) => Err(format!("write 1 to {TCP_MIGRATE_REQ} inside the pod: {e}")),
        }
    }
}

/// Dials Envoy's admin API from inside a pod's network namespace; plugs into
/// `AdminClient::with_dial`.
#[derive(Clone, Debug)]
pub struct NetnsDial {
    /// The pod's namespace.
    pub netns: Netns,
    /// Bound on the blocking connect, so a netns thread never lingers.
    pub connect_timeout: Duration,
}

impl Dial for NetnsDial {
    fn dial(
        &self,
        authority: &str,
    ) -> Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send + 'static>> {
        let netns = self.netns.clone();
        let timeout = self.connect_timeout;
        // Inside a pod only literal addresses make sense: no resolver is entered.
        let addr = authority.parse::<SocketAddr>().map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{authority:?} is not an IP:port ({e})"),
            )
        });
        Box::pin(async move { netns.connect(addr?, timeout).await })
    }
}

/// The addresses of the host's own interfaces (the kubelet's side), read in
/// the agent's namespace, which is the node's (hostNetwork).
pub fn host_addresses() -> io::Result<Vec<IpAddr>> {
    let mut out: Vec<IpAddr> = nix::ifaddrs::getifaddrs()
        .map_err(io::Error::from)?
        .filter_map(|ifa| {
            let a = ifa.address?;
            if let Some(v4) = a.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_host_has_a_loopback_address() {
        let addrs = host_addresses().unwrap();
        assert!(addrs.iter().any(|a| a.is_loopback()), "{addrs:?}");
    }

    #[test]
    fn dial_needs_a_literal_address() {
        let ns = Netns::open(Path::new("/proc/self/ns/net"), {
            std::fs::metadata("/proc/self/ns/net").unwrap().ino()
        })
        .unwrap();
        let dial = NetnsDial {
            netns: ns,
            connect_timeout: Duration::from_secs(1),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = rt.block_on(dial.dial("localhost:15000")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
