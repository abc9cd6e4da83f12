//! `/proc/net/snmp` and `/proc/net/netstat` as the kernel (or a hostile
//! /proc mount) might present them, and the Envoy stat names that are
//! classified as xDS update counters.
#![no_main]

use drainshim::control::telemetry::{classify_update, parse_proc_net};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for ((section, name), _) in parse_proc_net(&text) {
        // Names and sections come from a `Section: names` header line.
        assert!(!name.is_empty() && !name.contains(char::is_whitespace));
        assert!(!section.contains(':'));
    }
    if let Some((resource, result)) = classify_update(&text) {
        assert!(text.ends_with(&format!(".update_{result}")));
        assert!(["lds", "cds", "rds", "eds"].contains(&resource));
    }
});
