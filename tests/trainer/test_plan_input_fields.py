"""Issue 27 item 4: the planner's input restates no knob. Each PlanInput field is a RunConfig field
defaulting to RunConfig's default (trainer/knobs.py default), but for the ones a caller resolves
first; the model is built by RunConfig's own model_config_of."""
from __future__ import annotations

from dataclasses import MISSING, fields

from shardbench.trainer import knobs
from shardbench.trainer.config import RunConfig
from shardbench.trainer.plan.inputs import PlanInput

RESOLVED = {"world_size": 1, "grad_accum": 1, "precision": "fp32", "device": "cpu"}
"""Not RunConfig's defaults on purpose: world_size is not a knob, grad_accum is resolved from
--global-batch, precision and device from auto."""


def test_every_plan_input_field_is_a_run_config_field_with_its_default():
    run = {f.name for f in fields(RunConfig)}
    for f in fields(PlanInput):
        if f.name in RESOLVED:
            assert f.default == RESOLVED[f.name], f.name
            continue
        assert f.name in run, f"PlanInput.{f.name} is no RunConfig field"
        want = knobs.default(f.name)
        assert (f.default is MISSING) if want is MISSING else f.default == want, f.name


def test_the_plan_builds_the_model_as_the_run_does():
    dims = {"model": "gpt2-124m", "n_layer": 3, "n_embd": 64, "n_head": 2, "tie_embeddings": False}
    assert PlanInput(strategy="ddp", **dims).model_config() == RunConfig(strategy="ddp", **dims).model_config()
    assert PlanInput(strategy="ddp").model_config() == RunConfig(strategy="ddp").model_config()
