"""What the result records support saying: the one analysis behind BENCHMARK_REPORT.md and
benchtui's Results screen (two views of the same `Analysis`).

The rules (README "How the report decides" states them for users, docs/verdicts.md in full):
- A configuration (same config_id) folds its ok repeats into n, mean, sd and a 95% Student-t
  interval per metric, on a log scale for positive quantities (suite/analyze/stats.py).
- Who is compared with whom: "all measured settings equal except ..." (suite/analyze/groups.py):
  verdict groups except the strategy; loss groups except the world size and the knobs marked
  same_loss in trainer/config.py (strategy, data layout, bucket size, ...; suite/analyze/losscheck.py,
  loss and gradient norm per step); efficiency bases except world size and the per_world knobs
  (suite/analyze/scaling.py). Speedup = tok/s over the best single-device mean of any strategy.
- Flags (a flagged configuration is never named winner): efficiency whose interval lies above
  1.05; throughput sd/mean above 25%; a host overloaded during a run (1-minute load average at
  its start or end above the host's CPUs + 1); a loss curve off its group's reference. Memory
  verdicts (counted, not timed) are blocked only by a broken loss curve.
- Winner (suite/analyze/verdicts.py): Welch tests of the best against every other candidate, Holm
  at 5% family-wise; counted memory is decided from one repeat.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from shardbench.suite.analyze import axes as axes_mod
from shardbench.suite.analyze import groups
from shardbench.suite.analyze import losscheck
from shardbench.suite.analyze import rows as metrics
from shardbench.suite.analyze import scaling
from shardbench.suite.analyze.columns import fmt_bytes
from shardbench.suite.analyze.losscheck import LossGroup
from shardbench.suite.analyze.stats import Estimate, estimate, exact, finite, ratio
from shardbench.suite.analyze.verdicts import MIN_REPEATS, NOISE_CV_LIMIT, Verdict, decide, noise_flag  # noqa: F401
from shardbench.trainer import knobs


def splitting_keys(configs: list["MeasuredConfig"], varying: list[str], extra: list[str],
                   label: Any) -> list[str]:
    """The keys a line or point shows: `varying`, plus the fewest of `extra` (first without the
    global batch, then all) that give every configuration its own (label(c, keys), world size).
    A grad-accum or global-batch sweep shares a label without them: one configuration was dropped."""
    for more in ([], [k for k in extra if k != "resolved_global_batch"], extra):
        keys = sorted([*varying, *more])
        cells = [(label(c, keys), int(c.world_size)) for c in configs]
        if len(set(cells)) == len(cells):
            return keys
    return sorted([*varying, *extra])


CONFIG_KEYS = ["config_id", "strategy", "world_size", "model", "seq_len", "micro_batch", "grad_accum",
               "precision", "gpu_shape", "device", "launcher"]
"""Not knob-derived on purpose: record columns, not knobs (config_id, world_size, gpu_shape are
the record's; the rest as resolved). config_id alone tells configurations apart; the others are
the columns every summary.csv row and Results line shows whatever was swept. Every other knob
reaches summary.csv as a column when it differs (report/markdown.py summary_frame, sweep)."""
# Groupings are "all measured settings equal except ..." (suite/analyze/groups.py): no list of columns.
SPEEDUP_EXCEPT = groups.VERDICT_EXCEPT | groups.BASE_EXCEPT | {"resolved_global_batch"}

EFFICIENCY_LIMIT = 1.05
OVERLOAD_SLACK = 1.0
"""CPUs of load above the host's count tolerated before a run counts as overloaded (background work)."""

SUMMARY_METRICS = ["tokens_per_s", "tokens_per_s_per_device", "step_time_mean_s", "model_state_gib_per_rank",
                   "model_state_device_gib", "model_state_host_gib",
                   "train_peak_gib", "rss_footprint_gib", "cost_usd_per_mtok", "mfu", "h2d_gbps",
                   "comm_bytes_per_step", "final_loss"]
STATE_PARTS = ["params", "grads", "optimizer", "master", "comm_buffer"]

RUN_COLUMNS: list[tuple[str, str]] = [
    ("scaling_base_world_size", "the same strategy's smallest world size (same model, seq len, micro-batch, precision, "
                                "shape, launcher)"),
    ("scaling_efficiency", "tok/s / (mean tok/s of the ok base runs x world_size / base); empty when the base has no "
                           "ok run"),
    ("scaling_note", "why scaling_efficiency is empty"),
    ("speedup_vs_best_1dev", "tok/s / mean tok/s of the best single-device configuration of any strategy (same model, "
                             "seq len, precision, shape)"),
    ("host_overloaded", "yes when the 1-minute load average at the run's start or end exceeded the host's CPUs + 1; "
                        "empty when not recorded"),
    ("loss_max_rel_diff", "largest relative difference of this run's loss per step from its group's per-step median"),
    ("grad_norm_max_rel_diff", "largest relative difference of this run's gradient norm per step from its group's "
                               "per-step median"),
    ("all_gather_per_step", "all-gather calls and bytes per optimizer step as measured (fsdp and zero3 gather "
                            "parameters: shown beside their verdicts)"),
    ("loss_check_failed", "what was off the reference: loss, gradient norm, or loss and gradient norm"),
    ("loss_check", "ok, broken (loss or gradient norm off the reference beyond the tolerance), disagree (no majority "
                   "of its group agrees: an even split), or empty when the run had no group"),
]


@dataclass(frozen=True)
class Category:
    """A verdict category: which estimate of a configuration, and which way is better."""

    name: str
    metric: str
    higher_is_better: bool
    unit: str
    fmt: str = "{:.4g}"
    timed: bool = True
    """Measured with a clock: noise flags (overload, spread, efficiency) block its verdict. Memory
    is counted, not timed: only a broken run blocks it."""

    def show(self, e: Estimate | None) -> str:
        return show(e, self.fmt, self.unit)


CATEGORIES = [
    Category("throughput", "tokens_per_s", True, "tok/s", "{:,.0f}"),
    Category("step time", "step_time_mean_s", False, "s", "{:.4f}"),
    # what the device holds (state in host memory stated beside it: verdicts.describe)
    Category("memory: model state per rank", "model_state_device_gib", False, "GiB", "{:.4g}", timed=False),
    Category("memory: GPU training peak", "train_peak_gib", False, "GiB", "{:.3f}", timed=False),
    Category("scaling efficiency", "scaling_efficiency", True, "", "{:.2f}"),
    Category("cost", "cost_usd_per_mtok", False, "$/Mtok", "{:.4g}"),
]


WIDE_SPREAD = 10.0
"""An interval whose high end is more than this many times its low end is shown as its spread."""


def show(e: Estimate | None, spec: str = "{:.4g}", unit: str = "") -> str:
    """'1,100 [852, 1,348] tok/s (n=3)'; one repeat: '1,100 tok/s (n=1)'; an interval wider than
    WIDE_SPREAD: '1,100 tok/s (wide: n=3, spread x37)'."""
    if e is None:
        return "-"
    unit = f" {unit}" if unit else ""
    if e.has_interval and e.lo != e.hi:  # no spread (a counted value): no interval to show
        if e.lo > 0 and e.hi / e.lo > WIDE_SPREAD:  # type: ignore[operator]  # '[69, 25,732]' says only "too noisy to tell"
            return f"{spec.format(e.mean)}{unit} (wide: n={e.n}, spread x{e.hi / e.lo:.0f})"  # type: ignore[operator]
        return f"{spec.format(e.mean)} [{spec.format(e.lo)}, {spec.format(e.hi)}]{unit} (n={e.n})"
    return f"{spec.format(e.mean)}{unit} (n={e.n})"


@dataclass
class MeasuredConfig:
    """One configuration's ok repeats folded into estimates, with its flags."""

    key: dict[str, Any]
    run_ids: list[str]
    index: list[Any] = field(default_factory=list)
    """Row labels of its ok runs in Analysis.runs."""
    est: dict[str, Estimate] = field(default_factory=dict)
    efficiency: Estimate | None = None
    base_world_size: int | None = None
    efficiency_note: str = ""
    speedup: Estimate | None = None
    speedup_note: str = ""
    flags: list[str] = field(default_factory=list)
    broken: bool = False
    settings: dict[str, Any] = field(default_factory=dict)
    """Every measured setting (suite/analyze/groups.py), from its first run."""
    breakdown: dict[str, float] = field(default_factory=dict)
    """Mean GiB per model-state part (params, grads, ...) when recorded."""
    comm: str = ""

    def __getattr__(self, name: str) -> Any:  # key columns as attributes: c.strategy, c.world_size
        key = self.__dict__.get("key", {})
        if name in key:
            return key[name]
        raise AttributeError(name)

    @property
    def strategy(self) -> str:
        """The layout's name where the summary, verdicts and tables name a configuration: the
        strategy, with its mesh degrees when it has any ('hsdp 2x2', 'fsdp+tp 2x2', 'tp 4';
        suite/analyze/groups.py layout_name)."""
        strategy = self.__dict__.get("key", {}).get("strategy")
        settings = self.__dict__.get("settings") or {}
        if all(settings.get(k) in (None, knobs.default(k)) for k in groups.LAYOUT_KNOBS):  # the preset as it is
            return strategy
        return groups.layout_name({**settings, "strategy": strategy, "world_size": self.key.get("world_size")})

    @property
    def n(self) -> int:
        return len(self.run_ids)

    @property
    def name(self) -> str:
        """Readable and unique: the first run's id without its repeat part."""
        return metrics.without_repeat(self.run_ids[0])

    @property
    def label(self) -> str:
        return f"{self.key['strategy']} @ {int(self.key['world_size'])} dev"

    def get(self, metric: str) -> Estimate | None:
        if metric == "scaling_efficiency":
            return self.efficiency
        if metric == "speedup":
            return self.speedup
        return self.est.get(metric)


@dataclass
class Analysis:
    runs: pd.DataFrame
    """One row per record: metrics.COLUMNS + cost + RUN_COLUMNS (and the loss curve, not in the CSV)."""
    configs: list[MeasuredConfig]
    verdicts: list[Verdict]
    loss_groups: list[LossGroup]
    recommendations: list[str]
    drifts: list[losscheck.Drift] = field(default_factory=list)
    """Settings that change the trajectory (float8, a compressing hook) against their defaults."""
    axes: list[axes_mod.AxisComparison] = field(default_factory=list)
    """Knobs swept beyond the layout, each value against its default (suite/analyze/axes.py)."""

    @property
    def not_ok(self) -> pd.DataFrame:
        return self.runs[self.runs["status"] != "ok"]

    def csv_columns(self) -> list[str]:
        return ([c for c, _, _ in metrics.COLUMNS] + [c for c, _ in metrics.DERIVED_COLUMNS]
                + [c for c, _ in RUN_COLUMNS])


# --- entry point ---------------------------------------------------------------------------

def analyze(records: list[dict[str, Any]]) -> Analysis:
    """Everything the report and the Results screen say about these records (any status, and
    metrics.load_records' unreadable stand-ins)."""
    df = metrics.to_frame(records)
    for col, _ in RUN_COLUMNS:
        df[col] = None
    df["host_overloaded"] = [_overloaded(r) for r in df[OVERLOAD_INPUTS].to_dict("records")]
    df["grad_norm_max_rel_diff"] = None
    df["loss_check_failed"] = None
    gathers = {r.get("run_id"): _gathered(r) for r in records if isinstance(r, dict)}
    df["all_gather_per_step"] = df["run_id"].map(lambda rid: gathers.get(rid))
    loss_groups = losscheck.check(df)
    configs = _configs(df)
    scaling.fill(df, configs)
    _speedup(df, configs)
    per_run = df[FLAG_INPUTS].to_dict("index")
    for c in configs:
        _flag(c, [per_run[i] for i in c.index])
    for col in ("scaling_base_world_size", "scaling_efficiency", "speedup_vs_best_1dev", "loss_max_rel_diff",
                "grad_norm_max_rel_diff"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    verdicts = _verdicts(configs)
    an = Analysis(df, configs, verdicts, loss_groups, [], losscheck.drifts(df), axes_mod.compare(configs))
    an.recommendations = _recommendations(an)
    return an


def _gathered(record: dict[str, Any]) -> str | None:
    """'7 calls, 10.4 MiB' of all-gather per optimizer step (the trainer's own counter), None when not measured."""
    per_step = record.get("comm_per_step")
    op = per_step.get("all_gather") if isinstance(per_step, dict) else None
    if not isinstance(op, dict) or not finite(op.get("bytes")) or not finite(op.get("calls")):
        return None
    return f"{op['calls']:g} calls, {fmt_bytes(op['bytes'])}"


def _keys(frame: pd.DataFrame, cols: list[str]) -> pd.Series:
    """One string per combination of these columns' values, for every row."""
    return pd.Series(["|".join(map(str, t)) for t in frame[cols].itertuples(index=False)], index=frame.index,
                     dtype=object)


def _ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["status"] == "ok") & df["tokens_per_s"].notna() & df["world_size"].notna()]


# --- per configuration ---------------------------------------------------------------------

def _configs(df: pd.DataFrame) -> list[MeasuredConfig]:
    ok = _ok_rows(df)
    out: list[MeasuredConfig] = []
    if ok.empty:
        return out
    # Plain lists and groupby indices instead of a sub-frame per group: 5,000 records in
    # 1,000 configurations took most of a report's time in pandas indexing (benchmarks/bench_report_5k.py).
    state_cols = [f"model_state_{part}_gib" for part in STATE_PARTS]
    cols = {c: ok[c].tolist() for c in dict.fromkeys([*CONFIG_KEYS, *SUMMARY_METRICS, *state_cols, "run_id",
                                                       "comm_per_step", "settings"])}
    labels = ok.index.tolist()
    for rows in ok.groupby(_keys(ok, CONFIG_KEYS), sort=False).indices.values():
        first = rows[0]
        c = MeasuredConfig({k: cols[k][first] for k in CONFIG_KEYS}, [cols["run_id"][i] for i in rows],
                   [labels[i] for i in rows])
        for m in SUMMARY_METRICS:
            e = estimate([cols[m][i] for i in rows])
            if e is not None:
                c.est[m] = e
        settings = cols["settings"][first]
        c.settings = settings if isinstance(settings, dict) else {}
        for part, col in zip(STATE_PARTS, state_cols):
            e = estimate([cols[col][i] for i in rows])
            if e is not None:
                c.breakdown[part] = e.mean
        comm = [t for i in rows if isinstance(t := cols["comm_per_step"][i], str) and t]
        c.comm = comm[0] if comm else ""
        out.append(c)
    out.sort(key=lambda c: (str(c.strategy), c.world_size, str(c.seq_len), str(c.config_id)))
    return out


def _speedup(df: pd.DataFrame, configs: list[MeasuredConfig]) -> None:
    """tok/s over the best single-device configuration of any strategy in the same setting."""
    by_key: dict[str, list[MeasuredConfig]] = {}
    ignore = groups.specific([c.settings for c in configs])  # bucket size etc.: not a 1-device setting to match
    for c in configs:
        by_key.setdefault(groups.key(c.settings, SPEEDUP_EXCEPT | ignore), []).append(c)
    tps, speedups = df["tokens_per_s"].to_dict(), {}
    for group in by_key.values():
        singles = [c for c in group if int(c.world_size) == 1]
        best = max(singles, key=lambda c: c.est["tokens_per_s"].mean) if singles else None
        for c in group:
            if best is None:
                c.speedup_note = "no ok single-device run of any strategy"
                continue
            c.speedup_note = f"vs {best.label}"
            c.speedup = exact(c.n, 1.0) if c is best \
                else ratio(c.est["tokens_per_s"], best.est["tokens_per_s"])
            speedups.update({i: tps[i] / best.est["tokens_per_s"].mean for i in c.index})
    _assign(df, "speedup_vs_best_1dev", speedups)


def _assign(df: pd.DataFrame, col: str, values: dict) -> None:
    """df.loc[labels, col] = values in one step (a .loc per group was most of the analysis time)."""
    if values:
        df.loc[list(values), col] = pd.Series(values, dtype=object)


OVERLOAD_INPUTS = ["host_cpus", "load_avg_1m_start", "load_avg_1m_end", "device", "devices_per_node",
                   "threads_per_rank"]


def _overloaded(row: dict[str, Any]) -> str | None:
    cpus = row["host_cpus"]
    start, end = row["load_avg_1m_start"], row["load_avg_1m_end"]
    if not finite(cpus) or not (finite(start) or finite(end)):
        return None  # not recorded: unknown, not "no"
    # Not "start + the run's own threads": in a matrix the previous run's ranks still weigh in the
    # 1-minute average at start, so that sum flagged every 2-rank run on an idle 2-core host.
    load = max(start if finite(start) else 0.0, end if finite(end) else 0.0)
    return "yes" if load > cpus + OVERLOAD_SLACK else "no"


FLAG_INPUTS = ["host_overloaded", "load_avg_1m_start", "load_avg_1m_end", "host_cpus", "loss_check",
               "loss_max_rel_diff", "grad_norm_max_rel_diff", "loss_check_failed"]


def _flag(c: MeasuredConfig, runs: list[dict[str, Any]]) -> None:
    """Append the configuration's flags; `runs` are its ok runs' FLAG_INPUTS."""
    e = c.efficiency
    # The interval's low end, not the point: a noisy 1.08 [0.9, 1.3] is not evidence of more than linear.
    if e is not None and (e.lo if e.has_interval else e.mean) > EFFICIENCY_LIMIT:  # type: ignore[operator]
        shown = f"{e.mean:.2f} [{e.lo:.2f}, {e.hi:.2f}]" if e.has_interval else f"{e.mean:.2f} (n=1)"
        c.flags.append(f"scaling efficiency {shown} above {EFFICIENCY_LIMIT}: more than linear")
    noisy = noise_flag(c.est.get("tokens_per_s"))
    if noisy:
        c.flags.append(noisy)
    over = [r for r in runs if r["host_overloaded"] == "yes"]
    if over:
        worst = max(v for r in over for v in (r["load_avg_1m_start"], r["load_avg_1m_end"]) if finite(v))
        c.flags.append(f"host overloaded in {len(over)} of {len(runs)} runs "
                       f"(load average up to {worst:.1f} on {max(int(r['host_cpus']) for r in over)} CPUs)")
    broken = [r for r in runs if r["loss_check"] == "broken"]
    if broken:
        c.broken = True
        c.flags.append(f"broken: {_off(broken)} off the reference in {len(broken)} of {len(runs)} runs")
    split = [r for r in runs if r["loss_check"] == "disagree"]
    if split:
        c.flags.append(f"loss check: its group splits evenly, no majority to judge by ({len(split)} of {len(runs)} "
                       "runs; "
                       "the report's loss check lists each side)")


def _off(broken: list[dict[str, Any]]) -> str:
    """What was off in these broken runs, each quantity with its largest relative difference."""
    parts = []
    for name, col in (("loss", "loss_max_rel_diff"), ("gradient norm", "grad_norm_max_rel_diff")):
        hit = [r for r in broken if name in str(r["loss_check_failed"] or "").split(" and ")]
        if hit:
            worst = max((r[col] for r in hit if finite(r[col])), default=math.inf)
            parts.append(f"{name} (up to {'not finite' if math.isinf(worst) else f'{worst:.2g} relative'})")
    return " and ".join(parts) or "loss"


def _int(x: Any) -> str:
    return str(int(x)) if finite(x) else "?"


# --- verdicts ------------------------------------------------------------------------------

def pooled_cv(configs: list[MeasuredConfig], metric: str) -> float | None:
    """Median relative sd of a metric over configurations with repeats (the noise level here)."""
    cvs = [e.sd / abs(e.mean) for c in configs if (e := c.get(metric)) is not None
           and e.sd is not None and e.mean and e.n > 1]
    return statistics.median(cvs) if cvs else None


def group_label(c: MeasuredConfig, settings: dict[str, Any], varying: list[str]) -> str:
    """'2 dev, tiny, seq 64, fp32, cpu' plus every setting that differs between comparison groups."""
    parts = [f"{int(c.world_size)} dev", f"{c.model}", f"seq {_int(c.seq_len)}", str(c.precision)]
    if isinstance(c.gpu_shape, str):
        parts.append(c.gpu_shape)
    shown = {"world_size", "model", "seq_len", "precision", "shape", "nodes"}
    parts += [text for k in varying if k not in shown and (text := groups.shown(k, settings.get(k)))]
    return ", ".join(parts)


def verdict_groups(configs: list[MeasuredConfig]) -> list[list[MeasuredConfig]]:
    """Configurations whose measured settings are equal except the strategy (and its launcher)."""
    return groups.comparison_groups(configs, lambda c: c.settings)


def _verdicts(configs: list[MeasuredConfig]) -> list[Verdict]:
    out: list[Verdict] = []
    found = verdict_groups(configs)
    settings = [groups.merged([c.settings for c in g]) for g in found]
    varying = groups.differences(settings, groups.VERDICT_EXCEPT | {"resolved_global_batch"})
    cvs = {cat.metric: pooled_cv(configs, cat.metric) for cat in CATEGORIES}
    for group, merged in zip(found, settings):
        for cat in CATEGORIES:
            v = decide(cat, group, group_label(group[0], merged, varying), cvs[cat.metric])
            if v is not None:
                out.append(v)
    return out


# --- recommendations -----------------------------------------------------------------------

def _recommendations(an: Analysis) -> list[str]:
    recs: list[str] = []
    df = an.runs
    if not an.configs:
        return ["No run finished ok: nothing to compare. The failed runs and their reasons are listed below."]
    top = max(int(c.world_size) for c in an.configs)
    at_top = {v.category.name: v for v in an.verdicts if v.best.world_size == top}
    v = at_top.get("throughput")
    if v is not None and v.kind == "winner":
        recs.append(f"For speed at {top} devices: {v.text}.")
        if v.best.comm and v.second.comm:
            recs.append(f"Measured communication per step at {top} devices: {v.best.strategy} {v.best.comm}; "
                        f"{v.second.strategy} {v.second.comm}.")
    elif v is not None:
        recs.append(f"Throughput at {top} devices: {v.text}.")
    v = at_top.get("memory: model state per rank")
    if v is not None and v.kind == "winner":
        recs.append(f"When memory is the limit at {top} devices: {v.text}. Held per rank: "
                    f"{v.best.strategy} {_parts(v.best)}; {v.second.strategy} {_parts(v.second)}.")
    elif v is not None:
        recs.append(f"Model state per rank at {top} devices: {v.text}.")
    flagged = [c for c in an.configs if c.flags]
    if flagged:
        recs.append(f"{len(flagged)} configuration(s) are flagged and are never named winners: "
                    + "; ".join(f"{c.label}: {', '.join(c.flags)}" for c in flagged) + ".")
    single = [c for c in an.configs if c.n < 2]
    if single:
        need = [v for v in an.verdicts if v.kind == "one repeat"]
        n = max([v.repeats_hint for v in need if v.repeats_hint] or [MIN_REPEATS])
        recs.append(f"{len(single)} configuration(s) ran once: a single run has no interval, so no winner is "
                    f"named for them. Rerun with `--repeats {max(n, MIN_REPEATS)}`.")
    failed = df[df["status"] != "ok"]
    if len(failed):
        kinds = failed["status"].value_counts().to_dict()
        recs.append(f"{len(failed)} run(s) are not in the comparisons "
                    f"({', '.join(f'{k}: {n}' for k, n in kinds.items())}): see Failed and unreadable runs.")
    if (df["device"] == "cpu").any():
        recs.append("These runs used CPU ranks with gloo on this machine: they compare the strategies here, "
                    "not on a GPU shape.")
    return recs


def _parts(c: MeasuredConfig) -> str:
    if not c.breakdown:
        return f"{c.est['model_state_gib_per_rank'].mean * 1024:.1f} MiB (no breakdown recorded)"
    return ", ".join(f"{k.replace('_', ' ')} {v * 1024:.1f} MiB" for k, v in c.breakdown.items())
