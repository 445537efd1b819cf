"""benchtui's Results screen shows the loss check's "Settings that change the trajectory" and the
"Settings compared as axes" of the report, in its words (suite/report/markdown.py drift_texts,
axis_texts), below the verdicts; a result set without them shows neither heading."""
from __future__ import annotations

from textual.app import App
from textual.widgets import Static

from shardbench.tui.app.results_model import compute
from shardbench.tui.app.screens.results import ResultsScreen
from tests.synthetic import record

LOSS = [9.0, 8.9, 8.8, 8.7, 8.6, 8.5]


def _run(config: str, repeat: int, tps: float, loss: list[float] = LOSS, **settings) -> dict:
    return record(world_size=2, tokens_per_s=tps, repeat=repeat, settings=settings, loss_per_step=loss,
                  config_id=config, run_id=f"ddp-w2-{config}-r{repeat}", **settings)


async def _shown(records: list[dict]) -> str:
    screen = ResultsScreen()

    class Bare(App):
        def on_mount(self) -> None:
            self.push_screen(screen)

    app = Bare()
    async with app.run_test(size=(160, 45)) as pilot:
        screen.show(compute(records), "test")
        await pilot.pause()
        return str(screen.query_one("#winners", Static).render())


async def test_drifts_and_axes_are_on_the_results_screen():
    drifted = [x * (1 + 1e-3 * max(0, k - 2)) for k, x in enumerate(LOSS)]
    records = [_run("none", r, 1000 + 10 * r, ddp_comm_hook="none") for r in range(3)]
    records += [_run("psgd", r, 1100 + 10 * r, drifted, ddp_comm_hook="powersgd", powersgd_rank=1) for r in range(3)]
    text = await _shown(records)
    assert "Settings that change the trajectory" in text and "Settings compared as axes" in text, text
    assert ("ddp-comm-hook powersgd vs ddp-comm-hook none (3 vs 3 runs): loss differs by 0.003 relative at most "
            "(step 5)") in text, text
    assert ("ddp-comm-hook powersgd vs ddp-comm-hook none (no other settings): 1,110 [1,085, 1,135] (n=3) vs 1,010 "
            "[985, 1,035] (n=3) tok/s, ratio 1.1 [1.08, 1.12] (n=3), Welch p 0.00027") in text, text


async def test_a_set_without_them_shows_neither_heading():
    text = await _shown([_run("a", r, 1000 + r) for r in range(2)])
    assert "trajectory" not in text and "axes" not in text, text
