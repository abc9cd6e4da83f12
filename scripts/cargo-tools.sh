#!/usr/bin/env bash
# Installs the cargo subcommands that `make fuzz-ci` and `make lint` use into
# $DRAINSHIM_CACHE/cargo-tools/bin (not ~/.cargo): crates.io sources, built
# with `cargo install --locked` at pinned versions, so a fresh machine gets
# the same tools. Usage: scripts/cargo-tools.sh [cargo-fuzz|cargo-deny]...
# (default: both). Prints nothing when they are already there.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${DRAINSHIM_CACHE:-$root/.cache}
tools=$cache/cargo-tools
# Keep these in step with what the scripts were tested with.
declare -A VERSION=([cargo-fuzz]=0.13.2 [cargo-deny]=0.20.2)

wanted=("$@")
[[ ${#wanted[@]} -gt 0 ]] || wanted=(cargo-fuzz cargo-deny)
for tool in "${wanted[@]}"; do
  version=${VERSION[$tool]:?"cargo-tools: unknown tool $tool"}
  # `cargo install` records what it installed; an exact match needs no build.
  if [[ -x $tools/bin/$tool ]] && grep -q "\"$tool $version " "$tools/.crates.toml" 2>/dev/null; then
    continue
  fi
  echo "cargo-tools: installing $tool $version into $tools (a few minutes, once)" >&2
  # Its own target dir: never fights over the project's build lock.
  CARGO_TARGET_DIR=$cache/cargo-tools-build \
    cargo install --locked --quiet --root "$tools" "$tool" --version "=$version"
  rm -rf "$cache/cargo-tools-build"
done
