#!/usr/bin/env bash
# Python packages the tests use as independent peers, into a venv in the
# cache ($DRAINSHIM_CACHE, default .cache/py-venv):
#   - websockets (PyPI): the WebSocket client of tests/it/guard_websocket_python.rs
#   - grpcio (PyPI): the gRPC application of tests/it/guard_app_shutdown.rs
#     and tests/it/peer_matrix/ (tests/py/grpc_app.py), a server whose
#     graceful stop and keepalive enforcement nobody here wrote
#   - pytest, h2, hyperframe, hpack (PyPI): the HTTP/2 conformance suite
#     tests/py/h2_conformance/ (`make conformance`), whose app and client
#     on either side of the guard are python-h2 connections and hyperframe frames
#   - jsonpatch, trustme, PyYAML, kubernetes-validate (PyPI): the webhook's tests
#     (tests/py/webhook_test.py, `make webhook-test`): an independent JSON Patch
#     applied to its answers, a CA and certificates made for the test, the
#     manifests read, the pods it ends with held to Kubernetes' schemas
# Fails when they cannot be had: tests never skip for a missing component.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${DRAINSHIM_CACHE:-$root/.cache}
venv=$cache/py-venv
# Pinned to what was tested; bump together with the tests (and the check below).
pkgs=(websockets==17.4 grpcio==1.85.3 pytest==9.2.0 h2==4.4.1 hyperframe==6.1.0 hpack==4.2.0
      jsonpatch==1.48 trustme==1.2.1 PyYAML==6.0.4 kubernetes-validate==1.37.0)
die() { printf 'fetch-pytools: %s\n' "$*" >&2; exit 1; }
mkdir -p "$cache"
check='
import sys, importlib.metadata as m, websockets, grpc, pytest, h2, hyperframe, hpack, jsonpatch, trustme, yaml
import kubernetes_validate
sys.exit(websockets.__version__ != "17.4" or grpc.__version__ != "1.85.3"
         or pytest.__version__ != "9.2.0" or h2.__version__ != "4.4.1"
         or hyperframe.__version__ != "6.1.0" or hpack.__version__ != "4.2.0"
         or m.version("jsonpatch") != "1.48" or m.version("trustme") != "1.2.1"
         or m.version("PyYAML") != "6.0.4" or m.version("kubernetes-validate") != "1.37.0")'
if ! "$venv/bin/python" -c "$check" 2>/dev/null; then
  python3 -m venv "$venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${pkgs[@]}" \
    || die "pip install ${pkgs[*]} failed"
  "$venv/bin/python" -c "$check" || die "installed, yet not at the pinned versions: ${pkgs[*]}"
fi
echo "fetch-pytools: ${pkgs[*]}" >&2
