#!/usr/bin/env bash
# What `make test` runs, in order, saying when each phase starts (it takes
# most of an hour on two cores):
#
#   1. the tools the tests run against (`make tools`: Envoy, Prometheus, the
#      peers, ...), the lints and the deploy checks;
#   2. the debug build, then the unit and integration tests, one test at a
#      time (several measure timing against real Envoy), then the HTTP/2
#      conformance suite and the webhook tests;
#   3. the benchmarks (`make bench`), which build and measure the production
#      binary;
#   4. the fuzz targets (`make fuzz-ci`).
#
# One phase at a time: the machine is the tests' alone while they run. (The
# release builds of 3 and 4 were tried in the background during 1 and 2, at
# nice 19: the tests' own compile took 5 minutes instead of 1.5, and the
# benchmarks still waited 11 minutes for them, so nothing was gained.)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cargo=${CARGO:-cargo}
make=${MAKE:-make}
phase() { echo "make test: $(date +%T) $*"; }

phase "tools, lints and deploy checks"
"$make" --no-print-directory tools lint deploy-check
phase "debug build"
"$cargo" build --locked --workspace
phase "unit and integration tests (about 11 minutes)"
# drainshim-bench sits beside target/debug/drainshim: tests run `drainshim
# bench server`, which execs it. The peer matrix (tests/it/peer_matrix/)
# runs grpc-go, grpc-java, grpcio and tonic servers built by `make peers`.
RUST_TEST_THREADS=1 "$cargo" test --locked --workspace
phase "conformance and webhook"
"$make" --no-print-directory conformance
"$make" --no-print-directory webhook-test
phase "benchmarks"
"$make" --no-print-directory bench
phase "fuzzing"
"$make" --no-print-directory fuzz-ci
phase "done"
