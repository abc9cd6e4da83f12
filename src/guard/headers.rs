//! Hop-by-hop headers: they describe one connection and must not be
//! forwarded to the next (RFC 9110 §7.6.1); HTTP/2 forbids them outright.

use http::header::{
    HeaderMap, HeaderName, HeaderValue, CONNECTION, TE, TRANSFER_ENCODING, UPGRADE,
};

/// Headers that are always connection-specific.
const HOP_BY_HOP: [&str; 4] = [
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
];

/// Removes hop-by-hop headers, including those named by `Connection`. `te:
/// trailers` is kept: gRPC requires it and HTTP/2 allows exactly that value.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        if name != TE {
            headers.remove(name);
        }
    }
    headers.remove(CONNECTION);
    headers.remove(TRANSFER_ENCODING);
    headers.remove(UPGRADE);
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    let trailers_only = headers
        .get_all(TE)
        .iter()
        .any(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    headers.remove(TE);
    if trailers_only {
        headers.insert(TE, HeaderValue::from_static("trailers"));
    }
}

/// The client's address, appended to `x-forwarded-for` (the de facto
/// standard list, oldest hop first): behind the guard the application's TCP
/// peer is the guard, so this is where it finds who called.
pub fn append_forwarded_for(headers: &mut HeaderMap, peer: std::net::IpAddr) {
    const XFF: &str = "x-forwarded-for";
    let value = match headers.get(XFF).and_then(|v| v.to_str().ok()) {
        Some(prev) if !prev.trim().is_empty() => format!("{prev}, {peer}"),
        _ => peer.to_string(),
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(XFF, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_specific_headers_go_and_te_trailers_stays() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("close, x-hop"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert(TE, HeaderValue::from_static("trailers"));
        h.insert("x-end-to-end", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        let names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert_eq!(h.get(TE).map(|v| v.as_bytes()), Some(&b"trailers"[..]));
        assert!(h.contains_key("x-end-to-end"));
    }

    #[test]
    fn the_peer_is_appended_to_x_forwarded_for() {
        let mut h = HeaderMap::new();
        let peer: std::net::IpAddr = [127, 0, 0, 6].into();
        append_forwarded_for(&mut h, peer);
        assert_eq!(
            h.get("x-forwarded-for").map(|v| v.as_bytes()),
            Some(&b"127.0.0.6"[..])
        );
        h.insert("x-forwarded-for", HeaderValue::from_static("10.1.2.3"));
        append_forwarded_for(&mut h, peer);
        assert_eq!(
            h.get("x-forwarded-for").map(|v| v.as_bytes()),
            Some(&b"10.1.2.3, 127.0.0.6"[..])
        );
    }

    #[test]
    fn other_te_values_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(TE, HeaderValue::from_static("gzip"));
        strip_hop_by_hop(&mut h);
        assert!(h.is_empty());
    }
}
