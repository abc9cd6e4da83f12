//! Abuse of the stream guard, against the real binary so its memory can be
//! read: every attack is bounded, a legitimate tonic client keeps being
//! served during and after it (a long stream keeps ticking, a fresh unary
//! Echo succeeds), and the shim's peak RSS stays below the memory limit its
//! container gets in deploy/ (read from the manifests): an attack must never
//! get it OOM-killed. A summary table (attack, frames sent, outcome, legit
//! client, peak RSS) is printed. Exhausting the process-wide caps is tested
//! apart: while they are full, new streams are refused by design.
//!
//! One room per defence, each with its attacks and the tests of its own:
//! `rapid_reset` (the rapid-reset count), `caps` (the per-connection stream
//! limit and the process-wide stream and connection caps), `headers` (the
//! header list, CONTINUATION and HPACK limits), `floods` (the control-frame
//! rate limits: PING, RST_STREAM, SETTINGS) and `slow_readers` (the buffer
//! bounds, and closing a client that never reads). This file holds the
//! harness they share and the table test that runs every attack in turn.

mod caps;
mod floods;
mod headers;
mod rapid_reset;
mod slow_readers;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use drainshim_bench::proto::bench::{EchoRequest, SubscribeRequest};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::support::abuse::*;
use crate::support::guard::*;
use caps::many_streams;
use floods::{ping_flood, rst_flood, settings_flood};
use headers::{bad_headers, header_frames, hpack_bomb, small_headers};
use rapid_reset::rapid_reset;
use slow_readers::{never_reads, zero_window};

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
