#!/usr/bin/env bash
# Python packages the tests use as independent clients, into a venv in the
# cache ($DRAINSHIM_CACHE, default .cache/py-venv):
#   - websockets (PyPI): the WebSocket client of tests/it/guard_websocket_python.rs
# Fails when they cannot be had: tests never skip for a missing component.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${DRAINSHIM_CACHE:-$root/.cache}
venv=$cache/py-venv
# Pinned to what was tested; bump together with the tests.
pkgs=(websockets==17.4)
die() { printf 'fetch-pytools: %s\n' "$*" >&2; exit 1; }
mkdir -p "$cache"
if ! "$venv/bin/python" -c 'import websockets, sys; sys.exit(websockets.__version__ != "17.4")' 2>/dev/null; then
  python3 -m venv "$venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${pkgs[@]}" \
    || die "pip install ${pkgs[*]} failed"
fi
echo "fetch-pytools: websockets $("$venv/bin/python" -c 'import websockets; print(websockets.__version__)')" >&2
