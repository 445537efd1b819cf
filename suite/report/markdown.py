"""results/*/result.json -> metrics.csv, summary.csv, plots/*.png and BENCHMARK_REPORT.md.

This module only writes: every number, verdict, flag and recommendation comes from
suite/analyze/analysis.py, the same analysis benchtui's Results screen shows.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from shardbench.suite.analyze import analysis as an_mod
from shardbench.suite.report import fault_section as faults_report
from shardbench.suite.analyze import groups
from shardbench.suite.report import html_page as html_report
from shardbench.suite.analyze import losscheck
from shardbench.suite.analyze import rows as metrics
from shardbench.suite.report import plots
from shardbench.suite.report import run_plots as plots_runs
from shardbench.suite.report import summary
from shardbench.suite.report import tune_section as tune_report
from shardbench.suite.analyze import verdicts
from shardbench.suite.analyze.analysis import Analysis, MeasuredConfig, show
from shardbench.suite.analyze.stats import finite


@dataclass
class Report:
    """What `build_report` wrote."""

    markdown: Path
    csv: Path
    summary_csv: Path
    plots: list[Path]
    skipped_plots: list[str]
    runs: int
    failed: int
    html: Path | None = None
    """report.html: the same report, self-contained (suite/report/html_page.py)."""
    summary: str = ""
    """The Summary as terminal text (suite/summary.text), what the CLI prints last."""


def _tolerances(by_precision: dict[str, float]) -> str:
    return ", ".join(f"{v:g} ({k})" for k, v in by_precision.items())


RULES = f"""\
- Every summary value is the mean over a configuration's ok repeats with its 95% confidence
  interval, shown as `mean [low, high] (n=...)`. For positive quantities the interval is taken on
  a log scale, mean x exp(+-t x (sd/mean)/sqrt(n)), so it is never negative; t is the exact
  Student t quantile (fractional degrees of freedom interpolated, not rounded down). summary.csv
  has n, mean, sd and the interval of every metric.
- Comparison groups are runs whose measured settings (every RunConfig field that changes the
  measurement) are equal except the strategy; every verdict names the configurations it compares.
- Scaling efficiency is tok/s(N) / (tok/s(base) x N / base), base = the run with all settings
  equal except world size (and the grad-accum derived from it) at the smallest world size, only
  when that base has an ok run (else empty, with the reason). Its interval propagates the spread
  of both (delta method on the ratio of means, log scale, Welch-Satterthwaite df); so does the
  speedup over the best single-device run of any strategy. At one device the ZeRO strategies
  still run the DeepSpeed engine (one-rank collectives) while DDP and FSDP run the plain model.
- Winner: the best mean is named only when Welch's t test separates it from every other
  candidate of its group, the p values passing Holm's correction at {verdicts.ALPHA:.0%} family-wise: with
  all candidates equal, a winner is named in at most {verdicts.ALPHA:.0%} of groups. Otherwise "no significant
  difference", with the number of repeats that would name a real gap of that size
  {verdicts.POWER:.0%} of the time. Memory is counted, not timed: one repeat decides it.
- Flagged, never crowned: efficiency whose interval lies above {an_mod.EFFICIENCY_LIMIT}; throughput sd/mean
  above {verdicts.NOISE_CV_LIMIT:.0%} across repeats (a rule that does not grow with the number of repeats);
  a host overloaded during a run (1-minute load average at its start or end above the host's
  CPUs + {an_mod.OVERLOAD_SLACK:g}); a broken loss curve. Memory verdicts are blocked only by a broken loss curve.
- Loss check: runs with all settings equal except strategy and data layout (world size,
  micro-batch, grad-accum) at the same global batch must follow one trajectory. Each run's loss
  and gradient norm (before clipping) at every step are compared with the group's per-step
  median of its majority; more than {_tolerances(losscheck.LOSS_TOLERANCE)} relative in the loss
  or {_tolerances(losscheck.GRAD_NORM_TOLERANCE)} in the gradient norm (an fp32 run reducing in bf16 takes bf16's; steps
  without a norm, fp16's overflow skips, are left out) at any step marks the run broken; a group
  split evenly is reported as disagreeing, side by side, with no run called broken.
- Memory compares model state (tensors each rank holds; communication buckets are a part of
  their own) and, on GPU, the training peak; process RSS is only a footprint column."""


# --- formatting ----------------------------------------------------------------------------

def fmt(x: Any, spec: str = "{:.4g}") -> str:
    return spec.format(x) if finite(x) else "-"


def md_text(v: Any) -> str:
    """A string from a record, safe in Markdown: HTML it carries shows as text (a renderer would
    otherwise run `<img onerror=...>` from a strategy name), one line."""
    return str(v).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def _no_html(text: str) -> str:
    """Every section's text as Markdown without HTML: a `<` that would open a tag (a record's
    strategy name, error or label, wherever a section quotes it) is written as `&lt;`."""
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text)


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        return md_text(v).replace("|", "\\|")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _uniq(series: pd.Series) -> str:
    vals = [str(v) for v in series.dropna().unique() if str(v) not in ("", "None", "nan")]
    return ", ".join(sorted(vals, key=lambda v: (len(v), v))) or "-"


def _ints(series: pd.Series) -> str:
    return _uniq(series.map(lambda v: int(v) if finite(v) else None))


# --- sections ------------------------------------------------------------------------------

def setup_section(df: pd.DataFrame) -> str:
    ok = df[df["status"] == "ok"]
    src = ok if len(ok) else df
    rows = [
        ["model", f"{_uniq(src['model'])} ({_ints(src['n_layer'])} layers, width {_ints(src['n_embd'])}, "
                  f"{_ints(src['n_head'])} heads, vocab {_ints(src['vocab_size'])})"],
        ["parameters", _uniq(src["n_params"].map(lambda n: f"{n / 1e6:.2f}M" if finite(n) else None))],
        ["precision (grad reduction)", f"{_uniq(src['precision'])} ({_uniq(src['grad_reduce_dtype'])})"],
        ["seq len", _ints(src["seq_len"])],
        ["micro-batch x grad-accum", ", ".join(sorted({f"{fmt(m, '{:.0f}')} x {fmt(g, '{:.0f}')}"
                                                        for m, g in zip(src["micro_batch"], src["grad_accum"])}))],
        ["global batch (sequences)", _ints(src["global_batch"])],
        ["steps (warm-up excluded from metrics)",
         ", ".join(sorted({f"{fmt(s, '{:.0f}')} ({fmt(w, '{:.0f}')} warm-up)"
                           for s, w in zip(src["steps"], src["warmup_steps"])}))],
        ["strategies", _uniq(df["strategy"])],
        ["world sizes", _ints(df["world_size"])],
        ["launchers", _uniq(df["launcher"])],
        ["hardware", f"{_uniq(src['device'])}: {_uniq(src['device_name'])} (shape {_uniq(src['gpu_shape'])}), "
                     f"comm {_uniq(src['comm_backend'])}"],
        ["hosts (CPUs)", f"{_uniq(src['hostname'])} ({_ints(src['host_cpus'])})"],
        ["threads per rank", _ints(src["threads_per_rank"])],
        ["python / torch / deepspeed", f"{_uniq(src['python_version'])} / {_uniq(src['torch_version'])} / "
                                        f"{_uniq(src['deepspeed_version'])}"],
        ["NCCL / CUDA / image", f"{_uniq(src['nccl_version'])} / {_uniq(src['cuda_version'])} / {_uniq(src['image'])}"],
        ["MFU peak", f"{_uniq(src['peak_tflops'])} TFLOP/s per device from {_uniq(src['peak_flops_source'])}; "
                     "FLOPs/token = 6N + 12LdT (PaLM appendix B)"],
        ["price", f"{_uniq(df['usd_per_gpu_hour'])} $/device-hour (record or values/<shape>.yaml)"],
        ["runs", f"{len(df)} ({len(ok)} ok, {len(df) - len(ok)} not ok)"],
        ["dates (UTC)", f"{_edge(df['started_at'], min)} .. {_edge(df['finished_at'], max)}"],
    ]
    return "## Setup\n\n" + md_table(["", "value"], rows)


def _edge(s: pd.Series, pick) -> str:
    vals = [v for v in s.dropna() if isinstance(v, str) and v]
    return pick(vals) if vals else "-"


def verdicts_section(an: Analysis) -> str:
    head = ("## Verdicts\n\nPer comparison group (all measured settings equal except the strategy; the label "
            "shows the settings that differ between groups) and category.\n\n")
    if not an.verdicts:
        return head + "Fewer than two strategies finished ok in any comparison group: nothing to compare."
    rows = [[v.category.name, v.group, v.kind, v.text] for v in an.verdicts]
    gathered = an.runs["all_gather_per_step"].to_dict()  # a .loc per candidate was 8% of a large report
    gathers = [_gathers(gathered, v) for v in an.verdicts]
    if not any(gathers):
        return head + md_table(["category", "group", "verdict", "numbers"], rows)
    # fsdp and zero3 both gather parameters: what each gathered (the trainer's counter) beside the verdict
    return head + md_table(["category", "group", "verdict", "numbers", "all-gather per step (fsdp, zero3)"],
                           [[*row, g or "-"] for row, g in zip(rows, gathers)])


GATHERING = ("fsdp", "zero3")


def _gathers(gathered: dict[Any, Any], v: Any) -> str:
    """What each gathering candidate of the verdict gathered; `gathered`: the runs' all_gather_per_step by row."""
    shown = []
    for c in v.candidates:
        if c.strategy in GATHERING:
            measured = [g for i in c.index if isinstance(g := gathered[i], str)]
            shown.append(f"{c.strategy} @ {int(c.world_size)} dev: {measured[0] if measured else 'not measured'}")
    return "; ".join(shown)


def summary_section(an: Analysis) -> str:
    rows = summary.rows(an.verdicts)
    if not rows:
        return "## Summary\n\nFewer than two strategies finished ok in any comparison group: nothing to compare."
    return ("## Summary\n\nWhich strategy, how fast, how much memory (95% intervals; winners as decided "
            "under Verdicts, method under How this report decides).\n\n" + md_table(summary.HEADER, rows))


def flags_section(an: Analysis) -> str:
    flagged = [c for c in an.configs if c.flags]
    if not flagged:
        return "## Flags\n\nNo configuration is flagged."
    return "## Flags\n\n" + md_table(["configuration", "runs", "flags"],
                                     [[c.label + f" ({c.name})", c.n, "; ".join(c.flags)] for c in flagged])


def _eff(c: MeasuredConfig) -> str:
    if c.efficiency is not None:
        return show(c.efficiency, "{:.2f}")
    return f"- ({c.efficiency_note})" if c.efficiency_note else "-"


def results_section(an: Analysis) -> str:
    if not an.configs:
        return "## Results\n\nNo run finished ok."
    rows = []
    for c in an.configs:
        e = c.est.get
        rows.append([
            c.strategy, int(c.world_size), fmt(c.seq_len, "{:.0f}"), f"{fmt(c.micro_batch, '{:.0f}')} x "
                                                                     f"{fmt(c.grad_accum, '{:.0f}')}",
            c.n, show(e("tokens_per_s"), "{:,.0f}"), show(e("step_time_mean_s"), "{:.4f}"),
            show(e("model_state_gib_per_rank"), "{:.4g}"), show(e("train_peak_gib"), "{:.3f}"),
            fmt(e("rss_footprint_gib").mean if e("rss_footprint_gib") else None, "{:.3f}"),  # type: ignore[union-attr]
            _eff(c), show(c.speedup, "{:.2f}") + (f" {c.speedup_note}" if c.speedup else f" ({c.speedup_note})"),
            show(e("mfu"), "{:.3f}"), show(e("cost_usd_per_mtok"), "{:.4g}"),
            "; ".join(c.flags) or "-",
        ])
    header = ["strategy", "devices", "seq", "mb x ga", "n", "tok/s", "step s", "model state GiB/rank",
              "GPU train peak GiB", "RSS footprint GiB", "scaling eff", "speedup vs best 1-dev", "MFU",
              "$/Mtok", "flags"]
    return ("## Results\n\nPer configuration: mean [95% interval] (n = ok repeats). RSS is the process "
            "footprint, not compared.\n\n" + md_table(header, rows))


def memory_section(an: Analysis) -> str:
    rows = []
    for c in an.configs:
        if c.breakdown:
            rows.append([c.label, *[fmt(c.breakdown.get(p, float("nan")) * 1024, "{:.2f}") for p in an_mod.STATE_PARTS],
                         fmt(c.est["model_state_gib_per_rank"].mean * 1024 if "model_state_gib_per_rank" in c.est
                             else None, "{:.2f}")])
    if not rows:
        return "## Model state per rank\n\nNo record has the model-state breakdown."
    return ("## Model state per rank\n\nMiB held by the rank holding the most (mean over repeats).\n\n"
            + md_table(["configuration", *[PART_NAMES.get(p, p) for p in an_mod.STATE_PARTS], "total"], rows))


PART_NAMES = {"comm_buffer": "comm buckets"}


def scaling_section(an: Analysis) -> str:
    text = ("## Scaling efficiency\n\neff(N) = tok/s(N) / (tok/s(base) x N / base), base = the same strategy's "
            "smallest world size; empty with the reason when that base has no ok run.\n\n")
    have = [c for c in an.configs if c.base_world_size is not None]
    if not have:
        return text + "No ok runs."
    worlds = sorted({int(c.world_size) for c in have})
    varying = _line_keys(have)
    lines: dict[tuple[str, ...], dict[int, str]] = {}  # one line per configuration but its world size
    for c in have:
        lines.setdefault(_line(c, varying), {})[int(c.world_size)] = _eff(c)
    rows = [[*key, *[cells.get(w, "-") for w in worlds]] for key, cells in sorted(lines.items())]
    notes = sorted({str(n) for n in an.runs["scaling_note"].dropna() if n})
    return (text + md_table(["strategy", *[k.replace("_", "-") for k in varying], *[f"{w} dev" for w in worlds]], rows)
            + ("\n\n" + "\n".join(f"- {n}" for n in notes) if notes else ""))


def _line(c: MeasuredConfig, varying: list[str]) -> tuple[str, ...]:
    """A scaling line's key: the preset (its mesh degrees are columns: one line from 2 to 4 ranks
    of hsdp, whose name changes with the world size) and the shown value of every varying setting."""
    return (str(c.key["strategy"]), *[groups.shown(k, c.settings.get(k)) or "-" for k in varying])


def _line_keys(configs: list[MeasuredConfig]) -> list[str]:
    """The settings a scaling line shows: every one that differs besides the world size; a
    per-world knob (grad-accum) and the global batch only where two configurations of one line
    would share a cell without them (a grad-accum or global-batch sweep: one was dropped)."""
    varying = sweep(configs, groups.BASE_EXCEPT | {"resolved_global_batch"}, by_preset=True)
    extra = [k for k in sweep(configs, frozenset(), by_preset=True) if k not in varying and k not in groups.LAYOUT]
    return an_mod.splitting_keys(configs, varying, extra, _line)


def loss_section(an: Analysis) -> str:
    if not an.loss_groups:
        return "## Loss check\n\nNo two ok runs share a trajectory group: nothing to compare."
    lines = []
    for g in an.loss_groups:
        verdict = (f"{len(g.broken)} of {g.runs} runs BROKEN" if g.broken
                   else "the runs DISAGREE, no majority to judge by: " + " vs ".join(
                       "[" + ", ".join(f"`{r}`" for r in side) + "]" for side in g.sides) if g.sides
                   else f"all {g.runs} runs agree")
        grad = (f"; gradient norm within {g.grad_tolerance:g} (largest difference {fmt(g.grad_max_rel, '{:.2g}')})"
                if g.grad_tolerance is not None else "; no gradient norms recorded")
        lines.append(f"- {g.label} ({', '.join(g.strategies)}): {verdict} within {g.tolerance:g} relative per step "
                     f"(largest difference {fmt(g.max_rel, '{:.2g}')}){grad}")
        lines += [f"  - **broken** `{rid}`: {why}" for rid, why in g.broken]
    return "## Loss check\n\n" + "\n".join(lines) + drift_lines(an)


def drift_lines(an: Analysis) -> str:
    """Settings that change the trajectory by design, each value's runs against the default's: a
    measured difference (float8 also against its measured tolerance), never a broken run."""
    if not an.drifts:
        return ""
    return ("\n\n### Settings that change the trajectory\n\nRuns equal except a setting that changes the loss "
            "curve by design, their per-step medians against the default's: measured, not a failure.\n\n"
            + "\n".join(f"- {line}" for line in drift_texts(an)))


def drift_texts(an: Analysis) -> list[str]:
    """One line per drift, in the report's words (its loss check and benchtui's Results screen)."""
    lines = []
    for d in an.drifts:
        judged = ("" if d.tolerance is None else
                  f", {'within' if d.within else 'BEYOND'} float8's measured tolerance {d.tolerance:g}")
        grad = f"; gradient norm {fmt(d.grad_max_rel, '{:.2g}')}" if d.grad_max_rel is not None else ""
        lines.append(f"{d.label}: {groups.shown(d.setting, d.value)} vs {groups.shown(d.setting, d.baseline)} "
                     f"({d.runs} vs {d.baseline_runs} runs): loss differs by {d.max_rel:.2g} relative at most "
                     f"(step {d.step}){judged}{grad}")
    return lines


def axis_texts(an: Analysis) -> list[str]:
    """The axes table as lines for a terminal (benchtui's Results screen): the same cells."""
    return [f"{groups.shown(a.setting, a.value)} vs {groups.shown(a.setting, a.baseline)}"
            f" ({a.context or 'no other settings'}): {show(a.value_tokens_per_s, '{:,.0f}')} vs "
            f"{show(a.baseline_tokens_per_s, '{:,.0f}')} tok/s, ratio {show(a.ratio, '{:.3g}')}, "
            f"Welch p {fmt(a.p, '{:.2g}')}" for a in an.axes]


def axes_section(an: Analysis) -> str:
    """Knobs swept beyond the layout (float8, compile, a hook, ...): same settings except that knob."""
    if not an.axes:
        return ""
    rows = [[f"{a.setting.replace('_', '-')}", f"{groups.shown(a.setting, a.value)} vs "
             f"{groups.shown(a.setting, a.baseline)}", md_text(a.context or "-"),
             show(a.value_tokens_per_s, "{:,.0f}"), show(a.baseline_tokens_per_s, "{:,.0f}"),
             show(a.ratio, "{:.3g}"), fmt(a.p, "{:.2g}")] for a in an.axes]
    return ("## Settings compared as axes\n\nConfigurations equal except one setting, each value against the "
            "setting's default: tokens/s, mean [95% interval] (n = ok repeats), their ratio (value / default) "
            "and Welch's p.\n\n"
            + md_table(["same settings except", "value vs default", "other settings", "tok/s", "default tok/s",
                        "ratio", "p"], rows))


def host_section(df: pd.DataFrame) -> str:
    cols = ["load_avg_1m_start", "load_avg_1m_end", "host_cpus", "threads_per_rank", "cpu_affinity"]
    runs = df[df[cols].notna().any(axis=1)]
    if runs.empty:
        return "## Host load\n\nThe records do not carry load averages, CPUs or threads (schema 1): host load unknown."
    rows = [[r["run_id"], fmt(r["load_avg_1m_start"], "{:.2f}"), fmt(r["load_avg_1m_end"], "{:.2f}"),
             fmt(r["host_cpus"], "{:.0f}"), fmt(r["threads_per_rank"], "{:.0f}"), r["cpu_affinity"] or "-",
             r["host_overloaded"] or "unknown"] for _, r in runs.iterrows()]
    note = ("" if runs["host_cpus"].notna().any() else
            "The records carry no host CPU count (`cpu_count`), so whether the host was overloaded is "
            "unknown: no run is flagged for it.\n\n")
    return "## Host load\n\n" + note + md_table(["run", "load 1m start", "load 1m end", "CPUs", "threads/rank",
                                                 "cores per rank", "overloaded"], rows)


def failed_section(an: Analysis) -> str:
    failed = an.not_ok
    if failed.empty:
        return "## Failed and unreadable runs\n\nNone: every run finished ok."
    rows = [[r["run_id"], r["status"], str(r["error"] or "")[:300], r["source"] or "-"] for _, r in failed.iterrows()]
    return "## Failed and unreadable runs\n\n" + md_table(["run", "status", "reason", "result.json"], rows)


def build_markdown(an: Analysis, results_dir: Path, plot_files: list[Path], skipped: list[str], out_dir: Path) -> str:
    df = an.runs
    parts = [
        "# Benchmark report",
        f"Generated {datetime.now(timezone.utc).isoformat(timespec='seconds')} from `{results_dir}` "
        f"({len(df)} runs). Data: [metrics.csv](metrics.csv) (one row per run), "
        "[summary.csv](summary.csv) (one row per configuration).",
        summary_section(an),
        verdicts_section(an),
        flags_section(an),
        "## Recommendations\n\n" + "\n".join(f"- {md_text(r)}" for r in an.recommendations),
        "## How this report decides\n\n" + RULES,
        setup_section(df),
        results_section(an),
        memory_section(an),
        scaling_section(an),
        *filter(None, [axes_section(an)]),
        loss_section(an),
        host_section(df),
        "## Plots\n\nError bars are 95% intervals.\n\n"
        + "\n\n".join(f"![{p.stem}]({p.relative_to(out_dir)})" for p in plot_files)
        + ("\n\nNot drawn: " + "; ".join(skipped) if skipped else ""),
        failed_section(an),
        "## Columns of metrics.csv\n\n" + metrics.columns_markdown(an_mod.RUN_COLUMNS),
    ]
    return "\n\n".join(parts) + "\n"


def sweep(configs: list[MeasuredConfig], except_: frozenset[str], by_preset: bool = False) -> list[str]:
    """The settings that differ between configurations of one strategy besides `except_` (a swept
    knob; not the launcher that comes with each strategy). by_preset: of one preset, whatever its
    mesh degrees (fsdp and hsdp 2x2 are one: dp_replicate tells them apart); else of one layout name."""
    by_strategy: dict[str, list[dict[str, Any]]] = {}
    for c in configs:
        by_strategy.setdefault(str(c.key["strategy"] if by_preset else c.strategy), []).append(c.settings)
    found = {k for settings in by_strategy.values() for k in groups.differences(settings, except_)}
    return sorted(found)


def summary_frame(an: Analysis) -> pd.DataFrame:
    """summary.csv: per configuration n, mean, sd, ci_low, ci_high of every summary value, keyed by
    its columns plus every setting that differs between configurations (a swept knob)."""
    rows = []
    # By preset: the strategy column is the preset's name, so its mesh degrees must be columns
    # (fsdp at dp_replicate 1 and 2 were two identical rows but their config ids).
    varying = [k for k in sweep(an.configs, frozenset({"resolved_global_batch"}), by_preset=True)
               if k not in an_mod.CONFIG_KEYS]
    for c in an.configs:
        row: dict[str, Any] = dict(c.key)
        row.update({k: c.settings.get(k) for k in varying})
        row["n"] = c.n
        for name in [*an_mod.SUMMARY_METRICS, "scaling_efficiency", "speedup"]:
            e = c.get(name)
            for stat in ("n", "mean", "sd", "lo", "hi"):
                value = getattr(e, stat) if e is not None else None
                row[f"{name}_{'ci_low' if stat == 'lo' else 'ci_high' if stat == 'hi' else stat}"] = value
        row["scaling_note"] = c.efficiency_note
        row["speedup_vs"] = c.speedup_note
        row["flags"] = "; ".join(c.flags)
        rows.append(row)
    return pd.DataFrame(rows)


def build_report(results_dir: str | Path, out_dir: str | Path) -> Report:
    """Write the report of one result set under out_dir."""
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    records = metrics.load_records(results_dir)
    if not records:
        raise ValueError(f"no <run-id>/result.json under {results_dir}")
    return report_from_records(records, out_dir, results_dir)


STAGE = ".report-"
"""Prefix of the directory (inside out_dir, `.report-<pid>-...`) a report is written into first."""


def report_from_records(records: list[dict], out_dir: Path, results_dir: Path) -> Report:
    """Write every file into a staging directory, then rename each into out_dir (data, plots,
    then the pages): a report killed midway leaves the old files whole, never a new metrics.csv
    beside an old BENCHMARK_REPORT.md rewritten halfway."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _clear_dead_stages(out_dir)
    stage = Path(tempfile.mkdtemp(prefix=f"{STAGE}{os.getpid()}-", dir=out_dir))
    try:
        rep = _write_report(records, stage, results_dir)
        moved = _publish(stage, out_dir)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    html = moved.get(rep.html) if rep.html is not None else None
    return Report(moved[rep.markdown], moved[rep.csv], moved[rep.summary_csv], [moved[p] for p in rep.plots],
                  rep.skipped_plots, rep.runs, rep.failed, html,
                  rep.summary.replace(str(rep.markdown), str(moved[rep.markdown])))


def _publish(stage: Path, out_dir: Path) -> dict[Path, Path]:
    """os.replace every staged file to its place; the pages last. Returns staged -> final path."""
    files = sorted((p for p in stage.rglob("*") if p.is_file()),
                   key=lambda p: (p.suffix in (".md", ".html"), str(p)))
    moved = {}
    for f in files:
        target = out_dir / f.relative_to(stage)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(f, target)
        moved[f] = target
    return moved


def _clear_dead_stages(out_dir: Path) -> None:
    """Staging directories of reports that were killed (their pid no longer runs)."""
    for d in out_dir.glob(f"{STAGE}*"):
        pid = d.name[len(STAGE):].split("-", 1)[0]
        if d.is_dir() and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(d, ignore_errors=True)


def _write_report(records: list[dict], out_dir: Path, results_dir: Path) -> Report:
    an = an_mod.analyze(records)
    csv = metrics.write_csv(an.runs[an.csv_columns()], out_dir / "metrics.csv")
    summary_csv = metrics.write_csv(summary_frame(an), out_dir / "summary.csv")
    plot_files, skipped = plots.write_plots(an, out_dir / "plots")
    run_plots, run_skipped = plots_runs.write_run_plots(an, records, out_dir / "plots")  # loss, per rank
    plot_files, skipped = plot_files + run_plots, skipped + run_skipped
    md = out_dir / "BENCHMARK_REPORT.md"
    fault_section = faults_report.markdown(records)  # suite/report/fault_section.py; '' without checkpoints
    from shardbench.suite.report import plan_section as plan_report  # predicted vs measured (trainer/plan)

    fault_section = "\n\n".join(p for p in (fault_section, tune_report.markdown(records, results_dir)) if p)
    text = (build_markdown(an, results_dir, plot_files, skipped, out_dir)
            + ("\n" + fault_section if fault_section else "") + "\n" + plan_report.markdown(records) + "\n")
    text = _no_html(text)
    md.write_text(text)
    html = html_report.write_html(an, results_dir, plot_files, out_dir, text)  # the same sections
    return Report(md, csv, summary_csv, plot_files, skipped, len(an.runs), len(an.not_ok), html,
                  summary.text(an.verdicts, str(md)))
