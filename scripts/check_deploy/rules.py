"""Alerting rules: deploy/monitoring/prometheusrule.yaml generated from
rules.yaml (`sync-rules`), and checked to carry exactly its groups.
"""

from __future__ import annotations

import copy

import yaml

from .config import MONITORING
from .checker import Checker


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
