"""Scaling efficiency: eff(N) = tok/s(N) / (tok/s(base) x N / base).

The base of a configuration is the run at the smallest world size whose measured settings are
all equal except world size (suite/analyze/groups.py base_key) and whose batch follows the same rule:
the same grad-accum (the global batch grows with the world size) or, failing that, the same
global batch (grad-accum derived from the world size). Nothing else may differ: the old base
pooled grad-accum, threads, activation checkpointing and compile (0.68 [0.46, 0.90] where the
truth was 0.95).
A configuration whose group has ok runs at only one world size has no efficiency, only a note.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from shardbench.suite.analyze import groups
from shardbench.suite.analyze import rows as metrics
from shardbench.suite.analyze.stats import estimate, exact, ratio


def _equal(a: Any, b: Any) -> bool:
    """Equal as pandas compares a column with a value: a missing value (None, NaN) equals nothing."""
    return a is not None and b is not None and a == b


class _Runs:
    """The columns fill reads, as plain lists with the frame's row labels: a pandas filter per
    configuration (1,000 configurations at 5,000 runs) was most of the report's time."""

    COLS = ("status", "tokens_per_s", "world_size", "grad_accum", "global_batch", "config_id", "strategy",
            "run_id", "error", "settings")

    def __init__(self, runs: pd.DataFrame):
        self.labels = runs.index.tolist()
        self.col = {c: runs[c].tolist() for c in self.COLS}
        self.col["config_id"] = runs["config_id"].astype(str).tolist()

    def ok(self, i: int) -> bool:
        tps, world = self.col["tokens_per_s"][i], self.col["world_size"][i]
        return self.col["status"][i] == "ok" and not pd.isna(tps) and not pd.isna(world)


def _note(strategy: Any, base: int, runs: _Runs, rows: list[int]) -> str:
    if not rows:
        return f"no {strategy} run at {base} dev with the same settings and the same grad-accum or global batch"
    col = runs.col
    statuses = ", ".join(f"{col['run_id'][i]} {col['status'][i]}"
                         + (f" ({str(col['error'][i])[:80]})" if col["error"][i] else "") for i in rows[:3])
    return f"base {strategy} at {base} dev has no ok run: {statuses}"


def _one_world_size(out: dict[str, dict], runs: _Runs, rows: list[int], by_config: dict[str, Any], world: int) -> None:
    """No efficiency where a single world size was measured: 1.00 "by definition" read as a
    measured scaling (and was plotted at 1.0)."""
    note = f"only {world} dev measured: scaling needs ok runs at two world sizes"
    out["scaling_note"].update(dict.fromkeys((runs.labels[i] for i in rows), note))
    for config_id in dict.fromkeys(runs.col["config_id"][i] for i in rows):
        c = by_config.get(config_id)
        if c is not None:
            c.efficiency, c.efficiency_note = None, note


def _base_rows(runs: _Runs, base_rows: list[int], ga: Any, gb: Any) -> list[int]:
    """The base's runs with the same grad-accum or, failing that, the same global batch."""
    same_ga = [i for i in base_rows if _equal(runs.col["grad_accum"][i], ga)]
    return same_ga or [i for i in base_rows if _equal(runs.col["global_batch"][i], gb)]


def fill(df: pd.DataFrame, configs: list[Any]) -> None:
    """scaling_* columns of df's runs and efficiency / base_world_size / efficiency_note of configs."""
    frame = df[(df["status"] != metrics.UNREADABLE) & df["world_size"].notna()]
    if frame.empty:
        return
    runs = _Runs(frame)
    col, labels = runs.col, runs.labels
    by_config = {str(c.config_id): c for c in configs}
    by_base: dict[str, list[int]] = {}
    for i, s in enumerate(col["settings"]):
        by_base.setdefault(groups.base_key(s), []).append(i)
    # Collected per row and written once per column at the end: a `df.loc[...] =` per
    # configuration copied the whole frame each time.
    out: dict[str, dict] = {"scaling_note": {}, "scaling_base_world_size": {}, "scaling_efficiency": {}}
    for rows in by_base.values():
        base = int(min(col["world_size"][i] for i in rows))
        ok = [i for i in rows if runs.ok(i)]
        if len({col["world_size"][i] for i in ok}) < 2:
            _one_world_size(out, runs, rows, by_config, base)
            continue
        base_rows = [i for i in rows if col["world_size"][i] == base]
        by_id: dict[str, list[int]] = {}
        for i in rows:
            by_id.setdefault(col["config_id"][i], []).append(i)
        for config_id, members in by_id.items():
            first = members[0]
            chosen = _base_rows(runs, base_rows, col["grad_accum"][first], col["global_batch"][first])
            base_est = estimate(col["tokens_per_s"][i] for i in chosen if runs.ok(i))
            out["scaling_base_world_size"].update(dict.fromkeys((labels[i] for i in members), base))
            c = by_config.get(config_id)
            if base_est is None:
                note = _note(col["strategy"][first], base, runs, chosen)
                out["scaling_note"].update(dict.fromkeys((labels[i] for i in members), note))
                if c is not None:
                    c.base_world_size, c.efficiency_note = base, note
                continue
            out["scaling_efficiency"].update(
                (labels[i], col["tokens_per_s"][i] / (base_est.mean * col["world_size"][i] / base))
                for i in members if runs.ok(i))
            if c is None:
                continue
            c.base_world_size = base
            if int(c.world_size) == base:
                c.efficiency, c.efficiency_note = exact(c.n, 1.0), "base (1.00 by definition)"
            else:
                c.efficiency = ratio(c.est["tokens_per_s"], base_est, scale=base / c.world_size)
    for name, values in out.items():
        if values:
            old = df[name] if name in df.columns else pd.Series(None, index=df.index, dtype=object)
            df[name] = [values.get(i, v) for i, v in zip(df.index, old)]
