"""Modal screens: the help screen and the one-line path prompt (load/save matrix, open dir)."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Markdown

HELP = """\
# benchtui

Pick a matrix, run it here or on the cluster, watch the logs, compare the results.

| key | where | what |
| --- | --- | --- |
| F2 / 1 | anywhere | Matrix screen |
| F3 / 2 | anywhere | Runs screen |
| F4 / 3 | anywhere | Logs screen |
| F5 / 4 | anywhere | Results screen |
| ctrl+r | anywhere | run the matrix |
| x | anywhere | cancel all runs |
| ctrl+p | anywhere | command palette |
| ? / F1 | anywhere | this help |
| q | anywhere | quit (cancels runs first) |
| ctrl+s / ctrl+o | Matrix | save / load the matrix (YAML) |
| c / l | Runs | cancel the selected run / its log |
| f / / / n / e | Logs | follow on-off / search / next match / jump to the error |
| [ / ] | Logs | previous / next run |
| s / v | Results | sort by the next column / reverse (or click a header) |
| w / o / R | Results | write metrics.csv, plots, BENCHMARK_REPORT.md / open a results dir / reload |

Digits switch screens only when no text field has the focus.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Markdown(HELP)

    def action_dismiss(self) -> None:
        self.dismiss(None)


class PathPrompt(ModalScreen[str | None]):
    """Asks for a path; dismisses with it (enter) or None (escape)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, default: str) -> None:
        super().__init__()
        self.title_text, self.default = title, default

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt-box"):
            yield Label(self.title_text)
            yield Input(value=self.default, id="prompt-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
