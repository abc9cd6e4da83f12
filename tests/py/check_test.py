"""`drainshim check`, the real binary, on the fixtures of
tests/fixtures/check/: the healthy cluster exits 0, each broken one names its
problem and exits 1 (text and `-o json`), stdin is read with `-`, unreadable
input exits 65 and a bad flag 64.

Run: DRAINSHIM_BIN=<binary> python -m pytest tests/py/check_test.py
"""

import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("DRAINSHIM_BIN") or os.path.join(ROOT, "target", "debug", "drainshim")
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "check")
HEALTHY = os.path.join(FIXTURES, "healthy.yaml")

BROKEN = {
    "webhook-ca.yaml": ("webhook-ca", "MutatingWebhookConfiguration/drainshim-canary"),
    "issuer.yaml": ("webhook-ca", "Certificate/drainshim-system/drainshim-webhook-canary"),
    "revision.yaml": ("revision", "Namespace/payments"),
    "tag.yaml": ("revision", "Namespace/reports"),
    "inject-label.yaml": ("revision", "Namespace/ops"),
    "image.yaml": ("revision", "Deployment/drainshim-system/drainshim-webhook-canary"),
    "limit-range.yaml": ("limit-range", "LimitRange/shop/per-container"),
    "service-port.yaml": ("service-port", "Service/shop/cart"),
    "not-injected.yaml": ("not-injected", "Pod/shop/cart-7c9d8-qwert"),
    "istio-mode.yaml": ("istio-mode", "MutatingWebhookConfiguration/istio-revision-tag-default"),
    "istio-routing.yaml": ("istio-routing", "Deployment/mesh/quotes"),
}


def check(*args, stdin=None):
    assert os.access(BIN, os.X_OK), f"no drainshim binary at {BIN}: build it or set DRAINSHIM_BIN"
    return subprocess.run([BIN, "check", *args], input=stdin, capture_output=True, text=True, timeout=30)


def test_the_healthy_cluster_exits_0():
    r = check(HEALTHY)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1] == "0 problem(s), 3 info, in 20 object(s): healthy"


@pytest.mark.parametrize("fixture", sorted(BROKEN))
def test_each_broken_cluster_names_its_problem_and_exits_1(fixture):
    check_id, obj = BROKEN[fixture]
    r = check(HEALTHY, os.path.join(FIXTURES, fixture))
    assert r.returncode == 1, r.stdout + r.stderr
    problems = [l for l in r.stdout.splitlines() if l.startswith("PROBLEM")]
    assert len(problems) == 1, r.stdout
    assert problems[0].split()[1:3] == [check_id, obj + ":"], problems[0]
    assert " -> " in problems[0]
    j = check("-o", "json", HEALTHY, os.path.join(FIXTURES, fixture))
    assert j.returncode == 1
    report = json.loads(j.stdout)
    assert report["problems"] == 1
    found = [f for f in report["findings"] if f["severity"] == "problem"]
    assert [(f["check"], f["object"]) for f in found] == [(check_id, obj)]
    assert found[0]["fix"]


def test_stdin_is_read_with_a_dash():
    with open(HEALTHY) as f:
        healthy = f.read()
    r = check("-", os.path.join(FIXTURES, "revision.yaml"), stdin=healthy)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Namespace/payments" in r.stdout


def test_unreadable_input_exits_65_and_a_bad_flag_64(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [unclosed\n")
    r = check(str(bad))
    assert r.returncode == 65, r.stderr
    assert "bad.yaml: document 1: not YAML" in r.stderr
    assert check(str(tmp_path / "missing.yaml")).returncode == 65
    assert check("-o", "xml", HEALTHY).returncode == 64
    assert check().returncode == 64


def test_help_explains_every_check_and_exit_code():
    r = subprocess.run([BIN, "check", "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    for word in ["webhook-ca", "revision", "service-port", "not-injected", "limit-range", "versions", "istio-mode",
                 "istio-routing"]:
        assert f"- {word}" in r.stdout, word
    for code in ["  0 ", "  1 ", "  64 ", "  65 "]:
        assert code in r.stdout, code


@pytest.mark.parametrize("edit,problem", [
    # Without its opt-out, archive's revision canary (served by nothing) is a problem.
    (("labels: {drainshim.io/inject: disabled, drainshim.io/rev: canary}", "labels: {drainshim.io/rev: canary}"),
     "Namespace/archive"),
    # Without the tag stable's configuration, billing's drainshim.io/rev=stable names nothing.
    (("name: drainshim-tag-stable", "name: drainshim-other"), "Namespace/billing"),
])
def test_an_opt_out_beats_a_revision_and_a_tag_resolves_to_its_revision(edit, problem):
    with open(HEALTHY) as f:
        healthy = f.read()
    assert edit[0] in healthy
    r = check("-", stdin=healthy.replace(edit[0], edit[1]))
    assert r.returncode == 1, r.stdout + r.stderr
    problems = [l for l in r.stdout.splitlines() if l.startswith("PROBLEM")]
    assert [p.split()[1:3] for p in problems] == [["revision", problem + ":"]], r.stdout


def test_versions_are_reported_per_namespace():
    r = check("-o", "json", HEALTHY)
    spread = {f["object"]: f["what"] for f in json.loads(r.stdout)["findings"] if f["check"] == "versions"}
    assert set(spread) == {"Namespace/shop", "Namespace/mesh"}, spread
    assert spread["Namespace/shop"].startswith("1 injected pod(s): 1 on 0.1.0 (revision default)"), spread
