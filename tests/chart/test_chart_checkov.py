"""checkov finds nothing on the chart, nor on the MPIJob's pods, except skips written in the chart
with a reason.

Two checkov runs, side by side: its helm framework on chart/ (it renders the chart itself with the
helm it finds on PATH: .tools/bin/helm), and its kubernetes framework on a directory holding every
values file's render with each MPIJob replica's pod template written out as a Pod (checkov does not
look inside custom resources). A checkov that found no helm scans nothing and exits 0, so every
run must have scanned resources or the test fails.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from chart_helpers import (ALL_FEATURES, CHART, CHECKOV, RDMA_MODES, RDMA_SETS, TOOLS, VALUES_FILES,
                           one, render, replica_pods, tool)


def scanned(stdout: str) -> list[dict]:
    """checkov -o json output as a list of reports; fails when nothing at all was scanned."""
    data = json.loads(stdout)
    reports = data if isinstance(data, list) else [data]
    reports = [r for r in reports if "results" in r]
    if not reports or sum(r["summary"]["resource_count"] for r in reports) == 0:
        pytest.fail("checkov scanned nothing (no helm on its PATH, or no files?):\n" + stdout[:2000],
                    pytrace=False)
    return reports


def _checkov(args: list[str], env: dict) -> subprocess.Popen:
    # --skip-download: no Prisma Cloud look-ups (no network here, and results must not depend on it).
    return subprocess.Popen([tool(CHECKOV), *args, "--skip-download", "-o", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.fixture(scope="module")
def checkov_reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("rendered")
    renders = {v: render("helm3", (v,), ("workers=2",)) for v in VALUES_FILES}
    renders["all-features"] = render("helm3", ("h100.yaml",), ALL_FEATURES)
    for mode in RDMA_MODES:
        renders[f"rdma-{mode}"] = render("helm3", ("h100.yaml",), ("workers=2", *RDMA_SETS[mode]))
    for name, docs in renders.items():
        pods = list(replica_pods(one(docs, "MPIJob")).values())
        (out / f"{name}.yaml").write_text(yaml.safe_dump_all(docs + pods, sort_keys=False))
    tool(TOOLS / "bin" / "helm")
    env = dict(os.environ, PATH=f"{TOOLS / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    procs = {
        "helm": _checkov(["-d", str(CHART), "--framework", "helm"], env),
        "kubernetes": _checkov(["-d", str(out), "--framework", "kubernetes"], env),
    }
    reports = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode in (0, 1), stderr[-2000:]
        reports[name] = scanned(stdout)
    return reports


def _checks(reports, kind):
    return [c for r in reports for c in r["results"][kind]]


@pytest.mark.slow  # the checkov scans: ~5 s idle, paid by the first of these
@pytest.mark.parametrize("framework", ["helm", "kubernetes"])
def test_checkov_finds_nothing(checkov_reports, framework):
    failed = _checks(checkov_reports[framework], "failed_checks")
    assert not failed, "\n".join(f"{c['check_id']} {c['check_name']}: {c['resource']}" for c in failed)
    assert _checks(checkov_reports[framework], "passed_checks")


@pytest.mark.slow  # the checkov scans: ~5 s idle, paid by the first of these
@pytest.mark.parametrize("framework", ["helm", "kubernetes"])
def test_every_skip_is_written_in_the_chart_with_a_reason(checkov_reports, framework):
    for check in _checks(checkov_reports[framework], "skipped_checks"):
        reason = (check.get("check_result") or {}).get("suppress_comment", "")
        assert len(reason) > 15, f"{check['check_id']} on {check['resource']} skipped without a reason"


@pytest.mark.slow  # the checkov scans
def test_the_mpijob_pods_were_scanned(checkov_reports):
    resources = {c["resource"] for c in _checks(checkov_reports["kubernetes"], "passed_checks")}
    for role in ("launcher", "worker"):
        assert any(r.startswith("Pod.") and r.endswith(f"-{role}") for r in resources), sorted(resources)


@pytest.mark.slow  # the checkov scans
def test_the_helm_scan_rendered_every_kind(checkov_reports):
    resources = {c["resource"].split(".")[0]
                 for c in _checks(checkov_reports["helm"], "passed_checks") + _checks(checkov_reports["helm"], "skipped_checks")}
    assert {"Pod", "ServiceAccount", "ConfigMap"} <= resources, resources


def test_scanned_rejects_an_empty_scan():
    """What checkov prints when it found no helm: a bare summary with nothing scanned."""
    empty = json.dumps({"passed": 0, "failed": 0, "skipped": 0, "parsing_errors": 0, "resource_count": 0})
    with pytest.raises(pytest.fail.Exception):
        scanned(empty)
