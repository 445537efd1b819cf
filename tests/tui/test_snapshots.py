"""Snapshot tests of every benchtui screen (pytest-textual-snapshot; update with --snapshot-update).

Content is deterministic: the shapes come from tests/tui/fixtures/values, backend availability is
fixed, runs and logs are fed as suite events with fixed times, results are synthetic records.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from shardbench.tui.app.app import BenchApp
from shardbench.tui.app.messages import ShowLogs, SuiteEvent
from shardbench.tui.app.screens.dialogs import Confirm
from shardbench.suite.execute import events as ev
from shardbench.suite.matrix.expand import MatrixSpec

from .conftest import FIXED_AVAILABILITY, settle, write_results

SIZES = {"80x24": (80, 24), "160x45": (160, 45)}
"""The smallest terminal benchtui must work in, and a large one (issue 24)."""
RUNS = ["ddp-w1-s64-mb4-ga1-r0", "ddp-w2-s64-mb4-ga1-r0", "zero2-w1-s64-mb4-ga1-r0", "zero2-w2-s64-mb4-ga1-r0"]


# Every field the Matrix screen shows, given: suite default changes must not move the snapshots.
MATRIX = MatrixSpec(strategies=["ddp", "fsdp", "zero2", "zero3"], world_sizes=[1, 2], seq_lens=[64],
                    micro_batch=4, grad_accum=1, global_batch=None, model="tiny", precision="auto",
                    steps=10, warmup_steps=3, repeats=1, launcher="auto", backend="local", shape="cpu",
                    results="results/benchtui")


@pytest.fixture(params=list(SIZES.values()), ids=list(SIZES))
def size(request) -> tuple[int, int]:
    return request.param


def make_app(results_dir="results") -> BenchApp:
    return BenchApp(results_dir=results_dir, matrix=MATRIX, availability=FIXED_AVAILABILITY)


def feed(app: BenchApp) -> None:
    """A matrix part-way through: two finished, one running (frozen clock), one queued."""
    post = lambda event: app.post_message(SuiteEvent(event))  # noqa: E731
    for i, run_id in enumerate(RUNS):
        post(ev.RunQueued(run_id, i, len(RUNS), {}))
    post(ev.RunStateChanged(RUNS[0], "running"))
    post(ev.RunProgress(RUNS[0], 5, 5, tokens_per_s=663.7))
    post(ev.RunStateChanged(RUNS[0], "collecting"))
    post(ev.RunStateChanged(RUNS[0], "ok"))
    post(ev.RunStateChanged(RUNS[1], "running"))
    post(ev.RunStateChanged(RUNS[1], "failed", "oom: CUDA out of memory"))
    post(ev.RunStateChanged(RUNS[2], "running"))
    post(ev.RunLogLine(RUNS[2], "$ deepspeed --hostfile hostfiles/local --launcher openmpi --module trainer "
                                "--strategy zero2 --model tiny --seq-len 64 --micro-batch 4 --grad-accum 1 "
                                "--steps 10 --warmup-steps 3 --precision auto --seed 1234 --device auto"))
    for step in (1, 2, 3):
        post(ev.RunLogLine(RUNS[2], 'SHARDBENCH_PROGRESS {"step": %d, "steps": 10, "phase": "warmup", '
                                    '"loss": 9.%d, "step_time_s": 0.1, "tokens_per_s": %d.0, "eta_s": 42.0}'
                           % (step, 9 - step, 500 + step)))
        post(ev.RunProgress(RUNS[2], step, 10, tokens_per_s=500.0 + step, loss=float(f"9.{9 - step}"), eta_s=42.0))
    post(ev.RunLogLine(RUNS[2], "RuntimeError: example error line"))
    post(ev.MatrixProgress(2, 4, 30.0, eta_s=75.0))


async def freeze_clock(app: BenchApp) -> None:
    """Fixed start/end times, so elapsed columns do not depend on when the test ran."""
    for i, row in enumerate(app.board.rows.values()):
        if row.started is not None:
            row.started, row.ended = 1000.0, 1000.0 + 12.0 * (i + 1)


def test_matrix_screen(snap_compare, fixture_values, size):
    assert snap_compare(make_app(), terminal_size=size)


def test_matrix_screen_with_problems(snap_compare, fixture_values, size):
    async def run_before(pilot):
        pilot.app.matrix_screen.query_one("#world_sizes").value = "1, 3, 16"
        pilot.app.matrix_screen.query_one("#global_batch").value = "8"
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)


def test_runs_screen(snap_compare, fixture_values, size):
    async def run_before(pilot):
        feed(pilot.app)
        await pilot.pause()
        await pilot.press("f3")
        await freeze_clock(pilot.app)
        pilot.app.runs_screen.redraw()
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)


def test_logs_screen(snap_compare, fixture_values, size):
    async def run_before(pilot):
        feed(pilot.app)
        await pilot.pause()
        pilot.app.post_message(ShowLogs(RUNS[2]))
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)


def test_results_screen(snap_compare, fixture_values, size, tmp_path, monkeypatch):
    """Configurations with 95% intervals, a flagged (yellow) and a broken (red) one, a failed run and
    an unreadable result.json as rows, the verdicts, plots with error bars."""
    from tests.synthetic import record

    monkeypatch.chdir(tmp_path)  # the screen names its results dir: keep it the same every run
    loss, off = [9.0, 8.5, 8.2, 8.1], [9.0, 8.6, 8.3, 8.2]
    recs = []
    for strategy, world, values, curve in [("ddp", 1, [660.0, 650.0, 670.0], loss),
                                           ("ddp", 2, [1250.0, 1240.0, 1260.0], loss),
                                           ("zero2", 1, [610.0, 640.0, 580.0], loss),
                                           ("zero2", 2, [1600.0, 1610.0, 1590.0], loss),  # eff 1.31: flagged
                                           ("zero3", 2, [1300.0, 1305.0, 1295.0], off)]:  # broken loss
        recs += [record(strategy, world, v, repeat=i, loss_per_step=curve,
                        peak_memory_bytes=2 ** 30 // (world if strategy != "ddp" else 1))
                 for i, v in enumerate(values)]
    recs.append(record("fsdp", 2, 1.0, status="failed", error="RuntimeError: boom"))
    write_results(tmp_path / "results", recs)
    (tmp_path / "results" / "corrupt").mkdir()
    (tmp_path / "results" / "corrupt" / "result.json").write_text("{half")

    async def run_before(pilot):
        while "result(s) in" not in pilot.app.results_screen.source:
            await pilot.pause(0.1)
        await settle(pilot)
        await pilot.press("f5")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)


def test_runs_screen_while_a_run_starts(snap_compare, fixture_values, size, monkeypatch):
    """Before the first step a run says "starting" and its elapsed time counts."""
    # The board's clock only (Textual keeps the real one): a loaded machine rendered "16s" for 14.
    monkeypatch.setattr("shardbench.tui.app.board.time", SimpleNamespace(monotonic=lambda: 1014.2))

    async def run_before(pilot):
        pilot.app.post_message(SuiteEvent(ev.RunQueued(RUNS[0], 0, 2, {})))
        pilot.app.post_message(SuiteEvent(ev.RunQueued(RUNS[1], 1, 2, {})))
        pilot.app.post_message(SuiteEvent(ev.RunStateChanged(RUNS[0], "running")))
        await pilot.pause()
        await pilot.press("f3")
        pilot.app.board.rows[RUNS[0]].started = 1000.0
        pilot.app.runs_screen.redraw()
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)


def test_quit_with_runs_in_progress_asks_first(snap_compare, fixture_values, size):
    async def run_before(pilot):
        pilot.app.push_screen(Confirm("2 run(s) not finished: quit and stop them?"))
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)


def test_help_screen(snap_compare, fixture_values, size):
    assert snap_compare(make_app(), terminal_size=size, press=["f1"])


def test_matrix_screen_when_every_run_is_done(snap_compare, fixture_values, size, tmp_path, monkeypatch):
    """Resume would skip every run: the count says so instead of "8 run(s) ready"."""
    from shardbench.trainer.record import write_atomic
    from shardbench.suite.matrix.expand import expand
    from tests.synthetic import record

    monkeypatch.chdir(tmp_path)
    specs, errors = expand(MATRIX)
    assert not errors
    for s in specs:
        write_atomic(s.to_dict(), f"{MATRIX.results}/{s.run_id}/spec.json")
        write_atomic(record(s.strategy, s.world_size, 500.0, repeat=s.repeat)
                     | {"run_id": s.run_id, "config_id": s.config_id, "steps": s.steps,
                        "warmup_steps": s.warmup_steps, "seed": s.seed},
                     f"{MATRIX.results}/{s.run_id}/result.json")
    assert snap_compare(make_app(), terminal_size=size)


def test_results_screen_opened_on_a_report_directory(snap_compare, fixture_values, size, tmp_path, monkeypatch):
    """`benchtui --results reports/default`: no results there, and the screen says where they are."""
    from tests.synthetic import record

    monkeypatch.chdir(tmp_path)
    write_results(tmp_path / "results" / "default", [record("ddp", 1, 500.0)])
    (tmp_path / "reports" / "default").mkdir(parents=True)
    (tmp_path / "reports" / "default" / "BENCHMARK_REPORT.md").write_text(
        "# Benchmark report\n\nGenerated 2026-11-24T20:00:00+00:00 from `results/default` (1 runs).\n")

    async def run_before(pilot):
        while "result(s) in" not in pilot.app.results_screen.source:
            await pilot.pause(0.1)
        await settle(pilot)
        await pilot.press("f5")
        await pilot.pause()

    assert snap_compare(make_app("reports/default"), terminal_size=size, run_before=run_before)


def test_results_screen_with_drifts_and_axes(snap_compare, fixture_values, tmp_path, monkeypatch):
    """The loss check's "Settings that change the trajectory" and "Settings compared as axes" below
    the verdicts (PowerSGD against the exact hook, 3 repeats each); one size: the sections' layout."""
    from tests.synthetic import record

    monkeypatch.chdir(tmp_path)
    loss = [9.0, 8.9, 8.8, 8.7, 8.6, 8.5]
    drifted = [x * (1 + 1e-3 * max(0, k - 2)) for k, x in enumerate(loss)]
    recs = [record(world_size=2, tokens_per_s=tps + 10 * r, repeat=r, settings=settings, loss_per_step=curve,
                   config_id=config, run_id=f"ddp-w2-{config}-r{r}", **settings)
            for config, tps, curve, settings in [("none", 1000, loss, {"ddp_comm_hook": "none"}),
                                                 ("psgd", 1100, drifted, {"ddp_comm_hook": "powersgd",
                                                                          "powersgd_rank": 1})]
            for r in range(3)]
    write_results(tmp_path / "results", recs)

    async def run_before(pilot):
        while "result(s) in" not in pilot.app.results_screen.source:
            await pilot.pause(0.1)
        await settle(pilot)
        await pilot.press("f5")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=SIZES["160x45"], run_before=run_before)
