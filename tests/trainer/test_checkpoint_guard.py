"""What a checkpointing run checks before it measures anything (issue 19), on real runs: a
resume with other measured settings is refused (exit 2, one line naming them) unless
--resume-allow lets them change; a read-only --checkpoint-dir is refused at start; a directory
another live run holds is refused with its owner named; a full disk during a save says so."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from tests.fsfaults import tmpfs
from tests.trainer.conftest import REPO, cpu_env, run_trainer
from tests.trainer.test_checkpoint_faults import ARGS, full  # noqa: F401 - the shared uninterrupted run
from tests.trainer.test_failures import LONG_RUN, wait_for_step


def refused(run) -> str:
    assert run.returncode == 2, run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    return lines[0]


@pytest.mark.slow  # three trainer processes (each exits 2 before training, after importing torch)
def test_resume_with_other_measured_settings_is_refused(full, tmp_path):  # noqa: F811
    ckpt = tmp_path / "ckpt"
    shutil.copytree(full[1], ckpt)  # the session's shared run: never written into
    line = refused(run_trainer([*ARGS, "--checkpoint-dir", str(ckpt), "--lr", "2e-3", "--weight-decay", "0.1",
                                "--grad-clip", "0.5", "--lr-warmup-steps", "3"], tmp_path))
    for name in ("grad_clip", "lr ", "lr_warmup_steps", "weight_decay"):
        assert name in line, line
    line = refused(run_trainer([*ARGS, "--checkpoint-dir", str(ckpt), "--seed", "12"], tmp_path))
    assert "seed 11 -> 12" in line
    line = refused(run_trainer([*ARGS, "--checkpoint-dir", str(ckpt), "--resume-allow", "lr"], tmp_path))
    assert "--resume-allow lr" in line


@pytest.mark.slow
def test_resume_allow_lets_a_documented_change_through(full, tmp_path):  # noqa: F811
    _, ckpt = full
    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt, copy)
    refused(run_trainer([*ARGS, "--checkpoint-dir", str(copy), "--steps", "10"], tmp_path))
    run = run_trainer([*ARGS, "--checkpoint-dir", str(copy), "--steps", "10", "--resume-allow", "steps"], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.record["checkpoint"]["resumed_from_step"] == 6 and run.record["steps"] == 10


def test_a_read_only_checkpoint_dir_is_refused_at_start(tmp_path):
    with tmpfs(tmp_path / "ro", readonly=True) as ro:
        line = refused(run_trainer([*ARGS, "--checkpoint-dir", str(ro / "ckpt")], tmp_path))
    assert "--checkpoint-dir" in line and "not writable" in line and "Read-only" in line


@pytest.mark.slow
def test_a_checkpoint_dir_in_use_is_refused_with_its_owner(tmp_path):
    ckpt = tmp_path / "ckpt"
    first = subprocess.Popen([sys.executable, "-u", "-m", "shardbench.trainer", *LONG_RUN, "--checkpoint-dir", str(ckpt)],
                             cwd=REPO, env=cpu_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        wait_for_step(first, 1, time.time() + 120)
        os.environ["SHARDBENCH_CKPT_LOCK_WAIT_S"] = "1"  # not the default 15 s a retried launcher gets
        try:
            line = refused(run_trainer([*LONG_RUN, "--checkpoint-dir", str(ckpt)], tmp_path))
        finally:
            del os.environ["SHARDBENCH_CKPT_LOCK_WAIT_S"]
    finally:
        first.kill()
        first.wait()
    assert f"pid {first.pid} on host {socket.gethostname()}" in line
    # The lock dies with its owner: the directory is usable again at once.
    again = run_trainer([*ARGS, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "0", "--steps", "2"], tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]


@pytest.mark.slow
def test_a_full_disk_during_a_save_is_named(tmp_path):
    with tmpfs(tmp_path / "small", size="1m") as small:
        out = tmp_path / "out"
        run = run_trainer([*ARGS, "--checkpoint-dir", str(small / "ckpt"), "--output-dir", str(out)], tmp_path)
        leftovers = os.listdir(small / "ckpt")
    assert run.returncode == 1
    record = json.loads((out / "result.json").read_text())
    assert record["status"] == "failed" and "no space left on device" in record["error"].splitlines()[0].lower()
    assert not [n for n in leftovers if n.startswith(".tmp-")]  # the partial checkpoint is gone
