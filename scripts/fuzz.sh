#!/usr/bin/env bash
# Builds every libFuzzer target in fuzz/ and runs each for a fixed time.
#
#   scripts/fuzz.sh [seconds-per-target] [target...]
#   scripts/fuzz.sh --build-only     (build every target, run none)
#
# Default: 20 s per target, every target (what `make fuzz-ci` runs in CI), as
# many targets at once as there are cores (FUZZ_JOBS).
# Prints the executions per target and exits non-zero if any target crashed,
# hung past -timeout, or ran out of memory (the input that did it is kept in
# fuzz/artifacts/<target>/; reproduce: the target binary with that file), or
# ran fewer than FUZZ_MIN_EXECS inputs.
#
# cargo-fuzz needs nightly-only rustc flags (-Zsanitizer, sanitizer coverage
# passes, --cfg fuzzing checks). Only the stable toolchain is installed, so
# RUSTC_BOOTSTRAP=1 lets the stable compiler accept them for this build
# only; the main crate is never built that way.
#
# No sanitizer (`-s none`): the crate is #![forbid(unsafe_code)] and what we
# look for is panics, overflows (debug assertions and overflow checks are on)
# and broken invariants; AddressSanitizer would only police the dependencies'
# unsafe code, at about half the executions per second.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build_only=false
if [[ ${1:-} == --build-only ]]; then
  build_only=true
  shift
fi
seconds=${1:-20}
shift || true
[[ $seconds =~ ^[0-9]+$ && $seconds -gt 0 ]] || { echo "usage: $0 [seconds-per-target] [target...]" >&2; exit 64; }
# Per process; the targets' own use is ~40 MB.
rss_limit_mb=${FUZZ_RSS_LIMIT_MB:-2048}
# One input taking this long is a hang, reported like a crash.
input_timeout=${FUZZ_INPUT_TIMEOUT:-10}
[[ $input_timeout =~ ^[0-9]+$ && $input_timeout -gt 0 ]] || { echo "fuzz: FUZZ_INPUT_TIMEOUT must be a positive number" >&2; exit 64; }
# FUZZ_DEFER=FILE: the run shares the cores at idle priority (make test runs
# it beside the integration tests), where a target can wait seconds for a
# core. A target whose run is then in doubt (an input that took the hang
# timeout or more, or too few inputs) is not judged here: its name goes to
# FILE, and make test runs it again on its own (scripts/test.sh). libFuzzer
# itself aborts an input only after 60 s of wall time then. A crash fails
# as always. In doubt means: an input that took the hang timeout or more
# (saved in fuzz/artifacts/<target>/ as timeout-* or slow-unit-*), fewer
# than FUZZ_MIN_EXECS inputs, or less than half the target's seconds in CPU
# time (the budget is CPU, not the wall time a busy machine leaves it).
# Run on its own (no FUZZ_DEFER), a target first replays every input saved
# there as a hang or a slow unit, with the hang timeout: one that still
# takes that long fails the run, however rarely fuzzing finds it again.
defer=${FUZZ_DEFER:-}
abort_after=$input_timeout
[[ -z $defer ]] || abort_after=$((input_timeout > 60 ? input_timeout : 60))
# A target that ran fewer inputs than this fuzzed nothing worth the name (it
# exits at once, or never had a core): a failure, not a pass. Alone, the
# slowest target runs about 3,000 a second.
min_execs=${FUZZ_MIN_EXECS:-1000}

"$root/scripts/cargo-tools.sh" cargo-fuzz
cargo_fuzz=${DRAINSHIM_CACHE:-$root/.cache}/cargo-tools/bin/cargo-fuzz
# A target directory of its own (target/fuzz, its binaries under
# <triple>/release/): cargo locks a whole target directory while it builds,
# so sharing target/ made make test's release builds and the fuzz build and
# runs beside them wait on each other, one core idle.
target_dir=${FUZZ_TARGET_DIR:-${CARGO_TARGET_DIR:-$root/target}/fuzz}
# Where a crash's, a hang's or a slow unit's input is kept, a folder per target.
artifacts=${FUZZ_ARTIFACTS:-$root/fuzz/artifacts}
triple=$(rustc -vV | sed -n 's/^host: //p')

cd "$root/fuzz"
if [[ $# -gt 0 ]]; then
  targets=("$@")
else
  mapfile -t targets < <(RUSTC_BOOTSTRAP=1 "$cargo_fuzz" fuzz list)
fi

build_start=$SECONDS
# cargo-fuzz builds with one codegen unit by default; with 16 (and the
# opt-level overrides in fuzz/Cargo.toml) a fresh build of all targets took
# 170 s instead of 280 s on the 2-core CI machine.
RUSTC_BOOTSTRAP=1 "$cargo_fuzz" fuzz build --sanitizer none --target-dir "$target_dir" --target "$triple" \
  --codegen-units "${FUZZ_CODEGEN_UNITS:-16}" >&2
echo "fuzz: built ${#targets[@]} targets in $((SECONDS - build_start)) s" >&2
$build_only && exit 0

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# One target: runs it, writes its result line to $logs/<t>.result and, if it
# failed, why (its exit code, or too few inputs) to $logs/<t>.failed.
fuzz_one() {
  local t=$1 bin=$target_dir/$triple/release/$1 corpus start took rc=0 execs
  # The working corpus grows run by run and stays out of git; the seeds are
  # read only.
  corpus=${DRAINSHIM_CACHE:-$root/.cache}/fuzz-corpus/$t
  mkdir -p "$corpus" "$artifacts/$t"
  local dirs=("$corpus")
  [[ -d $root/fuzz/seeds/$t ]] && dirs+=("$root/fuzz/seeds/$t")
  if [[ -z $defer ]]; then
    local saved=()
    mapfile -t saved < <(find "$artifacts/$t" -maxdepth 1 -type f \( -name 'timeout-*' -o -name 'slow-unit-*' \) | sort)
    if [[ ${#saved[@]} -gt 0 ]]; then
      echo "fuzz: $t: replaying ${#saved[@]} input(s) saved as a hang or a slow unit, -timeout=$input_timeout" >&2
      "$bin" -rss_limit_mb="$rss_limit_mb" -timeout="$input_timeout" -timeout_exitcode=70 \
        "${saved[@]}" >"$logs/$t.replay.log" 2>&1 || rc=$?
      if [[ $rc -ne 0 ]]; then
        cat "$logs/$t.replay.log" >"$logs/$t.log"
        echo "an input saved as a hang or a slow unit still fails on its own (exit $rc)" >"$logs/$t.failed"
        printf '%-12s %8s s %12s execs  FAILED (a saved hang, exit %d)\n' "$t" 0 0 "$rc" >"$logs/$t.result"
        return
      fi
    fi
  fi
  start=$SECONDS
  local cpu TIMEFORMAT='%3U %3S'
  { time "$bin" -max_total_time="$seconds" -rss_limit_mb="$rss_limit_mb" -timeout="$abort_after" \
    -timeout_exitcode=70 -report_slow_units="$input_timeout" -print_final_stats=1 \
    -artifact_prefix="$artifacts/$t/" "${dirs[@]}" >"$logs/$t.log" 2>&1; } 2>"$logs/$t.cpu" || rc=$?
  took=$((SECONDS - start))
  # The CPU seconds it had (user and system), whole.
  cpu=$(awk '{ printf "%d", $1 + $2 }' "$logs/$t.cpu" 2>/dev/null)
  cpu=${cpu:-0}
  # libFuzzer's own count: the final stats line, else the last "#N DONE".
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$t.log" | tail -1)
  [[ -n $execs ]] || execs=$(sed -n 's/^#\([0-9]*\).*DONE.*/\1/p' "$logs/$t.log" | tail -1)
  execs=${execs:-0}
  slowest=$(sed -n 's/^stat::slowest_unit_time_sec: *//p' "$logs/$t.log" | tail -1)
  slowest=${slowest:-0}
  if [[ -n $defer ]] && { [[ $rc -eq 70 ]] || { [[ $rc -eq 0 ]] && ((execs < min_execs || slowest >= input_timeout || cpu * 2 < seconds)); }; }; then
    echo "$t" >"$logs/$t.deferred"
    printf '%-12s %8s s %12s execs  %s s CPU, slowest input %s s: again on its own\n' "$t" "$took" "$execs" "$cpu" "$slowest" >"$logs/$t.result"
  elif [[ $rc -ne 0 ]]; then
    echo "exit $rc" >"$logs/$t.failed"
    printf '%-12s %8s s %12s execs  FAILED (exit %d)\n' "$t" "$took" "$execs" "$rc" >"$logs/$t.result"
  elif ((execs < min_execs)); then
    echo "ran $execs inputs, fewer than $min_execs" >"$logs/$t.failed"
    printf '%-12s %8s s %12s execs  FAILED (fewer than %d)\n' "$t" "$took" "$execs" "$min_execs" >"$logs/$t.result"
  else
    printf '%-12s %8s s %12s execs  %8s/s  %s s CPU\n' "$t" "$took" "$execs" "$((execs / (took > 0 ? took : 1)))" "$cpu" >"$logs/$t.result"
  fi
}

# Each target is one libFuzzer process on one core: as many at once as
# there are cores (FUZZ_JOBS), so the run takes targets x seconds / cores.
jobs=${FUZZ_JOBS:-$(nproc)}
[[ $jobs =~ ^[0-9]+$ && $jobs -gt 0 ]] || { echo "fuzz: FUZZ_JOBS must be a positive number" >&2; exit 64; }
running=0
for t in "${targets[@]}"; do
  [[ -x $target_dir/$triple/release/$t ]] || { echo "fuzz: no binary for target $t" >&2; exit 1; }
done
for t in "${targets[@]}"; do
  if ((running >= jobs)); then
    wait -n || true
    running=$((running - 1))
  fi
  echo "fuzz: $t for ${seconds} s" >&2
  fuzz_one "$t" &
  running=$((running + 1))
done
wait || true

failed=()
deferred=()
results=()
for t in "${targets[@]}"; do
  [[ -f $logs/$t.result ]] || { echo "fuzz: $t left no result" >&2; failed+=("$t"); continue; }
  results+=("$(cat "$logs/$t.result")")
  [[ -f $logs/$t.deferred ]] && deferred+=("$t")
  if [[ -f $logs/$t.failed ]]; then
    failed+=("$t")
    echo "fuzz: $t FAILED ($(cat "$logs/$t.failed")); its log ends:" >&2
    tail -40 "$logs/$t.log" >&2
  fi
done

echo "fuzz: executions per target"
printf '  %s\n' "${results[@]}"
if [[ -n $defer ]]; then
  : >"$defer"
  [[ ${#deferred[@]} -eq 0 ]] || printf '%s\n' "${deferred[@]}" >"$defer"
  [[ ${#deferred[@]} -eq 0 ]] || echo "fuzz: in doubt at idle priority, to run again on their own: ${deferred[*]}"
fi
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz: failed: ${failed[*]} (a crash's input is in $artifacts/)" >&2
  exit 1
fi
