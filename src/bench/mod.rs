//! Bench and demo: the streaming backend, a real-Envoy launcher, and the demo.

pub mod admin_stub;
pub mod client;
pub mod demo;
pub mod envoy;
pub mod failopen;
pub mod fleet;
pub mod measure;
pub mod node_guard;
pub mod node_scale;
pub mod population;
pub mod reconnect;
pub mod relay;
pub mod server;
pub mod soak;
pub mod soak_node;
pub mod ws;

/// A free TCP port on loopback, bound and released: for a process (Envoy, a
/// shim) that binds it right away, and for a port known to refuse
/// connections. The benches, the demo and the tests all take it from here.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
