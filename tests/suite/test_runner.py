"""The runner with the real local backend, real files and real filesystem faults.

Fast tests give the backend an empty launcher search path: every run then really goes through
the runner and the backend and fails in a second with "mpirun not found" (no trainer starts),
which is all the runner's lifecycle needs. The test at the end runs the real trainer.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.fsfaults import fill, tmpfs
from shardbench.trainer import contract
from shardbench.trainer.record import write_atomic
from shardbench.suite.execute import events as ev
from tests import synthetic
from shardbench.suite.backends.local import LocalBackend
from shardbench.suite.matrix.expand import MatrixSpec, expand
from shardbench.suite.execute.runner import Runner, interleaved, run_matrix
from shardbench.suite.execute.store import LOCK_NAME, ResultsDir, ResultsDirError

REPO = Path(__file__).resolve().parents[2]


def specs(repeats=1, **kw):
    out, errors = expand(MatrixSpec(strategies=kw.pop("strategies", ["ddp", "zero2"]),
                                    world_sizes=kw.pop("world_sizes", [1, 2]), shape=None, repeats=repeats, **kw))
    assert not errors, errors
    return out


def no_launchers(tmp_path) -> LocalBackend:
    return LocalBackend(search_path=str(tmp_path / "no-bin"))


def ok_record_for(spec) -> dict:
    """A valid ok record that belongs to `spec` (what a finished run leaves)."""
    rec = synthetic.record(spec.strategy, spec.world_size, 1000.0, seq_len=spec.seq_len,
                           micro_batch=spec.micro_batch, grad_accum=spec.grad_accum, repeat=spec.repeat)
    rec.update(run_id=spec.run_id, config_id=spec.config_id, steps=spec.steps,
               warmup_steps=spec.warmup_steps, seed=spec.seed)
    return rec


def finish(results: Path, spec, record: dict | None = None) -> dict:
    """Leave `spec` finished in `results` as an earlier suite would have."""
    record = record or ok_record_for(spec)
    run_dir = results / spec.run_id
    write_atomic(spec.to_dict(), str(run_dir / "spec.json"))
    write_atomic(record, str(run_dir / "result.json"))
    return record


# -- order ------------------------------------------------------------------------------------

def test_repeats_are_interleaved_in_a_seeded_shuffle(tmp_path):
    s = specs(repeats=3, strategies=list(contract.STRATEGIES))
    order = interleaved(s, seed=7)
    n = len(s) // 3  # configurations: every strategy at 2 world sizes
    assert [x.repeat for x in order] == [0] * n + [1] * n + [2] * n
    rounds = [[x.config_id for x in order[i:i + n]] for i in (0, n, 2 * n)]
    assert all(sorted(r) == sorted(rounds[0]) for r in rounds)  # every configuration once per round
    assert len({tuple(r) for r in rounds}) > 1  # shuffled, not the same order each round
    assert [x.run_id for x in interleaved(s, seed=7)] == [x.run_id for x in order]
    assert [x.run_id for x in interleaved(s, seed=8)] != [x.run_id for x in order]
    seen = []
    records = Runner(s[:4], no_launchers(tmp_path), tmp_path, seen.append, order_seed=7).run()
    logged = json.loads((tmp_path / "order.jsonl").read_text().splitlines()[-1])
    assert logged["order_seed"] == 7 and logged["order"] == [r["run_id"] for r in records]
    assert [e.run_id for e in seen if isinstance(e, ev.RunQueued)] == logged["order"]
    assert all(isinstance(e, ev.Event) for e in seen)


# -- the results directory --------------------------------------------------------------------

def test_unusable_results_dir_is_one_line_at_once(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ResultsDirError, match=r"^results directory .*file is unusable \(File exists\)"):
        Runner(specs(), no_launchers(tmp_path), a_file).run()
    with tmpfs(tmp_path / "ro", readonly=True) as ro:
        with pytest.raises(ResultsDirError, match="Read-only file system"):
            Runner(specs(), no_launchers(tmp_path), ro / "results").run()
    with tmpfs(tmp_path / "full", size="64k") as full:
        fill(full)
        with pytest.raises(ResultsDirError, match="No space left on device"):
            Runner(specs(), no_launchers(tmp_path), full).run()


def test_cli_exit_2_with_one_line_for_an_unusable_results_dir(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    proc = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "run", "--results", str(a_file),
                           "--strategies", "ddp", "--world-sizes", "1", "--quiet"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "is unusable" in proc.stderr
    assert "run(s)" not in proc.stdout


def test_a_locked_results_dir_is_refused_naming_its_owner(tmp_path):
    with ResultsDir(tmp_path):  # this test process is the owner
        with pytest.raises(ResultsDirError, match=rf"in use by another shardbench \(pid {os.getpid()} on "):
            Runner(specs(), no_launchers(tmp_path), tmp_path).run()
        proc = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "run", "--results", str(tmp_path),
                               "--strategies", "ddp", "--world-sizes", "1", "--quiet"],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert f"pid {os.getpid()} on" in proc.stderr
        assert not any(p.is_dir() for p in tmp_path.iterdir())  # it ran nothing
    # released when the owner is done: the next suite gets it
    assert len(Runner(specs(), no_launchers(tmp_path), tmp_path).run()) == 4
    assert (tmp_path / LOCK_NAME).exists()


# -- run files: every error is that run's failed row -------------------------------------------

def test_bad_result_files_are_failed_rows_and_the_matrix_goes_on(tmp_path):
    s = specs()
    nested = tmp_path / s[0].run_id
    nested.mkdir()
    (nested / "result.json").write_text("[" * 100_000 + "]" * 100_000)
    (nested / "spec.json").write_text(json.dumps(s[0].to_dict()))
    not_a_dir = tmp_path / s[1].run_id
    not_a_dir.write_text("a file where the run's directory goes")
    records = Runner(s, no_launchers(tmp_path), tmp_path, order_seed=1).run()
    by_id = {r["run_id"]: r for r in records}
    assert sorted(by_id) == sorted(x.run_id for x in s)
    assert all(r["status"] == "failed" for r in records)
    assert "mpirun not found" in by_id[s[0].run_id]["error"] or "deepspeed not found" in by_id[s[0].run_id]["error"]
    assert by_id[s[1].run_id]["error"].startswith(f"cannot prepare {tmp_path / s[1].run_id}")
    # the unreadable file of the earlier attempt is kept aside, not overwritten
    assert (nested / "attempts" / "1" / "result.json").stat().st_size == 200_000


def test_a_disk_that_fills_mid_matrix_fails_the_runs_not_the_matrix(tmp_path):
    s = specs()
    seen = []

    def fill_after_first(event):
        seen.append(event)
        if isinstance(event, ev.RunFinished) and sum(isinstance(e, ev.RunFinished) for e in seen) == 1:
            fill(results)

    with tmpfs(tmp_path / "small", size="256k") as results:
        records = Runner(s, no_launchers(tmp_path), results, fill_after_first).run()
        assert len(records) == 4 and all(r["status"] == "failed" for r in records)
        assert all("No space left on device" in r["error"] for r in records[1:]), [r["error"] for r in records]
        on_disk = json.loads((results / records[0]["run_id"] / "result.json").read_text())
        assert on_disk["status"] == "failed" and on_disk["run_id"] == records[0]["run_id"]


# -- resume and --force -----------------------------------------------------------------------

def test_resume_trusts_only_this_runs_result(tmp_path):
    s = specs()
    kept = finish(tmp_path, s[0])
    finish(tmp_path, s[1], ok_record_for(s[2]))  # a result copied from another run
    (tmp_path / s[1].run_id / "spec.json").write_text(json.dumps(s[1].to_dict()))
    finish(tmp_path, s[2], {**ok_record_for(s[2]), "schema_version": 99})  # a schema it does not know
    seen = []
    records = {r["run_id"]: r for r in Runner(s, no_launchers(tmp_path), tmp_path, seen.append).run()}
    assert records[s[0].run_id] == kept
    skipped = [e.run_id for e in seen if isinstance(e, ev.RunStateChanged) and e.state == "skipped"]
    assert skipped == [s[0].run_id]
    for other in s[1:]:
        assert records[other.run_id]["status"] == "failed", other.run_id  # ran again (no launcher here)
    assert (tmp_path / s[1].run_id / "attempts" / "1" / "result.json").exists()


def test_force_keeps_the_previous_ok_attempt(tmp_path):
    s = specs()[:1]
    old = finish(tmp_path, s[0])
    (tmp_path / s[0].run_id / "log.txt").write_text("the old log\n")
    records = Runner(s, no_launchers(tmp_path), tmp_path, force=True).run()
    assert records[0]["status"] == "failed"
    attempt = tmp_path / s[0].run_id / "attempts" / "1"
    assert json.loads((attempt / "result.json").read_text()) == old
    assert (attempt / "log.txt").read_text() == "the old log\n"
    Runner(s, no_launchers(tmp_path), tmp_path, force=True).run()
    assert json.loads((tmp_path / s[0].run_id / "attempts" / "2" / "result.json").read_text())["status"] == "failed"
    assert json.loads((attempt / "result.json").read_text()) == old


# -- cancel -----------------------------------------------------------------------------------

def test_cancel_one_queued_run_and_then_all(tmp_path):
    s = specs()
    seen = []
    runner = Runner(s, no_launchers(tmp_path), tmp_path, seen.append, order_seed=3)
    first, second = runner.order[0].run_id, runner.order[1].run_id
    runner.cancel(second)

    def stop_all_after_third(event):
        seen.append(event)
        if isinstance(event, ev.RunFinished) and event.run_id == runner.order[2].run_id:
            runner.cancel_all()

    runner.emit = ev.guarded(stop_all_after_third)
    records = {r["run_id"]: r for r in runner.run()}
    assert records[first]["status"] == "failed" and records[runner.order[2].run_id]["status"] == "failed"
    assert records[second]["status"] == "cancelled" and records[runner.order[3].run_id]["status"] == "cancelled"
    assert not (tmp_path / second).exists()  # never started: no files
    states = {e.run_id: e.state for e in seen if isinstance(e, ev.RunStateChanged)}
    assert states[second] == "cancelled" and states[runner.order[3].run_id] == "cancelled"


def test_run_matrix_stops_on_the_cancel_event(tmp_path):
    cancel = threading.Event()
    cancel.set()
    records = run_matrix(specs(), no_launchers(tmp_path), tmp_path, cancel=cancel)
    assert len(records) == 4 and {r["status"] for r in records} == {"cancelled"}


@pytest.mark.slow
def test_real_run_is_written_by_the_runner_and_cancel_marks_it_cancelled(tmp_path):
    ok_spec, long_spec = (specs(strategies=["ddp"], world_sizes=[1], steps=steps, warmup_steps=2,
                                device="cpu", precision="fp32", launcher="mpirun")[0] for steps in (5, 100_000))
    runner: Runner | None = None

    def emit(event):
        if isinstance(event, ev.RunProgress) and event.run_id == long_spec.run_id and event.step >= 3:
            runner.cancel(long_spec.run_id)

    runner = Runner([ok_spec, long_spec], LocalBackend(kill_grace_s=3), tmp_path, emit)
    records = {r["run_id"]: r for r in runner.run()}
    assert records[ok_spec.run_id]["status"] == "ok", records[ok_spec.run_id]["error"]
    cancelled = records[long_spec.run_id]
    assert cancelled["status"] == "cancelled" and cancelled["error"].startswith("cancelled by the user at step")
    assert cancelled["measured_steps"] >= 1  # what the trainer measured before SIGTERM is kept
    for rid, rec in records.items():
        assert json.loads((tmp_path / rid / "result.json").read_text()) == rec


@pytest.mark.slow  # a real matrix run: ~10 s idle
def test_cli_exit_1_when_some_run_failed_and_the_summary_lists_every_run(tmp_path):
    """One run already finished ok (kept by resume), the other's directory is a file: exit 1,
    and both are in the summary (kept runs used to be left out when the matrix died)."""
    args = ["--strategies", "ddp", "--world-sizes", "1,2", "--repeats", "1", "--device", "cpu",
            "--precision", "fp32", "--launcher", "mpirun"]
    from shardbench.suite.cli.commands import build_parser
    from shardbench.suite.cli.matrix_flags import effective_matrix

    s, errors = expand(effective_matrix(build_parser().parse_args(["run", "--results", str(tmp_path), *args])))
    assert not errors and len(s) == 2
    finish(tmp_path, s[0])
    (tmp_path / s[1].run_id).write_text("not a directory")
    proc = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "run", "--results", str(tmp_path), *args,
                           "--quiet"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "2 run(s): 1 ok, 1 failed" in proc.stdout
    assert s[0].run_id in proc.stdout and s[1].run_id in proc.stdout


def test_a_cancelled_re_measure_keeps_the_good_result(tmp_path):
    """Issue 32: ctrl+f then cancel at once left the run "cancelled" with its ok result moved to
    attempts/. Now the ok result is the run's again and the cancelled attempt is kept aside."""
    from shardbench.suite.execute.collect import failed_record

    class WaitsForCancel:
        name = "waits"

        def run(self, spec, run_dir, emit, cancel, timeout_s):
            assert cancel.wait(30)
            return failed_record(spec, "cancelled by the user before the first step", status="cancelled")

    s = specs()[:1]
    old = finish(tmp_path, s[0])
    runner = Runner(s, WaitsForCancel(), tmp_path, force=True)
    threading.Timer(0.2, runner.cancel_all).start()
    (record,) = runner.run()
    assert record == old
    run_dir = tmp_path / s[0].run_id
    assert json.loads((run_dir / "result.json").read_text()) == old
    assert json.loads((run_dir / "attempts" / "1" / "result.json").read_text())["status"] == "cancelled"
    from shardbench.suite.execute.store import ResultsDir
    assert ResultsDir(tmp_path).trusted(s[0])[0] == old  # resume keeps it
