"""The Matrix screen's mesh-degree fields (issue 28): `TP degree` and `DP replicate` show a
loaded matrix's degrees, a typed list sweeps them (the matrix the screen hands the suite), and
a word there is one line naming the field."""
from __future__ import annotations

from shardbench.suite.matrix.expand import expand, load_matrix
from shardbench.tui.app import app as app_mod

from tests.trainer.conftest import REPO


async def test_degrees_load_sweep_and_refuse_words():
    from textual.widgets import Input

    from .conftest import FIXED_AVAILABILITY

    app = app_mod.BenchApp(availability=FIXED_AVAILABILITY)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = app.matrix_screen
        app.load_matrix(str(REPO / "suite" / "matrices" / "layouts-4dev.yaml"))
        await pilot.pause()
        assert screen.query_one("#tp", Input).value == "1, 2"
        assert screen.query_one("#dp_replicate", Input).value == "1, 2"
        screen.query_one("#tp", Input).value = "2"
        screen.query_one("#dp_replicate", Input).value = "1"
        screen.query_one("#strategies").deselect_all()
        screen.query_one("#strategies").select("fsdp")
        screen.query_one("#world_sizes", Input).value = "4"
        await pilot.pause()
        from shardbench.tui.app.matrix_form import to_matrix

        matrix, errors = to_matrix(screen.fields())
        assert errors == [] and matrix.tp == 2 and matrix.dp_replicate == 1
        specs, problems = expand(matrix)
        assert problems == [] and {(s.config.tp, s.config.dp_replicate) for s in specs} == {(2, 1)}
        screen.query_one("#tp", Input).value = "two"
        await pilot.pause()
        assert to_matrix(screen.fields())[1] == ["tp: 'two' is not a whole number"]


def test_the_layouts_matrix_round_trips_through_the_fields():
    from shardbench.tui.app.matrix_form import from_matrix, to_matrix

    loaded = load_matrix(REPO / "suite" / "matrices" / "layouts-4dev.yaml")
    again, errors = to_matrix(from_matrix(loaded))
    assert errors == [] and again.tp == loaded.tp and again.dp_replicate == loaded.dp_replicate
    assert again.layouts == loaded.layouts
