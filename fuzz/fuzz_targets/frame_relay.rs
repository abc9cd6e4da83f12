//! The guard's HTTP/2 frame relay (`src/guard/frames.rs`) fed arbitrary
//! bytes from both peers, cut into arbitrary reads. Each run starts with a
//! well-formed client preface and an application SETTINGS half the time, so
//! the fuzzer spends its effort past the handshake: HEADERS and
//! CONTINUATION with HPACK from the fuzz data, DATA, RST_STREAM, SETTINGS,
//! PING, GOAWAY and WINDOW_UPDATE in any order and size. Invariant: the
//! relay never panics, whatever either peer sends, and holds no more than
//! its bounds (asserted inside `feed`).
#![no_main]

use std::sync::OnceLock;

use arbitrary::Arbitrary;
use drainshim::guard::{Guard, GuardConfig};
use drainshim::metrics::Metrics;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    /// Start past the handshake (preface + both SETTINGS).
    handshake: bool,
    /// Each read: from the client (true) or the application, and its bytes.
    reads: Vec<(bool, Vec<u8>)>,
}

fn guard() -> &'static (tokio::runtime::Runtime, Guard) {
    static GUARD: OnceLock<(tokio::runtime::Runtime, Guard)> = OnceLock::new();
    GUARD.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let metrics = Metrics::register(&mut prometheus_client::registry::Registry::default());
        // Nothing is dialled: a WebSocket's task would connect here, and
        // the run ends before it could.
        let config = GuardConfig::new(([127, 0, 0, 1], 9).into());
        (rt, Guard::new(config, metrics))
    })
}

fuzz_target!(|input: Input| {
    let (rt, guard) = guard();
    let mut chunks: Vec<(bool, &[u8])> = Vec::new();
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    // An empty SETTINGS frame from each side.
    const SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];
    if input.handshake {
        chunks.push((true, PREFACE));
        chunks.push((true, SETTINGS));
        chunks.push((false, SETTINGS));
    }
    chunks.extend(input.reads.iter().map(|(c, b)| (*c, b.as_slice())));
    rt.block_on(async { guard.fuzz_frame_relay(&chunks) });
});
