"""Checkpoint and resume on real runs: every strategy at world sizes 1 and 2 resumes exactly
(the same loss per step as the uninterrupted run), fsdp resumes at another world size, a corrupt
or partial latest checkpoint falls back to the one before it, and the record reports the cost.

One uninterrupted run per (strategy, world size) saves checkpoints at steps 3 and 6 of 8; each
resumed run starts a new set of processes from the step-3 checkpoint, as a restarted job does."""
from __future__ import annotations

import shutil
from pathlib import Path

import jsonschema
import pytest

from tests.trainer.conftest import run_trainer
from shardbench.trainer import checkpoint
from shardbench.trainer.contract import STRATEGIES as STRATEGY_TABLE

pytestmark = pytest.mark.slow  # multi-process runs

STRATEGIES = list(STRATEGY_TABLE)  # a new row of the contract's table runs here too
STEPS, EVERY = 8, 3
COMMON = ["--model", "tiny", "--seq-len", "32", "--global-batch", "8", "--steps", str(STEPS),
          "--warmup-steps", "1", "--precision", "fp32", "--seed", "11", "--lr", "1e-3",
          "--lr-warmup-steps", "2", "--progress-every", "100"]
# A resumed run that saves no more checkpoints changes a measured setting (checkpoint_every):
# allowed explicitly (trainer/checkpoint_guard.py).
NO_SAVES = ("--resume-allow", "checkpointing")


def train(strategy: str, world: int, tmp: Path, *extra: str):
    args = ["--strategy", strategy, "--micro-batch", str(4 // world), *COMMON, *extra]
    # Ranks forked with torchrun's environment (tests/forkserver.py): checkpointing is under test
    # here, not the launchers (test_strategies runs each strategy under its own).
    run = run_trainer(args, tmp, launcher="torchrun" if world > 1 else None, nproc=world)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.record


def assert_same(a: list[float], b: list[float], rel: float) -> None:
    assert len(a) == len(b) == STEPS
    for step, (x, y) in enumerate(zip(a, b)):
        assert abs(x - y) <= rel * abs(y), f"step {step}: {x} vs {y}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(strategy, world) -> (uninterrupted record, its checkpoint dir, record resumed at step 3)."""
    out = {}
    for strategy in STRATEGIES:
        for world in (1, 2):
            tmp = tmp_path_factory.mktemp(f"{strategy}-w{world}")
            ckpt = tmp / "ckpt"
            full = train(strategy, world, tmp, "--checkpoint-dir", str(ckpt), "--checkpoint-every", str(EVERY))
            resumed = train(strategy, world, tmp, "--checkpoint-dir", str(tmp / "other"),
                            "--resume", str(ckpt / checkpoint.step_dir_name(3)), *NO_SAVES)
            out[(strategy, world)] = (full, ckpt, resumed)
    return out


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_resumed_run_has_the_uninterrupted_losses(runs, strategy, world, result_schema):
    full, ckpt, resumed = runs[(strategy, world)]
    assert_same(resumed["loss_per_step"], full["loss_per_step"], rel=1e-6)
    assert_same(resumed["grad_norm_per_step"], full["grad_norm_per_step"], rel=1e-5)  # restored, then recomputed
    assert resumed["checkpoint"]["resumed_from_step"] == 3 and resumed["checkpoint"]["restarts"] == 1
    assert resumed["checkpoint"]["load_s"] > 0
    # The record covers the whole run: measured steps before the checkpoint came with it.
    assert len(resumed["step_time_s"]["all"]) + len(resumed["checkpoint"]["step_time_s"]) == STEPS - 1
    jsonschema.validate(resumed, result_schema)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_checkpoints_are_committed_with_a_manifest_and_rotated(runs, strategy, world):
    full, ckpt, _ = runs[(strategy, world)]
    assert [p.name for _, p in checkpoint.committed(ckpt)] == ["step-00000006", "step-00000003"]
    assert not list(ckpt.glob(checkpoint.TMP_PREFIX + "*"))
    for _, path in checkpoint.committed(ckpt):
        assert checkpoint.verify(path) is None
    cost = full["checkpoint"]
    assert cost["saves"] == 2 and cost["every"] == EVERY and cost["save_s_max"] >= cost["save_s_mean"] > 0
    assert len(cost["size_bytes_per_rank"]) == world and all(b > 0 for b in cost["size_bytes_per_rank"])
    assert cost["size_bytes"] == sum(cost["size_bytes_per_rank"])
    # What each engine keeps, per parameter: fp32 weights once (the tied embedding too) and two
    # Adam moments; ZeRO-1/2 add DeepSpeed's fp32 master partitions beside the whole module.
    per_param = {"ddp": 12, "fsdp": 12, "zero1": 16, "zero2": 16, "zero3": 12}[strategy]
    assert cost["size_bytes"] == pytest.approx(per_param * full["n_params"], rel=0.1)
    # Steps 3 and 6 ended in a save: reported on their own, not in the step-time statistics.
    assert len(cost["step_time_s"]) == 2 and len(full["step_time_s"]["all"]) == STEPS - 1 - 2


def test_fsdp_resumes_at_another_world_size(runs, tmp_path):
    for saved, resumed_at in ((2, 1), (1, 2)):
        full, ckpt, _ = runs[("fsdp", saved)]
        other = train("fsdp", resumed_at, tmp_path, "--checkpoint-dir", str(tmp_path / f"c{saved}"),
                      "--resume", str(ckpt / checkpoint.step_dir_name(3)), "--resume-allow", "checkpointing,world_size")
        assert_same(other["loss_per_step"], full["loss_per_step"], rel=1e-4)
        assert other["checkpoint"]["resumed_from_step"] == 3


@pytest.mark.parametrize("strategy,damage", [("ddp", "corrupt"), ("zero2", "truncate"), ("fsdp", "partial")])
def test_a_bad_latest_checkpoint_falls_back_to_the_previous_one(runs, tmp_path, strategy, damage):
    full, ckpt, _ = runs[(strategy, 2)]
    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt, copy)
    latest = copy / checkpoint.step_dir_name(6)
    if damage == "partial":  # the run died while writing step 6: never committed
        latest.rename(copy / (checkpoint.TMP_PREFIX + latest.name))
        (copy / (checkpoint.TMP_PREFIX + latest.name) / checkpoint.MANIFEST).unlink()
    else:
        biggest = max((p for p in latest.rglob("*") if p.is_file() and p.name != checkpoint.MANIFEST),
                      key=lambda p: p.stat().st_size)
        data = bytearray(biggest.read_bytes())
        if damage == "corrupt":
            data[len(data) // 2] ^= 0xFF
        else:
            del data[len(data) // 2:]
        biggest.write_bytes(bytes(data))
    resumed = train(strategy, 2, tmp_path, "--checkpoint-dir", str(copy), *NO_SAVES)  # --resume auto
    assert resumed["checkpoint"]["resumed_from_step"] == 3
    assert any(latest.name in w for w in resumed["warnings"]), resumed["warnings"]
    assert_same(resumed["loss_per_step"], full["loss_per_step"], rel=1e-6)


def test_async_save_resumes_exactly(runs, tmp_path):
    full, _, _ = runs[("fsdp", 2)]
    ckpt = tmp_path / "ckpt"
    asynchronous = train("fsdp", 2, tmp_path, "--checkpoint-dir", str(ckpt), "--checkpoint-every", str(EVERY),
                         "--async-checkpoint")
    assert asynchronous["checkpoint"]["async_save"] and asynchronous["checkpoint"]["saves"] == 2
    assert_same(asynchronous["loss_per_step"], full["loss_per_step"], rel=1e-6)
    resumed = train("fsdp", 2, tmp_path, "--checkpoint-dir", str(ckpt), "--resume",
                    str(ckpt / checkpoint.step_dir_name(6)), *NO_SAVES)
    assert_same(resumed["loss_per_step"], full["loss_per_step"], rel=1e-6)


def test_resume_from_a_path_without_a_checkpoint_dir(runs, tmp_path):
    full, ckpt, _ = runs[("zero1", 1)]
    resumed = train("zero1", 1, tmp_path, "--resume", str(ckpt / checkpoint.step_dir_name(6)), *NO_SAVES)
    assert resumed["checkpoint"]["resumed_from_step"] == 6 and resumed["checkpoint"]["saves"] == 2
    assert_same(resumed["loss_per_step"], full["loss_per_step"], rel=1e-6)


def test_resume_never_and_an_empty_dir_start_from_scratch(tmp_path):
    rec = train("ddp", 1, tmp_path, "--checkpoint-dir", str(tmp_path / "empty"))
    assert rec["checkpoint"]["resumed_from_step"] is None and rec["checkpoint"]["restarts"] == 0


def test_checkpoint_every_without_a_dir_is_refused_before_anything_runs(tmp_path):
    run = run_trainer(["--strategy", "ddp", "--checkpoint-every", "5"], tmp_path)
    assert run.returncode == 2 and "--checkpoint-dir" in run.stderr and len(run.stderr.strip().splitlines()) == 1
