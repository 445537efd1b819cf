"""benchtui at 80x24, the smallest terminal it must work in (issue 32): the help box scrolls, every
footer shows F1-F5 and q, the Runs screen keeps elapsed and ETA on screen and says a failure once,
the plots keep a legend for every line."""
from __future__ import annotations

import pytest
from textual.widgets import DataTable, Footer, Static
from textual.widgets._footer import FooterKey

from shardbench.suite.execute import events as ev
from shardbench.tui.app.messages import SuiteEvent

from .conftest import settle, write_results
from .test_snapshots import RUNS, feed, make_app

SMALL = (80, 24)


def visible_keys(screen) -> set[str]:
    """The keys a footer shows wholly inside the terminal's width."""
    footer = screen.query_one(Footer)
    return {k.key for k in footer.query(FooterKey) if k.region.width and k.region.right <= SMALL[0]}


async def test_every_footer_shows_the_screens_help_and_quit_at_80_columns(fixture_values):
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        for key, mode in (("f2", "matrix"), ("f3", "runs"), ("f4", "logs"), ("f5", "results")):
            await pilot.press(key)
            await pilot.pause()
            assert app.current_mode == mode
            shown = visible_keys(app.screen)
            assert {"f1", "f2", "f3", "f4", "f5", "q"} <= shown, (mode, shown)
        await pilot.press("f2")
        await pilot.pause()
        assert "ctrl+l" in visible_keys(app.screen)  # the plan panel is discoverable


async def test_help_box_fits_and_scrolls_at_80x24(fixture_values):
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("f1")
        await pilot.pause()
        box = app.screen.query_one("#help-box")
        assert box.region.right <= SMALL[0] and box.region.bottom <= SMALL[1]
        assert box.max_scroll_y > 0 and box.scroll_y == 0
        await pilot.press("pagedown")
        await pilot.pause()
        assert box.scroll_y > 0


async def test_runs_screen_keeps_eta_on_screen_and_says_a_failure_once(fixture_values):
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        feed(app)
        app.post_message(SuiteEvent(ev.RunStateChanged(RUNS[3], "failed", "failed: RuntimeError: boom in rank 1")))
        await pilot.pause()
        await pilot.press("f3")
        await pilot.pause()
        table = app.runs_screen.query_one("#runs-table", DataTable)
        widths = [c.get_render_width(table) for c in table.columns.values()]
        keys = [k.value for k in table.columns]
        assert sum(widths[:keys.index("eta") + 1]) <= SMALL[0]
        assert table.get_cell(RUNS[2], "eta") == "42s"
        row = app.board.rows[RUNS[3]]
        assert row.state_text() == "failed: RuntimeError: boom in rank 1"
        assert table.get_cell(RUNS[3], "why") == "RuntimeError: boom in rank 1"
        table.move_cursor(row=3)
        await pilot.pause()
        detail = str(app.runs_screen.query_one("#run-detail", Static).content)
        assert detail.endswith("failed: RuntimeError: boom in rank 1") and "failed: failed" not in detail


async def test_plots_keep_a_legend_for_every_line_at_80x24(fixture_values, tmp_path, monkeypatch):
    from tests.synthetic import record

    monkeypatch.chdir(tmp_path)
    recs = [record(s, w, 500.0 * w + i, repeat=i) for s in ("ddp", "fsdp", "zero1", "zero2", "zero3")
            for w in (1, 2) for i in range(2)]
    write_results(tmp_path / "results", recs)
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        while "result(s) in" not in app.results_screen.source:
            await pilot.pause(0.1)
        await settle(pilot)
        await pilot.press("f5")
        await pilot.pause()
        legend = app.results_screen.query_one("#plot-legend", Static)
        text = str(legend.render())
        assert all(s in text for s in ("ddp", "fsdp", "zero1", "zero2", "zero3")), text
        assert legend.region.bottom <= SMALL[1] - 1 and legend.region.height >= 1
