"""The ray backend on real runs: an embedded Ray (no server) whose actors run the trainer's ranks.
A 2-rank gloo run under Ray has torchrun's losses and record fields; a rank SIGKILLed at step 5
is relaunched by Ray's driver and resumes exactly from the trainer's checkpoint; neither a
finished nor a cancelled run leaves a Ray process (GCS, raylet, workers, ranks) behind.
Ray is heavy on this 2-core machine: three runs share one fixture, one more is cancelled."""
from __future__ import annotations

import os
import re
import threading
import time

import pytest

pytest.importorskip("ray")

from tests.suite.test_local_backend import processes_mentioning  # noqa: E402
from shardbench.suite.execute import events as ev  # noqa: E402
from shardbench.suite.backends import get_backend  # noqa: E402
from shardbench.suite.matrix.expand import expand, matrix_from_dict  # noqa: E402
from shardbench.suite.execute.runner import Runner  # noqa: E402
from shardbench.suite.execute.startup import StampClock  # noqa: E402

pytestmark = pytest.mark.slow
BASE = {"strategies": ["ddp"], "world_sizes": [2], "seq_lens": [32], "steps": 8, "warmup_steps": 1,
        "precision": "fp32", "device": "cpu", "shape": "cpu", "checkpoint_every": 3, "pg_timeout_s": 10,
        "timeout_s": 240, "max_restarts": 2}


def specs(**extra):
    made, errors = expand(matrix_from_dict({**BASE, **extra}))
    assert not errors, errors
    return made


def ray_temp_dir(run_dir) -> str:
    """The run's own Ray temp dir, from the launch command (the log's first line)."""
    first = (run_dir / "log.txt").read_text().splitlines()[0]
    return re.search(r"--temp-dir (\S+)", first).group(1)


def assert_nothing_left(temp_dir: str, run_dir) -> None:
    """Nothing of this run lives: its Ray session (the head, raylets, actors: their command lines
    name the session's temp dir) and its ranks (they name the run's output dir). Only this run's:
    another test file's Ray run may be alive on another xdist worker (it failed this test once)."""
    assert processes_mentioning(temp_dir) == []
    assert processes_mentioning(str(run_dir)) == []


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """torchrun, ray, and ray with rank 1 killed at step 5: one runner, three real runs."""
    results = tmp_path_factory.mktemp("ray")
    torch = specs(launcher="torchrun", faults=["none"])
    ray = specs(backend="ray", faults=["none", "kill-rank:1@5"])
    records = Runner(torch, get_backend("local"), results, order_seed=1).run()
    records += Runner(ray, get_backend("ray"), results, order_seed=1).run()
    by = {(r["launcher"], (r.get("fault") or {}).get("fault", "none")): r for r in records}
    return by, results


def test_ray_run_matches_torchrun(runs):
    by, results = runs
    torch, ray = by[("torchrun", "none")], by[("ray", "none")]
    assert torch["status"] == "ok" and ray["status"] == "ok", (torch["error"], ray["error"])
    assert ray["launcher"] == "ray" and ray["world_size"] == 2 and ray["comm_backend"] == "gloo"
    assert set(ray) == set(torch)  # the same record, field for field
    assert len(ray["loss_per_step"]) == BASE["steps"]
    for step, (x, y) in enumerate(zip(ray["loss_per_step"], torch["loss_per_step"])):
        assert abs(x - y) <= 1e-6 * abs(y), f"step {step}: ray {x} vs torchrun {y}"
    # The launcher's start-up is measured for both: Ray starts a cluster and actors first.
    assert ray["launcher_startup_s"] > 0 and torch["launcher_startup_s"] > 0
    # On a cluster it is read from the driver's and ranks' start stamps (suite/execute/startup.py): here
    # they are of the same processes, so both readings of the same two instants agree (up to the
    # clock reads: 10 ms ticks, a read of /proc/uptime; 0.2 s leaves room on a loaded host).
    clock = StampClock(2)
    for line in (results / ray["run_id"] / "log.txt").read_text().splitlines():
        clock.feed(line)
    assert clock.seconds() is not None and abs(clock.seconds() - ray["launcher_startup_s"]) <= 0.2
    assert_nothing_left(ray_temp_dir(results / ray["run_id"]), results / ray["run_id"])


def test_a_killed_rank_is_relaunched_by_ray_and_resumes_exactly(runs):
    by, results = runs
    clean, faulty = by[("ray", "none")], by[("ray", "kill-rank:1@5")]
    assert faulty["status"] == "ok", faulty["error"]
    assert faulty["loss_per_step"] == pytest.approx(clean["loss_per_step"], rel=1e-6)
    fault = faulty["fault"]
    assert fault["attempts"] == 2 and fault["injected_at_step"] >= 5
    assert faulty["checkpoint"]["resumed_from_step"] == 3 and faulty["checkpoint"]["restarts"] == 1
    assert fault["steps_redone"] == fault["injected_at_step"] - 3
    assert fault["detection_s"] >= 0 and fault["restart_s"] > 0
    log = (results / faulty["run_id"] / "log.txt").read_text()
    assert '"event": "failed"' in log and "rank 1 exited with -9" in log and "sent SIGKILL" in log
    assert not (results / faulty["run_id"] / "checkpoints").exists()
    assert_nothing_left(ray_temp_dir(results / faulty["run_id"]), results / faulty["run_id"])


def test_cancel_leaves_no_ray_process(tmp_path):
    spec = specs(backend="ray", steps=100000, checkpoint_every=0)[0]
    run_dir = tmp_path / spec.run_id
    run_dir.mkdir()
    cancel, seen = threading.Event(), []

    def emit(event):
        if isinstance(event, ev.RunProgress) and event.step >= 2:
            seen.append(event.step)
            cancel.set()

    started = time.monotonic()
    record = get_backend("ray").run(spec, run_dir, emit, cancel, timeout_s=200)
    assert seen, record["error"]
    assert record["status"] == "failed" and "cancelled" in record["error"]
    assert time.monotonic() - started < 120
    temp_dir = ray_temp_dir(run_dir)
    assert_nothing_left(temp_dir, run_dir)
    assert not os.path.exists(temp_dir)
