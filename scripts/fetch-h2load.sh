#!/usr/bin/env bash
# Installs h2load (Debian's nghttp2-client) for the guard benchmark. It links
# against system libraries, so it is installed with apt rather than unpacked
# into the cache. Needs root, as on CI and the project's machines.
set -euo pipefail
command -v h2load >/dev/null && exit 0
command -v apt-get >/dev/null || { echo "fetch-h2load: apt-get is needed (Debian/Ubuntu)" >&2; exit 1; }
if ! apt-get install -y -qq nghttp2-client >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq nghttp2-client
fi
h2load --version >/dev/null
echo "fetch-h2load: $(h2load --version | head -1)" >&2
