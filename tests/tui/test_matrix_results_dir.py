"""benchtui --matrix FILE writes into a directory named for that matrix, never into make bench's
results/default (issue 32: even the default matrix's file sent benchtui's runs there)."""
from __future__ import annotations

import shutil

from shardbench.suite.matrix.expand import DEFAULT_MATRIX
from shardbench.tui.app import app as app_mod
from shardbench.tui.app.main import main
from shardbench.tui.app.matrix_plan import benchtui_results


def started_with(monkeypatch, argv: list[str]) -> str:
    """The results directory of the matrix benchtui's main() hands the app (the app is not run)."""
    seen = {}
    init = app_mod.BenchApp.__init__

    def capture(self, *a, **kw):
        seen["results"] = kw["matrix"].results
        init(self, *a, **kw)

    monkeypatch.setattr(app_mod.BenchApp, "__init__", capture)
    monkeypatch.setattr(app_mod.BenchApp, "run", lambda self: None)
    assert main(argv) == 0
    return seen["results"]


def test_matrix_file_results_dir(monkeypatch, tmp_path):
    assert started_with(monkeypatch, []) == "results/benchtui"
    assert started_with(monkeypatch, ["--matrix", str(DEFAULT_MATRIX)]) == "results/benchtui"
    copy = tmp_path / "nightly.yaml"
    shutil.copy(DEFAULT_MATRIX, copy)  # says results: results/default
    assert started_with(monkeypatch, ["--matrix", str(copy)]) == "results/benchtui-nightly"
    own = tmp_path / "own.yaml"
    own.write_text(DEFAULT_MATRIX.read_text().replace("results: results/default", "results: results/mine"))
    assert started_with(monkeypatch, ["--matrix", str(own)]) == "results/mine"
    assert benchtui_results("./results/default", str(copy)) == "results/benchtui-nightly"


async def test_a_matrix_loaded_in_the_app_gets_its_own_results_dir(tmp_path):
    from textual.widgets import Input

    from .conftest import FIXED_AVAILABILITY

    copy = tmp_path / "nightly.yaml"
    shutil.copy(DEFAULT_MATRIX, copy)
    app = app_mod.BenchApp(availability=FIXED_AVAILABILITY)
    async with app.run_test() as pilot:
        app.load_matrix(str(copy))
        await pilot.pause()
        assert app.matrix_screen.query_one("#results", Input).value == "results/benchtui-nightly"


def test_help_says_where_runs_go_and_lists_the_screens(capsys):
    import pytest

    from shardbench.tui.app.main import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = capsys.readouterr().out
    assert "results/benchtui-<file" in out and "F4 Logs" in out and "ctrl+l plan" in out
    assert "re-measure (asks first)" in out
