//! drainshim: makes Envoy proxy restarts safe for long-lived gRPC streams.
//!
//! Data flows one way: trigger -> drain driver -> (Envoy admin, guard) ->
//! report -> metrics and control endpoints. See docs/design.md.
#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod control;
pub mod drain;
pub mod envoy;
pub mod error;
pub mod fleet;
pub mod guard;
pub mod http;
pub mod inject;
pub mod inventory;
pub mod metrics;
pub mod node;
pub mod settings;
pub mod sidecar;
pub mod timer;
