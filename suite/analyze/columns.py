"""How a metrics.csv column is read from a result record (any schema version this report knows):
the small readers suite/analyze/rows.py COLUMNS is built from, and the number checks they share.
A value that is not a measurement (NaN, inf, above MAX_PLAUSIBLE) reads as missing."""
from __future__ import annotations

import math
import re
from typing import Any, Callable

from shardbench.suite.analyze.stats import finite

GIB = 1024 ** 3
# Above this no number in a record is a measurement (1e18 B/s, bytes, tok/s); such values would
# overflow sums and matplotlib (1.7e308 + 1.7e308 = inf).
MAX_PLAUSIBLE = 1e18


def _number(x: Any) -> bool:
    return finite(x) and abs(x) <= MAX_PLAUSIBLE


def _num_text(x: float) -> str:
    return f"{x:g}"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _get(*path: str) -> Callable[[dict], Any]:
    def get(record: dict) -> Any:
        value: Any = record
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value
    return get


_REPEAT = re.compile(r"-r(\d+)(?=-|$)")


def _repeat(record: dict) -> Any:
    """The record's `repeat` (schema 2), else the -rN part of a schema-1 run id."""
    if isinstance(record.get("repeat"), int):
        return record["repeat"]
    m = _REPEAT.search(str(record.get("run_id") or ""))
    return int(m.group(1)) if m else 0


def without_repeat(run_id: str) -> str:
    """The run id without its -rN part: the readable name of its configuration."""
    return _REPEAT.sub("", run_id, count=1)


def _config_id(record: dict) -> str:
    """The record's `config_id` (schema 2), else the run id without its -rN part."""
    if isinstance(record.get("config_id"), str) and record["config_id"]:
        return record["config_id"]
    return without_repeat(str(record.get("run_id") or ""))


def _gib(value: Any) -> Any:
    return value / GIB if finite(value) else None


def _state_part(part: str) -> Callable[[dict], Any]:
    """One part of the model-state breakdown (GiB) on the rank that holds the most."""
    def get(record: dict) -> Any:
        ranks = [r for r in record.get("model_state") or [] if isinstance(r, dict)]
        if not ranks:
            return None
        top = max(ranks, key=lambda r: r.get("total_bytes") if _number(r.get("total_bytes")) else -1)  # type: ignore[arg-type,return-value]
        return _gib(top.get(f"{part}_bytes"))
    return get


def _state_location(where: str) -> Callable[[dict], Any]:
    """Model state in the device's memory or the host's (offload), max over ranks, GiB (records
    before memory by location: all of it on the device). On a CPU run host and device memory
    are one, so the device holds all of it, whatever the layout places on the host: offload
    there saves nothing and must not win a memory verdict."""
    def get(record: dict) -> Any:
        ranks = [r for r in record.get("model_state") or [] if isinstance(r, dict) and _number(r.get("total_bytes"))]
        if not ranks:
            return _gib(record.get("model_state_bytes_per_rank")) if where == "device" else None
        host: list[float] = [r["host_bytes"] if _number(r.get("host_bytes")) else 0 for r in ranks]
        if where == "host":
            return _gib(max(host))
        one_memory = record.get("device") == "cpu"
        return _gib(max(r["total_bytes"] - (0 if one_memory else h) for r, h in zip(ranks, host)))
    return get


def _rank_max(record: dict, key: str) -> Any:
    """Largest `key` over the record's per-rank `memory` list (schema 2; a single dict is read too)."""
    memory = record.get("memory")
    ranks = [memory] if isinstance(memory, dict) else memory if isinstance(memory, list) else []
    values = [m.get(key) for m in ranks if isinstance(m, dict) and _number(m.get(key))]
    return max(values) if values else None  # type: ignore[type-var]


def _train_peak(record: dict) -> Any:
    """GPU training peak, max over ranks: memory[].train_peak_bytes (schema 2), else a schema-1 GPU peak."""
    peak = _rank_max(record, "train_peak_bytes")
    if peak is None and record.get("schema_version") == 1 and record.get("device") == "cuda":
        peak = record.get("peak_memory_bytes")
    return _gib(peak)


def _rss(record: dict) -> Any:
    """Process RSS, max over ranks: memory[].rss_peak_bytes (schema 2), else peak_memory[].rss_bytes."""
    rss = _rank_max(record, "rss_peak_bytes")
    if rss is None:
        old = [m.get("rss_bytes") for m in record.get("peak_memory") or [] if isinstance(m, dict)]
        rss = max([v for v in old if _number(v)], default=None)  # type: ignore[type-var]
    return _gib(rss)


def _comm_ops(record: dict) -> dict[str, dict]:
    ops = record.get("comm_per_step")
    return {str(k): v for k, v in ops.items() if isinstance(v, dict)} if isinstance(ops, dict) else {}


def _comm_total(key: str) -> Callable[[dict], Any]:
    def get(record: dict) -> Any:
        values = [v.get(key) for v in _comm_ops(record).values() if _number(v.get(key))]
        return math.fsum(values) if values else None  # type: ignore[arg-type]
    return get


def _comm_text(record: dict) -> Any:
    """'all_reduce 2 x 4.8 MB; broadcast ...', largest bytes first (empty when not measured)."""
    ops = [(k, v) for k, v in _comm_ops(record).items() if _number(v.get("bytes"))]
    if not ops:
        return None
    ops.sort(key=lambda kv: -kv[1]["bytes"])
    return "; ".join(f"{k} {_num_text(v.get('calls'))} x {fmt_bytes(v['bytes'] / v['calls'])}"  # type: ignore[arg-type]
                     if _number(v.get("calls")) and v["calls"] else f"{k} {fmt_bytes(v['bytes'])}"
                     for k, v in ops)


def _affinity(record: dict) -> Any:
    aff = record.get("cpu_affinity")
    if not isinstance(aff, list) or not aff:
        return None
    return " ".join(",".join(str(c) for c in cores) if isinstance(cores, list) else str(cores) for cores in aff)


def _model_key(record: dict) -> Any:
    model = record.get("model")
    if not isinstance(model, dict):
        return None
    return " ".join(f"{k}={model[k]}" for k in sorted(model))
