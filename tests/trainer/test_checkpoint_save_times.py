"""After a resume the record's checkpoint.save_s_mean covers the saves of every attempt. A
checkpoint's history holds the saves that ended before it was written, never its own: rank 0
keeps each committed save's seconds in <checkpoint root>/save_times.json (trainer/history.py),
and a resume reads them there, beside the checkpoint it resumes (--resume may name one outside
its own --checkpoint-dir). The live two-rank case is in tests/monitoring/test_prometheus.py."""
from __future__ import annotations

import json

import pytest

from shardbench.trainer import checkpoint
from shardbench.trainer.history import SAVE_TIMES
from tests.trainer.conftest import run_trainer

pytestmark = pytest.mark.slow  # two trainer runs

ARGS = ["--strategy", "ddp", "--model", "tiny", "--seq-len", "32", "--micro-batch", "4", "--steps", "8",
        "--warmup-steps", "1", "--precision", "fp32", "--device", "cpu", "--progress-every", "100"]


def test_a_resumed_run_reports_every_attempts_saves(tmp_path):
    first = run_trainer([*ARGS, "--checkpoint-dir", str(tmp_path / "a"), "--checkpoint-every", "3"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    saved = json.loads((tmp_path / "a" / SAVE_TIMES).read_text())
    assert sorted(saved, key=int) == ["3", "6"]  # the last step (8) never saves
    assert first.record["checkpoint"]["save_s_mean"] == pytest.approx(sum(saved.values()) / 2)
    # Resumed from step 6 into another directory, saving no more: the same two saves (before:
    # only step 3's, which step 6's checkpoint holds).
    resumed = run_trainer([*ARGS, "--checkpoint-dir", str(tmp_path / "b"), "--checkpoint-every", "3",
                           "--resume", str(tmp_path / "a" / checkpoint.step_dir_name(6))], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    cost = resumed.record["checkpoint"]
    assert cost["resumed_from_step"] == 6 and cost["saves"] == 2
    assert cost["save_s_mean"] == pytest.approx(sum(saved.values()) / 2)
    assert cost["save_s_max"] == pytest.approx(max(saved.values()))
