"""Records held in memory for a report or the Results screen, without per-step lists of Python
floats: 5,000 records of 1,000 steps held ~10 million float objects (32 bytes each with the list
slot) and peaked at 670 MB. The files are never changed; only the in-memory copy is compacted,
right after each file is parsed, so that at most one full record is alive at a time.

- `loss_per_step` becomes an array('d') (8 bytes a step; anything not a number is NaN, as
  metrics.loss_curve reads it): the loss check needs every step.
- `step_time_s.all` is dropped: the report and the screen use the mean, p50 and p90 beside it,
  and the count is kept as `step_time_s.n`.
- `grad_norm_per_step` becomes an array('d') too (losscheck.curve reads it so).
- Every dict key and string value is shared with the equal ones of the records read before (a
  dict of the reader's): json.loads makes new objects for each file, and 5,000 records held
  the same keys, versions, settings and plan assumptions 5,000 times (94 MB -> 42 MB).
"""
from __future__ import annotations

import math
import sys
from array import array
from typing import Any


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def _shared(value: Any, strings: dict[str, str]) -> Any:
    """value with its dicts and lists rebuilt around the first equal copy of every string."""
    if isinstance(value, str):
        return strings.setdefault(value, value)
    if isinstance(value, dict):
        return {sys.intern(k) if isinstance(k, str) else k: _shared(v, strings) for k, v in value.items()}
    if isinstance(value, list):
        return [_shared(v, strings) for v in value]
    return value


def compact(record: dict[str, Any], strings: dict[str, str] | None = None) -> dict[str, Any]:
    """The record to hold in memory (see the module docstring); `strings`: the reader's shared
    strings, one dict for all the records it reads."""
    for key in ("loss_per_step", "grad_norm_per_step"):
        values = record.get(key)
        if isinstance(values, list) and values:
            record[key] = array("d", map(_num, values))
    times = record.get("step_time_s")
    if isinstance(times, dict) and isinstance(times.get("all"), list):
        times = dict(times)
        times["n"] = len(times.pop("all"))
        record["step_time_s"] = times
    if strings is None:
        return record
    try:
        return _shared(record, strings)
    except RecursionError:  # nested deeper than the walk goes (json.loads went deeper): kept as read
        return record
