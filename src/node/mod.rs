//! `drainshim node`: the DaemonSet agent. One process per node reaches every
//! pod's Envoy by entering the pod's network namespace. It is a different way
//! of reaching Envoy, not a second implementation: each pod gets the same
//! drain driver, report, telemetry and metrics as a sidecar.
//!
//! Every `--scan-interval` the agent:
//! - lists Envoy processes in `--proc-root` and groups them by network
//!   namespace (one namespace = one pod; the node's own is skipped);
//! - for a new pod: pins its namespace fd, plants the preStop listener
//!   inside it (`--pod-listen-port`), starts its drain driver;
//! - asks each pod's Envoy `/server_info` (from inside the pod, on
//!   `127.0.0.1:--pod-admin-port`) for version and identity;
//! - retires pods whose namespace has no Envoy any more: listener closed,
//!   tasks cancelled, namespace fd released; their drain counters stay on
//!   `/metrics` for `--pod-retention` so the last drain is scraped.
//!
//! - reads the pod's own drain timers from the same node metadata
//!   (`DRAINSHIM_DRAIN_TIME`, ...; `timers`): valid ones govern its drain,
//!   invalid ones are named (log, `/status`, metric) and the agent's apply;
//! - for a pod that opts in (Envoy node metadata `DRAINSHIM_GUARD`, or
//!   `--guard`): binds its stream guard inside the pod and serves it; the
//!   pod's drain ends the guarded streams gracefully (`guard`).
//!
//! With `--handover-socket`, the agent takes every listener from the agent
//! it replaces and hands them to the one replacing it (`handover`).
//!
//! The agent's lifecycle (start, run, stop, hand-over) is in `agent`; the
//! scan in `scan`, its identify step in `identify`; each pod's preStop listener and guard binding in
//! `binding`; what they all work on (the pods, the settings, the registry)
//! in `shared`, which depends on none of them. The agent's own endpoints are
//! in `api`; a pod's listener in `pod`.

pub mod api;
pub mod guard;
pub mod handover;
pub mod metrics;
pub mod netns;
pub mod pod;
pub mod proc;
pub mod timers;

mod agent;
mod binding;
mod identify;
mod scan;
mod shared;

use std::net::SocketAddr;
use std::sync::Arc;

use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::metrics::PodLabels;
use self::pod::PodStatus;
use self::shared::Shared;
pub use crate::settings::NodeSettings;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot read this process's network namespace ({0}): is /proc mounted?")]
    OwnNetns(proc::ProcError),
    #[error("cannot enter network namespaces: {0}. drainshim node needs CAP_SYS_ADMIN (setns); see --help")]
    NoPrivilege(String),
    #[error("{0}")]
    Proc(#[from] proc::ProcError),
}

/// The running agent.
pub struct NodeAgent {
    /// What the scanner, the API and the pod listeners share.
    shared: Arc<Shared>,
    /// The bound `--listen` address.
    local: SocketAddr,
    /// Stops the scanner, the API and every pod.
    shutdown: CancellationToken,
    /// The scanner and the API server.
    tasks: TaskTracker,
    /// Cancelled once the listeners went to a new agent.
    handed_over: CancellationToken,
}

/// `GET /status` on the agent.
#[derive(Clone, Debug, Serialize)]
pub struct NodeStatus {
    /// Live pods, each with its listener, Envoy and drain status.
    pub pods: Vec<PodStatus>,
    /// Departed pods whose counters are still exported.
    pub departed: Vec<PodLabels>,
    /// Allowed to drain, besides loopback.
    pub host_addresses: Vec<String>,
    /// Scans done since start: a stuck scanner shows here.
    pub scans: u64,
    /// Tasks alive on the agent's runtime: what a soak watches for a leak.
    pub tasks: usize,
}

impl From<crate::node::NodeError> for crate::error::Error {
    fn from(e: crate::node::NodeError) -> Self {
        use crate::error::Error;
        match e {
            crate::node::NodeError::NoPrivilege(_) => Error::NoPermission(e.to_string()),
            e => Error::Unavailable(e.to_string()),
        }
    }
}
