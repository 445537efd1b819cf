"""The report's plots, drawn from the analysis (suite/analyze/analysis.py).

One PNG per metric against the number of devices, one line per strategy (and swept setting), on
a log axis spanning the means' range CLIP either way, error bars = the 95% intervals cut at that
edge with an arrow, flagged configurations ringed in red; plus a stacked bar chart of the model-state
breakdown per strategy and world size. A plot no configuration has data for (MFU without a known
peak, H2D or GPU peak on CPU) is not drawn, and `write_plots` says why.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt  # noqa: E402

from shardbench.suite.analyze import groups  # noqa: E402
from shardbench.suite.analyze.analysis import STATE_PARTS, Analysis, MeasuredConfig, splitting_keys  # noqa: E402
from shardbench.suite.analyze.stats import finite  # noqa: E402


@dataclass(frozen=True)
class PlotSpec:
    """One line plot: which configuration estimate against world size, and its labels."""

    filename: str
    metric: str
    """A name MeasuredConfig.get understands (a summary metric, scaling_efficiency or speedup)."""
    title: str
    ylabel: str
    scale: float = 1.0
    ideal_line: bool = False
    """Draw the y = 1 line (linear scaling / no speedup)."""


PLOTS = [
    PlotSpec("tokens_per_s.png", "tokens_per_s", "Training throughput", "tokens / s (global)"),
    PlotSpec("step_time.png", "step_time_mean_s", "Optimizer step time", "seconds per step (mean)"),
    PlotSpec("scaling_efficiency.png", "scaling_efficiency",
             "Scaling efficiency vs the strategy's smallest world size", "efficiency (1.0 = linear)", ideal_line=True),
    PlotSpec("speedup.png", "speedup", "Speedup over the best single-device run of any strategy", "speedup",
             ideal_line=True),
    PlotSpec("gpu_train_peak.png", "train_peak_gib", "GPU memory peak during training", "GiB per device"),
    PlotSpec("mfu.png", "mfu", "Model FLOPs utilization", "MFU (%)", scale=100.0),
    PlotSpec("h2d_bandwidth.png", "h2d_gbps", "Host-to-device copy bandwidth", "GB/s"),
]
STATE_PLOT = "model_state.png"
MAX_LEGEND = 30  # more lines than this make an unreadable legend that takes seconds to lay out


CLIP = 4.0
"""The y axis spans the means /CLIP .. xCLIP (log scale): an interval reaching past it is cut at the
edge and marked, so one noisy configuration cannot squash every other line flat (issue 32: bars
to 25k tok/s on means of 230-1,416)."""


def series(an: Analysis, metric: str) -> dict[str, list[tuple[int, float, float, float]]]:
    """label -> [(devices, mean, 95% low, 95% high)] sorted by devices (low = high = mean without
    an interval); finite values only. The interval is on a log scale: never below 0, not symmetric."""
    out: dict[str, list[tuple[int, float, float, float]]] = {}
    varying = _varying(an.configs)
    for c in an.configs:
        e = c.get(metric)
        if e is None or not finite(e.mean):
            continue
        lo, hi = (e.lo, e.hi) if e.has_interval and finite(e.lo) and finite(e.hi) else (e.mean, e.mean)
        out.setdefault(_label(c, varying), []).append((int(c.world_size), e.mean, lo, hi))  # type: ignore[arg-type]
    return {k: sorted(v) for k, v in sorted(out.items())}


def flagged(an: Analysis, metric: str) -> list[tuple[int, float, str]]:
    """(devices, mean, flags) of every flagged configuration that has this metric."""
    return [(int(c.world_size), e.mean, "; ".join(c.flags)) for c in an.configs
            if c.flags and (e := c.get(metric)) is not None and finite(e.mean)]


def y_limits(data: dict[str, list[tuple[int, float, float, float]]]) -> tuple[float, float] | None:
    """The y range (log axis) from the means, CLIP either side; None when a mean is not positive."""
    means = [p[1] for pts in data.values() for p in pts]
    if not means or min(means) <= 0:
        return None
    return min(means) / CLIP, max(means) * CLIP


def clipped(lo: float, hi: float, limits: tuple[float, float] | None) -> tuple[float, float, bool]:
    """An interval cut to the axis' limits, and whether it was cut."""
    if limits is None:
        return lo, hi, False
    a, b = max(lo, limits[0]), min(hi, limits[1])
    return a, b, (a, b) != (lo, hi)


def _varying(configs: list[MeasuredConfig]) -> list[str]:
    """Besides strategy and world size, what splits lines: every setting that differs between
    configurations of one strategy (a swept knob included: lines with one label would be merged)."""
    except_ = groups.BASE_EXCEPT | {"strategy", "resolved_global_batch"}
    by_strategy: dict[str, list[dict]] = {}
    for c in configs:
        by_strategy.setdefault(str(c.strategy), []).append(c.settings)
    varying = sorted({k for s in by_strategy.values() for k in groups.differences(s, except_)})
    # A grad-accum or global-batch sweep: two points of one line at one world size without them.
    extra = sorted({k for s in by_strategy.values() for k in groups.differences(s, frozenset({"strategy"}))}
                   - set(varying) - groups.LAYOUT)
    return splitting_keys(configs, varying, extra, _label)


def _label(c: MeasuredConfig, varying: list[str]) -> str:
    parts = [str(c.strategy)]
    for col in varying:
        value = c.settings.get(col)
        if col in ("seq_len", "micro_batch") and finite(value):
            parts.append(f"{'s' if col == 'seq_len' else 'mb'}{int(value)}")  # type: ignore[arg-type]
        elif col in ("model", "precision", "launcher") and value is not None:
            parts.append(str(value))
        elif (text := groups.shown(col, value)) is not None:
            parts.append(text)
    return " ".join(parts)


def _context(an: Analysis) -> str:
    parts = []
    for col, text in (("model", "{}"), ("seq_len", "seq {}"), ("precision", "{}"), ("gpu_shape", "shape {}")):
        values = {str(c.key[col]) for c in an.configs}
        if len(values) == 1:
            value = next(iter(values))
            parts.append(text.format(value.removesuffix(".0")))
    return ", ".join(parts)


def draw(an: Analysis, plot: PlotSpec, path: Path) -> bool:
    """One line plot into `path`; False (no file) when no configuration has the metric."""
    data = series(an, plot.metric)
    if not data:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    with_bars = False
    if len(data) > MAX_LEGEND:
        with_bars = _draw_many(ax, data, plot.scale)
    limits = y_limits(data) if plot.scale > 0 else None
    cut = False
    for label, points in data.items() if len(data) <= MAX_LEGEND else ():
        xs = [p[0] for p in points]
        ys = [p[1] * plot.scale for p in points]
        shown = [clipped(p[2], p[3], limits) for p in points]
        cut |= any(c for _, _, c in shown)
        err = [[(p[1] - lo) * plot.scale for p, (lo, _, _) in zip(points, shown)],
               [(hi - p[1]) * plot.scale for p, (_, hi, _) in zip(points, shown)]]
        bars = any(err[0]) or any(err[1])
        with_bars |= bars
        line = ax.errorbar(xs, ys, yerr=err if bars else None, marker="o", capsize=4, label=label)
        for p, (lo, hi, c) in zip(points, shown):  # a cut interval ends in an arrow at the edge
            if c and hi < p[3]:
                ax.plot([p[0]], [hi * plot.scale], marker="^", color=line[0].get_color(), markersize=7)
            if c and lo > p[2]:
                ax.plot([p[0]], [lo * plot.scale], marker="v", color=line[0].get_color(), markersize=7)
    marks = flagged(an, plot.metric)
    if marks:
        ax.scatter([m[0] for m in marks], [m[1] * plot.scale for m in marks], s=180, facecolors="none",
                   edgecolors="red", linewidths=1.6, zorder=4, label="flagged (see Flags)")
    if plot.ideal_line:
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="linear" if "scaling" in plot.metric else "1x")
    ax.set_xticks(sorted({p[0] for pts in data.values() for p in pts}))
    if limits is not None:
        # Log axis: equal ratios look equal (a 5% gap stays 5% at any height); y from zero would
        # flatten everything below one noisy configuration.
        ax.set_yscale("log")
        low, high = limits[0] * plot.scale, limits[1] * plot.scale
        if plot.ideal_line:
            low, high = min(low, 0.9), max(high, 1.1)
        ax.set_ylim(low, high)
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel("devices (world size)")
    ax.set_ylabel(plot.ylabel + (" (log scale)" if limits is not None else ""))
    ax.set_title(f"{plot.title}\n{_context(an)}", fontsize="medium")
    ax.grid(True, alpha=0.3, which="both")
    if len(data) <= MAX_LEGEND:
        ax.legend(title="strategy", fontsize="small")
    note = "error bars: 95% intervals" if with_bars else "one repeat per point: no intervals"
    if cut:
        note += f"; arrows: interval cut at {CLIP:g}x the means' range"
    ax.annotate(note, xy=(0.99, 0.01), xycoords="axes fraction", ha="right", va="bottom", fontsize="x-small",
                color="grey")
    _save(fig, path)
    return True


def _draw_many(ax, data: dict[str, list[tuple[int, float, float, float]]], scale: float) -> bool:
    """More lines than a legend can name: all of them as one collection of lines, one of points
    and one of error bars (an errorbar() call per line took most of a 5,000-run report's time).
    Returns whether any point has an interval."""
    from matplotlib.collections import LineCollection

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    lines, points, bars = [], [], []
    for k, pts in enumerate(data.values()):
        color = colors[k % len(colors)]
        lines.append(([(x, y * scale) for x, y, _, _ in pts], color))
        points += [(x, y * scale, color) for x, y, _, _ in pts]
        # (devices, mean, low, high): the interval is asymmetric (log scale), a point has none when lo == hi
        bars += [(x, lo * scale, hi * scale, color) for x, _, lo, hi in pts if hi != lo]
    ax.add_collection(LineCollection([seg for seg, _ in lines], colors=[c for _, c in lines], linewidths=1))
    ax.scatter([p[0] for p in points], [p[1] for p in points], c=[p[2] for p in points], s=16, zorder=3)
    if bars:
        ax.vlines([b[0] for b in bars], [b[1] for b in bars], [b[2] for b in bars], colors=[b[3] for b in bars])
    ax.autoscale_view()
    return bool(bars)


def draw_model_state(an: Analysis, path: Path) -> bool:
    """Stacked bars: params, grads, optimizer, master, comm buffers per strategy and world size."""
    bars = [c for c in an.configs if c.breakdown and all(finite(v) for v in c.breakdown.values())]
    if not bars:
        return False
    bars.sort(key=lambda c: (int(c.world_size), str(c.strategy), str(c.config_id)))
    varying = _varying(bars)
    fig, ax = plt.subplots(figsize=(max(7.0, 0.6 * len(bars) + 2), 4.5), dpi=110)
    xs = range(len(bars))
    bottom = [0.0] * len(bars)
    for part in STATE_PARTS:
        values = [c.breakdown.get(part, 0.0) * 1024 for c in bars]
        if any(values):
            ax.bar(xs, values, bottom=bottom, label="comm buckets (--bucket-mib)" if part == "comm_buffer" else part)
            bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(list(xs), [f"{_label(c, varying)}\n{int(c.world_size)} dev" for c in bars], fontsize="small")
    ax.set_ylabel("MiB held by one rank (the rank holding the most)")
    ax.set_title(f"Model state per rank\n{_context(an)}", fontsize="medium")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    _save(fig, path)
    return True


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(path)
    finally:
        plt.close(fig)


def write_plots(an: Analysis, out_dir: str | Path) -> tuple[list[Path], list[str]]:
    """Every plot that has data, as PNGs in out_dir; plus one line per plot skipped and why."""
    out_dir = Path(out_dir)
    written, skipped = [], []
    jobs = [(p.filename, p.metric, lambda path, p=p: draw(an, p, path)) for p in PLOTS]
    jobs.insert(2, (STATE_PLOT, "the model-state breakdown", lambda path: draw_model_state(an, path)))  # type: ignore[arg-type,misc]
    for filename, what, job in jobs:
        path = out_dir / filename
        path.unlink(missing_ok=True)  # a stale plot from an earlier report must not survive
        if job(path):
            written.append(path)
        else:
            skipped.append(f"{filename}: no ok run recorded {what}")
    return written, skipped
