"""The record outlives its readers: the suite (or a `| tee`) that dies closes the trainer's
stdout and stderr, and the SIGTERM that follows must still end in result.json (issue 19)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.trainer.conftest import REPO, cpu_env
from tests.trainer.test_failures import LONG_RUN, wait_for_step

pytestmark = pytest.mark.slow  # a real trainer process


def test_sigterm_after_the_readers_closed_still_writes_the_record(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-u", "-m", "shardbench.trainer", *LONG_RUN, "--output-dir", str(out)],
                            cwd=REPO, env=cpu_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_step(proc, 2, time.time() + 120)
        proc.stdout.close()  # the reader goes away: every later write is a broken pipe
        proc.stderr.close()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert code == 1
    record = json.loads((out / "result.json").read_text())
    assert record["status"] == "failed" and "SIGTERM" in record["error"]
