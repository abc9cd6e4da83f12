#!/usr/bin/env python3
"""Checks the deployment files in deploy/ (run by scripts/check-deploy.sh).

    check_deploy.py check --rendered DIR --envoy-cache DIR
        Every check below on the kustomize output in DIR (one NAME.yaml per
        base or overlay). Prints what it checked; exits 1 on any failure.
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
             in node metadata; a PodMonitor scrapes the agent, honorLabels
  node       the `drainshim node` DaemonSet: hostPID, hostNetwork, exactly
             SYS_ADMIN + SYS_PTRACE, root (for the capabilities), read-only
             root, seccomp RuntimeDefault, tolerations for every node, a
             Pod Security "privileged" namespace, /readyz probe, metrics port
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
  rules      prometheusrule.yaml carries exactly the groups of rules.yaml
  metrics    every metric queried by the rules and the dashboard is in the
             contract (docs/design.md), or recorded by rules.yaml
  dashboard  the dashboard JSON parses and every panel has a query
Only PyYAML is needed besides the standard library (and kubernetes-validate
for the schema check).
"""

from __future__ import annotations

import argparse
import copy
import ipaddress
import json
import os
import re
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
# rules.yaml (which promtool checks and unit-tests), and the PodMonitor's
# scrape port must be a port the shim containers declare.
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


def check_app_unchanged(ck: Checker, where: str, spec: dict, s: dict[str, str] | None, base_apps: dict[str, dict]) -> None:
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
    port = app_port(base_apps)
    if s is None:
        print(f"  {where}: app unchanged (port {port})")
        return
    gh, gp = host_port(s["guard-listen"])
    ck.check("wiring", gp == GUARD_PORT, f"{where}: --guard-listen port {gp}, want {GUARD_PORT} (the guard's own port; the app keeps its own)")
    if "guard-upstream" in s:
        uh, up = host_port(s["guard-upstream"])
        ck.check("wiring", up == port and is_loopback(uh),
                 f"{where}: --guard-upstream {s['guard-upstream']}, want 127.0.0.1:{port}, the app's own port in deploy/base")
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


def check_istio_failopen(ck: Checker, overlay: str, docs: list[dict], base_apps: dict[str, dict]) -> None:
    """Under Istio: a Sidecar points the inbound cluster of the app's port at
    the guard, and an EnvoyFilter adds the app as priority 1 and the retry."""
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
              configmaps: dict[str, dict], envoy_cache: Path, base_apps: dict[str, dict]) -> bool:
    """All per-pod checks; returns whether the pod has a drainshim sidecar."""
    where = f"{overlay}: {name}"
    shims = [(c, init, side) for c, init, side in all_containers(spec) if is_drainshim(c, "sidecar")]
    if not shims:
        return False
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
        check_app_unchanged(ck, where, spec, s, base_apps)

    # --- Envoy (plain) ------------------------------------------------------
    for c, init, side in all_containers(spec):
        if "envoyproxy/envoy" in c.get("image", ""):
            check_envoy(ck, where, c, spec, s, d, guard, configmaps, envoy_cache, app_port(base_apps))

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
    """(the -c path, the bootstrap text from the ConfigMap mounted there)."""
    ef = envoy_args(c)
    cpath = ef.get("-c") or ef.get("--config-path")
    if cpath is None:
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
        vargs = [a if a != cpath else str(cfg) for a in args]
        r = subprocess.run([str(binary), "--mode", "validate", *vargs, "-l", "error"],
                           capture_output=True, text=True, timeout=120)
    ck.check("envoy", r.returncode == 0,
             f"{where}: envoy {version} --mode validate failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    print(f"  {where}: envoy {version} --mode validate {' '.join(vargs[2:])}: {'OK' if r.returncode == 0 else 'FAILED'}")


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
    # Names of the container ports serving --listen (what a PodMonitor scrapes).
    metrics_ports: set[str]


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
    probe_port = (ports.get(rp.get("port")) or {}).get("containerPort", rp.get("port"))
    ck.check("node", rp.get("path") == "/readyz" and probe_port == listen_port,
             f"{where}: readinessProbe must be httpGet /readyz on --listen port {listen_port}, got {rp.get('path')} on {rp.get('port')}")
    ck.check("node", not is_loopback(listen_host), f"{where}: --listen {listen_host} is loopback: the probe and Prometheus cannot reach it")
    metrics_ports = {n for n, pt in ports.items() if pt.get("containerPort") == listen_port}
    ck.check("node", "drainshim-http" in metrics_ports,
             f"{where}: --listen port {listen_port} must be declared as a container port named drainshim-http (the PodMonitor scrapes that name)")
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
          f"caps {sorted(added)}; pod listener :{pod_listen}; metrics :{listen_port} ({', '.join(sorted(metrics_ports))})")
    return Agent(where=where, namespace=ns or "", labels=(doc["spec"]["template"].get("metadata") or {}).get("labels") or {},
                 timers=t, settings=s, listen_port=listen_port, pod_listen_port=pod_listen, pod_admin_port=pod_admin,
                 metrics_ports=metrics_ports)


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
    and registered in src/metrics.rs. The dashboard sticks to the contract."""
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


def check_podmonitor(ck: Checker, docs: list[dict], shim_ports: set[str], agents: list[Agent]) -> None:
    pms = [d for d in docs if d.get("kind") == "PodMonitor"]
    agent_ports = {n for a in agents for n in a.metrics_ports}
    for pm in pms:
        for ep in pm["spec"].get("podMetricsEndpoints", []):
            ck.check("wiring", ep.get("port") in shim_ports | agent_ports,
                     f"PodMonitor/{pm['metadata']['name']} scrapes port {ep.get('port')!r}, which no drainshim container declares ({sorted(shim_ports | agent_ports)})")
    # Each node agent is scraped, keeping the namespace/pod labels of the pods
    # it reports for.
    for a in agents:
        scraping = []
        for pm in pms:
            nsel = pm["spec"].get("namespaceSelector") or {}
            ns_ok = nsel.get("any") is True or a.namespace in (nsel.get("matchNames") or [])
            if not ns_ok or not selects(pm["spec"].get("selector") or {}, a.labels):
                continue
            scraping += [(pm, ep) for ep in pm["spec"].get("podMetricsEndpoints", []) if ep.get("port") in a.metrics_ports]
        if ck.check("wiring", bool(scraping), f"{a.where}: no PodMonitor scrapes its port {sorted(a.metrics_ports)} in namespace {a.namespace}"):
            for pm, ep in scraping:
                ck.check("wiring", ep.get("honorLabels") is True,
                         f"PodMonitor/{pm['metadata']['name']}: scrapes {a.where} without honorLabels: true; every pod's namespace/pod labels would become exported_namespace/exported_pod")
            print(f"  {a.where}: scraped by " + ", ".join(f"PodMonitor/{pm['metadata']['name']} port {ep.get('port')} (honorLabels {ep.get('honorLabels')})" for pm, ep in scraping))


# ------------------------------------------------------------------- main

def run_check(rendered: Path, envoy_cache: Path, design: Path | None) -> int:
    import kubernetes_validate

    ck = Checker()
    versions = SCHEMA_VERSIONS + [v for v in [kubernetes_validate.latest_version()] if v not in SCHEMA_VERSIONS]
    files = sorted(rendered.glob("*.yaml"))
    if not files:
        print(f"check_deploy: nothing rendered in {rendered}", file=sys.stderr)
        return 1
    skipped: list[str] = []
    shim_ports: set[str] = set()
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
            for name, meta, spec in pod_specs(d):
                check_no_privileged(ck, overlay, name, spec)
                if check_pod(ck, overlay, name, meta, spec, configmaps, envoy_cache, base_apps):
                    with_shim += 1
                    for c, _, _ in all_containers(spec):
                        if is_drainshim(c, "sidecar"):
                            shim_ports.update(p.get("name") for p in c.get("ports") or [])
                elif check_node_workload(ck, overlay, name, meta, spec, agents, configmaps, envoy_cache, base_apps):
                    with_node += 1
        if overlay in OVERLAYS_WITH_SHIM:
            ck.check("wiring", with_shim > 0, f"{overlay}: no pod with a drainshim sidecar")
        if overlay in OVERLAYS_WITH_NODE_WORKLOAD:
            ck.check("wiring", with_node > 0, f"{overlay}: no pod with the node-mode preStop")
        check_services(ck, overlay, docs)
        if overlay in OVERLAYS_WITH_ISTIO_FAILOPEN or any(d.get("kind") == "Sidecar" for d in docs):
            check_istio_failopen(ck, overlay, docs, base_apps)
        if overlay == "monitoring":
            monitoring_docs = docs

    print("== monitoring")
    ck.check("rules", bool(monitoring_docs), "deploy/monitoring rendered nothing")
    rules = check_rules_sync(ck, monitoring_docs)
    check_podmonitor(ck, monitoring_docs, shim_ports, agents)
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

    print("== summary")
    print(f"  schema versions: {', '.join(versions)} (strict)")
    for area in ("schema", "budget", "wiring", "node", "envoy", "rules", "metrics", "dashboard"):
        print(f"  {area:9} {ck.counts.get(area, 0)} passed")
    print(f"  skipped (CRDs, no schema in kubernetes-validate; checked via rules.yaml/PodMonitor port): {len(skipped)}")
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
    c.add_argument("--design", type=Path,
                   default=Path(os.environ.get("DRAINSHIM_DESIGN", ROOT / "docs" / "design.md")))
    sub.add_parser("sync-rules")
    a = ap.parse_args()
    if a.cmd == "sync-rules":
        sync_rules()
        return 0
    if not a.design.is_file():
        raise SystemExit(f"check_deploy: {a.design} not found (the metrics contract)")
    return run_check(a.rendered, a.envoy_cache, a.design)


if __name__ == "__main__":
    sys.exit(main())
