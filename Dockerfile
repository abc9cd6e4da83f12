# syntax=docker/dockerfile:1
#
# The drainshim image: one static binary in an empty (scratch) image.
#
#   docker build --build-arg DRAINSHIM_COMMIT="$(git rev-parse --short HEAD)" -t drainshim:0.1.0 .
#
# Not built in CI: no Docker engine runs on the project's machines. `make test`
# lints this file with hadolint (scripts/check-deploy.sh) instead.

# --- build ------------------------------------------------------------------
# Debian, not Alpine, for the builder: build.rs runs protoc from the
# protoc-bin-vendored crate, a glibc binary, so the *host* side of the build
# must be glibc. Only the *target* is musl.
FROM rust:1-bookworm AS build

# The musl target gives a fully static binary. That is what lets it run in
# `scratch`, and what lets `drainshim install` copy it into another container
# (Envoy's distroless image, the app's image) whatever libc that image has, or
# none. Rust's self-contained musl start-up objects link the binary, but one
# dependency compiles C and assembly: ring, rustls' crypto (the fleet tools'
# HTTPS to Prometheus), built by the cc crate with `musl-gcc`, which
# musl-tools provides. Pinned to bookworm's version (hadolint DL3008); a new
# base release needs the new version here.
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools=1.2.3-1 \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl

WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY src ./src
# The bench targets are declared in Cargo.toml, so cargo wants their files;
# they are not built (no default features, only the binary).
COPY benches ./benches

# Cache mounts keep the registry and the target directory between builds; the
# binary is copied out in the same step because the cache is not in the layer.
# --no-default-features: the production binary leaves out the benchmarks, the
# demo and their dependencies (`drainshim bench`, `drainshim demo`, the bench
# proto, tonic, the WebSocket client). No .git is copied, so `--version`
# names the commit given as DRAINSHIM_COMMIT (build.rs), else `unknown`.
ARG DRAINSHIM_COMMIT
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --no-default-features --target x86_64-unknown-linux-musl --bin drainshim \
 && install -D -m 0755 target/x86_64-unknown-linux-musl/release/drainshim /out/drainshim

# --- runtime ----------------------------------------------------------------
# scratch: no shell, no package manager, no libc, nothing to patch. drainshim
# writes nothing to the filesystem (logs go to stderr, the report to stdout),
# so the pod can mount the root read-only.
FROM scratch

# /usr/local/bin, not /: pods mount the shared emptyDir for the copied binary
# at /drainshim, and a mount there must not hide the image's own binary.
COPY --from=build /out/drainshim /usr/local/bin/drainshim

# 65532 is the conventional "nonroot" UID of distroless images (Envoy's
# distroless image uses it too), so a pod-wide runAsUser fits every container.
USER 65532:65532

ENTRYPOINT ["/usr/local/bin/drainshim"]
CMD ["sidecar"]
