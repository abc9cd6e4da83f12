//! One pod on the node: its namespace handle, identity, drain driver,
//! telemetry, and the preStop listener planted inside its network namespace.
//!
//! The listener serves exactly two endpoints, for this pod alone:
//!
//! | endpoint | what |
//! |---|---|
//! | `GET /drain?wait=true` | drain this pod's Envoy, block until done, 200 with the report (preStop `httpGet`) |
//! | `GET /healthz` | the listener is alive |
//!
//! Everything else is 404: nothing more is exposed on the pod network.
//! Drains are accepted only from the node's own addresses (the kubelet) and
//! from loopback inside the pod; the handler only ever holds this pod's
//! drain handle, so a pod can drain nobody but itself.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use ipnet::IpNet;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::metrics::{PodLabels, PodSeries};
use super::netns::Netns;
use super::proc::ProcIdentity;
use super::timers::{PodDrain, TimersStatus};
use crate::control::telemetry::Telemetry;
use crate::control::{drain_response, may_mutate, parse_wait};
use crate::drain::{Status, Trigger};
use crate::envoy::{AdminClient, ServerInfo};
use crate::http::server::text;
use crate::metrics::{Metrics, ProxyLabels};

/// The node's own addresses, shared by every pod listener and refreshed at
/// each scan (an interface may come or go).
pub type HostAddrs = Arc<RwLock<Vec<IpNet>>>;

/// Where the pod's preStop listener stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ListenerState {
    /// Bound inside the pod at this address.
    Listening(SocketAddr),
    /// Binding failed (retried at each scan), e.g. a sidecar owns the port.
    Failed(String),
}

/// Where the pod's stream guard stands (`node::guard`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GuardState {
    /// The pod did not opt in (no `DRAINSHIM_GUARD`, no `--guard`), or its
    /// Envoy has not answered yet.
    Off,
    /// Serving at `listen`, forwarding to `upstream`, both inside the pod.
    Serving {
        listen: SocketAddr,
        upstream: SocketAddr,
    },
    /// Asked for but not serving (retried each scan): why.
    Failed(String),
}

/// A pod the agent manages. Dropping it (after `retire`) releases its
/// namespace fd and socket.
pub struct Pod {
    /// Discovery order: of two namespaces claiming one pod, the first keeps the name.
    pub seq: u64,
    /// The pinned network namespace.
    pub netns: Netns,
    /// What the process says of the pod (downward API env, cgroup UID).
    pub proc_identity: ProcIdentity,
    /// The labels its series carry, resolved in the documented order (docs/design.md).
    pub labels: PodLabels,
    /// The inventory entry, once Envoy has answered `/server_info`.
    pub proxy: Option<ProxyLabels>,
    /// Its Envoy: the processes, the admin client, the last state seen.
    pub envoy: PodEnvoy,
    /// This pod's drain, with its own timers; the listener and the agent
    /// API drive it.
    pub drain: PodDrain,
    /// This pod's series, written by the driver and telemetry.
    pub metrics: Metrics,
    /// Read at scrape time.
    pub telemetry: Arc<Telemetry>,
    /// The preStop listener.
    pub listener: PreStopListener,
    /// The stream guard and its listener.
    pub guard: GuardBinding,
    /// `net.ipv4.tcp_migrate_req` in its namespace: not tried yet (`None`),
    /// set, or why not (`--tcp-migrate-req`).
    pub tcp_migrate_req: Option<Result<(), String>>,
    /// Its Envoy's listener drains after config pushes: the last look.
    pub listener_drains: crate::control::listener_drains::Tracker,
    /// Cancels the listener, the guard and the report watcher.
    pub cancel: CancellationToken,
    /// Shared with the listener so its logs name the pod as identity improves.
    pub name: Arc<RwLock<PodLabels>>,
}

/// A pod's Envoy, as the agent knows it.
pub struct PodEnvoy {
    /// Envoy pids seen in the pod's namespace at the last scan, lowest first.
    pub pids: Vec<i32>,
    /// The admin client, dialling from inside the pod.
    pub admin: AdminClient,
    /// Envoy's server state at the last scan (LIVE, DRAINING...), or the error.
    pub state: Result<String, String>,
}

/// A pod's preStop listener.
pub struct PreStopListener {
    /// Its state, for /status.
    pub state: ListenerState,
    /// Its socket, kept to hand over to the next agent.
    pub fd: Option<std::os::fd::OwnedFd>,
    /// Stops it alone (a child of the pod's `cancel`).
    pub stop: CancellationToken,
}

/// A pod's stream guard and the listener it serves.
pub struct GuardBinding {
    /// The guard, as the drain driver sees it.
    pub slot: super::guard::PodGuardSlot,
    /// Its state, for /status.
    pub state: GuardState,
    /// Its listener's socket, kept to hand over to the next agent.
    pub fd: Option<std::os::fd::OwnedFd>,
}

impl Pod {
    /// Resolves identity in the documented order (docs/design.md): the process's downward-API env,
    /// Envoy node metadata, the Istio node id, the cgroup pod UID; and, when
    /// none says anything, the namespace inode, so series never collide.
    /// When Envoy does not answer (it is draining away, or gone), what it
    /// said before still names the pod.
    pub fn resolve(&mut self, info: Option<&ServerInfo>) {
        let fallback = || {
            self.proc_identity
                .uid
                .clone()
                .unwrap_or_else(|| format!("netns-{}", self.netns.inode()))
        };
        let (labels, proxy) = match info {
            Some(info) => {
                let id = &self.proc_identity;
                let mut p = crate::inventory::proxy_labels(
                    id.namespace.as_deref(),
                    id.name.as_deref(),
                    info,
                );
                if p.pod.is_empty() {
                    p.pod = fallback();
                }
                let labels = PodLabels {
                    namespace: p.namespace.clone(),
                    pod: p.pod.clone(),
                };
                (labels, Some(p))
            }
            None => (
                labels_without_envoy(&self.proc_identity, self.proxy.as_ref(), fallback),
                self.proxy.clone(),
            ),
        };
        if let Ok(mut name) = self.name.write() {
            *name = labels.clone();
        }
        self.labels = labels;
        self.proxy = proxy;
    }

    pub fn series(&self) -> PodSeries {
        PodSeries {
            labels: self.labels.clone(),
            metrics: self.metrics.clone(),
            proxy: self.proxy.clone(),
            live: true,
        }
    }

    pub fn status(&self) -> PodStatus {
        PodStatus {
            namespace: self.labels.namespace.clone(),
            pod: self.labels.pod.clone(),
            uid: self.proc_identity.uid.clone(),
            pids: self.envoy.pids.clone(),
            netns: self.netns.inode(),
            listener: self.listener.state.clone(),
            guard: self.guard.state.clone(),
            envoy: EnvoySummary {
                version: self.proxy.as_ref().map(|p| p.version.clone()),
                mesh_version: self.proxy.as_ref().map(|p| p.mesh_version.clone()),
                state: self.envoy.state.clone().ok(),
                error: self.envoy.state.clone().err(),
            },
            drain: self.drain.status(),
            timers: self.drain.timers().status(),
        }
    }

    /// Stops everything the pod runs; its metrics live on for the retention.
    pub fn retire(self) -> PodSeries {
        self.cancel.cancel();
        self.drain.abort();
        PodSeries {
            labels: self.labels,
            metrics: self.metrics,
            proxy: None,
            live: false,
        }
    }
}

/// A pod's labels while its Envoy does not answer: the process's env first,
/// then what Envoy said when it last answered, then `fallback`. Never a
/// worse name than the pod had: a drain ends with Envoy gone, and its
/// outcome must be reported under the pod's name.
fn labels_without_envoy(
    id: &ProcIdentity,
    known: Option<&ProxyLabels>,
    fallback: impl FnOnce() -> String,
) -> PodLabels {
    let namespace = id
        .namespace
        .clone()
        .or_else(|| known.map(|p| p.namespace.clone()))
        .unwrap_or_default();
    let pod = id
        .name
        .clone()
        .or_else(|| known.map(|p| p.pod.clone()).filter(|p| !p.is_empty()))
        .unwrap_or_else(fallback);
    PodLabels { namespace, pod }
}

/// One pod in `GET /status`.
#[derive(Clone, Debug, Serialize)]
pub struct PodStatus {
    /// The pod's namespace label.
    pub namespace: String,
    /// The pod's name label.
    pub pod: String,
    /// From the kubepods cgroup, when the process is in one.
    pub uid: Option<String>,
    /// Envoy processes in the pod.
    pub pids: Vec<i32>,
    /// The network namespace inode: the pod's key on this node.
    pub netns: u64,
    /// Whether its preStop can be served.
    pub listener: ListenerState,
    /// Its stream guard.
    pub guard: GuardState,
    /// What Envoy said at the last scan.
    pub envoy: EnvoySummary,
    /// The pod's drain, as the sidecar's `/status` shows it.
    pub drain: Status,
    /// The timers its drain runs (or will run) with, and why (`timers`).
    pub timers: TimersStatus,
}

#[derive(Clone, Debug, Serialize)]
pub struct EnvoySummary {
    /// Envoy's release; None until `/server_info` answered once.
    pub version: Option<String>,
    /// ISTIO_VERSION from node metadata, if any.
    pub mesh_version: Option<String>,
    /// LIVE, DRAINING, ... at the last scan.
    pub state: Option<String>,
    /// Why the last `/server_info` failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What the pod listener's handler needs: this pod's drain and nothing else.
#[derive(Clone)]
pub struct PodEndpoint {
    /// The only drain this listener can drive.
    pub drain: PodDrain,
    /// Who may drain besides loopback.
    pub host: HostAddrs,
    /// For log lines.
    pub name: Arc<RwLock<PodLabels>>,
}

/// What a request to a pod's own listener asks for: it serves the
/// kubelet's preStop (`GET /drain?wait=true`) and `/healthz`, nothing else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodListenerRoute {
    Healthz,
    /// Drain this pod and wait for the report (the caller is checked next).
    Drain,
    NotFound,
}

/// Decides what a request to a pod listener asks for. Never panics on input.
pub fn pod_listener_route(method: &Method, path: &str, query: &str) -> PodListenerRoute {
    match (method, path) {
        (&Method::GET | &Method::HEAD, "/healthz") => PodListenerRoute::Healthz,
        (&Method::GET, "/drain") if parse_wait(query) == Ok(true) => PodListenerRoute::Drain,
        _ => PodListenerRoute::NotFound,
    }
}

impl PodEndpoint {
    pub async fn handle(&self, peer: SocketAddr, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let query = req.uri().query().unwrap_or("");
        match pod_listener_route(req.method(), req.uri().path(), query) {
            PodListenerRoute::Healthz => text(StatusCode::OK, "ok\n"),
            PodListenerRoute::Drain => self.drain(peer).await,
            PodListenerRoute::NotFound => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }

    async fn drain(&self, peer: SocketAddr) -> Response<Full<Bytes>> {
        let name = self.name.read().map(|n| n.clone()).unwrap_or_default();
        let allowed = self.host.read().map(|h| h.clone()).unwrap_or_default();
        if !may_mutate(peer.ip(), &allowed) {
            tracing::warn!(%peer, namespace = %name.namespace, pod = %name.pod,
                "refused a drain request from an address that is not the node's");
            return text(
                StatusCode::FORBIDDEN,
                format!(
                    "drain refused: {} is not this node or loopback\n",
                    peer.ip()
                ),
            );
        }
        tracing::info!(%peer, namespace = %name.namespace, pod = %name.pod,
            "preStop: draining the pod (waiting for the report)");
        drain_response(&self.drain.start(), Trigger::Prestop, true).await
    }
}

/// Logs the pod's report with its identity once a drain is done, so the
/// outcome outlives the pod in the agent's log (preStop logs vanish).
pub fn watch_report(
    tasks: &TaskTracker,
    drain: PodDrain,
    name: Arc<RwLock<PodLabels>>,
    cancel: CancellationToken,
) {
    tasks.spawn(async move {
        tokio::select! {
            _ = cancel.cancelled() => {}
            report = drain.report() => {
                if let Some(r) = report {
                    let n = name.read().map(|n| n.clone()).unwrap_or_default();
                    let t = drain.timers();
                    tracing::info!(namespace = %n.namespace, pod = %n.pod, timers = ?t.source,
                        drain_time = ?t.timers.drain_time, parent_shutdown_time = ?t.timers.parent_shutdown_time,
                        report = %serde_json::to_string(&r).unwrap_or_default(), "pod drain done");
                }
            }
        }
    });
}

/// A host address as an allow-list entry.
pub fn host_net(ip: IpAddr) -> IpNet {
    IpNet::from(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(namespace: &str, pod: &str) -> ProxyLabels {
        ProxyLabels {
            namespace: namespace.into(),
            pod: pod.into(),
            version: "1.40.0".into(),
            mesh_version: String::new(),
        }
    }

    /// Found flaky in `node_pods`: a retired pod's last drain was exported
    /// as `netns-<inode>` because the scan after Envoy exited fell back.
    #[test]
    fn a_pod_keeps_the_name_envoy_gave_it_after_envoy_is_gone() {
        let none = ProcIdentity::default();
        let known = proxy("shop", "web-a");
        let labels = labels_without_envoy(&none, Some(&known), || "netns-1".into());
        assert_eq!(
            (labels.namespace.as_str(), labels.pod.as_str()),
            ("shop", "web-a")
        );
    }

    #[test]
    fn the_process_env_comes_first_and_the_fallback_last() {
        let env = ProcIdentity {
            namespace: Some("ns".into()),
            name: Some("env-pod".into()),
            uid: None,
        };
        let labels = labels_without_envoy(&env, Some(&proxy("shop", "web-a")), || "x".into());
        assert_eq!(
            (labels.namespace.as_str(), labels.pod.as_str()),
            ("ns", "env-pod")
        );
        let labels = labels_without_envoy(&ProcIdentity::default(), None, || "netns-1".into());
        assert_eq!(
            (labels.namespace.as_str(), labels.pod.as_str()),
            ("", "netns-1")
        );
        let nameless = proxy("shop", "");
        let labels =
            labels_without_envoy(&ProcIdentity::default(), Some(&nameless), || "uid".into());
        assert_eq!(
            (labels.namespace.as_str(), labels.pod.as_str()),
            ("shop", "uid")
        );
    }
}
