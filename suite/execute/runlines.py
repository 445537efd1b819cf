"""One run's output, line by line, the same for every backend: each line becomes a RunLogLine
event, a progress line (`SHARDBENCH_PROGRESS {...}`) also a RunProgress event, and every line
feeds the record collector (suite/execute/collect.py). The local backend reads its launcher's pipe
through it, the kubernetes backend the launcher pod's log."""
from __future__ import annotations

from typing import Any

from shardbench.suite.execute.collect import Collector, Extracted, parse_progress
from shardbench.suite.execute.events import Emit, RunLogLine, RunProgress


def progress_event(run_id: str, p: dict[str, Any]) -> RunProgress:
    """The RunProgress event of a parsed progress line (numbers that are not numbers: None)."""
    def num(key):
        v = p.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    steps = p.get("steps") if isinstance(p.get("steps"), int) else 0
    return RunProgress(run_id=run_id, step=p["step"], steps=steps, tokens_per_s=num("tokens_per_s"),  # type: ignore[arg-type]
                       loss=num("loss"), step_time_s=num("step_time_s"), elapsed_s=num("elapsed_s"),
                       eta_s=num("eta_s"),
                       phase=str(p.get("phase") or ""))


class LineReader:
    """Feed it a run's lines; it emits their events and keeps the collector and the last progress."""

    def __init__(self, run_id: str, emit: Emit, collect: bool = True):
        """collect=False: events only (the kubernetes backend reads the record from log.txt once,
        over every launch, when the run ends)."""
        self.run_id, self.emit = run_id, emit
        self.collector = Collector(run_id) if collect else None
        self.last_progress: dict | None = None

    def feed(self, raw: bytes | str) -> None:
        if self.collector is not None:
            self.collector.feed(raw)
        line = (raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw).rstrip("\r\n")
        prog = parse_progress(line)
        if prog is not None:
            self.last_progress = prog
        self.emit(RunLogLine(self.run_id, line))
        if prog is not None:
            self.emit(progress_event(self.run_id, prog))

    def result(self) -> Extracted:
        return self.collector.result() if self.collector is not None else Extracted(error="not collected")

    def where(self) -> str:
        """'at step 40/100' from the last progress line, or ' before the first step'."""
        p = self.last_progress
        return f" at step {p['step']}/{p.get('steps', '?')}" if p else " before the first step"
