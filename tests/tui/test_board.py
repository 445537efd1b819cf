"""The app's run board (pure Python): start-up state and a matrix ETA that follows the rows."""
from __future__ import annotations

from tui.app.board import RunBoard
from tui.suite import events as ev


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
