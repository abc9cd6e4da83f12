"""`drainshim webhook`, the real binary, over real HTTPS: AdmissionReviews
built from workloads written outside the project, posted by Python's own
HTTP and TLS clients; the JSON Patch it answers applied by an independent
implementation (the `jsonpatch` package) must give exactly the pod
`drainshim inject` writes. Reviews it cannot handle are allowed unchanged
with a warning; its certificate is rotated while it serves; SIGTERM keeps
it answering for the shutdown delay with /readyz 503. Under Istio, an
emulation of Istio's own injector (`istio_inject`) and of the API server's
admission (`admit`, with reinvocation) make the pod drainshim's webhook must
get right in every mode: classic or native sidecars, the app held until the
proxy starts or not, either webhook called first. Every cell of
deploy/README.md's table of Istio's labels is posted to the path the shipped
configuration calls; a later webhook's changes to drainshim's containers
survive reinvocation; a Service by the app's port name reaches Envoy on
injected pods and the app on the others.

Run: `make webhook-test` (DRAINSHIM_BIN names the binary).
"""

import copy
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import jsonpatch
import pytest
import trustme
import yaml

import kubernetes_validate  # `make pytools` installs it: never a skip

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("DRAINSHIM_BIN") or os.path.join(ROOT, "target", "debug", "drainshim")
# Seconds a condition gets (start, reload, shutdown) on a loaded machine.
DEADLINE = 20

# Workloads as teams outside the project write them: several containers,
# named ports, a preStop of a helper's own, init containers, a StatefulSet,
# a pod that already runs a native sidecar of its own.
WORKLOADS = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: orders, namespace: shop}
spec:
  selector: {matchLabels: {app: orders}}
  template:
    metadata:
      labels: {app: orders}
      annotations: {drainshim.io/app-port: "9090"}
    spec:
      containers:
      - name: server
        image: registry.example.com/shop/orders:4.2.1
        ports: [{name: http, containerPort: 9090}, {name: metrics, containerPort: 9464}]
        volumeMounts: [{name: cache, mountPath: /var/cache/orders}]
      - name: log-shipper
        image: registry.example.com/infra/shipper:7
        lifecycle: {preStop: {exec: {command: [/bin/flush, --all]}}}
      initContainers:
      - {name: migrate, image: registry.example.com/shop/orders:4.2.1, args: [migrate]}
      volumes: [{name: cache, emptyDir: {}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: ledger, namespace: shop}
spec:
  serviceName: ledger
  selector: {matchLabels: {app: ledger}}
  template:
    metadata: {labels: {app: ledger}}
    spec:
      terminationGracePeriodSeconds: 200
      containers:
      - name: ledger
        image: registry.example.com/shop/ledger:1.0.3
        ports: [{name: grpc, containerPort: 7070}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: chat, namespace: shop}
spec:
  selector: {matchLabels: {app: chat}}
  template:
    metadata: {labels: {app: chat}}
    spec:
      initContainers:
      - name: vault-agent
        image: registry.example.com/infra/vault-agent:1.18
        restartPolicy: Always
      containers:
      - name: chat
        image: registry.example.com/shop/chat:3
        ports: [{name: ws, containerPort: 8080}]
"""


def workload_pods():
    """Each workload's pod as the API server sees it at CREATE: its
    template's metadata and spec, a generateName and no name yet."""
    pods = []
    for d in yaml.safe_load_all(WORKLOADS):
        t = d["spec"]["template"]
        meta = copy.deepcopy(t["metadata"])
        meta["generateName"] = d["metadata"]["name"] + "-"
        meta["namespace"] = "shop"
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": copy.deepcopy(t["spec"])})
    return pods


def review(obj, uid="u-1", operation="CREATE", kind="Pod", group=""):
    resource = {"group": group, "version": "v1", "resource": kind.lower() + "s"}
    gvk = {"group": group, "version": "v1", "kind": kind}
    return {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid, "kind": gvk, "resource": resource, "requestKind": gvk, "requestResource": resource,
            "namespace": "shop", "operation": operation, "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": obj, "oldObject": None, "dryRun": False,
        },
    }


def inject(pod, mode):
    """What `drainshim inject` writes for the pod."""
    r = subprocess.run([BIN, "inject", "--mode", mode, "--revision", "canary"], input=yaml.safe_dump(pod), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return yaml.safe_load(r.stdout)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_pair(ca, directory, not_after=None):
    """A serving certificate from `ca`, written as the kubelet updates a
    mounted Secret: new files, then renamed over the old ones."""
    cert = ca.issue_cert("127.0.0.1", "drainshim-webhook.drainshim-system.svc", not_after=not_after)
    crt, key = os.path.join(directory, "tls.crt"), os.path.join(directory, "tls.key")
    for path, blob in ((crt, b"".join(p.bytes() for p in cert.cert_chain_pems)), (key, cert.private_key_pem.bytes())):
        with open(path + ".new", "wb") as f:
            f.write(blob)
        os.replace(path + ".new", path)
    return crt, key


def wait(cond, what, deadline=DEADLINE):
    end = time.monotonic() + deadline
    last = None
    while time.monotonic() < end:
        try:
            if cond():
                return
        except Exception as e:  # not up yet: retry until the deadline
            last = e
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {deadline}s (last error: {last})")


class Webhook:
    """The real binary, on ports of its own, with a certificate of a CA
    made for the test."""

    def __init__(self, mode, extra=(), not_after=None):
        self.dir = tempfile.mkdtemp(prefix="drainshim-webhook-")
        self.ca = trustme.CA()
        self.crt, self.key = write_pair(self.ca, self.dir, not_after)
        self.port, self.metrics_port = free_port(), free_port()
        self.log = open(os.path.join(self.dir, "log"), "w+")
        self.proc = subprocess.Popen(
            [BIN, "webhook", "--listen", f"127.0.0.1:{self.port}", "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
             "--tls-cert", self.crt, "--tls-key", self.key, "--tls-reload-interval", "200ms",
             "--mode", mode, "--revision", "canary", "--shutdown-delay", "2s", *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait(lambda: self.get("/healthz")[0] == 200, "the webhook's /healthz")

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=5) as r:
            return r.status, r.read().decode()

    def context(self, ca=None):
        ctx = ssl.create_default_context()
        (ca or self.ca).configure_trust(ctx)
        return ctx

    def connect(self, ca=None):
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context(ca), timeout=10)

    def post(self, body, conn=None, path="/inject"):
        c = conn or self.connect()
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        c.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if conn is None:
            c.close()
        return r.status, (json.loads(data) if r.status == 200 else data.decode())

    def counts(self):
        _, text = self.get("/metrics")
        out = {}
        for line in text.splitlines():
            if line.startswith("drainshim_webhook_reviews_total{"):
                labels, value = line.rsplit(" ", 1)
                out[labels[labels.index("{"):]] = float(value)
        return out

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=DEADLINE)


@pytest.fixture(params=["sidecar", "native-sidecar"])
def hook(request):
    assert os.access(BIN, os.X_OK), f"no drainshim binary at {BIN}: run `cargo build --locked` or set DRAINSHIM_BIN"
    w = Webhook(request.param)
    w.mode = request.param
    yield w
    w.stop()
    print(w.output())


def outcome(labels):
    return f'{{revision="canary",outcome="{labels}"}}'


def test_the_patch_gives_the_pod_inject_writes(hook):
    for pod in workload_pods():
        status, answer = hook.post(review(pod, uid="uid-" + pod["metadata"]["generateName"]))
        assert status == 200, answer
        r = answer["response"]
        assert r["uid"] == "uid-" + pod["metadata"]["generateName"] and r["allowed"] is True, r
        assert r.get("patchType") == "JSONPatch", r
        import base64
        patch = jsonpatch.JsonPatch(json.loads(base64.b64decode(r["patch"])))
        got = patch.apply(pod)
        want = inject(pod, hook.mode)
        assert got == want, f"{pod['metadata']['generateName']}: the webhook's patch and inject differ:\n" \
                            f"{json.dumps(jsonpatch.make_patch(want, got).patch, indent=1)}"
        # Its own answer to the pod it injected: nothing more to do (the
        # API server reinvokes it after later webhooks, as under Istio).
        status, again = hook.post(review(got))
        assert status == 200 and "patch" not in again["response"], again
    counts = hook.counts()
    assert counts.get(outcome("injected")) == 3, counts
    assert counts.get(outcome("unchanged")) == 3, counts


def test_what_it_cannot_handle_is_allowed_unchanged_with_a_warning(hook):
    orders = workload_pods()[0]
    ambiguous = copy.deepcopy(orders)
    del ambiguous["metadata"]["annotations"]
    opted_out = copy.deepcopy(orders)
    opted_out["metadata"]["labels"]["drainshim.io/inject"] = "false"
    bad_limit = copy.deepcopy(orders)
    bad_limit["metadata"]["annotations"]["drainshim.io/proxy-cpu-limit"] = "two"
    # Drain timers past the grace period with the shim's linger, as --check refuses them.
    bad_timers = copy.deepcopy(orders)
    bad_timers["metadata"]["annotations"]["drainshim.io/drain-time"] = "100s"
    bad_timers["metadata"]["annotations"]["drainshim.io/parent-shutdown-time"] = "115s"
    cases = [
        (review(ambiguous), "refused", "ambiguous"),
        (review({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}, kind="Deployment",
                group="apps"), "malformed", "injects Pods on CREATE"),
        (review(orders, operation="UPDATE"), "malformed", "injects Pods on CREATE"),
        (review({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": "none"}}),
         "refused", "not a valid Kubernetes pod"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u-9", "object": 7}},
         "malformed", "not an AdmissionReview"),
        (review(opted_out), "opted_out", None),
        # A Job's pod: runs to completion, a classic sidecar would keep it up forever.
        (review(dict(orders, spec=dict(orders["spec"], restartPolicy="Never"))), "unchanged", None),
        # A limit of its own that is no quantity: refused, never a crash.
        (review(bad_limit), "refused", "drainshim.io/proxy-cpu-limit: \"two\" is not a Kubernetes quantity"),
        (review(bad_timers), "refused",
         "drainshim.io/parent-shutdown-time (115s) plus the shim's linger (10s) must stay below "
         "terminationGracePeriodSeconds (120s)"),
    ]
    for body, result, warning in cases:
        status, answer = hook.post(body)
        assert status == 200, (result, answer)
        r = answer["response"]
        assert r["allowed"] is True and "patch" not in r, (result, r)
        if warning is None:
            assert not r.get("warnings"), r
        else:
            assert any(warning in w for w in r.get("warnings") or []), (warning, r)
    # No uid to answer to: not a review at all.
    status, text = hook.post(b"{not json")
    assert status == 400, text
    counts = hook.counts()
    assert counts.get(outcome("refused")) == 4, counts
    assert counts.get(outcome("malformed")) == 4, counts
    assert counts.get(outcome("opted_out")) == 1, counts
    assert counts.get(outcome("unchanged")) == 1, counts
    assert "pod=shop/orders-*" in hook.output() or "shop/orders-*" in hook.output()


def test_a_pods_drain_timer_annotations_become_its_shims_timers(hook):
    """What plan's drain-timers step recommends, set per workload."""
    pod = copy.deepcopy(workload_pods()[0])
    pod["metadata"]["annotations"]["drainshim.io/drain-time"] = "75s"
    pod["metadata"]["annotations"]["drainshim.io/parent-shutdown-time"] = "100s"
    status, answer = hook.post(review(pod))
    assert status == 200, answer
    got = patched(pod, answer)
    assert got == inject(pod, hook.mode), "the webhook's patch and inject differ"
    containers = got["spec"]["containers"] + got["spec"].get("initContainers", [])
    shim = next(c for c in containers if c["name"] == "drainshim")
    env = {e["name"]: e.get("value") for e in shim.get("env", [])}
    assert env.get("DRAINSHIM_DRAIN_TIME") == "75s", env
    assert env.get("DRAINSHIM_PARENT_SHUTDOWN_TIME") == "100s", env


def patched(pod, answer):
    import base64
    r = answer["response"]
    assert r["allowed"] is True, r
    if "patch" not in r:
        return pod
    return jsonpatch.JsonPatch(json.loads(base64.b64decode(r["patch"]))).apply(pod)


ISTIO_PROXY = {"name": "istio-proxy", "image": "docker.io/istio/proxyv2:1.28.0", "args": ["proxy", "sidecar"]}


@pytest.mark.parametrize("native", [False, True], ids=["classic", "native"])
def test_a_pod_istio_injected_after_the_first_call_gets_the_istio_mode(hook, native):
    """Reinvoked (reinvocationPolicy IfNeeded) after Istio's injector added
    istio-proxy to a pod the plain path injected (a container, or with
    native sidecars an init container that keeps running): the webhook's own
    parts give way to the Istio mode's, the pod `inject --mode istio` writes
    for the pod with Istio's proxy."""
    def add_proxy(p):
        if native:
            p["spec"].setdefault("initContainers", []).append(dict(ISTIO_PROXY, restartPolicy="Always"))
        else:
            p["spec"]["containers"].append(copy.deepcopy(ISTIO_PROXY))
    pod = workload_pods()[2]
    _, first = hook.post(review(pod))
    istio = patched(pod, first)
    add_proxy(istio)
    status, answer = hook.post(review(istio))
    assert status == 200 and not answer["response"].get("warnings"), answer
    with_proxy = copy.deepcopy(pod)
    add_proxy(with_proxy)
    got, want = patched(istio, answer), inject(with_proxy, "istio")
    assert got == want, json.dumps(jsonpatch.make_patch(want, got).patch)
    assert not api_server_refusals(got), api_server_refusals(got)


def test_the_istio_path_sets_istios_settings_then_follows_istios_injection(hook):
    """/inject/istio (the webhooks for namespaces Istio injects), whatever
    --mode says; on /inject too for a pod that asks for Istio's injection by
    label. The first call, before Istio's injector, sets only the annotations
    that injector reads: no container, no label (Istio's injection is the
    mesh admin's and the pod's to ask for). After Istio's injection (classic
    or native sidecars), the API server's next call gives the pod `drainshim
    inject --mode istio` writes for it."""
    orders = workload_pods()[0]
    asks = copy.deepcopy(orders)
    asks["metadata"]["labels"]["sidecar.istio.io/inject"] = "true"
    for pod, path in ((orders, "/inject/istio"), (asks, "/inject")):
        status, answer = hook.post(review(pod), path=path)
        assert status == 200 and not answer["response"].get("warnings"), answer
        first = patched(pod, answer)
        assert first["spec"] == pod["spec"], path
        assert first["metadata"]["labels"] == pod["metadata"]["labels"], path
        annotations = first["metadata"]["annotations"]
        assert annotations["traffic.sidecar.istio.io/excludeInboundPorts"] == "15099", annotations
        assert "drainDuration: 60s" in annotations["proxy.istio.io/config"], annotations
        # Called again before Istio's injector: nothing more.
        status, again = hook.post(review(first), path=path)
        assert status == 200 and "patch" not in again["response"], again
        for native in (False, True):
            istio = istio_inject(first, native)
            status, answer = hook.post(review(istio), path=path)
            assert status == 200 and not answer["response"].get("warnings"), answer
            got, want = patched(istio, answer), inject(istio, "istio")
            assert got == want, f"{path}: " + json.dumps(jsonpatch.make_patch(want, got).patch)
            proxy = next(c for c in everywhere(got) if c["name"] == "istio-proxy")
            assert proxy["image"] == ISTIO_IMAGE and proxy["lifecycle"]["preStop"]["exec"]["command"] == PRESTOP, proxy
            assert [c["name"] for c in everywhere(got)].count("drainshim") == 1, got
            assert got["metadata"]["labels"].get("sidecar.istio.io/inject") == pod["metadata"]["labels"].get(
                "sidecar.istio.io/inject"), got["metadata"]["labels"]
            assert not api_server_refusals(got), api_server_refusals(got)
    # Each pod's first call and the one before Istio's injector.
    assert hook.counts().get(outcome("awaiting_istio")) == 4, hook.counts()
    # An Istio pod that opts out of Istio's injection is not Istio's to get:
    # drainshim's own mode, with a warning that says why.
    off = copy.deepcopy(orders)
    off["metadata"]["labels"]["sidecar.istio.io/inject"] = "false"
    status, answer = hook.post(review(off), path="/inject/istio")
    r = answer["response"]
    assert status == 200 and any("will not inject it" in w and "opts it out" in w for w in r.get("warnings") or []), r
    assert "envoy" in [c["name"] for c in everywhere(patched(off, answer))], r


README = os.path.join(ROOT, "deploy", "README.md")
CONFIG = os.path.join(ROOT, "deploy", "webhook", "webhooks", "mutatingwebhookconfiguration.yaml")


def label_table():
    """deploy/README.md's table of Istio's labels: (namespace labels, pod
    metadata, drainshim's path, what drainshim does) for every cell."""
    with open(README) as f:
        text = f.read()
    rows = text.split("<!-- istio-labels:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows if r.strip().startswith("|")]
    header, paths, body = cells[0], cells[2], cells[3:]

    def pairs(cell):
        return [p.strip() for p in cell.split(",") if p.strip()]

    namespaces = []
    for h in header[1:]:
        labels = {} if h == "no Istio label" else dict(p.strip("`").split("=", 1) for p in pairs(h))
        namespaces.append(labels)
    out = []
    for row in body:
        meta = {"labels": {}, "annotations": {}}
        if row[0] != "no Istio label or annotation":
            for p in pairs(row[0]):
                kind, kv = p.split(" ", 1)
                key, value = kv.strip("`").split(": ", 1)
                meta[kind + "s"][key] = value.strip('"')
        for ns, path, want in zip(namespaces, paths[1:], row[1:]):
            out.append((ns, meta, path.strip("`"), want))
    return out


def selects(selector, labels):
    ok = all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())
    for e in selector.get("matchExpressions") or []:
        value = labels.get(e["key"])
        among = value is not None and value in (e.get("values") or [])
        ok = ok and {"In": among, "NotIn": not among, "Exists": value is not None,
                     "DoesNotExist": value is None}[e["operator"]]
    return ok


def served_path(ns_labels, pod_labels):
    """The path of the one webhook of the shipped configuration the API
    server calls for a pod of this namespace."""
    with open(CONFIG) as f:
        config = yaml.safe_load(f)
    labels = dict(ns_labels, **{"drainshim.io/inject": "enabled", "kubernetes.io/metadata.name": "shop"})
    paths = [w["clientConfig"]["service"]["path"] for w in config["webhooks"]
             if selects(w["namespaceSelector"], labels) and selects(w["objectSelector"], pod_labels)]
    assert len(paths) == 1, (ns_labels, paths)
    return paths[0]


def test_every_combination_of_istios_labels_as_the_readme_says(hook):
    """Each cell of deploy/README.md's table of Istio's labels: the shipped
    configuration calls the path it names, and the real binary takes the
    Istio mode, its own mode, or its own mode with a warning and a count."""
    table = label_table()
    assert len(table) == 48, len(table)
    warned = {}
    for ns, meta, path, want in table:
        pod = workload_pods()[1]
        for field in ("labels", "annotations"):
            pod["metadata"].setdefault(field, {}).update(meta[field])
        where = f"namespace {ns or '-'}, pod {meta}"
        assert served_path(ns, pod["metadata"]["labels"]) == path, where
        status, answer = hook.post(review(pod), path=path)
        assert status == 200, (where, answer)
        r = answer["response"]
        got = patched(pod, r and answer)
        names = [c["name"] for c in everywhere(got)]
        warnings = r.get("warnings") or []
        if want == "Istio":
            assert names == [c["name"] for c in everywhere(pod)] and not warnings, (where, names, warnings)
            assert got["metadata"]["annotations"]["traffic.sidecar.istio.io/excludeInboundPorts"] == "15099", where
            assert got["metadata"]["labels"] == pod["metadata"]["labels"], where
        else:
            assert "envoy" in names and "istio-proxy" not in names, (where, names)
            if want == "plain":
                assert not warnings, (where, warnings)
            else:
                reason = want.split("`")[1]
                assert want.startswith("plain, warned") and len(warnings) == 1, (where, want, warnings)
                assert "will not inject it" in warnings[0], (where, warnings)
                warned[reason] = warned.get(reason, 0) + 1
    _, text = hook.get("/metrics")
    for reason, n in warned.items():
        line = f'drainshim_webhook_istio_declined_total{{revision="canary",reason="{reason}"}} {n}'
        assert line in text, (line, [l for l in text.splitlines() if "istio_declined" in l])
    assert set(warned) == {"namespace_disabled", "pod_opted_out", "annotation_only", "label_not_true"}, warned


def test_a_later_webhooks_changes_to_drainshims_containers_survive_reinvocation(hook):
    """A registry mirror and a security policy called after drainshim (its
    reinvocationPolicy is IfNeeded): the second call keeps their changes to
    drainshim's containers, and `inject --uninject` takes out exactly what
    drainshim added."""
    mirror = "mirror.example.com/"

    def mirror_and_policy(p):
        p = copy.deepcopy(p)
        for c in everywhere(p):
            if not c["image"].startswith(mirror):
                c["image"] = mirror + c["image"]
            c.setdefault("securityContext", {}).setdefault("runAsUser", 10001)
        return p

    def drainshim(p):
        status, answer = hook.post(review(p))
        assert status == 200, answer
        return patched(p, answer)

    for original in workload_pods():
        pod, calls = admit(original, [("drainshim", True, drainshim), ("mirror", False, mirror_and_policy)])
        assert calls == ["drainshim", "mirror", "drainshim"], calls
        ours = [c for c in everywhere(pod) if c["name"] in ("drainshim", "envoy", "drainshim-install")]
        assert len(ours) == 3, [c["name"] for c in everywhere(pod)]
        for c in ours:
            assert c["image"].startswith(mirror) and c["securityContext"]["runAsUser"] == 10001, c
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, c
            assert "cpu" in c["resources"]["limits"] and "memory" in c["resources"]["limits"], c
        assert not api_server_refusals(pod) and not schema_errors(pod)
        assert uninject(pod) == mirror_and_policy(original)


def test_a_service_by_the_apps_port_name_reaches_envoy_on_injected_pods_and_the_app_on_others(hook):
    """The endpoints controller's resolution of a named targetPort (the first
    container port of that name, then the native sidecars'): the app's port
    name is Envoy's on a pod the webhook injected, and still the app's on a
    pod created without it."""
    def find_port(pod, name):
        sidecars = [c for c in pod["spec"].get("initContainers") or [] if c.get("restartPolicy") == "Always"]
        for c in pod["spec"]["containers"] + sidecars:
            for p in c.get("ports") or []:
                if p.get("name") == name and p.get("protocol", "TCP") == "TCP":
                    return c["name"], p["containerPort"]
        return None

    for pod, name, port in ((workload_pods()[1], "grpc", 7070), (workload_pods()[2], "ws", 8080)):
        status, answer = hook.post(review(pod))
        assert status == 200 and not answer["response"].get("warnings"), answer
        injected = patched(pod, answer)
        assert find_port(injected, name) == ("envoy", 10000), injected
        assert find_port(pod, name)[1] == port
        app = injected["spec"]["containers"][0]
        assert [p for p in app["ports"] if p["containerPort"] == port][0]["name"] == f"app-{port}", app
    # An app port without a name: envoy-inbound, and a warning to name it.
    unnamed = workload_pods()[1]
    del unnamed["spec"]["containers"][0]["ports"][0]["name"]
    status, answer = hook.post(review(unnamed))
    warnings = answer["response"].get("warnings") or []
    assert any("has no name" in w for w in warnings), answer
    assert find_port(patched(unnamed, answer), "envoy-inbound") == ("envoy", 10000)


# === Istio's injector and the API server, emulated ===
#
# Istio's sidecar injector (istio/istio pkg/kube/inject: RunTemplate,
# injectPod, reapplyOverwrittenContainers, postProcessPod, reorderPod, and
# the sidecar template), read and written again here in the parts that decide
# where drainshim's parts land; the Rust unit tests have their own
# (src/inject/tests/istio_injector.rs). Left out: the proxy's environment,
# probe rewriting, CNI, and re-injection (Istio's webhook has
# reinvocationPolicy Never by default).

ISTIO_IMAGE = ISTIO_PROXY["image"]
STATUS_PORT = "15020"
PRESTOP = ["/drainshim/drainshim", "prestop"]
# Each workload's app container and port.
APPS = {"orders-": ("server", "9090"), "ledger-": ("ledger", "7070"), "chat-": ("chat", "8080")}
MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name", "env": "name",
              "volumeMounts": "mountPath", "ports": "containerPort"}


def smp(into, patch):
    """A strategic merge patch: maps field by field, the keyed lists of a pod
    item by item (a new item last), anything else replaced."""
    for k, v in patch.items():
        if k in into and k in MERGE_KEYS and isinstance(v, list) and isinstance(into[k], list):
            for item in v:
                same = next((i for i in into[k] if i.get(MERGE_KEYS[k]) == item.get(MERGE_KEYS[k])), None)
                if same is None:
                    into[k].append(copy.deepcopy(item))
                else:
                    smp(same, item)
        elif k in into and isinstance(v, dict) and isinstance(into[k], dict):
            smp(into[k], v)
        else:
            into[k] = copy.deepcopy(v)


def find(containers, name):
    return next((c for c in containers or [] if c["name"] == name), None)


def take(containers, name):
    c = find(containers, name)
    if c is not None:
        containers.remove(c)
    return c


def holds_app(pod):
    """The pod's ProxyConfig holds the app until the proxy starts."""
    config = yaml.safe_load((pod["metadata"].get("annotations") or {}).get("proxy.istio.io/config") or "") or {}
    return config.get("holdApplicationUntilProxyStarts") is True


def istio_template(pod, native):
    """The sidecar template, rendered for the pod."""
    annotations = pod["metadata"].get("annotations") or {}
    app = next(c["name"] for c in pod["spec"]["containers"] if c["name"] != "istio-proxy")
    proxy = {
        "name": "istio-proxy", "image": ISTIO_IMAGE,
        "args": ["proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local"],
        "ports": [{"containerPort": 15090, "protocol": "TCP", "name": "http-envoy-prom"}],
        "readinessProbe": {"httpGet": {"path": "/healthz/ready", "port": 15021}, "periodSeconds": 15},
        "startupProbe": {"httpGet": {"path": "/healthz/ready", "port": 15021}, "periodSeconds": 1},
        "volumeMounts": [{"name": "istio-envoy", "mountPath": "/etc/istio/proxy"},
                         {"name": "istio-podinfo", "mountPath": "/etc/istio/pod"}],
    }
    if native:
        proxy["restartPolicy"] = "Always"
        proxy["lifecycle"] = {"preStop": {"exec": {"command": [
            "pilot-agent", "request", f"--debug-port={STATUS_PORT}", "POST", "drain"]}}}
    elif holds_app(pod):
        proxy["lifecycle"] = {"postStart": {"exec": {"command": ["pilot-agent", "wait"]}}}
    # The template's excludeInboundPort: the status port added to the pod's list.
    excluded = [p.strip() for p in annotations.get("traffic.sidecar.istio.io/excludeInboundPorts", "").split(",")
                if p.strip()]
    excluded += [STATUS_PORT] if STATUS_PORT not in excluded else []
    init = {
        "name": "istio-init", "image": ISTIO_IMAGE,
        "args": ["istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*",
                 "-x", "", "-b", "*", "-d", "15090,15021," + ",".join(excluded)],
        "securityContext": {"capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]}, "runAsUser": 0},
    }
    meta = {"labels": {"security.istio.io/tlsMode": "istio",
                       "service.istio.io/canonical-name": (pod["metadata"].get("labels") or {}).get("app", app),
                       "service.istio.io/canonical-revision": "latest"},
            "annotations": {"istio.io/rev": "default"}}
    for k in ("kubectl.kubernetes.io/default-logs-container", "kubectl.kubernetes.io/default-container"):
        if k not in annotations:
            meta["annotations"][k] = app
    return {"metadata": meta, "spec": {
        "initContainers": [init, proxy] if native else [init],
        "containers": [] if native else [proxy],
        "volumes": [{"name": "istio-envoy", "emptyDir": {"medium": "Memory"}},
                    {"name": "istio-podinfo", "downwardAPI": {"items": [
                        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}}],
    }}


def istio_inject(pod, native):
    """Istio's injection of a pod it has not injected before."""
    template = istio_template(pod, native)
    merged = copy.deepcopy(pod)
    spec = merged["spec"]
    if native:
        # A customization in `containers` moves to the init containers first.
        custom = take(spec.get("containers"), "istio-proxy")
        if custom is not None:
            spec.setdefault("initContainers", []).append(custom)
    smp(merged, template)
    # The pod's own istio-proxy (a customization) over the rendered one.
    overrides = {}
    for field in ("containers", "initContainers"):
        for c in template["spec"][field]:
            own = find(pod["spec"].get("containers"), c["name"]) or find(pod["spec"].get("initContainers"), c["name"])
            if own is None:
                continue
            overlay = {k: v for k, v in own.items() if not (k == "image" and v == "auto")}
            smp(spec, {field: [overlay]})
            overrides.setdefault(field, []).append(overlay)
    annotations = merged["metadata"].setdefault("annotations", {})
    if overrides:
        annotations["sidecar.istio.io/proxyOverrides"] = json.dumps(overrides)
    names = {f: [c["name"] for c in template["spec"][f]] or None for f in ("initContainers", "containers", "volumes")}
    annotations["sidecar.istio.io/status"] = json.dumps(dict(names, imagePullSecrets=None, revision="default"))
    annotations.update({"prometheus.io/port": STATUS_PORT, "prometheus.io/path": "/stats/prometheus",
                        "prometheus.io/scrape": "true"})
    # reorderPod, reading where the proxy goes from the pod as it came in.
    proxy = take(spec["containers"], "istio-proxy")
    if proxy is not None:
        spec["containers"].insert(0 if holds_app(pod) else len(spec["containers"]), proxy)
    native_proxy, iptables = take(spec["initContainers"], "istio-proxy"), take(spec["initContainers"], "istio-init")
    if native_proxy is not None:
        spec["initContainers"][:0] = [iptables, native_proxy]
    else:
        spec["initContainers"].append(iptables)
    return merged


def admit(pod, hooks):
    """The API server's mutating admission: each webhook (name,
    reinvocationPolicy IfNeeded, call) in turn, then again each IfNeeded one
    that a later one changed the pod after. The pod and whose call each was."""
    calls, called, again = [], [], []
    for reinvocation in (False, True):
        for i, (name, if_needed, call) in enumerate(hooks):
            if reinvocation and i not in again:
                continue
            out = call(pod)
            calls.append(name)
            if out != pod:
                again, called = again + called, []
            if if_needed:
                called.append(i)
            pod = out
    return pod, calls


def api_server_refusals(pod):
    """What the API server's validation of a pod spec (ValidatePodSpec)
    answers 422 to, in the rules a mutating webhook can break."""
    spec, out = pod["spec"], []
    volumes = [v["name"] for v in spec.get("volumes") or []]
    if len(set(volumes)) != len(volumes):
        out.append(f"spec.volumes: Duplicate value: {volumes}")
    seen = set()
    for field in ("initContainers", "containers"):
        for c in spec.get(field) or []:
            at = f"spec.{field}[{c['name']}]"
            # Names are unique across containers and init containers.
            if c["name"] in seen:
                out.append(f"{at}.name: Duplicate value: {c['name']!r}")
            seen.add(c["name"])
            if not c.get("image"):
                out.append(f"{at}.image: Required value")
            restartable = field == "initContainers" and c.get("restartPolicy") == "Always"
            if "restartPolicy" in c and not restartable:
                out.append(f"{at}.restartPolicy: Forbidden: only Always, on init containers")
            for k in ("lifecycle", "livenessProbe", "readinessProbe", "startupProbe"):
                if field == "initContainers" and not restartable and k in c:
                    out.append(f"{at}.{k}: Forbidden: may not be set for init containers without restartPolicy=Always")
            for hook_name, handler in (c.get("lifecycle") or {}).items():
                if len([k for k in ("exec", "httpGet", "tcpSocket", "sleep") if k in handler]) != 1:
                    out.append(f"{at}.lifecycle.{hook_name}: must specify exactly one handler type")
            paths = [m["mountPath"] for m in c.get("volumeMounts") or []]
            if len(set(paths)) != len(paths):
                out.append(f"{at}.volumeMounts.mountPath: must be unique: {paths}")
            out += [f"{at}.volumeMounts.name: Not found: {m['name']!r}" for m in c.get("volumeMounts") or []
                    if m["name"] not in volumes]
    return out


def schema_errors(pod):
    """The pod against Kubernetes' schemas (kubernetes-validate, strict), as
    `make deploy-check` holds manifests: the oldest supported and the latest."""
    errors = []
    for version in ("1.30.0", kubernetes_validate.latest_version()):
        try:
            kubernetes_validate.validate(pod, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"Kubernetes {version}: {e.message} at {'.'.join(map(str, e.path))}")
    return errors


def uninject(pod):
    r = subprocess.run([BIN, "inject", "--uninject"], input=yaml.safe_dump(pod), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return yaml.safe_load(r.stdout)


def everywhere(pod):
    return (pod["spec"].get("initContainers") or []) + pod["spec"]["containers"]


def check_istio_pod(original, pod, native, hold, istio_path_first, again):
    """What the pod the API server creates must be, in one case; `again`
    calls drainshim's webhook once more."""
    errors = api_server_refusals(pod) + schema_errors(pod)
    assert not errors, errors
    app, port = APPS[original["metadata"]["generateName"]]
    # drainshim's preStop on the app, wherever the proxy went; the pod's
    # other containers keep their own.
    assert find(pod["spec"]["containers"], app)["lifecycle"]["preStop"]["exec"]["command"] == PRESTOP
    for c in original["spec"]["containers"]:
        if c["name"] != app:
            assert find(pod["spec"]["containers"], c["name"]).get("lifecycle") == c.get("lifecycle")
    # And on Istio's proxy, where Istio put it, once.
    proxies = [c for c in everywhere(pod) if c["name"] == "istio-proxy"]
    assert len(proxies) == 1, [c["name"] for c in everywhere(pod)]
    proxy = proxies[0]
    assert proxy["image"] == ISTIO_IMAGE and proxy["lifecycle"]["preStop"]["exec"]["command"] == PRESTOP, proxy
    assert "drainshim-bin" in [m["name"] for m in proxy["volumeMounts"]], proxy
    if native:
        assert proxy["restartPolicy"] == "Always" and proxy in pod["spec"]["initContainers"], proxy
    else:
        names = [c["name"] for c in pod["spec"]["containers"]]
        assert names.index("istio-proxy") == (0 if hold else len(names) - 2), names
    # The guard forwards to the app's port: $(APP_PORT) is the annotation,
    # and the routing objects select the label.
    shim = find(pod["spec"]["containers"], "drainshim")
    assert "--guard-upstream=127.0.0.1:$(APP_PORT)" in shim["args"], shim
    meta = pod["metadata"]
    for got in (meta["annotations"]["drainshim.io/app-port"], meta["labels"]["drainshim.io/app-port"]):
        assert got == port and got not in ("15090", "15020", "15021"), meta
    # Injected once: another call changes nothing.
    assert again(pod) == pod
    # Uninjected: what Istio alone makes of the pod. When drainshim went first
    # on Istio's path, its first call set only Istio's settings, and Istio
    # keeps one record of them: its iptables rules leave drainshim's port alone.
    want = istio_inject(original, native)
    if istio_path_first:
        iptables = find(pod["spec"]["initContainers"], "istio-init")
        assert iptables["args"][-1] == "15090,15021,15099,15020", iptables
        find(want["spec"]["initContainers"], "istio-init")["args"] = iptables["args"]
    got = uninject(pod)
    assert got == want, json.dumps(jsonpatch.make_patch(want, got).patch)


@pytest.mark.parametrize("native", [False, True], ids=["classic", "native"])
@pytest.mark.parametrize("hold", [False, True], ids=["no-hold", "hold"])
@pytest.mark.parametrize("first", ["drainshim", "istio"])
@pytest.mark.parametrize("path", ["/inject/istio", "/inject"])
def test_under_istio_every_mode_and_order_gives_a_pod_the_api_server_accepts(hook, native, hold, first, path):
    """Each workload admitted in an Istio namespace: drainshim's webhook
    (reinvocationPolicy IfNeeded) on its Istio path or the plain one (which
    takes the Istio mode once it sees Istio's proxy), Istio's injector
    (Never, its default) with classic or native sidecars, the app held until
    the proxy starts or not, either called first."""
    def drainshim(p):
        status, answer = hook.post(review(p), path=path)
        assert status == 200 and not answer["response"].get("warnings"), answer
        return patched(p, answer)
    webhooks = [("drainshim", True, drainshim), ("istio", False, lambda p: istio_inject(p, native))]
    if first == "istio":
        webhooks.reverse()
    for original in workload_pods():
        if hold:
            original["metadata"].setdefault("annotations", {})["proxy.istio.io/config"] = \
                "holdApplicationUntilProxyStarts: true\n"
        pod, calls = admit(original, webhooks)
        assert calls == (["drainshim", "istio", "drainshim"] if first == "drainshim" else ["istio", "drainshim"])
        check_istio_pod(original, pod, native, hold, first == "drainshim" and path == "/inject/istio", drainshim)


def test_a_rotated_certificate_is_served_and_a_broken_one_is_not(hook):
    status, _ = hook.post(review(workload_pods()[0]))
    assert status == 200
    old_ca = hook.ca
    new_ca = trustme.CA()
    write_pair(new_ca, hook.dir)

    def served_by_new():
        status, _ = hook.post(review(workload_pods()[0]), conn=hook.connect(new_ca))
        return status == 200
    wait(served_by_new, "the rotated certificate being served")
    with pytest.raises(ssl.SSLError):
        hook.post(review(workload_pods()[0]), conn=hook.connect(old_ca))
    # A half-written pair (key of another certificate) keeps the last good one.
    with open(hook.key, "wb") as f:
        f.write(trustme.CA().issue_cert("x").private_key_pem.bytes())
    wait(lambda: 'result="failed"' in hook.get("/metrics")[1], "the failed reload counted")
    assert hook.post(review(workload_pods()[0]), conn=hook.connect(new_ca))[0] == 200
    assert 'drainshim_webhook_certificate_reloads_total{result="ok"} 1' in hook.get("/metrics")[1]


def test_latency_per_review(hook):
    """Not asserted (tests never assert speed): printed for the record."""
    pod = workload_pods()[0]
    for path, mode in (("/inject", hook.mode), ("/inject/istio", "istio")):
        conn = hook.connect()
        times = []
        for i in range(300):
            t = time.perf_counter()
            status, answer = hook.post(review(pod, uid=f"l-{i}"), conn=conn, path=path)
            times.append(time.perf_counter() - t)
            assert status == 200 and "patch" in answer["response"], answer
        conn.close()
        times.sort()
        p50, p99 = times[len(times) // 2], times[int(len(times) * 0.99)]
        print(f"webhook {mode} ({path}): {len(times)} reviews on one connection, p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms")


def test_sigterm_keeps_answering_for_the_delay_then_exits_0(hook):
    hook.proc.send_signal(signal.SIGTERM)

    def not_ready():
        try:
            hook.get("/readyz")
            return False
        except urllib.error.HTTPError as e:
            return e.code == 503
    wait(not_ready, "/readyz 503 after SIGTERM")
    status, answer = hook.post(review(workload_pods()[0]))
    assert status == 200 and answer["response"]["allowed"], answer
    assert hook.proc.wait(timeout=DEADLINE) == 0, hook.output()


# === the server's limits and readiness ===

def gauge(w, name):
    _, text = w.get("/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in\n{text}")


def rejected(w, reason):
    return gauge(w, f'drainshim_webhook_rejected_total{{reason="{reason}"}}')


@pytest.fixture
def limited():
    assert os.access(BIN, os.X_OK), f"no drainshim binary at {BIN}"
    w = Webhook("sidecar", extra=["--body-timeout", "1s", "--max-in-flight", "1", "--max-connections", "3"])
    yield w
    w.stop()
    print(w.output())


def slow_start(w, length=4096):
    """A review's headers and the first bytes of its body, the rest never sent."""
    c = w.connect()
    c.putrequest("POST", "/inject")
    c.putheader("Content-Type", "application/json")
    c.putheader("Content-Length", str(length))
    c.endheaders(b'{"apiVersion": ')
    return c


def test_a_body_trickled_past_the_timeout_is_cut(limited):
    c = slow_start(limited)
    start = time.monotonic()
    r = c.getresponse()
    took = time.monotonic() - start
    assert r.status == 408, (r.status, r.read())
    assert r.getheader("Connection") == "close", r.getheaders()
    assert 0.8 <= took < DEADLINE, took
    c.close()
    assert rejected(limited, "body_timeout") == 1
    # The slot is free again: a whole review is answered.
    status, answer = limited.post(review(workload_pods()[0]))
    assert status == 200 and "patch" in answer["response"], answer


@pytest.fixture
def one_slot():
    """One review at a time, and a body timeout long past the test's
    deadline, so the held review keeps its slot however slow the machine."""
    assert os.access(BIN, os.X_OK), f"no drainshim binary at {BIN}"
    w = Webhook("sidecar", extra=["--body-timeout", f"{DEADLINE * 4}s", "--max-in-flight", "1"])
    yield w
    w.stop()
    print(w.output())


def test_past_the_in_flight_cap_a_review_is_refused_with_retry_after(one_slot):
    limited = one_slot
    held = slow_start(limited)
    # The held review has the one slot once its headers are read.
    status, text = None, None
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        c = limited.connect()
        raw = json.dumps(review(workload_pods()[0])).encode()
        c.request("POST", "/inject", body=raw, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        status, text, retry = r.status, r.read(), r.getheader("Retry-After")
        c.close()
        if status == 429:
            break
        time.sleep(0.05)
    assert status == 429, (status, text)
    assert retry == "1"
    assert rejected(limited, "in_flight") >= 1
    held.close()
    # The slot is free again once the held review's connection is gone.
    wait(lambda: limited.post(review(workload_pods()[0]))[0] == 200, "a review after the held one went")


def test_past_the_connection_cap_a_connection_is_reset(limited):
    held = []
    for _ in range(3):
        c = limited.connect()
        c.connect()
        held.append(c)
    # The server counts a connection once it accepted it: wait until a fourth is turned away.
    def fourth_refused():
        c = limited.connect()
        try:
            c.request("GET", "/inject")
            c.getresponse().read()
            return False
        except (ConnectionError, ssl.SSLError, http.client.RemoteDisconnected, OSError):
            return True
        finally:
            c.close()
    wait(fourth_refused, "a fourth connection refused")
    assert rejected(limited, "connections") >= 1
    for c in held:
        c.close()
    # Below the cap again: served.
    wait(lambda: limited.post(review(workload_pods()[0]))[0] == 200, "a review after the held connections closed")


def test_the_expiry_gauge_says_when_the_certificate_ends():
    import datetime
    from cryptography import x509
    end = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0) + datetime.timedelta(days=3)
    w = Webhook("sidecar", not_after=end)
    try:
        with open(w.crt, "rb") as f:
            not_after = x509.load_pem_x509_certificate(f.read()).not_valid_after_utc
        left = gauge(w, "drainshim_webhook_certificate_expiry_seconds")
        want = not_after.timestamp() - time.time()
        assert abs(left - want) <= 5, (left, want)
        assert w.get("/readyz") == (200, "ok\n")
    finally:
        w.stop()


def test_an_expired_certificate_is_not_ready():
    import datetime
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
    w = Webhook("sidecar", not_after=past)
    try:
        try:
            status, body = w.get("/readyz")
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read().decode()
        assert status == 503 and "expired" in body, (status, body)
        assert gauge(w, "drainshim_webhook_certificate_expiry_seconds") < -3000
        # Renewed (cert-manager writes a new pair): ready again.
        write_pair(w.ca, w.dir)
        wait(lambda: w.get("/readyz")[0] == 200, "/readyz after the renewal")
    finally:
        w.stop()
        print(w.output())


def test_managed_fields_are_never_patched(hook):
    pod = workload_pods()[0]
    pod["metadata"]["managedFields"] = [{
        "manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
        "time": "not a time", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {}}}}]
    status, answer = hook.post(review(pod))
    assert status == 200, answer
    import base64
    ops = json.loads(base64.b64decode(answer["response"]["patch"]))
    assert not [op for op in ops if "managedFields" in op["path"]], ops
    got = patched(pod, answer)
    assert got["metadata"]["managedFields"] == pod["metadata"]["managedFields"]
