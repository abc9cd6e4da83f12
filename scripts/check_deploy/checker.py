"""Checker: collects each check's verdict by area (schema, budget, wiring,
node, rollout, envoy, adopt, rules, metrics, dashboard, docs): the passes
counted, the failures as messages.
"""

from __future__ import annotations


class Checker:
    def __init__(self) -> None:
        self.failures: list[str] = []
        self.counts: dict[str, int] = {}

    def ok(self, area: str) -> None:
        self.counts[area] = self.counts.get(area, 0) + 1

    def check(self, area: str, cond: bool, msg: str) -> bool:
        if cond:
            self.ok(area)
        else:
            self.failures.append(f"[{area}] {msg}")
        return cond

    def fail(self, area: str, msg: str) -> None:
        self.failures.append(f"[{area}] {msg}")
