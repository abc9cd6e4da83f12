"""The Istio variant of the sidecar Component (deploy/components/sidecar-istio)
on a workload from outside the repo (ADOPTER_ISTIO), and the merge of a
workload-selected Sidecar with its namespace's default Sidecar. Then the
same workload through `drainshim inject --mode istio` and the mesh's routing
objects (`drainshim istio-routing`, deploy/istio-routing/): the Component's
pod, and an inbound cluster real Envoy accepts once Istio's merge is done.
"""

from __future__ import annotations

import copy
import json
import subprocess
import tempfile
from pathlib import Path

import yaml

from .config import DEPLOY, DRAINSHIM_BIN
from .checker import Checker
from .pods import all_containers, host_port, is_drainshim, pod_specs, shim_settings
from .pod_checks import base_app_containers, check_istio_failopen, check_pod, pod_app_port
from .node import check_no_privileged
from .sidecar import comparable_pod, render_adopter, run_inject
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


ISTIO_ROUTING = DEPLOY / "istio-routing"
# The ports deploy/istio-routing/routing.yaml is written for.
ROUTING_PORTS = "8080,9090,50051"
APP_PORT_LABEL = "drainshim.io/app-port"


def istio_routing(ports: str, namespace: str = "istio-system") -> tuple[list[dict] | None, str, str]:
    """`drainshim istio-routing --ports`: its objects, its output, its error."""
    try:
        r = subprocess.run([str(DRAINSHIM_BIN), "istio-routing", "--ports", ports, "--namespace", namespace],
                           capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise SystemExit(f"check_deploy: cannot run {DRAINSHIM_BIN} ({e}): build it first (cargo build)")
    if r.returncode != 0:
        return None, "", r.stderr.strip()
    return [d for d in yaml.safe_load_all(r.stdout) if d], r.stdout, ""


def proto_merge(dst: dict, src: dict) -> dict:
    """What Istio's EnvoyFilter MERGE does to a message (proto.Merge): message
    fields merge, repeated fields append, scalars and oneofs are replaced."""
    out = copy.deepcopy(dst)
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = proto_merge(out[k], v)
        elif isinstance(v, list) and isinstance(out.get(k), list):
            out[k] = out[k] + copy.deepcopy(v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def istio_inbound_cluster(port: int) -> dict:
    """Istio's inbound cluster of a port its Services target, as istiod
    writes it with the mesh defaults (inboundTrafficPolicy PASSTHROUGH):
    ORIGINAL_DST to the connection's own destination, from 127.0.0.6 so its
    iptables rules let it through, CLUSTER_PROVIDED, Istio's circuit breaker
    thresholds."""
    big = 4294967295
    return {
        "name": f"inbound|{port}||",
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "10s",
        "cleanup_interval": "315360000s",
        "common_lb_config": {},
        "alt_stat_name": f"inbound|{port}||;",
        "upstream_bind_config": {"source_address": {"address": "127.0.0.6", "port_value": 0}},
        "circuit_breakers": {"thresholds": [{"max_connections": big, "max_pending_requests": big,
                                             "max_requests": big, "max_retries": big}]},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}},
    }


def check_routing(ck: Checker, where: str, routing: list[dict], meta: dict, spec: dict, port: int) -> tuple[dict, dict] | None:
    """The pod's routing object: selected by its labels, Istio's inbound
    cluster of its app port made the guard (priority 0, --guard-listen) and
    the app (priority 1), the route's retry to the other priority. Returns
    the cluster and route patches."""
    area = "wiring"
    labels = meta.get("labels") or {}
    mine = [d for d in routing if d.get("kind") == "EnvoyFilter"
            and selects({"matchLabels": ((d.get("spec") or {}).get("workloadSelector") or {}).get("labels") or {"-": "-"}}, labels)]
    if not ck.check(area, len(mine) == 1,
                    f"{where}: {len(mine)} routing EnvoyFilters select the pod ({labels}); want one, for its app port {port}"):
        return None
    f = mine[0]
    shims = [shim_settings(c) for c, _, _ in all_containers(spec) if is_drainshim(c, "sidecar")]
    guard = host_port(shims[0]["guard-listen"]) if shims and "guard-listen" in shims[0] else None
    cluster, route = None, None
    for cp in (f.get("spec") or {}).get("configPatches") or []:
        m = cp.get("match") or {}
        if m.get("context") != "SIDECAR_INBOUND" or (cp.get("patch") or {}).get("operation") != "MERGE":
            continue
        v = (cp.get("patch") or {}).get("value") or {}
        if cp.get("applyTo") == "CLUSTER" and (m.get("cluster") or {}).get("portNumber") == port:
            cluster = v
        if cp.get("applyTo") == "HTTP_ROUTE" and (m.get("routeConfiguration") or {}).get("portNumber") == port:
            route = v
    name = f"EnvoyFilter/{f['metadata']['name']}"
    if not ck.check(area, cluster is not None and route is not None,
                    f"{where}: {name} has no MERGE of Istio's inbound CLUSTER and HTTP_ROUTE of port {port}"):
        return None
    ck.check(area, cluster.get("type") == "STATIC" and cluster.get("lb_policy") not in (None, "ROUND_ROBIN", "CLUSTER_PROVIDED"),
             f"{where}: {name} leaves Istio's ORIGINAL_DST cluster as it is (type {cluster.get('type')}, lb_policy "
             f"{cluster.get('lb_policy')}): want STATIC and a non-zero policy, which MERGE can set over CLUSTER_PROVIDED")
    ck.check(area, "circuit_breakers" not in cluster,
             f"{where}: {name} merges circuit_breakers: its thresholds are appended after Istio's, and Envoy reads the first "
             f"per priority, so it would do nothing (Istio's already allow 2^32-1 retries)")
    la = cluster.get("load_assignment") or {}
    ck.check(area, la.get("cluster_name") == f"inbound|{port}||",
             f"{where}: {name}'s load_assignment names {la.get('cluster_name')!r}, want inbound|{port}||")
    prio = {int(g.get("priority", 0)): [(ep["endpoint"]["address"]["socket_address"]["address"],
                                          ep["endpoint"]["address"]["socket_address"]["port_value"])
                                         for ep in g.get("lb_endpoints") or []]
            for g in la.get("endpoints") or []}
    ck.check(area, prio.get(0) == [guard],
             f"{where}: {name}'s priority 0 is {prio.get(0)}, want the guard's --guard-listen {guard}")
    ck.check(area, prio.get(1) == [("127.0.0.1", port)],
             f"{where}: {name}'s priority 1 is {prio.get(1)}, want the app on 127.0.0.1:{port}")
    ck.check(area, bool(cluster.get("health_checks")) and bool(cluster.get("outlier_detection")),
             f"{where}: {name} has no health check or outlier detection of the guard: a dead guard keeps its traffic")
    retry = (route.get("route") or {}).get("retry_policy") or {}
    ck.check(area, (retry.get("retry_priority") or {}).get("name") == "envoy.retry_priorities.previous_priorities"
             and "connect-failure" in str(retry.get("retry_on")),
             f"{where}: {name}'s inbound route has no retry to the other priority on connect-failure")
    print(f"  {where}: {name} (selects {APP_PORT_LABEL}={labels.get(APP_PORT_LABEL)}): Istio's inbound|{port}|| -> "
          f"guard {guard[0]}:{guard[1]} (0), app 127.0.0.1:{port} (1), retry to the other priority")
    return cluster, route


def check_merged_cluster(ck: Checker, where: str, cluster_patch: dict, route_patch: dict, port: int,
                         envoy_cache: Path) -> None:
    """Istio's inbound cluster with the routing's patch merged as Istio
    merges it, in a bootstrap with an inbound listener whose route carries
    the merged retry: real Envoy must accept it (`--mode validate`)."""
    cluster = proto_merge(istio_inbound_cluster(port), cluster_patch)
    route = proto_merge({"match": {"prefix": "/"}, "route": {"cluster": cluster["name"], "timeout": "0s"}}, route_patch)
    boot = {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 15000}}},
        "static_resources": {
            "clusters": [cluster],
            "listeners": [{
                "name": "virtualInbound", "traffic_direction": "INBOUND",
                "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "inbound_0.0.0.0_%d" % port,
                        "route_config": {"name": f"inbound|{port}||", "virtual_hosts": [
                            {"name": f"inbound|http|{port}", "domains": ["*"], "routes": [route]}]},
                        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
                    },
                }]}],
            }],
        },
    }
    versions = sorted((p.name for p in envoy_cache.iterdir() if (p / "envoy" / "_bin" / "envoy").is_file()),
                      key=lambda v: tuple(int(x) for x in v.split(".")))
    if not ck.check("envoy", bool(versions), f"{where}: no Envoy in {envoy_cache} (scripts/fetch-envoy.sh)"):
        return
    version = versions[-1]
    binary = envoy_cache / version / "envoy" / "_bin" / "envoy"
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "istio-inbound.json"
        cfg.write_text(json.dumps(boot))
        r = subprocess.run([str(binary), "--mode", "validate", "-c", str(cfg), "-l", "error"],
                           capture_output=True, text=True, timeout=120)
    ck.check("envoy", r.returncode == 0,
             f"{where}: Istio's inbound|{port}|| with the routing merged: envoy {version} --mode validate failed:\n"
             f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
    print(f"  {where}: Istio's ORIGINAL_DST inbound|{port}|| with the routing merged (type {cluster.get('type')}, "
          f"lb_policy {cluster.get('lb_policy')}, bind {cluster['upstream_bind_config']['source_address']['address']}): "
          f"envoy {version} --mode validate: {'OK' if r.returncode == 0 else 'FAILED'}")


def check_istio_inject(ck: Checker, kubectl: str, component: Path, envoy_cache: Path, versions: list[str],
                       workloads: str = ADOPTER_ISTIO) -> None:
    """`drainshim inject --mode istio` on the adopter's Istio workload: the
    pod the Component renders (plus the label the routing selects), every
    per-pod check, no Sidecar of its own (the namespace default's egress
    holds), and the routing of `drainshim istio-routing` for its port, which
    real Envoy accepts once merged into Istio's inbound cluster. The
    shipped deploy/istio-routing/routing.yaml is that command's output."""
    area, overlay = "inject", "inject --mode istio"
    before, err = render_adopter(kubectl, None, workloads)
    rendered, err2 = render_adopter(kubectl, component, workloads)
    if not ck.check(area, before is not None and rendered is not None, f"{overlay}: the adopter's Istio workload does not render: {err or err2}"):
        return
    after, err = run_inject(before, "istio")
    if not ck.check(area, after is not None, f"{overlay}: refused the adopter's Istio workload: {err}"):
        return
    check_schema(ck, overlay, after, versions)
    ck.check(area, [d for d in after if d.get("kind") == "Sidecar"] == [d for d in before if d.get("kind") == "Sidecar"],
             f"{overlay}: the namespace's Sidecars changed: inject must leave the default (its egress scoping) as it is")
    dep = next((d for d in after if d.get("kind") == "Deployment"), None)
    comp = next((d for d in rendered if d.get("kind") == "Deployment"), None)
    old = next((d for d in before if d.get("kind") == "Deployment"), None)
    if not ck.check(area, dep is not None and comp is not None and old is not None, f"{overlay}: no Deployment"):
        return
    got, want = comparable_pod(dep["spec"]["template"]), comparable_pod(comp["spec"]["template"])
    port_label = ((got.get("metadata") or {}).get("labels") or {}).pop(APP_PORT_LABEL, None)
    ck.check(area, port_label == str((want["metadata"].get("annotations") or {}).get(APP_PORT_LABEL)),
             f"{overlay}: the pod's label {APP_PORT_LABEL} is {port_label!r}, want its app port (what the routing selects)")
    diff = sorted(k for k in set(got["spec"]) | set(want["spec"]) if got["spec"].get(k) != want["spec"].get(k))
    ck.check(area, got == want, f"{overlay}: drainshim inject and components/sidecar-istio differ in "
                                f"{diff + (['metadata'] if got.get('metadata') != want.get('metadata') else [])}")
    apps = base_app_containers([old])
    routing_all, text, err = istio_routing(ROUTING_PORTS)
    if not ck.check(area, routing_all is not None, f"drainshim istio-routing --ports {ROUTING_PORTS}: {err}"):
        return
    shipped = (ISTIO_ROUTING / "routing.yaml").read_text()
    ck.check(area, shipped == text,
             f"deploy/istio-routing/routing.yaml is not `drainshim istio-routing --ports {ROUTING_PORTS}`'s output: regenerate it")
    for name, meta, spec in pod_specs(dep):
        check_no_privileged(ck, overlay, name, spec)
        ck.check(area, check_pod(ck, overlay, name, meta, spec, {}, envoy_cache, apps),
                 f"{overlay}: {name}: no drainshim sidecar")
        port = pod_app_port(ck, f"{overlay}: {name}", meta, apps)
        if port is None:
            continue
        routing, _, err = istio_routing(str(port))
        if not ck.check(area, routing is not None, f"drainshim istio-routing --ports {port}: {err}"):
            continue
        found = check_routing(ck, f"{overlay}: {name}", routing, meta, spec, port)
        ck.check(area, found is None or all(d in routing_all for d in routing),
                 f"{overlay}: the routing for port {port} is not in deploy/istio-routing/routing.yaml")
        if found is not None:
            check_merged_cluster(ck, f"{overlay}: {name}", *found, port, envoy_cache)
