"""Matrix screen: pick the axes and settings, see the run count and invalid combinations live."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, Label, Select, SelectionList, Static

from tui.app.messages import LoadMatrix, SaveMatrix
from tui.app.screens.dialogs import ask_path
from tui.app.matrix_form import EXTRA_FIELDS, from_matrix, shapes, to_matrix
from trainer.contract import BACKENDS, LAUNCHERS, PRECISIONS, STRATEGIES
from trainer.presets import PRESETS
from tui.suite.matrix import MatrixSpec, default_matrix, expand

INPUTS = (
    ("world_sizes", "World sizes"),
    ("seq_lens", "Seq lens"),
    ("micro_batch", "Micro-batch"),
    ("grad_accum", "Grad accum"),
    ("global_batch", "Global batch"),
    ("steps", "Steps"),
    ("warmup_steps", "Warm-up steps"),
    ("repeats", "Repeats"),
)


class CheckList(SelectionList[str]):
    """A SelectionList whose rows also say [x] / [ ] in text, so the selection is visible
    without colour (a monochrome terminal, a screen reader, a screenshot in a bug report)."""

    def on_mount(self) -> None:
        self.mark()

    @on(SelectionList.SelectedChanged)
    def mark(self) -> None:
        chosen = set(self.selected)
        for i in range(self.option_count):
            value = self.get_option_at_index(i).value
            self.replace_option_prompt_at_index(i, Text(f"[{'x' if value in chosen else ' '}] {value}"))


def placeholders() -> dict[str, str]:
    """What an empty input means: the default matrix's value (tui/suite/matrices/default.yaml)."""
    shown = from_matrix(default_matrix())
    shown["global_batch"] = shown["global_batch"] or "empty: micro x accum x world"
    return shown


class MatrixScreen(Screen):
    """The matrix being edited lives in the widgets; `matrix()` reads it back."""

    BINDINGS = [
        Binding("ctrl+r", "app.run_matrix", "Run"),
        Binding("ctrl+s", "save", "Save"),
        Binding("ctrl+o", "load", "Load"),
    ]

    def __init__(self, initial: MatrixSpec | None = None, path: str | None = None) -> None:
        super().__init__(id="matrix-screen")
        self.path = path
        """The matrix file last loaded or saved (the app sets it), the dialogs' default."""
        self.initial = initial or default_matrix()
        self.extras: dict[str, Any] = {}
        """Matrix keys without a widget (timeout, device, seed, ...), kept for save."""
        self.choices: dict[str, list[str]] = {}
        self.specs: list = []
        self.problems: list[str] = []
        self._validate_pending = False

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            with VerticalScroll(id="matrix-form"):
                yield Label("Strategies")
                yield CheckList(*[(s, s) for s in STRATEGIES], id="strategies")
                hints = placeholders()
                for key, title in INPUTS:
                    with Horizontal(classes="field"):
                        yield Label(title, classes="field-label")
                        yield Input(placeholder=hints[key], id=key, compact=True)
                yield from self._selects()
            with Vertical(id="matrix-side"):
                yield Static(id="run-count")
                yield Static(id="backend-note")
                yield Static(id="problems")
        yield Footer()

    def _selects(self) -> ComposeResult:
        choices = {
            "model": list(PRESETS), "precision": list(PRECISIONS), "launcher": ["auto", *LAUNCHERS],
            "shape": shapes(), "backend": list(BACKENDS),
        }
        titles = {"model": "Model preset", "precision": "Precision", "launcher": "Launcher",
                  "shape": "Shape (values/)", "backend": "Backend"}
        self.choices = choices
        for key, options in choices.items():
            with Horizontal(classes="field"):
                yield Label(titles[key], classes="field-label")
                yield Select([(o, o) for o in options], id=key, allow_blank=key == "shape", compact=True)

    def on_mount(self) -> None:
        self.show(self.initial)

    # -- widgets <-> matrix -------------------------------------------------------------------
    def show(self, spec: MatrixSpec) -> None:
        values = from_matrix(spec)
        sel = self.query_one("#strategies", SelectionList)
        sel.deselect_all()
        for s in values["strategies"]:
            if s in STRATEGIES:
                sel.select(s)
        for key, _ in INPUTS:
            self.query_one(f"#{key}", Input).value = values[key]
        for key in ("model", "precision", "launcher", "shape", "backend"):
            widget = self.query_one(f"#{key}", Select)
            value = values[key]
            options = self.choices[key]
            if value in options:
                widget.value = value
            elif key == "shape" or not options:
                widget.clear()
            else:
                widget.value = options[0]
        self.extras = {k: values[k] for k in EXTRA_FIELDS}
        self.validate()

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"strategies": list(self.query_one("#strategies", SelectionList).selected)}
        for key, _ in INPUTS:
            out[key] = self.query_one(f"#{key}", Input).value
        for key in ("model", "precision", "launcher", "shape", "backend"):
            value = self.query_one(f"#{key}", Select).value
            out[key] = None if value is Select.NULL else value
        return out | self.extras

    def matrix(self) -> MatrixSpec | None:
        spec, _ = to_matrix(self.fields())
        return spec

    # -- live validation ----------------------------------------------------------------------
    @on(Input.Changed)
    @on(Select.Changed)
    @on(SelectionList.SelectedChanged)
    def _changed(self) -> None:
        # Loading a matrix changes every field at once: validate once per refresh, not per field.
        if not self._validate_pending:
            self._validate_pending = True
            self.call_after_refresh(self._validate_now)

    def _validate_now(self) -> None:
        self._validate_pending = False
        self.validate()

    def validate(self) -> None:
        spec, errors = to_matrix(self.fields())
        self.specs, self.problems = ([], errors) if spec is None else expand(spec)
        count = self.query_one("#run-count", Static)
        if self.problems:
            count.update(f"[b]{len(self.problems)} problem(s)[/b]: nothing will run")
        else:
            count.update(f"[b]{len(self.specs)} run(s)[/b] ready: ctrl+r to start")
        self.query_one("#problems", Static).update("\n".join(f"• {p}" for p in self.problems))
        self.update_backend_note()

    def update_backend_note(self) -> None:
        """Every backend's availability; the chosen one first, an unavailable one with why."""
        chosen = self.query_one("#backend", Select).value
        statuses = getattr(self.app, "backend_status", {})
        lines = []
        for name in sorted(self.choices.get("backend", []), key=lambda n: n != chosen):
            mark = "▶ " if name == chosen else "  "
            status = statuses.get(name)
            if status is None:
                lines.append(f"{mark}{name}: checking…")
            elif status[0]:
                lines.append(f"{mark}{name}: available" + (f" ({status[1]})" if status[1] else ""))
            else:
                lines.append(f"{mark}[b]{name}: unavailable[/b] — {status[1]}")
        self.query_one("#backend-note", Static).update("\n".join(lines))

    # -- load / save --------------------------------------------------------------------------
    def action_save(self) -> None:
        ask_path(self, "Save matrix to", self.path or "matrix.yaml",
                 lambda path: self.post_message(SaveMatrix(path)))

    def action_load(self) -> None:
        ask_path(self, "Load matrix from", self.path or "matrix.yaml",
                 lambda path: self.post_message(LoadMatrix(path)))
