"""Plots of what happens inside runs: loss curves and per-rank memory (the report's other plots,
suite/report/plots.py, compare configurations against world size).

- loss_curves.png: the loss of every step of one ok run per configuration (its first repeat),
  warm-up steps shaded. Curves that must agree (the analysis' loss check) lie on top of each other;
  one that does not is the broken run the report names.
- per_rank_model_state.png: the model state each rank holds (tensors counted by the trainer), one
  bar per rank, for every configuration of more than one rank: sharding shows as equal bars
  that shrink with N; an imbalance (a rank holding the root or the buckets) shows as unequal bars.
- per_rank_peak.png: each rank's GPU training peak (allocated); on CPU its peak RSS, a footprint
  of libraries and activations, labelled as such and never compared.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from shardbench.suite.analyze.analysis import Analysis, MeasuredConfig  # noqa: E402
from shardbench.suite.report.plots import _context, _label, _save, _varying  # noqa: E402
from shardbench.suite.analyze.stats import finite  # noqa: E402

LOSS_PLOT, STATE_PLOT, PEAK_PLOT = "loss_curves.png", "per_rank_model_state.png", "per_rank_peak.png"
MAX_CURVES = 24  # beyond this many lines a loss plot is a smear; the first configurations are drawn
MIB = 2 ** 20


def first_run(an: Analysis, c: MeasuredConfig) -> dict[str, Any] | None:
    """The analysis row of a configuration's first ok run."""
    return an.runs.loc[c.index[0]].to_dict() if c.index else None


def draw_loss(an: Analysis, path: Path) -> bool:
    curves = []
    varying = _varying(an.configs)
    for c in an.configs:
        row = first_run(an, c)
        curve = row.get("loss_curve") if row else None
        # a tuple, or an array('d') when the records were compacted on load (suite/analyze/compact.py)
        if isinstance(curve, Sequence) and len(curve) and all(finite(v) for v in curve):
            label = f"{_label(c, varying)} @ {int(c.world_size)} dev" + (" (broken)" if c.broken else "")
            curves.append((label, list(curve), row.get("warmup_steps")))  # type: ignore[union-attr]
    if not curves:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for label, curve, _ in curves[:MAX_CURVES]:
        ax.plot(range(1, len(curve) + 1), curve, marker=".", linewidth=1, label=label)
    warm = [w for _, _, w in curves if finite(w)]
    if warm and max(warm) > 0:  # type: ignore[operator,type-var]
        ax.axvspan(0.5, max(warm) + 0.5, color="grey", alpha=0.12, label="warm-up (not measured)")  # type: ignore[operator,type-var]
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (mean over micro-steps and ranks)")
    ax.set_title(f"Loss per step, first repeat of each configuration\n{_context(an)}", fontsize="medium")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2)
    _save(fig, path)
    return True


def _per_rank(records: dict[str, dict], an: Analysis, field: str, value) -> list[tuple[str, list[float]]]:
    """(configuration label, [MiB of rank 0, 1, ...]) for every configuration of 2+ ranks."""
    out = []
    varying = _varying(an.configs)
    for c in an.configs:
        if not finite(c.world_size) or int(c.world_size) < 2:
            continue
        rec = records.get(c.run_ids[0]) or {}
        ranks = sorted((r for r in rec.get(field) or [] if isinstance(r, dict)), key=lambda r: r.get("rank", 0))
        values = [value(r) for r in ranks]
        if len(values) >= 2 and all(finite(v) for v in values):
            out.append((f"{_label(c, varying)}\n{int(c.world_size)} dev", [v / MIB for v in values]))
    return out


def _bars(data: list[tuple[str, list[float]]], title: str, ylabel: str, an: Analysis, path: Path) -> bool:
    if not data:
        return False
    if len(data) > MAX_CURVES:  # a figure as wide as 1,000 configurations is gigabytes of pixels
        title = f"{title}: the first {MAX_CURVES} of {len(data)} configurations"
        data = data[:MAX_CURVES]
    width = 0.8 / max(len(v) for _, v in data)
    fig, ax = plt.subplots(figsize=(max(7.0, 0.9 * len(data) + 2), 4.5), dpi=110)
    for i, (_, values) in enumerate(data):
        for rank, v in enumerate(values):
            ax.bar(i - 0.4 + width * (rank + 0.5), v, width, color=f"C{rank % 10}",
                   label=f"rank {rank}" if i == 0 or rank >= len(data[0][1]) else None)
    ax.set_xticks(range(len(data)), [label for label, _ in data], fontsize="small")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title}\n{_context(an)}", fontsize="medium")
    ax.grid(True, axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if len(labels) <= 16:
        ax.legend(fontsize="small")
    _save(fig, path)
    return True


def write_run_plots(an: Analysis, records: list[dict], out_dir: str | Path) -> tuple[list[Path], list[str]]:
    """loss_curves.png, per_rank_model_state.png, per_rank_peak.png when there is data; plus one
    line per plot not drawn and why."""
    out_dir = Path(out_dir)
    by_id = {r.get("run_id"): r for r in records if isinstance(r, dict)}
    gpu = any(finite(m.get("train_peak_bytes")) for r in records for m in (r.get("memory") or [])
              if isinstance(m, dict))
    peak_field = "train_peak_bytes" if gpu else "rss_peak_bytes"
    jobs = [
        (LOSS_PLOT, "a loss per step", lambda p: draw_loss(an, p)),
        (STATE_PLOT, "model state per rank at 2+ ranks", lambda p: _bars(
            _per_rank(by_id, an, "model_state", lambda r: r.get("total_bytes")),  # type: ignore[arg-type]
            "Model state held by each rank (first repeat)", "MiB per rank", an, p)),
        (PEAK_PLOT, "memory per rank at 2+ ranks", lambda p: _bars(
            _per_rank(by_id, an, "memory", lambda r: r.get(peak_field)),  # type: ignore[arg-type]
            "GPU training peak of each rank (allocated)" if gpu else
            "Peak RSS of each rank: a footprint (libraries, activations), not compared",
            "MiB per rank", an, p)),
    ]
    written, skipped = [], []
    for filename, what, job in jobs:
        path = out_dir / filename
        path.unlink(missing_ok=True)
        if job(path):
            written.append(path)
        else:
            skipped.append(f"{filename}: no ok run recorded {what}")
    return written, skipped
