"""Per-pod checks of a pod with a drainshim sidecar: the app unchanged, the
budget (`drainshim sidecar --check`), install and preStop hooks, probes,
Envoy's fail-open bootstrap (validated with the real Envoy), Istio's
Sidecar/EnvoyFilter pair and drain timers, and Services' target ports.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import yaml

from .config import (
    DRAINSHIM_BIN, GUARD_PORT, ISTIO_TERMINATION_DRAIN_DEFAULT, KUBE_GRACE_DEFAULT, MAX_CONNECTION_WINDOW,
    MAX_STREAM_WINDOW,
)
from .checker import Checker
from .durations import duration
from .pods import (
    all_containers, as_kubelet_runs, flags, host_port, is_drainshim, is_loopback, mounts_at, pod_specs,
    prestop_exec, prestop_http, shim_settings,
)


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
            # The hook's effective timeout, its default included, as the
            # binary itself reads its flags and the container's env.
            hook = {"args": cmd[1:], "env": c.get("env")}
            eff = binary_check(ck, "budget", f"{where}: {cname}: preStop", "prestop", hook)
            if eff is not None:
                timeout = duration(eff["timeout"])
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
