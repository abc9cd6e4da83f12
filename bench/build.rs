//! Generates the gRPC types of the bench protocol (src/lib.rs `proto`) from
//! the repository's top-level `proto/` (the crate sits in `bench/`, its proto
//! beside the product's at the top, as the layout in docs/design.md draws it).
//!
//! protoc comes from the `protoc-bin-vendored` crate so a fresh machine needs
//! nothing beyond cargo.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../proto");
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // Build scripts are single threaded, so setting the variable is sound here.
    std::env::set_var("PROTOC", protoc);
    tonic_prost_build::configure()
        .compile_protos(&["../proto/drainshim/bench/v1/stream.proto"], &["../proto"])?;
    Ok(())
}
