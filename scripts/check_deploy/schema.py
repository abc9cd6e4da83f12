"""Schemas: every rendered object against the Kubernetes schemas of
kubernetes-validate (strict); CRD kinds are skipped.
"""

from __future__ import annotations

from .config import CRD_KINDS
from .checker import Checker


def check_schema(ck: Checker, overlay: str, docs: list[dict], versions: list[str]) -> list[str]:
    import kubernetes_validate

    skipped = []
    for d in docs:
        kind = d.get("kind")
        name = f"{overlay}: {kind}/{d.get('metadata', {}).get('name')}"
        if kind in CRD_KINDS:
            skipped.append(name)
            continue
        for v in versions:
            try:
                kubernetes_validate.validate(d, v, strict=True)
                ck.ok("schema")
            except kubernetes_validate.ValidationError as e:
                ck.fail("schema", f"{name} (Kubernetes {v}): {e.message} at {'.'.join(map(str, e.path))}")
            except kubernetes_validate.SchemaNotFoundError as e:
                ck.fail("schema", f"{name} (Kubernetes {v}): no schema ({e}); add it to CRD_KINDS only if it is a CRD checked otherwise")
    return skipped
