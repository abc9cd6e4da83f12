//! Bench and demo: the streaming backend, a real-Envoy launcher, and the demo.

pub mod admin_stub;
pub mod client;
pub mod demo;
pub mod envoy;
pub mod failopen;
pub mod measure;
pub mod node_guard;
pub mod node_scale;
pub mod population;
pub mod reconnect;
pub mod server;
pub mod ws;
