"""`shardbench run ... | tee log`, then Ctrl-C: the terminal sends SIGINT to the whole pipeline,
tee dies, and every later line the suite prints meets a broken pipe. The suite must still end
the run, keep its record and exit 130 (issue 19: it died of SIGPIPE, exit 141, record lost)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a real trainer run

REPO = Path(__file__).resolve().parents[2]
MATRIX = ["--strategies", "ddp", "--world-sizes", "1", "--seq-lens", "32", "--steps", "100000",
          "--warmup-steps", "1", "--micro-batch", "2", "--device", "cpu", "--precision", "fp32",
          "--timeout-s", "300", "--repeats", "1"]


def _default_sigint() -> None:
    """Ctrl-C's default action in the child, whatever this test inherited: a shell starting a
    background job (`make test &`, nohup ... &) ignores SIGINT in it, and an ignored signal stays
    ignored across exec, as a blocked one stays blocked (seen in a CI check: tee outlived its SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _started(results: Path) -> bool:
    return any("SHARDBENCH_PROGRESS" in p.read_text(errors="replace") for p in results.glob("*/log*.txt"))


@pytest.mark.parametrize("quiet", [False, True])
def test_ctrl_c_under_tee_exits_130_and_keeps_the_record(tmp_path, quiet):
    res = tmp_path / "results"
    env = dict(os.environ, PYTHONWARNINGS="ignore::FutureWarning")
    suite = subprocess.Popen([sys.executable, "-m", "shardbench.suite.cli", "run", "--results", str(res), *MATRIX,
                              *(["--quiet"] if quiet else [])], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
                             preexec_fn=_default_sigint)
    tee = subprocess.Popen(["tee", str(tmp_path / "log")], stdin=suite.stdout, stdout=subprocess.DEVNULL,
                           start_new_session=True, preexec_fn=_default_sigint)
    suite.stdout.close()  # tee is now the pipe's only reader, as in a shell pipeline
    try:
        deadline = time.monotonic() + 120
        while not _started(res) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _started(res), "the run never reached its first step"
        tee.send_signal(signal.SIGINT)  # what Ctrl-C does to the pipeline's every process
        try:
            tee.wait(timeout=10)
        except subprocess.TimeoutExpired:
            status = Path(f"/proc/{tee.pid}/status").read_text()
            pytest.fail("tee outlived SIGINT: " + " ".join(line for line in status.splitlines()
                                                            if line.startswith(("State", "Sig"))))
        suite.send_signal(signal.SIGINT)
        code = suite.wait(timeout=90)
    finally:
        for p in (suite, tee):
            if p.poll() is None:
                p.kill()
    assert code == 130
    records = [json.loads(p.read_text()) for p in res.glob("*/result.json")]
    assert [r["status"] for r in records] == ["cancelled"]
