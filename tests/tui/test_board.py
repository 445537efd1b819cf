"""The app's run board (pure Python): start-up state and a matrix ETA that follows the rows."""
from __future__ import annotations

from shardbench.tui.app.board import RunBoard
from shardbench.suite.execute import events as ev


def board_with(states: list[str]) -> RunBoard:
    board = RunBoard()
    for i, state in enumerate(states):
        board.apply(ev.RunQueued(f"run{i}", i, len(states), {}))
        if state != "queued":
            board.apply(ev.RunStateChanged(f"run{i}", state))
    return board


def test_a_run_without_a_step_is_starting():
    board = board_with(["running"])
    assert board.rows["run0"].state_text() == "starting"
    board.apply(ev.RunProgress("run0", 1, 30))
    assert board.rows["run0"].state_text() == "running step 1/30"


def test_matrix_eta_follows_a_cancel():
    board = board_with(["ok", "running", "queued", "queued"])
    first = board.rows["run0"]
    first.started, first.ended = 100.0, 110.0  # one run took 10 s
    board.rows["run1"].started = 105.0
    board.apply(ev.RunProgress("run1", 3, 10, eta_s=4.0))
    assert board.eta_s(now=110.0) == 2 * 10.0 + 4.0
    board.apply(ev.RunStateChanged("run3", "cancelled", "cancelled by the user before the run started"))
    assert board.eta_s(now=110.0) == 1 * 10.0 + 4.0  # the frozen "matrix ETA" of the issue moved
    board.apply(ev.RunStateChanged("run1", "cancelled"))
    board.rows["run1"].ended = 111.0
    assert board.eta_s(now=111.0) == 10.0  # a cancelled run's time does not count as a run's length


def test_no_eta_before_a_run_ended():
    assert board_with(["running", "queued"]).eta_s() is None


def test_live_loss_then_the_records():
    """The Runs screen's loss column: the progress lines' loss while the run lives (what benchtui
    already parses from them), the record's final (rank-averaged) loss once it has ended."""
    from shardbench.tui.app.screens.runs import COLUMNS, cells

    board = RunBoard()
    board.apply(ev.RunQueued("run0", 0, 1))
    board.apply(ev.RunStateChanged("run0", "running"))
    row = board.apply(ev.RunProgress("run0", 3, 10, tokens_per_s=1500.0, loss=9.25))
    shown = dict(zip((key for _, key in COLUMNS), cells(row)))
    assert (shown["tps"], shown["loss"]) == ("1,500.0", "9.2500")
    board.apply(ev.RunFinished("run0", {"tokens_per_s": 1400.0, "final_loss": 9.125}))
    assert dict(zip((key for _, key in COLUMNS), cells(row)))["loss"] == "9.1250"
