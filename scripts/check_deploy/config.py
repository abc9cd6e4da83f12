"""Constants shared by the checks: the repository's paths (ROOT, DEPLOY,
MONITORING), the overlays each kind of check must find something in, the
CRD kinds without a schema, the drainshim binary that `--check` runs, the
timer defaults, the node agent's capabilities, the guard's port, Envoy's
HTTP/2 window bounds, and the metrics the alert rules may read beyond the
contract.
"""

from __future__ import annotations

import os
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent.parent
DEPLOY = ROOT / "deploy"
MONITORING = DEPLOY / "monitoring"

# Overlays that must contain at least one pod with a drainshim sidecar, so
# that the per-pod checks can never pass by finding nothing to check.
OVERLAYS_WITH_SHIM = {"sidecar", "native-sidecar", "istio"}

# prometheus-operator CRDs: kubernetes-validate ships only the schemas of
# Kubernetes' own API groups, so these kinds cannot be schema-checked. What
# they carry is checked otherwise: the PrometheusRule's groups must equal
# rules.yaml (which promtool checks and unit-tests), and the PodMonitors are
# run on every rendered pod as prometheus-operator and Prometheus would
# (check_scrapes): each drainshim scraped once, at its --listen port.
# Istio's Sidecar and EnvoyFilter (istio/) are checked by check_istio_failopen.
# cert-manager's Certificate and Issuer (webhook/) by check_webhooks: the
# webhook's CA annotation names the Certificate, its dnsNames hold the
# Service's name, its Secret is the one mounted, its issuer is rendered.
CRD_KINDS = {"PodMonitor", "PrometheusRule", "Sidecar", "EnvoyFilter", "Certificate", "Issuer"}
SCHEMA_VERSIONS = ["1.30.0"]  # the oldest supported; the latest is added at run time

# drainshim's own rules and defaults are not copied here: each manifest's
# drainshim container is run as `drainshim <sub> --check` with its args and
# env (and, for a sidecar, the pod's grace period), and the effective
# settings it prints are what the checks below use.
DRAINSHIM_BIN = Path(os.environ.get("DRAINSHIM_BIN", Path(__file__).resolve().parent.parent.parent / "target" / "debug" / "drainshim"))
KUBE_GRACE_DEFAULT = 30.0  # terminationGracePeriodSeconds when unset
ISTIO_TERMINATION_DRAIN_DEFAULT = 5.0  # ProxyConfig.terminationDrainDuration

# node mode (`drainshim node`): the agent's defaults (src/node/mod.rs) and the
# capabilities it needs, exactly (its --help, privileges).
AGENT_CAPABILITIES = {"SYS_ADMIN", "SYS_PTRACE"}
# Overlays that must contain the node agent / a workload using it, so the
# node-mode checks can never pass by finding nothing to check.
OVERLAYS_WITH_AGENT = {"daemonset"}
OVERLAYS_WITH_NODE_WORKLOAD = {"daemonset-workload"}

# Overlays that must render the admission webhook, each exactly one revision
# of it (the name its --revision serves), so the webhook checks can never pass
# by finding nothing to check: deploy/webhook (the default revision), the
# example of a named one, deploy/webhook/canary, and the example of a revision
# tag, deploy/webhook/tags/stable (the revision it points at).
OVERLAYS_WITH_WEBHOOK = {"webhook": "default", "webhook-canary": "canary", "webhook-tags-stable": "default"}

# Adopting the guard changes no app: the guard listens on its own port and
# forwards to the app's own, unchanged one (the port the app declares in
# deploy/base). Envoy's inbound cluster sends to the guard with the app as
# its priority 1 fallback.
GUARD_PORT = 15097
# Overlays that must wire Istio's inbound cluster to the guard, failing open.
OVERLAYS_WITH_ISTIO_FAILOPEN = {"istio"}
# Envoy's upstream HTTP/2 windows must stay bounded (backpressure end to end):
# at most these, in bytes (Envoy's defaults are 256 MiB).
MAX_STREAM_WINDOW = 1024 * 1024
MAX_CONNECTION_WINDOW = 4 * 1024 * 1024

POD_TEMPLATE_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}

# Metrics the alert rules may read beyond docs/design.md's contract (which is
# drainshim's own, tests/it/contract.rs), with who exports them: the API
# server counts the calls of a failurePolicy Ignore webhook that it gave up on
# (the pod was created without it).
RULE_METRICS_BEYOND_CONTRACT = {
    "apiserver_admission_webhook_fail_open_count": "kube-apiserver >= 1.24 (ALPHA): calls of a failurePolicy "
                                                   "Ignore webhook that failed, by webhook name and type",
}
