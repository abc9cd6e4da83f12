# syntax=docker/dockerfile:1
#
# The drainshim image: one static binary in an empty (scratch) image, the same
# binary `make bench` measures (scripts/build-shipped.sh builds both).
#
#   docker build --build-arg DRAINSHIM_COMMIT="$(git rev-parse --short HEAD)" -t drainshim:0.1.0 .
#
# Not built in CI: no Docker engine runs on the project's machines. `make test`
# lints this file with hadolint (scripts/check-deploy.sh) instead.

# --- build ------------------------------------------------------------------
# Debian bookworm: the same glibc (2.36) as the machines the benchmarks run
# on, so the binary in the image is built exactly as the measured one.
FROM rust:1-bookworm AS build

WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
# The sidecar Components' pod patches: drainshim inject and webhook embed them,
# and istio-routing its template.
COPY deploy/components ./deploy/components
COPY deploy/istio-routing/template.yaml ./deploy/istio-routing/
# drainshim-bench is a member of the workspace, so cargo reads its manifest;
# it is not built (the script builds only drainshim's binary), so the
# benchmarks (benches/) and the proto (proto/) it builds from are not copied:
# cargo looks for a target's file only when it builds the target.
COPY bench ./bench
COPY scripts/build-shipped.sh ./scripts/

# scripts/build-shipped.sh is the one recipe for the production binary, here
# and in `make bench` (whose guard and footprint figures are of it):
# release, drainshim's default features (none: no benchmarks, demo, bench
# proto, tonic or WebSocket client, which are drainshim-bench's),
# x86_64-unknown-linux-gnu linked fully static
# (crt-static: a static-pie with glibc inside, no loader, no shared library;
# the script checks it with readelf), glibc's malloc. Static is what lets it
# run in `scratch` and lets `drainshim install` copy it into another
# container (Envoy's distroless image, the app's image) whatever libc that
# has, or none. The musl target would do the same, but the project's
# machines cannot install it, so the figures would be of another binary
# (docs/design.md "The shipped build").
#
# Cache mounts keep the registry and the target directory between builds; the
# binary is copied out in the same step because the cache is not in the layer.
# No .git is copied, so `--version` names the commit given as DRAINSHIM_COMMIT
# (build.rs), else `unknown`.
ARG DRAINSHIM_COMMIT
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    scripts/build-shipped.sh \
 && install -D -m 0755 target/shipped/drainshim /out/drainshim

# --- runtime ----------------------------------------------------------------
# scratch: no shell, no package manager, no libc, nothing to patch. drainshim
# writes nothing to the filesystem (logs go to stderr, the report to stdout),
# so the pod can mount the root read-only. Host names (a Prometheus's, a
# `localhost` admin URL) resolve inside the static binary through the
# /etc/hosts and /etc/resolv.conf the kubelet mounts into every container; no
# NSS library is needed (checked in a chroot holding only the binary).
FROM scratch

# /usr/local/bin, not /: pods mount the shared emptyDir for the copied binary
# at /drainshim, and a mount there must not hide the image's own binary.
COPY --from=build /out/drainshim /usr/local/bin/drainshim

# 65532 is the conventional "nonroot" UID of distroless images (Envoy's
# distroless image uses it too), so a pod-wide runAsUser fits every container.
USER 65532:65532

ENTRYPOINT ["/usr/local/bin/drainshim"]
CMD ["sidecar"]
