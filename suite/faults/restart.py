"""The suite's fault axis: inject a failure into a running run, relaunch it from its checkpoint,
and report the whole run (every attempt) as one record. The grammar (`kill-rank:R@S`,
`stop-rank:R@S`, `kill-launcher@S`) is suite/faults/grammar.py, finding and signalling an
attempt's processes suite/faults/targets.py; this module is the restart wrapper and the merge.

On the kubernetes backend only kill-rank is injected (KUBE_FAULT_KINDS): the cluster backend
deletes the worker pod that holds the rank and follows the retried launcher
(suite/backends/kube/pod_faults.py); the record gets the same `fault` fields through `merge`.

`Recovering` wraps the local backend. For a run with checkpointing or a fault it gives the trainer
`--checkpoint-dir <run dir>/checkpoints` (the trainer resumes from it with its default `--resume
auto`), runs every attempt (launch) in `<run dir>/launch-<k>/`, injects the fault from the progress
lines into the first launch that reaches its step (one that fails before passes it on; the ranks are
found by their command line and their launcher's rank variables), waits for the launcher to end, and
relaunches up to `max_restarts` times. The record of the last attempt holds the whole run's losses
and step times (they travel in the checkpoint); `fault` adds detection time (fault to the first
rank's failure report, or to the launcher's exit when no rank reports), the launcher's own wait
after that report (not part of the recovery: torchrun waited 30 s for a stopped rank where prterun
did not), restart time (exit to the first step after resume), steps redone and goodput.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from shardbench.trainer.record import FaultRecovery
from shardbench.suite.execute.events import Emit, RunLogLine, RunProgress, RunStateChanged, guarded
from shardbench.suite.faults.grammar import (FAULT_KINDS, KUBE_FAULT_KINDS, Fault, fault_errors,  # noqa: F401 (re-exported)
                                     kube_fault_errors, parse_fault)
from shardbench.suite.faults.targets import attempt_processes, inject, launcher_pid, rank_pid  # noqa: F401 (re-exported)

CHECKPOINTS = "checkpoints"
"""Sub-directory of a run's directory that holds its checkpoints."""


# --- the wrapper ------------------------------------------------------------------------------

_FAILED = re.compile(r"\brank \d+: (failed|oom|timeout): ")
"""The line a rank prints as it fails (trainer/cli.py)."""


def _needs_checkpoints(spec) -> bool:
    return spec.fault != "none" or bool(dict(spec.extra_knobs).get("checkpoint_every"))


class _Attempt:
    """Watches one attempt's progress: injects the fault at its step, notes when the first step
    after a resume arrives."""

    def __init__(self, spec, fault: Fault | None, marker: str, emit: Emit):
        self.spec, self.fault, self.marker, self.emit = spec, fault, marker, emit
        self.injected_at: float | None = None
        self.injected_step: int | None = None
        self.last_step = 0
        self.first_step_at: float | None = None
        self.failed_at: float | None = None
        self.failed_line: str | None = None
        """When and what the first rank reported failing after the fault (its own report)."""
        self.notes: list[str] = []
        """What the suite did to this launch (the fault), for the joined log."""

    def __call__(self, event) -> None:
        if isinstance(event, RunProgress):
            self.last_step = max(self.last_step, event.step)
            if self.first_step_at is None:
                self.first_step_at = time.time()
            if self.fault and self.injected_at is None and event.step >= self.fault.step:
                self.injected_at, self.injected_step = time.time(), event.step
                self.notes.append(f"[shardbench] {inject(self.fault, self.marker)}")
                self.emit(RunLogLine(self.spec.run_id, self.notes[-1]))
                self._stopped = (rank_pid(self.marker, self.fault.rank)  # type: ignore[arg-type]  # stop-rank has a rank
                                 if self.fault.kind == "stop-rank" else None)
        elif isinstance(event, RunLogLine) and self.injected_at is not None and self.failed_at is None \
                and (found := _FAILED.search(event.line)):
            self.failed_at, self.failed_line = time.time(), event.line[found.start():found.end() - 2]
        if (isinstance(event, RunLogLine) and getattr(self, "_stopped", None) and self.failed_at is not None):
            # Another rank found the hang (its collective timed out): let the stopped rank act on
            # the launcher's SIGTERM, as prterun does itself. torchrun SIGTERMs a stopped rank and
            # waits 30 s for it before SIGKILL, which the fault table charged to the strategy.
            try:
                os.kill(self._stopped, signal.SIGCONT)  # type: ignore[arg-type]  # truthy: checked above
            except OSError:
                pass
            self._stopped = None
        self.emit(event)


class Recovering:
    """A backend that checkpoints, injects the spec's fault and relaunches (see the module doc).
    Runs without checkpointing or a fault go straight to the wrapped backend."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name

    def availability(self) -> tuple[bool, str]:
        return self.inner.availability()

    def run(self, spec, run_dir: Path, emit: Emit, cancel: threading.Event, timeout_s: float | None) -> dict[str, Any]:
        if not _needs_checkpoints(spec):
            return self.inner.run(spec, run_dir, emit, cancel, timeout_s)
        run_dir, emit = Path(os.path.abspath(run_dir)), guarded(emit)  # the launcher runs elsewhere
        ckpt = run_dir / CHECKPOINTS
        shutil.rmtree(ckpt, ignore_errors=True)  # an earlier run's checkpoints are not this run's
        options = dict(spec.extra_knobs)
        options.update(checkpoint_dir=str(ckpt), resume="auto")
        if spec.fault != "none" and "pg_timeout_s" not in options:
            options["pg_timeout_s"] = 30.0  # a hang must end in a timeout well within the run's
        attempt_spec = replace(spec, extra_knobs=tuple(sorted(options.items())))
        fault = parse_fault(spec.fault)
        start, deadline = time.time(), None if timeout_s is None else time.monotonic() + timeout_s
        attempts: list[tuple[dict, _Attempt, float]] = []
        pending = fault  # until a launch reaches the fault's step: the fault is the experiment
        for k in range(spec.max_restarts + 1):
            adir = run_dir / f"launch-{k}"
            adir.mkdir(parents=True, exist_ok=True)
            # The launch's own directory, as its ranks' --output-dir holds it, names its processes.
            watch = _Attempt(spec, pending, f"{adir}{os.sep}", emit)
            left = None if deadline is None else max(1.0, deadline - time.monotonic())
            if k:
                emit(RunLogLine(spec.run_id, f"[shardbench] relaunch {k} of {spec.max_restarts} with --resume auto"))
                emit(RunStateChanged(spec.run_id, "running", f"restart {k}"))
            record = self.inner.run(attempt_spec, adir, watch, cancel, left)
            attempts.append((record, watch, time.time()))
            if watch.injected_at is not None:
                pending = None
            if record.get("status") == "ok" or cancel.is_set() or (deadline and time.monotonic() >= deadline):
                break
        _join_logs(run_dir, [watch.notes for _, watch, _ in attempts])
        record = merge(spec, attempts, start)
        _resumed_here(record, run_dir)
        if record.get("status") == "ok":
            shutil.rmtree(ckpt, ignore_errors=True)  # measured; the checkpoints were the means
        return record


def _resumed_here(record: dict[str, Any], run_dir: Path) -> None:
    """checkpoint.resumed_from_output_dir for the run, not the attempt: the trainer compares the
    checkpoint with its --output-dir (<run dir>/launch-<k>/...), but the run's checkpoints live in
    <run dir>/checkpoints, its own results dir, so every resume read as someone else's."""
    ck = record.get("checkpoint")
    if isinstance(ck, dict) and isinstance(ck.get("resumed_from"), str):
        here = Path(os.path.abspath(ck["resumed_from"])).is_relative_to(run_dir)
        record["checkpoint"] = {**ck, "resumed_from_output_dir": here}


def merge(spec, attempts: list[tuple[dict, "_Attempt", float]], start: float) -> dict[str, Any]:
    """One record for the whole run: the last attempt's (which holds every step's loss and time
    through its checkpoint), with the fault and its recovery."""
    record = dict(attempts[-1][0])
    hit = next((k for k, (_, watch, _) in enumerate(attempts) if watch.injected_at is not None), 0)
    _, watch0, ended0 = attempts[hit]
    info = FaultRecovery(fault=spec.fault, attempts=len(attempts), injected_at_step=watch0.injected_step,
                         failed_before_fault=[a[0].get("error") or str(a[0].get("status")) for a in attempts[:hit]])
    if watch0.injected_at is not None:
        # Detected when a rank says so; what the launcher then takes to exit is its own wait
        # (torchrun's SIGTERM grace), kept apart: the fault table charged it to the strategy.
        failed_at = getattr(watch0, "failed_at", None)
        detected = min(failed_at, ended0) if failed_at is not None else ended0
        info.detection_s = detected - watch0.injected_at
        info.detected_by = getattr(watch0, "failed_line", None) if failed_at is not None else "launcher exit"
        info.launcher_wait_s = ended0 - detected
        resumed_at = attempts[hit + 1][1].first_step_at if len(attempts) > hit + 1 else None
        if resumed_at is not None:
            info.restart_s = resumed_at - ended0
            info.recovery_s = info.detection_s + info.restart_s
    resumed = [(a[0].get("checkpoint") or {}).get("resumed_from_step") or 0 for a in attempts[1:]]
    info.steps_redone = sum(max(0, prev[1].last_step - r) for prev, r in zip(attempts, resumed))
    info.total_wall_s = attempts[-1][2] - start
    if record.get("status") == "ok" and info.total_wall_s > 0:
        info.goodput_tokens_per_s = record.get("steps", 0) * record.get("tokens_per_step", 0) / info.total_wall_s
    elif spec.fault != "none" and len(attempts) > spec.max_restarts:
        record["error"] = (f"{len(attempts)} attempts, none finished (max_restarts {spec.max_restarts}); "
                           f"last: {record.get('error') or record.get('status')}")
    if spec.fault != "none":
        record["fault"] = asdict(info)
    return record


def _join_logs(run_dir: Path, notes: list[list[str]]) -> None:
    """run_dir/log.txt: every launch's log, one after another, each under a header line and
    followed by what the suite did to it."""
    try:
        with open(run_dir / "log.txt", "wb") as out:
            for k, said in enumerate(notes):
                out.write(f"===== launch {k} =====\n".encode())
                path = run_dir / f"launch-{k}" / "log.txt"
                if path.is_file():
                    with open(path, "rb") as fh:
                        shutil.copyfileobj(fh, out)
                out.write("".join(f"{line}\n" for line in said).encode())
    except OSError:
        pass  # the attempts' own logs are still there
