"""What a backend is: something that runs one RunSpec and returns its result record."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from shardbench.suite.execute.events import Emit
from shardbench.suite.matrix.expand import RunSpec


@runtime_checkable
class Backend(Protocol):
    """Runs one run of the matrix. The runner calls `run` once per spec, one at a time."""

    name: str
    """local or kubernetes."""

    def availability(self) -> tuple[bool, str]:
        """(True, "") when runs can start here; (False, one-line reason) otherwise."""
        ...

    def run(self, spec: RunSpec, run_dir: Path, emit: Emit, cancel: threading.Event,
            timeout_s: float | None) -> dict[str, Any]:
        """Run `spec` and return its result record; never raises for a failed run.

        Contract: launches, streams and returns; the runner (shardbench.suite.execute.runner) owns the rest of
        the run's life and alone writes run_dir/result.json. The backend streams the run's log to
        run_dir/log.txt line by line (emitting RunLogLine and, for progress lines, RunProgress)
        and emits RunStateChanged as the run moves on (installing/running/collecting). Any
        failure (launch error, crash, bad or missing record) returns a record with status
        failed/oom/timeout and `error` set, keeping whatever the trainer measured. When `cancel`
        is set it stops the run promptly and leaves no process or release behind (the runner
        then marks the record cancelled). `timeout_s` (None: no limit) bounds the run's wall
        time: past it the run is stopped and the record's status is timeout.
        """
        ...
