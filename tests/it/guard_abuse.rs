//! Abuse of the stream guard, against the real binary so its memory can be
//! read: every attack is bounded, a legitimate tonic client keeps being
//! served during and after it (a long stream keeps ticking, a fresh unary
//! Echo succeeds), and the shim's peak RSS stays below the memory limit its
//! container gets in deploy/ (read from the manifests): an attack must never
//! get it OOM-killed. A summary table (attack, frames sent, outcome, legit
//! client, peak RSS) is printed. Exhausting the process-wide caps is tested
//! apart: while they are full, new streams are refused by design.

use crate::support::guard as guard_support;

use crate::support::abuse as abuse_support;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use abuse_support::*;
use drainshim::guard::{GuardConfig, Limits};
use drainshim_bench::proto::bench::{EchoRequest, SubscribeRequest};
use guard_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

const SUBSCRIBE: &str = "/drainshim.bench.v1.Stream/Subscribe";
const ECHO: &str = "/drainshim.bench.v1.Stream/Echo";
/// No attack runs longer than this, whatever happens.
const ATTACK_LIMIT: Duration = Duration::from_secs(20);
/// A write the guard does not take within this long counts as blocked.
const WRITE_LIMIT: Duration = Duration::from_secs(2);

/// The guard process and what the attacks need around it.
struct Ctx {
    /// The application behind the guard; its ledger shows backpressure.
    backend: Backend,
    /// Between the guard and the application: counts the requests that
    /// reached the application.
    tap: Tap,
    guard: GuardProcess,
    legit: Legit,
}

impl Ctx {
    /// Requests the guard forwarded to the application so far, the
    /// legitimate client's included, and how many of those were its Echoes.
    fn app_requests(&self) -> (u64, u64) {
        let echoes = self.legit.echoes.load(Ordering::Relaxed);
        let all = self
            .tap
            .events()
            .iter()
            .filter(|e| {
                e.dir == Dir::Up
                    && matches!(&e.what, What::Frame(f) if f.ty == HEADERS && f.stream != 0)
            })
            .count() as u64;
        (all, echoes)
    }

    /// Requests of the attacker that reached the application since `before`
    /// (an [`Ctx::app_requests`] reading). An Echo of the legitimate client
    /// still in flight counts as the attacker's: this errs towards failing.
    fn attacker_requests(&self, before: (u64, u64)) -> u64 {
        let (all, echoes) = self.app_requests();
        (all - before.0).saturating_sub(echoes - before.1)
    }

    /// Sum of the messages the application produced on streams `prefix-0..n`.
    fn produced(&self, prefix: &str, n: usize) -> u64 {
        (0..n)
            .filter_map(|i| {
                self.backend
                    .service
                    .ledger
                    .last_written(&format!("{prefix}-{i}"))
            })
            .sum()
    }

    /// Waits until the application stops producing on `prefix-0..n` (its
    /// total is unchanged for a second), bounded; returns the total.
    async fn plateau(&self, prefix: &str, n: usize) -> u64 {
        let deadline = Instant::now() + ATTACK_LIMIT / 2;
        let mut last = self.produced(prefix, n);
        let mut since = Instant::now();
        while Instant::now() < deadline && since.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = self.produced(prefix, n);
            if now != last {
                (last, since) = (now, Instant::now());
            }
        }
        last
    }
}

/// Signals between an attack and the probe of the legitimate client.
#[derive(Clone)]
struct Swing {
    /// Set by the attack once it is in full swing.
    started: Arc<watch::Sender<bool>>,
    /// Set once the probe during the attack is over.
    probed: Arc<watch::Sender<bool>>,
}

impl Swing {
    fn in_full_swing(&self) {
        self.started.send_replace(true);
    }

    fn probed(&self) -> bool {
        *self.probed.borrow()
    }

    /// Holds the attack until the legitimate client was probed, bounded.
    async fn hold(&self) {
        let mut rx = self.probed.subscribe();
        let _ = tokio::time::timeout(ATTACK_LIMIT, rx.wait_for(|p| *p)).await;
    }
}

/// What an attack reports.
struct Report {
    frames: u64,
    outcome: String,
    /// Checks that failed.
    failures: Vec<String>,
}

/// Runs one attack with the legitimate client probed during and after it,
/// and the guard's memory and CPU measured.
async fn run<F, Fut>(ctx: &Ctx, name: &str, attack: F) -> (Row, Vec<String>)
where
    F: FnOnce(Swing) -> Fut,
    Fut: Future<Output = Report>,
{
    eprintln!("attack: {name}");
    ctx.guard.reset_peak();
    let cpu0 = ctx.guard.cpu();
    let swing = Swing {
        started: Arc::new(watch::channel(false).0),
        probed: Arc::new(watch::channel(false).0),
    };
    let over = AtomicBool::new(false);
    let mut started = swing.started.subscribe();
    let probed = swing.probed.clone();
    let attack = async {
        let r = tokio::time::timeout(ATTACK_LIMIT * 2, attack(swing)).await;
        over.store(true, Ordering::Relaxed);
        r.unwrap_or_else(|_| Report {
            frames: 0,
            outcome: "attack did not end in time".into(),
            failures: vec![format!("{name}: the attack did not end in time")],
        })
    };
    let during = async {
        // Started, or the attack ended without saying so.
        let _ = tokio::time::timeout(ATTACK_LIMIT, started.wait_for(|s| *s)).await;
        let r = ctx.legit.probe().await;
        let overlapped = !over.load(Ordering::Relaxed);
        probed.send_replace(true);
        (r, overlapped)
    };
    let (report, (during, overlapped)) = tokio::join!(attack, during);
    let after = ctx.legit.probe().await;
    let mem = ctx.guard.mem();
    let cpu = ctx.guard.cpu().saturating_sub(cpu0);

    let mut failures = report.failures;
    let when = if overlapped { "during" } else { "right after" };
    let legit = match (&during, &after) {
        (Ok(d), Ok(a)) => format!(
            "ok {when} ({} ms), after ({} ms)",
            d.as_millis(),
            a.as_millis()
        ),
        (Err(e), _) => {
            failures.push(format!("{name}: legitimate client {when} the attack: {e}"));
            format!("FAILED {when}")
        }
        (_, Err(e)) => {
            failures.push(format!("{name}: legitimate client after the attack: {e}"));
            "FAILED after".into()
        }
    };
    let ceiling = manifest_memory_limit();
    if mem.rss > ceiling {
        failures.push(format!(
            "{name}: guard RSS after the attack {:.1} MiB is over the manifests' limit {:.0} MiB",
            mem.rss as f64 / MIB,
            ceiling as f64 / MIB
        ));
    }
    if mem.hwm > ceiling {
        failures.push(format!(
            "{name}: guard peak RSS {:.1} MiB is over the manifests' limit {:.0} MiB",
            mem.hwm as f64 / MIB,
            ceiling as f64 / MIB
        ));
    }
    let row = Row {
        attack: name.to_string(),
        frames: report.frames,
        outcome: report.outcome,
        legit,
        peak: mem.hwm,
        after: mem.rss,
        cpu,
    };
    eprintln!("{row:?}");
    (row, failures)
}

fn code_name(code: u32) -> String {
    match code {
        0x0 => "NO_ERROR".into(),
        0x1 => "PROTOCOL_ERROR".into(),
        0x6 => "FRAME_SIZE_ERROR".into(),
        0xb => "ENHANCE_YOUR_CALM".into(),
        c => format!("0x{c:x}"),
    }
}

fn subscribe_request(id: &str, interval_ms: u32, payload_bytes: u32) -> Vec<u8> {
    grpc_message(&SubscribeRequest {
        stream_id: id.to_string(),
        count: 0,
        interval_ms,
        payload_bytes,
        ..Default::default()
    })
}

/// HEADERS + DATA(END_STREAM) opening a Subscribe stream.
fn open_subscribe(stream: u32, id: &str, interval_ms: u32, payload_bytes: u32) -> Vec<u8> {
    let mut out = encode_frame(
        HEADERS,
        END_HEADERS,
        stream,
        &grpc_request_block(SUBSCRIBE, &[]),
    );
    out.extend(encode_frame(
        DATA,
        END_STREAM,
        stream,
        &subscribe_request(id, interval_ms, payload_bytes),
    ));
    out
}

/// HEADERS + DATA(END_STREAM): a whole unary Echo request.
fn unary_echo(stream: u32) -> Vec<u8> {
    let mut out = encode_frame(HEADERS, END_HEADERS, stream, &grpc_request_block(ECHO, &[]));
    out.extend(encode_frame(
        DATA,
        END_STREAM,
        stream,
        &grpc_message(&EchoRequest {
            body: "abuse".into(),
            ..Default::default()
        }),
    ));
    out
}

// ===== The attacks =====

/// CVE-2023-44487: HEADERS then RST_STREAM in a tight loop, in batches, on
/// connection after connection.
async fn rapid_reset(ctx: &Ctx, swing: Swing) -> Report {
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

/// More streams than SETTINGS_MAX_CONCURRENT_STREAMS on several connections.
async fn many_streams(ctx: &Ctx, swing: Swing) -> Report {
    const CONNECTIONS: usize = 4;
    // The binary runs with the default limits.
    let max_streams = u64::from(Limits::default().max_concurrent_streams);
    let per_conn = max_streams + max_streams / 2;
    let app_before = ctx.app_requests();
    let mut attackers = Vec::new();
    let mut frames = 0;
    let mut failures = Vec::new();
    for c in 0..CONNECTIONS {
        let mut a =
            Attacker::connect(ctx.guard.addr, &[(INITIAL_WINDOW_SIZE, 1 << 20)], true).await;
        let mut bytes = window_update(0, MAX_WINDOW - 65_535);
        for i in 0..per_conn {
            let id = format!("many-{c}-{i}");
            bytes.extend(open_subscribe(2 * i as u32 + 1, &id, 1000, 0));
        }
        if a.send(&bytes, ATTACK_LIMIT).await.is_err() {
            failures.push(format!(
                "many streams: connection {c} did not take the requests"
            ));
        }
        frames += 1 + 2 * per_conn;
        attackers.push(a);
    }
    // Every stream is either served (first tick) or refused.
    let deadline = Instant::now() + ATTACK_LIMIT;
    let settled = |a: &Attacker| {
        a.seen.get(&a.seen.refused) + a.seen.get(&a.seen.headers) >= per_conn
            || a.seen.goaway_code().is_some()
    };
    while !attackers.iter().all(settled) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    swing.in_full_swing();
    swing.hold().await;
    let refused: u64 = attackers.iter().map(|a| a.seen.get(&a.seen.refused)).sum();
    let goaways: Vec<_> = attackers
        .iter()
        .filter_map(|a| a.seen.goaway_code())
        .collect();
    let app = ctx.attacker_requests(app_before);
    let expected_refused = CONNECTIONS as u64 * (per_conn - max_streams);
    if refused < expected_refused && goaways.is_empty() {
        failures.push(format!(
            "many streams: {refused} refused, expected {expected_refused} (or a GOAWAY)"
        ));
    }
    if app > CONNECTIONS as u64 * max_streams {
        failures.push(format!(
            "many streams: {app} streams reached the application, over {CONNECTIONS} connections x {max_streams}"
        ));
    }
    drop(attackers);
    Report {
        frames,
        outcome: format!(
            "{CONNECTIONS}x{per_conn} opened: {app} served, {refused} REFUSED_STREAM, GOAWAYs {goaways:?}"
        ),
        failures,
    }
}

/// A header block the guard must refuse, sent on fresh connections until
/// the legitimate client was probed. `request` is the frames of one request
/// on stream 1; `expect_goaway`: only a GOAWAY is the right answer.
async fn bad_headers(
    ctx: &Ctx,
    swing: Swing,
    what: &str,
    request: Vec<Vec<u8>>,
    expect_goaway: bool,
) -> Report {
    let app_before = ctx.app_requests();
    let start = Instant::now();
    let (mut frames, mut sent) = (0u64, 0u32);
    let mut answers = std::collections::BTreeMap::<String, u32>::new();
    let mut failures = Vec::new();
    while start.elapsed() < ATTACK_LIMIT && !(swing.probed() && sent >= 5) {
        let mut a = Attacker::connect(ctx.guard.addr, &[], true).await;
        let mut wrote = 0;
        for f in &request {
            if a.send(f, WRITE_LIMIT).await.is_err() {
                break;
            }
            wrote += 1;
        }
        frames += wrote;
        sent += 1;
        // The answer: 431 (HEADERS+END_STREAM), a reset, or a GOAWAY.
        let deadline = Instant::now() + WRITE_LIMIT * 2;
        let answer = loop {
            let woken = a.seen.changed.notified();
            if let Some(code) = a.seen.goaway_code() {
                break format!("GOAWAY({})", code_name(code));
            }
            if let Some(f) = a.seen.first_answer.lock().expect("answer").clone() {
                break match f.ty {
                    HEADERS if f.flags & END_STREAM != 0 => "431".to_string(),
                    HEADERS => "HEADERS (served!)".to_string(),
                    _ => format!("RST_STREAM({})", code_name(f.rst.unwrap_or_default())),
                };
            }
            if a.seen.closed.load(Ordering::Relaxed) {
                break "closed".to_string();
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                break "no answer".to_string();
            }
        };
        *answers.entry(answer).or_default() += 1;
        swing.in_full_swing();
    }
    let app = ctx.attacker_requests(app_before);
    if app > 0 {
        failures.push(format!("{what}: {app} requests reached the application"));
    }
    let good = |a: &str| {
        if expect_goaway {
            a.starts_with("GOAWAY")
        } else {
            a == "431" || a.starts_with("RST_STREAM") || a.starts_with("GOAWAY")
        }
    };
    if let Some(bad) = answers.keys().find(|a| !good(a)) {
        failures.push(format!("{what}: answered {bad}; all answers {answers:?}"));
    }
    let summary: Vec<String> = answers.iter().map(|(a, n)| format!("{a} x{n}")).collect();
    Report {
        frames,
        outcome: format!("{} ; {app} reached app", summary.join(", ")),
        failures,
    }
}

/// Header fields `x-h0000: v`, `x-h0001: v`, ...: each tiny, together over
/// the 64 KiB header list limit (h2 counts 32 bytes per field on top).
fn small_headers(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut b = Vec::new();
            hpack_literal(&mut b, &format!("x-h{i:04}"), "v");
            b
        })
        .collect()
}

/// `fields` packed into HEADERS + CONTINUATION frames of at most `max` bytes,
/// the request head of stream 1 first.
fn header_frames(fields: &[Vec<u8>], max: usize) -> Vec<Vec<u8>> {
    let mut block = grpc_request_block(ECHO, &[]);
    let mut frames = Vec::new();
    let mut ty = HEADERS;
    for f in fields {
        if block.len() + f.len() > max {
            let flags = if ty == HEADERS { END_STREAM } else { 0 };
            frames.push(encode_frame(ty, flags, 1, &block));
            block.clear();
            ty = CONTINUATION;
        }
        block.extend_from_slice(f);
    }
    let flags = END_HEADERS | if ty == HEADERS { END_STREAM } else { 0 };
    frames.push(encode_frame(ty, flags, 1, &block));
    frames
}

/// An HPACK bomb: one 4,000-byte header put in the dynamic table, then
/// referenced by its one-byte index over and over (16,000 times a frame,
/// 64 MB decoded per 16 KiB frame).
fn hpack_bomb(frames: usize) -> Vec<Vec<u8>> {
    let mut block = grpc_request_block(ECHO, &[]);
    // Literal with incremental indexing, new name: it becomes index 62.
    block.push(0x40);
    block.push(6);
    block.extend_from_slice(b"x-bomb");
    block.push(0x7f);
    block.extend_from_slice(&[0xa1, 0x1e]); // 127 + 33 + 30 * 128 = 4000
    block.extend(std::iter::repeat_n(b'b', 4000));
    let mut out = vec![encode_frame(HEADERS, END_STREAM, 1, &block)];
    let refs = vec![0x80 | 62u8; 16_000];
    for i in 0..frames {
        let flags = if i + 1 == frames { END_HEADERS } else { 0 };
        out.push(encode_frame(CONTINUATION, flags, 1, &refs));
    }
    out
}

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
async fn ping_flood(ctx: &Ctx, swing: Swing, read: bool) -> Report {
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
async fn rst_flood(ctx: &Ctx, swing: Swing) -> Report {
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
async fn settings_flood(ctx: &Ctx, swing: Swing) -> Report {
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

/// The client's stream windows are zero and it never opens them, while the
/// application produces as fast as it may.
async fn zero_window(ctx: &Ctx, swing: Swing) -> Report {
    const STREAMS: usize = 200;
    const PAYLOAD: u32 = 64 * 1024;
    let mut a = Attacker::connect(ctx.guard.addr, &[(INITIAL_WINDOW_SIZE, 0)], true).await;
    let mut bytes = Vec::new();
    for i in 0..STREAMS {
        bytes.extend(open_subscribe(
            2 * i as u32 + 1,
            &format!("zw-{i}"),
            0,
            PAYLOAD,
        ));
    }
    let mut failures = Vec::new();
    if a.send(&bytes, WRITE_LIMIT).await.is_err() {
        failures.push("zero window: the streams were not taken".into());
    }
    let produced = ctx.plateau("zw", STREAMS).await;
    swing.in_full_swing();
    swing.hold().await;
    let most = (0..STREAMS)
        .filter_map(|i| ctx.backend.service.ledger.last_written(&format!("zw-{i}")))
        .max()
        .unwrap_or(0);
    let data = a.seen.get(&a.seen.data_bytes);
    if data > 0 {
        failures.push(format!(
            "zero window: the guard sent {data} DATA bytes into a zero window"
        ));
    }
    // The guard's 256 KiB stream window holds 4 messages, the application's
    // own h2 send buffer and its 4-message channel a few more.
    if most > 16 {
        failures.push(format!(
            "zero window: the application produced {most} messages on one stream"
        ));
    }
    Report {
        frames: 1 + 2 * STREAMS as u64,
        outcome: format!(
            "{STREAMS} streams held; app backpressured at {produced} msgs ({:.0} MiB), ≤{most}/stream; {data} B sent",
            (produced * u64::from(PAYLOAD)) as f64 / MIB
        ),
        failures,
    }
}

/// What the guard may hold for one connection whose client never reads:
/// the response data in flight from the application (the guard's receive
/// window towards it) and, towards the client, at most the send buffer of
/// every stream.
fn never_read_bound(l: &Limits) -> u64 {
    u64::from(l.connection_window)
        + u64::from(l.max_concurrent_streams) * l.max_send_buffer_size as u64
}

/// Requests, then the client never reads the socket again, after opening
/// every window as wide as HTTP/2 allows: only the guard's own buffer
/// limits stand between the application and the guard's memory.
async fn never_reads(ctx: &Ctx, swing: Swing, connections: usize) -> Report {
    const PAYLOAD: u32 = 16 * 1024;
    const UNARY: u32 = 100;
    let limits = Limits::default();
    let streams = limits.max_concurrent_streams as usize - UNARY as usize;
    let base = ctx.guard.mem().rss;
    let mut attackers = Vec::new();
    let mut frames = 0;
    let mut failures = Vec::new();
    for c in 0..connections {
        let mut a =
            Attacker::connect(ctx.guard.addr, &[(INITIAL_WINDOW_SIZE, MAX_WINDOW)], false).await;
        let mut bytes = window_update(0, MAX_WINDOW - 65_535);
        for i in 0..streams {
            let id = format!("nr-{}", c * streams + i);
            bytes.extend(open_subscribe(2 * i as u32 + 1, &id, 0, PAYLOAD));
        }
        for u in 0..UNARY {
            bytes.extend(unary_echo(2 * (streams as u32 + u) + 1));
        }
        if a.send(&bytes, ATTACK_LIMIT).await.is_err() {
            failures.push(format!(
                "never reads: connection {c} did not take the requests"
            ));
        }
        frames += 1 + 2 * (streams as u64 + u64::from(UNARY));
        attackers.push(a);
    }
    let produced = ctx.plateau("nr", connections * streams).await;
    swing.in_full_swing();
    swing.hold().await;
    let grew = ctx.guard.mem().hwm.saturating_sub(base);
    // Twice the buffered bytes: allocator and bookkeeping overhead.
    let bound = connections as u64 * never_read_bound(&limits) * 2;
    if grew > bound {
        failures.push(format!(
            "never reads: the guard grew by {:.1} MiB, over {:.1} MiB ({connections} x (connection window + streams x send buffer), doubled)",
            grew as f64 / MIB,
            bound as f64 / MIB
        ));
    }
    drop(attackers);
    Report {
        frames,
        outcome: format!(
            "{connections}x({streams} streams + {UNARY} unary); app stalled at {:.0} MiB; guard +{:.0} MiB (bound {:.0})",
            (produced * u64::from(PAYLOAD)) as f64 / MIB,
            grew as f64 / MIB,
            bound as f64 / MIB
        ),
        failures,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attack_is_bounded_and_the_guard_keeps_serving() {
    let backend = start_backend().await;
    let tap = Tap::start(backend.addr).await;
    let guard = GuardProcess::spawn(tap.addr).await;
    let legit = Legit::start(guard.addr).await;
    let ctx = Ctx {
        backend,
        tap,
        guard,
        legit,
    };
    let baseline = ctx.guard.mem();
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let mut record = |(row, f): (Row, Vec<String>)| {
        rows.push(row);
        failures.extend(f);
    };

    // Each attack, measured by `run` and recorded in the table.
    macro_rules! attack {
        ($name:expr, |$s:ident| $body:expr) => {
            record(run(&ctx, $name, |$s| $body).await)
        };
    }
    attack!("rapid reset (HEADERS+RST_STREAM)", |s| rapid_reset(&ctx, s));
    attack!("streams over max_concurrent x4 conns", |s| many_streams(
        &ctx, s
    ));
    attack!("3,000 small headers (> 64 KiB)", |s| bad_headers(
        &ctx,
        s,
        "small headers",
        header_frames(&small_headers(3000), 16 * 1024),
        false,
    ));
    attack!("3,000 CONTINUATION frames", |s| bad_headers(
        &ctx,
        s,
        "continuations",
        header_frames(&small_headers(3000), 12),
        true,
    ));
    attack!("HPACK bomb (64 MB/frame decoded)", |s| bad_headers(
        &ctx,
        s,
        "hpack bomb",
        hpack_bomb(4),
        true
    ));
    attack!("PING flood, attacker reads", |s| ping_flood(&ctx, s, true));
    attack!("PING flood, attacker never reads", |s| ping_flood(
        &ctx, s, false
    ));
    attack!("RST_STREAM flood (a closed stream)", |s| rst_flood(&ctx, s));
    attack!("SETTINGS flood (100 open streams)", |s| settings_flood(
        &ctx, s
    ));
    attack!("window kept at zero (200 streams)", |s| zero_window(
        &ctx, s
    ));
    attack!("never reads, max windows, 2 conns", |s| never_reads(
        &ctx, s, 2
    ));

    print_table(baseline, &rows);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A client that sends requests with its windows wide open and then never
/// reads: the answers it does not take stay within the send buffers, and the
/// connection is closed once it has been idle for `idle_timeout` (unary
/// calls), or at max connection age once its streams could not be ended
/// within `end_timeout` (streams). Other clients are served meanwhile.
/// The guard's GOAWAY ack and shutdown waits are 300 ms; `configure` sets
/// the rest.
async fn never_reading_client_is_closed(
    streams: u32,
    unary: u32,
    configure: impl FnOnce(&mut GuardConfig),
) {
    let (backend, g) = guarded(|config| {
        config.limits.goaway_ack_timeout = Duration::from_millis(300);
        config.limits.shutdown_timeout = Duration::from_millis(300);
        configure(config);
    })
    .await;
    let mut a = Attacker::connect(g.addr, &[(INITIAL_WINDOW_SIZE, MAX_WINDOW)], false).await;
    let mut bytes = window_update(0, MAX_WINDOW - 65_535);
    for i in 0..streams {
        bytes.extend(open_subscribe(
            2 * i + 1,
            &format!("closed-{i}"),
            0,
            16 * 1024,
        ));
    }
    for u in 0..unary {
        bytes.extend(unary_echo(2 * (streams + u) + 1));
    }
    a.send(&bytes, PATIENCE).await.expect("requests sent");
    if streams > 0 {
        wait_until("the application to produce", || {
            backend.service.ledger.last_written("closed-0").is_some()
        })
        .await;
    }
    wait_until("the guard to close the connection that never reads", || {
        g.guard.active_connections() == 0
    })
    .await;
    let mut c = connect_client(g.addr).await;
    assert_eq!(
        within("echo", echo(&mut c, "after")).await.expect("echo"),
        "after"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_its_answers_is_closed_when_idle() {
    never_reading_client_is_closed(0, 100, |c| {
        c.limits.idle_timeout = Duration::from_millis(300)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_its_streams_is_closed_at_max_age() {
    never_reading_client_is_closed(50, 10, |c| {
        c.max_connection_age = Some(Duration::from_secs(1));
        c.max_connection_age_grace = Duration::from_millis(300);
        c.limits.end_timeout = Duration::from_millis(300);
    })
    .await;
}

/// The process-wide caps, exhausted at their defaults by the worst clients
/// they allow: every stream slot taken by connections whose clients opened
/// their windows wide and never read (the most memory the guard can be made
/// to hold), then every connection slot. Streams past the cap are refused
/// with REFUSED_STREAM (retryable: Envoy retries them, on the app when it
/// fails open), connections past it are closed, the long stream already open
/// keeps ticking, the shim's peak RSS stays below the manifests' memory
/// limit, and once the attacker leaves a fresh call is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausting_the_caps_is_refused_retryably_within_the_memory_limit() {
    const PAYLOAD: u32 = 16 * 1024;
    let limits = Limits::default();
    let per_conn = limits.max_concurrent_streams as usize;
    let hog_conns = limits.max_streams.div_ceil(per_conn);
    let ceiling = manifest_memory_limit();
    let backend = start_backend().await;
    let guard = GuardProcess::spawn(backend.addr).await;
    let legit = Legit::start(guard.addr).await;
    guard.reset_peak();
    let mut failures = Vec::new();

    // 1. Every stream slot, held by clients that never read.
    let mut hogs = Vec::new();
    for c in 0..hog_conns {
        let mut a =
            Attacker::connect(guard.addr, &[(INITIAL_WINDOW_SIZE, MAX_WINDOW)], false).await;
        let mut bytes = window_update(0, MAX_WINDOW - 65_535);
        for i in 0..per_conn {
            let id = format!("hog-{}", c * per_conn + i);
            bytes.extend(open_subscribe(2 * i as u32 + 1, &id, 0, PAYLOAD));
        }
        if a.send(&bytes, ATTACK_LIMIT).await.is_err() {
            failures.push(format!(
                "caps: hog connection {c} did not take its requests"
            ));
        }
        hogs.push(a);
    }
    // How many of them reached the app (a guard whose writes block may
    // still be reading the last requests): settled when the count holds.
    let hog_total = hog_conns * per_conn;
    let admitted = || {
        (0..hog_total)
            .filter(|i| {
                backend
                    .service
                    .ledger
                    .last_written(&format!("hog-{i}"))
                    .is_some()
            })
            .count()
    };
    let deadline = Instant::now() + ATTACK_LIMIT;
    let (mut last, mut since) = (admitted(), Instant::now());
    while Instant::now() < deadline && since.elapsed() < Duration::from_secs(1) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = admitted();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    // A reading client now: its streams past the free slots find the cap full.
    let free = limits.max_streams.saturating_sub(last + 1);
    let late_n = (free + 100).min(per_conn) as u32;
    let mut late = Attacker::connect(guard.addr, &[], true).await;
    let mut bytes = Vec::new();
    for i in 0..late_n {
        bytes.extend(open_subscribe(2 * i + 1, &format!("late-{i}"), 60_000, 0));
    }
    late.send(&bytes, WRITE_LIMIT)
        .await
        .expect("late streams sent");
    let deadline = Instant::now() + ATTACK_LIMIT;
    while late.seen.get(&late.seen.refused) + late.seen.get(&late.seen.headers) < u64::from(late_n)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refused = late.seen.get(&late.seen.refused);
    let want = u64::from(late_n).saturating_sub(free as u64) * 9 / 10;
    if refused < want {
        failures.push(format!(
            "caps: {refused} of {late_n} late streams refused with REFUSED_STREAM ({last} hog streams admitted, {free} slots free), want at least {want}"
        ));
    }
    let before = legit.sub.received();
    let ticking = Instant::now() + PROBE_PATIENCE;
    while legit.sub.received() <= before && Instant::now() < ticking {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if legit.sub.received() <= before {
        failures.push("caps: the long stream stalled while the stream cap was full".into());
    }
    let streams_peak = guard.mem().hwm;
    drop(late);
    drop(hogs);
    guard.reset_peak();

    // 2. Every connection slot (each with one stream, or the header read
    // timeout would close it): the ones past the cap are closed at once.
    let extra = 100;
    let mut conns = Vec::new();
    let mut closed = 0;
    for i in 0..limits.max_connections + extra {
        let Ok(mut tcp) = tokio::net::TcpStream::connect(guard.addr).await else {
            closed += 1;
            continue;
        };
        let mut hello = PREFACE.to_vec();
        hello.extend(encode_frame(SETTINGS, 0, 0, &[]));
        hello.extend(open_subscribe(1, &format!("conn-{i}"), 60_000, 0));
        if tcp.write_all(&hello).await.is_err() {
            closed += 1;
            continue;
        }
        conns.push(tcp);
    }
    // Open ones answer (SETTINGS); closed ones read EOF or a reset.
    for tcp in &mut conns {
        let mut b = [0u8; 64];
        match tokio::time::timeout(WRITE_LIMIT, tcp.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => closed += 1,
            _ => {}
        }
    }
    if closed < extra {
        failures.push(format!(
            "caps: {closed} of {} connections closed, want at least {extra} past the cap of {}",
            limits.max_connections + extra,
            limits.max_connections
        ));
    }
    let mem = guard.mem();
    drop(conns);

    // 3. The attacker is gone: a fresh call is served again.
    let deadline = Instant::now() + ATTACK_LIMIT;
    let mut after = legit.probe().await;
    while after.is_err() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = legit.probe().await;
    }
    if let Err(e) = after {
        failures.push(format!("caps: the legitimate client after the attack: {e}"));
    }
    eprintln!(
        "caps: {hog_conns}x{per_conn} never-reading streams ({last} admitted), {refused} of {late_n} late refused: peak {:.1} MiB; \
         {} connections ({closed} closed): peak {:.1} MiB; manifests' limit {:.0} MiB",
        streams_peak as f64 / MIB,
        limits.max_connections + extra,
        mem.hwm as f64 / MIB,
        ceiling as f64 / MIB
    );
    for (phase, peak) in [("streams", streams_peak), ("connections", mem.hwm)] {
        if peak > ceiling {
            failures.push(format!(
                "caps: the shim's peak RSS at the {phase} cap, {:.1} MiB, is over the manifests' limit {:.0} MiB",
                peak as f64 / MIB,
                ceiling as f64 / MIB
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
