"""Events the suite emits while a matrix runs; the CLI's rich progress and the TUI consume them.

Backends and the runner call `emit(event)` from the thread that runs the matrix; consumers must
not block in it (the TUI posts them to its own loop).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

RUN_STATES = ("queued", "installing", "running", "collecting", "ok", "failed", "skipped", "cancelled")
"""Life of one run: queued -> (installing, kubernetes only) -> running -> collecting -> a final
state. ok/failed/skipped/cancelled are final; `failed` covers every non-ok record status
(failed, oom, timeout), whose name is in RunStateChanged.detail."""
FINAL_STATES = ("ok", "failed", "skipped", "cancelled")


@dataclass(frozen=True)
class Event:
    """Base of every event below: a consumer handles this one type (the TUI wraps it in its one
    Textual message, tui/app/messages.py SuiteEvent) and dispatches on the subclass."""


@dataclass(frozen=True)
class RunQueued(Event):
    """A run entered the queue (emitted for every run before the first starts)."""

    run_id: str
    index: int
    """0-based position in the order the runs will start (repeats interleaved, shuffled)."""
    total: int
    """Runs in the matrix."""
    spec: dict[str, Any] = field(default_factory=dict)
    """RunSpec.to_dict() of the run."""


@dataclass(frozen=True)
class RunStateChanged(Event):
    run_id: str
    state: str
    """One of RUN_STATES."""
    detail: str = ""
    """Why (error line, skip reason, record status), or empty."""


@dataclass(frozen=True)
class RunProgress(Event):
    """One `SHARDBENCH_PROGRESS` line of the trainer's rank 0."""

    run_id: str
    step: int
    steps: int
    tokens_per_s: float | None = None
    loss: float | None = None
    """Rank 0's loss of the step (the record averages over ranks at the end)."""
    step_time_s: float | None = None
    """Time of the step (warm-up and checkpoint steps too: the phase says which)."""
    elapsed_s: float | None = None
    eta_s: float | None = None
    phase: str = ""
    """warmup or measure."""


@dataclass(frozen=True)
class RunLogLine(Event):
    """One line of the run's combined stdout/stderr (all ranks), without the newline."""

    run_id: str
    line: str


@dataclass(frozen=True)
class RunFinished(Event):
    run_id: str
    record: dict[str, Any]
    """The result record (trainer/record.py fields); status says how it ended."""


@dataclass(frozen=True)
class MatrixProgress(Event):
    done: int
    """Runs finished (any final state, skipped included)."""
    total: int
    elapsed_s: float
    eta_s: float | None = None
    """Estimated seconds left from the mean time of the runs that actually ran; None before one has."""


Emit = Callable[[Event], None]


def ignore(_event: Event) -> None:
    """An emit that drops everything (headless callers that only want the records)."""


def guarded(emit: Emit) -> Emit:
    """emit that swallows the consumer's exceptions: a display bug must not end a run or the
    matrix, and in a log pump it must not stop the draining (a full pipe would block every rank)."""
    def safe(event: Event) -> None:
        try:
            emit(event)
        except Exception:  # noqa: BLE001
            pass
    return safe
