"""`shardbench run` from any directory with a relative --results (the default's form): every run
is ok, every file a run writes (trainer output, hostfile, checkpoints) lands under that results
dir, nothing in the checkout, and a fresh results dir never resumes another run's checkpoints
(issue 32 item 1, issue 35 item 2)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # four real runs (~1-2 min)

REPO = Path(__file__).resolve().parents[2]
SHARDBENCH = str(Path(sys.executable).parent / "shardbench")


def _run(cwd: Path, results: str) -> None:
    cwd.mkdir()
    proc = subprocess.run(
        [SHARDBENCH, "run", "--strategies", "ddp,zero2", "--world-sizes", "1", "--seq-lens", "32", "--steps", "4",
         "--warmup-steps", "1", "--repeats", "1", "--checkpoint-every", "2", "--shape", "none", "--device", "cpu",
         "--precision", "fp32", "--results", results, "--yes", "--no-plan", "--quiet"],
        cwd=cwd, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore::FutureWarning"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def _in_checkout(name: str) -> list[str]:
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in (".git", ".venv", ".tools", "node_modules")]
        found += [os.path.join(root, n) for n in dirs + files if name in n]
    return found


def test_relative_results_from_other_directories(tmp_path):
    name = f"relres-{uuid.uuid4().hex[:8]}"
    results = f"{name}/r"
    for cwd in (tmp_path / "a", tmp_path / "b"):  # the same relative path from two directories
        _run(cwd, results)
        records = sorted((cwd / results).glob("*/result.json"))
        assert len(records) == 2
        for path in records:
            record = json.loads(path.read_text())
            assert record["status"] == "ok", record.get("error")
            # a fresh results dir measures from scratch: no other run's checkpoints resumed
            assert record["checkpoint"]["restarts"] == 0 and record["checkpoint"]["resumed_from_step"] is None
        assert sorted((cwd / results).glob("*/launch-0/trainer-output/result.json"))
    assert _in_checkout(name) == []
