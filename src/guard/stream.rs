//! One HTTP/2 stream through the guard: the request flows downstream →
//! upstream and the response upstream → downstream, each with flow control
//! end to end (a chunk is released to the sender only once the receiver's
//! window took it), and the graceful end.
//!
//! The graceful end of a gRPC stream: when asked, the stream notes how many
//! response bytes the application already produced (received by the guard,
//! not yet forwarded: h2's used receive capacity). It forwards those, then
//! continues only as far as the next gRPC message boundary, and ends with
//! trailers `grpc-status: 14`. The upstream stream is cancelled afterwards.
//! A stream that cannot reach a boundary within `end_timeout` (the
//! application stalls mid-message, or the client's window stays shut) is
//! reset with CANCEL: a reset is honest, a truncated message is not.
//!
//! Non-gRPC streams are let finish, bounded by `end_timeout`, then reset;
//! they never get an END_STREAM that would make a cut body look complete.

use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::{Request, Response, StatusCode};
use tokio_util::sync::CancellationToken;

use super::grpc::{self, Framer};
use super::h2conn::CountGuard;
use super::headers::strip_hop_by_hop;
use super::registry::{Registered, StreamCtl};
use super::upstream::H2Upstream;
use super::Inner;
use crate::metrics::Reason;

/// Everything one stream task needs.
pub struct StreamJob {
    /// Limits, metrics and counters.
    pub inner: Arc<Inner>,
    /// The application connection of this downstream connection.
    pub upstream: Arc<H2Upstream>,
    /// The stream's entry in the registry; dropping it unregisters.
    pub registered: Registered,
    /// The connection's stream count; dropping it decrements.
    pub count: CountGuard,
    /// The request as the client sent it.
    pub req: Request<RecvStream>,
    /// Where the response goes.
    pub respond: SendResponse<Bytes>,
    /// The client, for logs.
    pub peer: SocketAddr,
}

/// How a stream ended, for metrics and logs.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The application finished the response.
    Completed,
    /// The guard ended it gracefully (trailers or trailers-only).
    Ended(Reason),
    /// Ended before it reached the application: refused, safe to retry.
    Refused,
    /// The client reset it or went away.
    ClientGone,
    /// The application could not be reached or failed the stream.
    UpstreamFailed,
    /// No safe end point in time: reset with CANCEL.
    Reset,
}

/// Why forwarding a chunk stopped.
enum SendError {
    /// The receiver reset the stream or the connection failed.
    Gone,
    /// The interrupt (an ending's deadline, or a stop) fired first.
    Interrupted,
}

pub async fn proxy(job: StreamJob) {
    let StreamJob {
        inner,
        upstream,
        registered,
        count,
        req,
        mut respond,
        peer,
    } = job;
    let ctl = registered.ctl.clone();
    let id = respond.stream_id().as_u32();
    let path = req.uri().path().to_string();
    let outcome = run(&inner, &upstream, &ctl, req, &mut respond).await;
    match &outcome {
        Outcome::Ended(reason) => {
            inner.record_termination(*reason, crate::metrics::StreamProtocol::grpc)
        }
        Outcome::Reset => tracing::warn!(
            %peer, stream = id, %path,
            "guard: stream could not reach a safe end point in time; reset with CANCEL"
        ),
        _ => {}
    }
    tracing::trace!(%peer, stream = id, %path, ?outcome, "guard: stream done");
    drop(registered);
    drop(count);
}

async fn run(
    inner: &Inner,
    upstream: &H2Upstream,
    ctl: &StreamCtl,
    req: Request<RecvStream>,
    respond: &mut SendResponse<Bytes>,
) -> Outcome {
    let end_timeout = inner.config.limits.end_timeout;
    let (mut head, body) = req.into_parts();

    // 1. A slot on the application connection.
    let sender = tokio::select! {
        biased;
        _ = poll_fn(|cx| respond.poll_reset(cx)) => return Outcome::ClientGone,
        (reason, _) = ctl.ended() => {
            // Nothing reached the application yet.
            return if ctl.grpc {
                end_trailers_only(respond, reason)
            } else {
                respond.send_reset(h2::Reason::REFUSED_STREAM);
                Outcome::Refused
            };
        }
        r = upstream.ready() => r,
    };
    let mut sender = match sender {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "guard: cannot reach the application");
            return fail_before_response(respond, ctl.grpc);
        }
    };

    // 2. The request head; the body follows in `pump_request`.
    strip_hop_by_hop(&mut head.headers);
    let done = body.is_end_stream();
    let (response, up_send) = match sender.send_request(Request::from_parts(head, ()), done) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "guard: application connection refused the request");
            return fail_before_response(respond, ctl.grpc);
        }
    };
    drop(sender);

    let stop = CancellationToken::new();
    let request_side = pump_request(body, up_send, stop.clone(), done);
    let response_side = async {
        let outcome = respond_side(
            ctl,
            respond,
            response,
            end_timeout,
            inner.config.limits.end_settle,
        )
        .await;
        // The response is over: the request side has nothing left to do.
        stop.cancel();
        outcome
    };
    let ((), outcome) = tokio::join!(request_side, response_side);
    // Dropping the upstream handles of an unfinished stream resets it with
    // CANCEL: the application stops producing for a client that is gone.
    outcome
}

/// Answers a gRPC stream that never reached the application with a
/// trailers-only UNAVAILABLE.
fn end_trailers_only(respond: &mut SendResponse<Bytes>, reason: Reason) -> Outcome {
    let resp = grpc::unavailable_response(grpc::end_message(reason));
    match respond.send_response(resp, true) {
        Ok(_) => Outcome::Ended(reason),
        Err(_) => Outcome::ClientGone,
    }
}

/// The application is unreachable: UNAVAILABLE for gRPC, 502 for others.
fn fail_before_response(respond: &mut SendResponse<Bytes>, grpc: bool) -> Outcome {
    let resp = if grpc {
        grpc::unavailable_response(grpc::UPSTREAM_UNAVAILABLE_MESSAGE)
    } else {
        let mut r = Response::new(());
        *r.status_mut() = StatusCode::BAD_GATEWAY;
        r
    };
    if respond.send_response(resp, true).is_err() {
        return Outcome::ClientGone;
    }
    Outcome::UpstreamFailed
}

/// Resolves `end_timeout` after the stream was asked to end.
async fn end_deadline(ctl: &StreamCtl, end_timeout: Duration) {
    let (_, at) = ctl.ended().await;
    tokio::time::sleep_until(at + end_timeout).await;
}

/// Sends `data` within the receiver's flow-control window: capacity is
/// reserved for the chunk and only what the window grants is handed to h2,
/// so h2 never buffers beyond the window.
async fn send_flow_controlled(
    stream: &mut SendStream<Bytes>,
    mut data: Bytes,
    interrupt: impl Future<Output = ()>,
) -> Result<(), SendError> {
    tokio::pin!(interrupt);
    while !data.is_empty() {
        stream.reserve_capacity(data.len());
        let granted = tokio::select! {
            biased;
            _ = &mut interrupt => return Err(SendError::Interrupted),
            g = poll_fn(|cx| {
                if stream.poll_reset(cx).is_ready() {
                    return Poll::Ready(Err(SendError::Gone));
                }
                match stream.poll_capacity(cx) {
                    Poll::Ready(Some(Ok(n))) if n > 0 => Poll::Ready(Ok(n)),
                    Poll::Ready(Some(Err(_))) | Poll::Ready(None) => Poll::Ready(Err(SendError::Gone)),
                    _ if stream.capacity() > 0 => Poll::Ready(Ok(stream.capacity())),
                    _ => Poll::Pending,
                }
            }) => g?,
        };
        let n = granted.min(data.len());
        stream
            .send_data(data.split_to(n), false)
            .map_err(|_| SendError::Gone)?;
    }
    Ok(())
}

/// Request body and trailers, downstream → upstream, until done or `stop`.
async fn pump_request(
    mut body: RecvStream,
    mut up: SendStream<Bytes>,
    stop: CancellationToken,
    done: bool,
) {
    if done {
        return;
    }
    loop {
        let next = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            // The application no longer reads the request (it answered, or reset).
            _ = poll_fn(|cx| up.poll_reset(cx)) => return,
            d = body.data() => d,
        };
        match next {
            Some(Ok(chunk)) => {
                let len = chunk.len();
                if send_flow_controlled(&mut up, chunk, stop.cancelled())
                    .await
                    .is_err()
                {
                    return;
                }
                // Only now may the client send more: end-to-end backpressure.
                let _ = body.flow_control().release_capacity(len);
            }
            Some(Err(_)) => {
                // The client reset the stream (or its connection failed).
                up.send_reset(h2::Reason::CANCEL);
                return;
            }
            None => {
                let trailers = tokio::select! {
                    _ = stop.cancelled() => return,
                    t = body.trailers() => t,
                };
                match trailers {
                    Ok(Some(mut t)) => {
                        strip_hop_by_hop(&mut t);
                        let _ = up.send_trailers(t);
                    }
                    Ok(None) => {
                        let _ = up.send_data(Bytes::new(), true);
                    }
                    Err(_) => up.send_reset(h2::Reason::CANCEL),
                }
                return;
            }
        }
    }
}

/// The response head and body, upstream → downstream, and the graceful end.
async fn respond_side(
    ctl: &StreamCtl,
    respond: &mut SendResponse<Bytes>,
    mut response: h2::client::ResponseFuture,
    end_timeout: Duration,
    end_settle: Duration,
) -> Outcome {
    // The head. A gRPC stream asked to end now gets a trailers-only answer;
    // others wait for the application, bounded.
    let mut noticed = false;
    let head = loop {
        tokio::select! {
            biased;
            _ = poll_fn(|cx| respond.poll_reset(cx)) => return Outcome::ClientGone,
            (reason, _) = ctl.ended(), if !noticed => {
                if ctl.grpc {
                    return end_trailers_only(respond, reason);
                }
                noticed = true;
            }
            _ = end_deadline(ctl, end_timeout), if noticed => {
                respond.send_reset(h2::Reason::CANCEL);
                return Outcome::Reset;
            }
            r = &mut response => break r,
        }
    };
    let (mut parts, body) = match head {
        Ok(r) => r.into_parts(),
        Err(e) => return upstream_failed_before_response(respond, ctl.grpc, e),
    };
    strip_hop_by_hop(&mut parts.headers);
    // Only a gRPC response to a gRPC request is framed in gRPC messages.
    let framed = ctl.grpc && grpc::is_grpc(&parts.headers);
    let done = body.is_end_stream();
    let down = match respond.send_response(Response::from_parts(parts, ()), done) {
        Ok(s) => s,
        Err(_) => return Outcome::ClientGone,
    };
    if done {
        return Outcome::Completed;
    }
    pump_response(ctl, body, down, framed, end_timeout, end_settle).await
}

/// The application failed the stream before answering.
fn upstream_failed_before_response(
    respond: &mut SendResponse<Bytes>,
    grpc: bool,
    e: h2::Error,
) -> Outcome {
    match e.reason() {
        // The application reset the stream: pass its reason on, so
        // REFUSED_STREAM stays retryable and CANCEL stays CANCEL.
        Some(reason) if e.is_reset() => {
            respond.send_reset(reason);
            Outcome::UpstreamFailed
        }
        _ => {
            tracing::debug!(error = %e, "guard: application connection failed before the response");
            let resp = if grpc {
                grpc::unavailable_response(grpc::UPSTREAM_LOST_MESSAGE)
            } else {
                let mut r = Response::new(());
                *r.status_mut() = StatusCode::BAD_GATEWAY;
                r
            };
            if respond.send_response(resp, true).is_err() {
                return Outcome::ClientGone;
            }
            Outcome::UpstreamFailed
        }
    }
}

/// How much of `chunk` to forward while ending, `budget` being the bytes the
/// application had already produced when the ending began: all of the
/// budget, then every message that is complete in the chunk. Nothing the
/// guard has received whole is dropped; only a trailing partial message (the
/// application was mid-write) is held back. With no boundary in the chunk at
/// all, the message in progress is forwarded and the pump keeps reading.
fn cut_point(framer: &Framer, chunk: &[u8], budget: u64) -> usize {
    let len = chunk.len();
    let within = usize::try_from(budget).map_or(len, |b| b.min(len));
    if within == len {
        return len;
    }
    let mut f = *framer;
    f.consume(&chunk[..within]);
    let mut last_boundary = f.at_boundary().then_some(within);
    let mut pos = within;
    while let Some(n) = f.bytes_to_boundary(&chunk[pos..]) {
        f.consume(&chunk[pos..pos + n]);
        pos += n;
        last_boundary = Some(pos);
        if pos == len {
            break;
        }
    }
    last_boundary.unwrap_or(len)
}

/// Data from the application within this long counts as "just written".
const JUST_WROTE: Duration = Duration::from_millis(2);

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What woke the response pump.
enum Next {
    ClientGone,
    End(Reason),
    Timeout,
    Data(Option<Result<Bytes, h2::Error>>),
}

async fn pump_response(
    ctl: &StreamCtl,
    mut body: RecvStream,
    mut down: SendStream<Bytes>,
    framed: bool,
    end_timeout: Duration,
    end_settle: Duration,
) -> Outcome {
    let mut framer = Framer::default();
    // Set once the stream is asked to end: the reason, and the bytes already
    // produced by the application that must still be forwarded.
    let mut ending: Option<(Reason, u64)> = None;
    // When the application last sent data: just now means it is not mid-write.
    let mut last_data = Instant::now();
    // While ending at a boundary: until when to wait for one more message.
    let mut settle: Option<Instant> = None;
    // One more message was taken (or waited for): end at the next boundary.
    let mut settled = false;
    loop {
        if let Some((reason, 0)) = ending {
            if framed && framer.at_boundary() {
                let fresh = last_data.elapsed() < JUST_WROTE;
                if settled || fresh || end_settle.is_zero() {
                    let trailers = grpc::unavailable_trailers(grpc::end_message(reason));
                    return match down.send_trailers(trailers) {
                        Ok(()) => Outcome::Ended(reason),
                        Err(_) => Outcome::ClientGone,
                    };
                }
                settle.get_or_insert_with(|| Instant::now() + end_settle);
            }
        }
        let next = tokio::select! {
            biased;
            _ = poll_fn(|cx| down.poll_reset(cx)) => Next::ClientGone,
            (reason, _) = ctl.ended(), if ending.is_none() => Next::End(reason),
            _ = end_deadline(ctl, end_timeout), if ending.is_some() => Next::Timeout,
            _ = sleep_until_opt(settle), if settle.is_some() && !settled => {
                settled = true;
                continue;
            }
            d = body.data() => Next::Data(d),
        };
        match next {
            Next::ClientGone => return Outcome::ClientGone,
            Next::End(reason) => {
                // Non-gRPC bodies are let run to their end (bounded).
                let budget = if framed {
                    body.flow_control().used_capacity() as u64
                } else {
                    u64::MAX
                };
                ending = Some((reason, budget));
            }
            Next::Timeout => {
                down.send_reset(h2::Reason::CANCEL);
                return Outcome::Reset;
            }
            Next::Data(Some(Ok(mut chunk))) => {
                let len = chunk.len();
                last_data = Instant::now();
                if framed {
                    if let Some((_, budget)) = ending.as_mut() {
                        let take = cut_point(&framer, &chunk, *budget);
                        // The message waited for has come: end after it.
                        settled |= settle.is_some();
                        *budget = if take < len {
                            0
                        } else {
                            budget.saturating_sub(len as u64)
                        };
                        chunk.truncate(take);
                    }
                    framer.consume(&chunk);
                }
                match send_flow_controlled(&mut down, chunk, end_deadline(ctl, end_timeout)).await {
                    Ok(()) => {}
                    Err(SendError::Gone) => return Outcome::ClientGone,
                    Err(SendError::Interrupted) => {
                        down.send_reset(h2::Reason::CANCEL);
                        return Outcome::Reset;
                    }
                }
                // Only now may the application send more: end-to-end backpressure.
                let _ = body.flow_control().release_capacity(len);
            }
            Next::Data(None) => {
                let trailers = tokio::select! {
                    biased;
                    _ = poll_fn(|cx| down.poll_reset(cx)) => return Outcome::ClientGone,
                    _ = end_deadline(ctl, end_timeout) => {
                        down.send_reset(h2::Reason::CANCEL);
                        return Outcome::Reset;
                    }
                    t = body.trailers() => t,
                };
                return match trailers {
                    Ok(Some(mut t)) => {
                        strip_hop_by_hop(&mut t);
                        match down.send_trailers(t) {
                            Ok(()) => Outcome::Completed,
                            Err(_) => Outcome::ClientGone,
                        }
                    }
                    Ok(None) => match down.send_data(Bytes::new(), true) {
                        Ok(()) => Outcome::Completed,
                        Err(_) => Outcome::ClientGone,
                    },
                    Err(e) => upstream_failed_mid_body(&mut down, framed, &framer, e),
                };
            }
            Next::Data(Some(Err(e))) => {
                return upstream_failed_mid_body(&mut down, framed, &framer, e)
            }
        }
    }
}

/// The application failed the stream after the response started.
fn upstream_failed_mid_body(
    down: &mut SendStream<Bytes>,
    framed: bool,
    framer: &Framer,
    e: h2::Error,
) -> Outcome {
    tracing::debug!(error = %e, "guard: application failed the stream mid-response");
    if framed && framer.at_boundary() {
        // Between messages the client can still get a clean, retryable end.
        let t = grpc::unavailable_trailers(grpc::UPSTREAM_LOST_MESSAGE);
        if down.send_trailers(t).is_ok() {
            return Outcome::UpstreamFailed;
        }
        return Outcome::ClientGone;
    }
    let reason = e
        .reason()
        .filter(|r| *r != h2::Reason::NO_ERROR)
        .unwrap_or(h2::Reason::CANCEL);
    down.send_reset(reason);
    Outcome::UpstreamFailed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(sizes: &[usize]) -> Vec<u8> {
        sizes
            .iter()
            .flat_map(|&n| grpc::frame(&vec![7u8; n]).to_vec())
            .collect()
    }

    #[test]
    fn the_budget_is_forwarded_then_up_to_the_next_boundary() {
        // Three 10-byte messages (15 bytes framed each).
        let data = messages(&[10, 10, 10]);
        let f = Framer::default();
        assert_eq!(cut_point(&f, &data, 100), 45, "all within the budget");
        assert_eq!(cut_point(&f, &data, 15), 45, "budget ends on a boundary");
        assert_eq!(cut_point(&f, &data, 16), 45, "then every complete message");
        assert_eq!(
            cut_point(&f, &data, 0),
            45,
            "received whole, forwarded whole"
        );
        assert_eq!(
            cut_point(&f, &data[..40], 0),
            30,
            "a trailing partial message is held back"
        );
        assert_eq!(
            cut_point(&f, &data[..10], 0),
            0,
            "a partial new message is held back"
        );
        let mut mid = Framer::default();
        mid.consume(&data[..3]);
        assert_eq!(
            cut_point(&mid, &data[3..12], 0),
            9,
            "mid-message, no boundary: keep going"
        );
    }

    #[test]
    fn a_message_split_over_chunks_is_completed() {
        let data = messages(&[10, 10]);
        let mut f = Framer::default();
        f.consume(&data[..7]);
        // Budget exhausted mid-message: the rest of message one, and message two.
        assert_eq!(cut_point(&f, &data[7..], 0), 23);
        assert_eq!(cut_point(&f, &data[7..20], 0), 8);
        // No boundary in the chunk: forward it all and keep going.
        assert_eq!(cut_point(&f, &data[7..12], 0), 5);
    }
}
