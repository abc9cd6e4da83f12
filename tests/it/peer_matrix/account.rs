//! What the matrix counts besides the clients: the frames between the
//! guard and the app (the tap), the guard's own count of the app's GOAWAYs
//! (the sidecar's /metrics), and the table a case's counts become.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::support::guard::{Dir, Tap, What, ACK, DATA, GOAWAY, PING, RST_STREAM, SETTINGS};

use super::clients::End;
use super::Case;

/// What the tap saw between the guard and the app.
#[derive(Debug, Default)]
pub struct Wire {
    /// Connections that carried HTTP/2 (the guard's readiness checks connect
    /// and close without a byte).
    pub h2_conns: usize,
    /// PINGs the guard sent the app (not acks).
    pub pings_to_app: usize,
    /// GOAWAYs the app sent, by error code name.
    pub app_goaways: BTreeMap<String, u64>,
    /// RST_STREAMs the app sent, by error code name.
    pub app_resets: BTreeMap<String, u64>,
}

impl Wire {
    pub fn of(tap: &Tap) -> Wire {
        let mut w = Wire::default();
        let mut h2 = BTreeSet::new();
        for e in tap.events() {
            let What::Frame(f) = &e.what else { continue };
            match e.dir {
                Dir::Up => {
                    h2.insert(e.conn);
                    if f.ty == PING && f.flags & 1 == 0 {
                        w.pings_to_app += 1;
                    }
                }
                Dir::Down => match (f.ty, f.goaway, f.rst) {
                    (GOAWAY, Some((_, code)), _) => {
                        *w.app_goaways.entry(h2_error(code)).or_default() += 1;
                    }
                    (RST_STREAM, _, Some(code)) => {
                        *w.app_resets.entry(h2_error(code)).or_default() += 1;
                    }
                    _ => {}
                },
            }
        }
        w.h2_conns = h2.len();
        w
    }
}

/// The stream id and sequence number of the Tick at the start of a DATA
/// payload: a gRPC message prefix (5 bytes), then field 1 (the id) and
/// field 2 (the sequence number), as every app of the matrix encodes it.
fn tick(head: &[u8]) -> Option<(&str, u64)> {
    let msg = head.get(5..)?;
    let (&[0x0a, len], rest) = msg.split_first_chunk::<2>()? else {
        return None;
    };
    let id = std::str::from_utf8(rest.get(..usize::from(len))?).ok()?;
    let rest = rest.get(usize::from(len)..)?;
    let (&0x10, mut varint) = rest.split_first()? else {
        return None;
    };
    let mut seq = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, more) = varint.split_first()?;
        seq |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some((id, seq));
        }
        varint = more;
    }
    None
}

/// Where a message the app handed its transport and the client never got
/// went, by the tap between the guard and the app.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fate {
    /// It reached the guard before the guard reset the stream at the app,
    /// and was not forwarded: the guard dropped what it had received.
    DroppedByGuard,
    /// It reached the guard after the guard reset the stream at the app.
    AfterReset,
    /// It never left the app: its transport took it during the ending and
    /// dropped it with the stream.
    NeverSent,
    /// Its start reached the guard, and the rest never left the app: its
    /// transport was writing it when it read the cancel and stopped
    /// mid-message (grpc-go does). The guard drops the start, counted as
    /// `reason="partial_message"`: half a message is no message.
    CutByApp,
}

/// For a call whose messages `lost` never reached its client: where each
/// went, and the frames of its ending (its last message, the guard's
/// SETTINGS round trips, the guard's RST_STREAM to the app), in
/// milliseconds from that RST_STREAM.
pub fn lost_fates(tap: &Tap, id: &str, lost: std::ops::RangeInclusive<u64>) -> (Vec<Fate>, String) {
    let events = tap.events();
    let seen = |e: &crate::support::guard::Event| match &e.what {
        What::Frame(f) if e.dir == Dir::Down && f.ty == DATA => tick(&f.head)
            .filter(|(i, _)| *i == id)
            .map(|(_, seq)| (e.conn, f.stream, seq)),
        _ => None,
    };
    let Some((conn, stream, _)) = events.iter().find_map(seen) else {
        return (
            lost.map(|_| Fate::NeverSent).collect(),
            format!("{id}: none of its messages was on the wire"),
        );
    };
    let reset = events.iter().find_map(|e| match &e.what {
        What::Frame(f)
            if e.conn == conn && e.dir == Dir::Up && f.ty == RST_STREAM && f.stream == stream =>
        {
            Some(e.at)
        }
        _ => None,
    });
    let arrived = |seq: u64| {
        events
            .iter()
            .find_map(|e| seen(e).filter(|t| t.2 == seq).map(|_| e.at))
    };
    // Whether message `seq` reached the guard whole: its gRPC length prefix
    // against the stream's DATA from its first frame on.
    let whole = |seq: u64| {
        let Some(at) = events
            .iter()
            .position(|e| seen(e).is_some_and(|t| t.2 == seq))
        else {
            return false;
        };
        let What::Frame(first) = &events[at].what else {
            return false;
        };
        let Some(len) = first.head.get(1..5) else {
            return false;
        };
        let want = 5 + u64::from(u32::from_be_bytes([len[0], len[1], len[2], len[3]]));
        let got: u64 = events[at..]
            .iter()
            .filter_map(|e| match &e.what {
                What::Frame(f)
                    if e.conn == conn
                        && e.dir == Dir::Down
                        && f.ty == DATA
                        && f.stream == stream =>
                {
                    Some(u64::from(f.len))
                }
                _ => None,
            })
            .sum();
        got >= want
    };
    let fates = lost
        .clone()
        .map(|seq| match (arrived(seq), reset) {
            (None, _) => Fate::NeverSent,
            (Some(_), _) if !whole(seq) => Fate::CutByApp,
            (Some(at), Some(r)) if at > r => Fate::AfterReset,
            (Some(_), _) => Fate::DroppedByGuard,
        })
        .collect();
    let Some(reset) = reset else {
        return (fates, format!("{id}: the guard never reset it at the app"));
    };
    let ms = |at: tokio::time::Instant| {
        let (sign, d) = if at >= reset {
            ("+", at - reset)
        } else {
            ("-", reset - at)
        };
        format!("{sign}{:.1} ms", d.as_secs_f64() * 1e3)
    };
    // The ending: from the last message the client got on.
    let from = arrived(lost.start().saturating_sub(1)).unwrap_or(reset);
    let mut out = Vec::new();
    for e in events.iter().filter(|e| e.conn == conn && e.at >= from) {
        let What::Frame(f) = &e.what else { continue };
        let what = match (e.dir, f.ty) {
            (Dir::Down, DATA) if f.stream == stream => {
                tick(&f.head).map(|(_, seq)| format!("tick {seq}"))
            }
            (Dir::Up, RST_STREAM) if f.stream == stream => Some("guard's RST_STREAM".into()),
            (Dir::Up, SETTINGS) if f.flags & ACK == 0 && e.at <= reset => {
                Some("guard's SETTINGS".into())
            }
            (Dir::Down, SETTINGS) if f.flags & ACK != 0 && e.at <= reset => {
                Some("app's SETTINGS ack".into())
            }
            _ => None,
        };
        if let Some(w) = what {
            out.push(format!("{w} {}", ms(e.at)));
        }
    }
    let fate_of: Vec<String> = lost
        .zip(&fates)
        .map(|(seq, f)| format!("tick {seq}: {f:?}"))
        .collect();
    let ending = format!(
        "{id} ({}) on the wire: {}",
        fate_of.join(", "),
        out.join(", ")
    );
    (fates, ending)
}

/// RFC 9113 §7's name of an error code.
fn h2_error(code: u32) -> String {
    const NAMES: [&str; 14] = [
        "NO_ERROR",
        "PROTOCOL_ERROR",
        "INTERNAL_ERROR",
        "FLOW_CONTROL_ERROR",
        "SETTINGS_TIMEOUT",
        "STREAM_CLOSED",
        "FRAME_SIZE_ERROR",
        "REFUSED_STREAM",
        "CANCEL",
        "COMPRESSION_ERROR",
        "CONNECT_ERROR",
        "ENHANCE_YOUR_CALM",
        "INADEQUATE_SECURITY",
        "HTTP_1_1_REQUIRED",
    ];
    NAMES
        .get(code as usize)
        .map_or_else(|| format!("0x{code:x}"), |n| n.to_string())
}

/// The guard's count of the GOAWAYs the app sent it, labelled with each
/// one's error code name.
pub const APP_GOAWAYS: &str = "drainshim_guard_app_goaways";

/// [`APP_GOAWAYS`] by code, from the sidecar's /metrics text; None when the
/// family is not there at all.
pub fn app_goaways_metric(metrics: &str) -> Option<BTreeMap<String, u64>> {
    if !metrics.contains(APP_GOAWAYS) {
        return None;
    }
    let series = format!("{APP_GOAWAYS}_total{{");
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some((labels, value)) = line
            .strip_prefix(&series)
            .and_then(|rest| rest.split_once("} "))
        else {
            continue;
        };
        let code = labels
            .split(',')
            .find_map(|l| l.strip_prefix("code=\""))
            .map(|c| c.trim_end_matches('"').to_string())
            .unwrap_or_default();
        let n = value.trim().parse::<f64>().unwrap_or(0.0);
        *out.entry(code).or_default() += n as u64;
    }
    Some(out)
}

/// The guard's count of endings begun at a moment no write timed.
pub const BLIND_ENDED: &str = "drainshim_streams_blind_ended";
/// The guard's count of application DATA it dropped: 0 is the promise.
pub const DATA_DROPPED: &str = "drainshim_stream_data_dropped";

/// The sum of every series of counter family `family` in /metrics text.
pub fn series_sum(metrics: &str, family: &str) -> u64 {
    series_sum_where(metrics, family, "")
}

/// The sum of the series of counter family `family` whose labels contain
/// `label` (for example `reason="after_end"`).
pub fn series_sum_where(metrics: &str, family: &str, label: &str) -> u64 {
    let series = format!("{family}_total{{");
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(&series)?.split_once("} "))
        .filter(|(labels, _)| labels.contains(label))
        .map(|(_, v)| v.trim().parse::<f64>().unwrap_or(0.0) as u64)
        .sum()
}

/// One case's outcome: its row of the table, and what broke the promise.
pub struct Row {
    pub case: Case,
    /// Subscribe calls made (every cycle's).
    pub calls: usize,
    pub ends: BTreeMap<End, usize>,
    /// Messages the app handed its transport that no client received.
    pub lost: u64,
    /// Where those went.
    pub lost_fates: BTreeMap<Fate, u64>,
    /// Calls per app connection (by the app's view of its peers), most first.
    pub per_conn: Vec<usize>,
    pub wire: Wire,
    /// [`APP_GOAWAYS`] by code; None when the sidecar does not export it.
    pub metric: Option<BTreeMap<String, u64>>,
    /// Max age: the fewest graceful endings one client went through.
    pub cycles: Option<usize>,
    /// The first and the last end, after the trigger.
    pub ends_after: Option<(Duration, Duration)>,
    /// How the calls ended (status and message), with how many each.
    pub endings: BTreeMap<String, usize>,
    /// The drain's report: streams terminated / completed / cut.
    pub report: Option<String>,
    /// Endings begun at a moment no write timed ([`BLIND_ENDED`]).
    pub blind: Option<u64>,
    /// Application DATA frames the guard dropped ([`DATA_DROPPED`]).
    pub dropped: Option<u64>,
    pub time: Duration,
    pub failures: Vec<String>,
}

fn codes<T: std::fmt::Display>(m: &BTreeMap<String, T>) -> String {
    if m.is_empty() {
        return "-".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Row {
    pub const HEADER: &'static str = "| server | scenario | bootstrap | calls | graceful | app's own end | cut: app conn lost | cut: too many pings | cut: other | lost msgs | app conns (calls each) | PINGs to app | app GOAWAYs (wire) | app GOAWAYs (metric) | drain report: terminated / completed / cut | blind endings | data dropped | ends after trigger | time |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|";

    pub fn line(&self) -> String {
        let n = |e: End| self.ends.get(&e).copied().unwrap_or(0);
        let scenario = match self.cycles {
            Some(c) => format!("{} ({c} cycles)", self.case.scenario.name()),
            None => self.case.scenario.name().to_string(),
        };
        let per_conn: Vec<String> = self.per_conn.iter().map(usize::to_string).collect();
        let lost = if self.lost_fates.is_empty() {
            self.lost.to_string()
        } else {
            let fates: Vec<String> = self
                .lost_fates
                .iter()
                .map(|(f, n)| format!("{f:?} {n}"))
                .collect();
            format!("{} ({})", self.lost, fates.join(", "))
        };
        format!(
            "| {} | {scenario} | {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} | {} | {} | {} | {} | {} | {:.1} s |",
            self.case.server.name(),
            self.case.boot.name(),
            self.calls,
            n(End::Graceful),
            n(End::AppOwn),
            n(End::AppConnLost),
            n(End::Calm),
            n(End::Cut),
            lost,
            self.per_conn.len(),
            per_conn.join(", "),
            self.wire.pings_to_app,
            codes(&self.wire.app_goaways),
            self.metric.as_ref().map_or("absent".into(), codes),
            self.report.as_deref().unwrap_or("-"),
            self.blind.map_or("absent".into(), |n| n.to_string()),
            self.dropped.map_or("absent".into(), |n| n.to_string()),
            self.ends_after.map_or("-".into(), |(a, b)| format!(
                "{:.1}-{:.1} s",
                a.as_secs_f64(),
                b.as_secs_f64()
            )),
            self.time.as_secs_f64(),
        )
    }

    /// How the calls ended and what the app reset, when not all went well.
    pub fn notes(&self) -> String {
        let mut out = String::new();
        if self.ends.keys().all(|e| *e == End::Graceful) && self.failures.is_empty() {
            return out;
        }
        out.push_str(&format!(
            "  {} / {} / {}:\n",
            self.case.server.name(),
            self.case.scenario.name(),
            self.case.boot.name()
        ));
        for (how, n) in &self.endings {
            out.push_str(&format!("    {n} call(s) ended: {how}\n"));
        }
        if !self.wire.app_resets.is_empty() {
            out.push_str(&format!(
                "    the app reset streams: {}\n",
                codes(&self.wire.app_resets)
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::guard::{encode_frame, PREFACE};
    use tokio::io::AsyncWriteExt;

    /// A DATA frame of stream 1 carrying tick `seq` of stream `id`.
    fn tick_frame(id: &str, seq: u8) -> Vec<u8> {
        let mut msg = vec![0x0a, id.len() as u8];
        msg.extend_from_slice(id.as_bytes());
        msg.extend_from_slice(&[0x10, seq]);
        let mut data = vec![0, 0, 0, 0, msg.len() as u8];
        data.extend_from_slice(&msg);
        encode_frame(DATA, 0, 1, &data)
    }

    #[tokio::test]
    async fn tells_where_each_lost_message_went() {
        let app = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let tap = Tap::start(app.local_addr().expect("addr")).await;
        let mut guard = tokio::net::TcpStream::connect(tap.addr)
            .await
            .expect("connect");
        let (mut app, _) = app.accept().await.expect("accept");
        let frames = |n: usize| {
            move |e: &[crate::support::guard::Event]| {
                (e.iter()
                    .filter(|e| matches!(e.what, What::Frame(_)))
                    .count()
                    >= n)
                    .then_some(())
            }
        };
        // Ticks 1 and 2 reach the client; 3 reaches the guard before its
        // RST_STREAM, 4 after it, 5 only its first frame (its stack cut it
        // short), 6 never leaves the app.
        app.write_all(
            &[
                tick_frame("q-1", 1),
                tick_frame("q-1", 2),
                tick_frame("q-1", 3),
            ]
            .concat(),
        )
        .await
        .expect("ticks");
        tap.wait_for("ticks 1-3", frames(3)).await;
        guard.write_all(PREFACE).await.expect("preface");
        guard
            .write_all(&encode_frame(RST_STREAM, 0, 1, &8u32.to_be_bytes()))
            .await
            .expect("reset");
        tap.wait_for("the reset", frames(4)).await;
        app.write_all(&tick_frame("q-1", 4)).await.expect("tick 4");
        tap.wait_for("tick 4", frames(5)).await;
        // Tick 5's prefix says 100 bytes more than its frame carries.
        let mut cut = tick_frame("q-1", 5);
        let at = 9 + 4;
        cut[at] += 100;
        app.write_all(&cut).await.expect("tick 5's start");
        tap.wait_for("tick 5's start", frames(6)).await;

        let (fates, ending) = lost_fates(&tap, "q-1", 3..=6);
        assert_eq!(
            fates,
            [
                Fate::DroppedByGuard,
                Fate::AfterReset,
                Fate::CutByApp,
                Fate::NeverSent
            ],
            "{ending}"
        );
        assert!(ending.contains("tick 2 -"), "{ending}");
        assert!(ending.contains("guard's RST_STREAM +0.0 ms"), "{ending}");
        let (fates, ending) = lost_fates(&tap, "q-2", 1..=1);
        assert_eq!(fates, [Fate::NeverSent], "{ending}");
    }

    #[test]
    fn reads_the_app_goaways_family() {
        let text = "# HELP drainshim_guard_app_goaways GOAWAYs the app sent.\n\
                    # TYPE drainshim_guard_app_goaways counter\n\
                    drainshim_guard_app_goaways_total{code=\"NO_ERROR\"} 2\n\
                    drainshim_guard_app_goaways_total{code=\"ENHANCE_YOUR_CALM\"} 1\n\
                    drainshim_goaways_total{reason=\"drain\"} 1\n";
        let m = app_goaways_metric(text).expect("the family");
        assert_eq!(m.get("NO_ERROR"), Some(&2));
        assert_eq!(m.get("ENHANCE_YOUR_CALM"), Some(&1));
        assert_eq!(m.len(), 2);
        assert_eq!(app_goaways_metric("drainshim_goaways_total 1\n"), None);
        let blind = "drainshim_streams_blind_ended_total{reason=\"drain\",protocol=\"grpc\"} 3\n\
                     drainshim_streams_blind_ended_total{reason=\"max_age\",protocol=\"http\"} 1\n\
                     drainshim_streams_terminated_total{reason=\"drain\",protocol=\"grpc\"} 9\n";
        assert_eq!(series_sum(blind, BLIND_ENDED), 4);
        assert_eq!(h2_error(11), "ENHANCE_YOUR_CALM");
        // A Tick as grpc_app.py writes it: id "q-1", seq 300, 8 bytes of padding.
        let mut data = vec![0, 0, 0, 0, 17, 0x0a, 3];
        data.extend_from_slice(b"q-1");
        data.extend_from_slice(&[0x10, 0xac, 0x02, 0x1a, 8]);
        assert_eq!(tick(&data), Some(("q-1", 300)));
        assert_eq!(tick(&data[..9]), None);
        assert_eq!(h2_error(0x42), "0x42");
    }
}
