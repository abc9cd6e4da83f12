//! `drainshim verify`: the gate for one upgrade wave.
//!
//! With `--prometheus` every number is a PromQL query over the window; with
//! `--targets` the shims are scraped once, and the rate checks, which need
//! history, are reported as not applicable rather than guessed.
//!
//! Namespace membership: series that carry a `namespace` label (node mode's
//! per-pod series, and sidecars scraped with their pod's labels) are taken
//! by it; series of shims that export none are joined on `instance` to
//! `drainshim_proxy_info` over the whole window (`max_over_time`): the pods
//! that drained in this wave are gone at query time, but their cut streams
//! still count. Only series with neither `namespace` nor `pod` are joined: a
//! node agent's instance carries many pods, and it labels each pod's series
//! (see [`golden::Queries::in_wave`]).
//!
//! The guard's golden signals (success rate, p99, requests per caller
//! request, stream re-opens) are gated per namespace and service in
//! [`golden`].

use crate::inventory::Release;
use std::time::Duration;

use serde::Serialize;

use super::golden::{self, GoldenThresholds, Part, Queries, Read, ServiceDelta, Window};
use super::prometheus::{regex_alternation, PromClient};
use super::{scrape_target, table, FleetError, Proxy};

/// Where verify reads from.
#[derive(Clone, Debug)]
pub enum VerifySource {
    /// A Prometheus and how to reach it.
    Prometheus(Box<super::reach::Reach>),
    Targets(Vec<String>),
}

#[derive(Clone, Debug)]
pub struct VerifyOptions {
    /// The wave's namespaces; with targets, empty means every target.
    pub namespaces: Vec<String>,
    pub expect_version: String,
    pub window: Duration,
    /// Judge the wave as of this moment instead of now (Prometheus only):
    /// the window ends here and the one before ends a window earlier.
    pub at: Option<std::time::SystemTime>,
    pub thresholds: Thresholds,
}

/// How much a wave's rates may move against the window before.
#[derive(Clone, Debug)]
pub struct Thresholds {
    /// Allowed relative increase of the retry rate, window against the one before.
    pub max_retry_increase: f64,
    /// Allowed relative increase of the kernel reset rate.
    pub max_reset_increase: f64,
    /// Absolute slack (per second) so tiny rates do not fail on noise.
    pub rate_floor: f64,
    /// The guard's golden-signal gates.
    pub golden: GoldenThresholds,
}

/// One check's verdict. `ok: None` means not applicable, with the reason.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub check: String,
    pub ok: Option<bool>,
    pub detail: String,
    /// Per namespace and service, for the golden-signal gates: which moved
    /// and by how much.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceDelta>,
}

impl Check {
    fn new(check: &str, ok: Option<bool>, detail: String) -> Self {
        Self {
            check: check.to_string(),
            ok,
            detail,
            services: Vec::new(),
        }
    }
}

impl From<golden::GateOutcome> for Check {
    fn from(v: golden::GateOutcome) -> Self {
        Self {
            check: v.name.to_string(),
            ok: v.ok,
            detail: v.detail,
            services: v.services,
        }
    }
}

/// Passes when no check failed.
pub fn passed(checks: &[Check]) -> bool {
    checks.iter().all(|c| c.ok != Some(false))
}

pub fn render(checks: &[Check]) -> String {
    let rows: Vec<Vec<String>> = checks
        .iter()
        .map(|c| {
            let r = match c.ok {
                Some(true) => "PASS",
                Some(false) => "FAIL",
                None => "n/a",
            };
            vec![c.check.clone(), r.to_string(), c.detail.clone()]
        })
        .collect();
    let mut out = table(&["CHECK", "RESULT", "DETAIL"], &rows);
    out.push_str(if passed(checks) {
        "\nverify: PASS, the wave may proceed\n"
    } else {
        "\nverify: FAIL, stop the rollout here\n"
    });
    out
}

pub async fn verify(source: &VerifySource, opts: &VerifyOptions) -> Result<Vec<Check>, FleetError> {
    match source {
        VerifySource::Prometheus(reach) => {
            if opts.namespaces.is_empty() {
                return Err(FleetError::Input(
                    "--namespace is required with --prometheus (the wave's namespaces)".into(),
                ));
            }
            let prom = PromClient::from_reach((**reach).clone(), reach.timeout()).at(opts.at);
            from_prometheus(&prom, opts).await
        }
        VerifySource::Targets(urls) => from_targets(urls, opts).await,
    }
}

/// Whether a proxy's `version` is the one expected: the same string, or,
/// when only X.Y is expected, any X.Y.Z (`plan` judges waves by minor
/// version).
pub fn version_matches(version: &str, expected: &str) -> bool {
    if version == expected {
        return true;
    }
    match (version.parse::<Release>(), expected.parse::<Release>()) {
        (Ok(v), Ok(e)) if e.patch.is_none() => (v.major, v.minor) == (e.major, e.minor),
        _ => false,
    }
}

/// The PromQL matcher on the `version` label for [`version_matches`].
fn version_matcher(expected: &str) -> String {
    let quote = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    match expected.parse::<Release>() {
        Ok(e) if e.patch.is_none() => {
            let exact = regex::escape(expected);
            let minor = regex::escape(&format!("{}.{}.", e.major, e.minor));
            format!("version=~\"{}\"", quote(&format!("{exact}|{minor}.*")))
        }
        _ => format!("version=\"{}\"", quote(expected)),
    }
}

fn versions_check(proxies: &[Proxy], opts: &VerifyOptions) -> Check {
    let v = &opts.expect_version;
    if proxies.is_empty() {
        return Check::new(
            "every pod runs the expected version",
            Some(false),
            format!("no proxies found in namespaces {:?}", opts.namespaces),
        );
    }
    let wrong: Vec<String> = proxies
        .iter()
        .filter(|p| !version_matches(&p.version, v))
        .map(|p| {
            format!(
                "{}/{} on {}",
                p.namespace,
                p.pod,
                if p.version.is_empty() {
                    "?"
                } else {
                    &p.version
                }
            )
        })
        .collect();
    if wrong.is_empty() {
        Check::new(
            "every pod runs the expected version",
            Some(true),
            format!("{} of {} proxies on {v}", proxies.len(), proxies.len()),
        )
    } else {
        Check::new(
            "every pod runs the expected version",
            Some(false),
            format!(
                "{} of {} not on {v}: {}",
                wrong.len(),
                proxies.len(),
                wrong.join(", ")
            ),
        )
    }
}

/// The part of a wave's window that counts Envoy's config rejections.
const REJECTED: &str = "rejected";

/// The drain outcomes a wave must not have: (check, outcome, what it counts).
/// `bypassed` streams were on the fail-open path at the deadline, around a
/// guard that was down when they opened: the restart cut them too.
const ENDED_BADLY: [(&str, &str, &str); 2] = [
    ("no stream cut by a drain", "cut", "streams cut"),
    (
        "no bypassed stream cut by a restart",
        "bypassed",
        "streams around the guard (fail open) at a drain deadline",
    ),
];

fn count_check(name: &str, value: f64, what: &str) -> Check {
    // PromQL can answer -0; counts are shown as whole numbers.
    let shown = if value == 0.0 { 0.0 } else { value };
    Check::new(name, Some(value == 0.0), format!("{shown:.0} {what}"))
}

/// `now <= before * (1 + max_increase) + floor`.
fn rate_check(
    name: &str,
    now: Option<f64>,
    before: Option<f64>,
    max_increase: f64,
    floor: f64,
) -> Check {
    match (now, before) {
        (Some(now), Some(before)) => {
            let limit = before * (1.0 + max_increase) + floor;
            Check::new(
                name,
                Some(now <= limit),
                format!("{now:.3}/s now vs {before:.3}/s the window before (limit {limit:.3}/s)"),
            )
        }
        (None, _) => Check::new(name, None, "no data in the window".into()),
        (_, None) => Check::new(
            name,
            None,
            "no data for the window before to compare with".into(),
        ),
    }
}

async fn from_prometheus(
    prom: &PromClient,
    opts: &VerifyOptions,
) -> Result<Vec<Check>, FleetError> {
    let ns = regex_alternation(&opts.namespaces);
    let secs = opts.window.as_secs().max(1);
    let q = Queries {
        ns: &ns,
        secs,
        resets: false,
    };
    let v = version_matcher(&opts.expect_version);

    // What only the wave's own window is judged on, beside every window's
    // counters: the drain outcomes it must not have, and config rejections.
    let mut extra: Vec<Part> = ENDED_BADLY
        .iter()
        .map(|(_, outcome, _)| Part {
            name: outcome,
            metric: "drainshim_drained_streams_total",
            matchers: format!(",outcome=\"{outcome}\""),
            read: Read::Highest,
        })
        .collect();
    extra.push(Part {
        name: REJECTED,
        metric: "drainshim_envoy_config_updates_total",
        matchers: format!(",result=\"rejected\",{v}"),
        read: Read::Highest,
    });
    let before = format!(" offset {}", q.w());
    let info_q = format!("drainshim_proxy_info{{namespace=~\"{ns}\"}} == 1");
    // Every query at once: a store runs them side by side.
    let (info, now, before) = tokio::try_join!(
        prom.query(&info_q),
        Window::read(prom, &q, "", &extra),
        Window::read(prom, &q, &before, &[]),
    )?;

    let proxies: Vec<Proxy> = info
        .iter()
        .map(|s| Proxy {
            namespace: s.label("namespace").into(),
            pod: s.label("pod").into(),
            version: s.label("version").into(),
            mesh_version: s.label("mesh_version").into(),
            state: String::new(),
            source: s.label("instance").into(),
        })
        .collect();
    let mut checks = vec![versions_check(&proxies, opts)];
    let since = format!("in the last {}", humantime::format_duration(opts.window));
    let total = |part: &str| now.totals.get(part).copied().unwrap_or(0.0);
    for (name, outcome, what) in ENDED_BADLY {
        checks.push(count_check(
            name,
            total(outcome),
            &format!("{what} {since}"),
        ));
    }
    checks.push(count_check(
        "no config rejections on the new version",
        total(REJECTED),
        &format!("xDS updates rejected by Envoy {}", opts.expect_version),
    ));
    let rate_gates = [
        (
            "retry volume within threshold",
            "retries",
            opts.thresholds.max_retry_increase,
        ),
        (
            "reset rate within threshold",
            "tcp_resets",
            opts.thresholds.max_reset_increase,
        ),
    ];
    for (name, part, max_increase) in rate_gates {
        checks.push(rate_check(
            name,
            now.totals.get(part).copied(),
            before.totals.get(part).copied(),
            max_increase,
            opts.thresholds.rate_floor,
        ));
    }
    checks.extend(
        golden::judge(&before, &now, &opts.thresholds.golden)
            .into_iter()
            .map(Check::from),
    );
    checks.push(golden::endings(&now).into());
    Ok(checks)
}

async fn from_targets(urls: &[String], opts: &VerifyOptions) -> Result<Vec<Check>, FleetError> {
    let mut proxies = Vec::new();
    let mut ended = [0.0; ENDED_BADLY.len()];
    let mut rejected = 0.0;
    for url in urls {
        let scrape = scrape_target(url).await?;
        let in_wave = scrape
            .proxies
            .iter()
            .any(|p| opts.namespaces.is_empty() || opts.namespaces.contains(&p.namespace));
        if !in_wave {
            continue;
        }
        for (n, (_, outcome, _)) in ended.iter_mut().zip(ENDED_BADLY) {
            *n += scrape.sum("drainshim_drained_streams_total", &[("outcome", outcome)]);
        }
        rejected += scrape.sum(
            "drainshim_envoy_config_updates_total",
            &[("result", "rejected"), ("version", &opts.expect_version)],
        );
        proxies.extend(scrape.proxies);
    }
    let history = "needs --prometheus: a rate needs history, one scrape has none";
    let mut checks = vec![versions_check(&proxies, opts)];
    checks.extend(ENDED_BADLY.iter().zip(ended).map(|((name, _, what), n)| {
        count_check(name, n, &format!("{what} since each shim started"))
    }));
    checks.extend([
        count_check(
            "no config rejections on the new version",
            rejected,
            &format!("xDS updates rejected by Envoy {}", opts.expect_version),
        ),
        Check::new("retry volume within threshold", None, history.into()),
        Check::new("reset rate within threshold", None, history.into()),
    ]);
    checks.extend(
        golden::GATES
            .iter()
            .chain([&golden::ENDINGS])
            .map(|g| Check::new(g, None, history.into())),
    );
    Ok(checks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_checks_have_a_floor_and_say_when_they_cannot_judge() {
        assert_eq!(
            rate_check("r", Some(1.1), Some(1.0), 0.2, 0.0).ok,
            Some(true)
        );
        assert_eq!(
            rate_check("r", Some(1.3), Some(1.0), 0.2, 0.0).ok,
            Some(false)
        );
        assert_eq!(
            rate_check("r", Some(0.04), Some(0.0), 0.2, 0.05).ok,
            Some(true)
        );
        assert_eq!(rate_check("r", None, Some(1.0), 0.2, 0.0).ok, None);
        assert_eq!(rate_check("r", Some(1.0), None, 0.2, 0.0).ok, None);
        assert!(passed(&[rate_check("r", None, None, 0.2, 0.0)]));
        assert!(!passed(&[count_check("c", 1.0, "x")]));
        assert_eq!(count_check("c", -0.0, "cut").detail, "0 cut");
    }
}
