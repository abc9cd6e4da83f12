#!/usr/bin/env bash
# Fetches Debian's `prometheus` package (a real server and promtool) into
# $DRAINSHIM_CACHE/prometheus/ without installing it system-wide:
# `apt-get download` + `dpkg -x`. Binaries: usr/bin/prometheus, usr/bin/promtool.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${DRAINSHIM_CACHE:-$root/.cache}
dest=$cache/prometheus
if [[ -x $dest/usr/bin/prometheus && -x $dest/usr/bin/promtool ]]; then
  exit 0
fi
command -v apt-get >/dev/null || { echo "fetch-prometheus: apt-get is needed (Debian/Ubuntu)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# apt-get download drops privileges to _apt, which must be able to write here.
chmod 0777 "$tmp"
cd "$tmp"
if ! apt-get download prometheus >/dev/null 2>&1; then
  echo "fetch-prometheus: refreshing the package lists" >&2
  apt-get update -qq
  apt-get download prometheus
fi
rm -rf "$dest" && mkdir -p "$dest"
dpkg -x prometheus_*.deb "$dest"
"$dest/usr/bin/prometheus" --version >/dev/null
"$dest/usr/bin/promtool" --version >/dev/null
echo "fetch-prometheus: $("$dest/usr/bin/prometheus" --version 2>&1 | head -1) at $dest/usr/bin" >&2
