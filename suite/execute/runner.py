"""Run a matrix: the order, each run's lifecycle, resume, cancel, and progress events.

The runner owns every run from start to record: it locks the results directory (shardbench.suite.execute.store),
decides to skip (resume) or run, moves an earlier attempt aside, hands the run to the backend
(which only launches, streams and returns a record), sets the final status and writes
result.json. Backends never write result.json.

Order: repeat 0 of every configuration, then repeat 1 of every configuration, and so on; inside
each repeat the configurations are shuffled with a seeded RNG (the seed and the order are logged
in the results dir's order.jsonl; RunQueued.index is the position in it), so drift on the machine (load, heat)
spreads over all
strategies instead of landing on the ones that happen to run last.

Nothing measured is lost: any error in a run's files (mkdir, write, read, parse) or in the backend
becomes that run's failed row with the reason, and the matrix goes on. A run stopped on request
(`cancel(run_id)`, `cancel_all()`) ends with status `cancelled`, set here from the request, not
read from an error text; runs cancelled before they start return a cancelled record (no files).
"""
from __future__ import annotations

import random
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from shardbench.suite.backends.interface import Backend
from shardbench.suite.execute.collect import failed_record, validate
from shardbench.suite.execute.events import (Emit, MatrixProgress, RunFinished, RunQueued, RunStateChanged, guarded,
                              ignore)
from shardbench.suite.matrix.expand import RunSpec
from shardbench.suite.execute.store import ResultsDir, ResultsDirError, last_attempt


def interleaved(specs: list[RunSpec], seed: int) -> list[RunSpec]:
    """Repeat 0 of every configuration, then repeat 1, ...; each round shuffled with `seed`."""
    rng = random.Random(seed)
    order = []
    for rep in sorted({s.repeat for s in specs}):
        round_ = [s for s in specs if s.repeat == rep]
        rng.shuffle(round_)
        order += round_
    return order


class Runner:
    """Runs `specs` into `results_dir` one after another; `cancel`/`cancel_all` from any thread."""

    def __init__(self, specs: list[RunSpec], backend: Backend, results_dir: str | Path, emit: Emit = ignore,
                 force: bool | set[str] = False, order_seed: int | None = None,
                 predictions: dict[str, dict] | None = None):
        self.backend, self.force = backend, force
        """True: re-measure every run; a set of run ids: only those (suite/execute/rerun.py)."""
        self.predictions = predictions or {}  # run id -> the planner's prediction (suite/matrix/planning.py)
        self.store = ResultsDir(results_dir)
        self.emit = guarded(emit)
        self.order_seed = secrets.randbelow(2 ** 31) if order_seed is None else order_seed
        self.order = interleaved(specs, self.order_seed)
        self._cancel = {s.run_id: threading.Event() for s in specs}
        self._all = threading.Event()

    # -- control (thread-safe) ------------------------------------------------------------------
    def cancel(self, run_id: str) -> None:
        """Stop this run if it is running, or skip it if it has not started."""
        if run_id in self._cancel:
            self._cancel[run_id].set()

    def cancel_all(self) -> None:
        """Stop the current run and start no other."""
        self._all.set()
        for event in self._cancel.values():
            event.set()

    @property
    def cancelled(self) -> bool:
        return self._all.is_set()

    # -- the matrix -----------------------------------------------------------------------------
    def open(self) -> None:
        """Lock the results directory (ResultsDirError: unusable, in use, or keyed by an older
        config id version, whose runs resume would silently run again); `run` calls it too."""
        self.store.open()
        older = self.store.older_ids()
        if older:
            self.store.close()
            raise ResultsDirError(
                f"results directory {self.store.path} holds {len(older)} run(s) keyed by an older config id "
                f"version (e.g. {older[0]}): resume would not recognise them and would measure again; "
                "give a new --results directory (report and compare still read this one)")

    def run(self) -> list[dict[str, Any]]:
        """One record per spec, in run order: kept (resume), measured, failed or cancelled."""
        self.open()
        try:
            return self._run_all()
        finally:
            self.store.close()

    def _run_all(self) -> list[dict[str, Any]]:
        total, start, durations, records = len(self.order), time.monotonic(), [], []
        for i, spec in enumerate(self.order):
            self.emit(RunQueued(spec.run_id, i, total, spec.to_dict()))
        try:
            self.store.log_order(self.order_seed, [s.run_id for s in self.order])
        except OSError:
            pass  # a full disk shows up in the runs themselves, as their failed rows
        for i, spec in enumerate(self.order):
            t0 = time.monotonic()
            record, ran = self._one(spec)
            if ran:
                durations.append(time.monotonic() - t0)
            records.append(record)
            self.emit(RunFinished(spec.run_id, record))
            eta = sum(durations) / len(durations) * (total - i - 1) if durations else None
            self.emit(MatrixProgress(i + 1, total, time.monotonic() - start, eta))
        return records

    def _one(self, spec: RunSpec) -> tuple[dict[str, Any], bool]:
        """(the run's record, whether it ran)."""
        if self._cancel[spec.run_id].is_set():
            why = "matrix cancelled before this run started" if self._all.is_set() else "cancelled before it started"
            self.emit(RunStateChanged(spec.run_id, "cancelled", why))
            return failed_record(spec, why, status="cancelled"), False
        if not (self.force is True or (isinstance(self.force, set) and spec.run_id in self.force)):
            kept, why = self.store.trusted(spec)
            if kept is not None:
                self.emit(RunStateChanged(spec.run_id, "skipped", "result already there (resume)"))
                return kept, False
        kept = self.store.trusted(spec)[0]  # a good result a forced re-measure sets aside
        try:
            run_dir = self.store.begin(spec)
        except OSError as exc:
            record = failed_record(spec, f"cannot prepare {self.store.run_dir(spec)}: {exc.strerror or exc}")
            self.emit(RunStateChanged(spec.run_id, "failed", record["error"]))
            return record, False
        record = self._measure(spec, run_dir)
        if kept is not None and record.get("status") == "cancelled":
            return self._keep(spec, record, kept), True
        try:
            self.store.save(spec, record)
        except OSError as exc:
            # The record is still returned (the summary and report rows have it), marked failed:
            # a result that is not on disk is not a finished run.
            record["status"] = "failed"
            record["error"] = (f"result.json not written ({exc.strerror or exc})"
                               + (f"; {record['error']}" if record.get("error") else ""))
        self.emit(RunStateChanged(spec.run_id, *_state(record)))
        return record, True

    def _keep(self, spec: RunSpec, cancelled: dict[str, Any], kept: dict[str, Any]) -> dict[str, Any]:
        """A cancelled re-measure: the earlier good result is the run's again and the cancelled
        attempt goes to attempts/, so cancelling never costs a good result."""
        try:
            self.store.save(spec, cancelled)
            attempt = last_attempt(self.store.run_dir(spec))
            if attempt is not None:
                self.store.reinstate(spec, attempt)
        except OSError as exc:
            self.emit(RunStateChanged(spec.run_id, "cancelled", f"{cancelled.get('error')}; the earlier result "
                                      f"stays under attempts/ ({exc.strerror or exc})"))
            return cancelled
        self.emit(RunStateChanged(spec.run_id, "cancelled", f"{cancelled.get('error') or 'cancelled'}; "
                                  "the earlier result is kept"))
        return kept

    def _measure(self, spec: RunSpec, run_dir: Path) -> dict[str, Any]:
        cancel = self._cancel[spec.run_id]
        try:
            record = self.backend.run(spec, run_dir, self.emit, cancel, spec.timeout_s)
        except Exception as exc:  # a backend bug or a file error: this run's failure, not the matrix's
            record = failed_record(spec, f"backend {self.backend.name} raised {type(exc).__name__}: {exc}")
        why = validate(record)
        if why is not None:
            record = failed_record(spec, f"backend returned an invalid record: {why}")
        if cancel.is_set() and record.get("status") != "ok":
            record["status"] = "cancelled"
        _fill_from_spec(record, spec)
        if record.get("prediction") is None and spec.run_id in self.predictions:
            record["prediction"] = self.predictions[spec.run_id]
        return record


def run_matrix(specs: list[RunSpec], backend: Backend, results_dir: str | Path, emit: Emit = ignore,
               cancel: threading.Event | None = None, force: bool = False,
               order_seed: int | None = None) -> list[dict[str, Any]]:
    """Runner(...).run(), stopped like cancel_all() when `cancel` is set (a Ctrl-C handler)."""
    runner = Runner(specs, backend, results_dir, emit, force, order_seed)
    if cancel is None:
        return runner.run()
    done = threading.Event()

    def relay() -> None:
        while not done.is_set():
            if cancel.wait(0.1):
                runner.cancel_all()
                return

    threading.Thread(target=relay, name="cancel-relay", daemon=True).start()
    try:
        return runner.run()
    finally:
        done.set()


def _state(record: dict) -> tuple[str, str]:
    status = record.get("status")
    if status in ("ok", "cancelled"):
        return status, str(record.get("error") or "")
    return "failed", f"{status}: {record.get('error') or ''}".strip()


def _fill_from_spec(record: dict, spec: RunSpec) -> None:
    """Fields the trainer may not know but the matrix does (only where the record has none)."""
    for key, value in (("run_id", spec.run_id), ("gpu_shape", spec.shape), ("config_id", spec.config_id),
                       ("usd_per_gpu_hour", spec.usd_per_gpu_hour), ("launcher", spec.launcher)):
        if record.get(key) in (None, "", "none") and value not in (None, ""):
            record[key] = value
