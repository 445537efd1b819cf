"""Per-run cancel for the app: the suite's runner has one cancel event for the whole matrix;
the Runs screen also cancels a single run (the current one, or a queued one before it starts),
so the app hands the runner a `PerRunCancel` wrapper that gives each run its own event.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class PerRunCancel:
    """Wraps a backend so single runs can be cancelled while the matrix goes on."""

    inner: Any
    events: dict[str, threading.Event] = field(default_factory=dict)
    skipped: set[str] = field(default_factory=set)
    matrix_cancel: threading.Event = field(default_factory=threading.Event)

    @property
    def name(self) -> str:
        return self.inner.name

    def availability(self) -> tuple[bool, str]:
        return self.inner.availability()

    def run(self, spec, run_dir: Path, emit, cancel: threading.Event, timeout_s):
        if spec.run_id in self.skipped or self.matrix_cancel.is_set():
            from tui.suite.collect import failed_record

            return failed_record(spec, "cancelled by the user before the run started")
        mine = self.events.setdefault(spec.run_id, threading.Event())
        # The backend polls `mine`; mirror the runner's matrix-wide event into it too.
        stop = threading.Event()
        relay = threading.Thread(target=_relay, args=(cancel, mine, stop), daemon=True)
        relay.start()
        try:
            return self.inner.run(spec, run_dir, emit, mine, timeout_s)
        finally:
            stop.set()

    def cancel_run(self, run_id: str) -> None:
        self.skipped.add(run_id)
        self.events.setdefault(run_id, threading.Event()).set()

    def cancel_all(self) -> None:
        self.matrix_cancel.set()
        for event in self.events.values():
            event.set()


def _relay(source: threading.Event, target: threading.Event, stop: threading.Event) -> None:
    while not stop.is_set():
        if source.wait(0.2):
            target.set()
            return
