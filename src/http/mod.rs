//! HTTP both ways, for every part of drainshim that speaks it besides the
//! guard (which relays HTTP/2 frames itself and serves HTTP/1.1 with its own
//! limits):
//!
//! - [`client`]: the one client every outgoing call uses (Envoy's admin API,
//!   `drainshim prestop`, the fleet tools' scrapes and Prometheus queries).
//!   Its names are re-exported here (`http::Endpoint`, `http::call`), the
//!   names every caller uses.
//! - [`server`]: how drainshim serves its own HTTP/1.1 endpoints (the
//!   sidecar's control endpoints, the node agent's API and each pod's
//!   preStop listener, the webhook's TLS and metrics ports): one accept
//!   loop, one way to serve a connection (header timeout, buffer limit, a
//!   bounded graceful shutdown) and the plain-text, JSON and OpenMetrics
//!   answers.
//!
//! A leaf: it imports nothing of the crate (`tests/it/layering.rs`).

pub mod client;
pub mod server;

pub use client::{
    call, encode_query, request, request_with, CallError, Endpoint, RequestError, UrlError,
    MAX_BODY,
};
