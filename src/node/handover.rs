//! The agent's own rolling update: listeners pass from the old agent to the
//! new one over a unix socket on a host path both mount
//! (`--handover-socket`), as Envoy's hot restart passes its listen sockets.
//! The very same listening sockets change hands, so their accept queues
//! never close and no connection is refused (docs/design.md, "Hand-over").
//!
//! The conversation, one JSON object per SOCK_SEQPACKET message (message
//! boundaries keep each descriptor with its description):
//!
//! | from | message | with |
//! |---|---|---|
//! | new | `{"op":"take","version":1}` | |
//! | old | `{"op":"listener","kind":"api"\|"prestop"\|"guard","netns":N,"addr":"ip:port"}` | the listening socket (SCM_RIGHTS) |
//! | old | `{"op":"done","count":N}` | |
//! | new | `{"op":"adopted"}`, once it accepts on them | |
//!
//! The old agent stops discovering pods before it lists its listeners (a pod
//! that appears from then on is the new agent's to bind), and resumes if the
//! new agent goes away before `adopted`. After `adopted` it stops accepting,
//! ends the streams it still carries over `--handover-window`, and exits at
//! SIGTERM. The new agent binds whatever it was not given (first agent on
//! the node, old agent crashed mid-way, a pod that appeared meanwhile), then
//! serves the socket itself for its own successor.
//!
//! Descriptors are sent and received with rustix's `sendmsg`/`recvmsg`
//! ancillary API, which yields `OwnedFd`s: no unsafe code.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};
use socket2::{Domain, SockAddr, Socket, Type};
use tokio_util::sync::CancellationToken;

/// The protocol version both sides speak.
const VERSION: u32 = 1;
/// Largest message: one listener's description is ~100 bytes.
const MAX_MESSAGE: usize = 4096;
/// Every read and write of the conversation is bounded by this: a peer that
/// hangs is treated as gone (the new agent then binds for itself).
pub const STEP_TIMEOUT: Duration = Duration::from_secs(5);
/// Most listeners one hand-over carries (one API, two per pod): a bound on
/// the receiving loop.
const MAX_LISTENERS: usize = 10_000;

/// What a handed-over listener is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ListenerKind {
    /// The agent's own `--listen`, on the node.
    Api,
    /// A pod's preStop listener.
    Prestop,
    /// A pod's stream guard listener.
    Guard,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Message {
    Take {
        version: u32,
    },
    Listener {
        kind: ListenerKind,
        /// The pod's network namespace inode (the node's for `api`).
        netns: u64,
        addr: SocketAddr,
    },
    Done {
        count: usize,
    },
    Adopted,
}

/// One listening socket, with what it is for.
#[derive(Debug)]
pub struct Offer {
    pub kind: ListenerKind,
    pub netns: u64,
    pub addr: SocketAddr,
    /// A duplicate of the listening socket's descriptor.
    pub fd: OwnedFd,
}

/// Why a hand-over did not complete (the caller then binds for itself).
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error("hand-over socket {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("hand-over socket {path}: {what}")]
    Protocol { path: PathBuf, what: String },
}

fn seqpacket() -> io::Result<Socket> {
    Socket::new(Domain::UNIX, Type::SEQPACKET, None)
}

fn send(sock: &Socket, msg: &Message, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(fd) = fd {
        fds = [fd];
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(io::Error::other("no room for the descriptor"));
        }
    }
    let sent = sendmsg(
        sock,
        &[IoSlice::new(&body)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent != body.len() {
        return Err(io::Error::other("short write of a seqpacket message"));
    }
    Ok(())
}

/// One message and the descriptor that came with it, if any. EOF is an error.
fn recv(sock: &Socket) -> io::Result<(Message, Option<OwnedFd>)> {
    let mut buf = [0u8; MAX_MESSAGE];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = recvmsg(
        sock,
        &mut [IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fd = None;
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            // More than one would be a protocol error; extra ones are closed.
            for f in fds {
                fd.get_or_insert(f);
            }
        }
    }
    if got.bytes == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let body = buf.get(..got.bytes).unwrap_or_default();
    let msg =
        serde_json::from_slice(body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok((msg, fd))
}

/// What a new agent received.
#[derive(Debug, Default)]
pub struct Inherited {
    /// The conversation, to answer `adopted` on.
    pub adoption: Adoption,
    /// Every listener received.
    pub offers: Vec<Offer>,
}

/// Takes the listener for (`kind`, `netns`) out of `offers`, if one was handed over.
pub fn claim(offers: &mut Vec<Offer>, kind: ListenerKind, netns: u64) -> Option<Offer> {
    let i = offers
        .iter()
        .position(|o| o.kind == kind && o.netns == netns)?;
    Some(offers.swap_remove(i))
}

/// The open conversation with the old agent. Dropping it without
/// [`Adoption::adopted`] tells the old agent the hand-over failed (it resumes).
#[derive(Debug, Default)]
pub struct Adoption(Option<Socket>);

impl Adoption {
    /// Whether a live old agent handed its listeners over.
    pub fn from_old_agent(&self) -> bool {
        self.0.is_some()
    }

    /// Tells the old agent its listeners are served here now: it stops
    /// accepting on them. Best effort: an old agent gone meanwhile is fine.
    pub async fn adopted(self) {
        let Some(conn) = self.0 else { return };
        let r = tokio::task::spawn_blocking(move || send(&conn, &Message::Adopted, None)).await;
        match r {
            Ok(Ok(())) => tracing::info!("hand-over: told the old agent to stop accepting"),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "hand-over: the old agent did not hear `adopted`")
            }
            Err(e) => tracing::warn!(error = %e, "hand-over: task failed"),
        }
    }
}

/// Asks the agent serving `path` for its listeners. No agent there (no
/// socket, or a stale one) is the first start on this node: an empty
/// result. A failure part-way keeps what was received.
pub async fn take(path: &Path) -> Inherited {
    let p = path.to_path_buf();
    let done = tokio::task::spawn_blocking(move || take_blocking(&p)).await;
    match done {
        Ok(Ok(i)) => i,
        Ok(Err((partial, e))) => {
            tracing::warn!(error = %e, received = partial.offers.len(),
                "hand-over incomplete; binding the rest here");
            partial
        }
        Err(e) => {
            tracing::warn!(error = %e, "hand-over task failed; binding everything here");
            Inherited::default()
        }
    }
}

fn take_blocking(path: &Path) -> Result<Inherited, (Inherited, HandoverError)> {
    let io_err = |source| HandoverError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut got = Inherited::default();
    let conn = match seqpacket().and_then(|s| {
        s.set_read_timeout(Some(STEP_TIMEOUT))?;
        s.set_write_timeout(Some(STEP_TIMEOUT))?;
        s.connect(&SockAddr::unix(path)?)?;
        Ok(s)
    }) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            tracing::info!(path = %path.display(), "hand-over: no agent to take over from; binding every listener");
            return Ok(got);
        }
        Err(e) => return Err((got, io_err(e))),
    };
    if let Err(e) = send(&conn, &Message::Take { version: VERSION }, None) {
        return Err((got, io_err(e)));
    }
    loop {
        let (msg, fd) = match recv(&conn) {
            Ok(m) => m,
            Err(e) => return Err((got, io_err(e))),
        };
        match (msg, fd) {
            (Message::Listener { kind, netns, addr }, Some(fd)) => {
                got.offers.push(Offer {
                    kind,
                    netns,
                    addr,
                    fd,
                });
                if got.offers.len() > MAX_LISTENERS {
                    let what = format!("more than {MAX_LISTENERS} listeners");
                    return Err((
                        got,
                        HandoverError::Protocol {
                            path: path.to_path_buf(),
                            what,
                        },
                    ));
                }
            }
            (Message::Done { count }, None) if count == got.offers.len() => {
                tracing::info!(
                    listeners = count,
                    "hand-over: received every listener from the old agent"
                );
                got.adoption = Adoption(Some(conn));
                return Ok(got);
            }
            (other, fd) => {
                let what = format!(
                    "unexpected {other:?} ({} descriptor)",
                    if fd.is_some() { "with a" } else { "without" }
                );
                return Err((
                    got,
                    HandoverError::Protocol {
                        path: path.to_path_buf(),
                        what,
                    },
                ));
            }
        }
    }
}

/// The old agent's side, given by the agent: what to hand over, and what to
/// do when it is over.
pub trait Donor: Send + Sync + 'static {
    /// Stops taking on pods and lists every listener (duplicated descriptors).
    fn offer(&self) -> impl std::future::Future<Output = Vec<Offer>> + Send;
    /// The new agent went away before adopting: carry on as before.
    fn resume(&self);
}

/// Binds the hand-over socket at `path`, replacing whatever was there (an
/// old agent that handed over already, or a stale file).
pub fn bind(path: &Path) -> Result<Socket, HandoverError> {
    let io_err = |source| HandoverError::Io {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(e)),
    }
    let s = seqpacket().map_err(io_err)?;
    s.bind(&SockAddr::unix(path).map_err(io_err)?)
        .map_err(io_err)?;
    s.listen(4).map_err(io_err)?;
    Ok(s)
}

/// How long one blocking accept waits before `serve` looks at `stop`
/// again: the cost of an idle hand-over socket is one wake-up per period.
const ACCEPT_POLL: Duration = Duration::from_secs(1);

/// Serves successors on `listener` until one adopts (returns true) or
/// `stop` is cancelled (false). One conversation at a time. Accepts block
/// on a pool thread for at most [`ACCEPT_POLL`] each (tokio cannot poll a
/// SOCK_SEQPACKET socket without unsafe code).
pub async fn serve<D: Donor>(listener: Socket, donor: &D, stop: CancellationToken) -> bool {
    let listener = std::sync::Arc::new(listener);
    if let Err(e) = listener
        .set_nonblocking(false)
        .and_then(|()| listener.set_read_timeout(Some(ACCEPT_POLL)))
    {
        tracing::warn!(error = %e, "hand-over socket: cannot set it up; no hand-over possible");
        stop.cancelled().await;
        return false;
    }
    loop {
        let l = listener.clone();
        let accepted = tokio::select! {
            _ = stop.cancelled() => return false,
            a = tokio::task::spawn_blocking(move || l.accept()) => a,
        };
        let conn = match accepted {
            Ok(Ok((conn, _))) => conn,
            Ok(Err(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "hand-over socket: accept failed");
                tokio::select! {
                    _ = stop.cancelled() => return false,
                    _ = tokio::time::sleep(ACCEPT_POLL) => continue,
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "hand-over socket: accept task failed");
                return false;
            }
        };
        if converse(conn, donor).await {
            return true;
        }
    }
}

/// One successor: `take`, every listener, `done`, then wait for `adopted`.
async fn converse<D: Donor>(conn: Socket, donor: &D) -> bool {
    let setup = conn
        .set_nonblocking(false)
        .and_then(|()| conn.set_read_timeout(Some(STEP_TIMEOUT)))
        .and_then(|()| conn.set_write_timeout(Some(STEP_TIMEOUT)));
    if let Err(e) = setup {
        tracing::warn!(error = %e, "hand-over: cannot set up the connection");
        return false;
    }
    let asked = tokio::task::spawn_blocking(move || recv(&conn).map(|m| (conn, m))).await;
    let conn = match asked {
        Ok(Ok((conn, (Message::Take { version }, None)))) if version == VERSION => conn,
        Ok(Ok((_, (m, _)))) => {
            tracing::warn!(message = ?m, "hand-over: unexpected first message; ignoring the caller");
            return false;
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "hand-over: no request from the caller");
            return false;
        }
        Err(_) => return false,
    };
    tracing::info!("hand-over: a new agent asks for the listeners; pausing discovery");
    let offers = donor.offer().await;
    let count = offers.len();
    let sent = tokio::task::spawn_blocking(move || -> io::Result<()> {
        for o in &offers {
            let msg = Message::Listener {
                kind: o.kind,
                netns: o.netns,
                addr: o.addr,
            };
            send(&conn, &msg, Some(o.fd.as_fd()))?;
        }
        send(&conn, &Message::Done { count }, None)?;
        // The new agent binds what it lacks and runs its first scan before
        // it answers: wait longer than one step for that.
        conn.set_read_timeout(Some(STEP_TIMEOUT * 12))?;
        match recv(&conn)? {
            (Message::Adopted, None) => Ok(()),
            (m, _) => Err(io::Error::other(format!("expected adopted, got {m:?}"))),
        }
    })
    .await;
    match sent {
        Ok(Ok(())) => {
            tracing::info!(
                listeners = count,
                "hand-over: the new agent serves every listener now"
            );
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "hand-over: the new agent went away before adopting; resuming");
            donor.resume();
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "hand-over task failed; resuming");
            donor.resume();
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    struct OneListener {
        listener: std::net::TcpListener,
        resumed: Arc<AtomicBool>,
    }

    impl Donor for OneListener {
        async fn offer(&self) -> Vec<Offer> {
            vec![Offer {
                kind: ListenerKind::Guard,
                netns: 7,
                addr: self.listener.local_addr().unwrap(),
                fd: self.listener.as_fd().try_clone_to_owned().unwrap(),
            }]
        }
        fn resume(&self) {
            self.resumed.store(true, Ordering::SeqCst);
        }
    }

    /// A real socket changes hands: a connection queued on it before the
    /// hand-over is accepted by the receiver, and the sender's copy can be
    /// dropped without refusing anything.
    #[tokio::test]
    async fn a_listening_socket_changes_hands_with_its_queue() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = tcp.local_addr().unwrap();
        let queued = std::net::TcpStream::connect(addr).unwrap();
        let donor = OneListener {
            listener: tcp,
            resumed: Arc::default(),
        };
        let sock = bind(&path).unwrap();
        let stop = CancellationToken::new();
        let server = async { serve(sock, &donor, stop.clone()).await };
        let client = async {
            let mut got = take(&path).await;
            assert!(got.adoption.from_old_agent());
            let offer = claim(&mut got.offers, ListenerKind::Guard, 7).expect("the guard listener");
            assert_eq!(offer.addr, addr);
            got.adoption.adopted().await;
            offer
        };
        let (adopted, offer) = tokio::join!(server, client);
        assert!(adopted);
        assert!(!donor.resumed.load(Ordering::SeqCst));
        drop(donor); // the old agent's copy goes
        let mine = std::net::TcpListener::from(offer.fd);
        let (_, peer) = mine.accept().expect("the queued connection");
        assert_eq!(peer, queued.local_addr().unwrap());
    }

    #[tokio::test]
    async fn no_agent_means_nothing_inherited() {
        let dir = tempfile::tempdir().unwrap();
        let got = take(&dir.path().join("absent.sock")).await;
        assert!(!got.adoption.from_old_agent());
        assert!(got.offers.is_empty());
        // A stale file with nobody behind it: the same.
        let stale = dir.path().join("stale.sock");
        drop(bind(&stale).unwrap());
        let got = take(&stale).await;
        assert!(!got.adoption.from_old_agent());
    }

    #[tokio::test]
    async fn a_successor_that_leaves_early_makes_the_donor_resume() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handover.sock");
        let donor = OneListener {
            listener: std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
            resumed: Arc::default(),
        };
        let sock = bind(&path).unwrap();
        let stop = CancellationToken::new();
        let server = async { serve(sock, &donor, stop.clone()).await };
        let client = async {
            let got = take(&path).await;
            assert_eq!(got.offers.len(), 1);
            drop(got); // crashed before `adopted`
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while !donor.resumed.load(Ordering::SeqCst) {
                assert!(tokio::time::Instant::now() < deadline, "never resumed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            stop.cancel();
        };
        let (adopted, ()) = tokio::join!(server, client);
        assert!(!adopted);
    }
}
