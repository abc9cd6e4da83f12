"""Rollouts: no surging rolling update of a DaemonSet or Deployment needs a
host port twice on one node (the surge pod would stay Pending).
"""

from __future__ import annotations

from .checker import Checker
from .pods import all_containers, is_drainshim


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
