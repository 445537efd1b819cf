"""The chart's KubeRay RayJob (ray.enabled): it renders instead of the MPIJob, validates against
KubeRay v1.7.0's RayJob CRD schema (vendored), passes the operator's own rules that the schema
lacks (submissionMode among them, suite/backends/kube/rayjob_rules.py), its pods validate as core Pods,
and its driver is trainer/launchers.py's ray command for the same run, flag for flag."""
from __future__ import annotations

import copy
import gzip
import shlex
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from chart_helpers import NAMESPACE, VALUES_DIR, core_validate, kube_versions_in_range, one, openapi_to_jsonschema, render, template_error
from shardbench.trainer.launchers import LaunchPlan, build_command
from shardbench.suite.backends.kube.rayjob_rules import rayjob_errors

CRD = Path(__file__).resolve().parent / "vendor" / "ray.io_rayjobs.v1.7.0.yaml.gz"
# rdma.mode none: the RayJob's pods have no RDMA wiring (the chart refuses an RDMA mode with Ray).
RAY = ("ray.enabled=true", "ray.maxRestarts=2", "checkpoint.enabled=true", "persistence.enabled=true", "rdma.mode=none")


@lru_cache(maxsize=1)
def _validator():
    from jsonschema import Draft7Validator

    crd = yaml.load(gzip.decompress(CRD.read_bytes()), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = openapi_to_jsonschema(version["schema"]["openAPIV3Schema"])
    schema["properties"]["apiVersion"] = {"const": "ray.io/v1"}
    schema["properties"]["kind"] = {"const": "RayJob"}
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    return Draft7Validator(schema)


def schema_errors(doc: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in _validator().iter_errors(doc)]


@pytest.mark.parametrize("values", [("cpu.yaml",), ("h100.yaml",)])
def test_rayjob_renders_and_validates(values):
    docs = render("helm3", values, RAY)
    assert not [d for d in docs if d["kind"] == "MPIJob"]  # Ray replaces MPI
    job = one(docs, "RayJob")
    assert schema_errors(job) == []
    assert rayjob_errors(job) == []
    cluster = job["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    for template in pods:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": NAMESPACE},
               "spec": copy.deepcopy(template["spec"])}
        core_validate(pod, kube_versions_in_range()[-1])


@pytest.mark.parametrize("values", ["cpu.yaml", "h100.yaml"])
def test_the_driver_is_the_ray_launch_command(values):
    job = one(render("helm3", (values,), RAY), "RayJob")
    shape = yaml.safe_load((VALUES_DIR / values).read_text())
    gpus = shape["gpusPerWorker"] if shape.get("gpuResource") else 0
    argv = shlex.split(job["spec"]["entrypoint"])
    cut = argv.index("--")
    plan = LaunchPlan(launcher="ray", nodes=shape.get("workers", 1), procs_per_node=shape["gpusPerWorker"],
                      trainer_args=argv[cut + 1:], max_restarts=2, ray_gpus_per_rank=1 if gpus else 0)
    assert argv == build_command(plan)
    assert argv[argv.index("--launcher") + 1] == "ray" and "--checkpoint-dir" in argv


def test_the_schema_misses_what_the_backend_checks():
    job = one(render("helm3", ("cpu.yaml",), RAY), "RayJob")
    for mode in ("InteractiveMode", "K8sJobmode"):
        bad = copy.deepcopy(job)
        bad["spec"]["submissionMode"] = mode
        assert schema_errors(bad) == []  # a plain string to the CRD
        assert len(rayjob_errors(bad)) == 1 and "submissionMode" in rayjob_errors(bad)[0]
    bad = copy.deepcopy(job)
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = 5
    assert "outside" in rayjob_errors(bad)[0]
    assert "submissionMode" in template_error("helm3", ("cpu.yaml",), (*RAY, "ray.submissionMode=InteractiveMode"))


def test_disabled_by_default():
    docs = render("helm3", ("cpu.yaml",))
    assert not [d for d in docs if d["kind"] == "RayJob"] and one(docs, "MPIJob")


def test_a_rayjob_on_an_rdma_mode_is_refused_naming_sockets():
    """Before: h100.yaml's host-network mode rendered a RayJob whose pods had no RDMA devices, so
    NCCL silently used TCP sockets between nodes."""
    err = template_error("helm3", ("h100.yaml",), tuple(s for s in RAY if not s.startswith("rdma.")))
    assert "ray.enabled with rdma.mode host-network" in err and "TCP sockets" in err and "rdma.mode=none" in err
