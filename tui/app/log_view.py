"""A log viewer widget: every line of a run's log, rendered only where it is on screen.

- Progress lines (`SHARDBENCH_PROGRESS {json}`) show as one compact status line each.
- Long lines scroll horizontally (the scrollbar appears when a line is wider than the view).
- Follow mode (like `less +F` / k9s): new lines keep the view at the bottom; scrolling up pauses
  it, End or `f` resumes. The widget posts `FollowChanged` so its screen can say so.
- Search matches and error lines are highlighted; `find()` searches the whole log.
"""
from __future__ import annotations

import json
import re

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from shardbench.trainer.record import PROGRESS_PREFIX

# What counts as an error line: exception names, launcher/MPI aborts, OOM kills, pod events.
ERROR_LINE = re.compile(r"(Error|Exception|Traceback|Killed|ERROR|error:|FAILED|\[event\].*Warning|"
                        r"cannot start|out of memory)")
COMMAND_STYLE = Style(bold=True)
PROGRESS_STYLE = Style(color="cyan")
ERROR_STYLE = Style(color="red", bold=True)
MATCH_STYLE = Style(reverse=True)
CURRENT_STYLE = Style(bgcolor="yellow", color="black", bold=True)


def display_line(line: str) -> str:
    """A progress line as `▸ step 12/30 measure · loss 8.123 · 1,234 tok/s · ETA 3s`; others as is."""
    if not line.startswith(PROGRESS_PREFIX):
        return line.expandtabs(4)
    try:
        p = json.loads(line[len(PROGRESS_PREFIX):])
        parts = [f"▸ step {p['step']}/{p['steps']} {p.get('phase', '')}".rstrip()]
        if p.get("loss") is not None:
            parts.append(f"loss {p['loss']:.4f}")
        if p.get("tokens_per_s") is not None:
            parts.append(f"{p['tokens_per_s']:,.0f} tok/s")
        if p.get("step_time_s") is not None:
            parts.append(f"{p['step_time_s']:.3f} s/step")
        if p.get("eta_s") is not None:
            parts.append(f"ETA {p['eta_s']:.0f}s")
        return " · ".join(parts)
    except (ValueError, KeyError, TypeError):
        return line


class LogView(ScrollView, can_focus=True):
    DEFAULT_CSS = "LogView { height: 1fr; }"

    class FollowChanged(Message):
        def __init__(self, follow: bool) -> None:
            super().__init__()
            self.follow = follow

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.lines: list[str] = []
        self.follow = True
        self.needle = ""
        self.current: int | None = None
        """Line shown as the current match or jump target."""
        self._width = 0

    # -- content ------------------------------------------------------------------------------
    @property
    def line_count(self) -> int:
        return len(self.lines)

    def set_lines(self, raw: list[str]) -> None:
        self.lines = [display_line(line) for line in raw]
        self._width = max((len(line) for line in self.lines), default=0)
        self.current = None
        self._resize()
        if self.follow:
            self.call_after_refresh(self.scroll_end, animate=False)

    def append(self, raw: str) -> None:
        line = display_line(raw)
        self.lines.append(line)
        self._width = max(self._width, len(line))
        self._resize()
        if self.follow:
            self.call_after_refresh(self.scroll_end, animate=False)
        else:
            self.refresh()

    def _resize(self) -> None:
        self.virtual_size = Size(self._width + 1, len(self.lines))
        self.refresh()

    # -- follow -------------------------------------------------------------------------------
    def set_follow(self, follow: bool) -> None:
        if follow != self.follow:
            self.follow = follow
            self.post_message(self.FollowChanged(follow))
        if follow:
            self.scroll_end(animate=False)

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        # The reader scrolled up: stop pulling the view to the bottom until asked (End, f).
        if self.follow and new < old and new < self.max_scroll_y:
            self.set_follow(False)

    def action_scroll_end(self) -> None:
        self.set_follow(True)

    # -- search and jumps ---------------------------------------------------------------------
    def find(self, needle: str, start: int, step: int = 1) -> int | None:
        """Index of the next line (wrapping, in direction `step`) containing `needle`, any case."""
        if not needle or not self.lines:
            return None
        needle = needle.lower()
        n = len(self.lines)
        for offset in range(n):
            i = (start + step * offset) % n
            if needle in self.lines[i].lower():
                return i
        return None

    def last_error(self) -> int | None:
        for i in range(len(self.lines) - 1, -1, -1):  # the last error is usually the cause
            if ERROR_LINE.search(self.lines[i]):
                return i
        return None

    def jump(self, index: int) -> None:
        """Show line `index` near the top, marked; pauses follow so it stays in view."""
        self.current = index
        self.set_follow(False)
        self.scroll_to(y=max(0, index - 2), animate=False)
        self.refresh()

    # -- rendering ----------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.scrollable_content_region.width
        if index >= len(self.lines):
            return Strip.blank(width, self.rich_style)
        text = Text(self.lines[index], style=self._line_style(index), end="")
        if self.needle:
            text.highlight_words([self.needle], style=CURRENT_STYLE if index == self.current else MATCH_STYLE,
                                 case_sensitive=False)
        segments = [Segment(s.text, self.rich_style + s.style if s.style else self.rich_style)
                    for s in text.render(self.app.console)]
        return Strip(segments).crop(scroll_x, scroll_x + width).extend_cell_length(width, self.rich_style)

    def _line_style(self, index: int) -> Style:
        line = self.lines[index]
        if index == self.current and not self.needle:
            return CURRENT_STYLE
        if line.startswith("$ "):
            return COMMAND_STYLE
        if line.startswith("▸ step"):
            return PROGRESS_STYLE
        if ERROR_LINE.search(line):
            return ERROR_STYLE
        return Style()
