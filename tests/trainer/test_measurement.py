"""The measurement options on real runs: FSDP's gradient-sync option, one gradient-reduction
dtype for every strategy, threads per rank. Collectives are checked against the arithmetic."""
from __future__ import annotations

import os

import pytest

from tests.reference_runs import shared_run
from tests.trainer.test_strategies import COMMON
from shardbench.trainer.contract import STRATEGIES
from shardbench.trainer.model import PRESETS

pytestmark = pytest.mark.slow

# test_strategies' settings (global batch 8 = micro-batch 2 x grad-accum 2 x 2 ranks, 4 x 2 x 1 for
# the reference): "reference" and "zero2-fp32" are its runs, shared (tests/reference_runs.py).
LAUNCHER = {"ddp": "torchrun", "fsdp": "torchrun", "zero2": "deepspeed"}
RUNS = {
    "reference": (["--strategy", "ddp", "--micro-batch", "4"], 1),
    "fsdp-last": (["--strategy", "fsdp", "--micro-batch", "2", "--fsdp-grad-sync", "last_micro_step"], 2),
    "ddp-bf16": (["--strategy", "ddp", "--micro-batch", "2", "--grad-reduce-dtype", "bf16"], 2),
    "fsdp-bf16": (["--strategy", "fsdp", "--micro-batch", "2", "--grad-reduce-dtype", "bf16"], 2),
    "zero2-bf16": (["--strategy", "zero2", "--micro-batch", "2", "--grad-reduce-dtype", "bf16"], 2),
    "zero2-fp32": (["--strategy", "zero2", "--micro-batch", "2"], 2),
    "threads-2": (["--strategy", "ddp", "--micro-batch", "4", "--threads-per-rank", "2"], 1),
}


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    out = {}
    for name, (args, world) in RUNS.items():
        launcher = LAUNCHER[args[1]] if world > 1 else None
        run = shared_run([*args, *COMMON], launcher=launcher, nproc=world)
        assert run.returncode == 0, (name, run.stderr[-3000:])
        out[name] = run.record
    return out


def losses_close(a: dict, b: dict, rel: float) -> None:
    for step, (x, y) in enumerate(zip(a["loss_per_step"], b["loss_per_step"])):
        assert abs(x - y) <= rel * abs(y), f"step {step}: {x} vs {y}"


def test_fsdp_last_micro_step_sync_is_an_explicit_recorded_option(runs):
    """Reduce-scatter once per optimizer step instead of once per micro-step, and unsharded
    gradients held between micro-steps (4 + 12/N B/param instead of 16/N). Same losses."""
    r = runs["fsdp-last"]
    layers = PRESETS["tiny"].n_layer
    assert r["fsdp_grad_sync"] == "last_micro_step"
    assert r["comm_per_step"]["reduce_scatter"]["calls"] == layers + 1
    assert r["comm_per_step"]["all_gather"]["calls"] == 4 * r["grad_accum"]
    per_param = STRATEGIES["fsdp"].model_state_bytes_per_param("fp32", 2, 2, "last_micro_step")
    assert per_param == 10.0
    for m in r["model_state"]:
        assert m["total_bytes"] == pytest.approx(per_param * r["n_params"], rel=0.02)
        assert m["peak_at"] == "micro-step 0 backward"
    losses_close(r, runs["reference"], 1e-4)


@pytest.mark.parametrize("name,op,fp32_bytes_per_param", [
    ("ddp-bf16", "all_reduce", 4),                 # one all-reduce of all gradients per step
    ("fsdp-bf16", "reduce_scatter", 4 * 2),        # one reduce-scatter per micro-step
])
def test_grad_reduce_dtype_bf16_halves_gradient_bytes(runs, name, op, fp32_bytes_per_param):
    r = runs[name]
    assert r["grad_reduce_dtype"] == "bf16"
    assert r["comm_per_step"][op]["bytes"] == pytest.approx(fp32_bytes_per_param / 2 * r["n_params"], rel=0.01)
    losses_close(r, runs["reference"], 1e-2)


def test_deepspeed_reduces_in_the_given_dtype(runs):
    """DeepSpeed's communication_data_type follows --grad-reduce-dtype (fp32 by default)."""
    fp32, bf16 = runs["zero2-fp32"], runs["zero2-bf16"]
    assert fp32["grad_reduce_dtype"] == "fp32" and bf16["grad_reduce_dtype"] == "bf16"
    assert bf16["comm_per_step"]["all_reduce"]["bytes"] == pytest.approx(
        fp32["comm_per_step"]["all_reduce"]["bytes"] / 2, rel=0.01)
    losses_close(bf16, runs["reference"], 1e-2)


def test_threads_per_rank_are_set_and_recorded(runs):
    r = runs["threads-2"]
    assert r["threads_per_rank"] == 2
    if len(os.sched_getaffinity(0)) >= 2:
        assert len(r["cpu_affinity"][0]) == 2
    assert runs["reference"]["threads_per_rank"] == 1


@pytest.mark.parametrize("name", ["fsdp-last", "ddp-bf16", "zero2-fp32"])
def test_every_collective_has_its_in_flight_time(runs, name):
    """Each op's seconds per step (trainer/comm.py) are there, positive, and within the step:
    a union of in-flight time cannot exceed the steps it ran in (logical, not a timing bound)."""
    r = runs[name]
    assert r["comm_per_step"]
    for op, per in r["comm_per_step"].items():
        assert 0 < per["seconds"] <= r["step_time_s"]["mean"] * 1.02, (op, per, r["step_time_s"])
