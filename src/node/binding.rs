//! Per-pod listeners and guards: the preStop listener and the stream
//! guard planted inside each pod (or taken from the old agent), and their
//! retirement after a hand-over or at stop.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use super::guard::{self, GuardSpec, NetnsConnect, PodGuard};
use super::handover::{self, ListenerKind};
use super::netns::Netns;
use super::pod::{GuardState, ListenerState, Pod, PodEndpoint};
use super::shared::Shared;
use crate::drain::{Phase, StreamGuard};

/// After the guards' window: time for the last endings to flush and the
/// connections to close before what is left is ended at once.
const GUARD_STOP_SLACK: Duration = Duration::from_secs(5);

/// A listening socket received from the old agent, served here.
pub(super) fn adopt(fd: OwnedFd) -> std::io::Result<TcpListener> {
    let std = std::net::TcpListener::from(fd);
    std.set_nonblocking(true)?;
    TcpListener::from_std(std)
}

/// Pending connections on the agent's own API (probes, scrapes, preStops
/// through the node port).
const API_BACKLOG: i32 = 1024;

/// Binds the agent's API on the host: SO_REUSEPORT, so that a second agent
/// started beside this one without a hand-over socket binds it too.
pub(super) fn bind_api(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    socket.listen(API_BACKLOG)?;
    socket.set_nonblocking(true)?;
    TcpListener::from_std(std::net::TcpListener::from(socket))
}

impl Shared {
    /// Serves a freshly bound listener for `pod`, or records why binding failed.
    pub(super) fn serve_pod(
        &self,
        pod: &mut Pod,
        bound: std::io::Result<TcpListener>,
    ) -> ListenerState {
        let listener = match bound {
            Ok(l) => l,
            Err(e) => {
                let msg = format!(
                    "bind port {} inside the pod: {e}",
                    self.settings.pod_listen_port
                );
                if pod.listener.state != ListenerState::Failed(msg.clone()) {
                    tracing::warn!(namespace = %pod.labels.namespace, pod = %pod.labels.pod,
                        error = %msg, "no preStop listener for this pod (retrying each scan)");
                }
                return ListenerState::Failed(msg);
            }
        };
        let addr = match listener.local_addr() {
            Ok(a) => a,
            Err(e) => return ListenerState::Failed(format!("listener address: {e}")),
        };
        pod.listener.fd = listener.as_fd().try_clone_to_owned().ok();
        let endpoint = Arc::new(PodEndpoint {
            drain: pod.drain.clone(),
            host: self.host.clone(),
            name: pod.name.clone(),
        });
        self.tasks.spawn(crate::http::server::serve_fn_until(
            listener,
            pod.listener.stop.clone(),
            pod.cancel.clone(),
            move |peer, req| {
                let endpoint = endpoint.clone();
                async move { endpoint.handle(peer, req).await }
            },
        ));
        ListenerState::Listening(addr)
    }

    /// The pod's preStop listener: the one handed over, else a new one.
    pub(super) async fn pod_listener(&self, ns: &Netns, port: u16) -> std::io::Result<TcpListener> {
        let offered = self
            .inherited
            .lock()
            .ok()
            .and_then(|mut o| handover::claim(&mut o, ListenerKind::Prestop, ns.inode()));
        match offered.filter(|o| o.addr.port() == port) {
            Some(o) => adopt(o.fd),
            None => ns.listen(port).await,
        }
    }

    /// The pod's guard listener: the one handed over, else a new one.
    pub(super) async fn guard_listener(
        &self,
        ns: &Netns,
        spec: GuardSpec,
    ) -> std::io::Result<TcpListener> {
        let offered = self
            .inherited
            .lock()
            .ok()
            .and_then(|mut o| handover::claim(&mut o, ListenerKind::Guard, ns.inode()));
        match offered.filter(|o| o.addr == spec.listen) {
            Some(o) => adopt(o.fd),
            None => guard::bind_in(ns, spec.listen).await,
        }
    }

    /// Serves `pod`'s guard on a freshly bound (or inherited) listener, or
    /// records why it could not be bound.
    pub(super) fn start_guard(
        &self,
        pod: &mut Pod,
        spec: GuardSpec,
        bound: std::io::Result<TcpListener>,
    ) {
        let listener = match bound {
            Ok(l) => l,
            Err(e) => {
                let msg = format!("bind {} inside the pod: {e}", spec.listen);
                if pod.guard.state != GuardState::Failed(msg.clone()) {
                    tracing::warn!(namespace = %pod.labels.namespace, pod = %pod.labels.pod,
                        error = %msg, "no stream guard for this pod (retrying each scan)");
                }
                pod.guard.state = GuardState::Failed(msg);
                return;
            }
        };
        let mut config = self.settings.guard.template.clone();
        config.upstream = spec.upstream;
        let connector = NetnsConnect {
            netns: pod.netns.clone(),
            timeout: config.limits.upstream_connect_timeout,
        };
        let g = crate::guard::Guard::with_connector(
            config,
            pod.metrics.clone(),
            Some(Arc::new(connector)),
        );
        let accepting = pod.cancel.child_token();
        let shutdown = pod.cancel.child_token();
        pod.guard.fd = listener.as_fd().try_clone_to_owned().ok();
        let serving = g.clone();
        let (a, sd) = (accepting.clone(), shutdown.clone());
        self.tasks
            .spawn(async move { serving.serve_until(listener, a, sd).await });
        pod.guard.slot.set(PodGuard {
            spec,
            guard: g,
            accepting,
            shutdown,
        });
        tracing::info!(namespace = %pod.labels.namespace, pod = %pod.labels.pod,
            guard = %spec, "stream guard serving inside the pod");
        pod.guard.state = GuardState::Serving {
            listen: spec.listen,
            upstream: spec.upstream,
        };
    }

    /// After a hand-over: stop accepting everywhere (the new agent does),
    /// and end the guarded streams still carried here over the window.
    pub(super) fn retire_after_handover(self: &Arc<Self>) {
        self.api_stop.cancel();
        let guards: Vec<PodGuard> = self
            .pods
            .lock()
            .map(|p| {
                p.values()
                    .inspect(|p| {
                        // A preStop in flight here is answered here.
                        if p.drain.status().phase == Phase::Serving {
                            p.listener.stop.cancel();
                        }
                    })
                    .filter_map(|p| p.guard.slot.get())
                    .collect()
            })
            .unwrap_or_default();
        let streams: u64 = guards.iter().map(|g| g.guard.active_streams()).sum();
        tracing::info!(guards = guards.len(), streams,
            window = ?self.settings.guard.handover_window,
            "handed over: accepting nothing more; ending the streams still here gracefully over the window");
        let window = self.settings.guard.handover_window;
        for g in &guards {
            g.accepting.cancel();
            g.guard.goaway_all();
            g.guard.hand_off(window);
        }
        // The new agent holds the listening sockets now.
        self.close_guard_listeners();
    }

    /// Stops every pod's preStop listener accepting (its socket closes; the
    /// requests it accepted are still answered).
    pub(super) fn stop_prestop_listeners(&self) {
        if let Ok(mut pods) = self.pods.lock() {
            for p in pods.values_mut() {
                p.listener.stop.cancel();
                p.listener.fd = None;
            }
        }
    }

    /// Ends every pod's guarded streams gracefully over the hand-over window
    /// (already begun after a hand-over) and waits, bounded, until no
    /// connection is left; then stops the guards.
    pub(super) async fn end_guards(&self, stop_accepting: bool) {
        let guards: Vec<PodGuard> = self
            .pods
            .lock()
            .map(|p| p.values().filter_map(|p| p.guard.slot.get()).collect())
            .unwrap_or_default();
        if guards.is_empty() {
            return;
        }
        let window = self.settings.guard.handover_window;
        let mut stopped = false;
        for g in &guards {
            if stop_accepting && !g.accepting.is_cancelled() {
                g.accepting.cancel();
                g.guard.goaway_all();
                g.guard.hand_off(window);
                stopped = true;
            }
        }
        if stopped {
            // Nobody took the listeners: close them, so new connections are
            // refused (the shipped bootstrap then sends the calls to the app)
            // instead of queueing where nobody accepts them.
            self.close_guard_listeners();
        }
        // The window and the short calls' grace after it, then the close.
        let bound = guards
            .iter()
            .map(|g| g.guard.hand_off_deadline(window))
            .max()
            .unwrap_or(window)
            + GUARD_STOP_SLACK;
        let all_closed = async {
            loop {
                if guards.iter().all(|g| g.guard.active_connections() == 0) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        if tokio::time::timeout(bound, all_closed).await.is_err() {
            tracing::warn!(
                ?bound,
                "guard connections still open after the window; ending what is left now"
            );
        }
        for g in &guards {
            g.shutdown.cancel();
        }
    }

    /// Guard listeners handed over for a live pod that is not identified
    /// yet: nobody here accepts on them until a scan identifies the pod.
    pub(super) fn unserved_guard_listeners(&self) -> usize {
        let pods = match self.pods.lock() {
            Ok(p) => p,
            Err(_) => return 0,
        };
        self.inherited
            .lock()
            .map(|offers| {
                offers
                    .iter()
                    .filter(|o| o.kind == ListenerKind::Guard)
                    .filter(|o| pods.get(&o.netns).is_some_and(|p| p.envoy.state.is_err()))
                    .count()
            })
            .unwrap_or(0)
    }

    /// Drops this process's last descriptors of the guard listeners (the
    /// accept loops drop theirs once they stop accepting). Kept for a
    /// hand-over until then; afterwards the listening socket lives on in the
    /// next agent, or, with no next agent, closes, and new connections are
    /// refused instead of left in a backlog nobody accepts from.
    pub(super) fn close_guard_listeners(&self) {
        if let Ok(mut pods) = self.pods.lock() {
            for p in pods.values_mut() {
                p.guard.fd = None;
            }
        }
        if let Ok(mut offers) = self.inherited.lock() {
            offers.retain(|o| o.kind != ListenerKind::Guard);
        }
    }
}
