"""Every strategy, at world sizes 1 and 2, under every launcher: same tokens, same losses, valid
records, the model-state bytes each strategy is supposed to hold at the peak of a step, and the
collectives each one issues (checked against the arithmetic of the strategy)."""
from __future__ import annotations

import os

import jsonschema
import pytest

from tests.reference_runs import shared_run
from shardbench.trainer.contract import STATE, STRATEGIES as STRATEGY_TABLE, default_launcher
from shardbench.trainer.model import PRESETS, TinyGPT

pytestmark = pytest.mark.slow  # multi-process runs

STRATEGIES = list(STRATEGY_TABLE)  # a new row of the contract's table runs here too
# World size 2: each strategy's default launcher, but each launcher starts at least one
# plain-torch and one DeepSpeed strategy.
LAUNCHER_AT_2 = {**{s: default_launcher(s) for s in STRATEGIES}, "ddp": "torchrun", "zero3": "mpirun"}
SHARDED = [s for s, info in STRATEGY_TABLE.items() if not info.on_host and set(info.sharded) == set(STATE)]
"""Strategies that hold no whole copy of anything (fsdp, zero3)."""
STEPS = 6
# Same global batch (8 sequences) everywhere; grad-accum 2 exercises the no-sync micro-steps.
COMMON = ["--model", "tiny", "--seq-len", "64", "--global-batch", "8", "--steps", str(STEPS),
          "--warmup-steps", "1", "--precision", "fp32", "--seed", "7", "--lr", "1e-3", "--lr-warmup-steps", "2"]


def reference(strategy: str, world: int):
    """The session's run of `strategy` at `world` ranks (tests/reference_runs.py): test_layouts
    and test_measurement compare against the same runs instead of training their own."""
    if world == 1:
        return shared_run(["--strategy", strategy, "--micro-batch", "4", *COMMON])
    # zero3 under mpirun finds its rendezvous through mpi4py (no MASTER_ADDR given). The launchers
    # are under test here: real ones (fork=False), not ranks forked with torchrun's environment.
    return shared_run(["--strategy", strategy, "--micro-batch", "2", *COMMON], launcher=LAUNCHER_AT_2[strategy],
                      nproc=2, master_env=strategy != "zero3", fork=False)


@pytest.fixture(scope="module")
def records() -> dict[tuple[str, int], dict]:
    out = {}
    for strategy in STRATEGIES:
        one = reference(strategy, 1)
        assert one.returncode == 0, one.stderr[-3000:]
        out[(strategy, 1)] = one.record
        two = reference(strategy, 2)
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


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "ddp"])
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
        assert [m["rank"] for m in r["memory"]] == list(range(world))
        assert all(m["rss_peak_bytes"] > 0 and m["train_peak_bytes"] is None for m in r["memory"])
        # On CPU the compared figure is the tensors held, never the process's RSS.
        assert r["peak_memory_bytes"] == r["model_state_bytes_per_rank"]
        assert r["grad_reduce_dtype"] == "fp32" and r["compute_path"] == "fp32"
        assert r["fsdp_grad_sync"] == ("every_micro_step" if strategy == "fsdp" else None)
        assert r["threads_per_rank"] == 1 and len(r["cpu_affinity"]) == world
        assert r["load_avg_1m_start"] is not None and r["load_avg_1m_end"] is not None
        assert r["cpu_count"] == os.cpu_count()
        assert r["mfu"] is None and r["peak_flops"] is None  # no peak for CPUs
        assert r["comm_backend"] == "gloo" and r["device"] == "cpu"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_model_state_matches_the_formula(records, strategy):
    for world in (1, 2):
        r = records[(strategy, world)]
        per_param = STRATEGY_TABLE[strategy].model_state_bytes_per_param("fp32", world, r["grad_accum"])
        for rank in r["model_state"]:
            held = rank["total_bytes"] - rank["comm_buffer_bytes"]
            assert held == pytest.approx(per_param * r["n_params"], rel=0.02), (world, rank)
            parts = ("params_bytes", "grads_bytes", "optimizer_bytes", "master_bytes", "comm_buffer_bytes")
            assert sum(rank[k] for k in parts) == rank["total_bytes"]


def held(record: dict) -> int:
    """Model state without communication buffers, max over ranks."""
    return max(m["total_bytes"] - m["comm_buffer_bytes"] for m in record["model_state"])


@pytest.mark.parametrize("strategy", SHARDED)
def test_sharded_strategies_halve_at_two_ranks(records, strategy):
    assert held(records[(strategy, 2)]) / held(records[(strategy, 1)]) == pytest.approx(0.5, abs=0.05)


@pytest.mark.parametrize("strategy", [s for s, i in STRATEGY_TABLE.items() if i.zero_stage in (1, 2)])
def test_zero12_halve_master_and_optimizer(records, strategy):
    def sharded(world):
        ranks = records[(strategy, world)]["model_state"]
        return max(m["master_bytes"] + m["optimizer_bytes"] for m in ranks)

    assert sharded(2) / sharded(1) == pytest.approx(0.5, abs=0.05)


def test_ddp_does_not_shard(records):
    assert records[("ddp", 2)]["model_state_bytes_per_rank"] == records[("ddp", 1)]["model_state_bytes_per_rank"]


def test_zero1_holds_full_gradients_between_micro_steps(records):
    """ZeRO-1 accumulates whole gradients until the last micro-step; ZeRO-2 reduces them into
    its partition after every one (grad-accum 2 here): ZeRO-1 holds more, 14 vs 12 B/param."""
    zero1, zero2 = records[("zero1", 2)], records[("zero2", 2)]
    assert zero1["grad_accum"] == zero2["grad_accum"] == 2
    assert zero1["model_state_bytes_per_rank"] > zero2["model_state_bytes_per_rank"]
    assert held(zero1) > held(zero2)
    assert {m["peak_at"] for m in zero1["model_state"]} == {"micro-step 0 backward"}


def test_deepspeed_reduce_buckets_count_as_comm_buffers(records):
    """ZeRO-1 with overlap_comm double-buffers its fp32 reduce bucket (--bucket-mib, DDP's
    bucket_cap_mb, 25 MiB by default; it was DeepSpeed's 50M elements = 2 x 191 MiB):
    communication buffers DeepSpeed holds, counted apart from model state."""
    r = records[("zero1", 2)]
    assert r["bucket_mib"] == 25
    for m in r["model_state"]:
        assert m["comm_buffer_bytes"] == 2 * 25 * 2 ** 20


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_model_state_agrees_with_deepspeeds_estimators(records, strategy):
    """DeepSpeed's estimate_zero{2,3}_model_states_mem_needs (what its *_all_live functions
    print) assume 16-bit weights; in fp32 every difference is accounted for (README):
    zero2: + 2P (whole fp32 weights, not 16-bit) - 2P/N (no 16-bit gradient copy);
    zero3: + 2P/N (fp32 weight partition) - the largest layer (DeepSpeed's allowance for a
    gathered layer, which is released after use and not held at the sampled points)."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    r = records[(strategy, 2)]
    n, p = 2, r["n_params"]
    if strategy == "zero2":
        _, estimate = estimate_zero2_model_states_mem_needs(p, num_gpus_per_node=n, cpu_offload=False)
        expected = estimate + 2 * p - 2 * p / n
    else:
        largest = PRESETS["tiny"].vocab_size * PRESETS["tiny"].n_embd  # the tied embedding
        _, estimate, largest_bytes = estimate_zero3_model_states_mem_needs(
            p, largest, num_gpus_per_node=n, cpu_offload=False, cpu_offload_params=False)
        expected = estimate + 2 * p / n - largest_bytes
    assert held(r) == pytest.approx(expected, rel=0.01)


def test_ddp_all_reduces_four_bytes_per_parameter_per_step(records):
    r = records[("ddp", 2)]
    comm = r["comm_per_step"]
    assert set(comm) == {"all_reduce"}  # nothing on the non-final micro-step (no_sync)
    assert comm["all_reduce"]["bytes"] == pytest.approx(4 * r["n_params"], rel=0.01)


def test_fsdp_all_gathers_per_micro_step_match_the_arithmetic(records):
    """Blocks 0..L-2 are resharded after forward: gathered in forward and again in backward.
    The last block and the root (tied embedding, final LayerNorm) are not: gathered once.
    Every unit reduce-scatters its gradients after every micro-step."""
    r = records[("fsdp", 2)]
    cfg = PRESETS["tiny"]
    model = TinyGPT(cfg)
    block = 4 * sum(p.numel() for p in model.blocks[0].parameters())
    root = 4 * r["n_params"] - cfg.n_layer * block
    resharded, once = cfg.n_layer - 1, 1 + 1
    comm, accum = r["comm_per_step"], r["grad_accum"]
    assert comm["all_gather"]["calls"] / accum == 2 * resharded + once == 4
    assert comm["all_gather"]["bytes"] / accum == pytest.approx(root + block * (2 * resharded + 1), rel=0.01)
    assert comm["reduce_scatter"]["calls"] / accum == cfg.n_layer + 1
    assert comm["reduce_scatter"]["bytes"] / accum == pytest.approx(4 * r["n_params"], rel=0.01)


@pytest.mark.parametrize("strategy", [s for s, i in STRATEGY_TABLE.items() if not i.group_at_world_size_1])
def test_one_rank_issues_no_collectives(records, strategy):
    assert records[(strategy, 1)]["comm_per_step"] == {}


def test_each_rank_pinned_to_its_own_core(records):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    for strategy in STRATEGIES:
        affinity = records[(strategy, 2)]["cpu_affinity"]
        assert all(len(cores) == 1 for cores in affinity) and len({c[0] for c in affinity}) == 2, strategy
