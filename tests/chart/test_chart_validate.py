"""Every rendered object validates: core kinds with kubernetes-validate --strict for each
Kubernetes version in Chart.yaml's kubeVersion range, the MPIJob against the operator's CRD schema
(kubernetes-validate passes unknown kinds silently, so it cannot be trusted with MPIJobs), and the
MPIJob's pod templates as Pods against the core schema too."""
from __future__ import annotations

import copy

import pytest
from kubernetes_validate import ValidationError

from chart_helpers import (ALL_FEATURES, CHART_LAUNCHERS, RDMA_MODES, RDMA_SETS, STRATEGIES,
                           VALUES_FILES, core_validate, kube_versions_in_range, mpijob_errors, one,
                           render, replica_pods)

RENDERS = ([((v,), ()) for v in VALUES_FILES] + [(("cpu.yaml",), ALL_FEATURES)]
           + [(("h100.yaml",), RDMA_SETS[m]) for m in RDMA_MODES])
RENDER_IDS = [v[0] for v in VALUES_FILES] + ["cpu+all-features"] + [f"h100+rdma-{m}" for m in RDMA_MODES]


def test_kube_versions_cover_the_range():
    versions = kube_versions_in_range()
    # kubeVersion >=1.28: every shipped release from 1.28 to the newest.
    assert versions[0].startswith("1.28.") and len(versions) >= 8, versions


def _core_objects(docs):
    objs = [d for d in docs if d["kind"] != "MPIJob"]
    return objs + list(replica_pods(one(docs, "MPIJob")).values())


@pytest.mark.parametrize("helm", ["helm3", "helm4"])
@pytest.mark.parametrize("values,sets", RENDERS, ids=RENDER_IDS)
def test_core_kinds_validate_strict(helm, values, sets):
    docs = render(helm, values, sets)
    problems = []
    for version in kube_versions_in_range():
        for obj in _core_objects(docs):
            try:
                core_validate(obj, version)
            except ValidationError as exc:
                problems.append(f"{version} {obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    assert not problems, "\n".join(problems)


def test_core_validation_catches_a_bad_field():
    """The validator must be able to fail: an unknown field in a rendered pod is rejected."""
    pod = copy.deepcopy(replica_pods(one(render("helm3"), "MPIJob"))["Worker"])
    pod["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(ValidationError):
        core_validate(pod, kube_versions_in_range()[0])


@pytest.mark.parametrize("helm", ["helm3", "helm4"])
@pytest.mark.parametrize("values,sets", RENDERS, ids=RENDER_IDS)
def test_mpijob_matches_crd_schema(helm, values, sets):
    job = one(render(helm, values, sets), "MPIJob")
    assert mpijob_errors(job) == []


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("launcher", CHART_LAUNCHERS)
def test_mpijob_matches_crd_schema_every_combo(strategy, launcher):
    job = one(render("helm4", ("h100.yaml",), (f"run.strategy={strategy}", f"launcher={launcher}", "workers=2")), "MPIJob")
    assert mpijob_errors(job) == []


@pytest.mark.parametrize("path,value,expect", [
    (("spec", "slotsPerWorker"), "8", "is not of type 'integer'"),
    (("spec", "mpiImplementation"), "LAM", "is not one of"),
    (("spec", "runPolicy", "cleanupPolicy"), "All", "Additional properties are not allowed"),
    (("spec", "mpiReplicaSpecs", "Worker", "template", "spec", "containers", 0, "resources", "limits", "cpu"),
     {"n": 1}, "is not of type"),
])
def test_mpijob_schema_rejects(path, value, expect):
    job = one(render("helm3"), "MPIJob")
    node = job
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    errors = mpijob_errors(job)
    assert any(expect in e for e in errors), errors


def test_int_or_string_fields_accept_both():
    job = one(render("helm3"), "MPIJob")
    probe = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["readinessProbe"]
    probe["tcpSocket"]["port"] = 2222
    assert mpijob_errors(job) == []
    probe["tcpSocket"]["port"] = "ssh"
    assert mpijob_errors(job) == []
