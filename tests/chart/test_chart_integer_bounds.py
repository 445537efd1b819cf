"""Huge integers in values (issue 19): `int` in a template wraps anything past int64, so
rdma.count=1e20 rendered as -9223372036854775808. Every integer of values.schema.json has a
maximum, so helm refuses such a value before rendering (real helm, both versions)."""
from __future__ import annotations

import json

import pytest

from chart_helpers import CHART, RELEASE, helm_cmd

SCHEMA = json.loads((CHART / "values.schema.json").read_text())


def integer_paths(node, path=""):
    if isinstance(node, dict):
        kind = node.get("type")
        if kind == "integer" or (isinstance(kind, list) and "integer" in kind and "string" not in kind):
            yield path, node
        for key, value in node.items():
            yield from integer_paths(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from integer_paths(value, f"{path}[{i}]")


def test_every_integer_has_a_maximum_below_int32():
    missing = [p for p, node in integer_paths(SCHEMA) if not node.get("maximum", 2 ** 31) < 2 ** 31]
    assert not missing, missing


VALUES = {  # a values file, as a user writes it: YAML reads 1e20 as a float, 2**62 as an int64
    "rdma.count": {"rdma": {"mode": "sriov", "networks": "rdma-vf", "resourceName": "nvidia.com/rdma-vf", "count": None}},
    "gang.scheduleTimeoutSeconds": {"gang": {"scheduler": "volcano", "queue": "gpu", "scheduleTimeoutSeconds": None}},
    "runPolicy.backoffLimit": {"runPolicy": {"backoffLimit": None}},
    "run.steps": {"run": {"steps": None}},
}


def _with(tree: dict, value: int) -> dict:
    return {k: _with(v, value) if isinstance(v, dict) else (value if v is None else v) for k, v in tree.items()}


@pytest.mark.parametrize("helm", ["helm3", "helm4"])
@pytest.mark.parametrize("huge", [10 ** 20, 2 ** 62])
@pytest.mark.parametrize("key", sorted(VALUES))
def test_a_huge_integer_is_refused_not_wrapped(tmp_path, helm, huge, key):
    values = tmp_path / "values.yaml"
    values.write_text(json.dumps(_with(VALUES[key], huge)))  # JSON is YAML
    proc = helm_cmd(helm, "template", RELEASE, str(CHART), "-f", str(values))
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "-9223372036854775808" not in proc.stdout
    assert key.split(".")[-1] in proc.stderr and "maximum" in proc.stderr.lower(), proc.stderr
