"""Run a matrix one run after another, with resume, per-run isolation and progress events.

Results land in <results_dir>/<run-id>/ (result.json, log.txt, spec.json). Resume rule: a run is
skipped when its result.json holds a valid record with status ok or oom (outcomes a rerun would
repeat) and its spec.json equals the current spec (a changed matrix, e.g. more steps, reruns it; only
the timeout may differ).
failed / timeout / cancelled results run again: they are not measurements. `force` reruns all.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from trainer.record import write_atomic
from tui.suite.backends.base import Backend
from tui.suite.collect import failed_record, validate
from tui.suite.events import Emit, MatrixProgress, RunFinished, RunQueued, RunStateChanged, ignore
from tui.suite.matrix import RunSpec

KEEP_STATUSES = ("ok", "oom")


def load_result(run_dir: Path) -> dict[str, Any] | None:
    """The valid record in run_dir/result.json, or None (missing, unreadable, invalid)."""
    try:
        record = json.loads((run_dir / "result.json").read_text())
    except (OSError, ValueError):
        return None
    return record if validate(record) is None else None


def reusable(spec: RunSpec, run_dir: Path) -> dict[str, Any] | None:
    """The finished record of this exact spec, if resume may keep it."""
    record = load_result(run_dir)
    if record is None or record.get("status") not in KEEP_STATUSES:
        return None
    try:
        saved = json.loads((run_dir / "spec.json").read_text())
    except (OSError, ValueError):
        return None
    return record if _measured(saved) == _measured(spec.to_dict()) else None


def _measured(spec: dict) -> dict:
    """The spec fields that change what is measured (a new timeout does not)."""
    return {k: v for k, v in spec.items() if k != "timeout_s"} if isinstance(spec, dict) else {}


def _state_for(record: dict) -> tuple[str, str]:
    status = record.get("status")
    if status == "ok":
        return "ok", ""
    if "cancelled" in str(record.get("error") or ""):
        return "cancelled", str(record.get("error"))
    return "failed", f"{status}: {record.get('error') or ''}".strip()


def _eta(durations: list[float], remaining: int) -> float | None:
    return sum(durations) / len(durations) * remaining if durations else None


def run_matrix(specs: list[RunSpec], backend: Backend, results_dir: str | Path, emit: Emit = ignore,
               cancel: threading.Event | None = None, force: bool = False) -> list[dict[str, Any]]:
    """Run every spec in order; returns one record per spec that finished or was kept.

    One failed run is a failed record and the matrix goes on. When `cancel` is set the current run
    is stopped by the backend and the runs not started are reported as cancelled (no record).
    """
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    cancel = cancel or threading.Event()
    total, start, durations, records = len(specs), time.monotonic(), [], []
    for i, spec in enumerate(specs):
        emit(RunQueued(spec.run_id, i, total, spec.to_dict()))
    for i, spec in enumerate(specs):
        run_dir = results_dir / spec.run_id
        if cancel.is_set():
            for rest in specs[i:]:
                emit(RunStateChanged(rest.run_id, "cancelled", "matrix cancelled before this run started"))
            break
        kept = None if force else reusable(spec, run_dir)
        if kept is not None:
            records.append(kept)
            emit(RunStateChanged(spec.run_id, "skipped", "result already there (resume)"))
            emit(RunFinished(spec.run_id, kept))
        else:
            t0 = time.monotonic()
            record = _run_one(spec, backend, run_dir, emit, cancel)
            durations.append(time.monotonic() - t0)
            records.append(record)
            emit(RunStateChanged(spec.run_id, *_state_for(record)))
            emit(RunFinished(spec.run_id, record))
        elapsed = time.monotonic() - start
        emit(MatrixProgress(i + 1, total, elapsed, _eta(durations, total - i - 1)))
    return records


def _run_one(spec: RunSpec, backend: Backend, run_dir: Path, emit: Emit, cancel: threading.Event) -> dict:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "result.json").unlink(missing_ok=True)  # a stale result must not outlive a rerun
    (run_dir / "spec.json").write_text(json.dumps(spec.to_dict(), indent=2) + "\n")
    try:
        record = backend.run(spec, run_dir, emit, cancel, spec.timeout_s)
    except Exception as exc:  # a backend bug must not end the matrix: it is this run's failure
        record = failed_record(spec, f"backend {backend.name} raised {type(exc).__name__}: {exc}")
    if validate(record) is not None:
        record = failed_record(spec, f"backend returned an invalid record: {validate(record)}")
    if load_result(run_dir) != record:
        write_atomic(record, str(run_dir / "result.json"))
    return record
