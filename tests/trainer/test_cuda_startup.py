"""--device cuda where CUDA cannot run fails with a record saying what the driver supports and
what torch was built for; records carry the driver's versions and every rank's NCCL_* settings.

No GPU or NVIDIA driver exists here: the run test is the real trainer on this machine (CPU torch,
no driver), and the driver-mismatch wording is checked with the driver facts given as data."""
from __future__ import annotations

import json

import pytest

from tests.trainer.conftest import run_trainer
from shardbench.trainer import env_info
from shardbench.trainer.devices import MIN_DRIVER, cuda_problem


def _record(stdout: str) -> dict:
    lines = stdout.splitlines()
    return json.loads(lines[lines.index("BENCHMARK_RESULT_JSON_START") + 1])


def test_cuda_run_without_a_usable_gpu_fails_with_a_record(tmp_path, result_schema):
    from jsonschema import validate

    run = run_trainer(["--strategy", "ddp", "--device", "cuda", "--steps", "2", "--warmup-steps", "1",
                       "--output-dir", str(tmp_path / "out")], tmp_path, timeout=120)
    assert run.returncode == 1, run.stderr
    rec = _record(run.stdout)
    validate(rec, result_schema)
    assert rec["status"] == "failed"
    first = rec["error"].splitlines()[0]
    assert first.startswith("CudaUnusable: --device cuda: ") and "CPU-only build" in first
    assert json.loads((tmp_path / "out" / "result.json").read_text())["status"] == "failed"


def test_old_driver_names_both_sides_and_the_fix():
    msg = cuda_problem({"driver": "570.86.15", "driver_cuda": "12.8"}, built="13.0")
    assert "driver 570.86.15 supports CUDA up to 12.8" in msg
    assert f"built for CUDA 13.0, needs driver >= {MIN_DRIVER[13]}" in msg
    # The old-driver image: PyTorch 2.13 publishes no CUDA 12.8 wheels, so cu128 cannot be built.
    assert "--build-arg VARIANT=cu126 (CUDA 12.6 wheels on a CUDA 12.6 base, driver R560+)" in msg
    assert "cu128" not in msg


def test_no_driver_says_so():
    msg = cuda_problem({"driver": None, "driver_cuda": None}, built="12.8")
    assert "no NVIDIA driver here" in msg and "built for CUDA 12.8, needs driver >= 525.60.13" in msg


def test_driver_new_enough_but_no_gpu_names_the_visible_devices(monkeypatch):
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "void")
    msg = cuda_problem({"driver": "580.65.06", "driver_cuda": "13.0"}, built="13.0")
    assert "torch sees no GPU" in msg and "NVIDIA_VISIBLE_DEVICES='void'" in msg


@pytest.mark.parametrize("text,version", [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Fri Jan 24 00:00:00 UTC 2025\n", "570.86.15"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@x)\n", "580.65.06"),
    ("garbage\n", None),
])
def test_driver_version_from_proc(tmp_path, text, version):
    proc = tmp_path / "version"
    proc.write_text(text)
    assert env_info.cuda_driver(str(proc), libcuda="libcuda-absent.so.1") == {"driver": version, "driver_cuda": None}


def test_no_driver_here_is_none_not_an_error():
    assert env_info.cuda_driver("/nonexistent/version", "libcuda-absent.so.1") == {"driver": None, "driver_cuda": None}
    assert {"cuda", "driver", "driver_cuda", "nccl"} <= set(env_info.versions())


def test_nccl_env_disagreement_is_named():
    ranks = [{"NCCL_IB_HCA": "=mlx5_0", "NCCL_DEBUG": "WARN"}, {"NCCL_DEBUG": "WARN"}]
    env, disagree = env_info.nccl_env_across_ranks(lambda mine: ranks)
    assert env == ranks[0]
    assert disagree == ["NCCL_IB_HCA differs between ranks (rank 0: '=mlx5_0', rank 1: unset)"]
    assert env_info.nccl_env_across_ranks(lambda mine: [mine, mine])[1] == []


def test_an_unusable_gpu_is_not_sized_against_the_host(tmp_path):
    """A model too big for this host's memory still gets the CUDA reason, not a memory refusal."""
    run = run_trainer(["--strategy", "ddp", "--device", "cuda", "--model", "llama-7b-shape"], tmp_path, timeout=120)
    assert run.returncode == 1, run.stderr
    assert _record(run.stdout)["error"].startswith("CudaUnusable: --device cuda: ")
