//! An HTTP/2 stream as a byte stream (`AsyncRead` + `AsyncWrite`), for the
//! tunnels HTTP/2 carries: a WebSocket over extended CONNECT (RFC 8441) is
//! one DATA stream each way. Reads release flow-control capacity only for
//! what the reader took, and writes hand h2 no more than the peer's window
//! grants, so backpressure holds end to end as on any other stream.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// One HTTP/2 stream's two directions as a byte stream.
pub struct H2Io {
    /// What the peer sends.
    recv: RecvStream,
    /// What we send.
    send: SendStream<Bytes>,
    /// Received but not yet read; its capacity is released as it is read.
    pending: Bytes,
    /// The peer ended its side (END_STREAM).
    eof: bool,
}

impl H2Io {
    pub fn new(recv: RecvStream, send: SendStream<Bytes>) -> Self {
        Self {
            recv,
            send,
            pending: Bytes::new(),
            eof: false,
        }
    }
}

fn broken(e: h2::Error) -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, e)
}

impl AsyncRead for H2Io {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        while me.pending.is_empty() && !me.eof {
            match ready!(me.recv.poll_data(cx)) {
                Some(Ok(data)) => me.pending = data,
                Some(Err(e)) => return Poll::Ready(Err(broken(e))),
                None => me.eof = true,
            }
        }
        let n = me.pending.len().min(buf.remaining());
        buf.put_slice(&me.pending[..n]);
        me.pending.advance(n);
        // Only what was read may be sent again: end-to-end backpressure.
        let _ = me.recv.flow_control().release_capacity(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for H2Io {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let me = &mut *self;
        me.send.reserve_capacity(data.len());
        let granted = loop {
            if me.send.capacity() > 0 {
                break me.send.capacity();
            }
            match ready!(me.send.poll_capacity(cx)) {
                Some(Ok(n)) if n > 0 => break n,
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Poll::Ready(Err(broken(e))),
                None => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            }
        };
        let n = granted.min(data.len());
        me.send
            .send_data(Bytes::copy_from_slice(&data[..n]), false)
            .map_err(broken)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // h2 flushes on its own connection task.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // END_STREAM: our side is done (a second call finds it sent already).
        let _ = self.send.send_data(Bytes::new(), true);
        Poll::Ready(Ok(()))
    }
}
