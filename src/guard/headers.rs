//! Hop-by-hop headers: they describe one connection and must not be
//! forwarded to the next (RFC 9110 §7.6.1); HTTP/2 forbids them outright.
//! An HTTP/1.1 upgrade keeps its `Upgrade` and `Connection: upgrade`, which
//! the next hop needs to switch protocols. `X-Forwarded-For` gets the
//! guard's peer appended.

use std::net::IpAddr;

use bytes::BytesMut;
use http::header::{
    Entry, HeaderMap, HeaderName, HeaderValue, CONNECTION, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION,
    TE, TRANSFER_ENCODING, UPGRADE,
};

/// `X-Forwarded-For`: the client address chain (de facto standard; the
/// guard appends the address of whoever connected to it, Envoy usually).
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The protocol an HTTP/1.1 request asks to switch to: its `Upgrade` value,
/// when `Connection` lists `upgrade` (RFC 9110 §7.8).
pub fn upgrade_requested(headers: &HeaderMap) -> Option<HeaderValue> {
    let listed = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    listed.then(|| headers.get(UPGRADE).cloned()).flatten()
}

/// Whether an `Upgrade` value names WebSocket (the only protocol the guard
/// can end gracefully).
pub fn is_websocket(upgrade: &HeaderValue) -> bool {
    upgrade.to_str().is_ok_and(|v| {
        v.split(',')
            .any(|p| p.trim().eq_ignore_ascii_case("websocket"))
    })
}

/// [`strip_hop_by_hop`], then puts back `Upgrade: <upgrade>` and
/// `Connection: upgrade`, for an upgrade request or its 101 answer.
pub fn strip_hop_by_hop_keep_upgrade(headers: &mut HeaderMap, upgrade: HeaderValue) {
    strip_hop_by_hop(headers);
    headers.insert(UPGRADE, upgrade);
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
}

/// `peer` as an `X-Forwarded-For` entry; made once per connection, since
/// every request on it appends the same address.
pub fn forwarded_for(peer: IpAddr) -> HeaderValue {
    HeaderValue::from_str(&peer.to_string()).expect("an IP address is a valid header value")
}

/// Appends `peer` (from [`forwarded_for`]) to `X-Forwarded-For`, joining
/// earlier lines into one.
pub fn append_forwarded_for(headers: &mut HeaderMap, peer: &HeaderValue) {
    let mut chain = match headers.entry(X_FORWARDED_FOR) {
        // The usual case: the first hop that sets it.
        Entry::Vacant(e) => {
            e.insert(peer.clone());
            return;
        }
        Entry::Occupied(e) => {
            let mut chain = BytesMut::new();
            for v in e.iter() {
                let v = v.as_bytes().trim_ascii();
                if !v.is_empty() {
                    chain.extend_from_slice(v);
                    chain.extend_from_slice(b", ");
                }
            }
            chain
        }
    };
    chain.extend_from_slice(peer.as_bytes());
    if let Ok(v) = HeaderValue::from_maybe_shared(chain.freeze()) {
        headers.insert(X_FORWARDED_FOR, v);
    }
}

/// Headers that are always connection-specific.
const HOP_BY_HOP: [HeaderName; 4] = [
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    PROXY_AUTHENTICATE,
    PROXY_AUTHORIZATION,
];

/// Whether `name` is hop-by-hop by itself (without `Connection` naming it).
fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == CONNECTION || name == TRANSFER_ENCODING || name == UPGRADE || HOP_BY_HOP.contains(name)
}

/// Removes hop-by-hop headers, including those named by `Connection`. `te:
/// trailers` is kept: gRPC requires it and HTTP/2 allows exactly that value.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // The usual case, on every request, response and trailer block: nothing
    // to remove, and at most one `te: trailers`. One pass, no allocation.
    let mut te = 0;
    let clean = headers.iter().all(|(name, value)| {
        if name == TE {
            te += 1;
            return value == "trailers";
        }
        !is_hop_by_hop(name)
    });
    if clean && te <= 1 {
        return;
    }
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
    for name in &HOP_BY_HOP {
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
    fn upgrades_keep_their_headers_and_forwarded_for_appends() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("keep-alive, Upgrade"));
        h.insert(UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("sec-websocket-key", HeaderValue::from_static("abc"));
        let up = upgrade_requested(&h).expect("an upgrade");
        assert!(is_websocket(&up));
        strip_hop_by_hop_keep_upgrade(&mut h, up);
        assert_eq!(
            h.get(CONNECTION).map(|v| v.as_bytes()),
            Some(&b"upgrade"[..])
        );
        assert_eq!(
            h.get(UPGRADE).map(|v| v.as_bytes()),
            Some(&b"websocket"[..])
        );
        assert!(h.contains_key("sec-websocket-key"));

        let mut plain = HeaderMap::new();
        plain.insert(UPGRADE, HeaderValue::from_static("websocket"));
        assert!(
            upgrade_requested(&plain).is_none(),
            "no Connection: upgrade"
        );
        assert!(!is_websocket(&HeaderValue::from_static("h2c")));

        let mut x = HeaderMap::new();
        x.append(X_FORWARDED_FOR, HeaderValue::from_static("203.0.113.7"));
        x.append(X_FORWARDED_FOR, HeaderValue::from_static("10.0.0.1"));
        append_forwarded_for(&mut x, &forwarded_for("127.0.0.1".parse().expect("ip")));
        assert_eq!(
            x.get(X_FORWARDED_FOR).map(|v| v.as_bytes()),
            Some(&b"203.0.113.7, 10.0.0.1, 127.0.0.1"[..])
        );
        let mut fresh = HeaderMap::new();
        append_forwarded_for(&mut fresh, &forwarded_for("::1".parse().expect("ip")));
        assert_eq!(
            fresh.get(X_FORWARDED_FOR).map(|v| v.as_bytes()),
            Some(&b"::1"[..])
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
