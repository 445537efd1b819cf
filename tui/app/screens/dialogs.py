"""Modal screens: the help screen, the one-line path prompt (load/save matrix, open dir) and the
yes/no confirmation (quit with runs in progress)."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Markdown

HELP = """\
# benchtui

Pick a matrix, run it here or on the cluster, watch the logs, compare the results. This box
scrolls: arrow keys, page up/down, the mouse wheel; `esc` closes it.

**Anywhere**
- `F2` `F3` `F4` `F5` (or `1` `2` `3` `4` outside text fields): Matrix, Runs, Logs, Results screens
- `ctrl+r` run the matrix (runs already done are kept and skipped) · `x` cancel all runs ·
  `q` quit (with runs in progress it asks: `enter` stops them and quits, `esc` stays)
- `ctrl+p` command palette (every action by name) · `?` or `F1` this help

**Matrix**: one field per axis (a comma list sweeps it); invalid combinations are listed with why,
before anything runs. The side panel counts what `ctrl+r` would run and where results go
(`results/benchtui`, or the loaded matrix's own directory: `make bench`'s results/default is never
written). `ctrl+s` save as YAML · `ctrl+o` load a YAML matrix · `ctrl+l` show or hide the plan:
predicted memory per rank and step time for every configuration, before it runs ·
`ctrl+f` re-measure every run (asks first; the old attempts are kept under attempts/)

**Runs**: one row per run: state, step, tok/s, loss, elapsed, ETA; a failed run says why ·
`c` cancel the selected run · `l` or `enter` its log

**Logs**: `f` follow on/off (scrolling up pauses it, `end` resumes) · `/` search the whole log ·
`n` / `N` next / previous match · `e` jump to the last error · `[` `]` previous / next run

**Results**: one row per configuration, mean [95% interval] over its ok repeats; yellow rows are
flagged (noise, overload, efficiency above 1.05) and never named winners, red ones broken (loss off
its group). Verdicts first: a winner only when every other candidate is separated at 5%.
`s` sort by the next column · `v` reverse (or click a header) · `w` write metrics.csv, plots,
BENCHMARK_REPORT.md and report.html · `o` open a past results dir (read-only) · `R` reload ·
`p` the next plot (model state, step time, scaling efficiency, MFU) · `l` the selected row's log ·
`f` re-measure its runs (asks first; the old attempt is kept)

**From the shell**: `benchtui --matrix FILE` starts from a matrix file; `benchtui --results DIR`
opens a result set on this screen; `shardbench report DIR` writes the report without the TUI.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        # Scrolls: at 80x24 the help is taller than the box (it was clipped, unreadable below).
        with VerticalScroll(id="help-box"):
            yield Markdown(HELP)

    def on_mount(self) -> None:
        self.query_one("#help-box").focus()  # the keys scroll it at once

    def action_dismiss(self) -> None:  # type: ignore[override]
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


class Confirm(ModalScreen[bool]):
    """A yes/no question: Enter confirms, Esc stays."""

    BINDINGS = [Binding("enter", "answer(True)", "Confirm"), Binding("escape", "answer(False)", "Stay")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt-box"):
            yield Label(self.question, id="confirm-question")
            yield Label("[b]Enter[/b] confirms · [b]Esc[/b] stays")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


def ask_path(screen, title: str, default: str, then) -> None:
    """Prompt for a path over `screen`; `then(path)` when one is given (escape gives none)."""
    screen.app.push_screen(PathPrompt(title, default), callback=lambda path: path and then(path))
