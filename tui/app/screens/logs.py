"""Logs screen: the selected run's whole log, live: the launch command first, progress lines as
compact status lines, horizontal scroll for long lines, search with next/previous match over
every line, jump to the error, and follow mode that pauses when you scroll up (End or f resumes).

On the cluster the log is the launcher pod's (streamed by the backend), with `[event]` lines for
pods that could not start, so the same view serves both backends.
"""
from __future__ import annotations

from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, Static

from shardbench.tui.app.board import RunBoard
from shardbench.tui.app.log_view import LogView


OTHER_RUN = Binding.Group("other run")


class LogsScreen(Screen):
    BINDINGS = [
        Binding("f", "toggle_follow", "Follow"),
        Binding("slash", "search", "Search"),
        Binding("n", "match(1)", "Next match", show=False),  # the footer fits 80 columns; F1 lists these
        Binding("N", "match(-1)", "Prev match", show=False),
        Binding("e", "jump_error", "Error"),
        Binding("left_square_bracket", "other_run(-1)", "Prev run", group=OTHER_RUN),
        Binding("right_square_bracket", "other_run(1)", "Next run", group=OTHER_RUN),
        Binding("escape", "close_search", "Close search", show=False),
    ]

    def __init__(self, board: RunBoard) -> None:
        super().__init__(id="logs-screen")
        self.board = board
        """The runs' rows (the app folds every suite event into it); read, never written, here."""
        self.run_id: str | None = None
        self.saved_path: Path | None = None
        """Where a past run's log is (results/<run-id>/log.txt), shown when the board has none."""
        self.query_text = ""
        self.match_at = -1

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="log-title")
        yield LogView(id="log")
        search = Input(placeholder="search the whole log (enter: next match, esc: close)", id="log-search")
        search.display = False
        yield search
        yield Footer(compact=True, show_command_palette=False)  # 80 columns: F1-F5 and q stay visible

    def on_mount(self) -> None:
        if self.run_id is None and self.board.rows:
            self.run_id = next(iter(self.board.rows))
        self.reload()

    @property
    def view(self) -> LogView:
        return self.query_one(LogView)

    @property
    def follow(self) -> bool:
        return self.view.follow if self.is_mounted else True

    # -- content ------------------------------------------------------------------------------
    def lines(self) -> list[str]:
        row = self.board.rows.get(self.run_id) if self.run_id else None
        if row is not None:  # a run of this session: its live log (the file may still be growing)
            return row.log
        return self.saved_log() or []

    def saved_log(self) -> list[str] | None:
        """A past run's log.txt (the run is not on the board): the path the app gave show_run."""
        try:
            return self.saved_path.read_text(errors="replace").splitlines() if self.saved_path else None
        except OSError:
            return None

    def show_run(self, run_id: str, saved_path: Path | None = None) -> None:
        self.run_id = run_id
        self.saved_path = saved_path
        self.match_at = -1
        if self.is_mounted:
            self.reload()

    def reload(self) -> None:
        self.view.set_lines(self.lines())
        self.update_title()

    def append(self, run_id: str, line: str) -> None:
        if run_id == self.run_id and self.is_mounted:
            self.view.append(line)

    def update_title(self) -> None:
        row = self.board.rows.get(self.run_id) if self.run_id else None
        if row is None and self.run_id and self.view.line_count:
            text = f"[b]{self.run_id}[/b] · past run · {self.saved_path} · {self.view.line_count} lines"
        elif row is None and self.run_id:
            text = f"[b]{self.run_id}[/b]: no log saved at {self.saved_path}"
        elif row is None:
            text = ("No run selected: start a matrix, then pick a run on the Runs screen (F3), "
                    "or a past run on the Results screen (F5, then l).")
        else:
            follow = "follow on" if self.follow else "follow paused (End or f resumes)"
            text = (f"[b]{row.run_id}[/b] · {row.state_text()} · {self.view.line_count} lines · {follow}"
                    + (f" · search {self.query_text!r}" if self.query_text else "")
                    + (f" · line {self.match_at + 1}" if self.match_at >= 0 else ""))
        self.query_one("#log-title", Static).update(text)

    @on(LogView.FollowChanged)
    def _follow_changed(self) -> None:
        self.update_title()

    # -- actions ------------------------------------------------------------------------------
    def action_toggle_follow(self) -> None:
        self.view.set_follow(not self.view.follow)
        self.update_title()

    def action_search(self) -> None:
        search = self.query_one("#log-search", Input)
        search.display = True
        search.focus()

    def action_close_search(self) -> None:
        self.query_one("#log-search", Input).display = False
        self.view.focus()

    @on(Input.Submitted, "#log-search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        if event.value != self.query_text:
            self.query_text, self.match_at = event.value, -1
            self.view.needle = event.value
        self.action_match(1)

    def action_match(self, step: int) -> None:
        if not self.query_text:
            return
        start = self.match_at + step if self.match_at >= 0 else (0 if step > 0 else -1)
        found = self.view.find(self.query_text, start, step)
        if found is None:
            self.notify(f"{self.query_text!r} not found", severity="warning")
            return
        self._jump(found)

    def action_jump_error(self) -> None:
        found = self.view.last_error()
        if found is None:
            self.notify("no error line in this log", severity="information")
            return
        self._jump(found)

    def action_other_run(self, step: int) -> None:
        ids = list(self.board.rows)
        if not ids:
            return
        at = ids.index(self.run_id) if self.run_id in ids else -1
        self.show_run(ids[(at + step) % len(ids)])

    def _jump(self, index: int) -> None:
        self.match_at = index
        self.view.jump(index)
        self.update_title()
