"""Runner mechanics (order, failure isolation, resume, cancel, events) with an in-process backend.

The backend here is a small Python object following the Backend protocol: these tests are about
what the runner does with whatever a backend returns. The real launchers are exercised in
test_local_backend.py and test_e2e.py.
"""
from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

from trainer.record import write_atomic
from tui.suite import events as ev
from tui.suite.backends.base import Backend
from tui.suite.collect import failed_record
from tui.suite.matrix import MatrixSpec, expand
from tui.suite.runner import run_matrix
from tui.suite.synthetic import record


class ScriptedBackend:
    """Returns a synthetic record per run; `fail` ids return failed ones, `boom` ids raise."""

    name = "scripted"

    def __init__(self, fail=(), boom=(), cancel_after=None):
        self.calls: list[str] = []
        self.fail, self.boom, self.cancel_after = set(fail), set(boom), cancel_after

    def availability(self):
        return True, ""

    def run(self, spec, run_dir: Path, emit, cancel: threading.Event, timeout_s):
        self.calls.append(spec.run_id)
        if spec.run_id in self.boom:
            raise RuntimeError("backend bug")
        emit(ev.RunStateChanged(spec.run_id, "running"))
        (run_dir / "log.txt").write_text("log\n")
        if spec.run_id in self.fail:
            rec = failed_record(spec, "exploded")
        else:
            rec = record(spec.strategy, spec.world_size, 100.0 * spec.world_size)
        if self.cancel_after and len(self.calls) == self.cancel_after:
            cancel.set()
        write_atomic(rec, str(run_dir / "result.json"))
        return rec


def specs(**kw):
    out, errors = expand(MatrixSpec(strategies=["ddp", "zero2"], world_sizes=[1, 2], shape=None, **kw))
    assert not errors
    return out


def test_protocol_is_satisfied():
    assert isinstance(ScriptedBackend(), Backend)


def test_failed_and_raising_runs_are_rows_and_the_matrix_goes_on(tmp_path):
    s = specs()
    backend = ScriptedBackend(fail={s[1].run_id}, boom={s[2].run_id})
    seen = []
    records = run_matrix(s, backend, tmp_path, seen.append)
    assert backend.calls == [x.run_id for x in s]
    assert [r["status"] for r in records] == ["ok", "failed", "failed", "ok"]
    assert "RuntimeError: backend bug" in records[2]["error"]
    on_disk = json.loads((tmp_path / s[2].run_id / "result.json").read_text())
    assert on_disk["status"] == "failed" and on_disk["run_id"] == s[2].run_id
    finals = {e.run_id: e.state for e in seen if isinstance(e, ev.RunStateChanged) and e.state in ev.FINAL_STATES}
    assert finals == {s[0].run_id: "ok", s[1].run_id: "failed", s[2].run_id: "failed", s[3].run_id: "ok"}
    progress = [e for e in seen if isinstance(e, ev.MatrixProgress)]
    assert [p.done for p in progress] == [1, 2, 3, 4] and progress[-1].eta_s == 0
    assert progress[0].eta_s is not None and progress[0].total == 4


def test_resume_skips_finished_reruns_failed_and_changed(tmp_path):
    s = specs()
    first = ScriptedBackend(fail={s[3].run_id})
    run_matrix(s, first, tmp_path)
    second = ScriptedBackend()
    seen = []
    records = run_matrix(s, second, tmp_path, seen.append)
    assert second.calls == [s[3].run_id]  # only the failed one runs again
    assert [r["status"] for r in records] == ["ok"] * 4
    assert sum(isinstance(e, ev.RunStateChanged) and e.state == "skipped" for e in seen) == 3
    third = ScriptedBackend()
    run_matrix(s, third, tmp_path)
    assert third.calls == []  # nothing new
    changed = [replace(x, steps=x.steps + 1) for x in s[:1]] + s[1:]
    fourth = ScriptedBackend()
    run_matrix(changed, fourth, tmp_path)
    assert fourth.calls == [s[0].run_id]  # a changed spec is not the same run
    fifth = ScriptedBackend()
    run_matrix(s, fifth, tmp_path, force=True)
    assert fifth.calls == [x.run_id for x in s]
    sixth = ScriptedBackend()
    run_matrix([replace(x, timeout_s=5.0) for x in s], sixth, tmp_path)
    assert sixth.calls == []  # a new timeout does not change what was measured


def test_cancel_keeps_finished_results_and_starts_nothing_new(tmp_path):
    s = specs()
    backend = ScriptedBackend(cancel_after=2)
    seen = []
    cancel = threading.Event()
    records = run_matrix(s, backend, tmp_path, seen.append, cancel)
    assert backend.calls == [s[0].run_id, s[1].run_id]
    assert len(records) == 2
    assert [p.name for p in sorted(tmp_path.iterdir()) if (p / "result.json").exists()] == sorted(
        [s[0].run_id, s[1].run_id])
    cancelled = [e.run_id for e in seen if isinstance(e, ev.RunStateChanged) and e.state == "cancelled"]
    assert cancelled == [s[2].run_id, s[3].run_id]
    resumed = ScriptedBackend()
    run_matrix(s, resumed, tmp_path)
    assert resumed.calls == [s[2].run_id, s[3].run_id]


def test_stale_result_is_removed_before_a_rerun(tmp_path):
    s = specs()[:1]
    run_dir = tmp_path / s[0].run_id
    run_dir.mkdir()
    write_atomic(failed_record(s[0], "old failure"), str(run_dir / "result.json"))

    class Broken(ScriptedBackend):
        def run(self, spec, run_dir, emit, cancel, timeout_s):
            return {"not": "a record"}

    records = run_matrix(s, Broken(), tmp_path)
    assert "invalid record" in records[0]["error"]
    assert json.loads((run_dir / "result.json").read_text())["error"] == records[0]["error"]
