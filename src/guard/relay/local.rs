//! WebSockets over extended CONNECT (RFC 8441) the guard serves itself: each
//! is a task ([`super::connect::proxy`]) that speaks HTTP/1.1 to the
//! application, and the relay moves its bytes as DATA frames within the
//! client's windows. The client's DATA is held for the task within the
//! window the guard granted it (the initial window the client was told,
//! topped up as the task takes the data); whatever is held when the stream
//! goes, by any way, is given back to the client's connection window
//! ([`Locals::drop`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::collections::HashMap;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::ids::StreamIds;
use super::limits::{HIGH_WATER, LOCAL_CHUNK};
use super::peer::{put_block, Peer};
use super::settings::PeerSettings;
use super::window::Window;
use super::wire::{self, Head};

/// A WebSocket over HTTP/2 the guard serves itself: `io` is its task's
/// view of the stream (the task runs [`super::connect::proxy`]).
pub(super) struct Local {
    pub(super) io: tokio::io::DuplexStream,
    /// The task's answer, until it came.
    pub(super) answer: Option<tokio::sync::oneshot::Receiver<super::connect::Answer>>,
    pub(super) answered: bool,
    /// The client's window for this stream.
    pub(super) window: i64,
    /// The window the guard granted the client for its DATA on this stream
    /// (RFC 9113 §6.9): DATA past it is FLOW_CONTROL_ERROR, so `to_task`
    /// never holds more.
    pub(super) recv_window: i64,
    /// The client's DATA not yet handed to the task.
    pub(super) to_task: BytesMut,
    /// The client ended its side; once `to_task` is handed over, the task
    /// sees the end (`shut`).
    pub(super) client_eof: bool,
    pub(super) shut: bool,
    /// The task ended its side: END_STREAM went to the client.
    pub(super) task_eof: bool,
}

/// The WebSockets over HTTP/2 the guard serves itself, by stream id.
#[derive(Default)]
pub(super) struct Locals {
    open: HashMap<u32, Local>,
}

impl Locals {
    pub(super) fn get(&self, id: &u32) -> Option<&Local> {
        self.open.get(id)
    }

    pub(super) fn get_mut(&mut self, id: &u32) -> Option<&mut Local> {
        self.open.get_mut(id)
    }

    pub(super) fn contains_key(&self, id: &u32) -> bool {
        self.open.contains_key(id)
    }

    #[cfg(test)]
    pub(super) fn insert(&mut self, id: u32, local: Local) {
        self.open.insert(id, local);
    }

    pub(super) fn len(&self) -> usize {
        self.open.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Local> {
        self.open.values()
    }

    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut Local> {
        self.open.values_mut()
    }

    /// Opens local stream `id` (its request ended already with
    /// `end_stream`) for a WebSocket over HTTP/2 (RFC 8441): the task's ends
    /// of it, its view of the stream and where it answers, for the caller
    /// to start it on ([`super::connect::proxy`]).
    pub(super) fn open(
        &mut self,
        id: u32,
        end_stream: bool,
        window: &Window,
    ) -> (
        tokio::io::DuplexStream,
        tokio::sync::oneshot::Sender<super::connect::Answer>,
    ) {
        let (task_io, io) = tokio::io::duplex(4 * LOCAL_CHUNK);
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.open.insert(
            id,
            Local {
                io,
                answer: Some(rx),
                answered: false,
                window: window.initial(),
                recv_window: window.told(),
                to_task: BytesMut::new(),
                client_eof: end_stream,
                shut: false,
                task_eof: false,
            },
        );
        (task_io, tx)
    }

    /// Moves the local streams on: their answers, the client's data to
    /// their tasks, and theirs to the client within its windows. True if
    /// anything moved.
    pub(super) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        client: &mut Peer,
        window: &mut Window,
        settings: &mut PeerSettings,
    ) -> bool {
        let client_frame = client.frame();
        let to_client = &mut client.write;
        let mut moved = false;
        let mut done = Vec::new();
        let mut chunk = [0u8; LOCAL_CHUNK];
        for (&id, l) in self.open.iter_mut() {
            if let Some(rx) = l.answer.as_mut() {
                match Pin::new(rx).poll(cx) {
                    Poll::Ready(Ok((head, end))) => {
                        moved = true;
                        l.answer = None;
                        let mut block = Vec::new();
                        if let Some(size) = settings.take_update_due() {
                            // See `own_block`.
                            wire::put_size_update(&mut block, size);
                        }
                        block.extend_from_slice(&head_block(&head));
                        put_block(to_client, id, end, &block, client_frame);
                        if end {
                            if !l.client_eof {
                                wire::rst(to_client, id, wire::NO_ERROR);
                            }
                            done.push(id);
                            continue;
                        }
                        l.answered = true;
                    }
                    Poll::Ready(Err(_)) => {
                        wire::rst(to_client, id, wire::CANCEL);
                        done.push(id);
                        continue;
                    }
                    Poll::Pending => {}
                }
            }
            while !l.to_task.is_empty() {
                match Pin::new(&mut l.io).poll_write(cx, &l.to_task) {
                    Poll::Ready(Ok(n)) if n > 0 => {
                        l.to_task.advance(n);
                        l.recv_window += n as i64;
                        wire::window_update(to_client, id, n as u32);
                        wire::window_update(to_client, 0, n as u32);
                        moved = true;
                    }
                    // The task is gone: nothing takes the data any more,
                    // and the connection window it took is given back.
                    Poll::Ready(_) => {
                        wire::window_update(to_client, 0, l.to_task.len() as u32);
                        l.to_task.clear();
                    }
                    Poll::Pending => break,
                }
            }
            if l.to_task.is_empty()
                && l.client_eof
                && !l.shut
                && Pin::new(&mut l.io).poll_shutdown(cx).is_ready()
            {
                l.shut = true;
                moved = true;
            }
            // The connection window is charged when `to_client` is written
            // (`clear_gate`); what waits for it is bounded by the high-water mark.
            while l.answered
                && !l.task_eof
                && l.window > 0
                && window.available() > 0
                && to_client.len() < HIGH_WATER
            {
                let max = (l.window.min(window.available()) as usize)
                    .min(client_frame)
                    .min(LOCAL_CHUNK);
                let mut rb = ReadBuf::new(&mut chunk[..max]);
                match Pin::new(&mut l.io).poll_read(cx, &mut rb) {
                    Poll::Ready(Ok(())) if rb.filled().is_empty() => {
                        wire::put(to_client, wire::DATA, wire::END_STREAM, id, &[]);
                        l.task_eof = true;
                        moved = true;
                    }
                    Poll::Ready(Ok(())) => {
                        let n = rb.filled().len();
                        wire::put(to_client, wire::DATA, 0, id, rb.filled());
                        l.window -= n as i64;
                        window.owe(n);
                        moved = true;
                    }
                    Poll::Ready(Err(_)) => {
                        wire::rst(to_client, id, wire::CANCEL);
                        l.task_eof = true;
                        l.client_eof = true;
                        moved = true;
                    }
                    Poll::Pending => break,
                }
            }
            if l.task_eof && l.client_eof {
                done.push(id);
            }
        }
        for id in done {
            self.drop(id, &mut client.write);
        }
        moved
    }

    /// Client DATA on local stream `id`: held for its task within the
    /// window the guard granted; its padding given back at once. A stream
    /// error of the client's (its connection window given back) is the
    /// caller's to answer: its code.
    pub(super) fn data(
        &mut self,
        h: Head,
        data: &[u8],
        to_client: &mut BytesMut,
        ids: &mut StreamIds,
    ) -> Option<u32> {
        let l = self.open.get_mut(&h.id)?;
        let error = if l.client_eof {
            // Half-closed (remote): RFC 9113 §5.1.
            Some(wire::STREAM_CLOSED)
        } else if h.len as i64 > l.recv_window {
            Some(wire::FLOW_CONTROL_ERROR)
        } else {
            None
        };
        if let Some(code) = error {
            wire::window_update(to_client, 0, h.len as u32);
            return Some(code);
        }
        let padding = h.len - data.len();
        l.recv_window -= data.len() as i64;
        l.to_task.extend_from_slice(data);
        let end = h.flags & wire::END_STREAM != 0;
        l.client_eof |= end;
        wire::window_update(to_client, h.id, padding as u32);
        wire::window_update(to_client, 0, padding as u32);
        if end {
            ids.closed(h.id);
        }
        None
    }

    /// Drops local stream `id`, however it ends (the client's RST_STREAM, a
    /// refused upgrade, its task gone, both sides over, a stream error):
    /// the client's DATA still held for the task is given back to the
    /// client's connection window, as the task would have taken it.
    pub(super) fn drop(&mut self, id: u32, to_client: &mut BytesMut) {
        if let Some(l) = self.open.remove(&id) {
            wire::window_update(to_client, 0, l.to_task.len() as u32);
        }
    }

    /// The client was told a SETTINGS_INITIAL_WINDOW_SIZE `delta` from
    /// the last: local streams' windows for its DATA grow with it. A lower
    /// one is not applied to open streams (the client may have sent under
    /// the old one); new streams start at it.
    pub(super) fn window_told(&mut self, delta: i64) {
        if delta > 0 {
            for l in self.open.values_mut() {
                l.recv_window += delta;
            }
        }
    }
}

/// The request head of an extended CONNECT, from its fields.
pub(super) fn connect_head(fields: &[wire::Field]) -> Option<http::request::Parts> {
    let (mut scheme, mut authority, mut path) = ("http".to_string(), None, "/".to_string());
    let mut headers = http::HeaderMap::new();
    for wire::Field { name, value, .. } in fields {
        let text = || String::from_utf8(value.clone()).ok();
        match name.as_slice() {
            b":scheme" => scheme = text()?,
            b":authority" => authority = Some(text()?),
            b":path" => path = text()?,
            n if n.starts_with(b":") => {}
            n => {
                headers.append(
                    http::HeaderName::from_bytes(n).ok()?,
                    http::HeaderValue::from_bytes(value).ok()?,
                );
            }
        }
    }
    let uri = match authority {
        Some(a) => format!("{scheme}://{a}{path}"),
        None => path,
    };
    let (mut head, ()) = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(uri)
        .body(())
        .ok()?
        .into_parts();
    head.headers = headers;
    Some(head)
}

/// A response head as literals.
pub(super) fn head_block(head: &http::Response<()>) -> Vec<u8> {
    let status = head.status().as_u16().to_string();
    let mut fields = vec![(":status", status.as_str())];
    for (name, value) in head.headers() {
        if let Ok(v) = value.to_str() {
            fields.push((name.as_str(), v));
        }
    }
    wire::literal_block(&fields)
}
