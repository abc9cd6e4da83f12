"""The command line (check, selftest, sync-rules) and `check`, which runs
every check on the kustomize output and prints the summary.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from . import __doc__ as PACKAGE_DOC
from .config import (
    MONITORING, OVERLAYS_WITH_AGENT, OVERLAYS_WITH_ISTIO_FAILOPEN, OVERLAYS_WITH_NODE_WORKLOAD,
    OVERLAYS_WITH_SHIM, ROOT, RULE_METRICS_BEYOND_CONTRACT, SCHEMA_VERSIONS,
)
from .checker import Checker
from .pods import all_containers, is_drainshim, pod_specs
from .pod_checks import (
    base_app_containers, check_istio_failopen, check_pod, check_services, check_services_reach_proxy,
)
from .node import Agent, check_agent, check_no_privileged, check_node_workload
from .rollout import check_rollout
from .sidecar import NATIVE_SIDECAR_COMPONENT, SIDECAR_COMPONENT, check_adoption, check_inject_base
from .istio import SIDECAR_ISTIO_COMPONENT, check_istio_adoption, check_istio_inject, check_sidecar_merge
from .schema import check_schema
from .metrics import check_dashboard, check_metrics, contract_metrics, dashboard_panels
from .rules import check_rules_sync, sync_rules
from .scrapes import (
    FORGED, SIM_NODE_IPS, SIM_POD_IPS, ScrapePod, check_label_trust, check_scrapes, forged_label_run,
    podmonitor_scrapes,
)
from .docs import check_docs
from .webhook import check_webhooks, webhook_metrics_port
from .selftest import run_selftest


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
                elif webhook_metrics_port(spec) is not None:
                    # The admission webhook: scraped once at --metrics-listen,
                    # trusted no more than a sidecar (check_webhooks below).
                    scrape_pods.append(ScrapePod(where, ns, meta, spec, webhook_metrics_port(spec)))
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

    print("== the admission webhook (deploy/webhook and its revisions)")
    check_webhooks(ck, rendered_docs)

    print("== the sidecar Component on workloads from outside the repo (deploy/components/sidecar)")
    scrape_pods += check_adoption(ck, kubectl, SIDECAR_COMPONENT, envoy_cache, versions)
    print("== its native-sidecar variant on the same workloads (deploy/components/native-sidecar)")
    scrape_pods += check_adoption(ck, kubectl, NATIVE_SIDECAR_COMPONENT, envoy_cache, versions)
    print("== drainshim inject on the same workloads, in both modes: every pod check, and the Components' pods")
    check_adoption(ck, kubectl, SIDECAR_COMPONENT, envoy_cache, versions, inject_mode="sidecar")
    check_adoption(ck, kubectl, NATIVE_SIDECAR_COMPONENT, envoy_cache, versions, inject_mode="native-sidecar")
    check_inject_base(ck, rendered_docs)
    print("== its Istio variant on a workload from outside the repo, in a namespace with a default Sidecar (deploy/components/sidecar-istio)")
    check_istio_adoption(ck, kubectl, SIDECAR_ISTIO_COMPONENT, envoy_cache, versions)
    print("== drainshim inject --mode istio on the same workload, and the mesh's routing (drainshim istio-routing, deploy/istio-routing)")
    check_istio_inject(ck, kubectl, SIDECAR_ISTIO_COMPONENT, envoy_cache, versions)

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
    # against the document (the rules may also read the webhook's and the API
    # server's RULE_METRICS_BEYOND_CONTRACT).
    contract = contract_metrics(design)
    print(f"  contract: {len(contract)} metric series names from {design}; "
          f"for the rules also {', '.join(sorted(RULE_METRICS_BEYOND_CONTRACT))}")
    if dashboard is not None:
        check_metrics(ck, rules, dashboard, contract, contract | set(RULE_METRICS_BEYOND_CONTRACT))
        n = sum(len(p.get("targets", [])) for p in dashboard_panels(dashboard))
        print(f"  dashboard.json: {len(list(dashboard_panels(dashboard)))} panels, {n} queries")

    print("== docs (node mode, against the rendered agent and `drainshim node --help`)")
    check_docs(ck, agents)

    print("== summary")
    print(f"  schema versions: {', '.join(versions)} (strict)")
    for area in ("schema", "budget", "wiring", "node", "rollout", "envoy", "adopt", "webhook", "rules", "metrics", "dashboard", "docs"):
        print(f"  {area:9} {ck.counts.get(area, 0)} passed")
    print(f"  skipped (CRDs, no schema in kubernetes-validate; checked via rules.yaml, the PodMonitors run on the rendered pods, "
          f"the Istio checks, the webhook checks): {len(skipped)}")
    for s in skipped:
        print(f"    - {s}")
    if ck.failures:
        print(f"\n{len(ck.failures)} FAILED:", file=sys.stderr)
        for f in ck.failures:
            print(f"  {f}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=PACKAGE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
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
