//! drainshim-bench: the harness beside the product. The benchmarks and the
//! demo, the streaming backend, a real-Envoy launcher, load clients and
//! plots, on drainshim's public library; `drainshim bench ...` and
//! `drainshim demo` run this crate's binary (src/main.rs). The tests of the
//! drainshim package use it as their harness.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

pub mod admin_stub;
pub mod cli;
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

/// The source tree this crate was built from (the workspace root, above
/// bench/): `.cache/`, `target/shipped/`, `deploy/`.
pub fn source_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// A free TCP port on loopback, bound and released: for a process (Envoy, a
/// shim) that binds it right away, and for a port known to refuse
/// connections. The benches, the demo and the tests all take it from here.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The `drainshim` binary the benchmarks run as the sidecar, the agent and
/// the fleet commands (the soaks, node-scale, the fleet bench, failopen):
/// `DRAINSHIM_BIN` if set (`make bench` names the production build,
/// target/shipped/drainshim), else the one beside this binary (both are in
/// target/<profile>/ after `cargo build --workspace`, and an install puts
/// them side by side).
pub fn drainshim_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(DRAINSHIM_BIN) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "{DRAINSHIM_BIN}={}: no such file (build it, e.g. scripts/build-shipped.sh)",
                path.display()
            ))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
    let beside = exe.with_file_name("drainshim");
    if beside.is_file() {
        Ok(beside)
    } else {
        Err(format!(
            "no drainshim binary at {}: build it beside this one \
             (`cargo build --workspace`, with the same profile), or name one in {DRAINSHIM_BIN}",
            beside.display()
        ))
    }
}

/// The variable naming the `drainshim` binary to run ([`drainshim_binary`]).
pub const DRAINSHIM_BIN: &str = "DRAINSHIM_BIN";

/// Generated protobuf and gRPC types of the bench protocol (build.rs).
pub mod proto {
    pub mod bench {
        tonic::include_proto!("drainshim.bench.v1");
    }
}
