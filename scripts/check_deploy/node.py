"""Node mode: the `drainshim node` DaemonSet (Agent: privileges, budget,
probe and metrics port, namespace admission) and the workloads whose
preStop is an httpGet to its pod listener (their grace, hooks, Envoy
identity and stream guard); no privileged: true anywhere.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import yaml

from .config import AGENT_CAPABILITIES, GUARD_PORT, KUBE_GRACE_DEFAULT
from .checker import Checker
from .pods import (
    all_containers, host_port, is_drainshim, is_loopback, prestop_exec, prestop_http, shim_settings,
)
from .pod_checks import (
    app_port, binary_check, budget_seconds, check_app_unchanged, check_envoy, envoy_args, envoy_bootstrap,
)


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
