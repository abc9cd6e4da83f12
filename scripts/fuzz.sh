#!/usr/bin/env bash
# Builds every libFuzzer target in fuzz/ and runs each for a fixed time.
#
#   scripts/fuzz.sh [seconds-per-target] [target...]
#
# Default: 20 s per target, every target (what `make fuzz-ci` runs in CI).
# Prints the executions per target and exits non-zero if any target crashed,
# hung past -timeout, or ran out of memory; the input that did it is kept in
# fuzz/artifacts/<target>/ (reproduce: the target binary with that file).
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
seconds=${1:-20}
shift || true
[[ $seconds =~ ^[0-9]+$ && $seconds -gt 0 ]] || { echo "usage: $0 [seconds-per-target] [target...]" >&2; exit 64; }
# Per process; the targets' own use is ~40 MB.
rss_limit_mb=${FUZZ_RSS_LIMIT_MB:-2048}
# One input taking this long is a hang, reported like a crash.
input_timeout=${FUZZ_INPUT_TIMEOUT:-10}

"$root/scripts/cargo-tools.sh" cargo-fuzz
cargo_fuzz=${DRAINSHIM_CACHE:-$root/.cache}/cargo-tools/bin/cargo-fuzz
target_dir=${CARGO_TARGET_DIR:-$root/target}
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

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
failed=()
results=()
for t in "${targets[@]}"; do
  bin=$target_dir/$triple/release/$t
  [[ -x $bin ]] || { echo "fuzz: no binary for target $t" >&2; exit 1; }
  # The working corpus grows run by run and stays out of git; the seeds are
  # read only.
  corpus=${DRAINSHIM_CACHE:-$root/.cache}/fuzz-corpus/$t
  mkdir -p "$corpus" "$root/fuzz/artifacts/$t"
  dirs=("$corpus")
  [[ -d $root/fuzz/seeds/$t ]] && dirs+=("$root/fuzz/seeds/$t")
  echo "fuzz: $t for ${seconds} s" >&2
  start=$SECONDS
  rc=0
  "$bin" -max_total_time="$seconds" -rss_limit_mb="$rss_limit_mb" -timeout="$input_timeout" \
    -print_final_stats=1 -artifact_prefix="$root/fuzz/artifacts/$t/" "${dirs[@]}" \
    >"$logs/$t.log" 2>&1 || rc=$?
  took=$((SECONDS - start))
  # libFuzzer's own count: the final stats line, else the last "#N DONE".
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$t.log" | tail -1)
  [[ -n $execs ]] || execs=$(sed -n 's/^#\([0-9]*\).*DONE.*/\1/p' "$logs/$t.log" | tail -1)
  execs=${execs:-0}
  if [[ $rc -ne 0 ]]; then
    failed+=("$t")
    echo "fuzz: $t FAILED (exit $rc); its log ends:" >&2
    tail -40 "$logs/$t.log" >&2
    results+=("$(printf '%-12s %8s s %12s execs  FAILED (exit %d)' "$t" "$took" "$execs" "$rc")")
  else
    results+=("$(printf '%-12s %8s s %12s execs  %8s/s' "$t" "$took" "$execs" "$((execs / (took > 0 ? took : 1)))")")
  fi
done

echo "fuzz: executions per target"
printf '  %s\n' "${results[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz: crashed: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
  exit 1
fi
