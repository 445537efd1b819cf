"""The app's model of the matrix being run: one RunRow per run, updated from suite events.

Pure Python (no Textual), so the screens only render it and the logic is testable on its own.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from shardbench.suite.execute import events as ev


@dataclass
class RunRow:
    run_id: str
    index: int = 0
    spec: dict[str, Any] = field(default_factory=dict)
    state: str = "queued"
    detail: str = ""
    step: int = 0
    steps: int = 0
    tokens_per_s: float | None = None
    loss: float | None = None
    """Live: the last progress line's loss (rank 0's); final: the record's (averaged over ranks)."""
    run_eta_s: float | None = None
    started: float | None = None
    """monotonic time the run left the queue; None while queued."""
    ended: float | None = None
    record: dict[str, Any] | None = None
    log: list[str] = field(default_factory=list)

    @property
    def final(self) -> bool:
        return self.state in ev.FINAL_STATES

    def elapsed_s(self, now: float | None = None) -> float | None:
        if self.started is None:
            return None
        return (self.ended or now or time.monotonic()) - self.started

    def state_text(self) -> str:
        if self.state == "running" and not self.steps:
            return "starting"  # ranks launching, process group forming: no step yet
        if self.state == "running":
            return f"running step {self.step}/{self.steps}"
        if self.state == "failed" and self.detail:
            # The runner's detail already starts with the record's status ("failed: ..."):
            # said once, not "failed: failed: ...".
            return f"failed: {self.detail.removeprefix('failed: ')}"
        return self.state

    def state_short(self) -> str:
        """The state column: one word or 'step 3/10' (the reason goes to the detail column)."""
        if self.state == "running" and self.steps:
            return f"step {self.step}/{self.steps}"
        return "starting" if self.state == "running" else self.state

    def reason(self) -> str:
        """Why a run failed or was cancelled ('' when there is nothing to say)."""
        if self.state not in ("failed", "cancelled") or not self.detail:
            return ""
        return self.detail.removeprefix("failed: ")


class RunBoard:
    """All runs of the current matrix, in matrix order."""

    def __init__(self) -> None:
        self.rows: dict[str, RunRow] = {}
        self.done = 0
        self.total = 0

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    def row(self, run_id: str) -> RunRow:
        if run_id not in self.rows:
            self.rows[run_id] = RunRow(run_id, index=len(self.rows))
        return self.rows[run_id]

    def apply(self, event: Any) -> RunRow | None:
        """Fold one suite event into the board; returns the row it touched (None: matrix-wide)."""
        if isinstance(event, ev.MatrixProgress):
            self.done, self.total = event.done, event.total
            return None
        row = self.row(event.run_id)
        if isinstance(event, ev.RunQueued):
            row.index, row.spec, self.total = event.index, dict(event.spec), event.total
        elif isinstance(event, ev.RunStateChanged):
            self._state(row, event.state, event.detail)
        elif isinstance(event, ev.RunProgress):
            row.step, row.steps, row.run_eta_s = event.step, event.steps, event.eta_s
            if event.tokens_per_s is not None:
                row.tokens_per_s = event.tokens_per_s
            if event.loss is not None:
                row.loss = event.loss
        elif isinstance(event, ev.RunLogLine):
            row.log.append(event.line)
        elif isinstance(event, ev.RunFinished):
            row.record = event.record
            if event.record.get("tokens_per_s") is not None:
                row.tokens_per_s = event.record["tokens_per_s"]
            if event.record.get("final_loss") is not None:
                row.loss = event.record["final_loss"]
        return row

    def _state(self, row: RunRow, state: str, detail: str) -> None:
        if row.started is None and state not in ("queued", "skipped", "cancelled"):
            row.started = time.monotonic()
        if state in ev.FINAL_STATES and row.ended is None:
            row.ended = time.monotonic()
        row.state, row.detail = state, detail

    def active(self) -> list[RunRow]:
        return [r for r in self.rows.values() if not r.final and r.state != "queued"]

    def eta_s(self, now: float | None = None) -> float | None:
        """Seconds until the matrix ends: the runs still queued at the mean duration of the runs
        that ran, plus what the current run has left. Recomputed from the rows, so it follows
        cancels (a cancelled run leaves the queue) and real progress; None before one run ended."""
        now = now or time.monotonic()
        ran = [r.elapsed_s(now) for r in self.rows.values()
               if r.final and r.started is not None and r.state != "cancelled"]
        if not ran:
            return None
        mean = sum(ran) / len(ran)  # type: ignore[arg-type]
        queued = sum(1 for r in self.rows.values() if r.state == "queued")
        current = sum(r.run_eta_s if r.run_eta_s is not None else max(0.0, mean - r.elapsed_s(now))  # type: ignore[misc,operator]
                      for r in self.active())
        return queued * mean + current
