"""The Istio variant of the sidecar Component (deploy/components/sidecar-istio)
on a workload from outside the repo (ADOPTER_ISTIO), and the merge of a
workload-selected Sidecar with its namespace's default Sidecar.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from .config import DEPLOY
from .checker import Checker
from .pods import pod_specs
from .pod_checks import base_app_containers, check_istio_failopen, check_pod, pod_app_port
from .node import check_no_privileged
from .sidecar import render_adopter
from .schema import check_schema
from .scrapes import selects


SIDECAR_ISTIO_COMPONENT = DEPLOY / "components" / "sidecar-istio"

# A workload from outside the repo in a namespace whose default Sidecar
# scopes egress (and allows registered services only). Its Istio adoption
# must keep both for the pods its own Sidecar selects.
ADOPTER_ISTIO = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: orders
  labels: {app.kubernetes.io/name: orders, drainshim.io/inject: "true"}
spec:
  selector:
    matchLabels: {app.kubernetes.io/name: orders, tier: api}
  template:
    metadata:
      labels: {app.kubernetes.io/name: orders, tier: api}
      annotations: {drainshim.io/app-port: "9090", drainshim.io/app-protocol: GRPC}
    spec:
      containers:
      - name: server
        image: registry.example.com/shop/orders:4.2.1
        ports:
        - {name: grpc, containerPort: 9090}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata:
  name: default
spec:
  egress:
  - hosts: ["./*", "istio-system/*", "payments/payments.payments.svc.cluster.local"]
  outboundTrafficPolicy:
    mode: REGISTRY_ONLY
"""


def check_sidecar_merge(ck: Checker, overlay: str, docs: list[dict]) -> None:
    """Istio applies one Sidecar to a pod: one with a workloadSelector takes
    the place of its namespace's default Sidecar (none) for the pods it
    selects. Each such Sidecar must carry the default's egress hosts and its
    outboundTrafficPolicy, or those pods silently lose the namespace's
    scoping (an egress-less Sidecar reaches */*)."""
    def ns(d: dict) -> str:
        return (d.get("metadata") or {}).get("namespace") or ""

    sidecars = [d for d in docs if d.get("kind") == "Sidecar"]
    defaults = {ns(d): d for d in sidecars if not (d.get("spec") or {}).get("workloadSelector")}
    for d in sidecars:
        spec = d.get("spec") or {}
        dflt = defaults.get(ns(d))
        if not spec.get("workloadSelector") or dflt is None:
            continue
        name, dname = d["metadata"]["name"], dflt["metadata"]["name"]
        want = {h for e in (dflt.get("spec") or {}).get("egress") or [] for h in e.get("hosts") or []}
        got = {h for e in spec.get("egress") or [] for h in e.get("hosts") or []}
        missing = sorted(want - got)
        ck.check("wiring", not missing,
                 f"{overlay}: Sidecar/{name} replaces the namespace's default Sidecar/{dname} for the pods it selects but lacks its egress hosts "
                 f"{missing}{' (it has no egress: they would reach */*)' if not got else ''}: carry them over (components/sidecar-istio does)")
        otp = (dflt.get("spec") or {}).get("outboundTrafficPolicy")
        if otp is not None:
            ck.check("wiring", spec.get("outboundTrafficPolicy") == otp,
                     f"{overlay}: Sidecar/{name} has outboundTrafficPolicy {spec.get('outboundTrafficPolicy')}, its namespace's default Sidecar/{dname} {otp}: carry it over")
        if not missing:
            print(f"  {overlay}: Sidecar/{name} carries the egress hosts {sorted(want)} of the namespace's default Sidecar/{dname}")


def check_istio_adoption(ck: Checker, kubectl: str, component: Path, envoy_cache: Path, versions: list[str],
                         workloads: str = ADOPTER_ISTIO) -> None:
    """The Istio variant on a workload it has never seen: the pod passes the
    per-pod checks (budget, hooks, install, istio-proxy's hook, Istio's
    drain timers, the guard -> the app's own port), the Sidecar points the
    app's port at the guard and the EnvoyFilter adds the app as fallback,
    and the workload's Sidecar keeps the namespace default's egress."""
    area, overlay = "adopt", "adopter-istio"
    before, err = render_adopter(kubectl, None, workloads)
    if not ck.check(area, before is not None, f"the adopter's Istio workload alone does not render: {err}"):
        return
    after, err = render_adopter(kubectl, component, workloads)
    if not ck.check(area, after is not None, f"{overlay}: the adopter's kustomization with the Istio Component does not render: {err}"):
        return
    check_schema(ck, overlay, after, versions)
    dep = next((d for d in after if d.get("kind") == "Deployment"), None)
    old = next((d for d in before if d.get("kind") == "Deployment"), None)
    if not ck.check(area, dep is not None and old is not None, f"{overlay}: no Deployment rendered"):
        return
    apps = base_app_containers([old])
    for name, meta, spec in pod_specs(dep):
        check_no_privileged(ck, overlay, name, spec)
        ck.check(area, check_pod(ck, overlay, name, meta, spec, {}, envoy_cache, apps),
                 f"{overlay}: {name}: no drainshim sidecar: the Component did not patch it")
        port = pod_app_port(ck, f"{overlay}: {name}", meta, apps)
        check_istio_failopen(ck, overlay, after, apps, port)
        selected = [d for d in after if d.get("kind") in ("Sidecar", "EnvoyFilter")
                    and ((d.get("spec") or {}).get("workloadSelector") or {}).get("labels")]
        for d in selected:
            ck.check(area, selects({"matchLabels": d["spec"]["workloadSelector"]["labels"]}, meta.get("labels") or {}),
                     f"{overlay}: {d['kind']}/{d['metadata']['name']} selects {d['spec']['workloadSelector']['labels']}, not the pods of {name}")
        ck.check(area, len(selected) == 2, f"{overlay}: {len(selected)} workload-selected Sidecar/EnvoyFilter objects, want the pair")
    defaults = [d for d in after if d.get("kind") == "Sidecar" and d["metadata"]["name"] == "default"]
    ck.check(area, defaults == [d for d in before if d.get("kind") == "Sidecar"],
             f"{overlay}: the namespace's default Sidecar is not rendered as the adopter wrote it")
    check_sidecar_merge(ck, overlay, after)

    # The default as a copy that another kustomization applies
    # (local-config): left out of the output, and still merged.
    src = [d for d in yaml.safe_load_all(workloads) if d]
    dflt: dict = {"spec": {}}
    for d in src:
        if d.get("kind") == "Sidecar" and d["metadata"]["name"] == "default":
            d["metadata"].setdefault("annotations", {})["config.kubernetes.io/local-config"] = "true"
            dflt = d
    local, err = render_adopter(kubectl, component, yaml.safe_dump_all(src))
    if ck.check(area, local is not None, f"{overlay}: with the default Sidecar as a local-config copy, does not render: {err}"):
        ours = [d for d in local if d.get("kind") == "Sidecar"]
        ck.check(area, [d["metadata"]["name"] for d in ours] == ["drainshim-guard"]
                 and all((ours[0]["spec"].get(k) == dflt["spec"].get(k)) for k in ("egress", "outboundTrafficPolicy")),
                 f"{overlay}: with the default Sidecar as a local-config copy, want only Sidecar/drainshim-guard, with the default's egress "
                 f"and outboundTrafficPolicy; got {[(d['metadata']['name'], d['spec'].get('egress'), d['spec'].get('outboundTrafficPolicy')) for d in ours]}")
