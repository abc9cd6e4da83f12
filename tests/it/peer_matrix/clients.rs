//! The matrix's clients: tonic Subscribe calls through Envoy, opened again
//! after each UNAVAILABLE end as the README asks of clients, and how each
//! call ended as the table counts it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use drainshim_bench::proto::bench::stream_client::StreamClient;
use drainshim_bench::proto::bench::SubscribeRequest;
use tokio::time::Instant;
use tonic::transport::Channel;

/// One Subscribe call as its client saw it.
#[derive(Debug)]
pub struct Sub {
    pub id: String,
    /// Every sequence number received, in order.
    pub seqs: Vec<u64>,
    /// None: status OK.
    pub status: Option<tonic::Status>,
    pub ended_at: Instant,
}

impl Sub {
    /// Received 1..=n, n at least 1.
    pub fn gapless(&self) -> bool {
        !self.seqs.is_empty()
            && self
                .seqs
                .iter()
                .enumerate()
                .all(|(i, q)| *q == i as u64 + 1)
    }
}

/// How a call ended, as the table counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum End {
    /// UNAVAILABLE with one of the guard's messages for the case.
    Graceful,
    /// The app's own end: OK, or a status from the app's own trailers.
    AppOwn,
    /// The guard's "the connection to the application was lost".
    AppConnLost,
    /// Anything saying "too many pings" or ENHANCE_YOUR_CALM.
    Calm,
    /// A transport error, a reset, or a guard message not of this case.
    Cut,
}

/// The guard's message when the app's connection fails under a stream (not
/// exported by the guard; its text is what clients see).
const APP_CONN_LOST: &str = "the connection to the application was lost";

/// How `sub` ended; `graceful` are the guard's messages the case expects.
pub fn classify(sub: &Sub, graceful: &[&str]) -> End {
    use std::error::Error;
    let Some(s) = &sub.status else {
        return End::AppOwn;
    };
    let m = s.message();
    let lower = m.to_ascii_lowercase();
    if lower.contains("too many pings")
        || lower.contains("too_many_pings")
        || lower.contains("enhance_your_calm")
    {
        End::Calm
    } else if s.source().is_some() {
        // tonic names the transport error behind a status it made itself.
        End::Cut
    } else if s.code() == tonic::Code::Unavailable && graceful.contains(&m) {
        End::Graceful
    } else if m.contains(APP_CONN_LOST) {
        End::AppConnLost
    } else if m.starts_with("drainshim:") {
        End::Cut
    } else {
        End::AppOwn
    }
}

/// A status as the table's notes print it, with its transport error.
pub fn describe(status: &Option<tonic::Status>) -> String {
    use std::error::Error;
    let Some(s) = status else {
        return "OK".into();
    };
    let mut d = format!("{:?} {:?}", s.code(), s.message());
    let mut source = s.source();
    while let Some(e) = source {
        d.push_str(&format!(" <- {e}"));
        source = e.source();
    }
    d
}

/// What a client asks for, and how it reads.
#[derive(Clone, Debug)]
pub struct Shape {
    /// The app's cadence (1 ms: as fast as flow control lets it).
    pub interval_ms: u32,
    /// Each message's payload.
    pub payload_bytes: u32,
    /// While this says true, the client reads nothing (a slow client):
    /// its window, then Envoy's to the guard, shuts.
    pub hold: Option<tokio::sync::watch::Receiver<bool>>,
}

/// One Subscribe call through Envoy, until the server ends it, its
/// connection breaks, or `deadline`.
async fn subscription(
    channel: Channel,
    id: String,
    shape: &Shape,
    received: &AtomicUsize,
    deadline: Instant,
) -> Sub {
    let mut seqs = Vec::new();
    let mut client = StreamClient::new(channel);
    let call = async {
        let mut stream = client
            .subscribe(SubscribeRequest {
                stream_id: id.clone(),
                count: 0,
                interval_ms: shape.interval_ms,
                payload_bytes: shape.payload_bytes,
                ..Default::default()
            })
            .await?
            .into_inner();
        let mut hold = shape.hold.clone();
        loop {
            if let Some(h) = hold.as_mut() {
                // Released by the case (bounded by its deadline).
                let _ = h.wait_for(|held| !held).await;
            }
            let Some(tick) = stream.message().await? else {
                break;
            };
            seqs.push(tick.seq);
            received.fetch_add(1, Ordering::Relaxed);
        }
        Ok::<(), tonic::Status>(())
    };
    let status = match tokio::time::timeout_at(deadline, call).await {
        Ok(r) => r.err(),
        Err(_) => Some(tonic::Status::deadline_exceeded(
            "the stream outlived the test's limit",
        )),
    };
    Sub {
        id,
        seqs,
        status,
        ended_at: Instant::now(),
    }
}

/// One client: its stream `id`, opened again after each UNAVAILABLE end
/// (after a jittered backoff) as `id-c1`, `id-c2`, ..., `cycles` calls at
/// most, until `deadline`. `received` counts its messages.
pub async fn client(
    channel: Channel,
    id: String,
    shape: Shape,
    cycles: usize,
    received: Arc<AtomicUsize>,
    deadline: Instant,
) -> Vec<Sub> {
    let mut subs = Vec::new();
    for cycle in 0..cycles {
        let id = if cycles > 1 {
            format!("{id}-c{cycle}")
        } else {
            id.clone()
        };
        let sub = subscription(channel.clone(), id, &shape, &received, deadline).await;
        let again = sub
            .status
            .as_ref()
            .is_some_and(|s| s.code() == tonic::Code::Unavailable);
        subs.push(sub);
        if !again || Instant::now() >= deadline {
            break;
        }
        // The client's own backoff, not a synchronisation.
        tokio::time::sleep(Duration::from_millis(fastrand::u64(10..100))).await;
    }
    subs
}
