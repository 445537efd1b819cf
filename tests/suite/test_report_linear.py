"""The report's work grows linearly with the records (issue 35): counted, never timed.

The work of `shardbench report` is counted as Python function calls (sys.settrace 'call' events:
the report's own code and the libraries it drives, pandas included) on 100, 200 and 400 records
built alike (each block of 100 records is 20 configurations at one more sequence length, each
with a plan prediction, as `shardbench run` writes them). Linear work adds the same amount per
record: the step from 200 to 400 records costs twice the step from 100 to 200. A pass over every
record for each record (the plan section's calibration once did it: 17 s at 5,000 records) makes
that ratio about 3 at these sizes. Matplotlib's own calls are left out: it draws what the plots
ask, one artist collection per plot above plots.MAX_LEGEND lines, fewer lines than that each
drawn by itself (both within each plot's bounded size, but the switch would skew the count).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import shardbench
from shardbench.suite.report.markdown import report_from_records
from tests import synthetic

OURS = str(Path(shardbench.__file__).parent)
"""shardbench's code (as imported, through the package's links): its lines are counted too."""
STRATEGIES, WORLDS, REPEATS = ["ddp", "fsdp", "zero1", "zero2", "zero3"], [1, 2, 4, 8], 5


def _records(blocks: int) -> list[dict]:
    out = []
    for b in range(blocks):
        for strategy in STRATEGIES:
            for world in WORLDS:
                for rep in range(REPEATS):
                    r = synthetic.record(strategy, world, 1000.0 * world * (1 + 0.01 * rep), seq_len=32 * (b + 1),
                                         repeat=rep, usd_per_gpu_hour=2.0)
                    r["loss_per_step"] = [9.0 - 0.01 * i for i in range(20)]
                    r["prediction"] = {
                        "input": {"strategy": strategy, "world_size": world, "model": "tiny", "seq_len": 32 * (b + 1),
                                  "micro_batch": 1, "grad_accum": 1, "precision": "fp32", "device": "cpu"},
                        "model_state_bytes": 40 * 2 ** 20, "tensor_peak_bytes": 66 * 2 ** 20,
                        "peak_bytes": 66 * 2 ** 20, "comm_per_step": {"all_reduce": {"calls": 2.0, "bytes": 10e6}},
                        "fits": None, "links": {}, "step_time": {"seconds": None}, "assumptions": ["one"]}
                    r["_source"] = f"{r['run_id']}/result.json"
                    out.append(r)
    return out


def _calls(records: list[dict], out_dir) -> int:
    """Python calls made while the whole report is written, matplotlib's own left out."""
    count, drawing = [0], [0]

    def lines(frame, event, arg):  # a loop's turns are work too (a scan calls nothing per record)
        if event == "line":
            count[0] += 1
        return lines

    def leave(frame, event, arg):
        if event == "return":
            drawing[0] -= 1
        return None

    def tracer(frame, event, arg):
        if drawing[0]:
            return None
        if "matplotlib" in frame.f_code.co_filename:
            drawing[0] += 1
            return leave  # its 'return' ends the drawing
        count[0] += 1
        return lines if frame.f_code.co_filename.startswith(OURS) else None

    sys.settrace(tracer)
    try:
        report_from_records(records, out_dir, out_dir)
    finally:
        sys.settrace(None)
    return count[0]


@pytest.mark.slow  # three reports under a tracer: ~30 s on 2 cores
def test_the_report_does_the_same_work_per_added_record(tmp_path):
    _calls(_records(1), tmp_path / "warm-up")  # first-use work (imports, caches) counted once, here
    work = [_calls(_records(blocks), tmp_path / f"r{blocks}") for blocks in (1, 2, 4)]
    first, second = work[1] - work[0], work[2] - work[1]
    assert first > 0
    # Deterministic counts: 1.99 here; the quadratic calibration of the plan section made 2.27.
    assert second / first < 2.15, f"work at 100, 200, 400 records {work}: {second / first:.3f} x the step before"
