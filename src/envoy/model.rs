//! Serde models of the admin JSON we read, kept small on purpose.
//!
//! envoy-types has the prost types but no serde, so these mirror only the
//! fields drainshim uses; enums and type URLs come from envoy-types.

use envoy_types::pb::envoy::admin::v3::server_info::State;
use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use prost::Name;
use serde::Deserialize;
use serde_json::Value;

/// `GET /server_info`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ServerInfo {
    /// `<sha>/1.40.0/Clean/RELEASE/BoringSSL`.
    pub version: String,
    /// LIVE | DRAINING | PRE_INITIALIZING | INITIALIZING.
    pub state: String,
    #[serde(default)]
    pub node: Node,
    #[serde(default)]
    pub command_line_options: CommandLineOptions,
    /// Proto3 JSON duration, e.g. "12s": how long this process has run. A
    /// drain watches it to notice Envoy restarting under it.
    #[serde(default)]
    pub uptime_current_epoch: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Node {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub cluster: String,
    /// A protobuf Struct: arbitrary JSON. Istio puts NAME, NAMESPACE, ISTIO_VERSION here.
    #[serde(default)]
    pub metadata: serde_json::Map<String, Value>,
}

/// Durations are proto3 JSON strings such as "5s".
#[derive(Clone, Debug, Default, Deserialize)]
pub struct CommandLineOptions {
    pub drain_time: Option<String>,
    pub parent_shutdown_time: Option<String>,
    pub drain_strategy: Option<String>,
}

// === impl ServerInfo ===

impl ServerInfo {
    /// The release, `1.40.0`, from the build string.
    pub fn release(&self) -> &str {
        parse_envoy_version(&self.version).unwrap_or("")
    }

    pub fn state(&self) -> Option<State> {
        State::from_str_name(&self.state)
    }

    /// How long this Envoy process has run, when it says.
    pub fn uptime(&self) -> Option<std::time::Duration> {
        self.uptime_current_epoch
            .as_deref()
            .and_then(parse_proto_duration)
    }

    /// `--drain-time-s`: how long a graceful listener drain takes before
    /// Envoy stops the listeners.
    pub fn drain_time(&self) -> Option<std::time::Duration> {
        self.command_line_options
            .drain_time
            .as_deref()
            .and_then(parse_proto_duration)
    }

    /// A string field of the node metadata, if present.
    pub fn metadata_str(&self, key: &str) -> Option<&str> {
        self.node.metadata.get(key).and_then(Value::as_str)
    }
}

/// A proto3 JSON duration: decimal seconds with an `s` suffix ("5s", "1.5s").
pub fn parse_proto_duration(s: &str) -> Option<std::time::Duration> {
    let secs: f64 = s.strip_suffix('s')?.parse().ok()?;
    std::time::Duration::try_from_secs_f64(secs).ok()
}

/// One stat from `GET /stats?format=json`: counters and gauges only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub name: String,
    pub value: u64,
}

/// Decodes `{"stats":[{"name":..,"value":..}, {"histograms":..}]}`, skipping histograms.
pub fn parse_stats(body: &[u8]) -> Result<Vec<Stat>, serde_json::Error> {
    #[derive(Deserialize)]
    struct Doc {
        #[serde(default)]
        stats: Vec<Value>,
    }
    let doc: Doc = serde_json::from_slice(body)?;
    Ok(doc
        .stats
        .into_iter()
        .filter_map(|v| {
            let name = v.get("name")?.as_str()?.to_string();
            let value = v.get("value")?.as_u64()?;
            Some(Stat { name, value })
        })
        .collect())
}

/// One upstream host of `GET /clusters?format=json`, with what the
/// fail-open gauge reads of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostStatus {
    /// The host's IP, when it has a socket address (pipes have none).
    pub ip: Option<std::net::IpAddr>,
    /// Its priority in the cluster's load assignment (0 when Envoy omits it).
    pub priority: u32,
    /// `cx_active`: Envoy's connections open to this host.
    pub cx_active: u64,
    /// `rq_active`: requests (streams) active on this host.
    pub rq_active: u64,
}

/// One cluster of `GET /clusters?format=json`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterStatus {
    pub name: String,
    pub hosts: Vec<HostStatus>,
}

/// Decodes `GET /clusters?format=json`. Envoy writes proto JSON: a zero
/// value or priority is left out, and a uint64 value is a string.
pub fn parse_clusters(body: &[u8]) -> Result<Vec<ClusterStatus>, serde_json::Error> {
    #[derive(Deserialize)]
    struct Doc {
        #[serde(default)]
        cluster_statuses: Vec<Value>,
    }
    let doc: Doc = serde_json::from_slice(body)?;
    let number = |v: Option<&Value>| match v {
        Some(Value::String(s)) => s.parse().unwrap_or(0),
        Some(v) => v.as_u64().unwrap_or(0),
        None => 0,
    };
    let host = |h: &Value| {
        let stat = |name: &str| {
            h.get("stats")
                .and_then(Value::as_array)
                .and_then(|stats| {
                    stats
                        .iter()
                        .find(|s| s.get("name").and_then(Value::as_str) == Some(name))
                })
                .map_or(0, |s| number(s.get("value")))
        };
        HostStatus {
            ip: h
                .pointer("/address/socket_address/address")
                .and_then(Value::as_str)
                .and_then(|a| a.parse().ok()),
            priority: u32::try_from(number(h.get("priority"))).unwrap_or(u32::MAX),
            cx_active: stat("cx_active"),
            rq_active: stat("rq_active"),
        }
    };
    Ok(doc
        .cluster_statuses
        .iter()
        .map(|c| ClusterStatus {
            name: c
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            hosts: c
                .get("host_statuses")
                .and_then(Value::as_array)
                .map(|hs| hs.iter().map(host).collect())
                .unwrap_or_default(),
        })
        .collect())
}

/// What drainshim needs to know of one listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerInfo {
    pub name: String,
    pub direction: TrafficDirection,
    /// The `listener.<prefix>.` stats scope: the stat_prefix, or the address as Envoy writes it.
    pub stat_prefix: String,
    /// The `http.<prefix>.` scopes of its HTTP connection managers.
    pub http_stat_prefixes: Vec<String>,
}

/// Decodes `GET /config_dump?resource=static_listeners|dynamic_listeners`.
pub fn parse_listeners(body: &[u8]) -> Result<Vec<ListenerInfo>, serde_json::Error> {
    #[derive(Deserialize)]
    struct Doc {
        #[serde(default)]
        configs: Vec<Value>,
    }
    let doc: Doc = serde_json::from_slice(body)?;
    Ok(doc
        .configs
        .iter()
        .filter_map(|c| {
            // Static entries carry `listener`; dynamic ones `active_state.listener`.
            let l = c
                .get("listener")
                .or_else(|| c.get("active_state")?.get("listener"))?;
            Some(listener_info(l))
        })
        .collect())
}

/// Decodes `GET /listeners?format=json` into (name, bound address); listeners
/// without an IP socket address (pipes) are skipped.
pub fn parse_bound_listeners(
    body: &[u8],
) -> Result<Vec<(String, std::net::SocketAddr)>, serde_json::Error> {
    #[derive(Deserialize)]
    struct Doc {
        #[serde(default)]
        listener_statuses: Vec<Value>,
    }
    let doc: Doc = serde_json::from_slice(body)?;
    Ok(doc
        .listener_statuses
        .iter()
        .filter_map(|l| {
            let name = l.get("name")?.as_str()?.to_string();
            let sa = l.get("local_address")?.get("socket_address")?;
            let ip: std::net::IpAddr = sa.get("address")?.as_str()?.parse().ok()?;
            let port = u16::try_from(sa.get("port_value")?.as_u64()?).ok()?;
            Some((name, std::net::SocketAddr::new(ip, port)))
        })
        .collect())
}

fn listener_info(l: &Value) -> ListenerInfo {
    let name = l.get("name").and_then(Value::as_str).unwrap_or_default();
    let direction = l
        .get("traffic_direction")
        .and_then(Value::as_str)
        .and_then(TrafficDirection::from_str_name)
        .unwrap_or(TrafficDirection::Unspecified);
    let stat_prefix = match l.get("stat_prefix").and_then(Value::as_str) {
        Some(p) if !p.is_empty() => p.to_string(),
        _ => address_stat_name(l.get("address")),
    };
    let hcm_type = HttpConnectionManager::type_url();
    let chains = l
        .get("filter_chains")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .chain(l.get("default_filter_chain"));
    let mut http_stat_prefixes: Vec<String> = chains
        .filter_map(|fc| fc.get("filters")?.as_array())
        .flatten()
        .filter_map(|f| {
            let tc = f.get("typed_config")?;
            (tc.get("@type")?.as_str()? == hcm_type)
                .then(|| tc.get("stat_prefix")?.as_str().map(str::to_string))?
        })
        .collect();
    http_stat_prefixes.sort();
    http_stat_prefixes.dedup();
    ListenerInfo {
        name: name.to_string(),
        direction,
        stat_prefix,
        http_stat_prefixes,
    }
}

/// Envoy names a listener's stats scope after its address, with `:` made `_`.
fn address_stat_name(addr: Option<&Value>) -> String {
    let Some(sa) = addr.and_then(|a| a.get("socket_address")) else {
        return String::new();
    };
    let ip = sa.get("address").and_then(Value::as_str).unwrap_or("");
    let port = sa.get("port_value").and_then(Value::as_u64).unwrap_or(0);
    let joined = if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    };
    joined.replace(':', "_")
}

/// The `listener_manager.*` stats a watcher of Envoy reads in one call.
///
/// Measured (Envoy 1.36 to 1.40, file-based LDS): a listener whose
/// listener-level fields change (its stat prefix, say) is replaced and the
/// old one drained: `listener_modified` +1, `total_listeners_draining` 1
/// for `--drain-time-s`, and `/config_dump` shows its `draining_state`. A
/// change of its filter chains only is an in-place update:
/// `listener_modified` and `listener_in_place_updated` +1,
/// `total_filter_chains_draining` 1, no `draining_state`. A removed listener
/// counts `listener_removed` and drains the same way. The pod's own drain
/// (`/drain_listeners?graceful`) moves none of these: only
/// `listener_stopped`, when its listeners stop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListenerManagerStats {
    /// `listener_stopped`: listeners stopped for good (the recovery watcher's signal).
    pub stopped: u64,
    /// `listener_modified`: updates of a listener, in place or by replacement.
    pub modified: u64,
    /// `listener_in_place_updated`: updates that changed filter chains only.
    pub in_place_updated: u64,
    /// `listener_removed`: listeners removed by LDS.
    pub removed: u64,
    /// `listener_added`: listeners added by LDS (a watcher reads the new
    /// one's config, so its first update is seen).
    pub added: u64,
    /// `total_listeners_warming` (gauge): an update accepted but not in
    /// force yet (its drain begins when warming ends).
    pub warming: u64,
    /// `total_listeners_draining` (gauge): replaced or removed listeners draining now.
    pub listeners_draining: u64,
    /// `total_filter_chains_draining` (gauge): filter chains draining after in-place updates.
    pub filter_chains_draining: u64,
}

// === impl ListenerManagerStats ===

impl ListenerManagerStats {
    /// The `/stats` filter that selects exactly these.
    pub const FILTER: &'static str = r"^listener_manager\.(listener_stopped|listener_modified|listener_in_place_updated|listener_removed|listener_added|total_listeners_warming|total_listeners_draining|total_filter_chains_draining)$";

    /// Picks the fields out of a `/stats` answer; missing stats read 0.
    pub fn from_stats(stats: &[Stat]) -> Self {
        let mut out = Self::default();
        for s in stats {
            let field = match s.name.strip_prefix("listener_manager.") {
                Some("listener_stopped") => &mut out.stopped,
                Some("listener_modified") => &mut out.modified,
                Some("listener_in_place_updated") => &mut out.in_place_updated,
                Some("listener_removed") => &mut out.removed,
                Some("listener_added") => &mut out.added,
                Some("total_listeners_warming") => &mut out.warming,
                Some("total_listeners_draining") => &mut out.listeners_draining,
                Some("total_filter_chains_draining") => &mut out.filter_chains_draining,
                _ => continue,
            };
            *field = s.value;
        }
        out
    }
}

/// One entry of `GET /config_dump?resource=dynamic_listeners`: what a
/// watcher of listener drains needs of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynamicListenerState {
    pub name: String,
    /// The active listener's `traffic_direction`.
    pub direction: TrafficDirection,
    /// The active listener's `version_info` (set by an xDS server; empty
    /// for file-based LDS).
    pub version: String,
    /// The active listener's `last_updated` (RFC 3339, Envoy's clock): when
    /// Envoy took its current config, which is when the drain of the
    /// config it replaced began.
    pub last_updated: String,
    /// The `version_info` of the listener being drained, when one is
    /// (`draining_state`); `Some("")` for file-based LDS.
    pub draining_version: Option<String>,
    /// The active listener's filter chains (the default one included), each
    /// as its name (empty when unnamed) and a hash of its config: an
    /// in-place update drains the chains whose config changed or that are gone.
    pub chains: Vec<(String, u64)>,
}

/// Decodes `GET /config_dump?resource=dynamic_listeners` into each
/// listener's state. A listener only warming has no `active_state`; its
/// direction and times are then empty.
pub fn parse_dynamic_listener_states(
    body: &[u8],
) -> Result<Vec<DynamicListenerState>, serde_json::Error> {
    #[derive(Deserialize)]
    struct Doc {
        #[serde(default)]
        configs: Vec<Value>,
    }
    let doc: Doc = serde_json::from_slice(body)?;
    let text = |v: Option<&Value>, key: &str| {
        v.and_then(|v| v.get(key))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    Ok(doc
        .configs
        .iter()
        .filter_map(|c| {
            let name = c.get("name")?.as_str()?.to_string();
            let active = c.get("active_state");
            let direction = active
                .and_then(|a| a.get("listener"))
                .and_then(|l| l.get("traffic_direction"))
                .and_then(Value::as_str)
                .and_then(TrafficDirection::from_str_name)
                .unwrap_or(TrafficDirection::Unspecified);
            let draining = c.get("draining_state");
            let listener = active.and_then(|a| a.get("listener"));
            let chains = listener
                .and_then(|l| l.get("filter_chains"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .chain(listener.and_then(|l| l.get("default_filter_chain")))
                .map(|fc| (text(Some(fc), "name"), chain_hash(fc)))
                .collect();
            Some(DynamicListenerState {
                chains,
                name,
                direction,
                version: text(active, "version_info"),
                last_updated: text(active, "last_updated"),
                draining_version: draining.map(|d| text(Some(d), "version_info")),
            })
        })
        .collect())
}

/// A filter chain's config, hashed: equal configs (as Envoy dumps them,
/// which orders fields the same way each time) hash the same.
fn chain_hash(chain: &Value) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    chain.to_string().hash(&mut h);
    h.finish()
}

/// `<sha>/1.40.0/Clean/RELEASE/BoringSSL` -> `1.40.0`. A bare `1.40.0` is accepted too.
pub fn parse_envoy_version(build: &str) -> Option<&str> {
    let looks_like_release = |s: &str| {
        let mut parts = s.split('.');
        let ok = parts
            .by_ref()
            .take(3)
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        ok && s.split('.').count() == 3
    };
    build.split('/').find(|p| looks_like_release(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_skip_histograms_and_non_numbers() {
        let body = br#"{"stats":[{"name":"a","value":3},{"histograms":{"x":1}},{"name":"b","value":"text"}]}"#;
        assert_eq!(
            parse_stats(body).unwrap(),
            vec![Stat {
                name: "a".into(),
                value: 3
            }]
        );
    }

    #[test]
    fn listener_names_follow_envoy() {
        let body = br#"{"configs":[
          {"@type":"type.googleapis.com/envoy.admin.v3.ListenersConfigDump.StaticListener",
           "listener":{"name":"in","traffic_direction":"INBOUND",
             "address":{"socket_address":{"address":"::1","port_value":15006}},
             "filter_chains":[{"filters":[{"name":"hcm","typed_config":{
               "@type":"type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
               "stat_prefix":"inbound_0.0.0.0_15006"}}]}]}},
          {"name":"out","active_state":{"listener":{"name":"out","stat_prefix":"egress",
             "address":{"socket_address":{"address":"0.0.0.0","port_value":15001}}}}}
        ]}"#;
        let ls = parse_listeners(body).unwrap();
        assert_eq!(ls[0].direction, TrafficDirection::Inbound);
        assert_eq!(ls[0].stat_prefix, "[__1]_15006");
        assert_eq!(ls[0].http_stat_prefixes, vec!["inbound_0.0.0.0_15006"]);
        assert_eq!(ls[1].direction, TrafficDirection::Unspecified);
        assert_eq!(ls[1].stat_prefix, "egress");
    }

    #[test]
    fn listener_manager_stats_by_name() {
        let stats = parse_stats(
            br#"{"stats":[
          {"name":"listener_manager.listener_modified","value":2},
          {"name":"listener_manager.listener_in_place_updated","value":1},
          {"name":"listener_manager.total_filter_chains_draining","value":1},
          {"name":"listener_manager.listener_stopped","value":0},
          {"name":"listener_manager.lds.update_success","value":9}]}"#,
        )
        .unwrap();
        let m = ListenerManagerStats::from_stats(&stats);
        assert_eq!(
            m,
            ListenerManagerStats {
                modified: 2,
                in_place_updated: 1,
                filter_chains_draining: 1,
                ..ListenerManagerStats::default()
            }
        );
    }

    /// As Envoy 1.40 answers after a listener-level change from a file.
    #[test]
    fn dynamic_listener_states_show_the_drain() {
        let body = br#"{"configs":[
          {"@type":"type.googleapis.com/envoy.admin.v3.ListenersConfigDump.DynamicListener",
           "name":"inbound",
           "active_state":{"listener":{"name":"inbound","traffic_direction":"INBOUND"},
                           "last_updated":"2026-12-07T10:27:07.629Z"},
           "draining_state":{"listener":{"name":"inbound"},"last_updated":"2026-12-07T10:27:04.873Z"}},
          {"name":"out","active_state":{"version_info":"v7","listener":{"name":"out"},
                           "last_updated":"2026-12-07T10:20:00Z"}},
          {"name":"warming","warming_state":{"listener":{"name":"warming"}}}
        ]}"#;
        let ls = parse_dynamic_listener_states(body).unwrap();
        assert_eq!(ls.len(), 3);
        assert_eq!(ls[0].name, "inbound");
        assert_eq!(ls[0].direction, TrafficDirection::Inbound);
        assert_eq!(ls[0].last_updated, "2026-12-07T10:27:07.629Z");
        assert_eq!(ls[0].draining_version.as_deref(), Some(""));
        assert_eq!(ls[1].version, "v7");
        assert_eq!(ls[1].draining_version, None);
        assert_eq!(ls[2].last_updated, "");
    }

    #[test]
    fn server_info_tolerates_missing_sections() {
        let si: ServerInfo = serde_json::from_str(
            r#"{"version":"abc/1.38.3/Clean/RELEASE/BoringSSL","state":"DRAINING"}"#,
        )
        .unwrap();
        assert_eq!(si.release(), "1.38.3");
        assert_eq!(si.state(), Some(State::Draining));
        assert_eq!(si.uptime(), None);
        assert_eq!(si.drain_time(), None);
    }

    #[test]
    fn proto_durations() {
        use std::time::Duration;
        assert_eq!(parse_proto_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(
            parse_proto_duration("1.500s"),
            Some(Duration::from_millis(1500))
        );
        for bad in ["5", "s", "-1s", "NaNs", "1e400s", ""] {
            assert_eq!(parse_proto_duration(bad), None, "{bad:?}");
        }
    }
}
