"""--float8, --compile and --ddp-comm-hook (issue 29), each on real trainer processes: tiny narrowed
to 64 wide with a 2,048-token vocabulary (CPU float8 matmuls are torch's reference kernel, about a
second per 4 M multiply-adds), 16 tokens per step, a few steps."""
from __future__ import annotations

import subprocess
import sys

import pytest

from shardbench.suite.analyze import analysis, losscheck
from shardbench.trainer import rules
from shardbench.trainer.config import RunConfig
from shardbench.trainer.strategies.ddp import POWERSGD_START_STEP
from shardbench.trainer.strategies.fsdp import reshard_after_forward_plan
from tests.trainer.conftest import REPO, cpu_env, run_trainer

SMALL = ["--model", "tiny", "--n-embd", "64", "--vocab-size", "2048", "--seq-len", "16", "--device", "cpu",
         "--lr", "1e-3", "--lr-warmup-steps", "1", "--seed", "3"]
N_LAYER, D = 2, 64  # tiny's layers; the width above


def _ok(run) -> dict:
    assert run.returncode == 0, run.stderr[-3000:]
    record = run.record
    assert record["status"] == "ok", record["error"]
    return record


def _max_rel(a: list[float], b: list[float]) -> float:
    return losscheck._max_rel(tuple(a), list(b))[0]


def test_float8_trains_within_the_measured_tolerance_of_bf16(tmp_path):
    """Both recipes convert the blocks' 6 linears per layer (not the tied head), train, and stay
    within the loss check's float8 tolerance (measured against bf16: benchmarks/float8_spread.py)
    of the same run in bf16, while differing from it (the matmuls really ran in float8)."""
    args = [*SMALL, "--strategy", "ddp", "--micro-batch", "1", "--steps", "3", "--warmup-steps", "1",
            "--precision", "bf16"]
    bf16 = _ok(run_trainer(args, tmp_path))
    assert bf16["float8"] == "off" and bf16["float8_linears"] is None
    for recipe in ("tensorwise", "rowwise"):
        f8 = _ok(run_trainer([*args, "--float8", recipe], tmp_path))
        assert f8["float8"] == recipe and f8["float8_linears"] == 6 * N_LAYER
        assert f8["float8_all_gather"] is None  # ddp gathers nothing
        diff = _max_rel(f8["loss_per_step"], bf16["loss_per_step"])
        assert 0 < diff <= losscheck.FLOAT8_LOSS_TOLERANCE, (recipe, diff)


@pytest.mark.slow
def test_compile_matches_eager_and_compiles_in_warm_up(tmp_path):
    """--compile: the loss equals eager's within the loss check's tolerance, compilation's seconds
    are recorded, and none of them fell in a measured step (compile happens in warm-up step 0)."""
    args = [*SMALL, "--strategy", "ddp", "--micro-batch", "1", "--steps", "3", "--warmup-steps", "1",
            "--precision", "fp32"]
    eager = _ok(run_trainer(args, tmp_path))
    compiled = _ok(run_trainer([*args, "--compile"], tmp_path, timeout=600))
    assert eager["compile_s"] is None and compiled["compile"] is True
    assert compiled["compile_s"] > 0
    assert compiled["compile_in_measured_s"] == 0.0
    assert _max_rel(compiled["loss_per_step"], eager["loss_per_step"]) <= losscheck.loss_tolerance("fp32")


@pytest.mark.slow
def test_fsdp_float8_all_gather_bytes_are_the_arithmetic(tmp_path):
    """FSDP2 at 2 ranks, bf16 parameters: tensorwise float8 all-gathers the converted weights in 1
    byte instead of 2, so the counted all-gather bytes per step drop by exactly one byte per
    converted weight element per gather (the resharded blocks are gathered in forward and again in
    backward, the last block once); rowwise cannot gather in float8 (torchao) and gathers bf16."""
    args = [*SMALL, "--strategy", "fsdp", "--micro-batch", "1", "--steps", "3", "--warmup-steps", "1",
            "--precision", "bf16"]
    runs = {recipe: _ok(run_trainer([*args, "--float8", recipe], tmp_path, launcher="torchrun", nproc=2, timeout=600))
            for recipe in ("off", "tensorwise")}
    assert runs["tensorwise"]["float8_all_gather"] is True
    gathers = [2 if reshard else 1 for reshard in reshard_after_forward_plan(N_LAYER)]
    weights_per_block = 4 * D * D + 2 * 4 * D * D  # q, k, v, proj; fc and its projection
    saved = sum(gathers) * weights_per_block * (2 - 1)
    bf16_bytes = runs["off"]["comm_per_step"]["all_gather"]["bytes"]
    f8_bytes = runs["tensorwise"]["comm_per_step"]["all_gather"]["bytes"]
    assert bf16_bytes - f8_bytes == saved, (bf16_bytes, f8_bytes, saved)
    diff = _max_rel(runs["tensorwise"]["loss_per_step"], runs["off"]["loss_per_step"])
    assert diff <= losscheck.FLOAT8_LOSS_TOLERANCE


@pytest.mark.slow
def test_powersgd_completes_and_the_loss_check_reports_its_drift(tmp_path):
    """ddp at 2 ranks with PowerSGD at rank 1: the run completes, all-reduces fewer bytes than the
    exact hook, follows the exact run's loss until compression starts and drifts after; the loss
    check puts it in a group of its own (never "broken") and reports the drift as measured."""
    args = [*SMALL, "--strategy", "ddp", "--micro-batch", "1", "--steps", "5", "--warmup-steps", "1",
            "--precision", "fp32"]
    exact = _ok(run_trainer(args, tmp_path, launcher="torchrun", nproc=2))
    psgd = _ok(run_trainer([*args, "--ddp-comm-hook", "powersgd", "--powersgd-rank", "1"], tmp_path,
                           launcher="torchrun", nproc=2))
    assert (exact["ddp_comm_hook"], psgd["ddp_comm_hook"], psgd["powersgd_rank"]) == ("none", "powersgd", 1)
    assert psgd["comm_per_step"]["all_reduce"]["bytes"] < exact["comm_per_step"]["all_reduce"]["bytes"]
    # the loss of step k is taken before step k's update: steps up to the first compressed one agree
    same = POWERSGD_START_STEP + 1
    assert _max_rel(psgd["loss_per_step"][:same], exact["loss_per_step"][:same]) <= losscheck.loss_tolerance("fp32")
    assert _max_rel(psgd["loss_per_step"], exact["loss_per_step"]) > losscheck.loss_tolerance("fp32")
    an = analysis.analyze([exact, psgd])
    assert not any(g.broken for g in an.loss_groups) and "broken" not in set(an.runs["loss_check"])
    (drift,) = an.drifts
    assert (drift.setting, drift.value, drift.baseline, drift.tolerance) == ("ddp_comm_hook", "powersgd", "none", None)
    assert drift.max_rel == _max_rel(psgd["loss_per_step"], exact["loss_per_step"]) and drift.step > POWERSGD_START_STEP


NO_TORCHAO = """import sys
class NoTorchao:  # torchao cannot be imported in this process
    def find_spec(self, name, path=None, target=None):
        if name == "torchao" or name.startswith("torchao."):
            raise ModuleNotFoundError("No module named 'torchao'")
sys.meta_path.insert(0, NoTorchao())
"""


def test_bad_combinations_exit_2_with_one_line(tmp_path):
    """Refused before any process group: float8 with DeepSpeed or tensor parallelism, a ddp hook on
    another strategy, PowerSGD on bf16 gradients, compile without a warm-up step; and float8 where
    torchao cannot be imported (blocked here by a meta-path finder in a sitecustomize)."""
    cases = {"--float8 tensorwise applies to ddp and fsdp": ["--strategy", "zero2", "--float8", "tensorwise"],
             "--ddp-comm-hook powersgd applies to ddp, not fsdp": ["--strategy", "fsdp", "--ddp-comm-hook",
                                                                   "powersgd"],
             "--ddp-comm-hook powersgd compresses fp32 gradients": ["--strategy", "ddp", "--ddp-comm-hook", "powersgd",
                                                                    "--grad-reduce-dtype", "bf16"],
             "--compile compiles in the first step": ["--strategy", "ddp", "--compile", "--warmup-steps", "0"]}
    for said, args in cases.items():
        run = run_trainer(["--steps", "3", "--warmup-steps", "1", *args], tmp_path)
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1 and said in lines[0], (args, run.stderr)
    tp = rules.validate(RunConfig(strategy="ddp", float8="rowwise", tp=2, steps=3, warmup_steps=1), 2)
    assert tp == ["--float8 rowwise with --tp 2: float8 tensor parallelism is not wired here: use --tp 1 or "
                  "--float8 off"]
    (tmp_path / "sitecustomize.py").write_text(NO_TORCHAO)
    proc = subprocess.run([sys.executable, "-m", "shardbench.trainer", "--strategy", "ddp", "--float8", "rowwise",
                           "--steps", "3", "--warmup-steps", "1", "--device", "cpu"], cwd=REPO,
                          env=dict(cpu_env(), PYTHONPATH=str(tmp_path)), capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "--float8 rowwise needs torchao" in lines[0]
