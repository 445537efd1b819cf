"""The results volume (issue 20): each attempt checkpoints into a directory of its own unless
resuming is asked for (the volume outlives uninstall: a rerun must not continue from the last
attempt's state), the created claim is sized from the model, and workers that may span nodes get
ReadWriteMany or a one-line refusal."""
from __future__ import annotations

import json

import pytest

from chart_helpers import one, render, template_error

CKPT = ("persistence.enabled=true", "checkpoint.enabled=true")


def checkpoint_dir(*sets: str, values: str = "cpu.yaml") -> str:
    args = json.loads(one(render("helm3", (values,), (*CKPT, *sets)), "ConfigMap")["data"]["trainer-args.json"])
    return args[args.index("--checkpoint-dir") + 1]


def storage(*sets: str, values: str = "cpu.yaml") -> str:
    pvc = one(render("helm3", (values,), sets), "PersistentVolumeClaim")
    return pvc["spec"]["resources"]["requests"]["storage"]


def test_each_attempt_gets_its_own_checkpoint_directory_unless_resuming():
    assert checkpoint_dir("checkpoint.attempt=a1", "run.id=r") == "/results/r/attempts/a1/checkpoints"
    assert checkpoint_dir("checkpoint.attempt=a2", "run.id=r") == "/results/r/attempts/a2/checkpoints"
    assert checkpoint_dir("checkpoint.resume=true", "run.id=r") == "/results/r/checkpoints"
    # helm install by hand: the install time names the attempt.
    assert checkpoint_dir("run.id=r").split("/")[-2].isdigit()


@pytest.mark.parametrize("model,keep,size", [("tiny", 2, "1Gi"), ("gpt2-124m", 2, "7Gi"),
                                             ("gpt2-1.3b", 2, "71Gi"), ("gpt2-1.3b", 4, "118Gi")])
def test_volume_is_sized_from_the_model(model, keep, size):
    # 16 B per parameter per checkpoint x (keep + 1) + 20% + 1Gi (before: 1Gi whatever the model).
    assert storage(*CKPT, f"run.model={model}", "run.seqLen=128", f"checkpoint.keep={keep}") == size
    assert storage("persistence.enabled=true", f"run.model={model}", "run.seqLen=128") == "1Gi"  # records only
    assert storage(*CKPT, "persistence.size=500Gi") == "500Gi"  # given: kept


def test_workers_on_several_nodes_need_readwritemany():
    err = template_error("helm3", ("h100.yaml",), ("persistence.enabled=true", "workers=2"))
    line = next(l for l in err.splitlines() if "persistence with workers 2" in l)
    assert "needs persistence.accessModes [ReadWriteMany]" in line and "ContainerCreating" in line
    pvc = one(render("helm3", ("h100.yaml",), ("persistence.enabled=true", "workers=2",
                                                "persistence.accessModes={ReadWriteMany}")), "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    # An existing claim's mode is the cluster's business; one worker may use ReadWriteOnce.
    render("helm3", ("h100.yaml",), ("persistence.enabled=true", "workers=2", "persistence.existingClaim=shared"))
    render("helm3", ("h100.yaml",), ("persistence.enabled=true",))
