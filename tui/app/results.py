"""What the Results screen shows, computed off the UI thread from result records.

Uses the suite's own metrics (the metrics.csv columns and derived scaling/cost) and report
(winners by category) so the TUI and BENCHMARK_REPORT.md never disagree. Those import pandas,
so this module is only imported inside a worker, never at start-up.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# (CSV column, table header, format): the CSV's key columns, in the order a reader compares them.
KEY_COLUMNS: list[tuple[str, str, str]] = [
    ("run_id", "run", "{}"),
    ("status", "status", "{}"),
    ("strategy", "strategy", "{}"),
    ("world_size", "devices", "{:.0f}"),
    ("seq_len", "seq", "{:.0f}"),
    ("global_batch", "batch", "{:.0f}"),
    ("precision", "prec", "{}"),
    ("tokens_per_s", "tok/s", "{:,.1f}"),
    ("tokens_per_s_per_device", "tok/s/dev", "{:,.1f}"),
    ("step_time_mean_s", "step s", "{:.4f}"),
    ("peak_memory_gib", "mem GiB", "{:.3f}"),
    ("model_state_gib_per_rank", "state GiB", "{:.3f}"),
    ("scaling_efficiency", "scaling", "{:.2f}"),
    ("mfu", "MFU", "{:.2%}"),
    ("cost_usd_per_mtok", "$/Mtok", "{:.4g}"),
]


@dataclass
class ResultsView:
    headers: list[str] = field(default_factory=list)
    rows: list[tuple[str, list[Any]]] = field(default_factory=list)
    """(run id, raw cell values in KEY_COLUMNS order): raw so the table sorts numbers as numbers."""
    winners: list[str] = field(default_factory=list)
    throughput: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """strategy -> [(devices, mean tokens/s)] for the plot."""
    memory: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """strategy -> [(devices, mean peak GiB per device)]."""


def present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def fmt_cell(value: Any, spec: str) -> str:
    if not present(value):
        return ""
    try:
        return spec.format(value)
    except (ValueError, TypeError):
        return str(value)


def compute(records: list[dict]) -> ResultsView:
    """Table rows, winner lines and plot series for these records (any status)."""
    from tui.suite import metrics, report

    view = ResultsView(headers=[h for _, h, _ in KEY_COLUMNS])
    if not records:
        return view
    df = metrics.to_frame(records)
    for _, row in df.iterrows():
        view.rows.append((str(row["run_id"]), [_plain(row.get(c)) for c, _, _ in KEY_COLUMNS]))
    summary = metrics.summarize(df)
    view.winners = [_winner_line(w) for w in report.winners(summary)]
    view.throughput = _series(summary, "tokens_per_s_mean")
    view.memory = _series(summary, "peak_memory_gib_mean")
    return view


def _plain(value: Any) -> Any:
    """numpy scalars -> Python numbers; NaN -> None."""
    if hasattr(value, "item"):
        value = value.item()
    return value if present(value) else None


def _winner_line(w: dict) -> str:
    cat, best, second = w["category"], w["best"], w["second"]
    col = f"{cat.metric}_mean"
    margin = w["margin_pct"]
    noise = " (within noise)" if w.get("within_noise") else ""
    return (f"{cat.name} @ {int(best['world_size'])} dev: {best['strategy']} "
            f"{cat.fmt.format(best[col])} {cat.unit}".rstrip()
            + f", {margin:.1f}% ahead of {second['strategy']}{noise}")


def _series(summary, column: str) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    if summary.empty or column not in summary:
        return out
    for strategy, group in summary.groupby("strategy", sort=True):
        points = sorted((float(x), float(y)) for x, y in zip(group["world_size"], group[column]) if present(y))
        if points:
            # Several configs at one world size (e.g. two seq lens): plot their mean.
            merged: dict[float, list[float]] = {}
            for x, y in points:
                merged.setdefault(x, []).append(y)
            out[str(strategy)] = [(x, sum(ys) / len(ys)) for x, ys in sorted(merged.items())]
    return out
