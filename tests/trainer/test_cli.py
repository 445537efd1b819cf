"""The trainer's command line: one-line errors for bad input, a learning model, the record file."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from tests.trainer.conftest import REPO, cpu_env, run_trainer

BAD_ARGS = [
    (["--strategy", "zero4"], "invalid choice: 'zero4'"),
    (["--strategy", "ddp", "--model", "gpt5"], "invalid choice: 'gpt5'"),
    (["--strategy", "ddp", "--global-batch", "10", "--micro-batch", "4"], "is not a multiple of --micro-batch 4"),
    (["--strategy", "ddp", "--seq-len", "4096"], "exceeds the tiny preset's block size 256"),
    (["--strategy", "ddp", "--precision", "fp16"], "fp16 needs a CUDA GPU"),
    (["--strategy", "ddp", "--precision", "fp16", "--device", "cpu"], "fp16 needs a CUDA GPU"),
    (["--strategy", "ddp", "--steps", "5", "--warmup-steps", "5"], "leaves no measured step"),
    (["--strategy", "ddp", "--micro-batch", "0"], "--micro-batch must be at least 1, got 0"),
    (["--strategy", "ddp", "--n-embd", "100", "--n-head", "3"], "not divisible by 3 heads"),
    (["--strategy", "fsdp", "--deepspeed-config", "x.json"], "applies to DeepSpeed strategies, not fsdp"),
    (["--strategy", "ddp", "--lr", "nan"], "--lr must be a finite number, got nan"),
    (["--strategy", "ddp", "--pg-timeout-s", "inf"], "--pg-timeout-s must be a finite number, got inf"),
    (["--strategy", "ddp", "--pg-timeout-s", "0"], "--pg-timeout-s must be above 0"),
    (["--strategy", "ddp", "--steps", "x"], "invalid int value: 'x'"),
    # Before anything is allocated: 7B parameters x 16 B of DDP state cannot fit this host.
    (["--strategy", "ddp", "--model", "llama-7b-shape", "--device", "cpu"], "GiB of model state"),
    (["--strategy", "ddp", "--model", "llama-7b-shape"], "GiB of model state"),
]


@pytest.mark.parametrize("args,message", BAD_ARGS, ids=[m for _, m in BAD_ARGS])
def test_bad_arguments_exit_2_with_one_line(tmp_path, args, message):
    run = run_trainer(args, tmp_path, timeout=60)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("error: ") and message in lines[0]
    assert "BENCHMARK_RESULT_JSON_START" not in run.stdout


def test_zero_without_deepspeed_says_how_to_install(tmp_path):
    # A real interpreter in which `import deepspeed` cannot find the package.
    code = textwrap.dedent("""
        import sys, importlib.abc
        class Hide(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "deepspeed" or name.startswith("deepspeed."):
                    raise ModuleNotFoundError(name)
        sys.meta_path.insert(0, Hide())
        import importlib.util
        importlib.util.find_spec = (lambda f: (lambda n, *a: None if n == "deepspeed" else f(n, *a)))(importlib.util.find_spec)
        from shardbench.trainer.cli import main
        sys.exit(main(["--strategy", "zero3"]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=cpu_env(), capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --strategy zero3 needs DeepSpeed, which is not installed: run scripts/bootstrap.sh "
        "(or pip install deepspeed after torch)"]


@pytest.mark.slow
def test_model_learns_and_result_json_matches_stdout(tmp_path):
    out = tmp_path / "out"
    run = run_trainer(["--strategy", "ddp", "--steps", "30", "--warmup-steps", "2", "--seq-len", "64",
                       "--micro-batch", "8", "--lr", "1e-3", "--lr-warmup-steps", "2",
                       "--output-dir", str(out), "--run-id", "learn-r0"], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    losses = run.record["loss_per_step"]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3, losses
    saved = json.loads((out / "result.json").read_text())
    assert saved == run.record and saved["run_id"] == "learn-r0"
    assert not list(out.glob(".result-*"))  # the atomic write left no temp file
    progress = [json.loads(line.split(" ", 1)[1]) for line in run.stdout.splitlines()
                if line.startswith("SHARDBENCH_PROGRESS ")]
    assert [p["step"] for p in progress] == list(range(1, 31))
    assert [p["phase"] for p in progress[:3]] == ["warmup", "warmup", "measure"]
    assert progress[-1]["eta_s"] == 0


def test_schema_file_is_generated_from_the_record(result_schema):
    from shardbench.trainer.record_schema import json_schema

    assert result_schema == json_schema(), "regenerate: python -m shardbench.trainer.record_schema > trainer/schema/result.schema.json"


def test_unwritable_output_dir_is_refused_before_training(tmp_path):
    from tests.fsfaults import fill, tmpfs

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    run = run_trainer(["--strategy", "ddp", "--output-dir", str(not_a_dir / "out")], tmp_path, timeout=60)
    assert run.returncode == 2 and "BENCHMARK_RESULT_JSON_START" not in run.stdout
    assert run.stderr.strip().splitlines() == [
        f"error: --output-dir {not_a_dir / 'out'} is not writable (Not a directory): "
        "give a directory this user can write, with free space"]
    with tmpfs(tmp_path / "full", size="64k") as full:
        fill(full)
        run = run_trainer(["--strategy", "ddp", "--output-dir", str(full)], tmp_path, timeout=60)
        assert run.returncode == 2 and "No space left on device" in run.stderr, run.stderr
        assert sorted(p.name for p in full.iterdir()) == ["filler"]  # the probe was removed


def test_write_atomic_is_0644_and_leaves_no_temp_file_when_the_disk_is_full(tmp_path):
    from tests.fsfaults import fill, tmpfs
    from shardbench.trainer.record import write_atomic

    write_atomic({"a": 1}, str(tmp_path / "result.json"))
    assert (tmp_path / "result.json").stat().st_mode & 0o777 == 0o644
    with tmpfs(tmp_path / "full", size="64k") as full:
        fill(full)
        with pytest.raises(OSError):
            write_atomic({"big": "x" * 100_000}, str(full / "result.json"))
        assert sorted(p.name for p in full.iterdir()) == ["filler"]


@pytest.mark.slow  # real ranks, their start-up under test
def test_every_rank_stamps_its_process_start(tmp_path):
    """A cluster run's launcher_startup_s ends at the last rank's stamp (suite/execute/startup.py): the
    rank's process start, read from its own /proc, printed once the checks passed."""
    before = time.time()
    proc = subprocess.run([sys.executable, "-m", "shardbench.trainer", "--strategy", "ddp", "--steps", "3",
                           "--warmup-steps", "1", "--seq-len", "32", "--output-dir", str(tmp_path / "out")],
                          cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stamps = [json.loads(x.split(" ", 1)[1]) for x in proc.stderr.splitlines() if x.startswith("SHARDBENCH_START ")]
    assert len(stamps) == 1 and stamps[0]["rank"] == 0
    assert before - 0.05 <= stamps[0]["t"] <= time.time()  # the process's start, not a later moment's
    refused = subprocess.run([sys.executable, "-m", "shardbench.trainer", "--strategy", "ddp", "--micro-batch", "0"],
                             cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "SHARDBENCH_START" not in refused.stderr  # bad input stays one line


@pytest.mark.slow  # a real run in a fresh interpreter: ~7 s idle
def test_closed_stdout_does_not_lose_the_result(tmp_path):
    """`python -m shardbench.trainer ... | head -c 50`: the reader goes away after the first line; the run
    still finishes ok and result.json holds its record."""
    out = tmp_path / "out"
    proc = subprocess.run(
        f"{sys.executable} -m shardbench.trainer --strategy ddp --steps 12 --warmup-steps 2 --seq-len 32 "
        f"--output-dir {out} | head -c 50; exit ${{PIPESTATUS[0]}}",
        shell=True, executable="/bin/bash", cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(proc.stdout) == 50
    saved = json.loads((out / "result.json").read_text())
    assert saved["status"] == "ok" and saved["measured_steps"] == 10


@pytest.mark.slow  # a fresh interpreter importing DeepSpeed: ~5 s idle
def test_ranks_import_deepspeed_without_mlflow():
    """DeepSpeed's autotuner imports mlflow whenever it is installed (the tracking extra): most
    of a second of every DeepSpeed rank's start-up. The trainer's import leaves it out."""
    code = ("import sys; from shardbench.trainer.strategies.zero import import_deepspeed; "
            "ds = import_deepspeed(); import importlib.util; "
            "print(ds.__name__, 'mlflow' in sys.modules, importlib.util.find_spec('mlflow') is not None)")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=REPO, env=cpu_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # mlflow is installed here (make setup's tracking extra), yet never imported by the rank.
    assert proc.stdout.splitlines()[-1].split() == ["deepspeed", "False", "True"]  # after DeepSpeed's log lines


@pytest.mark.slow  # a fresh interpreter importing DeepSpeed: ~5 s idle
def test_the_deepspeed_launcher_starts_without_mlflow(tmp_path):
    """The `deepspeed` command imported mlflow too (its autotuner): 1.1 CPU-s and 1.5-3 s of wall
    time per launch here, counted in DeepSpeed's launcher_startup_s only. The local backend runs
    DeepSpeed's own runner with the same arguments under trainer/deepspeed_runner.py."""
    from shardbench.suite.backends.local import command_for
    from shardbench.suite.matrix.expand import MatrixSpec, expand

    specs, _ = expand(MatrixSpec(strategies=["zero2"], world_sizes=[2], seq_lens=[32], launcher="deepspeed",
                                 shape=None, device="cpu", precision="fp32"))
    cmd = command_for(specs[0], tmp_path, 29500)
    assert cmd[:4] == [sys.executable, "-m", "shardbench.trainer.deepspeed_runner", "--hostfile"]
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "shardbench.trainer.deepspeed_runner", "--help"],
                          cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--master_port" in proc.stdout, proc.stderr[-2000:]  # DeepSpeed's runner's help
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    # the autotuner asks for mlflow and is refused at once (a real import brings its submodules)
    assert "deepspeed.autotuning.autotuner" in imported and not [m for m in imported if m.startswith("mlflow.")]
