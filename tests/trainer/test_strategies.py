"""Every strategy, at world sizes 1 and 2, under every launcher: same tokens, same losses, valid
records, and the model-state bytes each strategy is supposed to hold."""
from __future__ import annotations

import jsonschema
import pytest

from tests.trainer.conftest import run_trainer
from trainer.contract import STRATEGIES as STRATEGY_TABLE

pytestmark = pytest.mark.slow  # multi-process runs

STRATEGIES = ["ddp", "fsdp", "zero1", "zero2", "zero3"]
# World size 2: each launcher starts at least one plain-torch and one DeepSpeed strategy.
LAUNCHER_AT_2 = {"ddp": "torchrun", "fsdp": "mpirun", "zero1": "deepspeed", "zero2": "deepspeed",
                 "zero3": "mpirun"}
STEPS = 6
# Same global batch (8 sequences) everywhere; grad-accum 2 exercises the no-sync micro-steps.
COMMON = ["--model", "tiny", "--seq-len", "64", "--global-batch", "8", "--steps", str(STEPS),
          "--warmup-steps", "1", "--precision", "fp32", "--seed", "7", "--lr", "1e-3", "--lr-warmup-steps", "2"]


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[tuple[str, int], dict]:
    tmp = tmp_path_factory.mktemp("strategies")
    out = {}
    for strategy in STRATEGIES:
        one = run_trainer(["--strategy", strategy, "--micro-batch", "4", *COMMON], tmp)
        assert one.returncode == 0, one.stderr[-3000:]
        out[(strategy, 1)] = one.record
        # zero3 under mpirun finds its rendezvous through mpi4py (no MASTER_ADDR given).
        two = run_trainer(["--strategy", strategy, "--micro-batch", "2", *COMMON], tmp,
                          launcher=LAUNCHER_AT_2[strategy], nproc=2, master_env=strategy != "zero3")
        assert two.returncode == 0, two.stderr[-3000:]
        out[(strategy, 2)] = two.record
    return out


def assert_close(a: list[float], b: list[float], rel: float = 1e-4) -> None:
    assert len(a) == len(b) == STEPS
    for step, (x, y) in enumerate(zip(a, b)):
        assert abs(x - y) <= rel * abs(y), f"step {step}: {x} vs {y}"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_world_size_2_matches_world_size_1(records, strategy):
    assert_close(records[(strategy, 2)]["loss_per_step"], records[(strategy, 1)]["loss_per_step"])


@pytest.mark.parametrize("strategy", STRATEGIES[1:])
def test_every_strategy_matches_ddp(records, strategy):
    for world in (1, 2):
        assert_close(records[(strategy, world)]["loss_per_step"], records[("ddp", 1)]["loss_per_step"])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_records_are_valid_and_describe_the_run(records, result_schema, strategy):
    for world in (1, 2):
        r = records[(strategy, world)]
        jsonschema.validate(r, result_schema)
        assert r["status"] == "ok" and r["error"] is None
        assert r["strategy"] == strategy and r["world_size"] == world
        assert r["launcher"] == (LAUNCHER_AT_2[strategy] if world == 2 else "none")
        assert r["global_batch"] == 8 and r["micro_batch"] * r["grad_accum"] * world == 8
        assert r["measured_steps"] == STEPS - 1 == len(r["step_time_s"]["all"])
        assert r["tokens_per_s"] == pytest.approx(r["tokens_per_step"] * r["measured_steps"]
                                                  / sum(r["step_time_s"]["all"]))
        assert r["tokens_per_s_per_device"] == pytest.approx(r["tokens_per_s"] / world)
        assert [m["rank"] for m in r["peak_memory"]] == list(range(world))
        assert all(m["rss_bytes"] > 0 for m in r["peak_memory"])
        assert r["mfu"] is None and r["peak_flops"] is None  # no peak for CPUs
        assert r["comm_backend"] == "gloo" and r["device"] == "cpu"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_model_state_matches_the_formula(records, strategy):
    for world in (1, 2):
        r = records[(strategy, world)]
        expected = STRATEGY_TABLE[strategy].model_state_bytes_per_param("fp32", world) * r["n_params"]
        for rank in r["model_state"]:
            assert rank["total_bytes"] == pytest.approx(expected, rel=0.10), (world, rank)


@pytest.mark.parametrize("strategy", ["fsdp", "zero3"])
def test_sharded_strategies_halve_at_two_ranks(records, strategy):
    one = records[(strategy, 1)]["model_state_bytes_per_rank"]
    two = records[(strategy, 2)]["model_state_bytes_per_rank"]
    assert two / one == pytest.approx(0.5, abs=0.05)


@pytest.mark.parametrize("strategy", ["zero1", "zero2"])
def test_zero12_halve_everything_but_the_weights(records, strategy):
    def sharded(world):
        ranks = records[(strategy, world)]["model_state"]
        return max(m["grads_bytes"] + m["optimizer_bytes"] for m in ranks)

    assert sharded(2) / sharded(1) == pytest.approx(0.5, abs=0.05)


def test_ddp_does_not_shard(records):
    assert records[("ddp", 2)]["model_state_bytes_per_rank"] == records[("ddp", 1)]["model_state_bytes_per_rank"]
