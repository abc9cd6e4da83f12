//! Bench and demo: the streaming backend, a real-Envoy launcher, and the demo.

pub mod client;
pub mod demo;
pub mod envoy;
pub mod measure;
pub mod population;
pub mod reconnect;
pub mod server;
