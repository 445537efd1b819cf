"""Results screen: sortable table of finished runs, winners, tokens/s and memory plots, report."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static
from textual_plotext import PlotextPlot

from tui.app.messages import OpenResults
from tui.app.screens.dialogs import ask_path
from tui.app.results import KEY_COLUMNS, ResultsView, fmt_cell


class Cell:
    """A table cell that shows formatted text but sorts by its raw value (numbers as numbers)."""

    def __init__(self, raw: Any, spec: str) -> None:
        self.raw = raw
        self.text = fmt_cell(raw, spec)

    def __rich__(self) -> Text:
        numeric = isinstance(self.raw, (int, float)) and not isinstance(self.raw, bool)
        return Text(self.text, justify="right" if numeric else "left")

    def sort_key(self, reverse: bool = False) -> tuple:
        # Missing values sort last in either direction (the table reverses the whole order).
        if self.raw is None:
            return (-1 if reverse else 2, 0, "")
        if isinstance(self.raw, (int, float)):
            return (0, self.raw, "")
        return (1, 0, str(self.raw))


class ResultsScreen(Screen):
    BINDINGS = [
        Binding("s", "sort_next", "Sort"),
        Binding("v", "reverse", "Reverse"),
        Binding("w", "app.write_report", "Write report"),
        Binding("o", "open_dir", "Open dir"),
        Binding("R", "app.reload_results", "Reload"),
    ]

    def __init__(self) -> None:
        super().__init__(id="results-screen")
        self.view = ResultsView()
        self.source = "no results loaded yet"
        self.sort_column = "tokens_per_s"
        self.sort_reverse = True

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="results-source")
        table = DataTable(id="results-table", cursor_type="row", zebra_stripes=True)
        for column, header, _ in KEY_COLUMNS:
            table.add_column(header, key=column)
        yield table
        yield Static(id="winners")
        with Horizontal(id="plots"):
            yield PlotextPlot(id="plot-throughput")
            yield PlotextPlot(id="plot-memory")
        yield Footer()

    def on_mount(self) -> None:
        self._render_view()

    def show(self, view: ResultsView, source: str = "") -> None:
        self.view = view
        if source:
            self.source = source
        if self.is_mounted:
            self._render_view()

    def _render_view(self) -> None:
        view = self.view
        self.query_one("#results-source", Static).update(self.source)
        table = self.query_one(DataTable)
        table.clear()
        for run_id, raw in view.rows:
            table.add_row(*[Cell(v, spec) for v, (_, _, spec) in zip(raw, KEY_COLUMNS)], key=run_id)
        self._sort()
        self.query_one("#winners", Static).update(
            "[b]Winners[/b]\n" + "\n".join(view.winners) if view.winners
            else "[b]Winners[/b]: need at least two strategies with ok runs at the same size.")
        self._plot("#plot-throughput", view.throughput, "tokens/s vs devices", "tokens/s")
        self._plot("#plot-memory", view.memory, "peak memory per device vs devices", "GiB")

    def _plot(self, selector: str, series: dict[str, list[tuple[float, float]]], title: str, unit: str) -> None:
        widget = self.query_one(selector, PlotextPlot)
        plt = widget.plt
        plt.clear_figure()
        plt.title(title)
        plt.xlabel("devices")
        plt.ylabel(unit)
        for strategy, points in series.items():
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            plt.plot(xs, ys, label=strategy, marker="braille")
        if series:
            ticks = sorted({p[0] for pts in series.values() for p in pts})
            plt.xticks(ticks, [f"{t:g}" for t in ticks])
        widget.refresh()

    # -- sorting ------------------------------------------------------------------------------
    def _sort(self) -> None:
        table = self.query_one(DataTable)
        if table.row_count:
            reverse = self.sort_reverse
            table.sort(self.sort_column, key=lambda cell: cell.sort_key(reverse), reverse=reverse)

    def sort_by(self, column: str, reverse: bool | None = None) -> None:
        if reverse is None:
            reverse = not self.sort_reverse if column == self.sort_column else False
        self.sort_column, self.sort_reverse = column, reverse
        self._sort()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        self.sort_by(str(event.column_key.value))

    def action_sort_next(self) -> None:
        keys = [c for c, _, _ in KEY_COLUMNS]
        self.sort_by(keys[(keys.index(self.sort_column) + 1) % len(keys)], reverse=False)
        self.notify(f"sorted by {dict((c, h) for c, h, _ in KEY_COLUMNS)[self.sort_column]}", timeout=2)

    def action_reverse(self) -> None:
        self.sort_by(self.sort_column, reverse=not self.sort_reverse)

    def action_open_dir(self) -> None:
        ask_path(self, "Open results dir (read-only)", str(self.app.results_dir),
                 lambda path: self.post_message(OpenResults(path)))
