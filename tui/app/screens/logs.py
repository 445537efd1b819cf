"""Logs screen: the selected run's log, live; follow on/off, search, jump to the error.

On the cluster the log is the launcher pod's (streamed by the backend), with `[event]` lines for
pods that could not start, so the same view serves both backends.
"""
from __future__ import annotations

import re

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, Log, Static

# What counts as an error line: exception names, launcher/ MPI aborts, OOM kills, pod events.
ERROR_LINE = re.compile(r"(Error|Exception|Traceback|Killed|ERROR|error:|FAILED|\[event\].*Warning|"
                        r"cannot start|out of memory)")


MAX_SHOWN = 20_000


class LogsScreen(Screen):
    BINDINGS = [
        Binding("f", "toggle_follow", "Follow"),
        Binding("slash", "search", "Search"),
        Binding("n", "next_match", "Next match"),
        Binding("e", "jump_error", "Error"),
        Binding("left_square_bracket", "other_run(-1)", "Prev run"),
        Binding("right_square_bracket", "other_run(1)", "Next run"),
        Binding("escape", "close_search", "Close search", show=False),
    ]

    def __init__(self) -> None:
        super().__init__(id="logs-screen")
        self.run_id: str | None = None
        self.follow = True
        self.query_text = ""
        self.match_at = -1

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="log-title")
        # The widget keeps the last lines (rendering cost); search and jumps use the full board log.
        yield Log(id="log", highlight=False, auto_scroll=True, max_lines=MAX_SHOWN)
        search = Input(placeholder="search the log (enter: next match, esc: close)", id="log-search")
        search.display = False
        yield search
        yield Footer()

    def on_mount(self) -> None:
        if self.run_id is None and self.app.board.rows:
            self.run_id = next(iter(self.app.board.rows))
        self.reload()

    # -- content ------------------------------------------------------------------------------
    def lines(self) -> list[str]:
        row = self.app.board.rows.get(self.run_id) if self.run_id else None
        return row.log if row else []

    def show_run(self, run_id: str) -> None:
        self.run_id = run_id
        self.match_at = -1
        if self.is_mounted:
            self.reload()

    def reload(self) -> None:
        log = self.query_one(Log)
        log.clear()
        log.auto_scroll = self.follow
        log.write_lines(self.lines())
        self.update_title()

    def append(self, run_id: str, line: str) -> None:
        if run_id == self.run_id and self.is_mounted:
            self.query_one(Log).write_line(line)

    def update_title(self) -> None:
        row = self.app.board.rows.get(self.run_id) if self.run_id else None
        if row is None:
            text = "No run selected: start a matrix, then pick a run on the Runs screen (F3)."
        else:
            text = (f"[b]{row.run_id}[/b] · {row.state_text()} · follow {'on' if self.follow else 'off'}"
                    + (f" · search {self.query_text!r}" if self.query_text else "")
                    + (f" · line {self.match_at + 1}" if self.match_at >= 0 and not self.follow else ""))
        self.query_one("#log-title", Static).update(text)

    # -- actions ------------------------------------------------------------------------------
    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        log = self.query_one(Log)
        log.auto_scroll = self.follow
        if self.follow:
            log.scroll_end(animate=False)
        self.update_title()

    def action_search(self) -> None:
        search = self.query_one("#log-search", Input)
        search.display = True
        search.focus()

    def action_close_search(self) -> None:
        search = self.query_one("#log-search", Input)
        search.display = False
        self.query_one(Log).focus()

    @on(Input.Submitted, "#log-search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        if event.value != self.query_text:
            self.query_text, self.match_at = event.value, -1
        self.action_next_match()

    def action_next_match(self) -> None:
        if not self.query_text:
            return
        needle = self.query_text.lower()
        found = self._find(lambda line: needle in line.lower(), start=self.match_at + 1)
        if found is None:
            self.notify(f"{self.query_text!r} not found", severity="warning")
            return
        self.match_at = found
        self._jump(found)

    def action_jump_error(self) -> None:
        lines = self.lines()
        for i in range(len(lines) - 1, -1, -1):  # the last error is usually the cause
            if ERROR_LINE.search(lines[i]):
                self._jump(i)
                return
        self.notify("no error line in this log", severity="information")

    def action_other_run(self, step: int) -> None:
        ids = list(self.app.board.rows)
        if not ids:
            return
        at = ids.index(self.run_id) if self.run_id in ids else -1
        self.show_run(ids[(at + step) % len(ids)])

    def _find(self, pred, start: int) -> int | None:
        lines = self.lines()
        for offset in range(len(lines)):
            i = (start + offset) % len(lines)
            if pred(lines[i]):
                return i
        return None

    def _jump(self, index: int) -> None:
        """Show line `index` (0-based) near the top; stops following so it stays in view."""
        self.follow = False
        log = self.query_one(Log)
        log.auto_scroll = False
        shown_from = len(self.lines()) - log.line_count  # the widget keeps only the last MAX_SHOWN
        if index < shown_from:
            self.notify(f"line {index + 1} is older than the last {MAX_SHOWN} lines shown; see log.txt",
                        severity="warning")
            return
        log.scroll_to(y=max(0, index - shown_from - 2), animate=False)
        self.match_at = index
        self.update_title()
