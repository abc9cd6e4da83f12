//! Control-frame floods: PING, RST_STREAM and SETTINGS as fast as the
//! guard takes them. Its rate limits (src/guard/relay/flood.rs) and its
//! backpressure (it stops reading a client that does not read its acks)
//! bound what each costs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::support::abuse::*;
use crate::support::guard::*;

use super::{code_name, open_subscribe, Ctx, Report, Swing, ATTACK_LIMIT, WRITE_LIMIT};

/// Frames sent `FLOOD_BATCH` at a time (`batch(sent)`) until `max` are sent,
/// the attack limit from `start` passes, the guard closes, a write blocks, or
/// `stop(sent)`; in full swing after ten batches. Returns (sent, blocked).
async fn flood(
    a: &mut Attacker,
    swing: &Swing,
    (start, max): (Instant, u64),
    mut batch: impl FnMut(u64) -> Vec<u8>,
    mut stop: impl FnMut(u64) -> bool,
) -> (u64, bool) {
    let mut sent = 0u64;
    while sent < max && start.elapsed() < ATTACK_LIMIT {
        match a.send(&batch(sent), WRITE_LIMIT).await {
            Ok(()) => sent += FLOOD_BATCH,
            Err(WriteStop::Closed) => break,
            Err(WriteStop::Blocked) => return (sent, true),
        }
        if sent == 10 * FLOOD_BATCH {
            swing.in_full_swing();
        }
        if stop(sent) {
            break;
        }
    }
    (sent, false)
}

/// The acks counted in `counter` once all `sent` are acked, a GOAWAY came,
/// or twice the write limit passed.
async fn acked(seen: &Seen, counter: &AtomicU64, sent: u64) -> u64 {
    let deadline = Instant::now() + WRITE_LIMIT * 2;
    while seen.get(counter) < sent && seen.goaway_code().is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    seen.get(counter)
}

const FLOOD_BATCH: u64 = 1_000;

/// PINGs as fast as the guard takes them; `read`: the attacker reads the
/// acks, else it never reads and the guard must stop reading too.
pub(super) async fn ping_flood(ctx: &Ctx, swing: Swing, read: bool) -> Report {
    const MAX_PINGS: u64 = 2_000_000;
    const MIN_PINGS: u64 = 100_000;
    let mut a = Attacker::connect(ctx.guard.addr, &[], read).await;
    let start = Instant::now();
    // Reading, it stops once the client was probed; not reading, it goes on
    // until the guard stops taking PINGs.
    let (sent, blocked) = flood(
        &mut a,
        &swing,
        (start, MAX_PINGS),
        |sent| (sent..sent + FLOOD_BATCH).flat_map(ping).collect(),
        |sent| read && sent >= MIN_PINGS && swing.probed(),
    )
    .await;
    let took = start.elapsed();
    swing.in_full_swing();
    if blocked {
        // The guard stopped reading: hold the connection (still not
        // reading) while the legitimate client is probed.
        swing.hold().await;
    }
    let mut failures = Vec::new();
    let outcome = if read {
        // Every PING sent is answered, unless the guard closed first.
        let pongs = acked(&a.seen, &a.seen.pongs, sent).await;
        format!(
            "{pongs} acked at {:.0}k/s, GOAWAY {:?}",
            pongs as f64 / took.as_secs_f64() / 1000.0,
            a.seen.goaway_code().map(code_name)
        )
    } else {
        if !blocked && a.seen.goaway_code().is_none() {
            failures.push(format!(
                "ping flood without reading: the guard took all {sent} PINGs without stopping"
            ));
        }
        format!(
            "guard stopped reading after {:.0}k PINGs (attacker write blocked: {blocked})",
            sent as f64 / 1000.0
        )
    };
    Report {
        frames: sent,
        outcome,
        failures,
    }
}

/// RST_STREAM frames as fast as the guard takes them, all for a stream the
/// attacker already reset (legal, and ignored by h2): only the rate limit on
/// RST_STREAM (guard/relay/flood.rs) stands between it and the guard's CPU.
pub(super) async fn rst_flood(ctx: &Ctx, swing: Swing) -> Report {
    const MAX_RESETS: u64 = 2_000_000;
    let mut a = Attacker::connect(ctx.guard.addr, &[], true).await;
    let mut opening = open_subscribe(1, "rst-flood", 1000, 0);
    opening.extend(rst_stream(1, CANCEL));
    let mut failures = Vec::new();
    if a.send(&opening, WRITE_LIMIT).await.is_err() {
        failures.push("rst flood: the stream was not taken".into());
    }
    let start = Instant::now();
    let (sent, blocked) = flood(
        &mut a,
        &swing,
        (start, MAX_RESETS),
        |_| {
            (0..FLOOD_BATCH)
                .flat_map(|_| rst_stream(1, CANCEL))
                .collect()
        },
        |_| false,
    )
    .await;
    swing.in_full_swing();
    if blocked {
        swing.hold().await;
    }
    let closed = a.seen.goaway_code().is_some() || a.seen.closed.load(Ordering::Relaxed);
    if !blocked && !closed {
        failures.push(format!(
            "rst flood: the guard took all {sent} RST_STREAMs in {:?} without slowing down",
            start.elapsed()
        ));
    }
    Report {
        frames: sent + 3,
        outcome: format!(
            "guard slowed the reader after {:.0}k RST_STREAMs (write blocked: {blocked}), GOAWAY {:?}",
            sent as f64 / 1000.0,
            a.seen.goaway_code().map(code_name)
        ),
        failures,
    }
}

/// SETTINGS frames as fast as the guard takes them, each changing
/// SETTINGS_INITIAL_WINDOW_SIZE, on a connection with open streams (so each
/// one makes h2 walk every stream).
pub(super) async fn settings_flood(ctx: &Ctx, swing: Swing) -> Report {
    const STREAMS: u32 = 100;
    const BATCH: u64 = 1_000;
    const MAX_SETTINGS: u64 = 1_000_000;
    const MIN_SETTINGS: u64 = 50_000;
    let mut a = Attacker::connect(ctx.guard.addr, &[], true).await;
    let mut open = Vec::new();
    for i in 0..STREAMS {
        open.extend(open_subscribe(2 * i + 1, &format!("settings-{i}"), 1000, 0));
    }
    let mut failures = Vec::new();
    if a.send(&open, WRITE_LIMIT).await.is_err() {
        failures.push("settings flood: the streams were not taken".into());
    }
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < MAX_SETTINGS && start.elapsed() < ATTACK_LIMIT {
        let batch: Vec<u8> = (sent..sent + BATCH)
            .flat_map(|i| {
                let window = 65_535 + (i % 2) as u32;
                encode_frame(
                    SETTINGS,
                    0,
                    0,
                    &settings_payload(&[(INITIAL_WINDOW_SIZE, window)]),
                )
            })
            .collect();
        if a.send(&batch, WRITE_LIMIT).await.is_err() {
            break;
        }
        sent += BATCH;
        if sent == 10 * BATCH {
            swing.in_full_swing();
        }
        if sent >= MIN_SETTINGS && swing.probed() {
            break;
        }
    }
    let took = start.elapsed();
    swing.in_full_swing();
    let acks = acked(&a.seen, &a.seen.settings_acks, sent).await;
    Report {
        frames: sent + u64::from(STREAMS) * 2,
        outcome: format!(
            "{acks} acked at {:.0}k/s, GOAWAY {:?}",
            acks as f64 / took.as_secs_f64() / 1000.0,
            a.seen.goaway_code().map(code_name)
        ),
        failures,
    }
}
