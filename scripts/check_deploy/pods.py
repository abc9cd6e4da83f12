"""The pod model: pod templates of rendered objects, their containers, a
drainshim container's flags and env, addresses, preStop hooks, and the pod
spec as the kubelet runs it (downward API env, $(VAR) expansion).
"""

from __future__ import annotations

import copy
import ipaddress
import re

from .config import POD_TEMPLATE_KINDS


def pod_specs(doc: dict):
    """(name, pod metadata, pod spec) for every pod template in a document."""
    kind = doc.get("kind")
    name = f"{kind}/{doc.get('metadata', {}).get('name')}"
    if kind in POD_TEMPLATE_KINDS:
        t = doc["spec"]["template"]
        yield name, t.get("metadata", {}), t["spec"]
    elif kind == "CronJob":
        t = doc["spec"]["jobTemplate"]["spec"]["template"]
        yield name, t.get("metadata", {}), t["spec"]
    elif kind == "Pod":
        yield name, doc.get("metadata", {}), doc["spec"]


def image_name(c: dict) -> str:
    """`registry/drainshim:1.2` -> `drainshim`."""
    img = c.get("image", "")
    return img.rsplit("/", 1)[-1].split("@")[0].split(":")[0]


def is_drainshim(c: dict, sub: str) -> bool:
    args = c.get("args") or []
    return image_name(c) == "drainshim" and not c.get("command") and args[:1] == [sub]


def flags(args: list[str]) -> dict[str, str]:
    """`--k=v` and `--k v` into a dict (bare `--k` -> "true")."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = str(args[i])
        if a.startswith("--"):
            if "=" in a:
                k, v = a[2:].split("=", 1)
            elif i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
                k, v = a[2:], str(args[i + 1])
                i += 1
            else:
                k, v = a[2:], "true"
            out[k] = v
        i += 1
    return out


def shim_settings(c: dict) -> dict[str, str]:
    """A drainshim container's effective flags: defaults, then DRAINSHIM_*
    env (literal values), then command-line flags, as clap resolves them."""
    eff: dict[str, str] = {}
    for e in c.get("env") or []:
        if e.get("name", "").startswith("DRAINSHIM_") and "value" in e:
            eff[e["name"][len("DRAINSHIM_"):].lower().replace("_", "-")] = str(e["value"])
    eff.update(flags((c.get("args") or [])[1:]))
    return eff


def host_port(addr: str) -> tuple[str, int]:
    addr = re.sub(r"^[a-z]+://", "", addr).rstrip("/")
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def all_containers(spec: dict):
    """(container, is_init, is_native_sidecar)."""
    for c in spec.get("initContainers") or []:
        yield c, True, c.get("restartPolicy") == "Always"
    for c in spec.get("containers") or []:
        yield c, False, False


def mounts_at(c: dict, path: str) -> str | None:
    for m in c.get("volumeMounts") or []:
        if m.get("mountPath", "").rstrip("/") == path.rstrip("/"):
            return m.get("name")
    return None


def prestop_exec(c: dict) -> list[str] | None:
    cmd = (((c.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command")
    return [str(x) for x in cmd] if cmd else None


def prestop_http(c: dict) -> dict | None:
    return ((c.get("lifecycle") or {}).get("preStop") or {}).get("httpGet")


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_FIELD_REF = re.compile(r"metadata\.(annotations|labels)\['([^']+)'\]")


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """$(VAR) as the kubelet expands it in command, args and env values: a
    defined variable is substituted, an undefined reference stays as
    written, and $$ is a literal $."""
    return _VAR_REF.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def as_kubelet_runs(meta: dict, spec: dict) -> tuple[dict, list[str]]:
    """The pod spec as its processes see it: env read from the pod's own
    annotations and labels (downward API) and $(VAR) expanded in env values,
    command and args (the sidecar Component passes the app's port this way).
    Other valueFrom sources are kept as they are. Also returns what cannot
    be resolved: an annotation or label the pod does not have (the kubelet
    gives an empty string), a $(VAR) left unexpanded."""
    spec = copy.deepcopy(spec)
    missing: list[str] = []
    for c, _, _ in all_containers(spec):
        env: dict[str, str] = {}
        for e in c.get("env") or []:
            if "value" in e:
                e["value"] = kubelet_expand(str(e["value"]), env)
                env[e["name"]] = e["value"]
                continue
            m = _FIELD_REF.fullmatch(str(((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")))
            if m:
                got = (meta.get(m.group(1)) or {}).get(m.group(2))
                if got is None:
                    missing.append(f"{c.get('name')}: env {e.get('name')} reads {m.group(1)[:-1]} {m.group(2)!r}, which the pod does not have")
                env[e["name"]] = str(got or "")
        for key in ("command", "args"):
            if c.get(key):
                c[key] = [kubelet_expand(str(a), env) for a in c[key]]
                missing += [f"{c.get('name')}: {key} has $({v}), which no env entry of the container defines"
                            for a in c[key] for v in re.findall(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", a)]
    return spec, missing
