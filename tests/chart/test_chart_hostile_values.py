"""YAML injection: a string value that carries a newline and more YAML (here
"<value>\\n          hostPID: true") must never add a key to what the chart renders. Every string
the templates place is quoted (or validated by the schema so that such a value is refused).

For every string in values.yaml (and an item or key of every list and map of strings), the chart
is rendered with a valid value and with that value plus the hostile tail; either helm refuses the
hostile one (schema or the chart's own checks), or both renders have exactly the same keys.
"""
from __future__ import annotations

import copy

import pytest
import yaml

from chart_helpers import CHART, NAMESPACE, RELEASE, helm_cmd

DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())
TAIL = "\n          hostPID: true"
# Every optional part of the chart on, so every value is placed somewhere.
FEATURES = {"persistence": {"enabled": True}, "image": {"pullSecrets": ["regcred"]},
            "priorityClassName": "bench", "podAnnotations": {"team": "ml"},
            "nodeSelector": {"pool": "gpu"}, "nccl": {"NCCL_DEBUG": "INFO"},
            "launcherPlacement": {"nodeSelector": {"pool": "cpu"}},
            "run": {"extraArgs": ["--compile"], "id": "my-run"},
            "metrics": {"enabled": True, "podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                        "dashboard": {"enabled": True}}}
# Valid values for strings that are empty by default, with what they need to render.
SAMPLES = {
    ("nameOverride",): ("bench", {}), ("fullnameOverride",): ("bench-run", {}),
    ("image", "digest"): ("sha256:" + "a" * 64, {}), ("gpuResource",): ("nvidia.com/gpu", {"run": {"device": "cuda"}}),
    ("tcpIfInclude",): ("eth0", {}), ("image", "launcherTag"): ("0.1.0-cpu", {}), ("persistence", "existingClaim"): ("claim", {}),
    ("persistence", "storageClass"): ("fast", {}), ("serviceAccount", "name"): ("bench-sa", {}),
    ("shape", "gpuModel"): ("NVIDIA H100", {}), ("rdma", "networks"): ("rdma-vf,rdma-vf", {"rdma": {"mode": "sriov"}}),
    ("gang", "queue"): ("gpu", {"gang": {"scheduler": "volcano"}}),
    ("gang", "priorityClass"): ("high", {"gang": {"scheduler": "volcano"}}), ("gang", "kueueQueue"): ("team-a", {}),
}


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _set(values: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(values)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def string_paths(node, path=()):
    """Paths of every string leaf, and of the first item of every list of strings."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from string_paths(value, (*path, key))
    elif isinstance(node, list):
        if node and isinstance(node[0], str):
            yield (*path, 0)
    elif isinstance(node, str):
        yield path


BASE = _merge(DEFAULTS, FEATURES)
CASES = sorted(set(string_paths(BASE)) | set(SAMPLES))
MAPS = [("env",), ("nccl",), ("podAnnotations",), ("nodeSelector",), ("launcherPlacement", "nodeSelector")]


def render_with(tmp_path, values: dict) -> tuple[list[dict] | None, str]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = helm_cmd("helm3", "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(path))
    if proc.returncode != 0:
        return None, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d], ""


def key_paths(node, path="") -> set[str]:
    out = set()
    if isinstance(node, dict):
        for key, value in node.items():
            out.add(f"{path}/{key}")
            out |= key_paths(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out |= key_paths(value, f"{path}[{i}]")
    return out


def assert_no_injection(tmp_path, benign: dict, hostile: dict, what: str, renamed: tuple = ("", "")) -> None:
    """`renamed` (hostile text, benign text): a map key that is data, e.g. a nodeSelector label."""
    good, err = render_with(tmp_path, benign)
    assert good is not None, f"{what}: the valid value does not render: {err}"
    bad, err = render_with(tmp_path, hostile)
    if bad is None:  # refused: fine, as long as it was refused on purpose, not by a YAML parse
        assert "schema" in err or "execution error" in err, f"{what}: {err}"
        return
    bad_keys = [{k.replace(*renamed) for k in key_paths(d)} for d in bad]
    assert bad_keys == [key_paths(d) for d in good], f"{what} changed the rendered keys"


@pytest.mark.parametrize("path", CASES, ids=[".".join(map(str, p)) for p in CASES])
def test_hostile_string_value(tmp_path, path):
    benign_value, extra = SAMPLES.get(path, (None, {}))
    base = _merge(BASE, extra)
    if benign_value is None:
        node = base
        for key in path:
            node = node[key]
        benign_value = node
    assert_no_injection(tmp_path, _set(base, path, benign_value), _set(base, path, benign_value + TAIL),
                        ".".join(map(str, path)))


@pytest.mark.parametrize("path", MAPS, ids=[".".join(p) for p in MAPS])
def test_hostile_map_key(tmp_path, path):
    prefix = "NCCL_" if path == ("nccl",) else ""
    benign = _set(BASE, path, {f"{prefix}PROBE": "1"})
    hostile = _set(BASE, path, {f"{prefix}PROBE{TAIL}": "1"})
    assert_no_injection(tmp_path, benign, hostile, f"a key of {'.'.join(path)}", renamed=(f"PROBE{TAIL}", "PROBE"))


def test_an_unquoted_placement_is_caught(tmp_path):
    """The check is not vacuous: the same tail through an unquoted field adds hostPID."""
    pod = "spec:\n          priorityClassName: bench"  # indented as in the pod templates
    assert key_paths(yaml.safe_load(pod + TAIL)) - key_paths(yaml.safe_load(pod)) == {"/spec/hostPID"}
