"""Metrics and the dashboard: the metrics contract of docs/design.md, the
metric names PromQL reads, and the dashboard JSON's panels and queries.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .checker import Checker


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
    """Alerts may also read what is exported beyond the contract (`exported`:
    the webhook's counter, the API server's fail-open count;
    RULE_METRICS_BEYOND_CONTRACT). The dashboard sticks to the contract."""
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    for g in rules["groups"]:
        for r in g["rules"]:
            what = r.get("alert") or r.get("record")
            used = promql_metrics(r["expr"])
            ck.check("metrics", bool(used), f"rules.yaml {what}: reads no metric?")
            for n in used:
                ck.check("metrics", n in contract or n in recorded or n in exported,
                         f"rules.yaml {what}: {n} is neither a docs/design.md metric, nor recorded in rules.yaml, "
                         "nor in RULE_METRICS_BEYOND_CONTRACT (config.py)")
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
