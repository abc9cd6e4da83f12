//! Envoy's admin API: the hyper client and serde models of its JSON.

pub mod admin;
pub mod model;

pub use admin::{AdminClient, AdminError, Counts, Dial, FailOpen, InboundScope, TcpDial};
pub use model::{
    parse_envoy_version, DynamicListenerState, ListenerInfo, ListenerManagerStats, ServerInfo, Stat,
};
