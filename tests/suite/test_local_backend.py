"""The local backend with the real trainer and launchers: cancel and timeout leave no rank behind."""
from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest

from tui.suite import events as ev
from tui.suite.backends.local import LocalBackend
from tui.suite.matrix import MatrixSpec, expand

pytestmark = pytest.mark.slow


def one_spec(strategy, world, launcher, steps=100000):
    specs, errors = expand(MatrixSpec(strategies=[strategy], world_sizes=[world], seq_lens=[64],
                                      steps=steps, warmup_steps=2, launcher=launcher, shape=None,
                                      device="cpu", precision="fp32"))
    assert not errors
    return specs[0]


def processes_mentioning(text: str) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid,stat,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines()[1:] if text in line and " Z" not in line and "ps -eo" not in line]


def test_cancel_mid_run_kills_every_rank(tmp_path):
    spec = one_spec("zero2", 2, "deepspeed")
    run_dir = tmp_path / spec.run_id
    cancel, seen = threading.Event(), []

    def emit(event):
        seen.append(event)
        if isinstance(event, ev.RunProgress) and event.step >= 2:
            cancel.set()  # what Ctrl-C in the CLI / the TUI's stop button does

    t0 = time.monotonic()
    record = LocalBackend(kill_grace_s=3).run(spec, run_dir, emit, cancel, timeout_s=240)
    assert cancel.is_set(), f"never saw progress: {(run_dir / 'log.txt').read_text()[-2000:]}"
    assert record["status"] == "failed" and "cancelled" in record["error"]
    assert time.monotonic() - t0 < 120
    # Every rank and launcher carried --output-dir <run_dir>/...: none may survive. Checked at
    # once: a rank that only dies later (SIGPIPE, a gloo timeout) was an orphan all the same.
    assert processes_mentioning(str(run_dir)) == []
    assert json.loads((run_dir / "result.json").read_text())["status"] == "failed"
    log = (run_dir / "log.txt").read_text()
    assert "SHARDBENCH_PROGRESS" in log
    progress = [e for e in seen if isinstance(e, ev.RunProgress)]
    assert progress[0].run_id == spec.run_id and progress[0].steps == 100000
    assert any(isinstance(e, ev.RunLogLine) for e in seen)


def test_timeout_stops_the_run_and_says_so(tmp_path):
    spec = one_spec("fsdp", 2, "torchrun")
    run_dir = tmp_path / spec.run_id
    record = LocalBackend(kill_grace_s=3).run(spec, run_dir, ev.ignore, threading.Event(), timeout_s=12)
    assert record["status"] == "timeout" and "12 s" in record["error"]
    assert " at step " in record["error"] or "before the first step" in record["error"]
    assert processes_mentioning(str(run_dir)) == []


def test_missing_launcher_is_one_clear_failed_record(tmp_path):
    spec = one_spec("ddp", 1, "mpirun", steps=4)
    backend = LocalBackend(search_path=str(tmp_path / "empty-bin"))
    assert backend.availability()[0] is False
    record = backend.run(spec, tmp_path / spec.run_id, ev.ignore, threading.Event(), None)
    assert record["status"] == "failed"
    assert record["error"].startswith("mpirun not found") and "\n" not in record["error"]
    assert (tmp_path / spec.run_id / "result.json").exists()


def test_a_raising_event_consumer_cannot_stall_the_run(tmp_path):
    spec = one_spec("ddp", 1, "mpirun", steps=4)

    def broken(_event):
        raise RuntimeError("consumer bug")

    record = LocalBackend().run(spec, tmp_path / spec.run_id, broken, threading.Event(), timeout_s=120)
    assert record["status"] == "ok", record.get("error")
    assert "BENCHMARK_RESULT_JSON_END" in (tmp_path / spec.run_id / "log.txt").read_text()
