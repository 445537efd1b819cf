"""results/*/result.json -> metrics.csv, plots/*.png and BENCHMARK_REPORT.md.

Every statement in the report is computed from the records: the winners and their margins, the
recommendations, the failed-run list. Strategies are only compared inside a comparison group:
same model, seq len, precision, shape and world size (DESIGN.md: numbers that can't be compared
are worse than none).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from tui.suite import metrics, plots

GROUP = ["model", "seq_len", "precision", "gpu_shape", "world_size"]


@dataclass(frozen=True)
class Category:
    """One 'winner' category: a summary metric and which way is better."""

    name: str
    metric: str
    higher_is_better: bool
    unit: str
    fmt: str = "{:.4g}"


CATEGORIES = [
    Category("throughput", "tokens_per_s", True, "tok/s", "{:,.0f}"),
    Category("step time", "step_time_mean_s", False, "s", "{:.4f}"),
    Category("memory per device", "peak_memory_gib", False, "GiB", "{:.3f}"),
    Category("scaling efficiency", "scaling_efficiency", True, "", "{:.2f}"),
    Category("cost", "cost_usd_per_mtok", False, "$/Mtok", "{:.4g}"),
]


@dataclass
class Report:
    """What `build_report` wrote."""

    markdown: Path
    csv: Path
    plots: list[Path]
    skipped_plots: list[str]
    runs: int
    failed: int


# --- formatting ----------------------------------------------------------------------------

def _ok(x: Any) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x)) and x is not pd.NA


def fmt(x: Any, spec: str = "{:.4g}") -> str:
    return spec.format(x) if _ok(x) else "-"


def fmt_pm(mean: Any, std: Any, n: int, spec: str = "{:.4g}") -> str:
    if not _ok(mean):
        return "-"
    return f"{spec.format(mean)} ± {spec.format(std)}" if n > 1 and _ok(std) else spec.format(mean)


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _label(row: pd.Series, groups: pd.DataFrame) -> str:
    """Short name of a comparison group: only the parts that vary across the report."""
    parts = [f"{int(row['world_size'])} dev"]
    for col, prefix in (("seq_len", "seq "), ("model", ""), ("precision", ""), ("gpu_shape", "")):
        if groups[col].nunique(dropna=False) > 1:
            parts.append(f"{prefix}{row[col]}")
    return ", ".join(parts)


# --- analysis ------------------------------------------------------------------------------

def winners(summary: pd.DataFrame) -> list[dict[str, Any]]:
    """Per comparison group with >= 2 strategies and per category: best, runner-up, margin."""
    out = []
    if summary.empty:
        return out
    for _, group in summary.groupby(GROUP, dropna=False, sort=True):
        for cat in CATEGORIES:
            col = f"{cat.metric}_mean"
            ranked = group[group[col].notna()].sort_values(col, ascending=not cat.higher_is_better)
            # Per strategy: its best config in this group (micro-batch/grad-accum may vary).
            ranked = ranked.drop_duplicates("strategy")
            # At each strategy's base world size every efficiency is 1 by definition: no contest.
            at_base = cat.metric == "scaling_efficiency" and ((ranked[col] - 1.0).abs() < 1e-9).all()
            if len(ranked) < 2 or at_base:
                continue
            best, second = ranked.iloc[0], ranked.iloc[1]
            b, s = float(best[col]), float(second[col])
            margin = (b - s) / abs(s) * 100 if cat.higher_is_better else (s - b) / abs(b) * 100 if b else float("nan")
            noise = _noise(best, second, cat.metric)
            out.append({"category": cat, "group": best, "best": best, "second": second,
                        "margin_pct": margin, "within_noise": noise is not None and margin < noise,
                        "noise_pct": noise})
    return out


def _noise(a: pd.Series, b: pd.Series, metric: str) -> float | None:
    """Two standard deviations (relative, %) of the noisier point, when both have repeats."""
    if a["repeats"] < 2 or b["repeats"] < 2:
        return None
    rel = [float(x[f"{metric}_std"]) / abs(float(x[f"{metric}_mean"])) * 100
           for x in (a, b) if _ok(x[f"{metric}_std"]) and float(x[f"{metric}_mean"])]
    return 2 * max(rel) if rel else None


def loss_check(summary: pd.DataFrame, df: pd.DataFrame) -> list[str]:
    """Same model, tokens and global batch must reach the same loss whatever the strategy."""
    notes = []
    ok = df[(df["status"] == "ok") & df["final_loss"].notna()]
    for key, group in ok.groupby(["model", "seq_len", "global_batch", "steps"], dropna=False):
        if group["strategy"].nunique() < 2:
            continue
        lo, hi = group["final_loss"].min(), group["final_loss"].max()
        spread = (hi - lo) / abs(lo) * 100 if lo else float("nan")
        verdict = "agree" if spread <= 1.0 else "DISAGREE (results not comparable: check the strategies)"
        notes.append(f"final loss over {group['strategy'].nunique()} strategies and {len(group)} runs "
                     f"(model {key[0]}, seq {key[1]}, global batch {key[2]}, {key[3]} steps): "
                     f"{lo:.4f} .. {hi:.4f}, spread {spread:.2f}% -> {verdict}")
    return notes


def recommendations(summary: pd.DataFrame, wins: list[dict], df: pd.DataFrame) -> list[str]:
    """Advice computed from the numbers; every sentence names the values it rests on."""
    recs: list[str] = []
    if summary.empty:
        return ["No run finished ok: nothing to recommend. Fix the failures listed above and rerun."]
    top = summary["world_size"].max()
    at_top = {w["category"].name: w for w in wins if int(w["group"]["world_size"]) == top}
    if "throughput" in at_top:
        w = at_top["throughput"]
        recs.append(f"For speed at {int(top)} devices use **{w['best']['strategy']}**: "
                    f"{w['best']['tokens_per_s_mean']:,.0f} tok/s, {w['margin_pct']:.1f}% above "
                    f"{w['second']['strategy']} ({w['second']['tokens_per_s_mean']:,.0f} tok/s)"
                    + (" - within the measured noise, so treat them as tied." if w["within_noise"] else "."))
    recs += _memory_recs(summary, top)
    recs += _scaling_recs(summary)
    cost = summary[summary["cost_usd_per_mtok_mean"].notna()] if "cost_usd_per_mtok_mean" in summary else summary.iloc[0:0]
    if not cost.empty:
        c = cost.sort_values("cost_usd_per_mtok_mean").iloc[0]
        recs.append(f"Cheapest per token: **{c['strategy']} on {int(c['world_size'])} device(s)** at "
                    f"${c['cost_usd_per_mtok_mean']:.4g} per million tokens"
                    + (f" (most expensive: {cost.sort_values('cost_usd_per_mtok_mean').iloc[-1]['strategy']} on "
                       f"{int(cost.sort_values('cost_usd_per_mtok_mean').iloc[-1]['world_size'])}, "
                       f"${cost['cost_usd_per_mtok_mean'].max():.4g})." if len(cost) > 1 else "."))
    elif (df["status"] == "ok").any():
        shapes = _uniq(df["gpu_shape"])
        recs.append(f"No cost per token: no $/device-hour is known for shape {shapes}. Set "
                    "`shape.usdPerGpuHour` in its values file or run with `--usd-per-gpu-hour`.")
    failed = df[df["status"] != "ok"]
    if len(failed):
        kinds = failed["status"].value_counts().to_dict()
        recs.append(f"{len(failed)} run(s) did not finish ({', '.join(f'{k}: {v}' for k, v in kinds.items())}); "
                    "their rows are missing from the comparisons above - see Failed runs."
                    + (" OOM runs need a sharding strategy (zero3/fsdp), a smaller micro-batch or "
                       "activation checkpointing." if "oom" in kinds else ""))
    if (df["device"] == "cpu").any():
        recs.append("These runs used CPU ranks with gloo: they rank the strategies' communication and "
                    "bookkeeping overheads on this machine, not GPU throughput. Repeat on the target GPU shape "
                    "before choosing.")
    if summary["repeats"].max() < 2:
        recs.append("Every point is a single run; differences under ~15% can be timing noise. "
                    "Set `repeats: 3` for error bars and a noise-aware verdict.")
    return recs


def _memory_recs(summary: pd.DataFrame, top: int) -> list[str]:
    at = summary[(summary["world_size"] == top) & summary["peak_memory_gib_mean"].notna()]
    if at["strategy"].nunique() < 2:
        return []
    best = at.sort_values("peak_memory_gib_mean").iloc[0]
    base = at[at["strategy"] == "ddp"]
    ref = base.iloc[0] if len(base) else at.sort_values("peak_memory_gib_mean").iloc[-1]
    if ref["strategy"] == best["strategy"]:
        return [f"At {int(top)} devices {best['strategy']} already has the lowest peak memory "
                f"({best['peak_memory_gib_mean']:.3f} GiB per device): sharding buys no memory here."]
    saved = (1 - best["peak_memory_gib_mean"] / ref["peak_memory_gib_mean"]) * 100
    return [f"When memory is the limit use **{best['strategy']}**: {best['peak_memory_gib_mean']:.3f} GiB "
            f"per device at {int(top)} devices, {saved:.1f}% less than {ref['strategy']} "
            f"({ref['peak_memory_gib_mean']:.3f} GiB)."]


def _scaling_recs(summary: pd.DataFrame) -> list[str]:
    s = summary[summary["scaling_efficiency_mean"].notna() & (summary["world_size"] > summary["world_size"].min())]
    if s.empty:
        return []
    top = s["world_size"].max()
    at = s[s["world_size"] == top].sort_values("scaling_efficiency_mean", ascending=False)
    best, worst = at.iloc[0], at.iloc[-1]
    line = (f"Scaling to {int(top)} devices: **{best['strategy']}** keeps "
            f"{best['scaling_efficiency_mean'] * 100:.0f}% of linear")
    if len(at) > 1:
        word = "only " if worst["scaling_efficiency_mean"] < 0.9 else ""
        line += f", {worst['strategy']} {word}{worst['scaling_efficiency_mean'] * 100:.0f}%"
    line += "."
    if best["scaling_efficiency_mean"] > 1.15:
        line += (f" {best['strategy']}'s efficiency above 1 is not a real speed-up: its base run was "
                 "slowed by noise (shared CPU, first-step effects). Rerun with more steps or repeats "
                 "before trusting its scaling numbers.")
    if worst["scaling_efficiency_mean"] < 0.7:
        line += (f" Below 70% more devices mostly buy communication: for {worst['strategy']} "
                 "prefer fewer devices with more grad-accum, or a faster interconnect.")
    return [line]


# --- sections ------------------------------------------------------------------------------

def _uniq(series: pd.Series) -> str:
    vals = [str(v) for v in series.dropna().unique() if str(v) not in ("", "None", "nan")]
    return ", ".join(sorted(vals, key=lambda v: (len(v), v))) or "-"


def setup_section(df: pd.DataFrame) -> str:
    ok = df[df["status"] == "ok"]
    src = ok if len(ok) else df
    rows = [
        ["model", f"{_uniq(src['model'])} ({_uniq(src['n_layer'])} layers, width {_uniq(src['n_embd'])}, "
                  f"{_uniq(src['n_head'])} heads, vocab {_uniq(src['vocab_size'])})"],
        ["parameters", _uniq(src["n_params"].map(lambda n: f"{n / 1e6:.2f}M" if _ok(n) else None))],
        ["precision", _uniq(src["precision"])],
        ["seq len", _uniq(src["seq_len"].map(lambda v: int(v) if _ok(v) else None))],
        ["micro-batch x grad-accum", ", ".join(sorted({f"{m} x {g}" for m, g in zip(src["micro_batch"], src["grad_accum"])}))],
        ["global batch (sequences)", _uniq(src["global_batch"])],
        ["steps (warm-up excluded from metrics)", ", ".join(sorted({f"{s} ({w} warm-up)" for s, w in zip(src["steps"], src["warmup_steps"])}))],
        ["strategies", _uniq(df["strategy"])],
        ["world sizes", _uniq(df["world_size"].map(lambda v: int(v) if _ok(v) else None))],
        ["launchers", _uniq(df["launcher"])],
        ["hardware", f"{_uniq(src['device'])}: {_uniq(src['device_name'])} (shape {_uniq(src['gpu_shape'])}), "
                     f"comm {_uniq(src['comm_backend'])}"],
        ["hosts", _uniq(src["hostname"])],
        ["python / torch / deepspeed", f"{_uniq(src['python_version'])} / {_uniq(src['torch_version'])} / "
                                        f"{_uniq(src['deepspeed_version'])}"],
        ["NCCL / CUDA / image", f"{_uniq(src['nccl_version'])} / {_uniq(src['cuda_version'])} / {_uniq(src['image'])}"],
        ["MFU peak", f"{_uniq(src['peak_tflops'])} TFLOP/s per device from {_uniq(src['peak_flops_source'])}; "
                     "FLOPs/token = 6N + 12LdT (PaLM appendix B)"],
        ["price", f"{_uniq(df['usd_per_gpu_hour'])} $/device-hour (record or values/<shape>.yaml)"],
        ["runs", f"{len(df)} ({len(ok)} ok, {len(df) - len(ok)} not ok)"],
        ["dates (UTC)", f"{_first(df['started_at'])} .. {_last(df['finished_at'])}"],
    ]
    return "## Setup\n\n" + md_table(["", "value"], rows)


def _first(s: pd.Series) -> str:
    vals = sorted(v for v in s.dropna() if v)
    return vals[0] if vals else "-"


def _last(s: pd.Series) -> str:
    vals = sorted(v for v in s.dropna() if v)
    return vals[-1] if vals else "-"


def winners_section(wins: list[dict], summary: pd.DataFrame) -> str:
    if not wins:
        return "## Winners\n\nFewer than two strategies finished in any comparison group: no winners."
    groups = summary[GROUP]
    rows = []
    for w in wins:
        cat, b, s = w["category"], w["best"], w["second"]
        col = f"{cat.metric}_mean"
        margin = fmt(w["margin_pct"], "{:.1f}%") + (" (within noise)" if w["within_noise"] else "")
        rows.append([cat.name, _label(w["group"], groups), f"**{b['strategy']}**",
                     f"{cat.fmt.format(b[col])} {cat.unit}".strip(), s["strategy"],
                     f"{cat.fmt.format(s[col])} {cat.unit}".strip(), margin])
    return ("## Winners\n\nBest strategy per category within each comparison group (same model, seq len, "
            "precision, shape and number of devices), with its margin over the runner-up "
            "(better-by, relative to the worse value for 'higher is better', to the better value otherwise).\n\n"
            + md_table(["category", "group", "winner", "value", "runner-up", "value", "margin"], rows))


def results_section(summary: pd.DataFrame) -> str:
    if summary.empty:
        return "## Results\n\nNo run finished ok."
    rows = []
    for _, r in summary.iterrows():
        n = int(r["repeats"])
        rows.append([
            r["strategy"], int(r["world_size"]), int(r["seq_len"]), f"{r['micro_batch']} x {r['grad_accum']}",
            n, fmt_pm(r["tokens_per_s_mean"], r["tokens_per_s_std"], n, "{:,.0f}"),
            fmt_pm(r["step_time_mean_s_mean"], r["step_time_mean_s_std"], n, "{:.4f}"),
            fmt_pm(r["peak_memory_gib_mean"], r["peak_memory_gib_std"], n, "{:.3f}"),
            fmt(r["model_state_gib_per_rank_mean"], "{:.4f}"),
            fmt_pm(r["scaling_efficiency_mean"], r["scaling_efficiency_std"], n, "{:.2f}"),
            fmt_pm(r["mfu_mean"] * 100 if _ok(r["mfu_mean"]) else None,
                   r["mfu_std"] * 100 if _ok(r["mfu_std"]) else None, n, "{:.2f}"),
            fmt(r["h2d_gbps_mean"], "{:.2f}"),
            fmt_pm(r["cost_usd_per_mtok_mean"], r["cost_usd_per_mtok_std"], n, "{:.4g}"),
            fmt(r["final_loss_mean"], "{:.4f}"),
        ])
    header = ["strategy", "devices", "seq", "mb x ga", "repeats", "tok/s", "step s", "peak mem GiB/dev",
              "model state GiB/rank", "scaling eff", "MFU %", "H2D GB/s", "$/Mtok", "final loss"]
    return ("## Results\n\nMean ± sample standard deviation over repeats (no ± with one repeat). "
            "Peak memory is GPU max-allocated on GPUs and peak RSS on CPU.\n\n" + md_table(header, rows))


def scaling_section(summary: pd.DataFrame) -> str:
    text = ("## Scaling efficiency\n\neff(N) = tok/s(N) / (tok/s(base) x N / base), where base is the "
            "same strategy's smallest measured world size (same model, seq len, micro-batch, precision, "
            "shape, launcher). 1.00 is linear scaling; each strategy is measured against itself.\n\n")
    s = summary[summary["scaling_efficiency_mean"].notna()] if not summary.empty else summary
    if s.empty:
        return text + "No ok runs."
    worlds = sorted(int(w) for w in s["world_size"].unique())
    rows = []
    for strategy, g in s.groupby("strategy"):
        vals = {int(r["world_size"]): r["scaling_efficiency_mean"] for _, r in g.iterrows()}
        rows.append([strategy] + [fmt(vals.get(w), "{:.2f}") for w in worlds])
    return text + md_table(["strategy"] + [f"{w} dev" for w in worlds], rows)


def failed_section(df: pd.DataFrame, results_dir: Path) -> str:
    failed = df[df["status"] != "ok"]
    if failed.empty:
        return "## Failed runs\n\nNone: every run finished ok."
    rows = [[r["run_id"], r["status"], str(r["error"] or "")[:300], f"{results_dir}/{r['run_id']}/log.txt"]
            for _, r in failed.iterrows()]
    return "## Failed runs\n\n" + md_table(["run", "status", "reason", "log"], rows)


def build_markdown(df: pd.DataFrame, summary: pd.DataFrame, results_dir: Path, plot_files: list[Path],
                   skipped: list[str], out_dir: Path) -> str:
    wins = winners(summary)
    parts = [
        "# Benchmark report",
        f"Generated {datetime.now(timezone.utc).isoformat(timespec='seconds')} from `{results_dir}` "
        f"({len(df)} runs). Data: [metrics.csv](metrics.csv).",
        setup_section(df),
        winners_section(wins, summary),
        "## Recommendations\n\n" + "\n".join(f"- {r}" for r in recommendations(summary, wins, df)),
        results_section(summary),
        scaling_section(summary),
        "## Loss check\n\n" + ("\n".join(f"- {n}" for n in loss_check(summary, df))
                               or "Fewer than two strategies finished on the same tokens: nothing to compare."),
        "## Plots\n\n" + "\n\n".join(f"![{p.stem}]({p.relative_to(out_dir)})" for p in plot_files)
        + ("\n\nNot drawn: " + "; ".join(skipped) if skipped else ""),
        failed_section(df, results_dir),
        "## Columns of metrics.csv\n\n" + metrics.columns_markdown(),
    ]
    return "\n\n".join(parts) + "\n"


def build_report(results_dir: str | Path, out_dir: str | Path) -> Report:
    """Write metrics.csv, plots/*.png and BENCHMARK_REPORT.md under out_dir from results_dir."""
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    records = metrics.load_records(results_dir)
    if not records:
        raise ValueError(f"no results/<run-id>/result.json under {results_dir}")
    return report_from_records(records, out_dir, results_dir)


def report_from_records(records: list[dict], out_dir: Path, results_dir: Path) -> Report:
    out_dir.mkdir(parents=True, exist_ok=True)
    df = metrics.to_frame(records)
    csv = metrics.write_csv(df, out_dir / "metrics.csv")
    summary = metrics.summarize(df)
    plot_files, skipped = plots.write_plots(summary, out_dir / "plots")
    md = out_dir / "BENCHMARK_REPORT.md"
    md.write_text(build_markdown(df, summary, results_dir, plot_files, skipped, out_dir))
    return Report(md, csv, plot_files, skipped, len(df), int((df["status"] != "ok").sum()))
