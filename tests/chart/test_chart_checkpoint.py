"""checkpoint.enabled: the chart's trainer arguments checkpoint onto the results volume, and a
retried launcher (runPolicy.backoffLimit > 0 reruns the very same command) resumes from there.
The retry is played on real processes: the rendered arguments run, the run is killed after its
first checkpoint, and the same arguments run again. No cluster can run here."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from chart_helpers import REPO, one, render

SETS = ("persistence.enabled=true", "checkpoint.enabled=true", "checkpoint.every=3", "checkpoint.keep=2",
        "runPolicy.backoffLimit=2", "run.steps=8", "run.warmupSteps=1", "run.seqLen=32")


def trainer_args(mount: str) -> list[str]:
    cm = one(render("helm4", ("cpu.yaml",), (*SETS, f"persistence.mountPath={mount}")), "ConfigMap")
    return json.loads(cm["data"]["trainer-args.json"])


def test_checkpoints_go_to_the_results_volume_and_the_launcher_retries():
    docs = render("helm4", ("cpu.yaml",), SETS)
    assert one(docs, "MPIJob")["spec"]["runPolicy"]["backoffLimit"] == 2
    args = trainer_args("/results")
    run_dir = args[args.index("--output-dir") + 1]
    # A fresh directory per attempt (tests/chart/test_chart_storage.py); a retry reruns this command.
    assert args[args.index("--checkpoint-dir") + 1].startswith(f"{run_dir}/attempts/")
    assert args[args.index("--checkpoint-every") + 1] == "3" and args[args.index("--keep-checkpoints") + 1] == "2"
    assert "--resume" not in args  # the trainer's default, auto, is what a retry needs


@pytest.mark.slow
def test_a_retried_launcher_resumes_from_the_volume(tmp_path):
    args = trainer_args(str(tmp_path))
    env = {**os.environ, "PYTHONWARNINGS": "ignore::FutureWarning", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "shardbench.trainer", *args]  # the launcher pod's command, on one rank
    first = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in first.stdout:  # the pod dies after step 4 (checkpoint at 3)
        if line.startswith("SHARDBENCH_PROGRESS") and json.loads(line.split(" ", 1)[1])["step"] >= 4:
            first.send_signal(signal.SIGKILL)
            break
    first.wait()
    retry = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert retry.returncode == 0, retry.stderr[-2000:]
    record = json.loads(open(os.path.join(args[args.index("--output-dir") + 1], "result.json")).read())
    assert record["checkpoint"]["resumed_from_step"] == 3 and len(record["loss_per_step"]) == 8
