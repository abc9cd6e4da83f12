"""Scrapes: the PodMonitors run on every rendered pod as prometheus-operator
and Prometheus' pod discovery run them (label selectors, relabeling), the
labels a sidecar's monitor trusts, and the forged-label run in a real
Prometheus.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from .checker import Checker
from .pods import all_containers


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
