"""Issue 27 item 4: the planner's input restates no knob. Each PlanInput field is a RunConfig field
defaulting to RunConfig's default (trainer/knobs.py default), but for the ones a caller resolves
first; the model is built by RunConfig's own model_config_of."""
from __future__ import annotations

from dataclasses import MISSING, fields

from shardbench.trainer import knobs
from shardbench.trainer.config import RunConfig
from shardbench.trainer.contract import STRATEGIES
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


def _random_config(rng) -> tuple[RunConfig, int]:
    """A RunConfig with every planner knob drawn at random (choices from the field's type, numbers
    within its bounds), and a world size its degrees divide."""
    from typing import Literal, get_args, get_origin

    tp, pp, rep = rng.choice([(1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1), (1, 1, 2)])
    world = tp * pp * rep * rng.choice([1, 2])
    values: dict = {"tp": tp, "pp": pp, "dp_replicate": rep}
    for f in fields(PlanInput):
        if f.name in RESOLVED or f.name in values or f.name == "strategy":
            continue
        kind = knobs.base_type(RunConfig, f.name)
        if get_origin(kind) is Literal:
            values[f.name] = rng.choice(get_args(kind))
        elif kind is bool:
            values[f.name] = rng.random() < 0.5
        elif kind is int:
            values[f.name] = rng.choice([None, 1, 2, 4]) if f.default is None else rng.choice([1, 2, 4])
        elif kind is float:
            values[f.name] = round(rng.uniform(0.0, 0.3), 4)
    values.update(n_embd=64, n_head=rng.choice([2, 4]), vocab_size=rng.choice([None, 512]),
                  seq_len=rng.choice([None, 32]))
    strategy = rng.choice(["ddp", "fsdp"] if tp * pp * rep > 1 else sorted(STRATEGIES))
    return RunConfig(strategy=strategy, **values), world


def test_a_records_plan_input_is_the_runs_for_random_configurations():
    """PlanInput.from_record reads each field where the trainer's real record builder
    (trainer/run_record.py base_record) put it, through the knobs' one reader (knobs.in_record):
    for 60 random configurations it equals the plan input of the run's own config with what the
    trainer resolved (grad-accum, sequence length, precision, device)."""
    import random

    import torch

    from shardbench.trainer.dist_env import DistEnv
    from shardbench.trainer.run_record import base_record

    rng = random.Random(27)
    for case in range(60):
        cfg, world = _random_config(rng)
        mcfg, seq_len, grad_accum = cfg.model_config(), cfg.effective_seq_len(), cfg.effective_grad_accum(world)
        env = DistEnv(rank=0, world_size=world, local_rank=0, local_world_size=world, launcher="torchrun",
                      master_addr=None, master_port=None)
        record = base_record(cfg, env, torch.device("cpu"), "fp32", mcfg, grad_accum, seq_len).to_dict()
        want = PlanInput.of(cfg, world_size=world, grad_accum=grad_accum, seq_len=seq_len, precision="fp32",
                            device="cpu")
        assert PlanInput.from_record(record) == want, (case, cfg)
