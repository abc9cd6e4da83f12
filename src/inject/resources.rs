//! The limits of drainshim's containers. Each has a CPU and a memory limit
//! (the pod patches' defaults), so a namespace whose ResourceQuota covers
//! `limits.cpu` or `limits.memory` admits the pod; a pod tunes them with
//! annotations, validated before anything is changed: a value that is not
//! a quantity, not above zero, or below the container's request is refused.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{patch, refuse, PodRefusal};

/// Pod annotations: the limits of Envoy (the plain modes' proxy, which
/// carries every inbound byte) and of the drainshim container (whose guard
/// relays them on to the app). Under Istio the proxy is Istio's, tuned by
/// its own annotations (sidecar.istio.io/proxyCPULimit, ...).
pub const PROXY_CPU_LIMIT: &str = "drainshim.io/proxy-cpu-limit";
pub const PROXY_MEMORY_LIMIT: &str = "drainshim.io/proxy-memory-limit";
pub const CPU_LIMIT: &str = "drainshim.io/cpu-limit";
pub const MEMORY_LIMIT: &str = "drainshim.io/memory-limit";

/// Each annotation: the container it tunes, and the resource.
const ANNOTATIONS: [(&str, &str, &str); 4] = [
    (PROXY_CPU_LIMIT, patch::ENVOY, "cpu"),
    (PROXY_MEMORY_LIMIT, patch::ENVOY, "memory"),
    (CPU_LIMIT, patch::DRAINSHIM, "cpu"),
    (MEMORY_LIMIT, patch::DRAINSHIM, "memory"),
];

/// The pod's own limits, by container and resource, validated.
#[derive(Debug, Default)]
pub struct ResourceLimits(BTreeMap<(&'static str, &'static str), Quantity>);

impl ResourceLimits {
    /// Reads the annotations; every bad one named in one refusal. `patch`
    /// gives each container's request, which a limit may not be under.
    pub fn read(meta: &ObjectMeta, patch: &patch::PodPatch) -> Result<Self, PodRefusal> {
        let mut limits = ResourceLimits::default();
        let mut bad = Vec::new();
        for (key, container, resource) in ANNOTATIONS {
            let Some(v) = meta.annotations.as_ref().and_then(|a| a.get(key)) else {
                continue;
            };
            let request = all(patch).find(|c| c.name == container).and_then(|c| {
                c.resources
                    .as_ref()?
                    .requests
                    .as_ref()?
                    .get(resource)
                    .cloned()
            });
            match parse(v) {
                Some(q) if q <= 0.0 => bad.push(format!("{key}: {v:?} is not above zero")),
                Some(q) => match request.as_ref().and_then(|r| parse(&r.0).map(|n| (r, n))) {
                    Some((r, n)) if q < n => bad.push(format!(
                        "{key}: {v:?} is below the container's request {}, which the API server refuses",
                        r.0
                    )),
                    _ => {
                        limits.0.insert((container, resource), Quantity(v.trim().to_owned()));
                    }
                },
                None => bad.push(format!(
                    "{key}: {v:?} is not a Kubernetes quantity (e.g. 500m, 2, 256Mi, 1Gi)"
                )),
            }
        }
        if bad.is_empty() {
            Ok(limits)
        } else {
            refuse(format!("its annotations {}", bad.join("; ")))
        }
    }

    /// Sets the pod's own limits on one of drainshim's containers.
    pub fn apply(&self, c: &mut Container) {
        for ((container, resource), q) in &self.0 {
            if c.name == *container {
                c.resources
                    .get_or_insert_with(Default::default)
                    .limits
                    .get_or_insert_with(BTreeMap::new)
                    .insert((*resource).to_owned(), q.clone());
            }
        }
    }
}

fn all(p: &patch::PodPatch) -> impl Iterator<Item = &Container> {
    p.spec
        .containers
        .iter()
        .chain(p.spec.init_containers.iter().flatten())
}

/// A Kubernetes quantity (`<number><suffix>`: a decimal number, then one of
/// the binary suffixes Ki..Ei, the decimal ones m, k, M..E, or an exponent
/// e<n>), as a number of units; `None` when it is not one.
pub fn parse(s: &str) -> Option<f64> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(end);
    let digits = number.strip_prefix(['+', '-']).unwrap_or(number);
    if digits.is_empty()
        || digits == "."
        || digits.matches('.').count() > 1
        || !digits.chars().all(|c| c.is_ascii_digit() || c == '.')
    {
        return None;
    }
    let n: f64 = number.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e => {
            let exp = e.strip_prefix(['e', 'E'])?;
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
                return None;
            }
            10f64.powi(exp.parse().ok()?)
        }
    };
    Some(n * scale).filter(|v| v.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_as_kubernetes_reads_them() {
        for (s, want) in [
            ("2", 2.0),
            ("500m", 0.5),
            ("0.25", 0.25),
            (".5", 0.5),
            ("1.5Gi", 1.5 * 1024.0 * 1024.0 * 1024.0),
            ("256Mi", 256.0 * 1024.0 * 1024.0),
            ("1G", 1e9),
            ("1e3", 1000.0),
            ("+3", 3.0),
        ] {
            assert_eq!(parse(s), Some(want), "{s}");
        }
        for s in [
            "", "m", "1.2.3", "lots", "1 Gi", "2x", "1e", "--1", "1mi", "0x10", "NaN",
        ] {
            assert_eq!(parse(s), None, "{s}");
        }
    }
}

/// One of drainshim's containers as the plain sidecar mode adds it, with its
/// default requests and limits (in cores and bytes), for checks of what a
/// namespace admits (`drainshim check`, LimitRanges).
#[derive(Debug)]
pub struct Injected {
    pub container: String,
    /// Resource (`cpu`, `memory`) -> (request, limit).
    pub resources: BTreeMap<String, (Option<f64>, Option<f64>)>,
}

/// drainshim's containers with their default resources, in every plain mode.
pub fn injected() -> Result<Vec<Injected>, String> {
    let mut out: Vec<Injected> = Vec::new();
    for mode in [super::Mode::Sidecar, super::Mode::NativeSidecar] {
        for c in all(patch::pod(mode)?) {
            if out.iter().any(|i| i.container == c.name) {
                continue;
            }
            let r = c.resources.as_ref();
            let get = |m: Option<&BTreeMap<String, Quantity>>, k: &str| {
                m.and_then(|m| m.get(k)).and_then(|q| parse(&q.0))
            };
            let mut resources = BTreeMap::new();
            for k in ["cpu", "memory"] {
                let request = get(r.and_then(|r| r.requests.as_ref()), k);
                let limit = get(r.and_then(|r| r.limits.as_ref()), k);
                if request.is_some() || limit.is_some() {
                    resources.insert(k.to_owned(), (request, limit));
                }
            }
            out.push(Injected {
                container: c.name.clone(),
                resources,
            });
        }
    }
    Ok(out)
}
