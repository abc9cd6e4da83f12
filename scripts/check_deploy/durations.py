"""Durations: humantime (`90s`, `1m30s`, `2 min`, drainshim's flags) and
Go/proto (Istio's `60s`) durations, in seconds.
"""

from __future__ import annotations

import re


_UNITS = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3,
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
}


def duration(text: str) -> float:
    """Seconds in a humantime duration (`90s`, `1m30s`, `2 min`), the syntax
    drainshim's flags use; also Go/proto durations like Istio's `60s`."""
    s = str(text).strip()
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-zµ]+)", s)
    rebuilt = "".join(n + u for n, u in parts)
    if not parts or rebuilt != re.sub(r"\s+", "", s):
        raise ValueError(f"not a duration: {text!r}")
    total = 0.0
    for n, unit in parts:
        if unit not in _UNITS:
            raise ValueError(f"unknown unit {unit!r} in {text!r}")
        total += float(n) * _UNITS[unit]
    return total
