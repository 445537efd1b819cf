"""Runs screen: the queue with each run's state, live tokens/s and loss, elapsed and ETA; cancel."""
from __future__ import annotations

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from shardbench.tui.app.board import RunBoard, RunRow
from shardbench.tui.app.messages import CancelRun, ShowLogs

# Short columns first, the reason last: at 80 columns a reason in the state column pushed
# elapsed and ETA off the screen. The highlighted row's whole state is in the line below.
COLUMNS = (("#", "index"), ("run", "run"), ("state", "state"), ("tok/s", "tps"), ("loss", "loss"),
           ("time", "elapsed"), ("ETA", "eta"), ("why", "why"))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = int(round(seconds))
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def cells(row: RunRow) -> tuple[str, ...]:
    tps = "" if row.tokens_per_s is None else f"{row.tokens_per_s:,.1f}"
    loss = "" if row.loss is None else f"{row.loss:.4f}"
    eta = duration(row.run_eta_s) if row.state == "running" else ""
    return (str(row.index + 1), row.run_id, row.state_short(), tps, loss, duration(row.elapsed_s()), eta,
            row.reason())


class RunsScreen(Screen):
    BINDINGS = [
        Binding("c", "cancel_run", "Cancel run"),
        Binding("x", "app.cancel_all", "Cancel all"),
        Binding("enter", "logs", "Logs", show=False),
        Binding("l", "logs", "Logs"),
    ]

    def __init__(self, board: RunBoard) -> None:
        super().__init__(id="runs-screen")
        self.board = board
        """The runs' rows (the app folds every suite event into it); read, never written, here."""

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("No matrix started yet: pick one on the Matrix screen (F2) and press ctrl+r.",
                     id="matrix-progress")
        table: DataTable[str] = DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        for title, key in COLUMNS:
            table.add_column(title, key=key)
        yield table
        yield Static("", id="run-detail")
        yield Footer(compact=True, show_command_palette=False)  # 80 columns: F1-F5 and q stay visible

    def on_mount(self) -> None:
        self.redraw()
        # Elapsed times tick while runs are active; finished rows do not change.
        self.set_interval(1.0, self.tick)

    def tick(self) -> None:
        for row in self.board.active():
            self.update_row(row)
        if self.board.active():
            self.update_progress()

    def redraw(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        for row in self.board.rows.values():
            table.add_row(*cells(row), key=row.run_id)
        self.update_progress()

    def update_row(self, row: RunRow) -> None:
        table = self.query_one(DataTable)
        if row.run_id not in table.rows:
            table.add_row(*cells(row), key=row.run_id)
            return
        for (_, key), value in zip(COLUMNS, cells(row)):
            table.update_cell(row.run_id, key, value, update_width=True)
        if row.run_id == self.selected_run():
            self.show_detail(row.run_id)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.show_detail(event.row_key.value)

    def show_detail(self, run_id: str | None) -> None:
        """The highlighted run's whole state, wrapped: a failure reason is never cut."""
        row = self.board.rows.get(run_id) if run_id else None
        text = "" if row is None else f"{row.run_id}: {row.state_text()}"
        self.query_one("#run-detail", Static).update(escape(text))

    def update_progress(self) -> None:
        board = self.board
        if not board.rows:
            return
        counts: dict[str, int] = {}
        for row in board.rows.values():
            counts[row.state] = counts.get(row.state, 0) + 1
        states = ", ".join(f"{n} {s}" for s, n in counts.items())
        left = board.eta_s()
        eta = f" · matrix ETA {duration(left)}" if left is not None and board.active() else ""
        self.query_one("#matrix-progress", Static).update(
            f"{board.done}/{board.total or len(board.rows)} runs done ({states}){eta}")

    def selected_run(self) -> str | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        key, _ = table.coordinate_to_cell_key(table.cursor_coordinate)
        return key.value

    def action_cancel_run(self) -> None:
        run_id = self.selected_run()
        if run_id:
            self.post_message(CancelRun(run_id))

    def action_logs(self) -> None:
        run_id = self.selected_run()
        if run_id:
            self.post_message(ShowLogs(run_id))
