#!/usr/bin/env bash
# What `make test` runs, saying when each phase starts (README.md says how
# long it takes on two cores; most of it is spent waiting on drains or measuring):
#
#   1. the tools the tests run against (`make tools`: Envoy, Prometheus, the
#      peers, ...; mostly downloads) beside the debug and test builds;
#   2. while the unit and integration tests run, one test at a time (several
#      measure timing against real Envoy, and most of their time is spent
#      waiting on drain windows: they leave the two cores 83 % idle), the
#      rest of the work that needs no quiet machine runs at idle priority:
#      the release builds the benchmarks and fuzzing need (the production
#      binary, the bench harness, the fuzz targets; the first two start
#      with phase 1), clippy, cargo-deny, the deploy checks, and then the
#      fuzz targets' runs (`make fuzz-ci`, each for a fixed time; a target
#      whose run is in doubt there, too few inputs, one slow input or less
#      than half its seconds in CPU, runs
#      again on its own before the benchmarks). Their logs are in
#      target/make-test/; the tests take the cores whenever they want them;
#   3. the HTTP/2 conformance suite and the webhook tests;
#   4. once the background work is done, the benchmarks (`make bench`) on a
#      machine that runs nothing else.
#
# Any failure stops the run with exit 1; a failure of the background work is
# reported (its log's end) when it is waited for, before the benchmarks.
# A test run stopped early (Ctrl-C, a failed test) stops the background too.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cargo=${CARGO:-cargo}
make=${MAKE:-make}
logs=target/make-test
mkdir -p "$logs"
phase() { echo "make test: $(date +%T) $*"; }

# Runs "$@" in its own session (so it can be stopped whole) and waits for it
# later: `started` holds its pid, "$1" is its log.
background() {
  local log=$1
  shift
  setsid "$@" >"$log" 2>&1 &
  started=$!
}

# A command prefix for idle priority, three ways, so it holds on any kernel:
# SCHED_IDLE, nice 19 and the idle I/O class. Where the kernel groups
# processes by session (autogroup), a new session's group shares the cores
# equally with the tests' session whatever its nice, so that group is set to
# nice 19 too, from inside the new session.
idle=(nice -n 19)
command -v chrt >/dev/null && idle=(chrt --idle 0 "${idle[@]}")
command -v ionice >/dev/null && idle=(ionice -c 3 "${idle[@]}")
idle=(bash -c '{ echo 19 >/proc/self/autogroup; } 2>/dev/null; exec "$@"' idle "${idle[@]}")

# Waits for a background job; on failure shows the end of its log and exits.
# Either way the job is gone: it leaves `jobs`, so no reused id is signalled.
join() {
  local pid=$1 log=$2 what=$3 rc=0 left=() j
  wait "$pid" || rc=$?
  for j in "${jobs[@]}"; do [[ $j == "$pid" ]] || left+=("$j"); done
  jobs=("${left[@]}")
  if [[ $rc -ne 0 ]]; then
    echo "make test: $what failed; the end of $log:" >&2
    tail -200 "$log" >&2
    # A long log's failure may lie above that tail (a build's warnings, a
    # fuzz target's stats after it): its error lines (rustc's, make's, a
    # panic or a script's own) close the report.
    echo "make test: $what failed; the error lines of $log:" >&2
    grep -n -E -A8 '^error(\[|:)|\*\*\* \[|panicked at|: (error|failed)' "$log" | tail -120 >&2 || true
    exit 1
  fi
}

jobs=()
stop_jobs() {
  local pid
  for pid in "${jobs[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
}
trap stop_jobs EXIT
trap 'exit 130' INT TERM

sub=("$make" --no-print-directory -j1 CARGO="$cargo")
phase "tools (downloads: $logs/tools.log) beside the debug and test builds;" \
  "the release builds at idle priority from now on ($logs/background-release.log)"
background "$logs/tools.log" "$make" --no-print-directory tools
tools=$started
# The release builds use their own target directories (target/shipped-build,
# target/release), so they never hold a lock the debug and test builds wait on.
# One after the other: side by side (-j2) they were still building 3 minutes
# past the time the two took in turn, and the fuzz build beside them took half
# as long again.
background "$logs/background-release.log" "${idle[@]}" "${sub[@]}" shipped bench-build
release=$started
jobs+=("$tools" "$release")
"$cargo" fmt --all --check
"$cargo" build --locked --workspace
"$cargo" test --locked --workspace --no-run
join "$tools" "$logs/tools.log" "make tools"
cat "$logs/tools.log"

phase "background, at idle priority: clippy, cargo-deny, deploy checks, the fuzz build and runs ($logs/background-checks.log)"
# After the debug and test builds: clippy shares their target directory.
# Beside the release builds, so one's single-threaded link (fat LTO) leaves
# the other core to the second. At idle priority a fuzz target may wait
# seconds for a core while a test holds both: a target whose run is in doubt
# there is named in $deferred and runs again on its own below (FUZZ_DEFER in
# scripts/fuzz.sh).
deferred=$logs/fuzz-deferred
rm -f "$deferred"
background "$logs/background-checks.log" env FUZZ_DEFER="$PWD/$deferred" \
  "${idle[@]}" "${sub[@]}" clippy deny deploy-check fuzz-build fuzz-ci
checks=$started
jobs+=("$checks")

phase "unit and integration tests (about 11 minutes)"
# drainshim-bench sits beside target/debug/drainshim: tests run `drainshim
# bench server`, which execs it. The peer matrix (tests/it/peer_matrix/)
# runs grpc-go, grpc-java, grpcio and tonic servers built by `make peers`.
tables=${CARGO_TARGET_DIR:-target}/tmp/peer-matrix
rm -rf "$tables"
RUST_TEST_THREADS=1 "$cargo" test --locked --workspace
# The peer matrix's tables and the config push's (cargo hides a passing test's output): every
# server's cases, graceful, cut, lost and dropped.
cat "$tables"/*.md || echo "make test: the peer matrix left no tables in $tables" >&2
phase "conformance and webhook"
"$make" --no-print-directory conformance
"$make" --no-print-directory webhook-test

phase "waiting for the background work"
join "$checks" "$logs/background-checks.log" "clippy, cargo-deny, the deploy checks or fuzzing"
cat "$logs/background-checks.log"
join "$release" "$logs/background-release.log" "the production build or the bench harness build"
cat "$logs/background-release.log"
trap - EXIT
[[ -f $deferred ]] || { echo "make test: the fuzz run left no $deferred" >&2; exit 1; }
mapfile -t again <"$deferred"
if [[ ${#again[@]} -gt 0 ]]; then
  phase "fuzzing again on its own: ${again[*]} (in doubt at idle priority)"
  scripts/fuzz.sh 20 "${again[@]}"
fi

phase "benchmarks"
"$make" --no-print-directory bench
phase "done"
