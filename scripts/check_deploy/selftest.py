"""The selftest: proves the rollout, scrape, label, docs, adoption and
webhook rules fire, on the shipped manifests (accepted) and on copies broken
as they were before issues 29 and 30, as an adopter might break the
Components (ADOPTION_CASES, NATIVE_ADOPTION_CASES, ISTIO_ADOPTION_CASES), or
as the webhook's manifests could be broken (WEBHOOK_CASES).
"""

from __future__ import annotations

import contextlib
import copy
import io
import shutil
import tempfile
from pathlib import Path

import yaml

from .config import OVERLAYS_WITH_WEBHOOK, SCHEMA_VERSIONS
from .checker import Checker
from .pods import all_containers, host_port, is_drainshim, pod_specs, shim_settings
from .rollout import max_surge, surge_port_conflicts
from .sidecar import ADOPTER_WORKLOADS, NATIVE_SIDECAR_COMPONENT, SIDECAR_COMPONENT, check_adoption
from .istio import ADOPTER_ISTIO, SIDECAR_ISTIO_COMPONENT, check_istio_adoption
from .scrapes import FORGED, ScrapePod, check_label_trust, check_scrapes, forged_label_run
from .docs import DocFacts, doc_contradictions, guard_documented, node_help
from .webhook import check_webhooks


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


def _obj(docs: list[dict], kind: str) -> dict:
    return next(d for d in docs if d.get("kind") == kind and (kind != "Certificate" or not d["spec"].get("isCA")))


def _hook(docs: list[dict]) -> dict:
    return _obj(docs, "MutatingWebhookConfiguration")["webhooks"][0]


def _webhook_container(docs: list[dict]) -> dict:
    return _obj(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


# The rendered webhook (overlay webhook, and webhook-canary for the cases
# across revisions), edited: (what, a failure message that must appear (None:
# no failure may), the overlay edited, the edit).
WEBHOOK_CASES = [
    ("the shipped default revision, canary and the tag stable: accepted", None, "webhook", lambda docs: None),
    ("failurePolicy Fail (a webhook that is down blocks every pod): rejected",
     "failurePolicy Fail", "webhook", lambda docs: _hook(docs).__setitem__("failurePolicy", "Fail")),
    ("no timeoutSeconds (the API's default, 10 s): rejected",
     "timeoutSeconds 10 (the default)", "webhook", lambda docs: _hook(docs).pop("timeoutSeconds")),
    ("operations CREATE and UPDATE: rejected",
     "Pod CREATE only", "webhook", lambda docs: _hook(docs)["rules"][0].__setitem__("operations", ["CREATE", "UPDATE"])),
    ("reinvocationPolicy Never (Istio's injector runs after it, unseen): rejected",
     "reinvocationPolicy Never", "webhook", lambda docs: _hook(docs).__setitem__("reinvocationPolicy", "Never")),
    ("the webhook's pods without drainshim.io/inject: \"false\": rejected",
     "lack the label drainshim.io/inject", "webhook",
     lambda docs: _obj(docs, "Deployment")["spec"]["template"]["metadata"]["labels"].pop("drainshim.io/inject")),
    ("a namespaceSelector that does not exclude kube-system and its own namespace: rejected",
     "never kube-system nor its own namespace", "webhook",
     lambda docs: _hook(docs)["namespaceSelector"]["matchExpressions"].pop()),
    ("no objectSelector (opted-out pods sent too): rejected",
     "every pod but those labelled", "webhook", lambda docs: _hook(docs).pop("objectSelector")),
    ("the Certificate's Secret is not the one mounted: rejected",
     "writes Secret 'other-tls', but", "webhook", lambda docs: _obj(docs, "Certificate")["spec"].__setitem__("secretName", "other-tls")),
    ("cert-manager.io/inject-ca-from names a Certificate that does not exist: rejected",
     "names no Certificate rendered", "webhook",
     lambda docs: _obj(docs, "MutatingWebhookConfiguration")["metadata"]["annotations"].__setitem__(
         "cert-manager.io/inject-ca-from", "drainshim-system/missing")),
    ("a Certificate without the Service's DNS name: rejected",
     "without drainshim-webhook.drainshim-system.svc", "webhook",
     lambda docs: _obj(docs, "Certificate")["spec"].__setitem__("dnsNames", ["drainshim-webhook.default.svc"])),
    ("the TLS Secret mounted by subPath (never updated on renewal): rejected",
     "subPath", "webhook", lambda docs: _webhook_container(docs)["volumeMounts"][0].__setitem__("subPath", "tls.crt")),
    ("one replica: rejected", "replicas 1", "webhook", lambda docs: _obj(docs, "Deployment")["spec"].__setitem__("replicas", 1)),
    ("a PodDisruptionBudget of minAvailable 2 (no node drain can proceed): rejected",
     "keeps 2 of 2", "webhook", lambda docs: _obj(docs, "PodDisruptionBudget")["spec"].__setitem__("minAvailable", 2)),
    ("a flag `drainshim webhook` does not have (--port): rejected",
     "not a flag of `drainshim webhook --help`", "webhook", lambda docs: _webhook_container(docs)["args"].append("--port=8443")),
    ("--shutdown-delay 40s, past terminationGracePeriodSeconds 30: rejected",
     "must be below terminationGracePeriodSeconds", "webhook",
     lambda docs: _webhook_container(docs)["args"].__setitem__(8, "--shutdown-delay=40s")),
    ("--image other than the webhook's own: rejected",
     "differs from the webhook's own image", "webhook",
     lambda docs: _webhook_container(docs)["args"].__setitem__(6, "--image=drainshim:0.3.0")),
    ("allowPrivilegeEscalation left unset: rejected",
     'not Pod Security "restricted"', "webhook", lambda docs: _webhook_container(docs)["securityContext"].pop("allowPrivilegeEscalation")),
    ("the Service's targetPort on the metrics port: rejected",
     "which is not --listen's port", "webhook", lambda docs: _obj(docs, "Service")["spec"]["ports"][0].__setitem__("targetPort", "metrics")),
    ("the NetworkPolicy allowing all egress: rejected",
     "egress must be denied", "webhook", lambda docs: _obj(docs, "NetworkPolicy")["spec"].__setitem__("egress", [{}])),
    ("canary also selecting drainshim.io/inject=enabled namespaces: rejected (served by two webhooks)",
     "is served by 2 webhooks", "webhook-canary",
     lambda docs: _hook(docs)["namespaceSelector"]["matchExpressions"].__setitem__(
         0, {"key": "drainshim.io/inject", "operator": "In", "values": ["enabled"]})),
    ("canary without its opt-out term (drainshim.io/rev would beat drainshim.io/inject=disabled): rejected",
     "no opting-out drainshim.io/inject", "webhook-canary",
     lambda docs: _hook(docs)["namespaceSelector"]["matchExpressions"].pop(1)),
    ("the tag stable without its opt-out term: rejected",
     "no opting-out drainshim.io/inject", "webhook-tags-stable",
     lambda docs: _hook(docs)["namespaceSelector"]["matchExpressions"].pop(1)),
    ("the tag stable calling a Service no revision renders: rejected",
     "which is not rendered by any revision", "webhook-tags-stable",
     lambda docs: _hook(docs)["clientConfig"]["service"].__setitem__("name", "drainshim-webhook-gone")),
    ("the tag stable named canary, a revision's name (served twice): rejected",
     "is served by 2 webhooks", "webhook-tags-stable",
     lambda docs: [e.__setitem__("values", ["canary"]) for h in _obj(docs, "MutatingWebhookConfiguration")["webhooks"]
                   for e in h["namespaceSelector"]["matchExpressions"] if e["key"] == "drainshim.io/rev"]),
    ("the tag stable rendering a Service of its own: rejected",
     "a tag is its MutatingWebhookConfiguration alone", "webhook-tags-stable",
     lambda docs: docs.append({"apiVersion": "v1", "kind": "Service",
                               "metadata": {"name": "drainshim-webhook-tag-stable", "namespace": "drainshim-system"},
                               "spec": {"selector": {"app": "x"}, "ports": [{"port": 443}]}})),
    ("canary's Deployment without its name suffix (it would replace the default's): rejected",
     "is also rendered by", "webhook-canary", lambda docs: _obj(docs, "Deployment")["metadata"].__setitem__("name", "drainshim-webhook")),
]


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

    print("== webhook: the rendered deploy/webhook and deploy/webhook/canary, and broken copies of them")
    shipped = {o: load(o) for o in OVERLAYS_WITH_WEBHOOK}
    for what, detail, overlay, edit in WEBHOOK_CASES:
        rendered_copy = copy.deepcopy(shipped)
        edit(rendered_copy[overlay])
        ck = Checker()
        with contextlib.redirect_stdout(io.StringIO()):
            check_webhooks(ck, rendered_copy)
        if detail is None:
            expect(not ck.failures and ck.counts.get("webhook", 0) > 0, what, "\n".join(ck.failures))
        else:
            expect(any(detail in f for f in ck.failures), what, "\n".join(ck.failures) or "no failure")

    bad = [w for ok, w in results if not ok]
    print(f"== selftest: {len(results) - len(bad)} of {len(results)} passed")
    return 1 if bad else 0
