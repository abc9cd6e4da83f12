"""The admission webhook (deploy/webhook/, its named revisions such as
deploy/webhook/canary/, and its revision tags such as
deploy/webhook/tags/stable/), as rendered: each drainshim
MutatingWebhookConfiguration and what it depends on. Its webhooks fail open,
never block a pod, see Pod CREATEs only, come back after Istio's injector
(reinvocation), spare opted-out pods, kube-system and their own namespace,
and serve one revision each (no namespace is served by two; a tag is
checked as the revision whose Service it calls). Behind each: a
Service whose port reaches the container's --listen, a cert-manager
Certificate for the Service's DNS name whose Secret is the one mounted (and
named by the CA injection annotation), two replicas on two nodes with a
budget that lets one go, the opt-out label on its own pods, Pod Security
"restricted", probes on --metrics-listen, flags that `drainshim webhook
--help` lists (the deploy contract's written out), and a NetworkPolicy that
lets the API server and Prometheus in and nothing out.
"""

from __future__ import annotations

import math
import re
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import PurePosixPath

from .config import DRAINSHIM_BIN, KUBE_GRACE_DEFAULT, OVERLAYS_WITH_WEBHOOK
from .checker import Checker
from .durations import duration
from .pods import all_containers, flags, host_port, image_name, is_drainshim, is_loopback, shim_settings
from .scrapes import selects


# The webhook's deploy contract: flags every manifest writes out, defaults or
# not, so a reader sees what it serves. Which flags exist, and the values of
# --mode, come from the binary itself (`drainshim webhook --help`): it has no
# `--check` (it would need its certificate), so its args are held to the
# flags it parses, and their values to the rules below.
REQUIRED_FLAGS = {"listen", "tls-cert", "tls-key", "metrics-listen", "mode", "image", "revision", "shutdown-delay"}
DEFAULT_REVISION = "default"
INJECT_PATH = "/inject"
# The path of the webhooks for namespaces Istio injects (`drainshim webhook`
# answers there in its Istio mode).
ISTIO_PATH = "/inject/istio"
# The path of the webhooks for namespaces whose istio-injection label is not
# "enabled" (Istio injects none of their pods): `drainshim webhook` never
# takes the Istio mode there, and warns a pod that asks for it.
NO_ISTIO_PATH = "/inject/no-istio"
MAX_TIMEOUT_SECONDS = 5

INJECT = "drainshim.io/inject"  # namespace: "enabled" opts in; pod: "false" opts out
OPTED_OUT = ("disabled", "false")  # namespace values of INJECT that opt out, whatever REV says
REV = "drainshim.io/rev"  # namespace: the named revision (or tag) that serves it
# A revision tag's MutatingWebhookConfiguration is named so (deploy/webhook/tags).
TAG_PREFIX = "drainshim-tag-"
NS_NAME = "kubernetes.io/metadata.name"  # set on every namespace by the API server
CA_ANNOTATION = "cert-manager.io/inject-ca-from"
HOSTNAME = "kubernetes.io/hostname"
# The keys of a cert-manager Certificate's Secret (kubernetes.io/tls).
SECRET_CERT, SECRET_KEY = "tls.crt", "tls.key"

# Pod Security Standards, "restricted" (and the "baseline" it includes).
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
RESTRICTED_ADD_CAPS = {"NET_BIND_SERVICE"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}

AREA = "webhook"


@dataclass
class Revision:
    """One webhook entry and the instance behind it, for the checks across
    revisions."""
    overlay: str
    where: str
    config: str  # the MutatingWebhookConfiguration's name
    webhook: str  # the webhook's name
    revision: str | None  # --revision, None when the instance was not found
    namespace: str  # the webhook's own namespace
    namespace_selector: dict
    istio: bool = False  # its path is ISTIO_PATH: the namespaces Istio injects
    path: str = INJECT_PATH
    tag: str | None = None  # the tag, when the configuration is a revision tag's

    @property
    def serves(self) -> str | None:
        """The drainshim.io/rev value it serves (the default revision: none,
        DEFAULT_REVISION stands for drainshim.io/inject=enabled)."""
        return self.tag if self.tag is not None else self.revision


def is_drainshim_config(doc: dict) -> bool:
    return doc.get("kind") == "MutatingWebhookConfiguration" and any(
        str(w.get("name", "")).endswith(".drainshim.io") for w in doc.get("webhooks") or [])


def webhook_container(spec: dict) -> dict | None:
    found = [c for c, _, _ in all_containers(spec) if is_drainshim(c, "webhook")]
    return found[0] if len(found) == 1 else None


def webhook_metrics_port(spec: dict) -> int | None:
    """The --metrics-listen port of a pod's `drainshim webhook` container (what
    the PodMonitors must scrape, once), or None for other pods."""
    c = webhook_container(spec)
    if c is None:
        return None
    try:
        return host_port(shim_settings(c).get("metrics-listen", ""))[1]
    except ValueError:
        return None


@lru_cache(maxsize=1)
def webhook_help() -> str:
    try:
        r = subprocess.run([str(DRAINSHIM_BIN), "webhook", "--help"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise SystemExit(f"check_deploy: cannot run {DRAINSHIM_BIN} ({e}): build it first (cargo build)")
    if r.returncode != 0:
        raise SystemExit(f"check_deploy: `drainshim webhook --help` exits {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def help_flags(text: str) -> dict[str, list[str]]:
    """The long flags a clap --help lists, each with its possible values
    (empty when any value goes)."""
    out: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        m = re.match(r"\s{2,6}(?:-\w, )?--([a-z][a-z0-9-]*)", line)
        if m:
            cur = m.group(1)
            out[cur] = []
            continue
        v = re.match(r"\s+- ([a-z0-9][a-z0-9-]*):", line)
        if cur and v:
            out[cur].append(v.group(1))
    out.pop("help", None)
    return out


def _ns(doc: dict) -> str:
    return (doc.get("metadata") or {}).get("namespace") or ""


def _name(doc: dict) -> str:
    return (doc.get("metadata") or {}).get("name") or ""


def _find(docs: list[dict], kind: str, ns: str, name: str) -> dict | None:
    return next((d for d in docs if d.get("kind") == kind and _ns(d) == ns and _name(d) == name), None)


def _scaled(v, total: int, round_up: bool) -> int:
    """An int-or-percent field of a Deployment or PodDisruptionBudget, as the
    API resolves it against `total`."""
    s = str(v).strip()
    if s.endswith("%"):
        x = float(s[:-1]) * total / 100
        return math.ceil(x) if round_up else math.floor(x)
    return int(s)


def restricted_violations(spec: dict) -> list[str]:
    """What keeps a pod spec from Pod Security "restricted" (and "baseline"):
    host namespaces, privileged, hostPath and other volume types, host ports,
    capabilities, privilege escalation, root, seccomp, SELinux, procMount,
    sysctls, AppArmor."""
    out = []
    psc = spec.get("securityContext") or {}
    for k in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(k) is True:
            out.append(f"{k}: true")
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {v.get('name')}: {sorted(kinds - RESTRICTED_VOLUMES)} (allowed: {sorted(RESTRICTED_VOLUMES)})")
    if psc.get("sysctls"):
        out.append(f"sysctls {[s.get('name') for s in psc['sysctls']]}")
    pod_nonroot = psc.get("runAsNonRoot") is True
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if psc.get("runAsUser") == 0:
        out.append("pod runAsUser: 0")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        out.append(f"pod seccompProfile {pod_seccomp}")
    containers = [(c, "container") for c, _, _ in all_containers(spec)] + \
                 [(c, "ephemeral container") for c in spec.get("ephemeralContainers") or []]
    for c, what in containers:
        n = f"{what} {c.get('name')}"
        sc = c.get("securityContext") or {}
        if sc.get("privileged") is True:
            out.append(f"{n}: privileged: true")
        if (sc.get("windowsOptions") or {}).get("hostProcess") is True or \
                (psc.get("windowsOptions") or {}).get("hostProcess") is True:
            out.append(f"{n}: windowsOptions.hostProcess")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{n}: allowPrivilegeEscalation must be false")
        nonroot = sc.get("runAsNonRoot")
        if nonroot is False or (nonroot is None and not pod_nonroot):
            out.append(f"{n}: runAsNonRoot must be true (on the container or the pod)")
        if sc.get("runAsUser") == 0:
            out.append(f"{n}: runAsUser: 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{n}: seccompProfile {seccomp}, want RuntimeDefault (or Localhost)")
        caps = sc.get("capabilities") or {}
        if "ALL" not in [str(x).upper() for x in caps.get("drop") or []]:
            out.append(f"{n}: capabilities.drop must include ALL")
        added = {re.sub(r"^CAP_", "", str(x).upper()) for x in caps.get("add") or []}
        if not added <= RESTRICTED_ADD_CAPS:
            out.append(f"{n}: capabilities.add {sorted(added - RESTRICTED_ADD_CAPS)}")
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                out.append(f"{n}: hostPort {p['hostPort']}")
        if sc.get("procMount") not in (None, "Default"):
            out.append(f"{n}: procMount {sc['procMount']}")
        for se in (sc.get("seLinuxOptions"), psc.get("seLinuxOptions")):
            if se and (se.get("user") or se.get("role") or se.get("type", "") not in SELINUX_TYPES):
                out.append(f"{n}: seLinuxOptions {se}")
        for aa in (sc.get("appArmorProfile"), psc.get("appArmorProfile")):
            if aa and aa.get("type") == "Unconfined":
                out.append(f"{n}: appArmorProfile Unconfined")
    return out


def stray_args(args: list[str]) -> list[str]:
    """Arguments that are neither a flag nor a flag's value (as flags() pairs
    them)."""
    out, i = [], 0
    while i < len(args):
        if not args[i].startswith("--"):
            out.append(args[i])
        elif "=" not in args[i] and i + 1 < len(args) and not args[i + 1].startswith("--"):
            i += 1
        i += 1
    return out


def _port_number(c: dict, port) -> int | None:
    """A container port by name or number, as probes and Services give it."""
    if isinstance(port, int):
        return port
    return next((p.get("containerPort") for p in c.get("ports") or [] if p.get("name") == port), None)


def _pod_labels(dep: dict) -> dict:
    return ((dep["spec"]["template"].get("metadata") or {}).get("labels")) or {}


@dataclass
class Instance:
    """What check_instance found of one webhook Deployment."""
    flags: dict[str, str]
    listen_port: int | None
    tls_secret: str | None


def check_instance(ck: Checker, where: str, dep: dict, docs: list[dict], shared: list[dict]) -> Instance | None:
    """The Deployment behind a webhook: its container's args (the flags of
    `drainshim webhook --help`, REQUIRED_FLAGS written out), TLS mount,
    probes, replicas and budget, spread, opt-out label, ServiceAccount, Pod
    Security "restricted", NetworkPolicy."""
    spec = dep["spec"]["template"]["spec"]
    c = webhook_container(spec)
    if not ck.check(AREA, c is not None, f"{where}: no single `drainshim webhook` container (image drainshim, args [webhook, ...])"):
        return None
    args = [str(a) for a in c.get("args") or []]
    known = help_flags(webhook_help())
    stray = stray_args(args[1:])
    ck.check(AREA, not stray, f"{where}: args {stray} are neither a flag nor a flag's value")
    unknown = sorted(set(flags(args[1:])) - set(known))
    ck.check(AREA, not unknown, f"{where}: --{', --'.join(unknown)} not a flag of `drainshim webhook --help` "
                                f"({', '.join('--' + k for k in known)}): it would refuse to start")
    env = [e.get("name") for e in c.get("env") or [] if str(e.get("name", "")).startswith("DRAINSHIM_")]
    bad_env = [n for n in env if n[len("DRAINSHIM_"):].lower().replace("_", "-") not in known]
    ck.check(AREA, not bad_env, f"{where}: env {bad_env} names no flag of `drainshim webhook --help`")
    # Effective settings: DRAINSHIM_* env, then the args (as clap reads them).
    f = shim_settings(c)
    missing = sorted(REQUIRED_FLAGS - set(f))
    ck.check(AREA, not missing, f"{where}: --{', --'.join(missing)} not given: write every flag out, so the manifest says what it serves")
    modes = known.get("mode") or []
    ck.check(AREA, f.get("mode", "sidecar") in modes, f"{where}: --mode {f.get('mode')!r}, want one of {modes} (`drainshim webhook --help`)")
    grace = float(spec.get("terminationGracePeriodSeconds", KUBE_GRACE_DEFAULT))
    try:
        delay = duration(f.get("shutdown-delay", "5s"))
        ck.check(AREA, delay < grace,
                 f"{where}: --shutdown-delay {f.get('shutdown-delay')} must be below terminationGracePeriodSeconds {grace:g}: the kubelet would kill it while it still answers")
    except (ValueError, KeyError):
        ck.fail(AREA, f"{where}: --shutdown-delay {f.get('shutdown-delay')!r} is not a duration")
    rev = f.get("revision", DEFAULT_REVISION)
    ck.check(AREA, re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", rev) is not None,
             f"{where}: --revision {rev!r} is not a label value a namespace can carry in {REV} (lower case, digits, '-')")
    ck.check(AREA, "image" not in f or f["image"] == c.get("image"),
             f"{where}: --image {f.get('image')} differs from the webhook's own image {c.get('image')}: a revision injects its own release")
    ck.check(AREA, image_name({"image": f.get("image", "")}) == "drainshim",
             f"{where}: --image {f.get('image')!r} is not a drainshim image")

    ports = {p.get("containerPort"): p for p in c.get("ports") or []}
    listen_port = metrics_port = None
    for flag in ("listen", "metrics-listen"):
        try:
            h, p = host_port(f.get(flag, ""))
        except ValueError:
            ck.fail(AREA, f"{where}: --{flag} {f.get(flag)!r} is not host:port")
            continue
        ck.check(AREA, not is_loopback(h), f"{where}: --{flag} {h}:{p} is loopback: the "
                 + ("API server" if flag == "listen" else "kubelet's probes and Prometheus") + " cannot reach it")
        ck.check(AREA, p in ports, f"{where}: --{flag} port {p} is not a declared container port ({sorted(ports)})")
        if flag == "listen":
            listen_port = p
        else:
            metrics_port = p
    ck.check(AREA, listen_port != metrics_port, f"{where}: --listen and --metrics-listen share port {listen_port}")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        g = (c.get(probe) or {}).get("httpGet") or {}
        ck.check(AREA, g.get("path") == path and _port_number(c, g.get("port")) == metrics_port
                 and str(g.get("scheme", "HTTP")).upper() == "HTTP",
                 f"{where}: {probe} must be httpGet {path} (HTTP) on --metrics-listen's port {metrics_port}, got {g or 'none'}")

    # TLS: both files from one Secret volume, mounted whole and read-only.
    tls_secret = None
    cert, key = PurePosixPath(f.get("tls-cert", "")), PurePosixPath(f.get("tls-key", ""))
    if ck.check(AREA, cert.is_absolute() and cert.parent == key.parent,
                f"{where}: --tls-cert {cert} and --tls-key {key} must be absolute paths in one directory (the Secret's volume)"):
        mounts = [m for m in c.get("volumeMounts") or [] if PurePosixPath(m.get("mountPath", "")) == cert.parent]
        if ck.check(AREA, len(mounts) == 1, f"{where}: nothing (or more than one volume) is mounted at {cert.parent}, where --tls-cert and --tls-key are"):
            m = mounts[0]
            ck.check(AREA, not m.get("subPath") and not m.get("subPathExpr"),
                     f"{where}: the TLS volume is mounted with subPath: the kubelet never updates such a mount, so a renewed certificate would never reach the webhook")
            ck.check(AREA, m.get("readOnly") is True, f"{where}: mount the TLS volume readOnly: true")
            vol = next((v for v in spec.get("volumes") or [] if v.get("name") == m.get("name")), {})
            sec = vol.get("secret")
            if ck.check(AREA, sec is not None, f"{where}: the volume {m.get('name')!r} at {cert.parent} is not a Secret (cert-manager's)"):
                tls_secret = sec.get("secretName")
                items = {i.get("path"): i.get("key") for i in sec.get("items") or []}
                for fl, want in ((cert, SECRET_CERT), (key, SECRET_KEY)):
                    got = items.get(fl.name, fl.name if not items else None)
                    ck.check(AREA, got == want, f"{where}: {fl} is the Secret's key {got!r}, want {want!r} (cert-manager's)")

    # Replicas, rollout, budget, spread.
    replicas = int(dep["spec"].get("replicas", 1))
    ck.check(AREA, replicas >= 2, f"{where}: replicas {replicas}: while the only one restarts or its node drains, pods are created without drainshim; want 2")
    ru = (dep["spec"].get("strategy") or {}).get("rollingUpdate") or {}
    if (dep["spec"].get("strategy") or {}).get("type", "RollingUpdate") == "Recreate":
        ck.fail(AREA, f"{where}: strategy Recreate stops every replica before starting the new ones")
    else:
        mu = _scaled(ru.get("maxUnavailable", "25%"), replicas, round_up=False)
        ck.check(AREA, replicas - mu >= 1, f"{where}: maxUnavailable {ru.get('maxUnavailable', '25%')} lets a rollout take all {replicas} replicas down")
    labels = _pod_labels(dep)
    # (policy/v1: no selector selects no pod, an empty one every pod.)
    pdbs = [d for d in docs if d.get("kind") == "PodDisruptionBudget" and _ns(d) == _ns(dep)
            and (d.get("spec") or {}).get("selector") is not None and selects(d["spec"]["selector"], labels)]
    if ck.check(AREA, len(pdbs) == 1, f"{where}: {len(pdbs)} PodDisruptionBudgets select its pods, want 1"):
        ps = pdbs[0]["spec"]
        if "minAvailable" in ps:
            keep = _scaled(ps["minAvailable"], replicas, round_up=True)
        else:
            keep = replicas - _scaled(ps.get("maxUnavailable", 1), replicas, round_up=True)
        ck.check(AREA, keep >= 1 and replicas - keep >= 1,
                 f"{where}: PodDisruptionBudget/{_name(pdbs[0])} keeps {keep} of {replicas}: want one replica always up and one "
                 "disruption allowed (minAvailable 1 of 2), or node drains either take both or wait forever")
    spread = [t for t in spec.get("topologySpreadConstraints") or []
              if t.get("topologyKey") == HOSTNAME and int(t.get("maxSkew", 1)) == 1 and selects(t.get("labelSelector") or {}, labels)]
    anti = (spec.get("affinity") or {}).get("podAntiAffinity") or {}
    terms = (anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []) + \
            [t.get("podAffinityTerm") or {} for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution") or []]
    anti_ok = [t for t in terms if t.get("topologyKey") == HOSTNAME and selects(t.get("labelSelector") or {}, labels)]
    ck.check(AREA, bool(spread or anti_ok),
             f"{where}: no topologySpreadConstraints (maxSkew 1) or podAntiAffinity on {HOSTNAME} selecting its own pods: both replicas may share a node")

    # Never injects itself; no token; restricted.
    ck.check(AREA, labels.get(INJECT) == "false",
             f"{where}: its pods lack the label {INJECT}: \"false\": a webhook serving its own namespace would be sent its own pods")
    sa = spec.get("serviceAccountName") or "default"
    sas = [d for d in shared if d.get("kind") == "ServiceAccount" and _ns(d) == _ns(dep) and _name(d) == sa]
    if ck.check(AREA, bool(sas), f"{where}: serviceAccountName {sa!r} is not rendered (deploy/webhook/ holds it for every revision)"):
        ck.check(AREA, spec.get("automountServiceAccountToken") is False or sas[0].get("automountServiceAccountToken") is False,
                 f"{where}: the webhook calls no API: do not mount a ServiceAccount token")
    for v in restricted_violations(spec):
        ck.fail(AREA, f"{where}: not Pod Security \"restricted\": {v}")
    for cc, _, _ in all_containers(spec):
        sc = cc.get("securityContext") or {}
        ck.check(AREA, sc.get("readOnlyRootFilesystem") is True, f"{where}: {cc.get('name')}: readOnlyRootFilesystem must be true")
        res = cc.get("resources") or {}
        ck.check(AREA, bool(res.get("requests")) and "memory" in (res.get("limits") or {}),
                 f"{where}: {cc.get('name')}: needs resource requests and a memory limit")
    ck.check(AREA, not spec.get("hostNetwork"), f"{where}: hostNetwork: the webhook needs the pod network only")
    check_network_policy(ck, where, dep, c, listen_port, metrics_port, shared)
    return Instance(flags=f, listen_port=listen_port, tls_secret=tls_secret)


def check_network_policy(ck: Checker, where: str, dep: dict, c: dict, listen_port: int | None,
                         metrics_port: int | None, shared: list[dict]) -> None:
    """NetworkPolicies selecting the webhook's pods: ingress on --listen from
    anywhere (the API server's address cannot be selected), on
    --metrics-listen from somewhere, and no egress at all."""
    labels = _pod_labels(dep)
    nps = [d for d in shared if d.get("kind") == "NetworkPolicy" and _ns(d) == _ns(dep)
           and selects((d.get("spec") or {}).get("podSelector") or {}, labels)]
    if not ck.check(AREA, bool(nps), f"{where}: no NetworkPolicy selects its pods"):
        return

    def types(np: dict) -> list[str]:
        s = np.get("spec") or {}
        return s.get("policyTypes") or (["Ingress"] + (["Egress"] if "egress" in s else []))

    def allows(rule: dict, port: int | None) -> bool:
        """A rule's ports admit TCP to the container's `port`."""
        if not rule.get("ports"):
            return True
        for p in rule["ports"]:
            if p.get("protocol", "TCP") != "TCP":
                continue
            if "port" not in p:
                return True
            if p.get("endPort") is not None:
                if port is not None and int(p["port"]) <= port <= int(p["endPort"]):
                    return True
            elif _port_number(c, p["port"]) == port:
                return True
        return False

    ingress = [r for np in nps if "Ingress" in types(np) for r in (np["spec"].get("ingress") or [])]
    if any("Ingress" in types(np) for np in nps):
        ck.check(AREA, any(allows(r, listen_port) and not r.get("from") for r in ingress),
                 f"{where}: its NetworkPolicies do not let everyone reach --listen's port {listen_port}: the API server's "
                 "source address cannot be selected, and a review that cannot reach the webhook lets the pod through without drainshim")
        ck.check(AREA, any(allows(r, metrics_port) for r in ingress),
                 f"{where}: its NetworkPolicies let nobody reach --metrics-listen's port {metrics_port} (Prometheus, the probes)")
    egress_policies = [np for np in nps if "Egress" in types(np)]
    egress = [r for np in egress_policies for r in (np["spec"].get("egress") or [])]
    ck.check(AREA, bool(egress_policies) and not egress,
             f"{where}: egress must be denied: a NetworkPolicy with policyTypes Egress and no egress rule (the webhook opens no "
             f"connection); got {len(egress_policies)} such policies, {len(egress)} egress rules")


def namespace_cases(revisions: list[str], own: str) -> list[dict]:
    """Namespaces, by their labels, to run the namespaceSelectors on."""
    out = []
    for name in ("shop", "kube-system", own):
        for inject in (None, "enabled", "disabled", "false"):
            for rev in [None, "unknown", *revisions]:
                for istio in ({}, {"istio-injection": "enabled"}, {"istio.io/rev": "stable"}, {"istio-injection": "disabled"},
                              {"istio-injection": "enabled", "istio.io/rev": "stable"},
                              {"istio-injection": "disabled", "istio.io/rev": "stable"}):
                    labels = {NS_NAME: name, **istio}
                    if inject:
                        labels[INJECT] = inject
                    if rev:
                        labels[REV] = rev
                    out.append(labels)
    return out


def istio_injects(labels: dict) -> bool:
    """A namespace whose pods Istio's injector gets: istio-injection=enabled,
    or istio.io/rev without an istio-injection label (which takes
    precedence)."""
    return labels.get("istio-injection") == "enabled" or ("istio.io/rev" in labels and "istio-injection" not in labels)


def istio_off(labels: dict) -> bool:
    """A namespace whose istio-injection label is there and not "enabled":
    Istio injects none of its pods, whatever istio.io/rev says."""
    return "istio-injection" in labels and labels["istio-injection"] != "enabled"


def wanted(labels: dict, revision: str, own: str, istio: bool, path: str | None = None) -> bool:
    """Which namespaces a revision's (or tag's) webhook must serve: its
    drainshim.io/rev unless drainshim.io/inject opts the namespace out
    (disabled, false: the opt-out beats the revision), or (the default
    revision) drainshim.io/inject=enabled without a revision; never
    kube-system or the webhook's own namespace. The plain paths only
    namespaces Istio does not inject (its Envoy and istio-proxy take the same
    admin port): /inject those without Istio's labels, /inject/no-istio
    those whose istio-injection is not "enabled" (the webhook cannot see a
    namespace's labels: the path tells it); the Istio path only those Istio
    injects. `path` None: either plain path."""
    if labels[NS_NAME] in ("kube-system", own):
        return False
    if istio != istio_injects(labels):
        return False
    if path == INJECT_PATH and (istio_off(labels) or "istio.io/rev" in labels):
        return False
    if path == NO_ISTIO_PATH and not istio_off(labels):
        return False
    if revision == DEFAULT_REVISION:
        return labels.get(INJECT) == "enabled" and REV not in labels
    return labels.get(REV) == revision and labels.get(INJECT) not in OPTED_OUT


def check_entry(ck: Checker, where: str, w: dict) -> None:
    """One webhook entry's own fields."""
    ck.check(AREA, w.get("failurePolicy") == "Ignore",
             f"{where}: failurePolicy {w.get('failurePolicy', 'Fail (the default)')}: want Ignore; the webhook must never block a pod")
    ck.check(AREA, w.get("sideEffects") == "None", f"{where}: sideEffects {w.get('sideEffects')!r}, want None")
    t = w.get("timeoutSeconds", 10)
    ck.check(AREA, int(t) <= MAX_TIMEOUT_SECONDS,
             f"{where}: timeoutSeconds {t}{' (the default)' if 'timeoutSeconds' not in w else ''}: want at most {MAX_TIMEOUT_SECONDS}, "
             "every Pod CREATE in an opted-in namespace waits for it")
    ck.check(AREA, w.get("admissionReviewVersions") == ["v1"],
             f"{where}: admissionReviewVersions {w.get('admissionReviewVersions')}, want [v1] (what `drainshim webhook` reads)")
    ck.check(AREA, w.get("reinvocationPolicy") == "IfNeeded",
             f"{where}: reinvocationPolicy {w.get('reinvocationPolicy', 'Never (the default)')}: want IfNeeded, so it runs again "
             "after Istio's injector (sorted after it by configuration name) has added istio-proxy")
    ck.check(AREA, w.get("matchPolicy", "Equivalent") == "Equivalent", f"{where}: matchPolicy {w.get('matchPolicy')}, want Equivalent")
    want_rule = {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}
    ck.check(AREA, w.get("rules") == [want_rule],
             f"{where}: rules {w.get('rules')}, want exactly {[want_rule]}: Pod CREATE only")
    cc = w.get("clientConfig") or {}
    ck.check(AREA, "url" not in cc and "service" in cc, f"{where}: clientConfig must name the Service, not a url")
    ck.check(AREA, not cc.get("caBundle"),
             f"{where}: clientConfig.caBundle is written in the manifest: cainjector keeps it current ({CA_ANNOTATION}), a written one goes stale")
    osel = w.get("objectSelector") or {}
    for labels, want in (({}, True), ({INJECT: "true"}, True), ({"app": "x"}, True), ({INJECT: "false"}, False)):
        ck.check(AREA, selects(osel, labels) == want,
                 f"{where}: objectSelector {osel or '{}'} {'skips' if want else 'sends'} a pod labelled {labels or 'nothing'}: "
                 f"every pod but those labelled {INJECT}: \"false\" must be sent")


def check_config(ck: Checker, overlay: str, cfg: dict, docs: list[dict], shared: list[dict]) -> list[Revision]:
    """A drainshim MutatingWebhookConfiguration, each webhook and the
    instance it calls."""
    out = []
    ann = ((cfg.get("metadata") or {}).get("annotations") or {}).get(CA_ANNOTATION, "")
    # A revision tag calls the Service of a revision rendered elsewhere, and
    # renders nothing but its configuration.
    tag = _name(cfg)[len(TAG_PREFIX):] if _name(cfg).startswith(TAG_PREFIX) else None
    pool = shared if tag is not None else docs
    if tag is not None:
        others = sorted({f"{d.get('kind')}/{_name(d)}" for d in docs if d is not cfg})
        ck.check(AREA, not others,
                 f"{overlay}: the revision tag {tag!r} also renders {others}: a tag is its MutatingWebhookConfiguration "
                 "alone, the objects behind it are its revision's")
    for w in cfg.get("webhooks") or []:
        where = f"{overlay}: MutatingWebhookConfiguration/{_name(cfg)} {w.get('name')}"
        check_entry(ck, where, w)
        svc_ref = (w.get("clientConfig") or {}).get("service") or {}
        ns, port = svc_ref.get("namespace") or "", int(svc_ref.get("port", 443))
        ck.check(AREA, svc_ref.get("path") in (INJECT_PATH, ISTIO_PATH, NO_ISTIO_PATH),
                 f"{where}: clientConfig.service.path {svc_ref.get('path')!r}, want {INJECT_PATH} (or {ISTIO_PATH} for "
                 f"namespaces Istio injects, {NO_ISTIO_PATH} for those whose istio-injection is not enabled)")
        rev = Revision(overlay, where, _name(cfg), str(w.get("name")), None, ns, w.get("namespaceSelector") or {},
                       svc_ref.get("path") == ISTIO_PATH, svc_ref.get("path") or INJECT_PATH, tag)
        out.append(rev)
        svc = _find(pool, "Service", ns, svc_ref.get("name", ""))
        if not ck.check(AREA, svc is not None, f"{where}: clientConfig names Service {ns}/{svc_ref.get('name')}, which is not rendered "
                        + ("by any revision" if tag is not None else "with it")):
            continue
        sp = [p for p in (svc.get("spec") or {}).get("ports") or [] if int(p.get("port", 0)) == port]
        ck.check(AREA, len(sp) == 1, f"{where}: Service {ns}/{_name(svc)} has no port {port} (clientConfig.service.port)")
        sel = (svc.get("spec") or {}).get("selector") or {}
        deps = [d for d in pool if d.get("kind") == "Deployment" and _ns(d) == ns and sel
                and all(_pod_labels(d).get(k) == v for k, v in sel.items())]
        if not ck.check(AREA, len(deps) == 1, f"{where}: Service {ns}/{_name(svc)} selects {len(deps)} Deployments, want the webhook's one"):
            continue
        dep = deps[0]
        dwhere = f"{overlay}: Deployment/{_name(dep)}"
        inst = check_instance(ck, dwhere, dep, pool, shared)
        if inst is None:
            continue
        c = webhook_container(dep["spec"]["template"]["spec"])
        if sp:
            tp = sp[0].get("targetPort", port)
            ck.check(AREA, _port_number(c, tp) == inst.listen_port,
                     f"{where}: Service port {port} -> targetPort {tp!r}, which is not --listen's port {inst.listen_port}")
        rev.revision = inst.flags.get("revision", DEFAULT_REVISION)
        own = _pod_labels(dep)
        ck.check(AREA, not selects(w.get("objectSelector") or {}, own),
                 f"{where}: its objectSelector sends the webhook's own pods ({own}) to it")

        # The namespaces it serves: its revision's, never its own or kube-system.
        # (That its webhooks together serve all of them: check_webhooks.)
        wrong = [str(lab) for lab in namespace_cases([rev.serves], ns)
                 if selects(rev.namespace_selector, lab) and not wanted(lab, rev.serves, ns, rev.istio, rev.path)]
        ck.check(AREA, not wrong,
                 f"{where}: namespaceSelector {rev.namespace_selector} for "
                 + (f"the tag {tag!r} (of revision {rev.revision!r})" if tag is not None else f"revision {rev.revision!r}")
                 + ": want only namespaces labelled "
                 + (f"{INJECT}=enabled without {REV}" if rev.serves == DEFAULT_REVISION
                    else f"{REV}={rev.serves} and no opting-out {INJECT} ({', '.join(OPTED_OUT)})")
                 + (", that Istio injects" if rev.istio else ", that Istio does not inject"
                    + (" (istio-injection not enabled)" if rev.path == NO_ISTIO_PATH else " (no Istio label)"))
                 + f", never kube-system nor its own namespace {ns}; it selects " + "; ".join(wrong[:3]))

        # TLS: the CA annotation names a Certificate for this Service, whose Secret is mounted.
        cns, _, cname = ann.partition("/")
        crt = _find(pool, "Certificate", cns, cname) if cname else None
        if not ck.check(AREA, crt is not None,
                        f"{where}: {CA_ANNOTATION} {ann!r} names no Certificate rendered with it: no caBundle, every call fails TLS and lets pods through"):
            continue
        cs = crt.get("spec") or {}
        dns = f"{_name(svc)}.{ns}.svc"
        ck.check(AREA, dns in (cs.get("dnsNames") or []),
                 f"{where}: Certificate {cns}/{cname} has dnsNames {cs.get('dnsNames')}, without {dns}, the name the API server connects to")
        ck.check(AREA, cs.get("secretName") == inst.tls_secret,
                 f"{where}: Certificate {cns}/{cname} writes Secret {cs.get('secretName')!r}, but {dwhere} mounts {inst.tls_secret!r}")
        ck.check(AREA, cs.get("isCA") is not True, f"{where}: Certificate {cns}/{cname} is a CA, not a serving certificate")
        iref = cs.get("issuerRef") or {}
        issuer = _find(shared, "Issuer", cns, iref.get("name", "")) if iref.get("kind", "Issuer") == "Issuer" else None
        if ck.check(AREA, issuer is not None, f"{where}: Certificate {cns}/{cname}: issuer {iref} is not rendered (deploy/webhook/ holds the CA)"):
            ca = (issuer.get("spec") or {}).get("ca")
            if ca is not None:
                roots = [d for d in shared if d.get("kind") == "Certificate" and _ns(d) == cns
                         and (d.get("spec") or {}).get("secretName") == ca.get("secretName") and (d.get("spec") or {}).get("isCA") is True]
                ck.check(AREA, len(roots) == 1, f"{where}: CA Issuer {_name(issuer)} reads Secret {ca.get('secretName')!r}, which no rendered isCA Certificate writes")
        print(f"  {where} ({f'tag {tag} -> ' if tag is not None else ''}revision {rev.revision}) -> Service {ns}/{_name(svc)}:{port}{svc_ref.get('path')} -> {dwhere} "
              f"(--listen :{inst.listen_port}, {dep['spec'].get('replicas')} replicas, mode {inst.flags.get('mode')}, "
              f"injects {inst.flags.get('image')}); Certificate {cname} ({dns}) -> Secret {inst.tls_secret}")
    return out


def check_webhooks(ck: Checker, rendered: dict[str, list[dict]]) -> list[Revision]:
    """Every drainshim MutatingWebhookConfiguration in the rendered overlays,
    and across them: one revision per webhook, unique names, no namespace
    served twice, no object rendered by two revisions."""
    overlays = {o: docs for o, docs in rendered.items() if any(is_drainshim_config(d) for d in docs)}
    shared = [d for docs in overlays.values() for d in docs]
    revisions: list[Revision] = []
    for overlay, docs in overlays.items():
        configs = [d for d in docs if is_drainshim_config(d)]
        found: list[Revision] = []
        for cfg in configs:
            found += check_config(ck, overlay, cfg, docs, shared)
        if overlay in OVERLAYS_WITH_WEBHOOK:
            want = OVERLAYS_WITH_WEBHOOK[overlay]
            got = sorted({r.revision or "?" for r in found})
            ck.check(AREA, got == [want], f"{overlay}: renders webhook revisions {got}, want exactly [{want!r}]")
            # Every namespace a revision may serve has its webhook: with
            # Istio's injection and without.
            ck.check(AREA, {r.istio for r in found} == {False, True},
                     f"{overlay}: its webhooks' paths cover {'only' if found else 'no'} "
                     f"{' and '.join(sorted({ISTIO_PATH if r.istio else INJECT_PATH for r in found}))}: want {INJECT_PATH} "
                     f"(namespaces Istio does not inject) and {ISTIO_PATH} (those it does)")
        revisions += found
    for overlay in OVERLAYS_WITH_WEBHOOK:
        ck.check(AREA, overlay in overlays, f"{overlay}: renders no drainshim MutatingWebhookConfiguration")
    if not revisions:
        return revisions

    # Across revisions: names (the API server's fail-open counter is by
    # webhook name), revisions, and the objects each renders.
    by_name: dict[str, str] = {}
    by_rev: dict[str, tuple[str, str]] = {}
    for r in revisions:
        ck.check(AREA, r.webhook not in by_name, f"{r.where}: webhook name {r.webhook!r} also in {by_name.get(r.webhook)}")
        by_name.setdefault(r.webhook, r.where)
        if r.serves is not None:
            other = by_rev.setdefault(r.serves, (r.overlay, r.config))
            ck.check(AREA, other == (r.overlay, r.config),
                     f"{r.where}: {'tag' if r.tag is not None else 'revision'} {r.serves!r} is also served by {other[0]}: {other[1]}")
    owners: dict[tuple[str, str, str], str] = {}
    for overlay, docs in overlays.items():
        for d in docs:
            key = (d.get("kind"), _ns(d), _name(d))
            ck.check(AREA, key not in owners,
                     f"{overlay}: {key[0]} {key[1]}/{key[2]} is also rendered by {owners.get(key)}: applying one revision would replace the other's")
            owners.setdefault(key, overlay)
    names = sorted({r.serves for r in revisions if r.serves and r.serves != DEFAULT_REVISION})
    for labels in {tuple(sorted(lab.items())) for r in revisions for lab in namespace_cases(names, r.namespace)}:
        lab = dict(labels)
        serving = [r.webhook for r in revisions if selects(r.namespace_selector, lab)]
        ck.check(AREA, len(serving) <= 1,
                 f"a namespace labelled {lab} is served by {len(serving)} webhooks {serving}: each pod would get drainshim twice")
    # Each revision's webhooks together serve every namespace it must: the
    # plain path those Istio leaves alone, the Istio path those it injects.
    for key in sorted({(r.overlay, r.config) for r in revisions}):
        mine = [r for r in revisions if (r.overlay, r.config) == key]
        rev_name = next((r.serves for r in mine if r.serves), None)
        if rev_name is None:
            continue
        for istio in (False, True):
            sels = [r.namespace_selector for r in mine if r.istio == istio]
            missed = [str(lab) for lab in namespace_cases([rev_name], mine[0].namespace)
                      if wanted(lab, rev_name, mine[0].namespace, istio) and not any(selects(sel, lab) for sel in sels)]
            ck.check(AREA, not missed,
                     f"{key[0]}: MutatingWebhookConfiguration/{key[1]}: no webhook on {ISTIO_PATH if istio else INJECT_PATH} serves "
                     f"namespaces of revision {rev_name!r} that Istio {'injects' if istio else 'does not inject'}: "
                     + "; ".join(missed[:3]))
    defaults = sorted({(r.overlay, r.config) for r in revisions if r.tag is None and r.revision == DEFAULT_REVISION})
    ck.check(AREA, len(defaults) == 1,
             f"want exactly one default revision (drainshim.io/inject=enabled), found {defaults}")
    return revisions

