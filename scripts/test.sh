#!/usr/bin/env bash
# What `make test` runs, in order, saying when each phase starts:
#
#   1. the tools the tests run against (`make tools`: Envoy, Prometheus, the
#      peers, ...), the lints and the deploy checks;
#   2. the debug build, then the unit and integration tests, one test at a
#      time (several measure timing against real Envoy), then the HTTP/2
#      conformance suite and the webhook tests;
#   3. the benchmarks (`make bench`), which measure the production binary;
#   4. the fuzz targets (`make fuzz-ci`).
#
# The release builds that 3 and 4 need (the production binary, the bench
# harness, the fuzz targets: about ten minutes of both cores) start first,
# in the background at the lowest CPU priority, and run while 1 downloads
# and installs and while the tests wait on their drains and timers. The
# tests must pass on a loaded two-core machine anyway; the builds take only
# what the rest leaves. Their log is target/prebuild.log; they are waited
# for (and their failure reported) before the benchmarks, and stopped if
# anything before fails.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cargo=${CARGO:-cargo}
make=${MAKE:-make}
phase() { echo "make test: $(date +%T) $*"; }

mkdir -p target
log=target/prebuild.log
phase "background, at low priority: the release builds for the benchmarks and fuzzing ($log)"
# Its own session, so a failed test stops the whole build (cargo, rustc).
setsid nice -n 19 "$make" --no-print-directory prebuild >"$log" 2>&1 &
prebuild=$!
stop_prebuild() { kill -- "-$prebuild" 2>/dev/null || true; }
trap stop_prebuild EXIT

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

phase "waiting for the background builds"
if ! wait "$prebuild"; then
  echo "make test: the background release builds failed; $log ends:" >&2
  tail -60 "$log" >&2
  exit 1
fi
trap - EXIT
phase "benchmarks"
"$make" --no-print-directory bench
phase "fuzzing"
"$make" --no-print-directory fuzz-ci
phase "done"
