//! Fleet tools: `inventory`, `skew` and `verify`.
//!
//! They read proxies from Envoy admin APIs directly, from the shims' own
//! `/metrics`, or, at fleet scale, from Prometheus, which does all the
//! aggregation.

pub mod golden;
pub mod plan;
pub mod prometheus;
pub mod reach;
pub mod timers;
pub mod verify;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use http::{Method, StatusCode};
use serde::Serialize;

use crate::envoy::AdminClient;
use crate::http::{Endpoint, UrlError};
use crate::inventory::{skew_violation, Release};
use prometheus::{PromClient, PromError};
use reach::Reach;

/// One proxy in the inventory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, PartialOrd, Ord)]
pub struct Proxy {
    pub namespace: String,
    pub pod: String,
    pub version: String,
    pub mesh_version: String,
    /// LIVE, DRAINING, ... or UNREACHABLE when its admin did not answer.
    pub state: String,
    /// Where it was read: an admin URL, a shim URL, or a Prometheus instance.
    pub source: String,
}

/// Where proxies are read from.
#[derive(Clone, Debug)]
pub enum Source {
    /// Envoy admin APIs, asked directly.
    Admins(Vec<String>),
    /// drainshim control endpoints; their `/metrics` is scraped.
    Targets(Vec<String>),
    /// A Prometheus server scraping the shims, and how to reach it.
    Prometheus(Box<Reach>),
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error(transparent)]
    Prometheus(#[from] PromError),
    #[error("{0}")]
    Input(String),
    #[error("target {target}: {what}")]
    Target { target: String, what: String },
    #[error("no proxies found: {0}")]
    Empty(String),
    #[error("{unreachable} of {asked} admin APIs could not be read: {which}")]
    AdminsUnreachable {
        unreachable: usize,
        asked: usize,
        which: String,
    },
}

/// Per-call deadline for admin APIs, shims and Prometheus.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads every proxy from `source`.
pub async fn proxies(source: &Source) -> Result<Vec<Proxy>, FleetError> {
    let mut out = match source {
        Source::Admins(urls) => from_admins(urls).await?,
        Source::Targets(urls) => {
            let mut all = Vec::new();
            for url in urls {
                all.extend(scrape_target(url).await?.proxies);
            }
            all
        }
        Source::Prometheus(reach) => {
            from_prometheus(&PromClient::from_reach((**reach).clone(), reach.timeout())).await?
        }
    };
    out.sort();
    Ok(out)
}

async fn from_admins(urls: &[String]) -> Result<Vec<Proxy>, FleetError> {
    let clients = urls
        .iter()
        .map(|u| AdminClient::new(u, CALL_TIMEOUT).map_err(|e| FleetError::Input(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    let answers = futures_util::future::join_all(clients.iter().map(|c| c.server_info())).await;
    Ok(urls
        .iter()
        .zip(answers)
        .map(|(url, info)| match info {
            Ok(info) => {
                let l = crate::inventory::proxy_labels(None, None, &info);
                Proxy {
                    namespace: l.namespace,
                    pod: l.pod,
                    version: l.version,
                    mesh_version: l.mesh_version,
                    state: info.state.clone(),
                    source: url.clone(),
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "inventory: admin unreachable");
                Proxy {
                    namespace: String::new(),
                    pod: String::new(),
                    version: String::new(),
                    mesh_version: String::new(),
                    state: "UNREACHABLE".to_string(),
                    source: url.clone(),
                }
            }
        })
        .collect())
}

/// An error naming the proxies whose admin API did not answer, if any: the
/// inventory lists them as UNREACHABLE, then fails (69), since a proxy it
/// could not read may be the one that matters.
pub fn unreachable(proxies: &[Proxy]) -> Result<(), FleetError> {
    let gone: Vec<&str> = proxies
        .iter()
        .filter(|p| p.state == "UNREACHABLE")
        .map(|p| p.source.as_str())
        .collect();
    if gone.is_empty() {
        return Ok(());
    }
    Err(FleetError::AdminsUnreachable {
        unreachable: gone.len(),
        asked: proxies.len(),
        which: gone.join(", "),
    })
}

async fn from_prometheus(prom: &PromClient) -> Result<Vec<Proxy>, FleetError> {
    let info = prom.query("drainshim_proxy_info == 1").await?;
    if info.is_empty() {
        return Err(FleetError::Empty(format!(
            "Prometheus {} has no drainshim_proxy_info series: is it scraping the shims' /metrics?",
            prom.url()
        )));
    }
    // Keyed by (instance, namespace, pod): a node agent exports one series
    // per pod; a sidecar's has no pod labels and stands for the instance.
    let draining: BTreeMap<(String, String, String), f64> = prom
        .query("drainshim_draining")
        .await?
        .into_iter()
        .map(|s| {
            let key = (
                s.label("instance").to_string(),
                s.label("namespace").to_string(),
                s.label("pod").to_string(),
            );
            (key, s.value)
        })
        .collect();
    Ok(info
        .iter()
        .map(|s| {
            let instance = s.label("instance").to_string();
            let own = (
                instance.clone(),
                s.label("namespace").to_string(),
                s.label("pod").to_string(),
            );
            let state = match draining
                .get(&own)
                .or_else(|| draining.get(&(instance.clone(), String::new(), String::new())))
            {
                Some(v) if *v >= 1.0 => "DRAINING",
                Some(_) => "LIVE",
                None => "UNKNOWN",
            };
            Proxy {
                namespace: s.label("namespace").to_string(),
                pod: s.label("pod").to_string(),
                version: s.label("version").to_string(),
                mesh_version: s.label("mesh_version").to_string(),
                state: state.to_string(),
                source: instance,
            }
        })
        .collect())
}

/// What one shim's `/metrics` says.
#[derive(Clone, Debug, Default)]
pub struct TargetScrape {
    pub proxies: Vec<Proxy>,
    /// Every sample, by metric name, for the checks that need more.
    pub samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

// === impl TargetScrape ===

impl TargetScrape {
    /// Sum of the samples of `metric` whose labels include all of `matching`.
    pub fn sum(&self, metric: &str, matching: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(name, labels, _)| {
                name == metric
                    && matching
                        .iter()
                        .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, _, v)| v)
            .sum()
    }
}

/// Scrapes a shim's `/metrics` (`url` is its control address, e.g. http://10.0.0.5:15099).
pub async fn scrape_target(url: &str) -> Result<TargetScrape, FleetError> {
    let terr = |what: String| FleetError::Target {
        target: url.to_string(),
        what,
    };
    let endpoint: Endpoint = url.parse().map_err(|e: UrlError| terr(e.to_string()))?;
    let (status, body) = endpoint
        .call(Method::GET, "/metrics", CALL_TIMEOUT)
        .await
        .map_err(|e| terr(e.to_string()))?;
    if status != StatusCode::OK {
        return Err(terr(format!("GET /metrics: status {status}")));
    }
    parse_scrape(&body, url).map_err(terr)
}

/// Decodes a shim's `/metrics` text into its proxies and samples; `source`
/// names the shim in each proxy.
pub fn parse_scrape(body: &[u8], source: &str) -> Result<TargetScrape, String> {
    let text = String::from_utf8_lossy(body);
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape =
        prometheus_parse::Scrape::parse(lines).map_err(|e| format!("bad metrics text: {e}"))?;
    let samples: Vec<(String, BTreeMap<String, String>, f64)> = scrape
        .samples
        .into_iter()
        .filter_map(|s| {
            let v = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => return None,
            };
            let labels = s
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            Some((s.metric, labels, v))
        })
        .collect();
    // A node agent labels drainshim_draining per pod; a sidecar has one.
    let draining_pod = |ns: &str, pod: &str| {
        samples.iter().any(|(n, l, v)| {
            n == "drainshim_draining"
                && *v >= 1.0
                && l.get("pod").is_none_or(|p| p == pod)
                && l.get("namespace").is_none_or(|x| x == ns)
        })
    };
    let proxies = samples
        .iter()
        .filter(|(n, _, v)| n == "drainshim_proxy_info" && *v >= 1.0)
        .map(|(_, l, _)| {
            let get = |k: &str| l.get(k).cloned().unwrap_or_default();
            Proxy {
                namespace: get("namespace"),
                pod: get("pod"),
                version: get("version"),
                mesh_version: get("mesh_version"),
                state: if draining_pod(&get("namespace"), &get("pod")) {
                    "DRAINING"
                } else {
                    "LIVE"
                }
                .to_string(),
                source: source.to_string(),
            }
        })
        .collect();
    Ok(TargetScrape { proxies, samples })
}

/// Renders rows as aligned columns.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            let _ = write!(l, "{:<w$}  ", c, w = widths[i]);
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec(), &mut out);
    for r in rows {
        line(r.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

/// The inventory as an operator reads it: every proxy, then the version
/// spread per namespace.
pub fn inventory_table(proxies: &[Proxy]) -> String {
    let rows: Vec<Vec<String>> = proxies
        .iter()
        .map(|p| {
            vec![
                or_dash(&p.namespace),
                or_dash(&p.pod),
                or_dash(&p.version),
                or_dash(&p.mesh_version),
                p.state.clone(),
            ]
        })
        .collect();
    let mut out = table(
        &["NAMESPACE", "POD", "VERSION", "MESH_VERSION", "STATE"],
        &rows,
    );
    let mut spread: BTreeMap<(String, String), usize> = BTreeMap::new();
    for p in proxies {
        *spread
            .entry((or_dash(&p.namespace), or_dash(&p.version)))
            .or_default() += 1;
    }
    let rows: Vec<Vec<String>> = spread
        .into_iter()
        .map(|((ns, v), n)| vec![ns, v, n.to_string()])
        .collect();
    out.push_str("\nVersion spread:\n");
    out.push_str(&table(&["NAMESPACE", "VERSION", "PROXIES"], &rows));
    out
}

/// Which label the skew is judged on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VersionLabel {
    /// Envoy's own release (`/server_info`).
    Version,
    /// The mesh's release (Istio's ISTIO_VERSION node metadata).
    MeshVersion,
}

/// The skew verdict for one control-plane version.
#[derive(Clone, Debug, Serialize)]
pub struct SkewReport {
    pub control_plane: String,
    pub max_skew: u32,
    pub judged_on: VersionLabel,
    pub proxies: usize,
    pub offenders: Vec<Offender>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Offender {
    pub namespace: String,
    pub pod: String,
    pub version: String,
    pub why: String,
    pub source: String,
}

pub fn skew(proxies: &[Proxy], cp: Release, max_skew: u32, label: VersionLabel) -> SkewReport {
    let offenders = proxies
        .iter()
        .filter_map(|p| {
            let v = match label {
                VersionLabel::Version => &p.version,
                VersionLabel::MeshVersion => &p.mesh_version,
            };
            let why = if p.state == "UNREACHABLE" {
                Some("admin unreachable: version unknown".to_string())
            } else {
                skew_violation(v, cp, max_skew)
            }?;
            Some(Offender {
                namespace: p.namespace.clone(),
                pod: p.pod.clone(),
                version: v.clone(),
                why,
                source: p.source.clone(),
            })
        })
        .collect();
    SkewReport {
        control_plane: format!("{}.{}", cp.major, cp.minor),
        max_skew,
        judged_on: label,
        proxies: proxies.len(),
        offenders,
    }
}

// === impl SkewReport ===

impl SkewReport {
    pub fn ok(&self) -> bool {
        self.offenders.is_empty()
    }

    /// The human verdict, naming offenders and the point of no return.
    pub fn render(&self) -> String {
        let cp = &self.control_plane;
        let mut out = format!(
            "control plane {cp}, max skew {} minor version(s), judged on {:?}: {} of {} proxies within skew\n",
            self.max_skew,
            self.judged_on,
            self.proxies - self.offenders.len(),
            self.proxies
        );
        if !self.offenders.is_empty() {
            let rows: Vec<Vec<String>> = self
                .offenders
                .iter()
                .map(|o| {
                    vec![
                        or_dash(&o.namespace),
                        or_dash(&o.pod),
                        or_dash(&o.version),
                        o.why.clone(),
                        o.source.clone(),
                    ]
                })
                .collect();
            out.push_str("\nOutside the skew:\n");
            out.push_str(&table(
                &["NAMESPACE", "POD", "VERSION", "WHY", "SOURCE"],
                &rows,
            ));
            let _ = writeln!(
                out,
                "\nMoving the control plane to {cp} now is NOT safe: {} proxy(ies) would be unsupported. \
                 Restart them onto a supported version first.",
                self.offenders.len()
            );
        } else {
            let _ = writeln!(
                out,
                "\nMoving the control plane to {cp} is safe: every proxy is within {} minor version(s).",
                self.max_skew
            );
        }
        let _ = writeln!(
            out,
            "Point of no return: once the control plane runs {cp}, proxies more than {} minor version(s) \
             behind it are unsupported, and rolling a namespace back by restarting onto the old proxy \
             version no longer works.",
            self.max_skew
        );
        out
    }
}

// === errors as the command's Error ===

impl From<crate::fleet::FleetError> for crate::error::Error {
    fn from(e: crate::fleet::FleetError) -> Self {
        use crate::error::Error;
        use crate::fleet::{prometheus::PromError, FleetError};
        match e {
            FleetError::Input(_) | FleetError::Prometheus(PromError::Setup(_)) => {
                Error::Usage(e.to_string())
            }
            FleetError::Prometheus(PromError::Refused { .. }) => Error::NoPermission(e.to_string()),
            e => Error::Unavailable(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(ns: &str, pod: &str, v: &str) -> Proxy {
        Proxy {
            namespace: ns.into(),
            pod: pod.into(),
            version: v.into(),
            mesh_version: String::new(),
            state: "LIVE".into(),
            source: "x".into(),
        }
    }

    #[test]
    fn the_table_sums_the_spread_per_namespace() {
        let t = inventory_table(&[
            proxy("a", "p1", "1.40.0"),
            proxy("a", "p2", "1.40.0"),
            proxy("b", "p3", "1.39.3"),
        ]);
        assert!(t.contains("a          1.40.0   2"), "{t}");
        assert!(t.contains("b          1.39.3   1"), "{t}");
    }

    #[test]
    fn skew_names_offenders_and_the_point_of_no_return() {
        let ps = [proxy("a", "old", "1.38.3"), proxy("a", "ok", "1.39.3")];
        let r = skew(&ps, "1.40".parse().unwrap(), 1, VersionLabel::Version);
        assert!(!r.ok());
        assert_eq!(r.offenders[0].pod, "old");
        let text = r.render();
        assert!(text.contains("NOT safe"), "{text}");
        assert!(text.contains("Point of no return"), "{text}");
        let r = skew(&ps[1..], "1.40".parse().unwrap(), 1, VersionLabel::Version);
        assert!(r.ok());
        assert!(r.render().contains("is safe"));
    }
}
