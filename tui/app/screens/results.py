"""Results screen: one row per configuration (mean ±95% interval over repeats) and per failed or
unreadable run, the verdicts, tokens/s and model-state plots with error bars, the report.

Broken runs (loss off the reference) are red, otherwise flagged configurations yellow, failed and
unreadable runs dim red: the same analysis and words as BENCHMARK_REPORT.md."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static
from textual_plotext import PlotextPlot

from shardbench.tui.app.messages import OpenResults, Remeasure, ShowLogs
from shardbench.tui.app.results_model import COLUMNS, PLOTS, ResultsView, Row, fmt_cell
from shardbench.tui.app.screens.dialogs import ask_path
from shardbench.suite.report import plots
from shardbench.suite.analyze.stats import Estimate

ROW_STYLES = {"broken": "bold red", "flagged": "yellow", "not ok": "red dim"}


class Cell:
    """A table cell that shows formatted text but sorts by its raw value (an estimate by its mean)."""

    def __init__(self, raw: Any, spec: str, style: str = "") -> None:
        self.raw = raw
        self.value = raw.mean if isinstance(raw, Estimate) else raw
        self.text = fmt_cell(raw, spec)
        self.style = style

    def __rich__(self) -> Text:
        numeric = isinstance(self.value, (int, float)) and not isinstance(self.value, bool)
        return Text(self.text, style=self.style, justify="right" if numeric else "left")

    def sort_key(self, reverse: bool = False) -> tuple:
        # Missing values sort last in either direction (the table reverses the whole order).
        if self.value is None:
            return (-1 if reverse else 2, 0, "")
        if isinstance(self.value, (int, float)):
            return (0, self.value, "")
        return (1, 0, str(self.value))


def row_style(row: Row) -> str:
    if row.broken:
        return ROW_STYLES["broken"]
    if row.flagged:
        return ROW_STYLES["flagged"]
    return ROW_STYLES["not ok"] if row.status != "ok" else ""


PLOT_COLORS = [("blue+", "bright_blue"), ("green+", "bright_green"), ("red+", "bright_red"), ("cyan+", "bright_cyan"),
               ("magenta+", "bright_magenta"), ("yellow+", "bright_yellow"), ("blue", "blue"), ("green", "green"),
               ("red", "red"), ("cyan", "cyan"), ("magenta", "magenta"), ("yellow", "yellow")]
"""Plot line colours: plotext's name and Rich's for the legend line."""


class ResultsScreen(Screen):
    VERTICAL_BREAKPOINTS = [(0, "-short"), (36, "-tall")]
    """Below 36 rows the plots and verdicts shrink so the table keeps its rows (80x24 showed none)."""
    BINDINGS = [
        Binding("l", "logs", "Log"),
        Binding("f", "remeasure", "Re-measure"),
        Binding("s", "sort_next", "Sort"),
        Binding("v", "reverse", "Reverse", show=False),  # the footer fits 80 columns; F1 lists these
        Binding("w", "app.write_report", "Report"),
        Binding("o", "open_dir", "Open", show=False),
        Binding("R", "app.reload_results", "Reload", show=False),
        Binding("p", "next_plot", "Plot"),
    ]

    def __init__(self, results_dir: Path | None = None) -> None:
        super().__init__(id="results-screen")
        self.results_dir = results_dir
        """The result set shown (the app sets it), the open dialog's default."""
        self.view = ResultsView()
        self.source = "no results loaded yet"
        self.sort_column = "tokens_per_s"
        self.sort_reverse = True
        self.right_plot = 1
        """Which of PLOTS the right-hand plot shows (the left one is always tokens/s); p cycles."""

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="results-source")
        table: DataTable[str] = DataTable(id="results-table", cursor_type="row", zebra_stripes=True)
        for column, header, _ in COLUMNS:
            table.add_column(header, key=column)
        yield table
        with VerticalScroll(id="verdicts"):
            yield Static(id="winners")
        with Horizontal(id="plots"):
            yield PlotextPlot(id="plot-left")
            yield PlotextPlot(id="plot-right")
        yield Static(id="plot-legend")
        yield Footer(compact=True, show_command_palette=False)  # 80 columns: F1-F5 and q stay visible

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
        for row in view.rows:
            style = row_style(row)
            table.add_row(*[Cell(v, spec, style) for v, (_, _, spec) in zip(row.cells, COLUMNS)], key=row.key)
        self._sort()
        text = ("[b]Verdicts[/b] (a winner only when Welch tests separate it from every other candidate, Holm 5%)\n"
                + "\n".join(view.verdicts)
                if view.verdicts else "[b]Verdicts[/b]: need at least two strategies with ok runs at the same size.")
        if view.fault_table:  # runs that checkpointed: the report's fault-tolerance table (no markup in it)
            text += "\n\n[b]Fault tolerance[/b]\n" + "\n".join(view.fault_table)
        for title, lines in (("Settings that change the trajectory (measured, not a failure)", view.drifts),
                             ("Settings compared as axes (each value against the default)", view.axes)):
            if lines:  # the report's sections of the same names
                text += f"\n\n[b]{title}[/b]\n" + "\n".join(escape(line) for line in lines)
        self.query_one("#winners", Static).update(text)
        self._plot("#plot-left", 0)
        self._plot("#plot-right", self.right_plot)
        legend = "  ".join(f"[{rich}]━━ {escape(label)}[/]" for label, (_, rich) in self._colors().items())
        self.query_one("#plot-legend", Static).update(legend)

    def _colors(self) -> dict[str, tuple[str, str]]:
        """label -> (plotext colour, Rich colour), the same in both plots and the legend line."""
        labels = sorted({label for series in self.view.series.values() for label in series})
        return {label: PLOT_COLORS[i % len(PLOT_COLORS)] for i, label in enumerate(labels)}

    def action_next_plot(self) -> None:
        """The right-hand plot shows the next of the report's plots (model state, step time,
        scaling efficiency, MFU), skipping those with no data."""
        for step in range(1, len(PLOTS)):
            candidate = 1 + (self.right_plot - 1 + step) % (len(PLOTS) - 1)
            if self.view.series.get(PLOTS[candidate][0]) or step == len(PLOTS) - 1:
                self.right_plot = candidate
                break
        self._plot("#plot-right", self.right_plot)

    def _plot(self, selector: str, index: int) -> None:
        metric, title, unit = PLOTS[index]
        series = self.view.series.get(metric, {})
        widget = self.query_one(selector, PlotextPlot)
        plt = widget.plt
        plt.clear_figure()
        plt.title(title)
        plt.xlabel("devices")
        plt.ylabel(unit)
        limits = plots.y_limits(series)  # type: ignore[arg-type]  # intervals cut at the means' range xCLIP, as in the report's plots
        colors = self._colors()
        for strategy, points in series.items():
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            # No in-plot legend: at 80x24 a plot has 3 rows for it and lost the rest; the legend
            # is the line below the plots, in the same colours.
            plt.plot(xs, ys, marker="braille", color=colors[strategy][0])
            cut = [plots.clipped(p[2], p[3], limits)[:2] for p in points]
            widths = [hi - lo for lo, hi in cut]
            if any(widths):  # plotext draws y +- yerr/2: centred on the (log-scale) interval, [low, high]
                plt.error(xs, [(lo + hi) / 2 for lo, hi in cut], yerr=widths, color=colors[strategy][0])
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
        keys = [c for c, _, _ in COLUMNS]
        self.sort_by(keys[(keys.index(self.sort_column) + 1) % len(keys)], reverse=False)
        self.notify(f"sorted by {dict((c, h) for c, h, _ in COLUMNS)[self.sort_column]}", timeout=2)

    def action_reverse(self) -> None:
        self.sort_by(self.sort_column, reverse=not self.sort_reverse)

    def selected_row(self) -> Row | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return next((r for r in self.view.rows if r.key == key), None)

    def action_logs(self) -> None:
        """The selected row's log: a past run's log.txt from the results directory."""
        row = self.selected_row()
        if row is None or not row.run_ids:
            self.notify("no run selected", severity="warning")
            return
        self.post_message(ShowLogs(row.run_ids[0]))

    def action_remeasure(self) -> None:
        """Run the selected configuration's repeats (or the failed run) again, result or not."""
        row = self.selected_row()
        if row is None or not row.run_ids:
            self.notify("no run selected", severity="warning")
            return
        self.post_message(Remeasure(list(row.run_ids)))

    def action_open_dir(self) -> None:
        ask_path(self, "Open results dir (read-only)", str(self.results_dir or ""),
                 lambda path: self.post_message(OpenResults(path)))
