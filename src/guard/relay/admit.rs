//! Whether a new stream goes on to the application, and the guard's own
//! answer when it does not (refused retryably, too large, or no application).

use super::*;

/// Why a new stream was refused.
pub(super) enum Refusal {
    /// Past the header list limit: 431.
    TooLarge,
    /// Not processed, safe to retry (REFUSED_STREAM).
    Reset,
    /// The drain refuses new streams: trailers-only UNAVAILABLE for gRPC.
    Draining(BodyKind),
}

impl Relay<'_> {
    /// Why a new stream is not admitted, if it is not.
    pub(super) fn admission(&self, fields: &wire::Fields, limit: usize) -> Option<Refusal> {
        let l = &self.guard.config().limits;
        if fields.list_size > limit {
            return Some(Refusal::TooLarge);
        }
        let beyond = |last: Option<u32>| last.is_some_and(|last| self.last_id > last);
        if self.life.refuses_streams() || beyond(self.sent_last) || beyond(self.app_last) {
            return Some(Refusal::Reset);
        }
        (self.streams.len() >= l.max_concurrent_streams as usize).then_some(Refusal::Reset)
    }

    /// Registers and opens a stream (true), or answers it (false).
    pub(super) fn admit(
        &mut self,
        id: u32,
        end_stream: bool,
        fields: &wire::Fields,
        now: Instant,
    ) -> bool {
        let guard = self.guard;
        let ct = fields.content_type.as_deref().unwrap_or("");
        let kind = request_kind_of(ct);
        let grpc = kind != BodyKind::Opaque;
        self.resets.accepted();
        let reg = match guard
            .registry()
            .try_register_relayed(self.info.id, grpc, &self.queue, id)
        {
            Ok(r) => r,
            Err(Refused::Terminating) => {
                self.refuse(id, end_stream, Refusal::Draining(kind));
                return false;
            }
            Err(Refused::Full) => {
                self.refuse(id, end_stream, Refusal::Reset);
                return false;
            }
        };
        let protocol = if grpc {
            StreamProtocol::grpc
        } else {
            StreamProtocol::http
        };
        let sig = guard
            .signals()
            .start(grpc, fields.path.as_deref().unwrap_or("/"), protocol);
        self.streams.insert(
            id,
            Stream {
                reg,
                kind,
                bounds: None,
                req_done: end_stream,
                resp_done: false,
                started: now,
                messages: 0,
                last_data: None,
                ending: None,
                sig,
                window: self.client_window,
                shut_since: None,
            },
        );
        true
    }

    /// Alone, an admitted stream's answer: the application could not be
    /// reached, so gRPC gets a trailers-only UNAVAILABLE (retryable), and
    /// HTTP a 502, as Envoy answers a failed upstream connect.
    pub(super) fn unavailable(&mut self, id: u32) {
        let Some(s) = self.streams.get(&id) else {
            return;
        };
        let block = trailers_only(s.kind, grpc::UPSTREAM_UNAVAILABLE_MESSAGE)
            .unwrap_or_else(|| wire::literal_block(&[(":status", "502")]));
        self.own_block(id, &block, true);
        if let Some(s) = self.streams.get_mut(&id) {
            s.resp_done = true;
        }
        self.end_here(id, Outcome::UpstreamFailed);
    }

    /// A stream the application never sees, answered here.
    pub(super) fn refuse(&mut self, id: u32, end_stream: bool, refusal: Refusal) {
        match refusal {
            Refusal::TooLarge => {
                let block = wire::literal_block(&[(":status", "431")]);
                self.own_block(id, &block, true);
            }
            Refusal::Reset => wire::rst(&mut self.client.write, id, wire::REFUSED_STREAM),
            Refusal::Draining(kind) => match trailers_only(kind, grpc::REFUSED_MESSAGE) {
                Some(block) => self.own_block(id, &block, true),
                None => wire::rst(&mut self.client.write, id, wire::REFUSED_STREAM),
            },
        }
        if !end_stream && !matches!(refusal, Refusal::Reset) {
            // Answered in full before the request's end: stop it, no error.
            wire::rst(&mut self.client.write, id, wire::NO_ERROR);
        }
    }
}
