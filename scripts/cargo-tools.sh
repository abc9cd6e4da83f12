#!/usr/bin/env bash
# Installs the cargo subcommands that `make fuzz-ci` and `make lint` use into
# $DRAINSHIM_CACHE/cargo-tools/bin (not ~/.cargo/bin): crates.io sources,
# built with `cargo install --locked` at pinned versions, so a fresh machine
# gets the same tools. Usage: scripts/cargo-tools.sh [cargo-fuzz|cargo-deny]...
# (default: both). Prints nothing when they are already there.
#
# CI runs in a fresh clone, whose .cache/ is empty: so that it does not
# rebuild the tools on every run (minutes each), each built binary is also
# kept per machine in $CARGO_HOME/drainshim-tools/<tool>-<version>/ and
# copied from there. A machine without that copy builds the tool as below.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${DRAINSHIM_CACHE:-$root/.cache}
tools=$cache/cargo-tools
# Keep these in step with what the scripts were tested with.
declare -A VERSION=([cargo-fuzz]=0.13.2 [cargo-deny]=0.20.2)

wanted=("$@")
[[ ${#wanted[@]} -gt 0 ]] || wanted=(cargo-fuzz cargo-deny)
mkdir -p "$tools/bin"
for tool in "${wanted[@]}"; do
  version=${VERSION[$tool]:?"cargo-tools: unknown tool $tool"}
  stamp=$tools/bin/.$tool.version
  if [[ -x $tools/bin/$tool && $(cat "$stamp" 2>/dev/null) == "$version" ]]; then
    continue
  fi
  shelf=${CARGO_HOME:-$HOME/.cargo}/drainshim-tools/$tool-$version
  if [[ ! -x $shelf/$tool ]]; then
    echo "cargo-tools: building $tool $version from crates.io (a few minutes, once per machine)" >&2
    build=$(mktemp -d)
    # Its own root and target dir: never touches ~/.cargo/bin or the project's build lock.
    CARGO_TARGET_DIR=$build/target \
      cargo install --locked --quiet --root "$build/root" "$tool" --version "=$version"
    mkdir -p "$shelf"
    cp "$build/root/bin/$tool" "$shelf/$tool.tmp"
    mv "$shelf/$tool.tmp" "$shelf/$tool"
    rm -rf "$build"
  fi
  cp "$shelf/$tool" "$tools/bin/$tool"
  echo "$version" >"$stamp"
  "$tools/bin/$tool" "${tool#cargo-}" --version >/dev/null
done
