"""Shared helpers of the chart tests: the helm binaries, rendering, the MPIJob schema.

helm comes from .tools/ (scripts/install-tools.sh, run by `make tools`): a missing helm fails the
tests, it never skips them, so CI cannot pass without having checked the chart.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from shardbench.trainer import contract

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "chart"
VALUES_DIR = REPO / "values"
TOOLS = REPO / ".tools"
HELMS = {"helm3": TOOLS / "helm3" / "helm", "helm4": TOOLS / "helm4" / "helm"}
CHECKOV = TOOLS / "checkov-venv" / "bin" / "checkov"
# The MPI Operator's CRD (Apache-2.0), vendored so a plain clone validates MPIJobs too.
MPIJOB_CRD = Path(__file__).resolve().parent / "vendor" / "kubeflow.org_mpijobs.v2beta1.yaml"

RELEASE = "sb"
NAMESPACE = "bench"
VALUES_FILES = sorted(p.name for p in VALUES_DIR.glob("*.yaml"))
STRATEGIES = tuple(contract.STRATEGIES)  # the contract's table: a new row is rendered too
CHART_LAUNCHERS = ("deepspeed", "mpirun")
RDMA_MODES = ("none", "shared-device", "host-network", "sriov")
# What every rdma mode needs besides its name (sriov: the VFs' Multus network).
SRIOV_SETS = ("rdma.networks=rdma-vf\\,rdma-vf", "rdma.resourceName=nvidia.com/rdma-vf", "rdma.count=2")
RDMA_SETS = {m: (f"rdma.mode={m}",) + (SRIOV_SETS if m == "sriov" else ()) for m in RDMA_MODES}
# Every optional feature switched on at once, so their objects and fields get validated too.
ALL_FEATURES = (
    "persistence.enabled=true", "rdma.mode=host-network", "oneWorkerPerNode=true", "numaBind=true",
    "gang.scheduler=volcano", "gang.queue=gpu", "gang.scheduleTimeoutSeconds=600", "gang.kueueQueue=bench",
    "launcherPlacement.nodeSelector.pool=cpu", "launcherPlacement.tolerations[0].key=spot",
    "launcherPlacement.tolerations[0].operator=Exists",
    "image.digest=sha256:" + "a" * 64, "run.strategy=zero3", "launcher=deepspeed",
    "deepspeed.config.zero_optimization.stage=3", "priorityClassName=bench",
    "podAnnotations.team=ml", "image.pullSecrets[0]=regcred", "run.globalBatch=64",
)


def tool(path: Path) -> str:
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing: run `make tools` (scripts/install-tools.sh)", pytrace=False)
    return str(path)


def helm_cmd(helm: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([tool(HELMS[helm]), *args], capture_output=True, text=True, timeout=120)


def _value_args(values: tuple[str, ...], sets: tuple[str, ...]) -> list[str]:
    args = []
    for v in values:
        args += ["-f", str(VALUES_DIR / v)]
    for s in sets:
        args += ["--set", s]
    return args


@lru_cache(maxsize=None)
def render_text(helm: str, values: tuple[str, ...] = (), sets: tuple[str, ...] = ()) -> str:
    """`helm template` output; fails the test with helm's message when it does not render."""
    proc = helm_cmd(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    *_value_args(values, sets))
    if proc.returncode != 0:
        pytest.fail(f"{helm} template {values} {sets} failed:\n{proc.stderr}", pytrace=False)
    return proc.stdout


def render(helm: str, values: tuple[str, ...] = (), sets: tuple[str, ...] = ()) -> list[dict]:
    """Rendered objects (deep copies: callers may change them)."""
    return copy.deepcopy([d for d in yaml.safe_load_all(render_text(helm, values, sets)) if d])


def template_error(helm: str, values: tuple[str, ...] = (), sets: tuple[str, ...] = ()) -> str:
    """stderr of a `helm template` that must fail; fails the test if it rendered."""
    proc = helm_cmd(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    *_value_args(values, sets))
    if proc.returncode == 0:
        pytest.fail(f"{helm} template {values} {sets} rendered but should have failed", pytrace=False)
    return proc.stderr


def one(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def replica_pods(mpijob: dict) -> dict[str, dict]:
    """Each MPIJob replica's pod template as a Pod (checkov and the core schema skip them inside a CR)."""
    pods = {}
    for role, spec in mpijob["spec"]["mpiReplicaSpecs"].items():
        meta = copy.deepcopy(spec["template"].get("metadata", {}))
        meta["name"] = f"{mpijob['metadata']['name']}-{role.lower()}"
        meta["namespace"] = mpijob["metadata"].get("namespace", NAMESPACE)
        pods[role] = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                      "spec": copy.deepcopy(spec["template"]["spec"])}
    return pods


def launcher_argv(mpijob: dict) -> list[str]:
    """The launcher container's argv. It must be `args`, not `command`: the image's ENTRYPOINT
    (docker/entrypoint.sh) has to run first."""
    container = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert "command" not in container, "the launcher must keep the image's entrypoint"
    return container["args"]


# --- the MPIJob CRD's openAPIV3Schema as JSON Schema --------------------------------------------

def openapi_to_jsonschema(node):
    """openAPI v3 (as Kubernetes structural schemas use it) -> JSON Schema, strict like the API
    server's field validation: objects that list their properties reject unknown ones.
    x-kubernetes-int-or-string: integer or string; x-kubernetes-preserve-unknown-fields: any
    properties."""
    if isinstance(node, list):
        return [openapi_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: openapi_to_jsonschema(v) for k, v in node.items()
           if not k.startswith("x-kubernetes-") and k != "nullable"}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.pop("anyOf", None)
        out["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
    if node.get("x-kubernetes-preserve-unknown-fields"):
        out.pop("additionalProperties", None)
    elif out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


@lru_cache(maxsize=1)
def mpijob_schema() -> dict:
    if not MPIJOB_CRD.is_file():
        pytest.fail(f"{MPIJOB_CRD} is missing: it is vendored with the tests", pytrace=False)
    crd = yaml.safe_load(MPIJOB_CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v2beta1")
    schema = openapi_to_jsonschema(version["schema"]["openAPIV3Schema"])
    # apiVersion/kind/metadata are the API server's: pin them to what this CRD serves.
    schema["properties"]["apiVersion"] = {"const": "kubeflow.org/v2beta1"}
    schema["properties"]["kind"] = {"const": crd["spec"]["names"]["kind"]}
    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "metadata", "spec"})
    return schema


@lru_cache(maxsize=1)
def _mpijob_validator():
    from jsonschema import Draft7Validator

    Draft7Validator.check_schema(mpijob_schema())
    return Draft7Validator(mpijob_schema())


def mpijob_errors(doc: dict) -> list[str]:
    """Every way `doc` breaks the CRD's schema, one line each ([] when it validates)."""
    validator = _mpijob_validator()
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]


@lru_cache(maxsize=1)
def _cache_kubernetes_schemas() -> None:
    """kubernetes-validate re-reads its JSON schemas (MBs of definitions) on every call; the tests
    make hundreds of calls, so keep what it read. Same schemas, same validator, just cached."""
    import kubernetes_validate.utils as kv

    kv.schema_contents = lru_cache(maxsize=None)(kv.schema_contents)


def core_validate(obj: dict, version: str) -> None:
    """kubernetes-validate --strict for one object; raises kubernetes_validate.ValidationError."""
    from kubernetes_validate import validate

    _cache_kubernetes_schemas()
    validate(obj, version, strict=True)


def kube_versions_in_range() -> list[str]:
    """The Kubernetes versions kubernetes-validate ships that Chart.yaml's kubeVersion allows."""
    from kubernetes_validate.utils import all_versions

    spec = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    return [v for v in all_versions() if _in_range(v, spec)]


def _in_range(version: str, spec: str) -> bool:
    """Enough of semver ranges for kubeVersion: space-separated >=, >, <=, <, = of x.y[.z][-pre]."""
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.lstrip("v").split("-")[0].split("."))[:3]

    ops = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
           "<": lambda a, b: a < b, "=": lambda a, b: a == b}
    for clause in spec.replace(",", " ").split():
        op = next(o for o in (">=", "<=", ">", "<", "=") if clause.startswith(o))
        bound = key(clause[len(op):])
        v = (key(version) + (0, 0, 0))[: len(bound)]
        if not ops[op](v, bound):
            return False
    return True


# --- the Dockerfile, read without Docker ---------------------------------------------------------

def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):  # a comment inside a continued instruction
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The instructions of each build stage (what follows each FROM), in order."""
    stages: list[list[tuple[str, str]]] = []
    for word, rest in dockerfile_instructions():
        if word == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((word, rest))
    return stages


def dockerfile_env() -> dict[str, str]:
    """The ENV the runtime (last) stage sets: what every container of the image starts with."""
    import shlex

    env: dict[str, str] = {}
    for word, rest in dockerfile_stages()[-1]:
        if word == "ENV":
            for item in shlex.split(rest):
                name, _, value = item.partition("=")
                env[name] = value
    return env


def to_json(obj) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)
