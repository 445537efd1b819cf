"""benchtui driven through Textual's pilot (app.run_test()): real runs on this machine, cancel,
live validation, load/save, logs search, results sorting, the unavailable cluster backend."""
from __future__ import annotations

from dataclasses import replace

import json
import time

import pytest
from textual.widgets import DataTable, Input, SelectionList, Static

from shardbench.tui.app.app import BenchApp
from shardbench.tui.app.screens.dialogs import Confirm
from shardbench.tui.app.messages import SuiteEvent
from shardbench.suite.execute import events as ev
from shardbench.suite.matrix.expand import MatrixSpec, default_matrix, load_matrix
from shardbench.suite.analyze.rows import without_repeat

from .conftest import FIXED_AVAILABILITY, rank_processes, settle, synthetic_record, write_results

SIZE = (150, 45)


async def wait_until(pilot, predicate, timeout: float, what: str) -> None:
    until = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > until:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.2)


async def pick_strategies(pilot, app: BenchApp, wanted: set[str]) -> None:
    """Toggle the strategy checkboxes with the keyboard, as a person would."""
    sel = app.matrix_screen.query_one("#strategies", SelectionList)
    sel.focus()
    await pilot.pause()
    for index in range(sel.option_count):
        sel.highlighted = index
        value = sel.get_option_at_index(index).value
        if (value in sel.selected) != (value in wanted):
            await pilot.press("space")
    await pilot.pause()
    assert set(sel.selected) == wanted


def set_inputs(app: BenchApp, **values: str) -> None:
    for key, value in values.items():
        app.matrix_screen.query_one(f"#{key}", Input).value = value


def table_cell(app: BenchApp, run_id: str, column: str):
    return app.results_screen.query_one("#results-table", DataTable).get_cell(run_id, column)


@pytest.mark.slow
async def test_tiny_matrix_runs_for_real_and_results_hold_measured_tokens_per_s(tmp_path):
    # A past result set opened with --results is only viewed: the runs go to the matrix's own
    # directory (they used to land in, and replace results of, the opened one).
    past = tmp_path / "past"
    write_results(past, [synthetic_record("ddp", 1, 100.0, 0.5)])
    before = sorted(p.relative_to(past) for p in past.rglob("*"))
    matrix = replace(default_matrix(), results=str(tmp_path / "results"))
    app = BenchApp(matrix=matrix, results_dir=past, availability=FIXED_AVAILABILITY)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: "in " + str(past) in app.results_screen.source, 30, "the past results")
        await pick_strategies(pilot, app, {"ddp"})
        set_inputs(app, world_sizes="1, 2", seq_lens="64", steps="5", warmup_steps="2", repeats="1")
        await pilot.pause()
        assert "2 run(s)" in str(app.matrix_screen.query_one("#run-count", Static).content)
        ids = [s.run_id for s in app.matrix_screen.specs]
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert app.current_mode == "runs"
        await wait_until(pilot, lambda: not app.matrix_worker.is_running, 180, "the matrix to finish")
        await settle(pilot)
        await pilot.pause(0.5)
        assert sorted(p.relative_to(past) for p in past.rglob("*")) == before
        assert app.results_dir == tmp_path / "results"

        runs = app.runs_screen.query_one("#runs-table", DataTable)
        assert [runs.get_cell(r, "state") for r in ids] == ["ok", "ok"]
        await pilot.press("f5")
        await pilot.pause(0.3)
        for run_id in ids:
            record = json.loads((tmp_path / "results" / run_id / "result.json").read_text())
            assert record["status"] == "ok" and record["tokens_per_s"] > 0
            cell = table_cell(app, without_repeat(run_id), "tokens_per_s")
            assert cell.value == pytest.approx(record["tokens_per_s"])  # one repeat: no interval
            assert cell.text == f"{record['tokens_per_s']:,.0f}"
            # The live log reached the board line by line, progress lines included.
            assert any("SHARDBENCH_PROGRESS" in line for line in app.board.rows[run_id].log)
        await pilot.press("f4")
        await pilot.pause()
        assert app.logs_screen.query_one("#log").line_count > 0


def endless_run_app(results) -> BenchApp:
    """An app whose matrix is one ddp run at world size 2 that would run for hours."""
    matrix = MatrixSpec(strategies=["ddp"], world_sizes=[2], seq_lens=[64], steps=100000, warmup_steps=2,
                        timeout_s=300, results=str(results))
    return BenchApp(matrix=matrix, availability=FIXED_AVAILABILITY)


async def start_and_wait_for_progress(pilot, app: BenchApp) -> None:
    await pilot.press("ctrl+r")
    await wait_until(pilot, lambda: any(r.tokens_per_s for r in app.board.rows.values()), 120,
                     "the first progress line")


@pytest.mark.slow
async def test_cancel_stops_the_run_and_leaves_no_rank_processes(tmp_path):
    results = tmp_path / "cancel-results"
    app = endless_run_app(results)
    async with app.run_test(size=SIZE) as pilot:
        await start_and_wait_for_progress(pilot, app)
        assert rank_processes(str(results)), "the run's ranks should be running"
        await pilot.press("c")  # cancel the selected (first) run on the Runs screen
        await wait_until(pilot, lambda: not app.matrix_worker.is_running, 60, "the cancelled matrix to end")
        await pilot.pause(0.3)
        (row,) = app.board.rows.values()
        assert row.state == "cancelled", row.detail
        assert rank_processes(str(results)) == []
        record = json.loads((results / row.run_id / "result.json").read_text())
        assert record["status"] == "cancelled" and record["error"].startswith("cancelled by the user")


@pytest.mark.slow
async def test_quit_with_runs_asks_and_enter_stops_every_rank(tmp_path):
    results = tmp_path / "quit-results"
    app = endless_run_app(results)
    async with app.run_test(size=SIZE) as pilot:
        await start_and_wait_for_progress(pilot, app)
        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, Confirm) and "1 run(s) not finished" in str(
            app.screen.query_one("#confirm-question").content)
        await pilot.press("escape")  # stay: nothing stops
        await pilot.pause()
        assert app.matrix_worker.is_running and rank_processes(str(results))
        await pilot.press("q")
        await pilot.pause()
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.matrix_worker.is_running, 60, "the runs to stop")
    assert rank_processes(str(results)) == []


async def test_matrix_screen_explains_invalid_combinations_live(tmp_path, fixture_values):
    matrix = MatrixSpec(strategies=["ddp", "fsdp", "zero2", "zero3"], world_sizes=[1, 2], seq_lens=[64],
                        repeats=1, backend="local", shape="cpu")
    app = BenchApp(results_dir=tmp_path, matrix=matrix, availability=FIXED_AVAILABILITY)
    async with app.run_test(size=SIZE) as pilot:
        screen = app.matrix_screen
        set_inputs(app, world_sizes="1, 3", global_batch="8", micro_batch="4")
        await pilot.pause()
        problems = str(screen.query_one("#problems", Static).content)
        assert "global_batch 8 is not a multiple of micro_batch 4 x world size 3" in problems
        assert "problem" in str(screen.query_one("#run-count", Static).content)
        set_inputs(app, world_sizes="1, two")
        await pilot.pause()
        assert "'two' is not a whole number" in str(screen.query_one("#problems", Static).content)
        # Nothing starts while the matrix has problems.
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert app.matrix_worker is None and app.current_mode == "matrix"
        set_inputs(app, world_sizes="1, 2", global_batch="")
        await pilot.pause()
        assert screen.problems == [] and "8 run(s)" in str(screen.query_one("#run-count", Static).content)


async def test_cluster_backend_unavailable_is_shown_with_why(tmp_path, monkeypatch, fixture_values):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    app = BenchApp(results_dir=tmp_path)  # real availability checks, in a worker
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: "kubernetes" in app.backend_status, 30, "the backend checks")
        await pilot.pause()
        note = str(app.matrix_screen.query_one("#backend-note", Static).content)
        assert "kubernetes: unavailable[/b] — no kubeconfig" in note
        app.matrix_screen.query_one("#backend").value = "kubernetes"
        await pilot.pause()
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert app.matrix_worker is None  # refused, with the reason in a notification
        assert any("unavailable" in n.message for n in app._notifications)


async def test_matrix_save_and_load_round_trip(tmp_path, fixture_values):
    path = tmp_path / "m.yaml"
    app = BenchApp(results_dir=tmp_path, availability=FIXED_AVAILABILITY)
    async with app.run_test(size=SIZE) as pilot:
        await pick_strategies(pilot, app, {"fsdp", "zero3"})
        set_inputs(app, world_sizes="2, 4", seq_lens="32, 64", repeats="3")
        app.matrix_screen.query_one("#shape").value = "h100"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
        app.screen.query_one("#prompt-input", Input).value = str(path)
        await pilot.press("enter")
        await pilot.pause()
        saved = load_matrix(path)
        assert (saved.strategies, saved.world_sizes, saved.seq_lens, saved.repeats, saved.shape) == (
            ["fsdp", "zero3"], [2, 4], [32, 64], 3, "h100")
        set_inputs(app, world_sizes="1")
        await pilot.press("ctrl+o")
        await pilot.pause()
        app.screen.query_one("#prompt-input", Input).value = str(path)
        await pilot.press("enter")
        await pilot.pause()
        assert app.matrix_screen.query_one("#world_sizes", Input).value == "2, 4"
        assert app.matrix_screen.matrix() == saved


async def test_logs_follow_search_and_jump_to_error(tmp_path):
    app = BenchApp(results_dir=tmp_path, availability=FIXED_AVAILABILITY)
    lines = [f"step {i}" for i in range(200)]
    lines[50] = "the needle is here"
    lines[120] = "RuntimeError: rank 1 ran out of patience"
    async with app.run_test(size=SIZE) as pilot:
        app.post_message(SuiteEvent(ev.RunQueued("ddp-w2-s64-mb4-ga1-r0", 0, 1, {})))
        app.post_message(SuiteEvent(ev.RunStateChanged("ddp-w2-s64-mb4-ga1-r0", "running")))
        for line in lines:
            app.post_message(SuiteEvent(ev.RunLogLine("ddp-w2-s64-mb4-ga1-r0", line)))
        await pilot.press("f4")
        await pilot.pause(0.3)
        logs = app.logs_screen
        assert logs.query_one("#log").line_count == 200 and logs.follow
        await pilot.press("f")
        assert not logs.follow
        await pilot.press("slash")
        await pilot.press(*"needle")
        await pilot.press("enter")
        await pilot.pause()
        assert logs.match_at == 50
        await pilot.press("escape", "e")
        await pilot.pause()
        assert logs.match_at == 120 and "line 121" in str(logs.query_one("#log-title").content)
        # New lines keep arriving while the view stays where the person put it.
        top = logs.view.scroll_y
        app.post_message(SuiteEvent(ev.RunLogLine("ddp-w2-s64-mb4-ga1-r0", "late line")))
        await pilot.pause()
        assert logs.query_one("#log").line_count == 201 and logs.view.scroll_y == top
        await pilot.press("N")  # previous match of "needle", wrapping backwards from line 121
        await pilot.pause()
        assert logs.match_at == 50


async def test_logs_show_the_command_first_progress_compact_and_search_every_line(tmp_path):
    """A short log: line 1 (the launch command) is shown and found (it was "older than the last
    20000 lines shown" in a 41-line log); progress lines are one
    status line each, not raw JSON; scrolling up pauses follow and End resumes it."""
    app = BenchApp(results_dir=tmp_path, availability=FIXED_AVAILABILITY)
    run = "ddp-w2-s64-mb4-ga1-r0"
    progress = ('SHARDBENCH_PROGRESS {"step": 3, "steps": 30, "phase": "measure", "loss": 8.5, '
                '"step_time_s": 0.05, "tokens_per_s": 5120.0, "elapsed_s": 1.0, "eta_s": 1.35}')
    lines = ["$ mpirun -np 2 python -m shardbench.trainer --strategy ddp WARNING-in-the-command"]
    lines += [progress] * 20 + ["x" * 400] + [f"rank {i % 2}: line {i}" for i in range(59)]
    async with app.run_test(size=SIZE) as pilot:
        app.post_message(SuiteEvent(ev.RunQueued(run, 0, 1, {})))
        for line in lines:
            app.post_message(SuiteEvent(ev.RunLogLine(run, line)))
        await pilot.press("f4")
        await pilot.pause(0.3)
        logs = app.logs_screen
        view = logs.view
        assert view.line_count == 81 and view.lines[0].startswith("$ mpirun")
        assert view.lines[1] == "▸ step 3/30 measure · loss 8.5000 · 5,120 tok/s · 0.050 s/step · ETA 1s"
        assert view.virtual_size.width > 400  # the long line scrolls instead of being cut
        await pilot.press("slash", *"warning", "enter")
        await pilot.pause()
        assert logs.match_at == 0 and "line 1" in str(logs.query_one("#log-title").content)
        await pilot.press("escape")
        await pilot.pause()
        view.set_follow(True)
        await wait_until(pilot, lambda: view.scroll_y == view.max_scroll_y > 0, 10, "the view at the bottom")
        view.focus()
        await pilot.press("pageup")
        await pilot.pause()
        assert not logs.follow and "follow paused" in str(logs.query_one("#log-title").content)
        await pilot.press("end")
        await pilot.pause()
        assert logs.follow and view.scroll_y == view.max_scroll_y


async def test_results_table_sorts_and_shows_the_reports_verdicts(tmp_path):
    from tests.synthetic import record

    loss = [9.0, 8.5, 8.2, 8.1]
    recs = [record("ddp", 2, v, repeat=i, loss_per_step=loss, peak_memory_bytes=2 ** 29)
            for i, v in enumerate([900.0, 905.0, 895.0])]
    recs += [record("zero2", 2, v, repeat=i, loss_per_step=loss, peak_memory_bytes=2 ** 28)
             for i, v in enumerate([1200.0, 1210.0, 1190.0])]
    recs += [record("zero3", 2, v, repeat=i, loss_per_step=[9.0, 8.6, 8.3, 8.2])  # off the reference
             for i, v in enumerate([1500.0, 1505.0, 1495.0])]
    recs.append(record("fsdp", 2, 1.0, status="failed", error="boom"))
    write_results(tmp_path, recs)
    name = {r["strategy"]: without_repeat(r["run_id"]) for r in recs if r["status"] == "ok"}
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "result.json").write_text("[" * 50000)
    app = BenchApp(results_dir=tmp_path, availability=FIXED_AVAILABILITY)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: "result(s) in" in app.results_screen.source, 30, "the results")
        await settle(pilot)
        await pilot.press("f5")
        await pilot.pause(0.3)
        assert "(1 unreadable)" in app.results_screen.source
        table = app.results_screen.query_one("#results-table", DataTable)
        order = lambda: [table.get_row_at(i)[0].raw for i in range(table.row_count)]  # noqa: E731
        # one row per configuration (3 repeats folded), tok/s high first; failed and unreadable last
        assert order()[:3] == [name["zero3"], name["zero2"], name["ddp"]]
        assert set(order()[3:]) == {recs[-1]["run_id"], "corrupt"}
        assert table.get_cell(name["zero2"], "tokens_per_s").text == "1,200 [1,175, 1,225]"
        assert "bold red" in table.get_cell(name["zero3"], "tokens_per_s").style  # broken: red
        assert "nested too deeply" in table.get_cell("corrupt", "detail").text
        app.results_screen.sort_by("model_state_gib_per_rank", reverse=False)
        assert order()[0] == name["zero2"]  # 64 MiB vs ddp's 128 MiB and zero3's 256 MiB
        verdicts = str(app.results_screen.query_one("#winners").content)
        # the broken zero3 is fastest but never crowned; zero2's interval separates from ddp's
        assert "throughput @ 2 dev, tiny, seq 64, fp32, cpu:[/] not named: zero3 `" in verdicts
        assert "step time @ 2 dev" in verdicts


async def test_open_past_results_and_write_the_report(tmp_path):
    past = write_results(tmp_path / "past", [synthetic_record("ddp", 1, 600.0, 0.4),
                                             synthetic_record("fsdp", 1, 550.0, 0.3)])
    app = BenchApp(results_dir=tmp_path / "empty", availability=FIXED_AVAILABILITY)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f5")
        await wait_until(pilot, lambda: "0 result(s)" in app.results_screen.source, 30, "the empty dir")
        await pilot.press("o")
        await pilot.pause()
        app.screen.query_one("#prompt-input", Input).value = str(past)
        await pilot.press("enter")
        await wait_until(pilot, lambda: "2 result(s)" in app.results_screen.source, 30, "the past results")
        assert app.results_screen.query_one("#results-table", DataTable).row_count == 2
        await pilot.press("w")
        await wait_until(pilot, lambda: (past / "report" / "BENCHMARK_REPORT.md").exists(), 60, "the report")
        await settle(pilot)
        assert (past / "report" / "metrics.csv").read_text().count("\n") == 3  # header + 2 runs
        assert list((past / "report" / "plots").glob("*.png"))
        assert any("wrote" in n.message for n in app._notifications)


async def test_results_plots_cycle_through_the_reports_plots(tmp_path):
    """The right-hand plot shows each PNG plot's data in turn (p), skipping those with no data
    (no MFU on CPU); the left one is always tokens/s."""
    write_results(tmp_path, [synthetic_record(s, w, 900.0 * w, 0.5) for s in ("ddp", "zero2") for w in (1, 2)])
    app = BenchApp(results_dir=tmp_path, availability=FIXED_AVAILABILITY)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.results_screen.view.rows, 30, "the results")
        await pilot.press("f5")
        await pilot.pause()
        screen = app.results_screen
        assert screen.view.series["tokens_per_s"] and not screen.view.series["mfu"]
        seen = [screen.right_plot]
        for _ in range(3):
            await pilot.press("p")
            seen.append(screen.right_plot)
        assert seen == [1, 2, 3, 1]  # model state, step time, scaling efficiency; MFU skipped


@pytest.mark.slow
async def test_matrix_screen_plan_panel_predicts_each_run(tmp_path, fixture_values):
    """ctrl+l on the Matrix screen: the planner (a subprocess) predicts every configuration's
    peak memory per rank and fit; the panel shows one line per run."""
    matrix = MatrixSpec(strategies=["ddp", "zero3"], world_sizes=[1, 2], seq_lens=[64], repeats=1,
                        backend="local", shape="cpu", model="tiny")
    app = BenchApp(results_dir=tmp_path, matrix=matrix, availability=FIXED_AVAILABILITY)
    async with app.run_test(size=SIZE) as pilot:
        panel = app.matrix_screen.query_one("#plan", Static)
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: "MiB/rank" in str(panel.content), 300, "the plan panel")
        text = str(panel.content)
        assert all(f"{s} w{w} s64" in text for s in ("ddp", "zero3") for w in (1, 2)), text
