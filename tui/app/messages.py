"""Typed Textual messages: every state change reaches the app as one of these.

The suite's events (shardbench.suite.execute.events) arrive as one SuiteEvent from the matrix thread; Textual
queues them on the app's loop, never blocking the runner. Screens never call into the app: they
post requests (CancelRun, ShowLogs, OpenResults, SaveMatrix, LoadMatrix) that bubble up to it.
"""
from __future__ import annotations

from typing import Any

from textual.message import Message



class SuiteEvent(Message):
    """The one message the suite sends: any shardbench.suite.execute.events event, posted from the matrix
    thread (post_message is thread-safe) and handled by the app's `on_suite_event`."""

    def __init__(self, event: Any) -> None:
        super().__init__()
        self.event = event


# -- requests the screens post upward; the app acts on them ---------------------------------

class CancelRun(Message):
    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id


class ShowLogs(Message):
    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id


class OpenResults(Message):
    """Show the result set in `path` (read-only: new runs go to the matrix's own directory)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path


class SaveMatrix(Message):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path


class LoadMatrix(Message):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path


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


class Remeasure(Message):
    """Run these runs of the shown result set again (force), from their saved spec.json."""

    def __init__(self, run_ids: list[str]) -> None:
        super().__init__()
        self.run_ids = run_ids
