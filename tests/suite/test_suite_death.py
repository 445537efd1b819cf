"""Nothing measured is lost when the suite dies: `kill -9` of `shardbench run` during a run
under mpirun, torchrun and the DeepSpeed launcher leaves rank 0's record (the trainer's
result.json) every time, and no process behind (issue 35 item 1).

The loss was a race (prterun SIGKILLs its ranks as soon as one exits after its SIGTERM): on an
idle host rank 0 usually won it, on a loaded one it lost about half the time. So the kills here
happen with three CPU burners running, as on a shared CI machine."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # five real runs (~2-3 min)

SHARDBENCH = str(Path(sys.executable).parent / "shardbench")
CASES = [("ddp", "mpirun")] * 3 + [("fsdp", "torchrun"), ("zero2", "deepspeed")]


def _ps_lines() -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid,ppid,stat,etimes,args"], capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines()[1:] if "ps -ww" not in line]


def _ours(text: str) -> list[int]:
    return [int(line.split()[0]) for line in _ps_lines() if text in line and line.split()[2][0] != "Z"]


def _burners(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


@pytest.mark.parametrize("strategy,launcher", CASES)
def test_kill_9_of_the_suite_keeps_rank_0s_record(tmp_path, strategy, launcher):
    results = tmp_path / "res"
    out = open(tmp_path / "out.txt", "wb")
    suite = subprocess.Popen(
        [SHARDBENCH, "run", "--strategies", strategy, "--world-sizes", "2", "--seq-lens", "32", "--steps", "100000",
         "--warmup-steps", "1", "--repeats", "1", "--launcher", launcher, "--shape", "none", "--device", "cpu", "--precision", "fp32",
         "--results", str(results), "--yes", "--no-plan", "--quiet"],
        cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    burners: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + 240
        while not any("SHARDBENCH_PROGRESS" in p.read_text(errors="replace") for p in results.glob("*/log.txt")):
            assert time.monotonic() < deadline and suite.poll() is None, (
                "the run never started: " + (tmp_path / "out.txt").read_text(errors="replace")[-2000:])
            time.sleep(0.5)
        burners = _burners(3)
        time.sleep(1.0)
        suite.kill()  # SIGKILL: no handler of the suite runs
        suite.wait()
        deadline = time.monotonic() + 60
        while _ours(str(results)) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _ours(str(results))
        # what lingered, for the failure message (seen once in a loaded CI run, fsdp-torchrun)
        lingered = [line for line in _ps_lines() if line.split()[0] in {str(pid) for pid in left}]
    finally:
        for b in burners:
            b.kill()
            b.wait()
        for pid in _ours(str(results)):  # clean up what this test started
            os.kill(pid, signal.SIGKILL)
    assert left == [], "\n".join(lingered)
    found = list(results.glob("*/trainer-output/result.json"))
    assert found, f"rank 0's record was lost ({strategy} under {launcher})"
    record = json.loads(found[0].read_text())
    assert record["status"] == "failed" and "SIGTERM" in record["error"]
