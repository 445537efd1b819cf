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


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["status"] == "ok") & df["tokens_per_s"].notna() & df["world_size"].notna()]


def _base_rows(base_runs: pd.DataFrame, ga: Any, gb: Any) -> pd.DataFrame:
    same_ga = base_runs[base_runs["grad_accum"] == ga]
    return same_ga if len(same_ga) else base_runs[base_runs["global_batch"] == gb]


def _note(strategy: Any, base: int, rows: pd.DataFrame) -> str:
    if rows.empty:
        return f"no {strategy} run at {base} dev with the same settings and the same grad-accum or global batch"
    statuses = ", ".join(f"{r['run_id']} {r['status']}" + (f" ({str(r['error'])[:80]})" if r["error"] else "")
                         for _, r in rows.head(3).iterrows())
    return f"base {strategy} at {base} dev has no ok run: {statuses}"


def _one_world_size(out: dict[str, dict], group: pd.DataFrame, by_config: dict[str, Any], world: int) -> None:
    """No efficiency where a single world size was measured: 1.00 "by definition" read as a
    measured scaling (and was plotted at 1.0)."""
    note = f"only {world} dev measured: scaling needs ok runs at two world sizes"
    out["scaling_note"].update(dict.fromkeys(group.index, note))
    for config_id in set(group["config_id"].astype(str)):
        c = by_config.get(config_id)
        if c is not None:
            c.efficiency, c.efficiency_note = None, note


def fill(df: pd.DataFrame, configs: list[Any]) -> None:
    """scaling_* columns of df's runs and efficiency / base_world_size / efficiency_note of configs."""
    runs = df[(df["status"] != metrics.UNREADABLE) & df["world_size"].notna()]
    if runs.empty:
        return
    by_config = {str(c.config_id): c for c in configs}
    # Collected per row and written once per column at the end: a `df.loc[...] =` per
    # configuration copied the whole frame each time (5,000 runs: most of the report's time).
    out: dict[str, dict] = {"scaling_note": {}, "scaling_base_world_size": {}, "scaling_efficiency": {}}
    for _, group in runs.groupby(runs["settings"].map(groups.base_key), sort=False):
        base = int(group["world_size"].min())
        if _ok(group)["world_size"].nunique() < 2:
            _one_world_size(out, group, by_config, base)
            continue
        base_runs = group[group["world_size"] == base]
        for config_id, rows in group.groupby(group["config_id"].astype(str), sort=False):
            first = rows.iloc[0]
            chosen = _base_rows(base_runs, first["grad_accum"], first["global_batch"])
            base_est = estimate(_ok(chosen)["tokens_per_s"])
            out["scaling_base_world_size"].update(dict.fromkeys(rows.index, base))
            c = by_config.get(config_id)
            if base_est is None:
                note = _note(first["strategy"], base, chosen)
                out["scaling_note"].update(dict.fromkeys(rows.index, note))
                if c is not None:
                    c.base_world_size, c.efficiency_note = base, note
                continue
            ok = _ok(rows)
            out["scaling_efficiency"].update((ok["tokens_per_s"] / (base_est.mean * ok["world_size"] / base)).to_dict())
            if c is None:
                continue
            c.base_world_size = base
            if int(c.world_size) == base:
                c.efficiency, c.efficiency_note = exact(c.n, 1.0), "base (1.00 by definition)"
            else:
                c.efficiency = ratio(c.est["tokens_per_s"], base_est, scale=base / c.world_size)
    for col, values in out.items():
        if values:
            old = df[col] if col in df.columns else pd.Series(None, index=df.index, dtype=object)
            df[col] = [values.get(i, v) for i, v in zip(df.index, old)]
