"""Screens show the data they are given (the run board, the paths), not the app's state: the Runs
and Logs screens work in a plain Textual App that has no board of its own. They used to read
`self.app.board`, `self.app.matrix_path` and `self.app.results_dir`."""
from __future__ import annotations

from textual.app import App
from textual.widgets import DataTable

from tests.tui.test_board import board_with
from shardbench.tui.app.log_view import LogView
from shardbench.tui.app.screens.logs import LogsScreen
from shardbench.tui.app.screens.runs import RunsScreen
from shardbench.suite.execute import events as ev


async def test_runs_and_logs_screens_read_the_board_they_are_given():
    board = board_with(["ok", "running"])
    board.apply(ev.RunLogLine("run1", "hello from rank 0"))

    class Bare(App):  # no `board`, no matrix path, no results dir
        def on_mount(self) -> None:
            self.push_screen(RunsScreen(board))

    app = Bare()
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        assert app.screen.query_one(DataTable).row_count == 2
        logs = LogsScreen(board)
        logs.run_id = "run1"
        await app.push_screen(logs)
        await pilot.pause()
        assert logs.query_one(LogView).line_count == 1
