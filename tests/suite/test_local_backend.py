"""The local backend with the real trainer and launchers: cancel and timeout leave no rank behind,
hung (SIGSTOP) or not, under every launcher; a full disk loses no record."""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.fsfaults import fill, tmpfs
from shardbench.suite.execute import events as ev
from shardbench.suite.backends.local import LocalBackend
from shardbench.suite.faults.targets import _is_rank
from shardbench.suite.matrix.expand import MatrixSpec, expand

pytestmark = pytest.mark.slow


def one_spec(strategy, world, launcher, steps=100000):
    specs, errors = expand(MatrixSpec(strategies=[strategy], world_sizes=[world], seq_lens=[64],
                                      steps=steps, warmup_steps=2, launcher=launcher, shape=None,
                                      device="cpu", precision="fp32"))
    assert not errors
    return specs[0]


def processes_mentioning(text: str) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid,stat,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines()[1:] if text in line and " Z" not in line and "ps -ww" not in line]


def rank_pids(run_dir: Path) -> list[int]:
    """Trainer ranks of this run (they carry --output-dir <run_dir>/trainer-output)."""
    pids = []
    for line in processes_mentioning(str(run_dir)):
        pid, _, args = line.split(None, 2)
        if _is_rank(args.split()):  # the suite's own test of a rank (not a launcher, not DeepSpeed's runner)
            pids.append(int(pid))
    return pids


def has_progress(run_dir: Path) -> bool:
    log = run_dir / "log.txt"
    return log.exists() and "SHARDBENCH_PROGRESS" in log.read_text()


def run_dir_for(tmp_path, spec) -> Path:
    run_dir = tmp_path / spec.run_id
    run_dir.mkdir(parents=True)  # the runner makes it (shardbench.suite.execute.store.ResultsDir.begin)
    return run_dir


def test_cancel_mid_run_kills_every_rank(tmp_path):
    spec = one_spec("zero2", 2, "deepspeed")
    run_dir = run_dir_for(tmp_path, spec)
    cancel, seen = threading.Event(), []

    def emit(event):
        seen.append(event)
        if isinstance(event, ev.RunProgress) and event.step >= 2:
            cancel.set()  # what Ctrl-C in the CLI / the TUI's stop button does

    t0 = time.monotonic()
    record = LocalBackend(kill_grace_s=3).run(spec, run_dir, emit, cancel, timeout_s=240)
    assert cancel.is_set(), f"never saw progress: {(run_dir / 'log.txt').read_text()[-2000:]}"
    assert record["status"] == "failed" and record["error"].startswith("cancelled by the user at step")
    assert time.monotonic() - t0 < 120
    # Every rank and launcher carried --output-dir <run_dir>/...: none may survive. Checked at
    # once: a rank that only dies later (SIGPIPE, a gloo timeout) was an orphan all the same.
    assert processes_mentioning(str(run_dir)) == []
    assert not (run_dir / "result.json").exists()  # the runner writes it, not the backend
    log = (run_dir / "log.txt").read_text()
    assert "SHARDBENCH_PROGRESS" in log
    progress = [e for e in seen if isinstance(e, ev.RunProgress)]
    assert progress[0].run_id == spec.run_id and progress[0].steps == 100000
    assert any(isinstance(e, ev.RunLogLine) for e in seen)


def stop_a_rank_at_step_2(run_dir: Path, then=None):
    """An emit that SIGSTOPs one rank (a hung rank) at step 2, then calls `then`."""
    stopped = []

    def emit(event):
        if isinstance(event, ev.RunProgress) and event.step >= 2 and not stopped:
            pid = max(rank_pids(run_dir))
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
            if then is not None:
                then()
    return emit, stopped


@pytest.mark.parametrize("strategy,launcher", [("fsdp", "torchrun"), ("zero2", "deepspeed"), ("ddp", "mpirun")])
def test_cancel_with_a_hung_rank_leaves_no_rank_alive(tmp_path, strategy, launcher):
    """One rank is SIGSTOPped, then the run is cancelled: every process of the run must end.
    torchrun starts each rank in a session of its own and waits 30 s before killing them; a
    stopped process acts on SIGTERM only once continued."""
    spec = one_spec(strategy, 2, launcher)
    run_dir = run_dir_for(tmp_path, spec)
    cancel = threading.Event()
    emit, stopped = stop_a_rank_at_step_2(run_dir, cancel.set)
    record = LocalBackend(kill_grace_s=3).run(spec, run_dir, emit, cancel, timeout_s=240)
    assert stopped, f"never saw step 2: {(run_dir / 'log.txt').read_text()[-2000:]}"
    assert record["error"].startswith("cancelled by the user at step")
    assert processes_mentioning(str(run_dir)) == []


def test_timeout_with_a_hung_rank_under_torchrun(tmp_path):
    """The reported case: `--launcher torchrun`, one rank stopped, the per-run timeout fires."""
    spec = one_spec("fsdp", 2, "torchrun")
    run_dir = run_dir_for(tmp_path, spec)
    emit, stopped = stop_a_rank_at_step_2(run_dir)
    # The timeout counts from the launch: long enough for a slow start on a loaded machine (step 2
    # comes ~5 s after the launch here, 2.7x that under the worst load seen), and all of it is
    # waited out, so no longer.
    record = LocalBackend(kill_grace_s=3).run(spec, run_dir, emit, threading.Event(), timeout_s=25)
    assert stopped, f"never saw step 2: {(run_dir / 'log.txt').read_text()[-2000:]}"
    assert record["status"] == "timeout" and "25 s" in record["error"] and " at step " in record["error"]
    assert processes_mentioning(str(run_dir)) == []


def test_a_launcher_that_outlives_the_record_is_stopped_and_the_record_kept(tmp_path):
    """OpenMPI 5's mpirun now and then never exits after every rank has (openpmix/prrte#1839):
    stood in for by SIGSTOPping mpirun as rank 0's record comes in (its ranks then end and stay
    unreaped, the launcher never exits: the hang's picture; the hang itself cannot be had on
    demand). The run ends teardown_grace_s later with the record and a note; before, it waited
    for the per-run timeout, and without one for ever."""
    spec = one_spec("ddp", 2, "mpirun", steps=4)
    run_dir = run_dir_for(tmp_path, spec)
    frozen = []

    def emit(event):
        if isinstance(event, ev.RunLogLine) and "BENCHMARK_RESULT_JSON_END" in event.line and not frozen:
            for line in processes_mentioning(str(run_dir)):
                pid, _, args = line.split(None, 2)
                if os.path.basename(args.split()[0]) in ("mpirun", "prterun"):
                    os.kill(int(pid), signal.SIGSTOP)
                    frozen.append(int(pid))

    started = time.monotonic()
    record = LocalBackend(kill_grace_s=3, teardown_grace_s=5).run(spec, run_dir, emit, threading.Event(), timeout_s=120)
    assert frozen, (run_dir / "log.txt").read_text()[-2000:]
    assert record["status"] == "ok", record["error"]
    assert time.monotonic() - started < 60  # the grace, not the 120 s timeout
    assert "had not exited 5 s after the record was printed" in (run_dir / "collect-notes.txt").read_text()
    assert processes_mentioning(str(run_dir)) == []


def test_missing_launcher_is_one_clear_failed_record(tmp_path):
    spec = one_spec("ddp", 1, "mpirun", steps=4)
    backend = LocalBackend(search_path=str(tmp_path / "empty-bin"))
    assert backend.availability()[0] is False
    record = backend.run(spec, run_dir_for(tmp_path, spec), ev.ignore, threading.Event(), None)
    assert record["status"] == "failed"
    assert record["error"].startswith("mpirun not found") and "\n" not in record["error"]


def test_a_raising_event_consumer_cannot_stall_the_run(tmp_path):
    spec = one_spec("ddp", 1, "mpirun", steps=4)

    def broken(_event):
        raise RuntimeError("consumer bug")

    record = LocalBackend().run(spec, run_dir_for(tmp_path, spec), broken, threading.Event(), timeout_s=120)
    assert record["status"] == "ok", record.get("error")
    assert "BENCHMARK_RESULT_JSON_END" in (tmp_path / spec.run_id / "log.txt").read_text()


def test_disk_full_mid_run_keeps_draining_and_keeps_the_record(tmp_path):
    """The run's disk fills at the first progress line: the log stops growing, the ranks' output
    is still drained (no rank blocks on a full pipe) and the record comes from the stream."""
    spec = one_spec("ddp", 1, "mpirun", steps=8)
    with tmpfs(tmp_path / "small", size="512k") as small:
        run_dir = run_dir_for(small, spec)
        filled = []

        def emit(event):
            if isinstance(event, ev.RunProgress) and not filled:
                fill(small)
                filled.append(True)

        record = LocalBackend().run(spec, run_dir, emit, threading.Event(), timeout_s=120)
        assert filled
        assert record["status"] == "ok" and record["measured_steps"] == 6, record.get("error")
        assert "BENCHMARK_RESULT_JSON_END" not in (run_dir / "log.txt").read_text()


@pytest.mark.parametrize("strategy,launcher", [("zero2", "deepspeed"), ("fsdp", "torchrun")])
def test_a_suite_killed_outright_takes_its_ranks_with_it(tmp_path, strategy, launcher):
    """SIGKILL to the process running the backend (no handler can run): the launcher gets SIGTERM
    from the kernel (it was started through trainer.lifeline), and the ranks follow it."""
    spec = one_spec(strategy, 2, launcher)
    run_dir = run_dir_for(tmp_path, spec)
    code = ("import pickle, sys, threading; from shardbench.suite.backends.local import LocalBackend; "
            "from shardbench.suite.execute import events; spec = pickle.loads(bytes.fromhex(sys.argv[1])); "
            "LocalBackend().run(spec, sys.argv[2], events.ignore, threading.Event(), 600)")
    suite = subprocess.Popen([sys.executable, "-c", code, pickle.dumps(spec).hex(), str(run_dir)],
                             cwd=Path(__file__).resolve().parents[2])
    try:
        deadline = time.monotonic() + 180
        while not has_progress(run_dir):
            assert time.monotonic() < deadline and suite.poll() is None, "the run never started"
            time.sleep(0.5)
        assert rank_pids(run_dir)
        suite.kill()
        suite.wait()
        deadline = time.monotonic() + 60
        while processes_mentioning(str(run_dir)) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = processes_mentioning(str(run_dir))
    finally:
        for line in processes_mentioning(str(run_dir)):  # clean up what this test started
            os.kill(int(line.split()[0]), signal.SIGKILL)
    assert left == []
