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
from textual.widgets.selection_list import Selection

from shardbench.tui.app.messages import LoadMatrix, SaveMatrix
from shardbench.tui.app.screens.dialogs import ask_path
from shardbench.tui.app.matrix_form import EXTRA_FIELDS, from_matrix, shapes, to_matrix
from shardbench.trainer.contract import BACKENDS, LAUNCHERS, PRECISIONS, STRATEGIES
from shardbench.trainer.presets import PRESETS
from shardbench.tui.app.matrix_plan import BENCHTUI_RESULTS, count_done, run_count_text
from shardbench.suite.matrix.expand import MatrixSpec, default_matrix, expand

INPUTS = (
    ("world_sizes", "World sizes"),
    ("seq_lens", "Seq lens"),
    ("micro_batch", "Micro-batch"),
    ("grad_accum", "Grad accum"),
    ("global_batch", "Global batch"),
    ("tp", "TP degree"),
    ("dp_replicate", "DP replicate"),
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
    """What an empty input means: the default matrix's value (suite/matrices/default.yaml)."""
    shown = from_matrix(default_matrix())
    shown["global_batch"] = shown["global_batch"] or "empty: micro x accum x world"
    return shown


class MatrixScreen(Screen):
    """The matrix being edited lives in the widgets; `matrix()` reads it back."""

    BINDINGS = [
        Binding("ctrl+r", "app.run_matrix", "Run"),
        Binding("ctrl+f", "app.run_matrix(True)", "Re-measure"),
        Binding("ctrl+s", "save", "Save"),
        Binding("ctrl+o", "load", "Load"),
        Binding("ctrl+l", "plan", "Plan"),
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
        self.unknown: list[str] = []
        """Strategies a loaded matrix named that the contract does not know (shown as problems)."""
        self.done: int = 0
        """Runs of `specs` whose result is already in the results dir (resume skips them)."""
        self._validate_pending = False
        self.predictions: dict[str, dict] = {}
        """The plan panel's predictions by run id (ctrl+l), put into the records of the runs."""

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
                with Horizontal(classes="field"):
                    yield Label("Results dir", classes="field-label")
                    yield Input(placeholder=BENCHTUI_RESULTS, id="results", compact=True)
            with Vertical(id="matrix-side"):
                yield Static(id="run-count")
                yield Static(id="backend-note")
                yield Static(id="problems")
                plan = Static(id="plan")  # ctrl+l: the planner's prediction per run (suite/matrix/planning.py)
                plan.display = False  # shown once asked for
                yield plan
        yield Footer(compact=True, show_command_palette=False)  # 80 columns: F1-F5 and q stay visible

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
        named = list(dict.fromkeys(map(str, values["strategies"] or [])))
        for s in [u for u in self.unknown if u not in named]:  # a typo of the previous matrix
            self.unknown.remove(s)
            sel.remove_option(f"unknown-{s}")
        for s in named:
            if s not in STRATEGIES and s not in self.unknown:
                # Kept, selected and shown as a problem (as the CLI rejects it): dropping a typo
                # silently ran a smaller matrix than the file asked for.
                self.unknown.append(s)
                sel.add_option(Selection(s, s, id=f"unknown-{s}"))
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
        self.query_one("#results", Input).value = str(values.get("results") or "")
        self.validate()

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"strategies": list(self.query_one("#strategies", SelectionList).selected)}
        for key, _ in INPUTS:
            out[key] = self.query_one(f"#{key}", Input).value
        for key in ("model", "precision", "launcher", "shape", "backend"):
            value = self.query_one(f"#{key}", Select).value
            out[key] = None if value is Select.NULL else value
        return out | self.extras | {"results": self.query_one("#results", Input).value.strip() or BENCHTUI_RESULTS}

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
        self.done = count_done(self.specs, spec.results if spec is not None else "")
        if self.problems:
            count.update(f"[b]{len(self.problems)} problem(s)[/b]: nothing will run")
        else:
            count.update(run_count_text(len(self.specs), self.done, spec.results))  # type: ignore[union-attr]
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

    # -- plan ---------------------------------------------------------------------------------
    def action_plan(self) -> None:
        """Predict every configuration's memory, fit and step time in a worker thread (the
        planner runs in a subprocess: no torch in benchtui)."""
        specs = [s for s in self.specs if s.repeat == 0]
        panel = self.query_one("#plan", Static)
        panel.display = True
        if not specs:
            panel.update("plan: no valid run to plan")
            return
        panel.update(f"plan: predicting {len(specs)} configuration(s)…")
        self.run_worker(lambda: self._plan(specs), thread=True, exclusive=True, group="plan")

    def _plan(self, specs: list) -> None:
        from shardbench.suite.matrix.planning import plan_lines, predict_specs

        predictions, why = predict_specs(specs)
        self.predictions = predictions  # the runs started next carry them (app.run_specs)
        text = "\n".join(["[b]plan[/b] (shardbench plan; docs/planner.md)", *plan_lines(specs, predictions)])
        self.app.call_from_thread(self.query_one("#plan", Static).update, why or text)

    # -- load / save --------------------------------------------------------------------------
    def action_save(self) -> None:
        ask_path(self, "Save matrix to", self.path or "matrix.yaml",
                 lambda path: self.post_message(SaveMatrix(path)))

    def action_load(self) -> None:
        ask_path(self, "Load matrix from", self.path or "matrix.yaml",
                 lambda path: self.post_message(LoadMatrix(path)))
