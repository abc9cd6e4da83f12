//! Proxy identity and version parsing for the version inventory.
//!
//! Identity (namespace, pod) is resolved in the order of DESIGN.md §3:
//! flags or env, then Envoy node metadata NAMESPACE/NAME, then the Istio node id.

use crate::envoy::ServerInfo;
use crate::metrics::ProxyLabels;

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

#[cfg(test)]
mod tests {
    use super::*;

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
