"""benchtui as a new user meets it (issue 24): where its runs go, a typo'd matrix, a report
directory opened as results, runs already done, past logs, re-measuring, the CLI's --force."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, Static

from shardbench.tui.app.app import BenchApp
from shardbench.tui.app.main import parse_args
from shardbench.suite.matrix.expand import MatrixSpec, default_matrix, expand
from tests.synthetic import record

from .conftest import FIXED_AVAILABILITY, settle, write_results
from .test_app_pilot import wait_until

SIZE = (150, 45)
ROOT = Path(__file__).resolve().parents[2]


def tiny(results: Path, **kw) -> MatrixSpec:
    """One ddp run of 4 steps on one rank: the smallest real run."""
    return replace(default_matrix(), strategies=["ddp"], world_sizes=[1], steps=4, warmup_steps=1, repeats=1,
                   results=str(results), **kw)


def run_count(app: BenchApp) -> str:
    return str(app.matrix_screen.query_one("#run-count", Static).content)


async def test_benchtui_runs_do_not_go_to_make_benchs_results(tmp_path, fixture_values):
    app = BenchApp(availability=FIXED_AVAILABILITY)  # no --matrix: the default matrix
    async with app.run_test(size=SIZE) as pilot:
        field = app.matrix_screen.query_one("#results", Input)
        assert field.value == "results/benchtui"
        assert app.matrix_screen.matrix().results == "results/benchtui"
        field.value = str(tmp_path / "mine")
        await pilot.pause()
        assert app.matrix_screen.matrix().results == str(tmp_path / "mine")
    assert default_matrix().results == "results/default"  # make bench's own stays where it was


async def test_a_typod_strategy_in_a_matrix_file_is_a_problem_as_in_the_cli(tmp_path, fixture_values):
    path = tmp_path / "typo.yaml"
    path.write_text("strategies: [ddp, zer03]\nworld_sizes: [1, 2]\nrepeats: 1\n")
    cli = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "run", "--matrix", str(path), "--dry-run"],
                         capture_output=True, text=True, cwd=ROOT)
    assert cli.returncode == 2 and "strategy got 'zer03'" in cli.stderr
    app = BenchApp(results_dir=tmp_path, availability=FIXED_AVAILABILITY)
    async with app.run_test(size=SIZE) as pilot:
        app.load_matrix(str(path))
        await pilot.pause()
        assert any("strategy got 'zer03'" in p for p in app.matrix_screen.problems)
        assert "problem" in run_count(app) and app.matrix_screen.specs == []
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert app.matrix_worker is None
        # Loading a good matrix afterwards drops the typo's checkbox again.
        app.load_matrix(str(ROOT / "suite" / "matrices" / "default.yaml"))
        await pilot.pause()
        assert app.matrix_screen.problems == [] and app.matrix_screen.unknown == []
        assert app.matrix_screen.query_one("#strategies").option_count == 5


def test_empty_result_sets_say_where_the_results_are(tmp_path):
    from shardbench.tui.app.results_source import empty_hint

    results = write_results(tmp_path / "results" / "default", [record("ddp", 1, 100.0)])
    report = tmp_path / "reports" / "default"
    report.mkdir(parents=True)
    (report / "BENCHMARK_REPORT.md").write_text(f"# Benchmark report\n\nGenerated now from `{results}` (1 runs).\n")
    hint = empty_hint(report)
    assert "report directory" in hint and str(results) in hint
    (report / "BENCHMARK_REPORT.md").write_text("# Benchmark report\n")  # sibling guess: reports/x -> results/x
    assert str(results) in empty_hint(report)
    hint = empty_hint(tmp_path / "results")
    assert "one level down" in hint and str(results) in hint
    assert "no such directory" in empty_hint(tmp_path / "nowhere")
    # benchtui's own results/benchtui before its first run, beside make bench's results/default
    assert f"result sets beside it: {results}" in empty_hint(tmp_path / "results" / "benchtui")


async def test_results_flag_opens_on_results_or_hints(tmp_path, fixture_values):
    results = write_results(tmp_path / "results" / "default", [record("ddp", 1, 100.0)])
    args = parse_args(["--results", str(tmp_path / "results")])
    app = BenchApp(results_dir=args.results, availability=FIXED_AVAILABILITY, show_results=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: "result(s) in" in app.results_screen.source, 30, "results")
        await pilot.pause()
        assert "one level down" in app.results_screen.source
        assert app.current_mode == "results"  # at once, and it stays: the hint is on the screen
        from shardbench.tui.app.app import HINT_TIMEOUT_S
        assert any("one level down" in n.message and n.timeout == HINT_TIMEOUT_S for n in app._notifications)
    app = BenchApp(results_dir=results, availability=FIXED_AVAILABILITY, show_results=True)
    async with app.run_test(size=SIZE) as pilot:
        assert app.current_mode == "results"  # from the start, not once the results have loaded
        await wait_until(pilot, lambda: "1 result(s)" in app.results_screen.source, 30, "results")
        await pilot.pause()
        assert app.current_mode == "results"


async def test_results_table_keeps_rows_at_80x24(tmp_path, fixture_values):
    recs = [record(s, w, 100.0 * w, repeat=r) for s in ("ddp", "zero2") for w in (1, 2) for r in range(2)]
    write_results(tmp_path, recs)
    app = BenchApp(results_dir=tmp_path, availability=FIXED_AVAILABILITY)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: "8 result(s)" in app.results_screen.source, 30, "results")
        await settle(pilot)
        await pilot.press("f5")
        await pilot.pause()
        table = app.results_screen.query_one("#results-table", DataTable)
        assert table.row_count == 4
        assert table.region.height >= 6  # header + every configuration (it was 0 rows high)


@pytest.mark.slow
async def test_done_runs_are_counted_logs_open_and_remeasure_keeps_the_old_attempt(tmp_path, fixture_values):
    results = tmp_path / "res"
    matrix = tiny(results)
    app = BenchApp(matrix=matrix, availability=FIXED_AVAILABILITY)
    async with app.run_test(size=SIZE) as pilot:
        assert "1 run(s)[/b] ready" in run_count(app)
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: app.matrix_worker is not None and app.matrix_worker.is_finished,
                         120, "the run")
        await settle(pilot)
        (run_id,) = [s.run_id for s in app.matrix_screen.specs]
        assert (results / run_id / "result.json").is_file()
        app.matrix_screen.validate()
        assert "all 1 run(s) already done" in run_count(app)  # was "1 run(s) ready"
        first = app.matrix_worker
        await pilot.press("f2")
        await pilot.press("ctrl+f")  # re-measure from the Matrix screen
        await pilot.pause()
        await pilot.press("enter")  # it asks first
        await pilot.pause()
        await wait_until(pilot, lambda: app.matrix_worker is not first and app.matrix_worker.is_finished,
                         120, "the forced run")
        await settle(pilot)
        assert (results / run_id / "attempts" / "1" / "result.json").is_file()
        # The log of a past run opens from the Results screen (a fresh app: not on its board).
    app = BenchApp(matrix=matrix, results_dir=results, availability=FIXED_AVAILABILITY)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: "1 result(s)" in app.results_screen.source, 30, "results")
        await settle(pilot)
        await pilot.press("f5")
        await pilot.pause()
        await pilot.press("l")
        await pilot.pause()
        assert app.current_mode == "logs" and app.logs_screen.run_id == run_id
        assert any("BENCHMARK_RESULT_JSON_START" in line for line in app.logs_screen.lines())
        assert "past run" in str(app.logs_screen.query_one("#log-title", Static).content)
        await pilot.press("f5")
        await pilot.pause()
        await pilot.press("f")
        await pilot.pause()
        await pilot.press("enter")  # it asks first
        await wait_until(pilot, lambda: app.matrix_worker is not None and app.matrix_worker.is_finished,
                         120, "the re-measured run")
        await settle(pilot)
    assert (results / run_id / "attempts" / "2" / "result.json").is_file()  # the Results screen's f
    assert (results / run_id / "result.json").is_file()


@pytest.mark.slow
def test_cli_force_remeasures_one_configuration_and_rejects_unknown_ids(tmp_path):
    results = tmp_path / "res"
    base = [sys.executable, "-m", "shardbench.suite.cli", "run", "--strategies", "ddp", "--world-sizes", "1",
            "--steps", "4", "--warmup-steps", "1", "--repeats", "1", "--results", str(results), "--quiet"]
    assert subprocess.run(base, capture_output=True, text=True, cwd=ROOT).returncode == 0
    (run_id,) = [p.name for p in results.iterdir() if p.is_dir()]
    bad = subprocess.run(base + ["--force", "ddp-nothing"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--force ddp-nothing: no such run" in bad.stderr
    again = subprocess.run(base + ["--force", run_id.rsplit("-r", 1)[0]], capture_output=True, text=True, cwd=ROOT)
    assert again.returncode == 0, again.stderr
    assert (results / run_id / "attempts" / "1" / "result.json").is_file()
    assert "skipped" not in again.stdout


def test_rerun_flagged_selects_only_the_flagged_configurations(tmp_path):
    from shardbench.suite.execute.rerun import selection

    matrix = MatrixSpec(strategies=["ddp", "zero2"], world_sizes=[1], repeats=2, shape="cpu", device="cpu",
                        results=str(tmp_path))
    specs, errors = expand(matrix)
    assert not errors
    recs = []
    for s in specs:  # zero2's repeats differ by 2x: a spread flag; ddp's agree
        tps = 100.0 if s.strategy == "ddp" or s.repeat == 0 else 200.0
        recs.append(record(s.strategy, 1, tps, repeat=s.repeat) | {"run_id": s.run_id, "config_id": s.config_id})
    write_results(tmp_path, recs)
    assert selection([], True, specs, tmp_path) == {s.run_id for s in specs if s.strategy == "zero2"}
    assert selection(["*"], False, specs, tmp_path) is True
    one = specs[0].run_id
    assert selection([one], False, specs, tmp_path) == {one}
    assert "no such run" in selection(["zero9-w1"], False, specs, tmp_path)


def test_readme_says_what_a_fresh_debian_needs_and_where_the_commands_are():
    readme = (ROOT / "README.md").read_text()
    top = readme[:readme.index("## The trainer")]
    assert "python3-venv" in top and "make" in top and "g++" in top
    assert ".venv/bin/benchtui" in top and ".venv/bin/activate" in top
    assert "## Which strategy when" in readme and "From the counted numbers" in readme
    assert readme.index("<!-- sample:begin") < readme.index("## Quick start")  # the answer first (issue 32)
    # The commands the README shows exist with the flags it names.
    from shardbench.suite.cli.commands import build_parser

    parser = build_parser()
    args = parser.parse_args(["run", "--rerun-flagged", "--force", "x-r1", "--force"])
    assert args.rerun_flagged and args.force == ["x-r1", "*"]
    assert parser.parse_args(["compare", "a", "b", "--fail-on-worse"]).fail_on_worse
    assert "BENCH_ARGS" in (ROOT / "Makefile").read_text()
