//! Version and identity parsing: Envoy build strings, Istio node ids,
//! `X.Y[.Z]` releases and the skew rule, and the identity order of
//! `proxy_labels`.
#![no_main]

use arbitrary::Arbitrary;
use drainshim::envoy::{parse_envoy_version, ServerInfo};
use drainshim::inventory::{parse_istio_node_id, proxy_labels, skew_violation, Release};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input<'a> {
    build: &'a str,
    node_id: &'a str,
    release: &'a str,
    control_plane: (u32, u32),
    max_skew: u32,
    namespace_flag: Option<&'a str>,
    pod_flag: Option<&'a str>,
    metadata: Vec<(&'a str, &'a str)>,
}

fuzz_target!(|input: Input| {
    if let Some(v) = parse_envoy_version(input.build) {
        // One whole `/`-separated field, three runs of digits.
        assert!(input.build.split('/').any(|p| p == v));
        let parts: Vec<&str> = v.split('.').collect();
        assert_eq!(parts.len(), 3);
        assert!(parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())));
    }

    if let Some((ns, pod)) = parse_istio_node_id(input.node_id) {
        assert!(!ns.is_empty() && !pod.is_empty());
        assert!(input.node_id.contains(&format!("~{pod}.{ns}~")));
    }

    if let Ok(r) = input.release.parse::<Release>() {
        // What is shown parses back to the same release.
        assert_eq!(r.to_string().parse::<Release>(), Ok(r));
    }
    let cp = Release {
        major: input.control_plane.0,
        minor: input.control_plane.1,
        patch: None,
    };
    let verdict = skew_violation(input.release, cp, input.max_skew);
    if let Ok(r) = input.release.parse::<Release>() {
        let within =
            r.major == cp.major && r.minor <= cp.minor && cp.minor - r.minor <= input.max_skew;
        assert_eq!(verdict.is_none(), within, "{verdict:?}");
    } else {
        assert!(verdict.is_some());
    }

    let mut info = ServerInfo {
        version: input.build.to_string(),
        ..ServerInfo::default()
    };
    info.node.id = input.node_id.to_string();
    for (k, v) in &input.metadata {
        info.node.metadata.insert(
            (*k).to_string(),
            serde_json::Value::String((*v).to_string()),
        );
    }
    let labels = proxy_labels(input.namespace_flag, input.pod_flag, &info);
    if let Some(ns) = input.namespace_flag.filter(|s| !s.is_empty()) {
        assert_eq!(labels.namespace, ns, "a flag always wins");
    }
    if let Some(pod) = input.pod_flag.filter(|s| !s.is_empty()) {
        assert_eq!(labels.pod, pod, "a flag always wins");
    }
    assert_eq!(
        labels.version,
        parse_envoy_version(input.build).unwrap_or("")
    );
});
