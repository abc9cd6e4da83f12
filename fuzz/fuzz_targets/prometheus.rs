//! What the fleet tools read from others: Prometheus `/api/v1/query` answers
//! (first byte even; the next two bytes are the HTTP status) and a shim's
//! `/metrics` text (first byte odd).
#![no_main]

use drainshim::fleet::parse_scrape;
use drainshim::fleet::prometheus::decode_answer;
use http::StatusCode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    if which % 2 == 0 {
        let [hi, lo, body @ ..] = rest else {
            return;
        };
        let code = 100 + u16::from_be_bytes([*hi, *lo]) % 900;
        let Ok(status) = StatusCode::from_u16(code) else {
            return;
        };
        match decode_answer(status, body) {
            Ok(samples) => {
                assert_eq!(status, StatusCode::OK);
                for s in samples {
                    let _ = s.label("instance");
                }
            }
            Err(_) => {}
        }
    } else if let Ok(scrape) = parse_scrape(rest, "http://192.0.2.1:15099") {
        for p in &scrape.proxies {
            assert!(p.state == "LIVE" || p.state == "DRAINING");
        }
        let _ = scrape.sum("drainshim_draining", &[("pod", "p")]);
    }
});
