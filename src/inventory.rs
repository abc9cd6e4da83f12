//! Proxy identity and version parsing for the version inventory.
//!
//! Identity (namespace, pod) is resolved in the order of docs/design.md:
//! flags or env, then Envoy node metadata NAMESPACE/NAME, then the Istio node id.

#[cfg(test)]
use crate::envoy::parse_envoy_version;
use crate::envoy::ServerInfo;
use crate::metrics::ProxyLabels;

/// Istio's node id: `sidecar~10.0.0.1~POD.NAMESPACE~NAMESPACE.svc.cluster.local`.
/// Returns (namespace, pod).
pub fn parse_istio_node_id(id: &str) -> Option<(String, String)> {
    let mut parts = id.split('~');
    let (_kind, _ip, pod_ns, domain) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let ns = domain.split('.').next().filter(|s| !s.is_empty())?;
    // Pod names may contain dots themselves; the namespace is the known suffix.
    let pod = pod_ns.strip_suffix(&format!(".{ns}"))?;
    (!pod.is_empty()).then(|| (ns.to_string(), pod.to_string()))
}

/// Who this proxy is, from flags first and then from what Envoy says of itself.
pub fn proxy_labels(namespace: Option<&str>, pod: Option<&str>, info: &ServerInfo) -> ProxyLabels {
    let from_id = parse_istio_node_id(&info.node.id);
    let pick = |flag: Option<&str>, meta_key: &str, id_part: Option<&String>| {
        flag.filter(|s| !s.is_empty())
            .or_else(|| info.metadata_str(meta_key).filter(|s| !s.is_empty()))
            .or(id_part.map(String::as_str))
            .unwrap_or_default()
            .to_string()
    };
    ProxyLabels {
        namespace: pick(namespace, "NAMESPACE", from_id.as_ref().map(|(ns, _)| ns)),
        pod: pick(pod, "NAME", from_id.as_ref().map(|(_, p)| p)),
        version: info.release().to_string(),
        mesh_version: info
            .metadata_str("ISTIO_VERSION")
            .unwrap_or_default()
            .to_string(),
    }
}

/// A release `X.Y[.Z]`, compared on major and minor for skew.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Release {
    pub major: u32,
    pub minor: u32,
    pub patch: Option<u32>,
}

impl std::str::FromStr for Release {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("invalid version {s:?} (expected X.Y or X.Y.Z, e.g. 1.40)");
        let core = s.trim().trim_start_matches('v');
        // Tolerate suffixes such as 1.24.0-distroless or 1.40.0-dev.
        let core = core.split(['-', '+']).next().unwrap_or(core);
        let mut parts = core.split('.');
        let num = |p: Option<&str>| p.and_then(|p| p.parse::<u32>().ok());
        let major = num(parts.next()).ok_or_else(bad)?;
        let minor = num(parts.next()).ok_or_else(bad)?;
        let patch = match parts.next() {
            None => None,
            Some(p) => Some(p.parse::<u32>().map_err(|_| bad())?),
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Self {
            major,
            minor,
            patch,
        })
    }
}

impl std::fmt::Display for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.patch {
            Some(p) => write!(f, "{}.{}.{p}", self.major, self.minor),
            None => write!(f, "{}.{}", self.major, self.minor),
        }
    }
}

/// Why a proxy is outside the supported skew of a control plane, or None.
pub fn skew_violation(proxy: &str, control_plane: Release, max_skew: u32) -> Option<String> {
    let Ok(p) = proxy.parse::<Release>() else {
        return Some(format!("version unknown ({proxy:?})"));
    };
    let cp = control_plane;
    if p.major != cp.major {
        return Some(format!(
            "major version {} differs from the control plane's {}",
            p.major, cp.major
        ));
    }
    if p.minor > cp.minor {
        return Some(format!(
            "newer than the control plane ({}.{} > {}.{})",
            p.major, p.minor, cp.major, cp.minor
        ));
    }
    let behind = cp.minor - p.minor;
    (behind > max_skew).then(|| {
        format!(
            "{behind} minor versions behind {}.{} (at most {max_skew} supported)",
            cp.major, cp.minor
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse_and_order() {
        let r: Release = "1.40".parse().unwrap();
        assert_eq!((r.major, r.minor, r.patch), (1, 40, None));
        assert_eq!(
            "1.24.0-distroless".parse::<Release>().unwrap().to_string(),
            "1.24.0"
        );
        assert_eq!("v1.39.3".parse::<Release>().unwrap().patch, Some(3));
        for bad in ["", "1", "1.x", "1.2.3.4", "one.two"] {
            assert!(bad.parse::<Release>().is_err(), "{bad}");
        }
    }

    #[test]
    fn skew_rules() {
        let cp: Release = "1.40".parse().unwrap();
        assert_eq!(skew_violation("1.40.0", cp, 1), None);
        assert_eq!(skew_violation("1.39.3", cp, 1), None);
        assert!(skew_violation("1.38.3", cp, 1)
            .unwrap()
            .contains("2 minor versions behind 1.40"));
        assert_eq!(skew_violation("1.38.3", cp, 2), None);
        assert!(skew_violation("1.41.0", cp, 1).unwrap().contains("newer"));
        assert!(skew_violation("2.40.0", cp, 1).unwrap().contains("major"));
        assert!(skew_violation("", cp, 1).unwrap().contains("unknown"));
    }

    #[test]
    fn versions() {
        assert_eq!(
            parse_envoy_version("8a1c4f0e/1.40.0/Clean/RELEASE/BoringSSL"),
            Some("1.40.0")
        );
        assert_eq!(parse_envoy_version("1.38.3"), Some("1.38.3"));
        assert_eq!(parse_envoy_version("abc/1.40/Clean"), None);
        assert_eq!(parse_envoy_version(""), None);
        assert_eq!(parse_envoy_version("a/1.2.3.4/x"), None);
    }

    #[test]
    fn istio_node_ids() {
        assert_eq!(
            parse_istio_node_id("sidecar~10.1.2.3~web-7d9f.shop~shop.svc.cluster.local"),
            Some(("shop".into(), "web-7d9f".into()))
        );
        assert_eq!(
            parse_istio_node_id("sidecar~10.1.2.3~a.b.ns~ns.svc.cluster.local"),
            Some(("ns".into(), "a.b".into()))
        );
        assert_eq!(parse_istio_node_id("router~x"), None);
        assert_eq!(parse_istio_node_id("sidecar~ip~pod.other~ns.svc"), None);
    }

    #[test]
    fn identity_order_is_flags_then_metadata_then_node_id() {
        let mut info: ServerInfo = serde_json::from_str(
            r#"{"version":"x/1.39.3/Clean/RELEASE/BoringSSL","state":"LIVE",
                "node":{"id":"sidecar~1.2.3.4~idpod.idns~idns.svc.cluster.local",
                        "metadata":{"NAMESPACE":"metans","ISTIO_VERSION":"1.24.1"}}}"#,
        )
        .unwrap();
        let l = proxy_labels(None, None, &info);
        assert_eq!(
            (
                l.namespace.as_str(),
                l.pod.as_str(),
                l.version.as_str(),
                l.mesh_version.as_str()
            ),
            ("metans", "idpod", "1.39.3", "1.24.1")
        );
        let l = proxy_labels(Some("flagns"), Some("flagpod"), &info);
        assert_eq!(
            (l.namespace.as_str(), l.pod.as_str()),
            ("flagns", "flagpod")
        );
        info.node = Default::default();
        let l = proxy_labels(None, None, &info);
        assert_eq!(
            (
                l.namespace.as_str(),
                l.pod.as_str(),
                l.mesh_version.as_str()
            ),
            ("", "", "")
        );
    }
}
