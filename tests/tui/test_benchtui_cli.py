"""`benchtui --help` and the command palette's commands."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from shardbench.tui.app.app import BenchApp
from shardbench.tui.app.main import parse_args

from .conftest import FIXED_AVAILABILITY

BIN = Path(sys.executable).parent / "benchtui"


def test_benchtui_help_runs_without_starting_the_app():
    cmd = [str(BIN)] if BIN.exists() else [sys.executable, "-m", "shardbench.tui.app.main"]
    out = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for flag in ("--results", "--matrix", "--backend", "--kubeconfig", "--keep-failed"):
        assert flag in out.stdout


def test_arguments_reach_the_app_options():
    args = parse_args(["--results", "r", "--backend", "kubernetes", "--namespace", "bench", "--keep-failed"])
    assert (args.results, args.backend, args.namespace, args.keep_failed) == ("r", "kubernetes", "bench", True)
    # ray_cluster is the matrix's (MatrixSpec.ray_cluster), not a cluster option: benchtui still
    # takes it as a flag, and the app runs backend ray where the loaded matrix says.
    assert parse_args(["--backend", "ray", "--ray-cluster"]).ray_cluster is True
    from dataclasses import replace

    from shardbench.suite.matrix.expand import default_matrix

    app = BenchApp(matrix=replace(default_matrix(), backend="ray", ray_cluster=True), availability=FIXED_AVAILABILITY)
    assert app.ray_cluster is True and BenchApp(availability=FIXED_AVAILABILITY).ray_cluster is False


async def test_command_palette_offers_the_app_actions(tmp_path):
    app = BenchApp(results_dir=tmp_path, availability=FIXED_AVAILABILITY)
    async with app.run_test() as pilot:
        titles = {c.title for c in app.get_system_commands(app.screen)}
        assert {"Run matrix", "Cancel all runs", "Write report", "Open results dir", "Save matrix",
                "Load matrix", "Results screen", "Help"} <= titles
        await pilot.press("ctrl+p")
        await pilot.pause()
        assert type(app.screen).__name__ == "CommandPalette"
