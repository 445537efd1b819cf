"""What the Results screen shows, computed off the UI thread from result records.

A view of suite/analyze/analysis.py, the analysis BENCHMARK_REPORT.md is written from: the same
intervals, flags, broken runs and verdicts (one analysis, two views). One row per configuration
(its ok repeats folded into mean and 95% interval), then one per run that did not finish ok or
whose result.json is unreadable, with the reason. The suite imports pandas, so this module is
imported inside a worker, never at start-up.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.markup import escape

from shardbench.suite.analyze.stats import Estimate, finite

# (column key, header, format of a number): the order a reader compares them in.
COLUMNS: list[tuple[str, str, str]] = [
    ("name", "configuration / run", "{}"),
    ("status", "status", "{}"),
    ("strategy", "strategy", "{}"),
    ("world_size", "dev", "{:.0f}"),
    ("seq_len", "seq", "{:.0f}"),
    ("n", "n", "{:.0f}"),
    ("tokens_per_s", "tok/s ±95%", "{:,.0f}"),
    ("step_time_mean_s", "step s ±95%", "{:.4f}"),
    ("model_state_gib_per_rank", "state GiB", "{:.4g}"),
    ("train_peak_gib", "GPU peak GiB", "{:.3f}"),
    ("scaling_efficiency", "scaling ±95%", "{:.2f}"),
    ("speedup", "speedup", "{:.2f}"),
    ("cost_usd_per_mtok", "$/Mtok", "{:.4g}"),
    ("detail", "flags / reason", "{}"),
]


# The terminal plots: (metric, title, unit), the same data as the report's PNG plots.
PLOTS = [
    ("tokens_per_s", "tokens/s vs devices (95% bars)", "tokens/s"),
    ("model_state_gib_per_rank", "model state per rank vs devices", "GiB"),
    ("step_time_mean_s", "step time vs devices (95% bars)", "s"),
    ("scaling_efficiency", "scaling efficiency vs devices (95% bars)", "efficiency"),
    ("mfu", "MFU vs devices (95% bars)", "MFU"),
]


@dataclass
class Row:
    key: str
    """A configuration's name (run id without -rN); run id (or directory) of a run that is not ok."""
    status: str
    cells: list[Any]
    """Raw values in COLUMNS order: an Estimate, a number, a string or None."""
    detail: str = ""
    broken: bool = False
    flagged: bool = False
    run_ids: list[str] = field(default_factory=list)
    """The runs behind the row (a configuration's repeats): what l opens and f re-measures."""


@dataclass
class ResultsView:
    rows: list[Row] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)
    """One line per verdict (Rich markup), the same text as the report's Verdicts table."""
    series: dict[str, dict[str, list[tuple[float, float, float, float]]]] = field(default_factory=dict)
    """metric -> strategy -> [(devices, mean, 95% low, 95% high)]: the PNG plots' data (PLOTS)."""
    fault_table: list[str] = field(default_factory=list)
    """The report's fault-tolerance table as plain lines (suite/report/fault_section.py)."""
    drifts: list[str] = field(default_factory=list)
    """The loss check's "Settings that change the trajectory", plain lines (report/markdown.py)."""
    axes: list[str] = field(default_factory=list)
    """"Settings compared as axes", plain lines (report/markdown.py)."""


def fmt_cell(value: Any, spec: str) -> str:
    """'1,100 [880, 1,380]' for an estimate with an interval (log scale: not symmetric), '1,100'
    without; '' for nothing."""
    if isinstance(value, Estimate):
        text = spec.format(value.mean)
        if not value.has_interval or value.lo == value.hi:  # a counted value has no spread to show
            return text
        return f"{text} [{spec.format(value.lo).strip()}, {spec.format(value.hi).strip()}]"
    if value is None or (isinstance(value, float) and not finite(value)):
        return ""
    try:
        return spec.format(value)
    except (ValueError, TypeError):
        return str(value)


def compute(records: list[dict]) -> ResultsView:
    """Rows, verdict lines and plot series for these records (any status, unreadable included)."""
    from shardbench.suite.analyze import analysis
    from shardbench.suite.report import plots

    view = ResultsView()
    if not records:
        return view
    an = analysis.analyze(records)
    for c in an.configs:
        values = {"name": c.name, "status": "ok", "strategy": c.strategy, "world_size": _plain(c.world_size),
                  "seq_len": _plain(c.seq_len), "n": c.n, "scaling_efficiency": c.efficiency,
                  "speedup": c.speedup, "detail": "; ".join(c.flags) or c.efficiency_note}
        values.update({m: c.est.get(m) for m in ("tokens_per_s", "step_time_mean_s", "model_state_gib_per_rank",
                                                   "train_peak_gib", "cost_usd_per_mtok")})
        view.rows.append(Row(c.name, "ok", [values.get(k) for k, _, _ in COLUMNS],
                             "; ".join(c.flags), c.broken, bool(c.flags), list(c.run_ids)))
    for _, r in an.not_ok.iterrows():
        values = {"name": r["run_id"], "status": r["status"], "strategy": _plain(r["strategy"]),
                  "world_size": _plain(r["world_size"]), "seq_len": _plain(r["seq_len"]),
                  "detail": " ".join(str(r["error"] or "").split())[:300]}  # one table line
        key = r["source"].removesuffix("/result.json").rsplit("/", 1)[-1] if isinstance(r["source"], str) \
            else str(r["run_id"])
        view.rows.append(Row(key, str(r["status"]), [values.get(k) for k, _, _ in COLUMNS], values["detail"],
                             run_ids=[key]))
    _unique_keys(view.rows)
    # Winners and flagged candidates first: the lines a reader acts on, before the ties.
    order = {"winner": 0, "flagged": 1, "one repeat": 2}
    view.verdicts = [_verdict_line(v) for v in sorted(an.verdicts, key=lambda v: order.get(v.kind, 3))]
    view.series = {metric: plots.series(an, metric) for metric, _, _ in PLOTS}  # type: ignore[misc]
    from shardbench.suite.report import fault_section as faults_report

    view.fault_table = faults_report.text_lines(records)
    from shardbench.suite.report import markdown

    view.drifts, view.axes = markdown.drift_texts(an), markdown.axis_texts(an)
    return view


def _unique_keys(rows: list[Row]) -> None:
    """Table row keys must differ: a copied or hand-named result can repeat a name."""
    seen: dict[str, int] = {}
    for row in rows:
        n = seen.get(row.key, 0)
        seen[row.key] = n + 1
        if n:
            row.key = f"{row.key}#{n + 1}"


def _plain(value: Any) -> Any:
    """numpy scalars -> Python numbers; NaN -> None."""
    if hasattr(value, "item"):
        value = value.item()
    return None if isinstance(value, float) and not finite(value) else value


def _verdict_line(v) -> str:
    style = {"winner": "green", "flagged": "yellow"}.get(v.kind, "dim")
    return f"[{style}]{escape(v.category.name)} @ {escape(v.group)}:[/] {escape(v.text.replace('**', ''))}"
