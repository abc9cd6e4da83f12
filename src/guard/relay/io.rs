//! The relay's socket reads and writes, each bounded by the caller.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::io::poll_read_buf;

use super::limits::READ_BUF;

/// What is left of `buf` from `at` (an incomplete frame), as the next read's
/// buffer, with room for the read.
pub(super) fn keep_rest(mut buf: BytesMut, at: usize) -> BytesMut {
    buf.advance(at);
    if buf.capacity() - buf.len() < READ_BUF / 4 {
        buf.reserve(READ_BUF);
    }
    buf
}

/// Writes from `buf` until it is empty or the socket is full.
pub(super) fn write_some<W: AsyncWrite + Unpin>(
    cx: &mut Context<'_>,
    io: &mut W,
    buf: &mut BytesMut,
) -> std::io::Result<()> {
    while !buf.is_empty() {
        match Pin::new(&mut *io).poll_write(cx, buf) {
            Poll::Ready(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Poll::Ready(Ok(n)) => buf.advance(n),
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => break,
        }
    }
    Ok(())
}

pub(super) fn read_some<R: AsyncRead + Unpin>(
    cx: &mut Context<'_>,
    io: &mut R,
    buf: &mut BytesMut,
) -> Poll<std::io::Result<usize>> {
    if buf.capacity() - buf.len() < READ_BUF / 4 {
        buf.reserve(READ_BUF);
    }
    poll_read_buf(Pin::new(io), cx, buf)
}

/// Writes all of `buf`, bounded by the caller.
pub(super) async fn flush<W: AsyncWrite + Unpin>(
    io: &mut W,
    buf: &mut BytesMut,
) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let bound = std::time::Duration::from_secs(1);
    let _ = tokio::time::timeout(bound, async {
        while !buf.is_empty() {
            let n = io.write(buf).await?;
            if n == 0 {
                break;
            }
            buf.advance(n);
        }
        io.flush().await
    })
    .await;
    Ok(())
}
