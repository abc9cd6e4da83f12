#!/usr/bin/env bash
# Fetches the metric stores the tests and `bench fleet` run, Debian's
# packages, into $DRAINSHIM_CACHE/ without installing them system-wide
# (`apt-get download` + `dpkg -x`):
#   prometheus/usr/bin/prometheus, prometheus/usr/bin/promtool (package prometheus)
#   victoria-metrics/usr/bin/victoria-metrics (package victoria-metrics)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${DRAINSHIM_CACHE:-$root/.cache}

# fetch <package> <binary to check, relative to the package's root>...
fetch() {
  local pkg=$1 dest=$cache/$1
  shift
  local have=1
  for bin in "$@"; do [[ -x $dest/$bin ]] || have=0; done
  [[ $have == 1 ]] && return 0
  command -v apt-get >/dev/null || { echo "fetch-prometheus: apt-get is needed (Debian/Ubuntu)" >&2; exit 1; }
  local tmp
  tmp=$(mktemp -d)
  # apt-get download drops privileges to _apt, which must be able to write here.
  chmod 0777 "$tmp"
  if ! (cd "$tmp" && apt-get download "$pkg" >/dev/null 2>&1); then
    echo "fetch-prometheus: refreshing the package lists" >&2
    apt-get update -qq
    (cd "$tmp" && apt-get download "$pkg")
  fi
  rm -rf "$dest" && mkdir -p "$dest"
  dpkg -x "$tmp"/"${pkg}"_*.deb "$dest"
  rm -rf "$tmp"
  for bin in "$@"; do
    [[ -x $dest/$bin ]] || { echo "fetch-prometheus: $pkg has no $bin" >&2; exit 1; }
  done
  echo "fetch-prometheus: $pkg at $dest" >&2
}

fetch prometheus usr/bin/prometheus usr/bin/promtool
"$cache/prometheus/usr/bin/prometheus" --version >/dev/null
fetch victoria-metrics usr/bin/victoria-metrics
"$cache/victoria-metrics/usr/bin/victoria-metrics" -version >/dev/null
