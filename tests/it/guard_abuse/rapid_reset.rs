//! Rapid reset (CVE-2023-44487): the relay counts streams a client opens
//! and resets at once, and answers too many with GOAWAY(ENHANCE_YOUR_CALM)
//! (src/guard/relay/rapid.rs).

use tokio::time::Instant;

use crate::support::abuse::*;
use crate::support::guard::*;

use super::{Ctx, Report, Swing, ATTACK_LIMIT, ECHO, WRITE_LIMIT};

/// CVE-2023-44487: HEADERS then RST_STREAM in a tight loop, in batches, on
/// connection after connection.
pub(super) async fn rapid_reset(ctx: &Ctx, swing: Swing) -> Report {
    const PAIRS_PER_CONNECTION: u32 = 10_000;
    const BATCH: u32 = 100;
    const MAX_CONNECTIONS: usize = 200;
    let block = grpc_request_block(ECHO, &[]);
    let app_before = ctx.app_requests();
    let start = Instant::now();
    let (mut frames, mut conns, mut most_processed) = (0u64, 0usize, 0u32);
    let mut codes = Vec::new();
    let mut failures = Vec::new();
    while conns < MAX_CONNECTIONS && start.elapsed() < ATTACK_LIMIT {
        let mut a = Attacker::connect(ctx.guard.addr, &[], true).await;
        conns += 1;
        let (mut id, mut pairs) = (1u32, 0u32);
        while pairs < PAIRS_PER_CONNECTION && a.seen.goaway_code().is_none() {
            let mut batch = Vec::new();
            for _ in 0..BATCH {
                batch.extend(encode_frame(HEADERS, END_HEADERS, id, &block));
                batch.extend(rst_stream(id, CANCEL));
                id += 2;
            }
            if a.send(&batch, WRITE_LIMIT).await.is_err() {
                break;
            }
            pairs += BATCH;
            frames += 2 * u64::from(BATCH);
            tokio::task::yield_now().await;
        }
        if !a.seen.wait_goaway_or_close(WRITE_LIMIT).await {
            failures.push(format!(
                "rapid reset: connection {conns} took {pairs} pairs without a GOAWAY or close"
            ));
        }
        codes.push(a.seen.goaway_code());
        if let Some((last, _)) = *a.seen.goaway.lock().expect("goaway") {
            most_processed = most_processed.max(last.div_ceil(2));
        }
        if conns == 2 {
            swing.in_full_swing();
        }
        if swing.probed() && conns >= 5 {
            break;
        }
    }
    let calm = codes
        .iter()
        .filter(|c| **c == Some(ENHANCE_YOUR_CALM))
        .count();
    if calm != codes.len() {
        failures.push(format!(
            "rapid reset: GOAWAY codes {codes:?}, expected ENHANCE_YOUR_CALM on every connection"
        ));
    }
    let app = ctx.attacker_requests(app_before);
    Report {
        frames,
        outcome: format!(
            "GOAWAY(ENHANCE_YOUR_CALM) on {calm}/{conns} conns after ≤{most_processed} streams; {app} reached app"
        ),
        failures,
    }
}
