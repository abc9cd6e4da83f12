"""Docs: the node-mode prose (DOC_FILES) held against the rendered agent and
`drainshim node --help`, for a short list of known contradictions.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from .config import DRAINSHIM_BIN, ROOT
from .checker import Checker
from .node import Agent


# Prose that describes node mode, held against the rendered manifests and the
# binary's `drainshim node --help`. Only a short list of known contradictions,
# each tied to one fact; a paragraph is judged only where it is about the node
# agent, so the same words elsewhere (a sidecar, `drainshim drain`) pass.
DOC_FILES = ["README.md", "docs/reference.md", "deploy/README.md", "docs/operations.md", "docs/design.md",
             "deploy/daemonset/workload-prestop/workload-prestop-patch.yaml",
             "deploy/daemonset/workload-prestop/kustomization.yaml"]
NODE_TOPIC = re.compile(r"node mode|node agent|daemonset|\bagents?\b", re.I)


@dataclass
class DocFacts:
    """What the docs about node mode must not contradict."""
    max_surge: str  # the agent DaemonSet's rolling update, as rendered
    max_unavailable: str
    host_paths: list[str]  # hostPath volumes of the agent
    handover: bool  # --handover-socket is set
    guard_help: bool  # `drainshim node --help` documents the per-pod stream guard (--guard)


def doc_paragraphs(name: str, text: str) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph: blank-line separated; in YAML
    only comment lines count. Markdown emphasis and backticks are dropped and
    whitespace collapsed, so a phrase wrapped over two lines still matches."""
    yaml_file = name.endswith((".yaml", ".yml"))
    out, cur, start = [], [], 0
    for n, line in enumerate(text.splitlines() + [""], 1):
        if yaml_file:
            m = re.match(r"\s*#(.*)", line)
            line = m.group(1) if m else ""
        if line.strip():
            if not cur:
                start = n
            cur.append(line)
        elif cur:
            out.append((start, re.sub(r"\s+", " ", re.sub(r"[*`]", "", " ".join(cur))).strip()))
            cur = []
    return out


def doc_contradictions(texts: dict[str, str], facts: DocFacts) -> list[str]:
    """Messages for each known contradiction of facts in texts ({name: text})."""
    # (pattern, the value its group 1 must have or None for any match, what the fact is)
    rules: list[tuple[str, str | None, str]] = [
        (r"\bmaxSurge\s*[:=]?\s*(\d+%?)", facts.max_surge, f"the agent's DaemonSet has maxSurge: {facts.max_surge}"),
        (r"\bmaxUnavailable\s*[:=]?\s*(\d+%?)", facts.max_unavailable,
         f"the agent's DaemonSet has maxUnavailable: {facts.max_unavailable}"),
    ]
    surge_zero = facts.max_surge in ("0", "0%")
    if facts.handover and not surge_zero:
        rules.append((r"\btwo agents cannot share\b", None,
                      f"the agents of a node overlap (maxSurge {facts.max_surge}) and hand the port over (--handover-socket)"))
    if facts.guard_help:
        fact = "`drainshim node --help` documents a stream guard per pod (--guard, node metadata DRAINSHIM_GUARD)"
        rules += [(r"\bno stream guard\b", None, fact),
                  (r"\bnode mode (?:has|offers|gives|provides) no (?:stream )?guard\b", None, fact),
                  (r"\bnode mode,? there is no (?:stream )?guard\b", None, fact),
                  (r"\bno (?:stream )?guard in node mode\b", None, fact)]
    if facts.host_paths:
        fact = f"the agent's DaemonSet mounts hostPath {', '.join(facts.host_paths)}"
        rules += [(r"\bnot used:[^.]*(?<!other )\bhostPath\b", None, fact),
                  (r"\bno hostPath\b", None, fact),
                  (r"\bwithout (?:a |any )?hostPath\b", None, fact)]
    out = []
    for name, text in texts.items():
        for line, para in doc_paragraphs(name, text):
            if not NODE_TOPIC.search(para):
                continue
            spans: list[tuple[int, int]] = []  # one message per phrase, however many rules match it
            for pat, want, fact in rules:
                for m in re.finditer(pat, para, re.I):
                    if (want is None or m.group(1) != want) and not any(a < m.end() and m.start() < b for a, b in spans):
                        spans.append(m.span())
                        out.append(f"{name} (paragraph at line {line}): says {m.group(0)!r}, but {fact}")
    return out


def node_help() -> str:
    try:
        r = subprocess.run([str(DRAINSHIM_BIN), "node", "--help"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise SystemExit(f"check_deploy: cannot run {DRAINSHIM_BIN} ({e}): build it first (cargo build)")
    if r.returncode != 0:
        raise SystemExit(f"check_deploy: `drainshim node --help` exits {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def guard_documented(help_text: str) -> bool:
    """`drainshim node --help` offers the per-pod stream guard."""
    return bool(re.search(r"^\s*--guard <", help_text, re.M)) and "DRAINSHIM_GUARD" in help_text


def check_docs(ck: Checker, agents: list[Agent]) -> None:
    if not ck.check("docs", len(agents) == 1, f"want the one node agent's DaemonSet to hold the docs against, found {len(agents)}"):
        return
    a = agents[0]
    help_text = node_help()
    facts = DocFacts(
        max_surge=str(a.rolling_update.get("maxSurge", 0)),
        max_unavailable=str(a.rolling_update.get("maxUnavailable", 1)),
        host_paths=a.host_paths,
        handover="handover-socket" in a.settings,
        guard_help=guard_documented(help_text),
    )
    texts = {}
    for f in DOC_FILES:
        path = ROOT / f
        if ck.check("docs", path.is_file(), f"{f}: missing (scripts/check_deploy.py DOC_FILES)"):
            texts[f] = path.read_text()
    bad = doc_contradictions(texts, facts)
    for m in bad:
        ck.fail("docs", m)
    if not bad:
        ck.ok("docs")
    print(f"  {len(texts)} files held against {a.where} (maxSurge {facts.max_surge}, maxUnavailable {facts.max_unavailable}, "
          f"hostPath {facts.host_paths or 'none'}, hand-over {facts.handover}) and `drainshim node --help` "
          f"(stream guard per pod: {facts.guard_help}): {len(bad)} contradiction(s)")
