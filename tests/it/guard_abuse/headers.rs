//! Header blocks the guard must refuse: a header list over its limit, a
//! block split into thousands of CONTINUATION frames, an HPACK bomb. None
//! reaches the application; each is answered 431, reset or GOAWAY.

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use crate::support::abuse::*;
use crate::support::guard::*;

use super::{code_name, Ctx, Report, Swing, ATTACK_LIMIT, ECHO, WRITE_LIMIT};

/// A header block the guard must refuse, sent on fresh connections until
/// the legitimate client was probed. `request` is the frames of one request
/// on stream 1; `expect_goaway`: only a GOAWAY is the right answer.
pub(super) async fn bad_headers(
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
pub(super) fn small_headers(n: usize) -> Vec<Vec<u8>> {
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
pub(super) fn header_frames(fields: &[Vec<u8>], max: usize) -> Vec<Vec<u8>> {
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
pub(super) fn hpack_bomb(frames: usize) -> Vec<Vec<u8>> {
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
