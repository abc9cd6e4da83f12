#!/usr/bin/env python3
"""Checks the deployment files in deploy/ (run by scripts/check-deploy.sh).

    check_deploy.py check --rendered DIR --envoy-cache DIR --prometheus BIN --kubectl BIN
        Every check below on the kustomize output in DIR (one NAME.yaml per
        base or overlay). Prints what it checked; exits 1 on any failure.
    check_deploy.py selftest --rendered DIR --prometheus BIN --envoy-cache DIR --kubectl BIN
        Proves the rollout, scrape, label, docs and adoption rules fire: on the rendered
        DaemonSet as shipped (accepted) and as it was before issue 29, with
        its port declared (rejected), on the sidecar PodMonitor as shipped
        and as it was before issue 30, honouring labels (rejected, also by a
        real Prometheus), on the docs' old wording, and on broken copies of
        the sidecar Components (ADOPTION_CASES, NATIVE_ADOPTION_CASES,
        ISTIO_ADOPTION_CASES).
    check_deploy.py sync-rules
        Rewrites deploy/monitoring/prometheusrule.yaml from rules.yaml.

Checks:
  schema     every rendered object against the Kubernetes 1.30 and latest
             schemas (kubernetes-validate, strict: unknown fields fail)
  budget     drain < parent-shutdown < terminationGracePeriodSeconds, from the
             drainshim container's flags and env (defaults when absent), plus
             the timers around it: Envoy's --drain-time-s, Istio's
             drainDuration/terminationDrainDuration, prestop --timeout.
             Node mode: the agent's timers against every node-mode
             workload's grace, and against the agent's own grace
  wiring     the preStop hooks exec the binary that the install init container
             copies, from a volume the hook's container mounts; the proxy's
             hook starts the drain; probes and scrapes can reach the shim;
             Services' named target ports exist; no privileged: true anywhere.
             Node mode: each workload's httpGet preStop targets the agent's
             --pod-listen-port with ?wait=true on the Envoy container, other
             containers wait too, no binary in the pod, Envoy names its pod
             in node metadata. Scrapes: the PodMonitors are run on every
             rendered pod (Prometheus' pod discovery, the operator's port
             filter, the relabelings): each drainshim scraped exactly once at
             its --listen port, nothing else scraped, the agent with
             honorLabels. Labels: no sidecar scraped with honorLabels, its
             monitor's own relabelings set namespace/pod from the pod's
             metadata, honorLabels only on monitors confined to the agents'
             namespaces; and a real Prometheus, configured from each sidecar
             monitor as the operator would, scrapes an exporter claiming
             another pod (FORGED): the stored series must name the real pod
  node       the `drainshim node` DaemonSet: hostPID, hostNetwork, exactly
             SYS_ADMIN + SYS_PTRACE, root (for the capabilities), read-only
             root, seccomp RuntimeDefault, tolerations for every node, a
             Pod Security "privileged" namespace, /readyz probe on --listen
  rollout    no DaemonSet or Deployment whose rolling update surges declares
             a host port (with hostNetwork: any container port): the surge
             pod would stay Pending on the NodePorts filter
  envoy      the Envoy bootstrap validates with the real Envoy of the image's
             version (`envoy --mode validate`) and agrees with drainshim's
             flags (admin address, INBOUND listener, cluster -> guard); it
             fails open: priority 0 the guard (health-checked), priority 1
             the app's own port, a retry to the other priority, bounded
             HTTP/2 windows. Every app container is as in deploy/base
             (image, command, args): the guard listens on 15097 and forwards
             to the app's own port. Under Istio, a Sidecar points the
             inbound cluster at the guard and an EnvoyFilter adds the app as
             its fallback
  adopt      the sidecar Component (deploy/components/sidecar) on workloads
             written here, outside the repo (ADOPTER_WORKLOADS), through one
             `components:` line: the opted-in pods pass every per-pod check
             above, the app containers keep their ports and mounts, a
             workload without the label is untouched. Its Istio variant
             (components/sidecar-istio, ADOPTER_ISTIO) likewise, with the
             Sidecar/EnvoyFilter pair; and in every rendered overlay, a
             workload-selected Sidecar carries its namespace default
             Sidecar's egress hosts and outboundTrafficPolicy (merged, not
             replaced). The selftest breaks copies of both Components
  rules      prometheusrule.yaml carries exactly the groups of rules.yaml
  metrics    every metric queried by the rules and the dashboard is in the
             contract (docs/design.md), or recorded by rules.yaml
  dashboard  the dashboard JSON parses and every panel has a query
  docs       the node-mode prose (DOC_FILES) against the rendered agent and
             `drainshim node --help`: a short list of known contradictions
             (maxSurge/maxUnavailable, "no stream guard", "no hostPath")
Only PyYAML is needed besides the standard library (and kubernetes-validate
for the schema check).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
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
CRD_KINDS = {"PodMonitor", "PrometheusRule", "Sidecar", "EnvoyFilter"}
SCHEMA_VERSIONS = ["1.30.0"]  # the oldest supported; the latest is added at run time

# drainshim's own rules and defaults are not copied here: each manifest's
# drainshim container is run as `drainshim <sub> --check` with its args and
# env (and, for a sidecar, the pod's grace period), and the effective
# settings it prints are what the checks below use.
DRAINSHIM_BIN = Path(os.environ.get("DRAINSHIM_BIN", Path(__file__).resolve().parent.parent / "target" / "debug" / "drainshim"))
PRESTOP_TIMEOUT_DEFAULT = 120.0  # drainshim prestop --timeout
KUBE_GRACE_DEFAULT = 30.0  # terminationGracePeriodSeconds when unset
ISTIO_TERMINATION_DRAIN_DEFAULT = 5.0  # ProxyConfig.terminationDrainDuration

# node mode (`drainshim node`): the agent's defaults (src/node/mod.rs) and the
# capabilities it needs, exactly (its --help, privileges).
AGENT_CAPABILITIES = {"SYS_ADMIN", "SYS_PTRACE"}
# Overlays that must contain the node agent / a workload using it, so the
# node-mode checks can never pass by finding nothing to check.
OVERLAYS_WITH_AGENT = {"daemonset"}
OVERLAYS_WITH_NODE_WORKLOAD = {"daemonset-workload"}

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


class Checker:
    def __init__(self) -> None:
        self.failures: list[str] = []
        self.counts: dict[str, int] = {}

    def ok(self, area: str) -> None:
        self.counts[area] = self.counts.get(area, 0) + 1

    def check(self, area: str, cond: bool, msg: str) -> bool:
        if cond:
            self.ok(area)
        else:
            self.failures.append(f"[{area}] {msg}")
        return cond

    def fail(self, area: str, msg: str) -> None:
        self.failures.append(f"[{area}] {msg}")


# ---------------------------------------------------------------- durations

_UNITS = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3,
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
}


def duration(text: str) -> float:
    """Seconds in a humantime duration (`90s`, `1m30s`, `2 min`), the syntax
    drainshim's flags use; also Go/proto durations like Istio's `60s`."""
    s = str(text).strip()
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-zµ]+)", s)
    rebuilt = "".join(n + u for n, u in parts)
    if not parts or rebuilt != re.sub(r"\s+", "", s):
        raise ValueError(f"not a duration: {text!r}")
    total = 0.0
    for n, unit in parts:
        if unit not in _UNITS:
            raise ValueError(f"unknown unit {unit!r} in {text!r}")
        total += float(n) * _UNITS[unit]
    return total


# ---------------------------------------------------------------- pod model

def pod_specs(doc: dict):
    """(name, pod metadata, pod spec) for every pod template in a document."""
    kind = doc.get("kind")
    name = f"{kind}/{doc.get('metadata', {}).get('name')}"
    if kind in POD_TEMPLATE_KINDS:
        t = doc["spec"]["template"]
        yield name, t.get("metadata", {}), t["spec"]
    elif kind == "CronJob":
        t = doc["spec"]["jobTemplate"]["spec"]["template"]
        yield name, t.get("metadata", {}), t["spec"]
    elif kind == "Pod":
        yield name, doc.get("metadata", {}), doc["spec"]


def image_name(c: dict) -> str:
    """`registry/drainshim:1.2` -> `drainshim`."""
    img = c.get("image", "")
    return img.rsplit("/", 1)[-1].split("@")[0].split(":")[0]


def is_drainshim(c: dict, sub: str) -> bool:
    args = c.get("args") or []
    return image_name(c) == "drainshim" and not c.get("command") and args[:1] == [sub]


def flags(args: list[str]) -> dict[str, str]:
    """`--k=v` and `--k v` into a dict (bare `--k` -> "true")."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = str(args[i])
        if a.startswith("--"):
            if "=" in a:
                k, v = a[2:].split("=", 1)
            elif i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
                k, v = a[2:], str(args[i + 1])
                i += 1
            else:
                k, v = a[2:], "true"
            out[k] = v
        i += 1
    return out


def shim_settings(c: dict) -> dict[str, str]:
    """A drainshim container's effective flags: defaults, then DRAINSHIM_*
    env (literal values), then command-line flags, as clap resolves them."""
    eff: dict[str, str] = {}
    for e in c.get("env") or []:
        if e.get("name", "").startswith("DRAINSHIM_") and "value" in e:
            eff[e["name"][len("DRAINSHIM_"):].lower().replace("_", "-")] = str(e["value"])
    eff.update(flags((c.get("args") or [])[1:]))
    return eff


def host_port(addr: str) -> tuple[str, int]:
    addr = re.sub(r"^[a-z]+://", "", addr).rstrip("/")
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def all_containers(spec: dict):
    """(container, is_init, is_native_sidecar)."""
    for c in spec.get("initContainers") or []:
        yield c, True, c.get("restartPolicy") == "Always"
    for c in spec.get("containers") or []:
        yield c, False, False


def mounts_at(c: dict, path: str) -> str | None:
    for m in c.get("volumeMounts") or []:
        if m.get("mountPath", "").rstrip("/") == path.rstrip("/"):
            return m.get("name")
    return None


def prestop_exec(c: dict) -> list[str] | None:
    cmd = (((c.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command")
    return [str(x) for x in cmd] if cmd else None


def prestop_http(c: dict) -> dict | None:
    return ((c.get("lifecycle") or {}).get("preStop") or {}).get("httpGet")


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_FIELD_REF = re.compile(r"metadata\.(annotations|labels)\['([^']+)'\]")


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """$(VAR) as the kubelet expands it in command, args and env values: a
    defined variable is substituted, an undefined reference stays as
    written, and $$ is a literal $."""
    return _VAR_REF.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def as_kubelet_runs(meta: dict, spec: dict) -> tuple[dict, list[str]]:
    """The pod spec as its processes see it: env read from the pod's own
    annotations and labels (downward API) and $(VAR) expanded in env values,
    command and args (the sidecar Component passes the app's port this way).
    Other valueFrom sources are kept as they are. Also returns what cannot
    be resolved: an annotation or label the pod does not have (the kubelet
    gives an empty string), a $(VAR) left unexpanded."""
    spec = copy.deepcopy(spec)
    missing: list[str] = []
    for c, _, _ in all_containers(spec):
        env: dict[str, str] = {}
        for e in c.get("env") or []:
            if "value" in e:
                e["value"] = kubelet_expand(str(e["value"]), env)
                env[e["name"]] = e["value"]
                continue
            m = _FIELD_REF.fullmatch(str(((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")))
            if m:
                got = (meta.get(m.group(1)) or {}).get(m.group(2))
                if got is None:
                    missing.append(f"{c.get('name')}: env {e.get('name')} reads {m.group(1)[:-1]} {m.group(2)!r}, which the pod does not have")
                env[e["name"]] = str(got or "")
        for key in ("command", "args"):
            if c.get(key):
                c[key] = [kubelet_expand(str(a), env) for a in c[key]]
                missing += [f"{c.get('name')}: {key} has $({v}), which no env entry of the container defines"
                            for a in c[key] for v in re.findall(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", a)]
    return spec, missing


# ------------------------------------------------------------- pod checks

def base_app_containers(base_docs: list[dict]) -> dict[str, dict]:
    """The containers of deploy/base's workloads, by name: the apps before
    drainshim."""
    return {c.get("name"): c for d in base_docs for _, _, spec in pod_specs(d)
            for c, _, _ in all_containers(spec)}


def app_port(base_apps: dict[str, dict]) -> int | None:
    """The app's own port, as deploy/base declares it."""
    ports = [pt.get("containerPort") for c in base_apps.values() for pt in c.get("ports") or []]
    return ports[0] if len(ports) == 1 else None


# The sidecar Component's input (deploy/components/sidecar): the port the
# pod's app serves on, a pod annotation read through the downward API.
APP_PORT_ANNOTATION = "drainshim.io/app-port"


def pod_app_port(ck: Checker, where: str, meta: dict, base_apps: dict[str, dict]) -> int | None:
    """The app's port for this pod: its drainshim.io/app-port annotation,
    which must name a port the app declares before drainshim; without the
    annotation, the one port the apps declare (deploy/base)."""
    ann = (meta.get("annotations") or {}).get(APP_PORT_ANNOTATION)
    if ann is None:
        return app_port(base_apps)
    declared = sorted({pt.get("containerPort") for c in base_apps.values() for pt in c.get("ports") or []})
    ck.check("wiring", str(ann).isdigit() and int(ann) in declared,
             f"{where}: {APP_PORT_ANNOTATION} {ann!r} is not a port the app declares ({declared}): the guard and Envoy's fallback would go nowhere")
    return int(ann) if str(ann).isdigit() else None


def check_app_unchanged(ck: Checker, where: str, spec: dict, s: dict[str, str] | None, base_apps: dict[str, dict],
                        port: int | None = None) -> None:
    """Adopting the guard (or node mode) changes no app: every container of
    deploy/base keeps its image, command and args; the guard, if any (`s`:
    the shim's flags), listens on GUARD_PORT and forwards to the app's own
    port."""
    if not ck.check("wiring", bool(base_apps), f"{where}: deploy/base rendered no app container to compare with"):
        return
    for c, _, _ in all_containers(spec):
        before = base_apps.get(c.get("name"))
        if before is None:
            continue
        for key in ("image", "command", "args"):
            ck.check("wiring", c.get(key) == before.get(key),
                     f"{where}: {c.get('name')}: {key} {c.get(key)!r} differs from deploy/base ({before.get(key)!r}): adopting the guard must change no app")
    if port is None:
        port = app_port(base_apps)
    if s is None:
        print(f"  {where}: app unchanged (port {port})")
        return
    gh, gp = host_port(s["guard-listen"])
    ck.check("wiring", gp == GUARD_PORT, f"{where}: --guard-listen port {gp}, want {GUARD_PORT} (the guard's own port; the app keeps its own)")
    if "guard-upstream" in s:
        uh, up = host_port(s["guard-upstream"])
        ck.check("wiring", up == port and is_loopback(uh),
                 f"{where}: --guard-upstream {s['guard-upstream']}, want 127.0.0.1:{port}, the app's own port")
    print(f"  {where}: app unchanged (port {port}); guard {s['guard-listen']} -> {s.get('guard-upstream')}")


def check_failopen_cluster(ck: Checker, where: str, boot: dict, guard_port: int, app_port_: int | None) -> None:
    """The INBOUND listener's route goes to a cluster whose priority 0 is the
    guard (health-checked) and whose priority 1 is the app, with a retry to
    the other priority, room for the retries, and bounded HTTP/2 windows."""
    sr = boot.get("static_resources") or {}
    routes = [
        r
        for li in sr.get("listeners") or [] if li.get("traffic_direction") == "INBOUND"
        for fc in li.get("filter_chains") or [] for f in fc.get("filters") or []
        for vh in (((f.get("typed_config") or {}).get("route_config") or {}).get("virtual_hosts") or [])
        for r in vh.get("routes") or []
    ]
    if not ck.check("envoy", bool(routes), f"{where}: no route on the INBOUND listener"):
        return
    clusters = {cl.get("name"): cl for cl in sr.get("clusters") or []}
    for r in routes:
        ra = r.get("route") or {}
        cl = clusters.get(ra.get("cluster"))
        if not ck.check("envoy", cl is not None, f"{where}: inbound route to unknown cluster {ra.get('cluster')!r}"):
            continue
        by_prio: dict[int, set[int]] = {}
        for grp in (cl.get("load_assignment") or {}).get("endpoints") or []:
            by_prio.setdefault(int(grp.get("priority", 0)), set()).update(
                ep["endpoint"]["address"]["socket_address"]["port_value"] for ep in grp.get("lb_endpoints") or [])
        ck.check("envoy", by_prio.get(0) == {guard_port},
                 f"{where}: cluster {cl.get('name')}: priority 0 goes to {sorted(by_prio.get(0, []))}, want the guard's port {guard_port}")
        ck.check("envoy", app_port_ is not None and by_prio.get(1) == {app_port_},
                 f"{where}: cluster {cl.get('name')}: priority 1 goes to {sorted(by_prio.get(1, []))}, want the app's own port {app_port_} (the fallback while the guard is down)")
        hc = cl.get("health_checks") or []
        ck.check("envoy", bool(hc) and all(h.get("no_traffic_interval") for h in hc),
                 f"{where}: cluster {cl.get('name')}: no active health check (with no_traffic_interval) of the guard: Envoy would not see it die or come back")
        rp = ra.get("retry_policy") or {}
        on = set(str(rp.get("retry_on", "")).split(","))
        ck.check("envoy", {"connect-failure", "refused-stream"} <= on
                 and (rp.get("retry_priority") or {}).get("name") == "envoy.retry_priorities.previous_priorities",
                 f"{where}: inbound route: want retry_on connect-failure,refused-stream and retry_priority previous_priorities (a call the dead guard failed is retried on the app); got {rp}")
        mr = [t.get("max_retries") for t in (cl.get("circuit_breakers") or {}).get("thresholds") or []]
        ck.check("envoy", bool(mr) and all((m or 3) >= 100 for m in mr),
                 f"{where}: cluster {cl.get('name')}: circuit_breakers max_retries {mr}: Envoy's default of 3 fails all but 3 of the calls in flight when the guard dies")
        h2 = ((((cl.get("typed_extension_protocol_options") or {})
                .get("envoy.extensions.upstreams.http.v3.HttpProtocolOptions") or {})
               .get("explicit_http_config") or {}).get("http2_protocol_options"))
        if h2 is not None:
            sw, cw = h2.get("initial_stream_window_size"), h2.get("initial_connection_window_size")
            ck.check("envoy", sw is not None and int(sw) <= MAX_STREAM_WINDOW and cw is not None and int(cw) <= MAX_CONNECTION_WINDOW,
                     f"{where}: cluster {cl.get('name')}: http2 windows stream {sw} / connection {cw}: bound them (<= {MAX_STREAM_WINDOW} / {MAX_CONNECTION_WINDOW}) so backpressure holds end to end")
        print(f"  {where}: cluster {cl.get('name')}: guard :{guard_port} (priority 0, health-checked) -> app :{app_port_} (priority 1), retry {rp.get('retry_on')}")


def check_istio_failopen(ck: Checker, overlay: str, docs: list[dict], base_apps: dict[str, dict],
                         port: int | None = None) -> None:
    """Under Istio: a Sidecar points the inbound cluster of the app's port at
    the guard, and an EnvoyFilter adds the app as priority 1 and the retry.
    `port`: the app's port, when not the one port of base_apps."""
    if port is None:
        port = app_port(base_apps)
    shims = [shim_settings(c) for d in docs for _, _, spec in pod_specs(d)
             for c, _, _ in all_containers(spec) if is_drainshim(c, "sidecar")]
    guards = {s["guard-listen"] for s in shims if "guard-listen" in s}
    sidecars = [d for d in docs if d.get("kind") == "Sidecar"]
    filters = [d for d in docs if d.get("kind") == "EnvoyFilter"]
    if not ck.check("wiring", bool(sidecars) and bool(filters),
                    f"{overlay}: want a Sidecar (ingress defaultEndpoint -> the guard) and an EnvoyFilter (the app as fallback)"):
        return
    eps = {(i.get("port") or {}).get("number"): i.get("defaultEndpoint") for sc in sidecars for i in (sc.get("spec") or {}).get("ingress") or []}
    protocols = {(i.get("port") or {}).get("number"): (i.get("port") or {}).get("protocol") for sc in sidecars for i in (sc.get("spec") or {}).get("ingress") or []}
    ck.check("wiring", protocols.get(port) in ("GRPC", "HTTP", "HTTP2"),
             f"{overlay}: Sidecar ingress for port {port} has protocol {protocols.get(port)!r}, want GRPC, HTTP2 or HTTP (the guard relays HTTP)")
    ck.check("wiring", eps.get(port) in guards,
             f"{overlay}: Sidecar ingress for port {port} has defaultEndpoint {eps.get(port)!r}, want the guard's --guard-listen {sorted(guards)}")
    prio1, retry = set(), {}
    for f in filters:
        for cp in (f.get("spec") or {}).get("configPatches") or []:
            m, v = cp.get("match") or {}, ((cp.get("patch") or {}).get("value") or {})
            if m.get("context") != "SIDECAR_INBOUND":
                continue
            if cp.get("applyTo") == "CLUSTER" and (m.get("cluster") or {}).get("portNumber") == port:
                ck.check("wiring", bool(v.get("health_checks")), f"{overlay}: the EnvoyFilter's cluster patch has no health check of the guard")
                for grp in (v.get("load_assignment") or {}).get("endpoints") or []:
                    if int(grp.get("priority", 0)) == 1:
                        prio1.update(ep["endpoint"]["address"]["socket_address"]["port_value"] for ep in grp.get("lb_endpoints") or [])
            if cp.get("applyTo") == "HTTP_ROUTE" and (m.get("routeConfiguration") or {}).get("portNumber") == port:
                retry = (v.get("route") or {}).get("retry_policy") or {}
    ck.check("wiring", prio1 == {port}, f"{overlay}: the EnvoyFilter adds priority 1 endpoints {sorted(prio1)}, want the app's port {port}")
    ck.check("wiring", (retry.get("retry_priority") or {}).get("name") == "envoy.retry_priorities.previous_priorities"
             and "connect-failure" in str(retry.get("retry_on")),
             f"{overlay}: the EnvoyFilter's inbound route has no retry to the other priority on connect-failure")
    print(f"  {overlay}: Istio inbound :{port} -> guard {eps.get(port)} (Sidecar), app :{port} as priority 1 + retry (EnvoyFilter)")


def binary_check(ck: Checker, area: str, where: str, sub: str, c: dict,
                 grace: float | None = None) -> dict | None:
    """Runs `drainshim <sub> --check` with the container's args and literal
    DRAINSHIM_* env (and `--termination-grace-period` from the pod spec when
    the manifest does not pass it): the binary validates exactly as it will
    at start-up. Returns its effective settings, or None after a failure."""
    args = [str(a) for a in (c.get("args") or [])[1:]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAINSHIM_")}
    for e in c.get("env") or []:
        if e.get("name", "").startswith("DRAINSHIM_") and "value" in e:
            env[e["name"]] = str(e["value"])
    if grace is not None and "termination-grace-period" not in flags(args) \
            and "DRAINSHIM_TERMINATION_GRACE_PERIOD" not in env:
        args += ["--termination-grace-period", f"{grace:g}s"]
    cmd = [str(DRAINSHIM_BIN), sub, *args, "--check"]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise SystemExit(f"check_deploy: cannot run {DRAINSHIM_BIN} ({e}): build it first (cargo build)")
    if r.returncode != 0:
        ck.fail(area, f"{where}: `drainshim {sub} ... --check` exits {r.returncode} (the container would not start): {r.stderr.strip()}")
        return None
    ck.ok(area)
    return json.loads(r.stdout)


def budget_seconds(eff: dict) -> dict[str, float]:
    """The timers of `--check`'s effective settings, in seconds."""
    b = eff["budget"]
    t = {k.replace("_", "-"): duration(b[k]) for k in
         ("drain_time", "parent_shutdown_time", "min_drain_time", "deregistration_delay")}
    if b.get("termination_grace_period"):
        t["termination-grace-period"] = duration(b["termination_grace_period"])
    return t


def check_pod(ck: Checker, overlay: str, name: str, meta: dict, spec: dict,
              configmaps: dict[str, dict], envoy_cache: Path, base_apps: dict[str, dict],
              listen_ports: dict[str, int] | None = None) -> bool:
    """All per-pod checks; returns whether the pod has a drainshim sidecar.
    Records the shim's --listen port in listen_ports (what must be scraped)."""
    where = f"{overlay}: {name}"
    shims = [(c, init, side) for c, init, side in all_containers(spec) if is_drainshim(c, "sidecar")]
    if not shims:
        return False
    spec, unresolved = as_kubelet_runs(meta, spec)
    for u in unresolved:
        ck.fail("wiring", f"{where}: {u}")
    shims = [(c, init, side) for c, init, side in all_containers(spec) if is_drainshim(c, "sidecar")]
    app = pod_app_port(ck, where, meta, base_apps)
    ck.check("wiring", len(shims) == 1, f"{where}: {len(shims)} drainshim sidecar containers, want 1")
    shim, shim_init, shim_native = shims[0]
    ck.check("wiring", not shim_init or shim_native,
             f"{where}: drainshim is a plain init container; it must be a container or a native sidecar (restartPolicy: Always)")
    s = shim_settings(shim)

    # --- budget (the binary's own rules, with the pod's grace period) --------
    grace = float(spec.get("terminationGracePeriodSeconds", KUBE_GRACE_DEFAULT))
    eff = binary_check(ck, "budget", where, "sidecar", shim, grace)
    if eff is None:
        return True
    t = budget_seconds(eff)
    d, p = t["drain-time"], t["parent-shutdown-time"]
    if "termination-grace-period" in s:
        ck.check("budget", duration(s["termination-grace-period"]) == grace,
                 f"{where}: --termination-grace-period {s['termination-grace-period']} differs from terminationGracePeriodSeconds {grace:g}: the shim would check its budget against the wrong number")
    s.setdefault("listen", eff["listen"])
    s.setdefault("envoy-admin", eff["envoy_admin"])
    print(f"  {where}: drain {d:g}s < parent-shutdown {p:g}s < grace {grace:g}s")

    # --- install + hooks --------------------------------------------------
    installs = [(c, init, side) for c, init, side in all_containers(spec) if is_drainshim(c, "install")]
    bin_dir, bin_volume = None, None
    if installs:
        inst, init, side = installs[0]
        bin_dir = flags(inst.get("args")[1:]).get("to")
        ck.check("wiring", init and not side, f"{where}: `drainshim install` must run as a plain init container (to completion, before the others)")
        bin_volume = mounts_at(inst, bin_dir or "")
        ck.check("wiring", bin_volume is not None, f"{where}: install --to {bin_dir}: no volume mounted there")
        vol = next((v for v in spec.get("volumes") or [] if v.get("name") == bin_volume), {})
        ck.check("wiring", "emptyDir" in vol, f"{where}: the volume {bin_volume!r} for the copied binary must be an emptyDir")

    listen_host, listen_port = host_port(s["listen"])
    if listen_ports is not None:
        listen_ports[where] = listen_port
    allow = s.get("allow-drain-from")
    hooked_proxy = False
    for c, init, side in all_containers(spec):
        cname = c.get("name")
        cmd = prestop_exec(c)
        http = prestop_http(c)
        if cmd and cmd[0].endswith("/drainshim"):
            ck.check("wiring", cmd[1:2] == ["prestop"], f"{where}: {cname}: preStop runs {cmd}, want `drainshim prestop`")
            ck.check("wiring", bin_dir is not None and cmd[0] == f"{bin_dir.rstrip('/')}/drainshim",
                     f"{where}: {cname}: preStop execs {cmd[0]}, but the install init container copies to {bin_dir}/drainshim")
            ck.check("wiring", bin_dir is not None and mounts_at(c, bin_dir) == bin_volume,
                     f"{where}: {cname}: preStop execs {cmd[0]} but the container does not mount volume {bin_volume!r} at {bin_dir}")
            pf = flags(cmd[2:])
            timeout = duration(pf["timeout"]) if "timeout" in pf else PRESTOP_TIMEOUT_DEFAULT
            ck.check("budget", timeout > p,
                     f"{where}: {cname}: prestop --timeout {timeout:g}s must exceed --parent-shutdown-time {p:g}s, or the hook gives up before the deadline")
        elif http and str(http.get("path", "")).startswith("/drain"):
            # The kubelet sends a preStop httpGet from the node to the pod IP.
            ck.check("wiring", "wait=true" in str(http.get("path")),
                     f"{where}: {cname}: preStop httpGet {http.get('path')} does not wait (add ?wait=true)")
            ck.check("wiring", not is_loopback(listen_host) and allow is not None,
                     f"{where}: {cname}: preStop httpGet reaches the pod IP from the node, but the shim listens on {listen_host} and has no --allow-drain-from: the drain would be refused or unreachable")
            ck.check("wiring", not http.get("host"),
                     f"{where}: {cname}: preStop httpGet with host: set would be sent to that host from the node, not to this pod")
        if cname in ("envoy", "istio-proxy"):
            hooked_proxy = bool((cmd and cmd[0].endswith("/drainshim")) or (http and str(http.get("path", "")).startswith("/drain")))
            ck.check("wiring", hooked_proxy,
                     f"{where}: {cname}: no preStop hook starting the drain: the proxy would get SIGTERM at t=0 and exit in 0.1 s")
        elif not init and c is not shim:
            # An app container behind the guard must outlive the drain.
            ck.check("wiring", bool(cmd and cmd[0].endswith("/drainshim")) or bool(http),
                     f"{where}: {cname}: no preStop hook holding it up; it gets SIGTERM at t=0 while the guard still forwards streams to it")
    ck.check("wiring", hooked_proxy, f"{where}: no envoy or istio-proxy container with a drain hook")

    # Probes and scrapes come from outside the pod.
    rp = (shim.get("readinessProbe") or {}).get("httpGet") or {}
    ck.check("wiring", rp.get("path") == "/readyz", f"{where}: drainshim readinessProbe must be httpGet /readyz")
    ports = {pt.get("name"): pt.get("containerPort") for pt in shim.get("ports") or []}
    probe_port = ports.get(rp.get("port"), rp.get("port"))
    ck.check("wiring", probe_port == listen_port, f"{where}: readiness probe port {rp.get('port')} is not --listen port {listen_port}")
    ck.check("wiring", not is_loopback(listen_host),
             f"{where}: --listen {listen_host}:{listen_port} is loopback: the kubelet's probe and Prometheus cannot reach it")
    ck.check("wiring", ports.get("drainshim-http") == listen_port,
             f"{where}: drainshim must declare containerPort {listen_port} named drainshim-http (the PodMonitor scrapes that name)")
    env_names = {e.get("name"): e for e in shim.get("env") or []}
    for var, field in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")):
        got = ((env_names.get(var) or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        ck.check("wiring", got == field, f"{where}: drainshim env {var} must come from the downward API ({field})")
    sc = shim.get("securityContext") or {}
    ck.check("wiring", sc.get("readOnlyRootFilesystem") is True and sc.get("runAsNonRoot") is True
             and sc.get("allowPrivilegeEscalation") is False
             and (sc.get("capabilities") or {}).get("drop") == ["ALL"]
             and ((sc.get("seccompProfile") or (spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type") == "RuntimeDefault"),
             f"{where}: drainshim securityContext must be read-only root, non-root, no privilege escalation, drop ALL, seccomp RuntimeDefault")
    ck.check("wiring", bool((shim.get("resources") or {}).get("requests")), f"{where}: drainshim has no resource requests")

    guard = s.get("guard-listen")
    if guard is not None:
        ck.check("wiring", "guard-upstream" in s, f"{where}: --guard-listen without --guard-upstream")
        check_app_unchanged(ck, where, spec, s, base_apps, app)

    # --- Envoy (plain) ------------------------------------------------------
    for c, init, side in all_containers(spec):
        if "envoyproxy/envoy" in c.get("image", ""):
            check_envoy(ck, where, c, spec, s, d, guard, configmaps, envoy_cache, app)

    # --- Istio --------------------------------------------------------------
    ann = meta.get("annotations") or {}
    istio_proxy = any(c.get("name") == "istio-proxy" for c, _, _ in all_containers(spec))
    if istio_proxy or "proxy.istio.io/config" in ann:
        pc = yaml.safe_load(ann.get("proxy.istio.io/config", "")) or {}
        ck.check("budget", "drainDuration" in pc and duration(pc["drainDuration"]) == d,
                 f"{where}: proxy.istio.io/config drainDuration ({pc.get('drainDuration')}) must equal drainshim --drain-time ({d:g}s): it is Envoy's --drain-time-s")
        tdd = duration(pc["terminationDrainDuration"]) if "terminationDrainDuration" in pc else ISTIO_TERMINATION_DRAIN_DEFAULT
        ck.check("budget", p + tdd < grace,
                 f"{where}: --parent-shutdown-time {p:g}s + terminationDrainDuration {tdd:g}s must be < grace {grace:g}s: pilot-agent waits that long after the hook returns")
        # The guard's address is the Sidecar's defaultEndpoint (check_istio_failopen).
        excluded = [x.strip() for x in str(ann.get("traffic.sidecar.istio.io/excludeInboundPorts", "")).split(",")]
        ck.check("wiring", str(listen_port) in excluded,
                 f"{where}: port {listen_port} is not in traffic.sidecar.istio.io/excludeInboundPorts: scrapes and probes would go through the proxy being drained")
        print(f"  {where}: istio drainDuration {pc.get('drainDuration')}, terminationDrainDuration {tdd:g}s")
    return True


def envoy_args(c: dict) -> dict[str, str]:
    """Envoy's `-x value` / `--xx value` arguments (Envoy takes no `=` form)."""
    args = [str(a) for a in c.get("args") or []]
    ef = {}
    for i, a in enumerate(args):
        if a.startswith("-") and i + 1 < len(args) and not args[i + 1].startswith("-"):
            ef[a] = args[i + 1]
    return ef


def envoy_bootstrap(c: dict, spec: dict, configmaps: dict[str, dict]) -> tuple[str | None, str | None]:
    """(the -c path, the bootstrap text from the ConfigMap mounted there); or,
    with no -c, ("--config-yaml", the inline bootstrap)."""
    ef = envoy_args(c)
    cpath = ef.get("-c") or ef.get("--config-path")
    if cpath is None:
        if "--config-yaml" in ef:
            return "--config-yaml", ef["--config-yaml"]
        return None, None
    text = None
    for m in c.get("volumeMounts") or []:
        mp = m["mountPath"].rstrip("/")
        if cpath.startswith(mp + "/"):
            vol = next((v for v in spec.get("volumes") or [] if v.get("name") == m["name"]), {})
            cm = configmaps.get((vol.get("configMap") or {}).get("name", ""))
            if cm is not None:
                text = (cm.get("data") or {}).get(cpath[len(mp) + 1:])
    return cpath, text


def check_envoy(ck: Checker, where: str, c: dict, spec: dict, s: dict, drain: float,
                guard: str | None, configmaps: dict[str, dict], envoy_cache: Path, app: int | None) -> None:
    args = [str(a) for a in c.get("args") or []]
    ef = envoy_args(c)
    ck.check("budget", "--drain-time-s" in ef and float(ef["--drain-time-s"]) == drain,
             f"{where}: envoy --drain-time-s ({ef.get('--drain-time-s')}) must equal drainshim --drain-time ({drain:g}s)")
    ck.check("budget", ef.get("--drain-strategy") == "immediate",
             f"{where}: envoy --drain-strategy must be immediate (the guard spreads stream endings itself)")

    # The bootstrap: which mounted ConfigMap holds the -c path?
    cpath, text = envoy_bootstrap(c, spec, configmaps)
    if not ck.check("envoy", cpath is not None, f"{where}: envoy has no -c bootstrap"):
        return
    if not ck.check("envoy", text is not None, f"{where}: bootstrap {cpath} is not in a rendered ConfigMap"):
        return
    boot = yaml.safe_load(text)
    admin = boot.get("admin", {}).get("address", {}).get("socket_address", {})
    want_host, want_port = host_port(s["envoy-admin"])
    ck.check("envoy", (admin.get("address"), admin.get("port_value")) == (want_host, want_port),
             f"{where}: Envoy admin {admin.get('address')}:{admin.get('port_value')} is not drainshim's --envoy-admin {want_host}:{want_port}")
    listeners = boot.get("static_resources", {}).get("listeners", [])
    ck.check("envoy", any(li.get("traffic_direction") == "INBOUND" for li in listeners),
             f"{where}: no listener has traffic_direction: INBOUND; drainshim counts only inbound streams")
    # Fail open, with or without a guard in this pod (node mode: none yet,
    # so priority 0 stays unhealthy and the app serves).
    check_failopen_cluster(ck, where, boot, host_port(guard)[1] if guard is not None else GUARD_PORT, app)
    if guard is not None:
        gport = host_port(guard)[1]
        eps = {
            ep["endpoint"]["address"]["socket_address"]["port_value"]
            for cl in boot.get("static_resources", {}).get("clusters", [])
            for grp in (cl.get("load_assignment") or {}).get("endpoints", [])
            for ep in grp.get("lb_endpoints", [])
        }
        ck.check("envoy", gport in eps, f"{where}: no Envoy cluster sends to the guard's port {gport} (clusters go to {sorted(eps)})")
        lports = {li.get("address", {}).get("socket_address", {}).get("port_value") for li in listeners}
        ck.check("envoy", gport not in lports, f"{where}: the guard's port {gport} is also an Envoy listener port")

    # Validate with the real Envoy of the image's version.
    m = re.search(r"v?(\d+\.\d+\.\d+)$", c.get("image", ""))
    if not ck.check("envoy", m is not None, f"{where}: cannot read the Envoy version from image {c.get('image')}"):
        return
    version = m.group(1)
    binary = envoy_cache / version / "envoy" / "_bin" / "envoy"
    if not ck.check("envoy", binary.is_file(), f"{where}: no Envoy {version} at {binary} (scripts/fetch-envoy.sh)"):
        return
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "bootstrap.yaml"
        cfg.write_text(text)
        vargs = list(args) if cpath == "--config-yaml" else [a if a != cpath else str(cfg) for a in args]
        r = subprocess.run([str(binary), "--mode", "validate", *vargs, "-l", "error"],
                           capture_output=True, text=True, timeout=120)
    ck.check("envoy", r.returncode == 0,
             f"{where}: envoy {version} --mode validate failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    shown = [a if a != text else "<the bootstrap>" for a in vargs] if cpath == "--config-yaml" else vargs[2:]
    print(f"  {where}: envoy {version} --mode validate {' '.join(shown)}: {'OK' if r.returncode == 0 else 'FAILED'}")


def check_services(ck: Checker, overlay: str, docs: list[dict]) -> None:
    pods = [(meta, spec) for d in docs for _, meta, spec in pod_specs(d)]
    for svc in (d for d in docs if d.get("kind") == "Service"):
        sel = (svc.get("spec") or {}).get("selector") or {}
        matching = [(m, sp) for m, sp in pods if sel and all((m.get("labels") or {}).get(k) == v for k, v in sel.items())]
        if not matching:
            continue
        for port in svc["spec"].get("ports", []):
            tp = port.get("targetPort")
            if isinstance(tp, str):
                names = [pt.get("name") for _, sp in matching
                         for c, init, side in all_containers(sp) if not init or side
                         for pt in c.get("ports") or []]
                ck.check("wiring", names.count(tp) == 1,
                         f"{overlay}: Service/{svc['metadata']['name']} targetPort {tp!r} matches {names.count(tp)} container ports, want exactly 1")


def check_services_reach_proxy(ck: Checker, overlay: str, docs: list[dict]) -> None:
    """A Service in front of pods with a plain Envoy must send to Envoy: a
    targetPort on the app's own port would bypass Envoy, the guard and so
    the drain (the app keeps its port when adopting the guard, so this
    mistake still works until the first restart). Under Istio, iptables
    sends the app's port to istio-proxy, so it is not checked there."""
    pods = [(meta, spec) for d in docs for _, meta, spec in pod_specs(d)]
    for svc in (d for d in docs if d.get("kind") == "Service"):
        sel = (svc.get("spec") or {}).get("selector") or {}
        for meta, spec in pods:
            if not sel or not all((meta.get("labels") or {}).get(k) == v for k, v in sel.items()):
                continue
            proxies = [c for c, init, side in all_containers(spec) if (not init or side) and "envoyproxy/envoy" in c.get("image", "")]
            if not proxies:
                continue
            theirs = {x for c in proxies for pt in c.get("ports") or [] for x in (pt.get("name"), pt.get("containerPort"))}
            for port in svc["spec"].get("ports", []):
                tp = port.get("targetPort", port.get("port"))
                ck.check("wiring", tp in theirs,
                         f"{overlay}: Service/{svc['metadata']['name']} targetPort {tp!r} is not a port of Envoy ({sorted(map(str, theirs - {None}))}): "
                         "callers would bypass Envoy and the guard, and nothing drains their streams")


# -------------------------------------------------------------- node mode

@dataclass
class Agent:
    """A `drainshim node` DaemonSet, as the node-mode workloads depend on it."""
    where: str
    namespace: str
    labels: dict
    timers: dict[str, float]
    settings: dict[str, str]
    listen_port: int
    pod_listen_port: int
    pod_admin_port: int
    # What the docs may say of it (check_docs): its rolling update and the
    # host paths it mounts.
    rolling_update: dict
    host_paths: list[str]


def cap_names(caps) -> list[str]:
    """`CAP_SYS_ADMIN` and `sys_admin` are the same capability as `SYS_ADMIN`."""
    return [re.sub(r"^CAP_", "", str(x).upper()) for x in caps or []]


def check_agent(ck: Checker, overlay: str, doc: dict, docs: list[dict]) -> Agent | None:
    """The node agent's DaemonSet: privileges (exactly what `drainshim node
    --help` lists), budget, probe and metrics port, namespace admission."""
    if doc.get("kind") != "DaemonSet":
        return None
    spec = doc["spec"]["template"]["spec"]
    agents = [c for c, _, _ in all_containers(spec) if is_drainshim(c, "node")]
    if not agents:
        return None
    meta = doc.get("metadata") or {}
    where = f"{overlay}: DaemonSet/{meta.get('name')}"
    ck.check("node", len(agents) == 1 and len(spec.get("containers") or []) == 1 and not spec.get("initContainers"),
             f"{where}: want exactly one container, `drainshim node`, and nothing else in a pod this privileged")
    c = agents[0]
    s = shim_settings(c)

    # --- privileges: exactly these, and nothing more --------------------------
    ck.check("node", spec.get("hostPID") is True, f"{where}: hostPID must be true: the agent finds pods' Envoys in the host's /proc")
    ck.check("node", spec.get("hostNetwork") is True,
             f"{where}: hostNetwork must be true: pod listeners accept drains from the node's own addresses, which the agent learns from its namespace")
    ck.check("node", spec.get("dnsPolicy") == "ClusterFirstWithHostNet",
             f"{where}: dnsPolicy must be ClusterFirstWithHostNet with hostNetwork (else the node's resolv.conf)")
    ck.check("node", spec.get("hostIPC") is not True, f"{where}: hostIPC is not needed")
    ck.check("node", spec.get("hostUsers") is not False,
             f"{where}: hostUsers: false puts the agent in its own user namespace, where CAP_SYS_ADMIN cannot setns into pods' namespaces")
    # One hostPath at most: the directory of --handover-socket, shared by the
    # old and the new agent during a rolling update, and nothing else.
    handover = s.get("handover-socket")
    handover_dir = handover.rsplit("/", 1)[0] if handover else None
    mounts = {m.get("name"): m.get("mountPath") for m in c.get("volumeMounts") or []}
    hostpaths = [v for v in spec.get("volumes") or [] if "hostPath" in v]
    for v in hostpaths:
        hp = v["hostPath"]
        ck.check("node", handover_dir is not None and mounts.get(v.get("name")) == handover_dir
                 and hp.get("path") == handover_dir and hp.get("type") == "DirectoryOrCreate",
                 f"{where}: hostPath volume {v.get('name')}: the only one the agent needs is the directory of --handover-socket "
                 f"({handover_dir}), at the same path on the host, type DirectoryOrCreate (hostPID gives it /proc)")
    if handover_dir:
        ck.check("node", any(mounts.get(v.get("name")) == handover_dir for v in hostpaths),
                 f"{where}: --handover-socket {handover} is not on a hostPath: the next agent on the node could not reach it")
    sc = c.get("securityContext") or {}
    psc = spec.get("securityContext") or {}
    caps = sc.get("capabilities") or {}
    ck.check("node", cap_names(caps.get("drop")) == ["ALL"], f"{where}: capabilities.drop must be [ALL], got {caps.get('drop')}")
    added = cap_names(caps.get("add"))
    ck.check("node", sorted(added) == sorted(AGENT_CAPABILITIES),
             f"{where}: capabilities.add must be exactly {sorted(AGENT_CAPABILITIES)}, got {caps.get('add')}")
    ck.check("node", sc.get("privileged") is not True, f"{where}: privileged: true is not needed (SYS_ADMIN and SYS_PTRACE are)")
    ck.check("node", not (sc.get("allowPrivilegeEscalation") is False and "SYS_ADMIN" in added),
             f"{where}: allowPrivilegeEscalation: false beside SYS_ADMIN protects nothing, and the API rejects it when spelled CAP_SYS_ADMIN")
    ck.check("node", sc.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem must be true (the agent writes nothing)")
    seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
    ck.check("node", seccomp == "RuntimeDefault", f"{where}: seccompProfile must be RuntimeDefault, got {seccomp}")
    uid = sc.get("runAsUser", psc.get("runAsUser"))
    ck.check("node", uid == 0,
             f"{where}: runAsUser is {uid}, must be 0: added capabilities are effective only for root (the image's USER is 65532)")
    nonroot = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
    ck.check("node", nonroot is not True, f"{where}: runAsNonRoot: true with runAsUser 0: the kubelet would refuse to start it")

    # --- placement and lifecycle --------------------------------------------
    tol = spec.get("tolerations") or []
    ck.check("node", any(t.get("operator") == "Exists" and not t.get("key") and not t.get("effect") for t in tol),
             f"{where}: needs a toleration `operator: Exists` (no key, no effect): every node that can run a meshed pod needs the agent")
    ck.check("node", spec.get("priorityClassName") == "system-node-critical",
             f"{where}: priorityClassName should be system-node-critical: an evicted agent turns preStops into plain SIGTERMs")
    ru = ((doc["spec"].get("updateStrategy") or {}).get("rollingUpdate") or {})
    if handover_dir:
        # With the hand-over the new agent takes the node's port (and every
        # pod's listeners) from the old one: they must overlap.
        ck.check("node", str(ru.get("maxSurge")) == "1" and str(ru.get("maxUnavailable")) in ("0", "0%"),
                 f"{where}: with --handover-socket, updateStrategy must be maxSurge 1, maxUnavailable 0 (got {ru}): "
                 "the new agent takes the listeners from the old one, so they must overlap")
    else:
        ck.check("node", str(ru.get("maxSurge", 0)) in ("0", "0%"),
                 f"{where}: updateStrategy maxSurge {ru.get('maxSurge')}: without --handover-socket a second agent on a node cannot bind the node's port, and the rollout would hang")
    res = c.get("resources") or {}
    ck.check("node", bool(res.get("requests")) and "memory" in (res.get("limits") or {}),
             f"{where}: needs resource requests and a memory limit")
    sa = spec.get("serviceAccountName")
    sas = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ServiceAccount"}
    ck.check("node", sa in sas, f"{where}: serviceAccountName {sa!r} is not rendered with it")
    ck.check("node", spec.get("automountServiceAccountToken") is False or (sas.get(sa) or {}).get("automountServiceAccountToken") is False,
             f"{where}: the agent never calls the Kubernetes API: do not mount a token")

    # The namespace must admit hostPID, hostNetwork and SYS_ADMIN.
    ns = meta.get("namespace")
    nsdoc = next((d for d in docs if d.get("kind") == "Namespace" and d["metadata"].get("name") == ns), None)
    if ck.check("node", nsdoc is not None, f"{where}: its namespace {ns!r} is not rendered with it (it needs Pod Security labels)"):
        level = ((nsdoc["metadata"].get("labels") or {}).get("pod-security.kubernetes.io/enforce"))
        ck.check("node", level == "privileged",
                 f"{where}: namespace {ns} enforces Pod Security {level!r}: baseline and restricted reject hostPID, hostNetwork and SYS_ADMIN, and the DaemonSet would create no pod")

    # --- probe and metrics port ----------------------------------------------
    eff = binary_check(ck, "budget", where, "node", c)
    if eff is None:
        return None
    listen_host, listen_port = host_port(eff["listen"])
    ports = {pt.get("name"): pt for pt in c.get("ports") or []}
    rp = (c.get("readinessProbe") or {}).get("httpGet") or {}
    # A number: the agent declares no port (check_rollout), so a port name
    # would name nothing and the probe fail.
    probe_port = (ports.get(rp.get("port")) or {}).get("containerPort", rp.get("port"))
    ck.check("node", rp.get("path") == "/readyz" and probe_port == listen_port,
             f"{where}: readinessProbe must be httpGet /readyz on --listen port {listen_port} (a number), got {rp.get('path')} on {rp.get('port')!r}")
    ck.check("node", not is_loopback(listen_host), f"{where}: --listen {listen_host} is loopback: the probe and Prometheus cannot reach it")
    # What scrapes --listen is checked with the PodMonitors (check_scrapes).
    for n, pt in ports.items():
        ck.check("node", pt.get("hostPort") in (None, pt.get("containerPort")),
                 f"{where}: port {n}: with hostNetwork, hostPort must equal containerPort")

    # --- budget (the binary checked its own rules above) ---------------------
    t = budget_seconds(eff)
    d, p = t["drain-time"], t["parent-shutdown-time"]
    own_grace = float(spec.get("terminationGracePeriodSeconds", KUBE_GRACE_DEFAULT))
    ck.check("budget", p < own_grace,
             f"{where}: the agent's terminationGracePeriodSeconds {own_grace:g}s must exceed --parent-shutdown-time {p:g}s: on SIGTERM it waits for drains in progress")
    pod_listen = int(eff["pod_listen_port"])
    pod_admin = int(eff["pod_admin_port"])
    print(f"  {where}: drain {d:g}s < parent-shutdown {p:g}s < grace {own_grace:g}s; "
          f"caps {sorted(added)}; pod listener :{pod_listen}; metrics :{listen_port} (declared ports: {sorted(ports) or 'none'})")
    return Agent(where=where, namespace=ns or "", labels=(doc["spec"]["template"].get("metadata") or {}).get("labels") or {},
                 timers=t, settings=s, listen_port=listen_port, pod_listen_port=pod_listen, pod_admin_port=pod_admin,
                 rolling_update=ru, host_paths=[v["hostPath"].get("path") for v in hostpaths])


def is_node_prestop(http: dict | None) -> bool:
    return bool(http) and urllib.parse.urlsplit(str(http.get("path", ""))).path == "/drain"


def check_node_workload(ck: Checker, overlay: str, name: str, meta: dict, spec: dict, agents: list[Agent],
                        configmaps: dict[str, dict], envoy_cache: Path, base_apps: dict[str, dict]) -> bool:
    """A pod whose preStop is an httpGet to the node agent's listener (and
    which has no drainshim sidecar, whose own checks are in check_pod).
    Returns whether the pod is one."""
    where = f"{overlay}: {name}"
    containers = list(all_containers(spec))
    if any(is_drainshim(c, "sidecar") for c, _, _ in containers):
        return False
    hooked = [(c, init, side) for c, init, side in containers if is_node_prestop(prestop_http(c))]
    if not hooked:
        return False
    if not ck.check("wiring", bool(agents), f"{where}: preStop httpGet /drain but no `drainshim node` DaemonSet is rendered anywhere in deploy/"):
        return True

    # No binary, no shell, no extra container: node mode's whole point.
    ck.check("wiring", not any(is_drainshim(c, "install") for c, _, _ in containers)
             and not any((prestop_exec(c) or [""])[0].endswith("/drainshim") for c, _, _ in containers),
             f"{where}: node mode needs no drainshim binary in the pod (no install init container, no exec hook)")

    proxies = [(c, init, side) for c, init, side in containers if c.get("name") in ("envoy", "istio-proxy")]
    if not ck.check("wiring", len(proxies) == 1, f"{where}: want exactly one envoy or istio-proxy container, found {len(proxies)}"):
        return True
    proxy = proxies[0][0]
    pname = proxy.get("name")
    ck.check("wiring", is_node_prestop(prestop_http(proxy)),
             f"{where}: {pname}: no preStop httpGet /drain: the proxy would get SIGTERM at t=0 and exit in 0.1 s")
    ck.check("wiring", pname == "istio-proxy" or bool(proxy.get("image")),
             f"{where}: {pname}: no image: the patch created a container instead of patching the workload's Envoy (is it named `envoy`?)")
    declared = {pt.get("containerPort") for c, _, _ in containers for pt in c.get("ports") or []}
    grace = float(spec.get("terminationGracePeriodSeconds", KUBE_GRACE_DEFAULT))

    for agent in agents:
        ck.check("wiring", agent.pod_listen_port not in declared,
                 f"{where}: a container declares port {agent.pod_listen_port}, where {agent.where} plants its listener: the agent could not bind it")
        for c, init, side in hooked:
            http = prestop_http(c) or {}
            url = urllib.parse.urlsplit(str(http.get("path", "")))
            port = http.get("port")
            ck.check("wiring", port == agent.pod_listen_port,
                     f"{where}: {c.get('name')}: preStop httpGet port {port!r} is not {agent.where}'s --pod-listen-port {agent.pod_listen_port} (a number: no container owns that port)")
            ck.check("wiring", urllib.parse.parse_qs(url.query).get("wait") == ["true"],
                     f"{where}: {c.get('name')}: preStop httpGet {http.get('path')} does not wait (add ?wait=true): the hook would return at once and Envoy get SIGTERM mid-drain")
            ck.check("wiring", not http.get("host"),
                     f"{where}: {c.get('name')}: preStop httpGet with host: set goes to that host, not to this pod's listener")
            ck.check("wiring", http.get("scheme", "HTTP") == "HTTP", f"{where}: {c.get('name')}: the pod listener speaks plain HTTP")
        # The grace period must hold the agent's whole drain.
        p = agent.timers["parent-shutdown-time"]
        ck.check("budget", p < grace,
                 f"{where}: terminationGracePeriodSeconds {grace:g}s must exceed {agent.where}'s --parent-shutdown-time {p:g}s (the kubelet would SIGKILL mid-drain)")
        if "termination-grace-period" in agent.timers:
            tg = agent.timers["termination-grace-period"]
            ck.check("budget", grace >= tg,
                     f"{where}: terminationGracePeriodSeconds {grace:g}s is below {agent.where}'s --termination-grace-period {tg:g}s, the budget the agent was checked against")
        print(f"  {where}: node mode: drain {agent.timers['drain-time']:g}s < parent-shutdown {p:g}s < grace {grace:g}s "
              f"({agent.where}); preStop httpGet :{agent.pod_listen_port} on {', '.join(c.get('name') for c, _, _ in hooked)}")

    # Containers Envoy forwards to must outlive the drain.
    for c, init, side in containers:
        if init or c is proxy:
            continue
        ck.check("wiring", bool(prestop_http(c) or prestop_exec(c) or ((c.get("lifecycle") or {}).get("preStop") or {}).get("sleep")),
                 f"{where}: {c.get('name')}: no preStop hook holding it up; it gets SIGTERM at t=0 while Envoy still drains streams to it")

    ann = meta.get("annotations") or {}
    if pname == "istio-proxy" or "proxy.istio.io/config" in ann:
        excluded = [x.strip() for x in str(ann.get("traffic.sidecar.istio.io/excludeInboundPorts", "")).split(",")]
        for agent in agents:
            ck.check("wiring", str(agent.pod_listen_port) in excluded,
                     f"{where}: port {agent.pod_listen_port} is not in traffic.sidecar.istio.io/excludeInboundPorts: Istio would redirect the kubelet's preStop to Envoy")
        return True

    check_app_unchanged(ck, where, spec, None, base_apps)

    # Plain Envoy: its identity, its guard and its bootstrap.
    check_envoy_identity(ck, where, proxy, spec, configmaps)
    guard = check_node_guard(ck, where, proxy, spec, configmaps, app_port(base_apps))
    for agent in agents:
        if "envoyproxy/envoy" in proxy.get("image", ""):
            check_envoy(ck, where, proxy, spec, {"envoy-admin": f"http://127.0.0.1:{agent.pod_admin_port}"},
                        agent.timers["drain-time"], guard, configmaps, envoy_cache, app_port(base_apps))
    return True


def envoy_metadata(ck: Checker, where: str, c: dict, spec: dict, configmaps: dict[str, dict]) -> dict:
    """Envoy's node metadata: the bootstrap's, with --config-yaml merged over it."""
    meta: dict = {}
    _, text = envoy_bootstrap(c, spec, configmaps)
    for src in (text, envoy_args(c).get("--config-yaml")):
        if src:
            try:
                meta.update((((yaml.safe_load(src) or {}).get("node") or {}).get("metadata") or {}))
            except yaml.YAMLError as e:
                ck.fail("wiring", f"{where}: {c.get('name')}: bootstrap YAML does not parse: {e}")
    return meta


def check_node_guard(ck: Checker, where: str, c: dict, spec: dict, configmaps: dict[str, dict],
                     app: int | None) -> str | None:
    """A node-mode pod opts in to the agent's stream guard with node metadata
    DRAINSHIM_GUARD = LISTEN=UPSTREAM (src/node/guard.rs). LISTEN must be the
    guard endpoint of Envoy's inbound cluster (priority 0, checked by
    check_envoy) and UPSTREAM the app's own port (its priority 1 fallback).
    Returns LISTEN, or None when the pod does not opt in."""
    v = envoy_metadata(ck, where, c, spec, configmaps).get("DRAINSHIM_GUARD")
    if v is None:
        return None
    listen, sep, upstream = str(v).partition("=")
    try:
        lh, lp = host_port(listen)
        uh, up = host_port(upstream)
    except ValueError:
        ck.fail("wiring", f"{where}: {c.get('name')}: node metadata DRAINSHIM_GUARD {v!r} is not LISTEN=UPSTREAM (ip:port=ip:port)")
        return None
    ck.check("wiring", bool(sep) and is_loopback(lh) and lp == GUARD_PORT,
             f"{where}: DRAINSHIM_GUARD LISTEN {listen!r}: want 127.0.0.1:{GUARD_PORT}, the guard endpoint of the shipped inbound cluster")
    ck.check("wiring", is_loopback(uh) and app is not None and up == app,
             f"{where}: DRAINSHIM_GUARD UPSTREAM {upstream!r}: want the app's own port {app} on loopback (unchanged app, fail-open fallback)")
    print(f"  {where}: node guard: Envoy -> agent's guard {listen} -> app {upstream}; app at priority 1 while the agent is away")
    return listen


def check_envoy_identity(ck: Checker, where: str, c: dict, spec: dict, configmaps: dict[str, dict]) -> None:
    """The agent names a pod from Envoy's node metadata NAMESPACE/NAME: it may
    not read other users' /proc/<pid>/environ (no CAP_DAC_READ_SEARCH). So
    both keys must be set, from the downward API, in the bootstrap or in
    --config-yaml (which Envoy merges over it)."""
    meta: dict = {}
    _, text = envoy_bootstrap(c, spec, configmaps)
    for src in (text, envoy_args(c).get("--config-yaml")):
        if src:
            try:
                meta.update((((yaml.safe_load(src) or {}).get("node") or {}).get("metadata") or {}))
            except yaml.YAMLError as e:
                ck.fail("wiring", f"{where}: {c.get('name')}: bootstrap YAML does not parse: {e}")
    env = {e.get("name"): ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") for e in c.get("env") or []}
    for key, field in (("NAMESPACE", "metadata.namespace"), ("NAME", "metadata.name")):
        v = str(meta.get(key, ""))
        m = re.fullmatch(r"\$\((\w+)\)", v)
        ck.check("wiring", m is not None and env.get(m.group(1)) == field,
                 f"{where}: {c.get('name')}: Envoy node metadata {key} is {v!r}, want $(VAR) with VAR from the downward API "
                 f"({field}): the agent names the pod from it, and cannot read Envoy's environment")


def check_no_privileged(ck: Checker, overlay: str, name: str, spec: dict) -> None:
    bad = [c.get("name") for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])
           + (spec.get("ephemeralContainers") or []) if (c.get("securityContext") or {}).get("privileged") is True]
    ck.check("wiring", not bad, f"{overlay}: {name}: privileged: true on {bad}; nothing in deploy/ needs it")


# ---------------------------------------------------------------- rollout

def max_surge(doc: dict) -> str | None:
    """The maxSurge of a DaemonSet's or Deployment's rolling update, with the
    API's defaults (DaemonSet 0, Deployment 25%); None when it never starts a
    pod beside an old one (OnDelete, Recreate, maxSurge 0 or 0%, other kinds).
    A percentage is rounded up, so any non-zero one surges."""
    kind = doc.get("kind")
    spec = doc.get("spec") or {}
    if kind == "DaemonSet":
        strategy, default = spec.get("updateStrategy") or {}, 0
    elif kind == "Deployment":
        strategy, default = spec.get("strategy") or {}, "25%"
    else:
        return None
    if strategy.get("type", "RollingUpdate") != "RollingUpdate":
        return None
    v = str((strategy.get("rollingUpdate") or {}).get("maxSurge", default)).strip()
    try:
        n = float(v[:-1]) if v.endswith("%") else float(v)
    except ValueError:
        return v  # not a number: the schema check says so; assume it surges
    return v if n > 0 else None


def surge_port_conflicts(doc: dict) -> list[str]:
    """Host ports a surging rollout needs twice on one node. A surge pod is
    started while the old pod still runs; the host ports it declares are
    held by the old one (on a DaemonSet's node always, for a Deployment on
    every node that runs a replica), so the scheduler's NodePorts filter
    keeps it Pending and the rollout never progresses. With hostNetwork
    every declared containerPort is a host port (the API sets hostPort =
    containerPort). One message per offending port, naming the workload."""
    surge = max_surge(doc)
    if surge is None:
        return []
    kind = doc["kind"]
    name = f"{kind}/{(doc.get('metadata') or {}).get('name')}"
    spec = doc["spec"]["template"]["spec"]
    host_net = spec.get("hostNetwork") is True
    where = ("the surge pod is created on the old pod's node" if kind == "DaemonSet"
             else "the surge pod fits no node that already runs a replica")
    out = []
    for c, _, _ in all_containers(spec):
        agent = is_drainshim(c, "node")
        for pt in c.get("ports") or []:
            hp = pt.get("hostPort") or (pt.get("containerPort") if host_net else None)
            if not hp:
                continue
            label = str(pt.get("containerPort")) + (f" ({pt['name']})" if pt.get("name") else "")
            how = ("with hostNetwork: true that is also host port " if host_net and not pt.get("hostPort") else "as host port ")
            out.append(
                f"{name}: container {c.get('name')} declares port {label}, {how}{hp}. With maxSurge {surge}, {where} "
                f"while the old pod still holds host port {hp}: the scheduler's NodePorts filter keeps it Pending "
                f"(\"didn't have free ports\") and the rollout never progresses. Declare no port (a probe can give the "
                f"number)" + ("; the new agent gets the old one's listening sockets over --handover-socket" if agent
                              else ", or roll without surge"))
    return out


def check_rollout(ck: Checker, overlay: str, doc: dict) -> None:
    if doc.get("kind") not in ("DaemonSet", "Deployment"):
        return
    bad = surge_port_conflicts(doc)
    for m in bad:
        ck.fail("rollout", f"{overlay}: {m}")
    if not bad:
        ck.ok("rollout")
        surge = max_surge(doc)
        if surge is not None and (doc["spec"]["template"]["spec"].get("hostNetwork") is True):
            print(f"  {overlay}: {doc['kind']}/{doc['metadata'].get('name')}: hostNetwork, maxSurge {surge}, no declared port: the surge pod can be scheduled")


# ------------------------------------------------------ the sidecar Component

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
                   workloads: str = ADOPTER_WORKLOADS) -> list[ScrapePod]:
    """The sidecar Component on workloads it has never seen: the opted-in
    pods pass every per-pod check the shipped overlays pass (budget, hooks,
    install, guard -> the pod's own app port, Envoy's fail-open bootstrap
    validated by the real Envoy, probes), every object the schemas, the
    Service reaches Envoy; the app containers keep their image, args, ports
    and mounts; a workload without the label is not touched. Returns the
    rendered pods for the scrape checks."""
    area = "adopt"
    before, err = render_adopter(kubectl, None, workloads)
    if not ck.check(area, before is not None, f"the adopter's workloads alone do not render: {err}"):
        return []
    after, err = render_adopter(kubectl, component, workloads)
    if not ck.check(area, after is not None, f"{component.relative_to(ROOT) if component.is_relative_to(ROOT) else component}: "
                                             f"the adopter's kustomization with the Component does not render: {err}"):
        return []
    overlay = "adopter"
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
            now = {c.get("name"): c for c, _, _ in all_containers(spec)}
            for cname, c in apps.items():
                got = now.get(cname) or {}
                ck.check(area, got.get("ports") == c.get("ports"),
                         f"{where}: {cname}: ports {got.get('ports')} differ from the workload's own {c.get('ports')}")
                kept = [m for m in got.get("volumeMounts") or [] if m.get("name") != "drainshim-bin"]
                ck.check(area, kept == (c.get("volumeMounts") or []),
                         f"{where}: {cname}: volumeMounts {kept} (besides drainshim-bin) differ from the workload's own {c.get('volumeMounts')}")
            print(f"  {where}: adopted through the Component (app {next(iter(apps), None)!r} on :{pod_app_port(Checker(), where, meta, apps)})")
    return pods


# ------------------------------------------------ the Istio variant of it

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


def _edit(rel: str, old: str, new: str):
    """A selftest edit of a copy of the Component: `old` -> `new` in one file."""
    def edit(component: Path) -> None:
        f = component / rel
        text = f.read_text()
        if old not in text:
            raise SystemExit(f"check_deploy selftest: {old!r} is not in {component.name}/{rel}: update ADOPTION_CASES or ISTIO_ADOPTION_CASES")
        f.write_text(text.replace(old, new))
    return edit


# (what, a failure message that must appear (None: no failure may), an edit
# of the Component's copy, the adopter's workloads).
ADOPTION_CASES = [
    ("the shipped Component on orders (Deployment, :9090), ledger (StatefulSet, :7070) and mailer (not opted in): accepted",
     None, None, ADOPTER_WORKLOADS),
    ("the Component without app/ (the app's container gets no preStop): rejected",
     "no preStop hook holding it up", _edit("kustomization.yaml", "components:\n- app\n", ""), ADOPTER_WORKLOADS),
    ("the Component with Envoy's fallback on a fixed 8080 instead of $(APP_PORT): rejected",
     "priority 1 goes to [8080]", _edit("pod-patch.yaml", "port_value: $(APP_PORT)", "port_value: 8080"), ADOPTER_WORKLOADS),
    ("the Component without terminationGracePeriodSeconds (Kubernetes' 30 s): rejected",
     "differs from terminationGracePeriodSeconds", _edit("pod-patch.yaml", "      terminationGracePeriodSeconds: 120\n", ""), ADOPTER_WORKLOADS),
    ("the Component patching every Deployment and StatefulSet (no label selector): mailer changed, rejected",
     "yet the Component changed it", _edit("kustomization.yaml", "    labelSelector: drainshim.io/inject=true\n", ""), ADOPTER_WORKLOADS),
    ("orders without its drainshim.io/app-port annotation: rejected",
     "which the pod does not have", None, ADOPTER_WORKLOADS.replace('      annotations: {drainshim.io/app-port: "9090"}\n', "", 1)),
    ("the adopter's Service to the app's own port (http) instead of envoy-inbound: rejected",
     "callers would bypass Envoy", None, ADOPTER_WORKLOADS.replace("targetPort: envoy-inbound", "targetPort: http", 1)),
    ("the Component with Envoy's retry policy dropped from its inline bootstrap: rejected",
     "differs from components/envoy/envoy.yaml", _edit("pod-patch.yaml", "retry_on: connect-failure,refused-stream,reset", "retry_on: connect-failure"),
     ADOPTER_WORKLOADS),
    ("orders with drainshim.io/app-port 9091, a port it does not declare: rejected",
     "is not a port the app declares", None, ADOPTER_WORKLOADS.replace('drainshim.io/app-port: "9090"', 'drainshim.io/app-port: "9091"', 1)),
]

# The native-sidecar variant (components/native-sidecar) on the same workloads.
NATIVE_ADOPTION_CASES = [
    ("the shipped native-sidecar Component on orders, ledger and mailer: accepted",
     None, None, ADOPTER_WORKLOADS),
    ("the native-sidecar Component with drainshim a plain init container (no restartPolicy: Always): rejected",
     "is a plain init container", _edit("pod-patch.yaml", "        image: drainshim\n        restartPolicy: Always\n", "        image: drainshim\n"),
     ADOPTER_WORKLOADS),
]

# The same for the Istio variant (components/sidecar-istio, ADOPTER_ISTIO).
ISTIO_ADOPTION_CASES = [
    ("the shipped Istio variant on orders (:9090, GRPC) in a namespace with a default Sidecar: accepted, its egress carried over",
     None, None, ADOPTER_ISTIO),
    ("the Istio variant without its first replacement (the Sidecar does not start from the namespace default): rejected",
     "lacks its egress hosts", _edit("kustomization.yaml", """- source: { kind: Sidecar, name: default, fieldPath: spec }
  targets:
  - select: { kind: Sidecar, name: drainshim-guard }
    fieldPaths: [spec]
""", ""), ADOPTER_ISTIO),
    ("the Istio variant with the EnvoyFilter's fallback left on port 0: rejected",
     "the EnvoyFilter adds priority 1 endpoints [0]", _edit("kustomization.yaml",
                                                            "    - spec.configPatches.0.patch.value.load_assignment.endpoints.0.lb_endpoints.0.endpoint.address.socket_address.port_value\n", ""),
     ADOPTER_ISTIO),
]


# ----------------------------------------------------------------- schema

def check_schema(ck: Checker, overlay: str, docs: list[dict], versions: list[str]) -> list[str]:
    import kubernetes_validate

    skipped = []
    for d in docs:
        kind = d.get("kind")
        name = f"{overlay}: {kind}/{d.get('metadata', {}).get('name')}"
        if kind in CRD_KINDS:
            skipped.append(name)
            continue
        for v in versions:
            try:
                kubernetes_validate.validate(d, v, strict=True)
                ck.ok("schema")
            except kubernetes_validate.ValidationError as e:
                ck.fail("schema", f"{name} (Kubernetes {v}): {e.message} at {'.'.join(map(str, e.path))}")
            except kubernetes_validate.SchemaNotFoundError as e:
                ck.fail("schema", f"{name} (Kubernetes {v}): no schema ({e}); add it to CRD_KINDS only if it is a CRD checked otherwise")
    return skipped


# ----------------------------------------------------------------- metrics

def contract_metrics(design: Path) -> set[str]:
    """Metric names from docs/design.md's metrics table; histograms also give
    their _bucket/_sum/_count series."""
    text = design.read_text()
    m = re.search(r"^### Metrics.*?(?=^## |\Z)", text, re.S | re.M)
    if not m:
        raise SystemExit(f"check_deploy: no '### Metrics' section in {design}")
    names: set[str] = set()
    for line in m.group(0).splitlines():
        if not line.startswith("|"):
            continue
        found = re.findall(r"`(drainshim_[a-z0-9_]+)", line.split("|")[1])
        for n in found:
            names.add(n)
            if "histogram" in line:
                names.update({n + "_bucket", n + "_sum", n + "_count"})
    return names


_PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
                 "group_left", "group_right", "inf", "nan", "atan2"}


def promql_metrics(expr: str) -> set[str]:
    """The metric (or recorded rule) names a PromQL expression reads."""
    s = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w$.])[A-Za-z_:][A-Za-z0-9_:]*", s):
        tok = m.group(0)
        rest = s[m.end():].lstrip()
        if rest.startswith("(") or tok.lower() in _PROMQL_WORDS:
            continue
        names.add(tok)
    return names


def check_metrics(ck: Checker, rules: dict, dashboard: dict, contract: set[str], exported: set[str]) -> None:
    """Alerts may also read what the shim exports beyond the contract (e.g.
    drainshim_envoy_stuck_draining, the recovery watcher's gauge): it is real
    and registered in src/metrics/. The dashboard sticks to the contract."""
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    for g in rules["groups"]:
        for r in g["rules"]:
            what = r.get("alert") or r.get("record")
            used = promql_metrics(r["expr"])
            ck.check("metrics", bool(used), f"rules.yaml {what}: reads no metric?")
            for n in used:
                ck.check("metrics", n in contract or n in recorded or n in exported,
                         f"rules.yaml {what}: {n} is neither a docs/design.md metric, nor recorded in rules.yaml")
    for p in dashboard_panels(dashboard):
        for t in p.get("targets", []):
            for n in promql_metrics(t.get("expr", "")):
                ck.check("metrics", n in contract,
                         f"dashboard panel {p.get('title')!r}: {n} is not a docs/design.md metric")


def dashboard_panels(d: dict):
    for p in d.get("panels", []):
        if p.get("type") == "row":
            yield from p.get("panels", [])
        else:
            yield p


def check_dashboard(ck: Checker, path: Path) -> dict | None:
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        ck.fail("dashboard", f"{path}: {e}")
        return None
    ck.ok("dashboard")
    panels = list(dashboard_panels(d))
    ck.check("dashboard", bool(panels), "the dashboard has no panels")
    ids = [p.get("id") for p in d.get("panels", [])]
    ck.check("dashboard", len(ids) == len(set(ids)), "panel ids are not unique")
    for p in panels:
        exprs = [t.get("expr") for t in p.get("targets", [])]
        ck.check("dashboard", bool(exprs) and all(exprs), f"panel {p.get('title')!r} has a target without a query")
    return d


# ------------------------------------------------------------------ rules

def prometheusrule_from(rules: dict) -> dict:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "drainshim", "labels": {"app.kubernetes.io/name": "drainshim"}},
        "spec": {"groups": copy.deepcopy(rules["groups"])},
    }


class _RulesDumper(yaml.SafeDumper):
    """Writes multi-line strings (the PromQL) as `|` blocks, as in rules.yaml."""


_RulesDumper.add_representer(
    str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


def sync_rules() -> None:
    rules = yaml.safe_load((MONITORING / "rules.yaml").read_text())
    body = yaml.dump(prometheusrule_from(rules), Dumper=_RulesDumper, sort_keys=False, width=100)
    header = ("# GENERATED from rules.yaml by `make deploy-rules`.\n"
              "# Edit rules.yaml (promtool checks and tests it), then regenerate; `make test`\n"
              "# fails while the two differ.\n")
    (MONITORING / "prometheusrule.yaml").write_text(header + body)
    print("wrote deploy/monitoring/prometheusrule.yaml")


def check_rules_sync(ck: Checker, rendered_docs: list[dict]) -> dict:
    rules = yaml.safe_load((MONITORING / "rules.yaml").read_text())
    prs = [d for d in rendered_docs if d.get("kind") == "PrometheusRule"]
    if ck.check("rules", len(prs) == 1, f"monitoring renders {len(prs)} PrometheusRule objects, want 1"):
        ck.check("rules", prs[0]["spec"]["groups"] == rules["groups"],
                 "deploy/monitoring/prometheusrule.yaml differs from rules.yaml: run `make deploy-rules`")
    n = sum(len(g["rules"]) for g in rules["groups"])
    print(f"  rules.yaml: {len(rules['groups'])} groups, {n} rules; PrometheusRule in sync: {not any('[rules]' in f for f in ck.failures)}")
    return rules


def selects(selector: dict, labels: dict) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions) against labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        k, op, vals = e.get("key"), e.get("operator"), e.get("values") or []
        if not {"In": lambda: labels.get(k) in vals, "NotIn": lambda: labels.get(k) not in vals,
                "Exists": lambda: k in labels, "DoesNotExist": lambda: k not in labels}.get(op, lambda: False)():
            return False
    return True


# What Prometheus would scrape: the PodMonitors are run on every rendered pod
# the way prometheus-operator and Prometheus' kubernetes_sd (role: pod) run
# them, for an IPv4 and an IPv6 pod IP. The operator keeps a target by
# `port` (the declared port's name), `portNumber` or `targetPort` (a declared
# port's number), and only then applies the endpoint's relabelings; a
# container that declares no port is discovered as one port-less target at
# the pod IP. So `portNumber` cannot reach an undeclared port, and the node
# agent (which declares none, see check_rollout) is scraped by relabeling.

SIM_POD_IPS = ("10.0.3.17", "fd00:10::3:17")
SIM_NODE_IPS = ("10.0.0.5", "fd00:10::5")


@dataclass
class ScrapePod:
    """A rendered pod as Prometheus' pod discovery sees it, and what must be
    scraped of it: want_port, drainshim's --listen port (None: nothing may be
    scraped); judge False for a drainshim pod whose port is unknown because
    its own checks failed."""
    where: str
    namespace: str
    meta: dict
    spec: dict
    want_port: int | None
    agent: bool = False
    judge: bool = True


def join_host_port(ip: str, port: int | str) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def discovered_targets(pod: ScrapePod, ip: str, node_ip: str) -> list[dict[str, str]]:
    """Prometheus' kubernetes_sd, role pod: one target per declared container
    port, one port-less target per container that declares none (init
    containers included)."""
    common = {
        # A manifest without a namespace is applied to one; never empty.
        "__meta_kubernetes_namespace": pod.namespace or "default",
        "__meta_kubernetes_pod_name": pod.where.rsplit("/", 1)[-1] + "-0",
        "__meta_kubernetes_pod_ip": ip,
        "__meta_kubernetes_pod_ready": "true",
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_node_name": "node-0",
        "__meta_kubernetes_pod_host_ip": node_ip,
    }
    for prefix, items in (("label", pod.meta.get("labels")), ("annotation", pod.meta.get("annotations"))):
        for k, v in (items or {}).items():
            common[f"__meta_kubernetes_pod_{prefix}_{_sanitize(k)}"] = str(v)
            common[f"__meta_kubernetes_pod_{prefix}present_{_sanitize(k)}"] = "true"
    out = []
    containers = [(c, False) for c in pod.spec.get("containers") or []] + [(c, True) for c in pod.spec.get("initContainers") or []]
    for c, init in containers:
        base = {**common, "__meta_kubernetes_pod_container_name": c.get("name", ""),
                "__meta_kubernetes_pod_container_image": c.get("image", ""),
                "__meta_kubernetes_pod_container_init": str(init).lower()}
        ports = c.get("ports") or []
        if not ports:
            out.append({**base, "__address__": f"[{ip}]" if ":" in ip else ip})
        for pt in ports:
            out.append({**base, "__address__": join_host_port(ip, pt.get("containerPort")),
                        "__meta_kubernetes_pod_container_port_name": pt.get("name", ""),
                        "__meta_kubernetes_pod_container_port_number": str(pt.get("containerPort")),
                        "__meta_kubernetes_pod_container_port_protocol": pt.get("protocol", "TCP")})
    return out


def _expand(template: str, m: re.Match) -> str:
    """Go's regexp Expand, as Prometheus uses it: $1, ${1}, $name, ${name}, $$.
    A reference to a group that does not exist expands to nothing (so
    `$1x` is the group named `1x`: write ${1}x)."""
    def sub(g: re.Match) -> str:
        if g.group(0) == "$$":
            return "$"
        ref = g.group(1) or g.group(2)
        try:
            v = m.group(int(ref)) if ref.isdigit() else m.group(ref)
        except IndexError:  # no such group, by number or by name
            v = None
        return v or ""
    return re.sub(r"\$\$|\$\{(\w+)\}|\$(\w+)", sub, template)


def relabel(labels: dict[str, str], rules: list[dict]) -> dict[str, str] | None:
    """Prometheus relabeling (prometheus-operator field names); None when the
    target is dropped. Regexes are anchored, as in Prometheus."""
    labels = dict(labels)
    for r in rules:
        action = str(r.get("action", "replace")).lower()
        src = [str(s) for s in r.get("sourceLabels") or []]
        val = str(r.get("separator", ";")).join(labels.get(s, "") for s in src)
        regex = re.compile(r"^(?:" + str(r.get("regex", "(.*)")) + r")$")
        repl = str(r.get("replacement", "$1"))
        target = r.get("targetLabel")
        if action == "keep":
            if not regex.match(val):
                return None
        elif action == "drop":
            if regex.match(val):
                return None
        elif action == "keepequal":
            if labels.get(target, "") != val:
                return None
        elif action == "dropequal":
            if labels.get(target, "") == val:
                return None
        elif action == "replace":
            m = regex.match(val)
            if m is None or not target:
                continue
            name, value = _expand(str(target), m), _expand(repl, m)
            if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name):
                continue
            if value:
                labels[name] = value
            else:
                labels.pop(name, None)
        elif action in ("lowercase", "uppercase"):
            labels[str(target)] = val.lower() if action == "lowercase" else val.upper()
        elif action == "labelmap":
            for k in list(labels):
                m = regex.match(k)
                if m:
                    labels[_expand(repl, m)] = labels[k]
        elif action in ("labeldrop", "labelkeep"):
            labels = {k: v for k, v in labels.items() if bool(regex.match(k)) == (action == "labelkeep")}
        else:
            raise ValueError(f"relabeling action {action!r} is not simulated by check_deploy.py")
    return labels


def operator_relabelings(pm: dict, ep: dict) -> list[dict]:
    """What prometheus-operator puts before an endpoint's own relabelings:
    the target filters, then the target labels namespace, container and pod
    (from the pod's metadata), job and endpoint."""
    rules: list[dict] = [{"sourceLabels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)", "action": "drop"}]
    if ep.get("port"):
        rules.append({"sourceLabels": ["__meta_kubernetes_pod_container_port_name"], "regex": str(ep["port"]), "action": "keep"})
    elif ep.get("portNumber"):
        rules.append({"sourceLabels": ["__meta_kubernetes_pod_container_port_number"], "regex": str(ep["portNumber"]), "action": "keep"})
    elif ep.get("targetPort") is not None:
        tp = ep["targetPort"]
        key = "port_number" if isinstance(tp, int) else "port_name"
        rules.append({"sourceLabels": [f"__meta_kubernetes_pod_container_{key}"], "regex": str(tp), "action": "keep"})
    meta = pm.get("metadata") or {}
    rules += [
        {"sourceLabels": ["__meta_kubernetes_namespace"], "targetLabel": "namespace"},
        {"sourceLabels": ["__meta_kubernetes_pod_container_name"], "targetLabel": "container"},
        {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "pod"},
        {"targetLabel": "job", "replacement": f"{meta.get('namespace') or 'monitoring'}/{meta.get('name', '')}"},
    ]
    if ep.get("port"):
        rules.append({"targetLabel": "endpoint", "replacement": str(ep["port"])})
    return rules


def podmonitor_scrapes(pm: dict, pod: ScrapePod, ip: str, node_ip: str) -> list[tuple[int, dict, str, dict]]:
    """(endpoint index, endpoint, address, discovered target) of every target
    the PodMonitor gives on the pod."""
    spec = pm.get("spec") or {}
    nsel = spec.get("namespaceSelector") or {}
    own_ns = (pm.get("metadata") or {}).get("namespace") or ""
    if not (nsel.get("any") is True or pod.namespace in (nsel.get("matchNames") or [])
            or (not nsel.get("matchNames") and not nsel.get("any") and pod.namespace == own_ns)):
        return []
    if not selects(spec.get("selector") or {}, pod.meta.get("labels") or {}):
        return []
    found = []
    targets = discovered_targets(pod, ip, node_ip)
    for i, ep in enumerate(spec.get("podMetricsEndpoints") or []):
        rules = operator_relabelings(pm, ep) + (ep.get("relabelings") or [])
        for t in targets:
            out = relabel(t, rules)
            if out is not None and out.get("__address__"):
                found.append((i, ep, out["__address__"], t))
    return found


def check_scrapes(ck: Checker, docs: list[dict], pods: list[ScrapePod], all_pods: bool = True) -> None:
    """Every drainshim is scraped exactly once, at its --listen port, for an
    IPv4 and an IPv6 pod IP; no other rendered pod is scraped at all; node
    agents with honorLabels (each pod's namespace/pod labels are the agent's
    series'). With all_pods (every rendered pod given), every PodMonitor
    endpoint must scrape some drainshim."""
    pms = [d for d in docs if d.get("kind") == "PodMonitor"]
    used: set[tuple[str, int]] = set()
    for pod in pods:
        seen = []
        for ip, node_ip in zip(SIM_POD_IPS, SIM_NODE_IPS):
            if pod.spec.get("hostNetwork") is True:
                ip = node_ip
            try:
                scraped = [(pm["metadata"]["name"], i, ep, addr, t) for pm in pms for i, ep, addr, t in podmonitor_scrapes(pm, pod, ip, node_ip)]
                got = [(n, i, ep, addr) for n, i, ep, addr, _ in scraped]
                found = [(n, i, ep, t) for n, i, ep, _, t in scraped]
            except (ValueError, re.error) as e:
                ck.fail("wiring", f"{pod.where}: cannot run the PodMonitors' relabelings on it: {e}")
                return
            used.update((n, i) for n, i, _, _ in got)
            if not pod.judge:
                continue
            if pod.want_port is None:
                for n, i, _, addr in got:
                    ck.fail("wiring", f"PodMonitor/{n} endpoint {i} would scrape {pod.where} at {addr}, where no drainshim serves /metrics")
                continue
            want = join_host_port(ip, pod.want_port)
            addrs = [f"PodMonitor/{n}[{i}] {addr}" for n, i, _, addr in got]
            if not got:
                ck.fail("wiring", f"{pod.where}: no PodMonitor scrapes it (pod IP {ip}: want {want}, its --listen; "
                                  f"declared ports {[pt.get('containerPort') for c, _, _ in all_containers(pod.spec) for pt in c.get('ports') or []]})")
                continue
            ck.check("wiring", len(got) == 1 and got[0][3] == want,
                     f"{pod.where}: scraped as {addrs} (pod IP {ip}), want exactly once at {want}, its --listen")
            if pod.agent:
                for n, i, ep, _ in got:
                    ck.check("wiring", ep.get("honorLabels") is True,
                             f"PodMonitor/{n}: scrapes {pod.where} without honorLabels: true; every pod's namespace/pod labels would become exported_namespace/exported_pod")
            else:
                for n, i, ep, t in found:
                    check_sidecar_labels(ck, f"PodMonitor/{n}[{i}]", ep, pod, t)
            seen += [f"{a} (honorLabels {ep.get('honorLabels')})" for a, (_, _, ep, _) in zip(addrs, got)]
        if seen and pod.judge and pod.want_port is not None and all_pods:
            print(f"  {pod.where}: scraped by {'; '.join(seen)}")
    for pm in pms if all_pods else []:
        for i, _ in enumerate(pm["spec"].get("podMetricsEndpoints") or []):
            ck.check("wiring", (pm["metadata"]["name"], i) in used,
                     f"PodMonitor/{pm['metadata']['name']} endpoint {i} scrapes no rendered drainshim pod")


def check_sidecar_labels(ck: Checker, where: str, ep: dict, pod: ScrapePod, target: dict[str, str]) -> None:
    """A monitor that scrapes sidecars trusts nothing they export: any pod in
    any namespace can declare their port. No honorLabels, and its own
    relabelings (not only the operator's) set namespace and pod from the pod's
    metadata, so a scraped namespace/pod never names another pod."""
    ck.check("wiring", ep.get("honorLabels") is not True,
             f"{where}: scrapes the sidecar {pod.where} with honorLabels: true; any pod that declares its port "
             "could export series with another pod's namespace/pod labels (set honorLabels: false)")
    try:
        own = relabel(target, ep.get("relabelings") or []) or {}
    except (ValueError, re.error) as e:
        ck.fail("wiring", f"{where}: cannot run its relabelings on {pod.where}: {e}")
        return
    want = {"namespace": target.get("__meta_kubernetes_namespace"), "pod": target.get("__meta_kubernetes_pod_name")}
    got = {k: own.get(k) for k in want}
    ck.check("wiring", got == want,
             f"{where}: its relabelings set {got} on {pod.where}, want {want}: namespace and pod from "
             "__meta_kubernetes_namespace and __meta_kubernetes_pod_name")


def check_label_trust(ck: Checker, pms: list[dict], agent_namespaces: set[str]) -> None:
    """honorLabels only where nobody but the agent runs: a PodMonitor that
    honours labels reads only the agents' namespaces (matchNames), never any."""
    for pm in pms:
        name = f"PodMonitor/{pm['metadata']['name']}"
        nsel = (pm.get("spec") or {}).get("namespaceSelector") or {}
        for i, ep in enumerate(pm["spec"].get("podMetricsEndpoints") or []):
            if ep.get("honorLabels") is not True:
                continue
            names = set(nsel.get("matchNames") or [])
            ck.check("wiring", nsel.get("any") is not True and bool(names) and names <= agent_namespaces,
                     f"{name}[{i}]: honorLabels: true on namespaceSelector {nsel or '{}'}; honour labels only in the "
                     f"node agents' namespaces {sorted(agent_namespaces)} (matchNames), or any pod there could name any pod")


# A tenant's exporter: it claims to be another namespace's pod.
FORGED = {"namespace": "kube-system", "pod": "victim"}


def _snake(rule: dict) -> dict:
    """A prometheus-operator relabeling as Prometheus' relabel_config."""
    out = {re.sub(r"([A-Z])", r"_\1", k).lower(): v for k, v in rule.items()}
    if "action" in out:
        out["action"] = str(out["action"]).lower()
    return out


def forged_label_run(prometheus: Path, pm: dict, pod: ScrapePod) -> list[str]:
    """Scrapes an exporter that claims FORGED with the PodMonitor's first
    endpoint that selects the pod, in a real Prometheus: the operator's
    relabelings, the endpoint's relabelings, honorLabels and
    metricRelabelings, on the pod's discovered target labels. Returns what is
    wrong with the stored series (nothing when they name the real pod and
    nothing forged is left)."""
    import http.server
    import socket
    import threading
    import time
    import urllib.request

    found = podmonitor_scrapes(pm, pod, SIM_POD_IPS[0], SIM_NODE_IPS[0])
    if not found:
        return [f"PodMonitor/{pm['metadata']['name']} does not scrape {pod.where}"]
    i, ep, _, target = found[0]
    real = {"namespace": target["__meta_kubernetes_namespace"], "pod": target["__meta_kubernetes_pod_name"]}
    body = ("# TYPE drainshim_proxy_info gauge\n"
            f'drainshim_proxy_info{{namespace="{FORGED["namespace"]}",pod="{FORGED["pod"]}",version="1.40.0",mesh_version=""}} 1\n').encode()

    class Exporter(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    exporter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        prom_port = s.getsockname()[1]
    addr = f"127.0.0.1:{exporter.server_address[1]}"
    labels = {k: v for k, v in target.items() if k != "__address__"}
    # The exporter stands in for the pod's address: the last word on
    # __address__ is the harness's, after the monitor's own.
    relabel_configs = [_snake(r) for r in operator_relabelings(pm, ep) + (ep.get("relabelings") or [])]
    relabel_configs.append({"target_label": "__address__", "replacement": addr})
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "scrape_configs": [{
            "job_name": f"podMonitor/{pm['metadata']['name']}/{i}",
            "honor_labels": ep.get("honorLabels") is True,
            "metrics_path": ep.get("path", "/metrics"),
            "static_configs": [{"targets": [addr], "labels": labels}],
            "relabel_configs": relabel_configs,
            "metric_relabel_configs": [_snake(r) for r in ep.get("metricRelabelings") or []],
        }],
    }
    with tempfile.TemporaryDirectory() as d:
        # JSON is YAML: Prometheus reads it as its config.
        (Path(d) / "prometheus.yml").write_text(json.dumps(config, indent=1))
        log = open(Path(d) / "prometheus.log", "w")
        proc = subprocess.Popen([str(prometheus), f"--config.file={d}/prometheus.yml", f"--storage.tsdb.path={d}/data",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": "drainshim_proxy_info"})
            # Straight to the local Prometheus, whatever *_proxy says.
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            series: list[dict] = []
            deadline = time.monotonic() + 60
            while not series and time.monotonic() < deadline and proc.poll() is None:
                try:
                    with opener.open(url, timeout=5) as r:
                        series = [x["metric"] for x in json.load(r)["data"]["result"]]
                except OSError:
                    pass
                if not series:
                    time.sleep(0.2)
            if not series:
                return [f"Prometheus stored no drainshim_proxy_info within 60 s (exit {proc.poll()}): "
                        + (Path(d) / "prometheus.log").read_text()[-2000:]]
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
            exporter.shutdown()
            exporter.server_close()
    wrong = []
    for m in series:
        got = {k: m.get(k) for k in real}
        if got != real:
            wrong.append(f"stored {got}, want the pod's own {real}: {m}")
        forged = sorted(k for k, v in m.items() if v in FORGED.values())
        if forged:
            wrong.append(f"the forged {FORGED} survived as {forged}: {m}")
    return wrong


# ------------------------------------------------------------------- docs

# Prose that describes node mode, held against the rendered manifests and the
# binary's `drainshim node --help`. Only a short list of known contradictions,
# each tied to one fact; a paragraph is judged only where it is about the node
# agent, so the same words elsewhere (a sidecar, `drainshim drain`) pass.
DOC_FILES = ["README.md", "docs/reference.md", "deploy/README.md", "docs/operations.md", "docs/design.md",
             "deploy/daemonset/workload-prestop/workload-prestop-patch.yaml",
             "deploy/daemonset/workload-prestop/kustomization.yaml"]
NODE_TOPIC = re.compile(r"node mode|node agent|daemonset|\bagents?\b", re.I)


@dataclass
class DocFacts:
    """What the docs about node mode must not contradict."""
    max_surge: str  # the agent DaemonSet's rolling update, as rendered
    max_unavailable: str
    host_paths: list[str]  # hostPath volumes of the agent
    handover: bool  # --handover-socket is set
    guard_help: bool  # `drainshim node --help` documents the per-pod stream guard (--guard)


def doc_paragraphs(name: str, text: str) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph: blank-line separated; in YAML
    only comment lines count. Markdown emphasis and backticks are dropped and
    whitespace collapsed, so a phrase wrapped over two lines still matches."""
    yaml_file = name.endswith((".yaml", ".yml"))
    out, cur, start = [], [], 0
    for n, line in enumerate(text.splitlines() + [""], 1):
        if yaml_file:
            m = re.match(r"\s*#(.*)", line)
            line = m.group(1) if m else ""
        if line.strip():
            if not cur:
                start = n
            cur.append(line)
        elif cur:
            out.append((start, re.sub(r"\s+", " ", re.sub(r"[*`]", "", " ".join(cur))).strip()))
            cur = []
    return out


def doc_contradictions(texts: dict[str, str], facts: DocFacts) -> list[str]:
    """Messages for each known contradiction of facts in texts ({name: text})."""
    # (pattern, the value its group 1 must have or None for any match, what the fact is)
    rules: list[tuple[str, str | None, str]] = [
        (r"\bmaxSurge\s*[:=]?\s*(\d+%?)", facts.max_surge, f"the agent's DaemonSet has maxSurge: {facts.max_surge}"),
        (r"\bmaxUnavailable\s*[:=]?\s*(\d+%?)", facts.max_unavailable,
         f"the agent's DaemonSet has maxUnavailable: {facts.max_unavailable}"),
    ]
    surge_zero = facts.max_surge in ("0", "0%")
    if facts.handover and not surge_zero:
        rules.append((r"\btwo agents cannot share\b", None,
                      f"the agents of a node overlap (maxSurge {facts.max_surge}) and hand the port over (--handover-socket)"))
    if facts.guard_help:
        fact = "`drainshim node --help` documents a stream guard per pod (--guard, node metadata DRAINSHIM_GUARD)"
        rules += [(r"\bno stream guard\b", None, fact),
                  (r"\bnode mode (?:has|offers|gives|provides) no (?:stream )?guard\b", None, fact),
                  (r"\bnode mode,? there is no (?:stream )?guard\b", None, fact),
                  (r"\bno (?:stream )?guard in node mode\b", None, fact)]
    if facts.host_paths:
        fact = f"the agent's DaemonSet mounts hostPath {', '.join(facts.host_paths)}"
        rules += [(r"\bnot used:[^.]*(?<!other )\bhostPath\b", None, fact),
                  (r"\bno hostPath\b", None, fact),
                  (r"\bwithout (?:a |any )?hostPath\b", None, fact)]
    out = []
    for name, text in texts.items():
        for line, para in doc_paragraphs(name, text):
            if not NODE_TOPIC.search(para):
                continue
            spans: list[tuple[int, int]] = []  # one message per phrase, however many rules match it
            for pat, want, fact in rules:
                for m in re.finditer(pat, para, re.I):
                    if (want is None or m.group(1) != want) and not any(a < m.end() and m.start() < b for a, b in spans):
                        spans.append(m.span())
                        out.append(f"{name} (paragraph at line {line}): says {m.group(0)!r}, but {fact}")
    return out


def node_help() -> str:
    try:
        r = subprocess.run([str(DRAINSHIM_BIN), "node", "--help"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise SystemExit(f"check_deploy: cannot run {DRAINSHIM_BIN} ({e}): build it first (cargo build)")
    if r.returncode != 0:
        raise SystemExit(f"check_deploy: `drainshim node --help` exits {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def guard_documented(help_text: str) -> bool:
    """`drainshim node --help` offers the per-pod stream guard."""
    return bool(re.search(r"^\s*--guard <", help_text, re.M)) and "DRAINSHIM_GUARD" in help_text


def check_docs(ck: Checker, agents: list[Agent]) -> None:
    if not ck.check("docs", len(agents) == 1, f"want the one node agent's DaemonSet to hold the docs against, found {len(agents)}"):
        return
    a = agents[0]
    help_text = node_help()
    facts = DocFacts(
        max_surge=str(a.rolling_update.get("maxSurge", 0)),
        max_unavailable=str(a.rolling_update.get("maxUnavailable", 1)),
        host_paths=a.host_paths,
        handover="handover-socket" in a.settings,
        guard_help=guard_documented(help_text),
    )
    texts = {}
    for f in DOC_FILES:
        path = ROOT / f
        if ck.check("docs", path.is_file(), f"{f}: missing (scripts/check_deploy.py DOC_FILES)"):
            texts[f] = path.read_text()
    bad = doc_contradictions(texts, facts)
    for m in bad:
        ck.fail("docs", m)
    if not bad:
        ck.ok("docs")
    print(f"  {len(texts)} files held against {a.where} (maxSurge {facts.max_surge}, maxUnavailable {facts.max_unavailable}, "
          f"hostPath {facts.host_paths or 'none'}, hand-over {facts.handover}) and `drainshim node --help` "
          f"(stream guard per pod: {facts.guard_help}): {len(bad)} contradiction(s)")


# --------------------------------------------------------------- selftest

# The prose this change corrected (issue 29), verbatim: each must still be
# caught. And sentences that must pass: the same words where they are true.
OLD_DOCS = {
    "deploy/README.md, node mode, before issue 29": """What node mode does not do:
- **No stream guard.** The guard is a proxy in the pod's data path, which only the sidecar
  provides. A drain fails Envoy's health check, drains its listeners and exits early once streams
  are gone.
- **No drain while the agent is down.** If the node's agent is not running when a pod is deleted
  (not yet scheduled, or being rolled), the hook fails at once. The DaemonSet rolls
  one node at a time with `maxSurge: 0` (two agents cannot share the node's port 15098). Do not
  roll it during a mesh upgrade.

Not used: `privileged: true`, hostPath volumes, NET_ADMIN, NET_BIND_SERVICE, DAC_READ_SEARCH, a
ServiceAccount token (the agent never calls the Kubernetes API).
""",
    "docs/operations.md, before issue 29": """- **Node mode** (`deploy/daemonset/`): one `drainshim node` agent per node. No stream guard
  either: the drain fails Envoy's health check.

is not the first time clients reconnect. Turn on the guard's max connection age (a sidecar flag:
node mode has no guard, so this step needs the sidecar overlays):

- **Stop:** `outcome: deadline` with `cut > 0`: the drain time is shorter than your streams, or
  the guard is not in front of the port that carries them. In node mode there is no guard, so
  streams longer than the drain time are always cut.
""",
    "workload-prestop-patch.yaml, before issue 29": """# What a pod needs for node mode.
#
# There is no stream guard in node mode (it is a proxy in the pod's data
# path, which only the sidecar provides): streams still open at the deadline
# are cut, and reported as such.
""",
}
OLD_DOCS_CAUGHT = {"deploy/README.md, node mode, before issue 29": 4, "docs/operations.md, before issue 29": 3,
                   "workload-prestop-patch.yaml, before issue 29": 1}
TRUE_DOCS = {
    "true statements": """A malformed key is logged and the pod gets no guard; a pod already
draining gets none (node mode).

The agent's rolling update (`maxSurge: 1, maxUnavailable: 0`) hands the sockets over.

- `drainshim drain --envoy-admin URL [timers]`: one drain driving Envoy directly, no guard.

A sidecar without --guard-listen has no stream guard, and maxSurge: 25% is a Deployment's default.

The node agent mounts the hand-over socket's directory. Not used: `privileged: true`, any other
hostPath, NET_ADMIN.
""",
}


def run_selftest(rendered: Path, prometheus: Path, envoy_cache: Path, kubectl: str) -> int:
    """Proves the rules above fire: each on the shipped manifests (passes)
    and on a copy broken the way issue 29 found it (rejected)."""
    results: list[tuple[bool, str]] = []

    def expect(cond: bool, what: str, detail: str = "") -> None:
        results.append((cond, what))
        print(f"  {'ok  ' if cond else 'FAIL'} {what}")
        if detail:
            print("       " + detail.replace("\n", "\n       "))

    def load(name: str) -> list[dict]:
        f = rendered / f"{name}.yaml"
        if not f.is_file():
            raise SystemExit(f"check_deploy selftest: {f} not rendered (run scripts/check-deploy.sh)")
        return [d for d in yaml.safe_load_all(f.read_text()) if d]

    ds = next((d for d in load("daemonset") if d.get("kind") == "DaemonSet"), None)
    if ds is None:
        raise SystemExit("check_deploy selftest: no DaemonSet in the rendered daemonset/")
    pms = [d for d in load("monitoring") if d.get("kind") == "PodMonitor"]
    name = f"DaemonSet/{ds['metadata']['name']}"

    def agent_of(doc: dict) -> dict:
        return next(c for c, _, _ in all_containers(doc["spec"]["template"]["spec"]) if is_drainshim(c, "node"))

    # The DaemonSet as it was before issue 29: the same, plus its port.
    old = copy.deepcopy(ds)
    agent_of(old)["ports"] = [{"name": "drainshim-http", "containerPort": 15098}]
    agent_of(old)["readinessProbe"]["httpGet"]["port"] = "drainshim-http"

    print("== rollout: hostNetwork + surge + a declared port")
    expect(surge_port_conflicts(ds) == [], f"the shipped {name} (hostNetwork, maxSurge {max_surge(ds)}, no port): accepted",
           "\n".join(surge_port_conflicts(ds)))
    msgs = surge_port_conflicts(old)
    expect(len(msgs) == 1 and name in msgs[0] and "15098" in msgs[0] and "NodePorts" in msgs[0] and "Pending" in msgs[0],
           f"the old {name} (containerPort 15098 named drainshim-http): rejected, naming the workload, the port and why",
           "\n".join(msgs) or "no message")

    def variant(doc: dict, edit) -> dict:
        d = copy.deepcopy(doc)
        edit(d)
        return d

    def set_surge(v):
        return lambda d: d["spec"]["updateStrategy"]["rollingUpdate"].__setitem__("maxSurge", v)

    expect(surge_port_conflicts(variant(old, set_surge(0))) == [], "the old port with maxSurge 0: accepted (nothing to schedule beside the old pod)")
    expect(surge_port_conflicts(variant(old, set_surge("0%"))) == [], "the old port with maxSurge 0%: accepted")
    expect(len(surge_port_conflicts(variant(old, set_surge("10%")))) == 1, "the old port with maxSurge 10% (rounded up to 1): rejected")
    expect(surge_port_conflicts(variant(old, lambda d: d["spec"].__setitem__("updateStrategy", {"type": "OnDelete"}))) == [],
           "the old port with updateStrategy OnDelete: accepted")
    no_hostnet = variant(ds, lambda d: d["spec"]["template"]["spec"].__setitem__("hostNetwork", False))
    expect(surge_port_conflicts(variant(no_hostnet, lambda d: agent_of(d).__setitem__("ports", [{"containerPort": 15098}]))) == [],
           "a containerPort without hostNetwork (no host port): accepted")
    msgs = surge_port_conflicts(variant(no_hostnet, lambda d: agent_of(d).__setitem__("ports", [{"containerPort": 15098, "hostPort": 15098}])))
    expect(len(msgs) == 1 and "host port 15098" in msgs[0], "an explicit hostPort without hostNetwork: rejected", "\n".join(msgs))
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "hostnet"},
           "spec": {"template": {"spec": {"hostNetwork": True, "containers": [{"name": "app", "image": "app", "ports": [{"containerPort": 8080}]}]}}}}
    msgs = surge_port_conflicts(dep)
    expect(len(msgs) == 1 and "Deployment/hostnet" in msgs[0] and "maxSurge 25%" in msgs[0],
           "a hostNetwork Deployment with a port and the default strategy (maxSurge 25%): rejected", "\n".join(msgs))
    expect(surge_port_conflicts(variant(dep, lambda d: d["spec"].__setitem__("strategy", {"type": "Recreate"}))) == [],
           "the same Deployment with strategy Recreate: accepted")

    print("== scrape: the node agent without a declared port")
    listen = host_port(shim_settings(agent_of(ds)).get("listen", "0.0.0.0:15098"))[1]

    def scrapes(doc: dict, monitors: list[dict]) -> list[str]:
        t = doc["spec"]["template"]
        pod = ScrapePod(name, doc["metadata"].get("namespace") or "", t.get("metadata") or {}, t["spec"], listen, agent=True)
        ck = Checker()
        check_scrapes(ck, monitors, [pod], all_pods=False)
        return ck.failures

    fails = scrapes(ds, pms)
    expect(not fails, f"the shipped {name} and PodMonitors: scraped once at <pod IP>:{listen}, IPv4 and IPv6, with honorLabels", "\n".join(fails))
    fails = scrapes(old, pms)
    expect(any("exactly once" in f for f in fails), f"the old {name} (drainshim-http declared) and the shipped PodMonitors: scraped twice, rejected",
           "\n".join(fails))

    def by_port_number(pm: dict) -> dict:
        pm = copy.deepcopy(pm)
        for ep in pm["spec"].get("podMetricsEndpoints") or []:
            if ep.pop("relabelings", None) is not None:
                ep["portNumber"] = listen
        return pm

    fails = scrapes(ds, [by_port_number(pm) for pm in pms])
    expect(any("no PodMonitor scrapes it" in f for f in fails),
           f"portNumber: {listen} instead of the relabelings: scrapes nothing (it filters declared ports only), rejected", "\n".join(fails))
    fails = scrapes(ds, [variant(pm, lambda d: [ep.__setitem__("honorLabels", False) for ep in d["spec"]["podMetricsEndpoints"]]) for pm in pms])
    expect(any("honorLabels" in f for f in fails), "the node PodMonitor without honorLabels: rejected", "\n".join(fails))
    # The address rewrite alone (selector {}, no keep): the app pods of base/
    # would be scraped at :15098, where nothing serves.
    apps = [ScrapePod(f"base: {n}", (d.get("metadata") or {}).get("namespace") or "", m, s, None)
            for d in load("base") for n, m, s in pod_specs(d)]

    def rewrite_only(d: dict) -> None:
        d["spec"]["selector"] = {}
        d["spec"]["namespaceSelector"] = {"any": True}
        for ep in d["spec"].get("podMetricsEndpoints") or []:
            if "relabelings" in ep:
                ep["relabelings"] = [r for r in ep["relabelings"] if str(r.get("action", "replace")).lower() != "keep"]

    ck = Checker()
    check_scrapes(ck, [variant(pm, rewrite_only) for pm in pms], apps, all_pods=False)
    expect(bool(apps) and any("where no drainshim serves" in f for f in ck.failures),
           "the node PodMonitor's address rewrite alone (selector {}, every namespace, no keep): scrapes base/'s app, rejected", "\n".join(ck.failures))

    print("== labels: what the sidecar monitor trusts (prometheus-operator, and a real Prometheus)")
    side_pm = next(pm for pm in pms if pm["metadata"]["name"] == "drainshim")
    sidecar = next(ScrapePod(f"sidecar: {n}", (d.get("metadata") or {}).get("namespace") or "", m, sp,
                             host_port(shim_settings(next(c for c, _, _ in all_containers(sp) if is_drainshim(c, "sidecar"))).get("listen", "127.0.0.1:15099"))[1])
                   for d in load("sidecar") for n, m, sp in pod_specs(d)
                   if any(is_drainshim(c, "sidecar") for c, _, _ in all_containers(sp)))

    def old_sidecar_monitor(d: dict) -> None:
        for ep in d["spec"]["podMetricsEndpoints"]:
            ep["honorLabels"] = True
            ep.pop("relabelings", None)
            ep.pop("metricRelabelings", None)

    old_pm = variant(side_pm, old_sidecar_monitor)
    ck = Checker()
    check_scrapes(ck, [side_pm], [sidecar], all_pods=False)
    expect(not ck.failures, f"the shipped PodMonitor/drainshim on {sidecar.where}: no honorLabels, namespace/pod from the pod", "\n".join(ck.failures))
    ck = Checker()
    check_scrapes(ck, [old_pm], [sidecar], all_pods=False)
    expect(any("honorLabels: true" in f for f in ck.failures) and any("its relabelings set" in f for f in ck.failures),
           "the old PodMonitor/drainshim (honorLabels: true, no relabelings): rejected", "\n".join(ck.failures))
    ck = Checker()
    check_label_trust(ck, [old_pm], {"drainshim-system"})
    expect(any("honorLabels: true on namespaceSelector" in f for f in ck.failures),
           "honorLabels: true on a monitor of every namespace: rejected", "\n".join(ck.failures))
    ck = Checker()
    check_label_trust(ck, pms, {ds["metadata"].get("namespace") or ""})
    expect(not ck.failures, "the shipped monitors: honorLabels only in the agent's namespace", "\n".join(ck.failures))
    node_pm = next(pm for pm in pms if pm["metadata"]["name"] != "drainshim")
    ck = Checker()
    check_label_trust(ck, [variant(node_pm, lambda d: d["spec"].__setitem__("namespaceSelector", {"any": True}))], {"drainshim-system"})
    expect(len(ck.failures) == 1, "the node monitor on every namespace (its old namespaceSelector): rejected", "\n".join(ck.failures))
    wrong = forged_label_run(prometheus, side_pm, sidecar)
    expect(not wrong, f"the shipped PodMonitor/drainshim, an exporter claiming {FORGED}, real Prometheus: the pod's own namespace/pod stored",
           "\n".join(wrong))
    no_drop = variant(side_pm, lambda d: [ep.pop("metricRelabelings", None) for ep in d["spec"]["podMetricsEndpoints"]])
    wrong = forged_label_run(prometheus, no_drop, sidecar)
    expect(any("survived as ['exported_namespace', 'exported_pod']" in w for w in wrong),
           "the shipped PodMonitor/drainshim without its metricRelabelings: the forged labels stored as exported_*, rejected", "\n".join(wrong))
    wrong = forged_label_run(prometheus, old_pm, sidecar)
    expect(any("want the pod's own" in w for w in wrong),
           f"the old PodMonitor/drainshim, the same exporter, real Prometheus: the forged {FORGED} stored, rejected", "\n".join(wrong))

    print("== docs: known contradictions of the manifests and `drainshim node --help`")
    ru = (ds["spec"].get("updateStrategy") or {}).get("rollingUpdate") or {}
    facts = DocFacts(max_surge=str(ru.get("maxSurge", 0)), max_unavailable=str(ru.get("maxUnavailable", 1)),
                     host_paths=[v["hostPath"].get("path") for v in ds["spec"]["template"]["spec"].get("volumes") or [] if "hostPath" in v],
                     handover="handover-socket" in shim_settings(agent_of(ds)),
                     guard_help=guard_documented(node_help()))
    for what, text in OLD_DOCS.items():
        found = doc_contradictions({what: text}, facts)
        expect(len(found) == OLD_DOCS_CAUGHT[what], f"{what}: {len(found)} contradiction(s) caught, want {OLD_DOCS_CAUGHT[what]}", "\n".join(found))
    found = doc_contradictions(TRUE_DOCS, facts)
    expect(not found, "the same words where they are true: none caught", "\n".join(found))

    print("== adopt: the sidecar Component on workloads from outside the repo, and broken copies of it")
    cases = ([(c, check_adoption, "sidecar") for c in ADOPTION_CASES]
             + [(c, check_adoption, "native-sidecar") for c in NATIVE_ADOPTION_CASES]
             + [(c, check_istio_adoption, "sidecar-istio") for c in ISTIO_ADOPTION_CASES])
    for (what, detail, edit, workloads), run, name in cases:
        with tempfile.TemporaryDirectory(prefix="drainshim-component-") as tmp:
            # The Components, side by side as in deploy/components (the
            # variants include ../sidecar/app); only one is edited.
            shutil.copytree(SIDECAR_COMPONENT, Path(tmp) / "sidecar")
            shutil.copytree(NATIVE_SIDECAR_COMPONENT, Path(tmp) / "native-sidecar")
            shutil.copytree(SIDECAR_ISTIO_COMPONENT, Path(tmp) / "sidecar-istio")
            component = Path(tmp) / name
            if edit is not None:
                edit(component)
            ck = Checker()
            with contextlib.redirect_stdout(io.StringIO()):  # each check's own lines; the verdict is below
                run(ck, kubectl, component, envoy_cache, SCHEMA_VERSIONS, workloads)
        if detail is None:
            expect(not ck.failures, what, "\n".join(ck.failures))
        else:
            expect(any(detail in f for f in ck.failures), what, "\n".join(ck.failures) or "no failure")

    bad = [w for ok, w in results if not ok]
    print(f"== selftest: {len(results) - len(bad)} of {len(results)} passed")
    return 1 if bad else 0


# ------------------------------------------------------------------- main

def run_check(rendered: Path, envoy_cache: Path, design: Path | None, prometheus: Path, kubectl: str) -> int:
    import kubernetes_validate

    ck = Checker()
    versions = SCHEMA_VERSIONS + [v for v in [kubernetes_validate.latest_version()] if v not in SCHEMA_VERSIONS]
    files = sorted(rendered.glob("*.yaml"))
    if not files:
        print(f"check_deploy: nothing rendered in {rendered}", file=sys.stderr)
        return 1
    skipped: list[str] = []
    listen_ports: dict[str, int] = {}
    scrape_pods: list[ScrapePod] = []
    monitoring_docs: list[dict] = []
    rendered_docs = {f.stem: [d for d in yaml.safe_load_all(f.read_text()) if d] for f in files}
    # First the node agents, wherever they are rendered: a workload in one
    # overlay is checked against the agent of another (the agent is applied
    # once per cluster, workloads each on their own).
    print("== node agents (privileges, budget, probe, namespace)")
    agents: list[Agent] = []
    for overlay, docs in rendered_docs.items():
        found = [a for a in (check_agent(ck, overlay, d, docs) for d in docs) if a is not None]
        if overlay in OVERLAYS_WITH_AGENT:
            ck.check("node", len(found) == 1, f"{overlay}: {len(found)} `drainshim node` DaemonSets, want 1")
        agents += found
    base_apps = base_app_containers(rendered_docs.get("base", []))
    print("== per-pod checks (budget, wiring, envoy)")
    for overlay, docs in rendered_docs.items():
        ck.check("schema", bool(docs), f"{overlay}: renders nothing")
        skipped += check_schema(ck, overlay, docs, versions)
        configmaps = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ConfigMap"}
        with_shim = with_node = 0
        for d in docs:
            check_rollout(ck, overlay, d)
            agent = next((a for a in agents if a.where == f"{overlay}: {d.get('kind')}/{(d.get('metadata') or {}).get('name')}"), None)
            for name, meta, spec in pod_specs(d):
                where = f"{overlay}: {name}"
                ns = (d.get("metadata") or {}).get("namespace") or ""
                check_no_privileged(ck, overlay, name, spec)
                if check_pod(ck, overlay, name, meta, spec, configmaps, envoy_cache, base_apps, listen_ports):
                    with_shim += 1
                    scrape_pods.append(ScrapePod(where, ns, meta, spec, listen_ports.get(where), judge=where in listen_ports))
                elif agent is not None:
                    scrape_pods.append(ScrapePod(where, ns, meta, spec, agent.listen_port, agent=True))
                elif any(is_drainshim(c, "node") for c, _, _ in all_containers(spec)):
                    scrape_pods.append(ScrapePod(where, ns, meta, spec, None, judge=False))  # its own check failed
                else:
                    if check_node_workload(ck, overlay, name, meta, spec, agents, configmaps, envoy_cache, base_apps):
                        with_node += 1
                    scrape_pods.append(ScrapePod(where, ns, meta, spec, None))
        if overlay in OVERLAYS_WITH_SHIM:
            ck.check("wiring", with_shim > 0, f"{overlay}: no pod with a drainshim sidecar")
        if overlay in OVERLAYS_WITH_NODE_WORKLOAD:
            ck.check("wiring", with_node > 0, f"{overlay}: no pod with the node-mode preStop")
        check_services(ck, overlay, docs)
        check_services_reach_proxy(ck, overlay, docs)
        if overlay in OVERLAYS_WITH_ISTIO_FAILOPEN or any(d.get("kind") == "Sidecar" for d in docs):
            check_istio_failopen(ck, overlay, docs, base_apps)
            check_sidecar_merge(ck, overlay, docs)
        if overlay == "monitoring":
            monitoring_docs = docs

    print("== the sidecar Component on workloads from outside the repo (deploy/components/sidecar)")
    scrape_pods += check_adoption(ck, kubectl, SIDECAR_COMPONENT, envoy_cache, versions)
    print("== its native-sidecar variant on the same workloads (deploy/components/native-sidecar)")
    scrape_pods += check_adoption(ck, kubectl, NATIVE_SIDECAR_COMPONENT, envoy_cache, versions)
    print("== its Istio variant on a workload from outside the repo, in a namespace with a default Sidecar (deploy/components/sidecar-istio)")
    check_istio_adoption(ck, kubectl, SIDECAR_ISTIO_COMPONENT, envoy_cache, versions)

    print("== monitoring")
    ck.check("rules", bool(monitoring_docs), "deploy/monitoring rendered nothing")
    rules = check_rules_sync(ck, monitoring_docs)
    check_scrapes(ck, monitoring_docs, scrape_pods)
    pms = [d for d in monitoring_docs if d.get("kind") == "PodMonitor"]
    check_label_trust(ck, pms, {a.namespace for a in agents})
    # Forged labels, in a real Prometheus: each monitor that scrapes sidecars,
    # against an exporter in one of the pods it scrapes.
    sidecars = [p for p in scrape_pods if p.judge and p.want_port is not None and not p.agent]
    for pm in pms:
        pod = next((p for p in sidecars if podmonitor_scrapes(pm, p, SIM_POD_IPS[0], SIM_NODE_IPS[0])), None)
        if pod is None:
            continue
        wrong = forged_label_run(prometheus, pm, pod)
        if ck.check("wiring", not wrong, f"PodMonitor/{pm['metadata']['name']}: an exporter in {pod.where} claiming "
                                         f"{FORGED}, in a real Prometheus: " + "; ".join(wrong)):
            print(f"  PodMonitor/{pm['metadata']['name']}: an exporter in {pod.where} claiming {FORGED}: "
                  "stored with the pod's own namespace and pod (real Prometheus)")
    dashboard = check_dashboard(ck, MONITORING / "dashboard.json")
    rendered_dash = [d for d in monitoring_docs if d.get("kind") == "ConfigMap" and "dashboard.json" in (d.get("data") or {})]
    ck.check("dashboard", len(rendered_dash) == 1, "the dashboard ConfigMap is not rendered by deploy/monitoring")
    # What the binary registers is checked against docs/design.md by a Rust
    # test (tests/it/contract.rs); here rules and dashboards are checked
    # against the document.
    contract = contract_metrics(design)
    print(f"  contract: {len(contract)} metric series names from {design}")
    if dashboard is not None:
        check_metrics(ck, rules, dashboard, contract, contract)
        n = sum(len(p.get("targets", [])) for p in dashboard_panels(dashboard))
        print(f"  dashboard.json: {len(list(dashboard_panels(dashboard)))} panels, {n} queries")

    print("== docs (node mode, against the rendered agent and `drainshim node --help`)")
    check_docs(ck, agents)

    print("== summary")
    print(f"  schema versions: {', '.join(versions)} (strict)")
    for area in ("schema", "budget", "wiring", "node", "rollout", "envoy", "adopt", "rules", "metrics", "dashboard", "docs"):
        print(f"  {area:9} {ck.counts.get(area, 0)} passed")
    print(f"  skipped (CRDs, no schema in kubernetes-validate; checked via rules.yaml, the PodMonitors run on the rendered pods, the Istio checks): {len(skipped)}")
    for s in skipped:
        print(f"    - {s}")
    if ck.failures:
        print(f"\n{len(ck.failures)} FAILED:", file=sys.stderr)
        for f in ck.failures:
            print(f"  {f}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--rendered", type=Path, required=True)
    c.add_argument("--envoy-cache", type=Path, required=True)
    c.add_argument("--prometheus", type=Path, required=True, help="the prometheus binary (forged-label runs)")
    c.add_argument("--kubectl", default="kubectl", help="kubectl, for `kubectl kustomize` of the adopter's workloads")
    c.add_argument("--design", type=Path,
                   default=Path(os.environ.get("DRAINSHIM_DESIGN", ROOT / "docs" / "design.md")))
    sub.add_parser("sync-rules")
    st = sub.add_parser("selftest")
    st.add_argument("--rendered", type=Path, required=True)
    st.add_argument("--prometheus", type=Path, required=True, help="the prometheus binary (forged-label runs)")
    st.add_argument("--envoy-cache", type=Path, required=True)
    st.add_argument("--kubectl", default="kubectl", help="kubectl, for `kubectl kustomize` of the adopter's workloads")
    a = ap.parse_args()
    if a.cmd == "sync-rules":
        sync_rules()
        return 0
    if a.cmd == "selftest":
        if not a.prometheus.is_file():
            raise SystemExit(f"check_deploy: {a.prometheus} not found (scripts/fetch-prometheus.sh)")
        return run_selftest(a.rendered, a.prometheus, a.envoy_cache, a.kubectl)
    if not a.design.is_file():
        raise SystemExit(f"check_deploy: {a.design} not found (the metrics contract)")
    if not a.prometheus.is_file():
        raise SystemExit(f"check_deploy: {a.prometheus} not found (scripts/fetch-prometheus.sh)")
    return run_check(a.rendered, a.envoy_cache, a.design, a.prometheus, a.kubectl)


if __name__ == "__main__":
    sys.exit(main())
