"""Records held in memory for a report or the Results screen, without per-step lists of Python
floats: 5,000 records of 1,000 steps held ~10 million float objects (32 bytes each with the list
slot) and peaked at 670 MB. The files are never changed; only the in-memory copy is compacted,
right after each file is parsed, so that at most one full record is alive at a time.

- `loss_per_step` becomes an array('d') (8 bytes a step; anything not a number is NaN, as
  metrics.loss_curve reads it): the loss check needs every step.
- `step_time_s.all` is dropped: the report and the screen use the mean, p50 and p90 beside it,
  and the count is kept as `step_time_s.n`.
"""
from __future__ import annotations

import math
from array import array
from typing import Any


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def compact(record: dict[str, Any]) -> dict[str, Any]:
    losses = record.get("loss_per_step")
    if isinstance(losses, list) and losses:
        record["loss_per_step"] = array("d", map(_num, losses))
    times = record.get("step_time_s")
    if isinstance(times, dict) and isinstance(times.get("all"), list):
        times = dict(times)
        times["n"] = len(times.pop("all"))
        record["step_time_s"] = times
    return record
