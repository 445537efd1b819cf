"""Re-measuring asks first (issue 32): ctrl+f on the Matrix screen and `f` on Results used to start
at once, moving good results into attempts/."""
from __future__ import annotations

from shardbench.tui.app.app import BenchApp
from shardbench.tui.app.screens.dialogs import Confirm
from shardbench.trainer.record import write_atomic
from shardbench.suite.matrix.expand import MatrixSpec, expand
from tests.synthetic import record

from .conftest import FIXED_AVAILABILITY, settle

MATRIX = dict(strategies=["ddp"], world_sizes=[1], seq_lens=[64], micro_batch=4, grad_accum=1, model="tiny",
              precision="fp32", steps=4, warmup_steps=1, repeats=1, launcher="auto", backend="local",
              shape="cpu", device="cpu")


def done_matrix(results) -> MatrixSpec:
    matrix = MatrixSpec(**MATRIX, results=str(results))
    specs, errors = expand(matrix)
    assert not errors
    for s in specs:
        write_atomic(s.to_dict(), str(results / s.run_id / "spec.json"))
        write_atomic(record(s.strategy, s.world_size, 500.0, repeat=s.repeat)
                     | {"run_id": s.run_id, "config_id": s.config_id, "steps": s.steps,
                        "warmup_steps": s.warmup_steps, "seed": s.seed}, str(results / s.run_id / "result.json"))
    return matrix


async def test_ctrl_f_asks_before_re_measuring_and_esc_keeps_everything(tmp_path, fixture_values):
    results = tmp_path / "res"
    app = BenchApp(matrix=done_matrix(results), availability=FIXED_AVAILABILITY)
    before = sorted(p.relative_to(results) for p in results.rglob("*"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("ctrl+f")
        await pilot.pause()
        assert isinstance(app.screen, Confirm) and "Re-measure all 1 run(s)" in app.screen.question
        assert "1 finished result(s)" in app.screen.question
        assert app.matrix_worker is None
        await pilot.press("escape")
        await pilot.pause()
        assert app.matrix_worker is None and not isinstance(app.screen, Confirm)
    assert sorted(p.relative_to(results) for p in results.rglob("*")) == before


async def test_results_f_asks_before_re_measuring(tmp_path, fixture_values):
    results = tmp_path / "res"
    done_matrix(results)
    app = BenchApp(matrix=MatrixSpec(**MATRIX, results=str(results)), results_dir=results,
                   availability=FIXED_AVAILABILITY)
    async with app.run_test(size=(80, 24)) as pilot:
        while "1 result(s)" not in app.results_screen.source:
            await pilot.pause(0.1)
        await settle(pilot)
        await pilot.press("f5")
        await pilot.pause()
        await pilot.press("f")
        await pilot.pause()
        assert isinstance(app.screen, Confirm) and "Re-measure 1 run(s)" in app.screen.question
        assert app.matrix_worker is None
        await pilot.press("escape")
        await pilot.pause()
        assert app.matrix_worker is None
