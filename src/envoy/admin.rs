//! A typed client for Envoy's admin API over hyper.
//!
//! Every call opens its own connection and has a deadline, so a hung admin
//! can never stall the drain, and the client holds no keep-alive open on
//! Envoy. Errors name the endpoint that failed and why.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use http::{Method, StatusCode};
use tokio::net::TcpStream;

use crate::http::{Endpoint, UrlError};

use super::model::{
    self, ClusterStatus, DynamicListenerState, ListenerInfo, ListenerManagerStats, ServerInfo, Stat,
};

/// Opens the TCP connection to the admin address. Node mode supplies one that
/// connects from inside the pod's network namespace.
pub trait Dial: Send + Sync + 'static {
    fn dial(
        &self,
        authority: &str,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<TcpStream>> + Send + 'static>>;
}

/// Plain TCP from the current network namespace.
#[derive(Debug, Default)]
pub struct TcpDial;

// === impl TcpDial ===

impl Dial for TcpDial {
    fn dial(
        &self,
        authority: &str,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<TcpStream>> + Send + 'static>> {
        let authority = authority.to_string();
        Box::pin(async move { TcpStream::connect(authority).await })
    }
}

/// What went wrong talking to the admin API.
#[derive(Debug, thiserror::Error)]
pub enum ErrorKind {
    #[error("{0}")]
    Call(#[from] crate::http::CallError),
    #[error("status {0}: {1}")]
    Status(StatusCode, String),
    #[error("bad JSON: {0}")]
    Decode(#[from] serde_json::Error),
}

/// An admin call failed; says which one.
#[derive(Debug, thiserror::Error)]
#[error("envoy admin {authority}: {method} {path}: {kind}")]
pub struct AdminError {
    pub authority: String,
    pub method: Method,
    pub path: String,
    #[source]
    pub kind: ErrorKind,
}

/// The live counters of Envoy's inbound side, summed over its listeners.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// `listener.<in>.downstream_cx_active`
    pub cx_active: u64,
    /// `listener.<in>.downstream_cx_total`: lets a drain count connections opened meanwhile.
    pub cx_total: u64,
    /// `http.<in>.downstream_rq_active`: live streams, the thing that matters.
    pub rq_active: u64,
    /// `http.<in>.downstream_rq_total`
    pub rq_total: u64,
}

/// What Envoy has active on the fail-open path: the hosts it falls back to
/// when the stream guard is down, where no drain can end a stream gracefully.
///
/// The path is recognised by its shape, as the shipped bootstrap and the
/// Istio patch build it: a cluster whose priority 0 is on loopback only (the
/// guard) and that has hosts at a lower priority (the app on its own port).
/// Those hosts' live requests and connections are what bypasses the guard.
/// An outbound cluster's locality failover has remote hosts at priority 0,
/// so it never counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailOpen {
    /// `rq_active` summed over the fail-open hosts: streams the guard cannot see.
    pub requests: u64,
    /// `cx_active` summed over them: Envoy's connections to the app directly.
    pub connections: u64,
    /// Clusters of that shape: the paths that send to the guard first. None
    /// while a guard runs means Envoy sends nothing through it (under Istio:
    /// no routing object for the pod's app port).
    pub paths: u64,
}

// === impl FailOpen ===

impl FailOpen {
    /// Sums the fail-open hosts of `clusters`.
    pub fn of(clusters: &[ClusterStatus]) -> Self {
        let mut f = Self::default();
        for c in clusters {
            let mut guards = c.hosts.iter().filter(|h| h.priority == 0).peekable();
            let guarded =
                guards.peek().is_some() && guards.all(|h| h.ip.is_some_and(|ip| ip.is_loopback()));
            if !guarded || c.hosts.iter().all(|h| h.priority == 0) {
                continue;
            }
            f.paths += 1;
            for h in c.hosts.iter().filter(|h| h.priority > 0) {
                f.requests += h.rq_active;
                f.connections += h.cx_active;
            }
        }
        f
    }
}

/// Which stats scopes are inbound, resolved from the listener config.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InboundScope {
    pub listeners: Vec<String>,
    pub http: Vec<String>,
    /// No listener is marked INBOUND, so every listener is counted and drained.
    pub all_listeners: bool,
}

// === impl InboundScope ===

impl InboundScope {
    /// Chooses the INBOUND listeners; without any, falls back to all of them
    /// (Envoy's `inboundonly` would then drain nothing).
    pub fn from_listeners(ls: &[ListenerInfo]) -> Self {
        let inbound: Vec<&ListenerInfo> = ls
            .iter()
            .filter(|l| l.direction == TrafficDirection::Inbound)
            .collect();
        let all_listeners = inbound.is_empty();
        let chosen: Vec<&ListenerInfo> = if all_listeners {
            ls.iter().collect()
        } else {
            inbound
        };
        let mut listeners: Vec<String> = chosen.iter().map(|l| l.stat_prefix.clone()).collect();
        let mut http: Vec<String> = chosen
            .iter()
            .flat_map(|l| l.http_stat_prefixes.iter().cloned())
            .collect();
        listeners.sort();
        listeners.dedup();
        http.sort();
        http.dedup();
        Self {
            listeners,
            http,
            all_listeners,
        }
    }

    /// An exact RE2 filter for `/stats`, so Envoy sends only the four counters
    /// we need per scope (never per-worker or admin ones).
    pub fn stats_filter(&self) -> String {
        let alt = |v: &[String]| {
            v.iter()
                .map(|s| regex::escape(s))
                .collect::<Vec<_>>()
                .join("|")
        };
        let mut parts = Vec::new();
        if !self.listeners.is_empty() {
            parts.push(format!(
                r"listener\.({})\.downstream_cx_(active|total)",
                alt(&self.listeners)
            ));
        }
        if !self.http.is_empty() {
            parts.push(format!(
                r"http\.({})\.downstream_rq_(active|total)",
                alt(&self.http)
            ));
        }
        if parts.is_empty() {
            // Matches nothing: there is no inbound listener to count.
            return "^$".to_string();
        }
        format!("^({})$", parts.join("|"))
    }

    /// Sums the stats returned for `stats_filter()`.
    pub fn sum(&self, stats: &[Stat]) -> Counts {
        let mut c = Counts::default();
        for s in stats {
            let Some((scope, rest)) = s.name.split_once('.') else {
                continue;
            };
            let owned = |list: &[String], suffix: &str| {
                rest.strip_suffix(suffix)
                    .is_some_and(|p| list.iter().any(|l| l == p))
            };
            match scope {
                "listener" if owned(&self.listeners, ".downstream_cx_active") => {
                    c.cx_active += s.value
                }
                "listener" if owned(&self.listeners, ".downstream_cx_total") => {
                    c.cx_total += s.value
                }
                "http" if owned(&self.http, ".downstream_rq_active") => c.rq_active += s.value,
                "http" if owned(&self.http, ".downstream_rq_total") => c.rq_total += s.value,
                _ => {}
            }
        }
        c
    }
}

/// The admin client. Cheap to clone.
#[derive(Clone)]
pub struct AdminClient {
    authority: String,
    timeout: Duration,
    dial: Arc<dyn Dial>,
}

// === impl AdminClient ===

impl fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminClient")
            .field("authority", &self.authority)
            .field("timeout", &self.timeout)
            .finish()
    }
}

// === impl AdminClient ===

impl AdminClient {
    /// Parses `http://host:port`; every call then has `timeout` to finish.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, UrlError> {
        Self::with_dial(url, timeout, Arc::new(TcpDial))
    }

    /// Like [`AdminClient::new`], with connections opened by `dial`.
    pub fn with_dial(url: &str, timeout: Duration, dial: Arc<dyn Dial>) -> Result<Self, UrlError> {
        let endpoint: Endpoint = url.parse()?;
        Ok(Self::at(endpoint.without_prefix()?, timeout, dial))
    }

    /// A client for an already checked endpoint (its prefix is ignored: the
    /// admin API's paths are fixed).
    pub fn at(endpoint: Endpoint, timeout: Duration, dial: Arc<dyn Dial>) -> Self {
        Self {
            authority: endpoint.authority().to_string(),
            timeout,
            dial,
        }
    }

    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// `GET /server_info`.
    pub async fn server_info(&self) -> Result<ServerInfo, AdminError> {
        self.get_json("/server_info").await
    }

    /// `GET /stats?format=json&filter=<re2>`.
    pub async fn stats(&self, filter: &str) -> Result<Vec<Stat>, AdminError> {
        let path = format!(
            "/stats?format=json&filter={}",
            crate::http::encode_query(filter)
        );
        let body = self.call(Method::GET, &path).await?;
        model::parse_stats(&body).map_err(|e| self.err(Method::GET, &path, e.into()))
    }

    /// Static and dynamic listeners, from `/config_dump`.
    pub async fn listeners(&self) -> Result<Vec<ListenerInfo>, AdminError> {
        let mut all = Vec::new();
        for resource in ["static_listeners", "dynamic_listeners"] {
            let path = format!("/config_dump?resource={resource}");
            let body = self.call(Method::GET, &path).await?;
            let mut ls = model::parse_listeners(&body)
                .map_err(|e| self.err(Method::GET, &path, e.into()))?;
            all.append(&mut ls);
        }
        Ok(all)
    }

    /// `GET /listeners?format=json`: each listener's name and bound address.
    pub async fn bound_listeners(&self) -> Result<Vec<(String, std::net::SocketAddr)>, AdminError> {
        let path = "/listeners?format=json";
        let body = self.call(Method::GET, path).await?;
        model::parse_bound_listeners(&body).map_err(|e| self.err(Method::GET, path, e.into()))
    }

    /// Resolves which listeners are inbound, from their config.
    pub async fn inbound_scope(&self) -> Result<InboundScope, AdminError> {
        Ok(InboundScope::from_listeners(&self.listeners().await?))
    }

    pub async fn counts(&self, scope: &InboundScope) -> Result<Counts, AdminError> {
        Ok(scope.sum(&self.stats(&scope.stats_filter()).await?))
    }

    /// `GET /clusters?format=json`: every upstream host with its priority
    /// and live counts.
    pub async fn clusters(&self) -> Result<Vec<ClusterStatus>, AdminError> {
        let path = "/clusters?format=json";
        let body = self.call(Method::GET, path).await?;
        model::parse_clusters(&body).map_err(|e| self.err(Method::GET, path, e.into()))
    }

    /// What is active on the fail-open path (see [`FailOpen`]).
    pub async fn failopen(&self) -> Result<FailOpen, AdminError> {
        Ok(FailOpen::of(&self.clusters().await?))
    }

    /// `listener_manager.listener_stopped`: listeners Envoy has stopped
    /// (`/drain_listeners`, at once or after a graceful drain). A stopped
    /// listener is closed for good; `/listeners` and
    /// `listener_manager.total_listeners_active` still count it (Envoy 1.40),
    /// so this counter is the only trace.
    pub async fn listeners_stopped(&self) -> Result<u64, AdminError> {
        const NAME: &str = "listener_manager.listener_stopped";
        let stats = self.stats(r"^listener_manager\.listener_stopped$").await?;
        Ok(stats.iter().find(|s| s.name == NAME).map_or(0, |s| s.value))
    }

    /// The `listener_manager` counters and gauges of listener updates,
    /// drains and stops, in one `/stats` call (see [`ListenerManagerStats`]).
    pub async fn listener_manager(&self) -> Result<ListenerManagerStats, AdminError> {
        let stats = self.stats(ListenerManagerStats::FILTER).await?;
        Ok(ListenerManagerStats::from_stats(&stats))
    }

    /// `GET /config_dump?resource=dynamic_listeners`: each LDS listener's
    /// version, last update and whether an older one of it drains.
    pub async fn dynamic_listener_states(&self) -> Result<Vec<DynamicListenerState>, AdminError> {
        let path = "/config_dump?resource=dynamic_listeners";
        let body = self.call(Method::GET, path).await?;
        model::parse_dynamic_listener_states(&body)
            .map_err(|e| self.err(Method::GET, path, e.into()))
    }

    /// `POST /healthcheck/fail`: `/ready` answers 503 from now on.
    pub async fn healthcheck_fail(&self) -> Result<(), AdminError> {
        self.call(Method::POST, "/healthcheck/fail").await.map(drop)
    }

    /// `POST /healthcheck/ok`: undoes `healthcheck_fail`.
    pub async fn healthcheck_ok(&self) -> Result<(), AdminError> {
        self.call(Method::POST, "/healthcheck/ok").await.map(drop)
    }

    /// `POST /drain_listeners[?graceful][&inboundonly]`.
    pub async fn drain_listeners(
        &self,
        graceful: bool,
        inbound_only: bool,
    ) -> Result<(), AdminError> {
        let mut q = Vec::new();
        if graceful {
            q.push("graceful");
        }
        if inbound_only {
            q.push("inboundonly");
        }
        let path = if q.is_empty() {
            "/drain_listeners".to_string()
        } else {
            format!("/drain_listeners?{}", q.join("&"))
        };
        self.call(Method::POST, &path).await.map(drop)
    }

    /// `GET /ready`: true when Envoy is LIVE and its health check passes.
    pub async fn ready(&self) -> Result<bool, AdminError> {
        match self.call(Method::GET, "/ready").await {
            Ok(_) => Ok(true),
            Err(AdminError {
                kind: ErrorKind::Status(StatusCode::SERVICE_UNAVAILABLE, _),
                ..
            }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, AdminError> {
        let body = self.call(Method::GET, path).await?;
        serde_json::from_slice(&body).map_err(|e| self.err(Method::GET, path, e.into()))
    }

    /// One request on a fresh connection, bounded by the client's timeout.
    async fn call(&self, method: Method, path: &str) -> Result<Bytes, AdminError> {
        let connect = self.dial.dial(&self.authority);
        let answer =
            crate::http::call(connect, &self.authority, method.clone(), path, self.timeout).await;
        match answer {
            Ok((status, body)) if status.is_success() => Ok(body),
            Ok((status, body)) => {
                let text = String::from_utf8_lossy(&body).trim().to_string();
                Err(self.err(method, path, ErrorKind::Status(status, text)))
            }
            Err(e) => Err(self.err(method, path, e.into())),
        }
    }

    fn err(&self, method: Method, path: &str, kind: ErrorKind) -> AdminError {
        AdminError {
            authority: self.authority.clone(),
            method,
            path: path.to_string(),
            kind,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        let t = Duration::from_secs(1);
        assert!(AdminClient::new("http://127.0.0.1:15000", t).is_ok());
        assert!(AdminClient::new("http://127.0.0.1:15000/", t).is_ok());
        for bad in [
            "127.0.0.1:15000",
            "https://x:1",
            "http://x",
            "http://x:1/stats",
            "::",
        ] {
            let e = AdminClient::new(bad, t).unwrap_err().to_string();
            assert!(e.contains("invalid URL"), "{bad}: {e}");
        }
    }

    #[test]
    fn failopen_counts_the_hosts_behind_a_loopback_guard_only() {
        // Envoy 1.40's JSON: zeros and priority 0 left out, uint64 as strings.
        let body = br#"{"cluster_statuses":[
          {"name":"app","host_statuses":[
            {"address":{"socket_address":{"address":"127.0.0.1","port_value":15097}},
             "stats":[{"name":"cx_active","type":"GAUGE","value":"2"},{"name":"rq_active","type":"GAUGE","value":"9"}]},
            {"address":{"socket_address":{"address":"127.0.0.1","port_value":8080}},"priority":1,
             "stats":[{"name":"cx_total","value":"7"},{"name":"cx_active","type":"GAUGE","value":"1"},{"name":"rq_active","type":"GAUGE","value":"3"}]}]},
          {"name":"outbound|80||b","host_statuses":[
            {"address":{"socket_address":{"address":"10.0.0.5","port_value":80}},
             "stats":[{"name":"rq_active","type":"GAUGE","value":"4"}]},
            {"address":{"socket_address":{"address":"10.1.0.5","port_value":80}},"priority":1,
             "stats":[{"name":"rq_active","type":"GAUGE","value":"5"}]}]},
          {"name":"inbound|9090||","host_statuses":[
            {"address":{"socket_address":{"address":"127.0.0.1","port_value":9090}},
             "stats":[{"name":"rq_active","type":"GAUGE","value":"6"}]}]},
          {"name":"pipe","host_statuses":[
            {"address":{"pipe":{"path":"/sock"}},"stats":[]},
            {"address":{"socket_address":{"address":"127.0.0.1","port_value":1}},"priority":1,
             "stats":[{"name":"rq_active","type":"GAUGE","value":"8"}]}]}
        ]}"#;
        let clusters = model::parse_clusters(body).unwrap();
        assert_eq!(clusters.len(), 4);
        assert_eq!(clusters[0].hosts[1].priority, 1);
        assert_eq!(
            FailOpen::of(&clusters),
            FailOpen {
                requests: 3,
                connections: 1,
                paths: 1
            }
        );
        assert_eq!(FailOpen::of(&[]), FailOpen::default());
        assert!(model::parse_clusters(b"[1]").is_err());
    }

    #[test]
    fn scope_sums_only_its_own_counters() {
        let scope = InboundScope {
            listeners: vec!["127.0.0.1_8080".into()],
            http: vec!["in".into()],
            all_listeners: false,
        };
        let stat = |n: &str, v| Stat {
            name: n.into(),
            value: v,
        };
        let c = scope.sum(&[
            stat("listener.127.0.0.1_8080.downstream_cx_active", 2),
            stat("listener.127.0.0.1_8080.worker_0.downstream_cx_active", 2),
            stat("listener.admin.downstream_cx_active", 7),
            stat("http.in.downstream_rq_active", 5),
            stat("http.in.downstream_rq_total", 9),
            stat("http.admin.downstream_rq_active", 1),
        ]);
        assert_eq!(
            c,
            Counts {
                cx_active: 2,
                cx_total: 0,
                rq_active: 5,
                rq_total: 9
            }
        );
        let f = regex::Regex::new(&scope.stats_filter()).unwrap();
        assert!(f.is_match("listener.127.0.0.1_8080.downstream_cx_active"));
        assert!(!f.is_match("listener.127.0.0.1_8080.worker_0.downstream_cx_active"));
        assert!(!f.is_match("listener.127x0x0x1_8080.downstream_cx_active"));
    }
}
