"""Typed Textual messages: every state change reaches the UI as one of these.

The suite emits plain dataclass events (tui.suite.events) from the matrix thread; `to_message`
wraps each in its own Message class so handlers are typed (`on_run_progress`, ...) and Textual
queues them on the app's loop (post_message is thread-safe), never blocking the runner.
"""
from __future__ import annotations

from typing import Any

from textual.message import Message

from tui.suite import events as ev


class SuiteMessage(Message):
    """A suite event on its way into the app."""

    def __init__(self, event: Any) -> None:
        super().__init__()
        self.event = event


class RunQueued(SuiteMessage):
    event: ev.RunQueued


class RunState(SuiteMessage):
    event: ev.RunStateChanged


class RunProgress(SuiteMessage):
    event: ev.RunProgress


class RunLog(SuiteMessage):
    event: ev.RunLogLine


class RunFinished(SuiteMessage):
    event: ev.RunFinished


class MatrixProgress(SuiteMessage):
    event: ev.MatrixProgress


_BY_EVENT: dict[type, type[SuiteMessage]] = {
    ev.RunQueued: RunQueued, ev.RunStateChanged: RunState, ev.RunProgress: RunProgress,
    ev.RunLogLine: RunLog, ev.RunFinished: RunFinished, ev.MatrixProgress: MatrixProgress,
}


def to_message(event: Any) -> SuiteMessage:
    return _BY_EVENT[type(event)](event)


class MatrixDone(Message):
    """The matrix worker returned (all runs finished, or it was cancelled, or it crashed)."""

    def __init__(self, records: list[dict], error: str | None = None) -> None:
        super().__init__()
        self.records, self.error = records, error


class BackendChecked(Message):
    """Availability of one backend, checked off the UI thread (the cluster check does I/O)."""

    def __init__(self, name: str, ok: bool, why: str) -> None:
        super().__init__()
        self.name, self.ok, self.why = name, ok, why


class ReportWritten(Message):
    def __init__(self, paths: list[str], error: str | None = None) -> None:
        super().__init__()
        self.paths, self.error = paths, error


class ResultsReady(Message):
    """A ResultsView computed in a worker, with where its records came from."""

    def __init__(self, view, source: str) -> None:
        super().__init__()
        self.view, self.source = view, source
