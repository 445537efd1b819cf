"""The live views of `shardbench run`: one line per run (--quiet) or two rich progress bars."""
from __future__ import annotations

import sys


class QuietView:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def note(self, text: str) -> None:
        print(text, file=sys.stderr)

    def emit(self, event) -> None:
        from shardbench.suite.execute.events import RunFinished

        if isinstance(event, RunFinished):
            r = event.record
            tps = r.get("tokens_per_s")
            print(f"{event.run_id}: {r.get('status')}"
                  + (f" {tps:,.0f} tok/s" if isinstance(tps, (int, float)) else "")
                  + (f" ({r.get('error')})" if r.get("error") else ""), flush=True)


class RichView:
    """Two progress bars: the matrix (run i/N, elapsed, ETA) and the current run (step, tok/s)."""

    def __init__(self, total: int):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
                                 console=self.console, transient=False)
        self.matrix = self.progress.add_task("matrix", total=total, info="")
        self.current = self.progress.add_task("run", total=1, info="", visible=False)
        self.index: dict[str, int] = {}
        self.total = total

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc):
        self.progress.stop()
        return False

    def note(self, text: str) -> None:
        self.progress.console.print(text)

    def emit(self, event) -> None:
        from shardbench.suite.execute import events as ev

        if isinstance(event, ev.RunQueued):
            self.index[event.run_id] = event.index + 1
        elif isinstance(event, ev.RunStateChanged) and event.state == "running":
            self.progress.update(self.current, description=f"run {self.index.get(event.run_id)}/{self.total} "
                                 f"{event.run_id}", completed=0, total=1, info="starting", visible=True)
        elif isinstance(event, ev.RunProgress):
            tps = f"{event.tokens_per_s:,.0f} tok/s" if event.tokens_per_s else ""
            loss = f"loss {event.loss:.3f}" if event.loss is not None else ""
            self.progress.update(self.current, completed=event.step, total=max(event.steps, 1),
                                 info=f"{event.phase} {tps} {loss}".strip())
        elif isinstance(event, ev.RunFinished):
            r = event.record
            tps = r.get("tokens_per_s")  # type: ignore[assignment]
            style = "green" if r.get("status") == "ok" else "red"
            detail = f"{tps:,.0f} tok/s" if isinstance(tps, (int, float)) else str(r.get("error") or "")[:160]
            self.progress.console.print(f"[{style}]{r.get('status'):>7}[/] {event.run_id}  {detail}",
                                        markup=True, highlight=False)
        elif isinstance(event, ev.RunStateChanged) and event.state == "skipped":
            self.progress.console.print(f"[dim]skipped {event.run_id} ({event.detail})[/]")
        elif isinstance(event, ev.MatrixProgress):
            eta = f"ETA {duration(event.eta_s)}" if event.eta_s is not None else ""
            self.progress.update(self.matrix, completed=event.done, info=eta)


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
