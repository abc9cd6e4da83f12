"""The sidecar Component (deploy/components/sidecar, and its native-sidecar
variant) on workloads written outside the repo (ADOPTER_WORKLOADS): rendered
with one `components:` line, they pass every per-pod check. `drainshim
inject` on the same workloads: every per-pod check too, and the pods the
Component renders (check_inject).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import tempfile
from pathlib import Path

import yaml

from .config import DEPLOY, DRAINSHIM_BIN, POD_TEMPLATE_KINDS, ROOT
from .checker import Checker
from .pods import all_containers, pod_specs
from .pod_checks import (
    base_app_containers, check_pod, check_services, check_services_reach_proxy, pod_app_port,
)
from .node import check_no_privileged
from .rollout import check_rollout
from .schema import check_schema
from .scrapes import ScrapePod


SIDECAR_COMPONENT = DEPLOY / "components" / "sidecar"
# The same on native sidecars (Kubernetes >= 1.29); it includes ../sidecar/app.
NATIVE_SIDECAR_COMPONENT = DEPLOY / "components" / "native-sidecar"

# Workloads from outside the repo, as someone adopting drainshim has them:
# their own names, images, ports, volumes; nothing of deploy/base. Two opt in
# (a Deployment and a StatefulSet, on different ports), one does not. The
# Service points at Envoy, as deploy/README.md tells adopters to.
ADOPTER_WORKLOADS = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: orders
  labels: {app.kubernetes.io/name: orders, drainshim.io/inject: "true"}
spec:
  replicas: 2
  selector:
    matchLabels: {app.kubernetes.io/name: orders}
  template:
    metadata:
      labels: {app.kubernetes.io/name: orders}
      annotations: {drainshim.io/app-port: "9090"}
    spec:
      containers:
      - name: server
        image: registry.example.com/shop/orders:4.2.1
        args: [--port=9090, --metrics-port=9464]
        ports:
        - {name: http, containerPort: 9090}
        - {name: metrics, containerPort: 9464}
        volumeMounts:
        - {name: cache, mountPath: /var/cache/orders}
      volumes:
      - name: cache
        emptyDir: {}
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: ledger
  labels: {app.kubernetes.io/name: ledger, drainshim.io/inject: "true"}
spec:
  serviceName: ledger
  selector:
    matchLabels: {app.kubernetes.io/name: ledger}
  template:
    metadata:
      labels: {app.kubernetes.io/name: ledger}
      annotations: {drainshim.io/app-port: "7070"}
    spec:
      containers:
      - name: ledger
        image: registry.example.com/shop/ledger:1.0.3
        ports:
        - {name: grpc, containerPort: 7070}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: mailer
  labels: {app.kubernetes.io/name: mailer}
spec:
  selector:
    matchLabels: {app.kubernetes.io/name: mailer}
  template:
    metadata:
      labels: {app.kubernetes.io/name: mailer}
    spec:
      containers:
      - name: mailer
        image: registry.example.com/shop/mailer:2.0.0
---
apiVersion: v1
kind: Service
metadata:
  name: orders
spec:
  selector: {app.kubernetes.io/name: orders}
  ports:
  - {name: http, port: 80, targetPort: envoy-inbound}
"""
ADOPTERS_OPTED_IN = {"Deployment/orders", "StatefulSet/ledger"}


# The same workloads for `drainshim inject`, which takes every workload it is
# given: the one that does not opt in says so (drainshim.io/inject: "false").
# Their Service targets the app's port by name, which inject gives to Envoy's
# inbound port: it must reach Envoy (check_services_reach_proxy).
INJECT_WORKLOADS = ADOPTER_WORKLOADS.replace(
    "labels: {app.kubernetes.io/name: mailer}", 'labels: {app.kubernetes.io/name: mailer, drainshim.io/inject: "false"}', 1
).replace("targetPort: envoy-inbound}", "targetPort: http}")


def run_inject(docs: list[dict], mode: str) -> tuple[list[dict] | None, str]:
    """`drainshim inject --services --mode` on the objects (under Istio
    without --services: the Services keep the app's port): the objects it
    writes, or None and its error."""
    services = [] if mode == "istio" else ["--services"]
    try:
        r = subprocess.run([str(DRAINSHIM_BIN), "inject", *services, "--mode", mode], input=yaml.safe_dump_all(docs),
                           capture_output=True, text=True, timeout=120)
    except OSError as e:
        raise SystemExit(f"check_deploy: cannot run {DRAINSHIM_BIN} ({e}): build it first (cargo build)")
    if r.returncode != 0:
        return None, r.stderr.strip()
    return [d for d in yaml.safe_load_all(r.stdout) if d], ""


def port_name_given_back(template: dict) -> dict:
    """A pod template `drainshim inject` wrote, with the app's port name
    given back: in the plain modes inject gives it to Envoy's inbound port
    and renames the app's port (and the app's probes that name it)
    `app-<number>`, so that a Service by that name reaches Envoy on injected
    pods and the app on the others (the Component's pods always have Envoy,
    and keep `envoy-inbound`). Its record in drainshim.io/injected names both."""
    t = copy.deepcopy(template)
    raw = ((t.get("metadata") or {}).get("annotations") or {}).get("drainshim.io/injected")
    moved = (json.loads(raw) if raw else {}).get("portName")
    if not moved:
        return t
    for c, _, _ in all_containers(t.get("spec") or {}):
        for p in c.get("ports") or []:
            if c.get("name") == "envoy" and p.get("name") == moved["name"]:
                p["name"] = "envoy-inbound"
            elif p.get("name") == moved["to"]:
                p["name"] = moved["name"]
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            for kind in ("httpGet", "tcpSocket"):
                handler = (c.get(probe) or {}).get(kind) or {}
                if handler.get("port") == moved["to"]:
                    handler["port"] = moved["name"]
    return t


def comparable_pod(template: dict) -> dict:
    """A pod template as inject and the Component may each write it: inject's
    port name given back (port_name_given_back) and its record of what it
    replaced and its record of which release (and webhook revision) wrote
    it left out (a Component cannot know them), the containers and volumes
    in name order (the
    Component puts the new ones first, inject after the pod's own; init
    containers keep their order, which is their start order)."""
    t = port_name_given_back(template)
    annotations = (t.get("metadata") or {}).get("annotations") or {}
    for key in ("drainshim.io/injected", "drainshim.io/version", "drainshim.io/revision"):
        annotations.pop(key, None)
    if not annotations:
        (t.get("metadata") or {}).pop("annotations", None)
    spec = t.get("spec") or {}
    for key in ("containers", "volumes"):
        if key in spec:
            spec[key] = sorted(spec[key] or [], key=lambda c: c.get("name", ""))
    return t


def check_inject_matches(ck: Checker, where: str, injected: list[dict], rendered: list[dict], ids: set[str]) -> None:
    """The pods `drainshim inject` writes are the pods the Component renders."""
    by_id = {f"{d.get('kind')}/{d['metadata']['name']}": d for d in rendered}
    for d in injected:
        rid = f"{d.get('kind')}/{d['metadata']['name']}"
        if rid not in ids:
            continue
        other = by_id.get(rid)
        if not ck.check("inject", other is not None, f"{where}: {rid} is not in the Component's rendering"):
            continue
        got, want = comparable_pod(d["spec"]["template"]), comparable_pod(other["spec"]["template"])
        diff = sorted(k for k in set(got["spec"]) | set(want["spec"]) if got["spec"].get(k) != want["spec"].get(k))
        if got.get("metadata") != want.get("metadata"):
            diff.append("metadata")
        ck.check("inject", got == want, f"{where}: {rid}: drainshim inject and the Component differ in {diff}")


def render_adopter(kubectl: str, component: Path | None, workloads: str = ADOPTER_WORKLOADS) -> tuple[list[dict] | None, str]:
    """The adopter's kustomization, in a directory of its own outside the
    repo: `resources: [deployment.yaml]` and, with a component, the one
    `components:` line (kustomize takes a relative path only). Returns the
    rendered objects, or None and kustomize's error."""
    with tempfile.TemporaryDirectory(prefix="drainshim-adopter-") as tmp:
        (Path(tmp) / "deployment.yaml").write_text(workloads)
        k = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- deployment.yaml\n"
        if component is not None:
            k += f"components:\n- {os.path.relpath(component, tmp)}\n"
        (Path(tmp) / "kustomization.yaml").write_text(k)
        r = subprocess.run([kubectl, "kustomize", tmp], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return None, r.stderr.strip()
    return [d for d in yaml.safe_load_all(r.stdout) if d], ""


def check_bootstrap_alike(ck: Checker, component: Path) -> None:
    """The Component's inline Envoy bootstrap is components/envoy/envoy.yaml
    with the app's port from the pod: the same object once $(APP_PORT) is
    that file's priority 1 port. One may not drift from the other."""
    shared = yaml.safe_load((DEPLOY / "components" / "envoy" / "envoy.yaml").read_text())
    patch = yaml.safe_load((component / "pod-patch.yaml").read_text())
    pod = patch["spec"]["template"]["spec"]
    envoy = next((c for c in (pod.get("containers") or []) + (pod.get("initContainers") or []) if c.get("name") == "envoy"), {})
    args = [str(a) for a in envoy.get("args") or []]
    if not ck.check("adopt", "--config-yaml" in args[:-1], f"{component.name}/pod-patch.yaml: Envoy has no inline --config-yaml bootstrap"):
        return
    port = next(ep["endpoint"]["address"]["socket_address"]["port_value"]
                for cl in shared["static_resources"]["clusters"] for grp in cl["load_assignment"]["endpoints"]
                if grp.get("priority") == 1 for ep in grp["lb_endpoints"])
    inline = yaml.safe_load(args[args.index("--config-yaml") + 1].replace("$(APP_PORT)", str(port)))
    ck.check("adopt", inline == shared,
             f"{component.name}/pod-patch.yaml: Envoy's inline bootstrap differs from components/envoy/envoy.yaml (with $(APP_PORT) = {port}): change both alike")


def check_adoption(ck: Checker, kubectl: str, component: Path, envoy_cache: Path, versions: list[str],
                   workloads: str = ADOPTER_WORKLOADS, inject_mode: str | None = None) -> list[ScrapePod]:
    """The sidecar Component on workloads it has never seen: the opted-in
    pods pass every per-pod check the shipped overlays pass (budget, hooks,
    install, guard -> the pod's own app port, Envoy's fail-open bootstrap
    validated by the real Envoy, probes), every object the schemas, the
    Service reaches Envoy; the app containers keep their image, args, ports
    and mounts; a workload without the label is not touched. Returns the
    rendered pods for the scrape checks.

    With `inject_mode`, the pods are `drainshim inject --mode`'s instead of
    the Component's (on INJECT_WORKLOADS), and each must also be the pod the
    Component renders."""
    area = "adopt"
    if inject_mode is not None:
        workloads = INJECT_WORKLOADS
    before, err = render_adopter(kubectl, None, workloads)
    if not ck.check(area, before is not None, f"the adopter's workloads alone do not render: {err}"):
        return []
    rendered, err = render_adopter(kubectl, component, workloads)
    if not ck.check(area, rendered is not None, f"{component.relative_to(ROOT) if component.is_relative_to(ROOT) else component}: "
                                                f"the adopter's kustomization with the Component does not render: {err}"):
        return []
    after = rendered
    overlay = "adopter"
    if inject_mode is not None:
        overlay = f"inject --mode {inject_mode}"
        after, err = run_inject(before, inject_mode)
        if not ck.check("inject", after is not None, f"{overlay}: refused the adopter's workloads: {err}"):
            return []
        check_inject_matches(ck, overlay, after, rendered, ADOPTERS_OPTED_IN)
    check_schema(ck, overlay, after, versions)
    check_services(ck, overlay, after)
    check_services_reach_proxy(ck, overlay, after)
    check_bootstrap_alike(ck, component)
    configmaps = {d["metadata"]["name"]: d for d in after if d.get("kind") == "ConfigMap"}
    by_id = {f"{d.get('kind')}/{d['metadata']['name']}": d for d in before}
    pods: list[ScrapePod] = []
    listen_ports: dict[str, int] = {}
    for d in after:
        rid = f"{d.get('kind')}/{(d.get('metadata') or {}).get('name')}"
        if d.get("kind") not in POD_TEMPLATE_KINDS:
            continue
        old = by_id.get(rid)
        if rid not in ADOPTERS_OPTED_IN:
            ck.check(area, d == old, f"{overlay}: {rid} has no drainshim.io/inject label, yet the Component changed it")
            pods += [ScrapePod(f"{overlay}: {n}", "", m, sp, None) for n, m, sp in pod_specs(d)]
            continue
        check_rollout(ck, overlay, d)
        apps = base_app_containers([old]) if old else {}
        for name, meta, spec in pod_specs(d):
            where = f"{overlay}: {name}"
            check_no_privileged(ck, overlay, name, spec)
            if not ck.check(area, check_pod(ck, overlay, name, meta, spec, configmaps, envoy_cache, apps, listen_ports),
                            f"{where}: no drainshim sidecar: the Component did not patch it"):
                continue
            pods.append(ScrapePod(where, "", meta, spec, listen_ports.get(where), judge=where in listen_ports))
            own = port_name_given_back({"metadata": meta, "spec": spec})["spec"] if inject_mode else spec
            now = {c.get("name"): c for c, _, _ in all_containers(own)}
            for cname, c in apps.items():
                got = now.get(cname) or {}
                ck.check(area, got.get("ports") == c.get("ports"),
                         f"{where}: {cname}: ports {got.get('ports')} differ from the workload's own {c.get('ports')}")
                kept = [m for m in got.get("volumeMounts") or [] if m.get("name") != "drainshim-bin"]
                ck.check(area, kept == (c.get("volumeMounts") or []),
                         f"{where}: {cname}: volumeMounts {kept} (besides drainshim-bin) differ from the workload's own {c.get('volumeMounts')}")
            how = "drainshim inject" if inject_mode else "the Component"
            print(f"  {where}: adopted through {how} (app {next(iter(apps), None)!r} on :{pod_app_port(Checker(), where, meta, apps)})")
    return pods


def check_inject_base(ck: Checker, rendered_docs: dict[str, list[dict]]) -> None:
    """`drainshim inject` on deploy/base gives the pods of deploy/sidecar
    (base with the sidecar Component), the app's port found from its only
    port instead of the annotation workload/ adds."""
    base, sidecar = rendered_docs.get("base"), rendered_docs.get("sidecar")
    if not ck.check("inject", bool(base) and bool(sidecar), "deploy/base or deploy/sidecar rendered nothing"):
        return
    injected, err = run_inject(base, "sidecar")
    if not ck.check("inject", injected is not None, f"inject refused deploy/base: {err}"):
        return
    ids = {f"{d.get('kind')}/{d['metadata']['name']}" for d in base if d.get("kind") in POD_TEMPLATE_KINDS}
    ck.check("inject", bool(ids), "deploy/base has no workload")
    check_inject_matches(ck, "inject deploy/base", injected, sidecar, ids)
    print(f"  inject deploy/base: {sorted(ids)} as deploy/sidecar renders them")
