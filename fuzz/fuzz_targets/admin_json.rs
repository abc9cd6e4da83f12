//! Envoy admin JSON: `/stats?format=json`, `/server_info`,
//! `/config_dump?resource=..._listeners` and `/listeners?format=json`.
//! The first byte picks the parser; the rest is the body as Envoy would send it.
#![no_main]

use drainshim::envoy::model::{parse_bound_listeners, parse_listeners, parse_stats};
use drainshim::envoy::ServerInfo;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => {
            if let Ok(stats) = parse_stats(body) {
                // Every stat kept came from a {"name","value"} object of the body.
                assert!(stats.len() <= body.len());
            }
        }
        1 => {
            if let Ok(info) = serde_json::from_slice::<ServerInfo>(body) {
                let release = info.release();
                assert!(release.is_empty() || info.version.contains(release));
                let _ = info.state();
                let labels = drainshim::inventory::proxy_labels(None, None, &info);
                assert_eq!(labels.version, release);
                let _ = drainshim::inventory::proxy_labels(Some("ns"), Some(""), &info);
            }
        }
        2 => {
            if let Ok(listeners) = parse_listeners(body) {
                for l in listeners {
                    // Sorted and deduplicated, as the stats scopes are looked up by name.
                    assert!(l.http_stat_prefixes.windows(2).all(|w| w[0] < w[1]));
                }
            }
        }
        _ => {
            let _ = parse_bound_listeners(body);
        }
    }
});
