//! Tells HTTP/2 with prior knowledge (h2c) from HTTP/1.1 by the first bytes
//! of a connection, and hands the bytes read back to the protocol driver.
//! A client whose bytes began as the HTTP/2 preface and then diverged is an
//! HTTP/2 client with an invalid preface: it gets the server's SETTINGS and
//! GOAWAY(PROTOCOL_ERROR) before the close (RFC 9113 §3.4), not an
//! HTTP/1.1 answer. So is a client whose first line is not an HTTP/1.x
//! request line (`INVALID CONNECTION PREFACE`): it spoke neither protocol,
//! and only an HTTP/2 client can be told so in a way it understands.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;

/// The HTTP/2 connection preface (RFC 9113 §3.4).
pub const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The preface's request line: no HTTP/1.x request starts with
/// `PRI * HTTP/2.0\r\n`, so a client that sent it meant HTTP/2.
const H2_PREFACE_LINE: usize = 16;

/// The longest request line read to tell HTTP/1.x from neither protocol;
/// a longer one goes to the HTTP/1.1 server, which answers it (414 or 400).
const REQUEST_LINE_MAX: usize = 8 * 1024;

/// The answer to an invalid HTTP/2 preface: an empty SETTINGS (the server's
/// preface, RFC 9113 §3.4), then GOAWAY(last stream 0, PROTOCOL_ERROR).
const BAD_PREFACE_ANSWER: [u8; 26] = [
    0, 0, 0, 0x4, 0, 0, 0, 0, 0, // SETTINGS
    0, 0, 8, 0x7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x1, // GOAWAY
];

/// What a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
    /// HTTP/2 with an invalid preface: its request line, then something
    /// else (answer with [`refuse_preface`]).
    BadPreface,
}

/// Why sniffing failed.
#[derive(Debug, thiserror::Error)]
pub enum SniffError {
    #[error("no request within the header read timeout")]
    Timeout,
    #[error("closed before sending a request")]
    Closed,
    #[error("read: {0}")]
    Io(#[from] io::Error),
}

/// Reads until the bytes match the HTTP/2 preface or diverge from it, by
/// `deadline`. Returns the protocol and the stream with those bytes put back.
pub async fn sniff<T>(mut io: T, deadline: Instant) -> Result<(Protocol, Prefixed<T>), SniffError>
where
    T: AsyncRead + Unpin,
{
    let mut buf = vec![0u8; H2_PREFACE.len()];
    let mut have = 0;
    // An HTTP/1.1 request line gets the whole budget from its first byte,
    // as the HTTP/1.1 server's own head timer would have given it.
    let budget = deadline.saturating_duration_since(Instant::now());
    let mut line_deadline = deadline;
    let protocol = loop {
        if buf[..have] != H2_PREFACE[..have] {
            let line = H2_PREFACE_LINE.min(have);
            if have > H2_PREFACE_LINE && buf[..line] == H2_PREFACE[..line] {
                break Protocol::BadPreface;
            }
            break Protocol::Http1;
        }
        if have == H2_PREFACE.len() {
            break Protocol::Http2;
        }
        let n = tokio::time::timeout_at(deadline, io.read(&mut buf[have..]))
            .await
            .map_err(|_| SniffError::Timeout)??;
        if n == 0 {
            return Err(SniffError::Closed);
        }
        if have == 0 {
            line_deadline = Instant::now() + budget;
        }
        have += n;
    };
    buf.truncate(have);
    let protocol = match protocol {
        Protocol::Http1 => request_line(&mut io, &mut buf, line_deadline).await?,
        p => p,
    };
    Ok((
        protocol,
        Prefixed {
            prefix: Bytes::from(buf),
            inner: Some(io),
            reclaim: Reclaim::default(),
        },
    ))
}

/// Reads on until `buf` holds the first request line (by `deadline`, at
/// most [`REQUEST_LINE_MAX`]): HTTP/1.1 if it ends in an HTTP/1.x version,
/// [`Protocol::BadPreface`] if it ends in anything else. A line too long to
/// judge, or cut short by the client's close, goes to the HTTP/1.1 server.
async fn request_line<T: AsyncRead + Unpin>(
    io: &mut T,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> Result<Protocol, SniffError> {
    loop {
        // Empty lines before the request line are ignored (RFC 9112 §2.2).
        if let Some(from) = buf.iter().position(|&b| b != b'\r' && b != b'\n') {
            if let Some(len) = buf[from..].iter().position(|&b| b == b'\n') {
                let line = &buf[from..from + len];
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let http1 = line.ends_with(b" HTTP/1.1") || line.ends_with(b" HTTP/1.0");
                return Ok(if http1 {
                    Protocol::Http1
                } else {
                    Protocol::BadPreface
                });
            }
        }
        if buf.len() >= REQUEST_LINE_MAX {
            return Ok(Protocol::Http1);
        }
        let have = buf.len();
        buf.resize((have * 2).clamp(256, REQUEST_LINE_MAX), 0);
        let read = tokio::time::timeout_at(deadline, io.read(&mut buf[have..])).await;
        let n = match read {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Err(SniffError::Timeout),
        };
        buf.truncate(have + n);
        if n == 0 {
            return Ok(Protocol::Http1);
        }
    }
}

/// Where a [`Prefixed`] leaves its connection when the protocol driver
/// drops it, so the connection can still be closed politely.
#[derive(Debug)]
pub struct Reclaim<T>(Arc<Mutex<Option<T>>>);

impl<T> Default for Reclaim<T> {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(None)))
    }
}

impl<T> Clone for Reclaim<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> Reclaim<T> {
    /// The connection, once the driver dropped it.
    pub fn take(&self) -> Option<T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// Answers an HTTP/2 client whose preface is invalid (RFC 9113 §3.4: a
/// connection error PROTOCOL_ERROR): the server's SETTINGS and GOAWAY, then
/// a lingering close bounded by `bound`.
pub async fn refuse_preface<T: AsyncRead + AsyncWrite + Unpin>(mut io: T, bound: Duration) {
    let sent = tokio::time::timeout(bound.min(MAX_LINGER), io.write_all(&BAD_PREFACE_ANSWER));
    if matches!(sent.await, Ok(Ok(()))) {
        linger(io, bound).await;
    }
}

/// Longest lingering close: a peer that read our GOAWAY and FIN closes
/// within a round trip; one that does not is not waited for longer.
pub const MAX_LINGER: Duration = Duration::from_secs(2);

/// Closes `io` without losing what was sent last: shuts the write side
/// (FIN) and reads until the peer closes too, bounded by `bound` and
/// [`MAX_LINGER`]. Dropping a socket with unread input makes the kernel send
/// RST, and an RST can make the peer discard trailers or a GOAWAY it has
/// received but not yet read.
pub async fn linger<T: AsyncRead + AsyncWrite + Unpin>(mut io: T, bound: Duration) {
    let _ = tokio::time::timeout(bound.min(MAX_LINGER), async {
        let _ = io.shutdown().await;
        // On the heap: a connection task awaits this, and an array here
        // would make every connection's state 4 KiB larger for its life.
        let mut sink = vec![0u8; 4096];
        while let Ok(n) = io.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

/// A stream that first yields `prefix`, then reads from `inner`; dropped, it
/// hands `inner` to its [`Reclaim`].
#[derive(Debug)]
pub struct Prefixed<T> {
    /// Bytes already read while sniffing, not yet handed to the reader.
    prefix: Bytes,
    /// The connection itself; None only after drop.
    inner: Option<T>,
    /// Receives `inner` on drop.
    reclaim: Reclaim<T>,
}

impl<T> Prefixed<T> {
    /// `io`, read as `prefix` first.
    pub fn new(prefix: Bytes, io: T) -> Self {
        Self {
            prefix,
            inner: Some(io),
            reclaim: Reclaim::default(),
        }
    }

    /// Where the connection goes when this is dropped.
    pub fn reclaim(&self) -> Reclaim<T> {
        self.reclaim.clone()
    }

    /// The unread prefix and the connection, taken out for good (nothing is
    /// handed to the reclaim): an upgraded connection is relayed as it is.
    pub fn into_parts(mut self) -> (Bytes, Option<T>) {
        (std::mem::take(&mut self.prefix), self.inner.take())
    }

    fn io(&mut self) -> io::Result<&mut T> {
        self.inner
            .as_mut()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }
}

impl<T> Drop for Prefixed<T> {
    fn drop(&mut self) {
        if let Some(io) = self.inner.take() {
            *self
                .reclaim
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(io);
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(self.io()?).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.io()?).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.io()?).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.as_ref().is_some_and(|io| io.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.io()?).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.io()?).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn sniffed(input: &'static [u8]) -> (Protocol, Vec<u8>) {
        let (mut client, server) = tokio::io::duplex(16 * 1024);
        client.write_all(input).await.expect("write");
        drop(client);
        let deadline = Instant::now() + Duration::from_secs(5);
        let (p, mut io) = sniff(server, deadline).await.expect("sniff");
        let mut all = Vec::new();
        io.read_to_end(&mut all).await.expect("read back");
        let reclaim = io.reclaim();
        drop(io);
        assert!(
            reclaim.take().is_some(),
            "the connection is handed back on drop"
        );
        (p, all)
    }

    #[tokio::test]
    async fn preface_means_http2_and_nothing_is_lost() {
        let mut input = H2_PREFACE.to_vec();
        input.extend_from_slice(b"\0\0\0\x04\0\0\0\0\0");
        let input: &'static [u8] = Box::leak(input.into_boxed_slice());
        assert_eq!(sniffed(input).await, (Protocol::Http2, input.to_vec()));
    }

    #[tokio::test]
    async fn a_request_line_means_http1() {
        let input = b"POST / HTTP/1.1\r\nhost: x\r\n\r\n";
        assert_eq!(sniffed(input).await, (Protocol::Http1, input.to_vec()));
        let input = b"PRI * HTTP/1.1\r\n\r\n";
        assert_eq!(sniffed(input).await.0, Protocol::Http1);
        // Empty lines first, a bare LF, a line cut short by the close.
        let input = b"\r\nGET / HTTP/1.0\nhost: x\n\n";
        assert_eq!(sniffed(input).await, (Protocol::Http1, input.to_vec()));
        let input = b"GET /some/path?q=1";
        assert_eq!(sniffed(input).await, (Protocol::Http1, input.to_vec()));
    }

    #[tokio::test]
    async fn a_line_that_is_neither_protocol_gets_http2s_refusal() {
        // h2spec's invalid preface, and an unknown version.
        let input = b"INVALID CONNECTION PREFACE\r\n\r\n";
        assert_eq!(sniffed(input).await, (Protocol::BadPreface, input.to_vec()));
        let input = b"GET / HTTP/3.0\r\n\r\n";
        assert_eq!(sniffed(input).await.0, Protocol::BadPreface);
        // A request line past the bound is the HTTP/1.1 server's to answer.
        let mut long = b"GET /".to_vec();
        long.resize(REQUEST_LINE_MAX + 100, b'a');
        let long: &'static [u8] = Box::leak(long.into_boxed_slice());
        assert_eq!(sniffed(long).await, (Protocol::Http1, long.to_vec()));
    }

    #[tokio::test]
    async fn a_diverging_preface_is_http2_gone_wrong() {
        let input = b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n";
        assert_eq!(sniffed(input).await, (Protocol::BadPreface, input.to_vec()));
        // The request line cut short is not enough to tell.
        let input = b"PRI * HTTP/2.0\r\r";
        assert_eq!(sniffed(input).await.0, Protocol::Http1);
        let (mut client, server) = tokio::io::duplex(64);
        refuse_preface(server, Duration::from_millis(100)).await;
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.expect("read");
        assert_eq!(answer, BAD_PREFACE_ANSWER);
    }

    /// A request line begun just before the header read timeout and
    /// finished after it is still read: its budget counts from its first
    /// byte (the third review of issue 55's changes).
    #[tokio::test(start_paused = true)]
    async fn a_request_line_gets_its_budget_from_its_first_byte() {
        let (mut client, server) = tokio::io::duplex(1024);
        let deadline = Instant::now() + Duration::from_secs(10);
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(9_500)).await;
            client.write_all(b"GET").await.expect("write");
            tokio::time::sleep(Duration::from_secs(1)).await;
            client
                .write_all(b" / HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .expect("write");
            client
        });
        let (p, _io) = sniff(server, deadline).await.expect("sniff");
        assert_eq!(p, Protocol::Http1);
        drop(writer.await);
        // A line still unfinished a whole budget after its first byte is not.
        let (mut client, server) = tokio::io::duplex(1024);
        let deadline = Instant::now() + Duration::from_secs(10);
        client.write_all(b"GET /").await.expect("write");
        assert!(matches!(
            sniff(server, deadline).await,
            Err(SniffError::Timeout)
        ));
    }

    #[tokio::test]
    async fn a_silent_client_times_out() {
        let (_client, server) = tokio::io::duplex(64);
        let deadline = Instant::now() + Duration::from_millis(50);
        assert!(matches!(
            sniff(server, deadline).await,
            Err(SniffError::Timeout)
        ));
    }
}
