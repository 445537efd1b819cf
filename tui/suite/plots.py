"""The report's plots: one PNG per metric vs number of devices, one line per strategy.

Drawn from `metrics.summarize` (ok runs, mean over repeats); error bars show the spread when a
point has more than one repeat. A plot whose metric no run has (MFU without a known peak, H2D on
CPU) is not drawn, and `write_plots` says so in its return value.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


@dataclass(frozen=True)
class PlotSpec:
    """One plot: which summary metric against world size, and how to label it."""

    filename: str
    metric: str
    """Column prefix in the summary (`<metric>_mean`, `<metric>_std`)."""
    title: str
    ylabel: str
    scale: float = 1.0
    """Factor applied to the values (e.g. 100 for percent)."""
    ideal_line: bool = False
    """Draw the y = 1 line (perfect scaling)."""


PLOTS = [
    PlotSpec("tokens_per_s.png", "tokens_per_s", "Training throughput", "tokens / s (global)"),
    PlotSpec("step_time.png", "step_time_mean_s", "Optimizer step time", "seconds per step (mean)"),
    PlotSpec("scaling_efficiency.png", "scaling_efficiency",
             "Scaling efficiency vs the strategy's smallest world size", "efficiency (1.0 = linear)",
             ideal_line=True),
    PlotSpec("peak_memory.png", "peak_memory_gib", "Peak memory per device",
             "GiB (GPU: max allocated; CPU: peak RSS)"),
    PlotSpec("mfu.png", "mfu", "Model FLOPs utilization", "MFU (%)", scale=100.0),
    PlotSpec("h2d_bandwidth.png", "h2d_gbps", "Host-to-device copy bandwidth", "GB/s"),
]


def _series_label(key: tuple, varying: list[str]) -> str:
    parts = [str(key[0])]
    for name, value in zip(varying, key[1:]):
        parts.append(f"{'s' if name == 'seq_len' else ''}{value}")
    return " ".join(parts)


def _context(data: pd.DataFrame) -> str:
    """What every point shares (model, seq len, precision, shape), for the title."""
    parts = []
    for col, fmt in (("model", "{}"), ("seq_len", "seq {}"), ("precision", "{}"), ("gpu_shape", "shape {}")):
        values = data[col].dropna().unique()
        if len(values) == 1:
            parts.append(fmt.format(values[0]))
    return ", ".join(parts)


def draw(summary: pd.DataFrame, plot: PlotSpec, path: Path) -> bool:
    """Draw one plot into `path`; False (no file) when no point has the metric."""
    mean, std = f"{plot.metric}_mean", f"{plot.metric}_std"
    if mean not in summary or summary[mean].notna().sum() == 0:
        return False
    data = summary[summary[mean].notna()]
    # Besides strategy, split lines by whatever else varies (seq len, model, precision, launcher).
    varying = [c for c in ("seq_len", "model", "precision", "launcher")
               if data.groupby("strategy")[c].nunique(dropna=False).max() > 1]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for key, group in data.groupby(["strategy", *varying], sort=True):
        key = key if isinstance(key, tuple) else (key,)
        group = group.sort_values("world_size")
        y = group[mean] * plot.scale
        err = group[std].fillna(0) * plot.scale if (group["repeats"] > 1).any() else None
        ax.errorbar(group["world_size"], y, yerr=err, marker="o", capsize=4 if err is not None else 0,
                    label=_series_label(key, varying))
    if plot.ideal_line:
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="linear scaling")
    worlds = sorted(int(w) for w in data["world_size"].unique())
    ax.set_xticks(worlds)
    ax.set_ylim(bottom=0)  # from zero: a cropped axis makes a 5% gap look like 5x
    ax.set_xlabel("devices (world size)")
    ax.set_ylabel(plot.ylabel)
    ax.set_title(f"{plot.title}\n{_context(data)}", fontsize="medium")
    ax.grid(True, alpha=0.3)
    ax.legend(title="strategy", fontsize="small")
    if (data["repeats"] > 1).any():
        ax.annotate("error bars: std over repeats", xy=(0.99, 0.01), xycoords="axes fraction",
                    ha="right", va="bottom", fontsize="x-small", color="grey")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def write_plots(summary: pd.DataFrame, out_dir: str | Path) -> tuple[list[Path], list[str]]:
    """Every plot that has data, as PNGs in out_dir; plus one line per plot skipped and why."""
    out_dir = Path(out_dir)
    written, skipped = [], []
    for plot in PLOTS:
        path = out_dir / plot.filename
        path.unlink(missing_ok=True)  # a stale plot from an earlier report must not survive
        if draw(summary, plot, path):
            written.append(path)
        else:
            skipped.append(f"{plot.filename}: no run reported {plot.metric}")
    return written, skipped
