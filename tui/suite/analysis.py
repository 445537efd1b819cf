"""What the result records support saying: the one analysis behind BENCHMARK_REPORT.md and
benchtui's Results screen (two views of the same `Analysis`).

The rules (README "How the report decides" states them for users):
- A configuration (same config_id) folds its ok repeats into n, mean, sd and a 95% Student-t
  interval per metric (tui/suite/stats.py).
- Scaling efficiency eff(N) = tok/s(N) / (tok/s(base) x N / base), base = the same strategy's
  smallest world size in the matrix (same model, seq len, micro-batch, precision, shape,
  launcher and every other knob), only when that base has an ok run; else it stays empty with the reason. Its interval
  propagates both spreads (delta method, Welch-Satterthwaite df). Speedup = tok/s over the best
  single-device mean of any strategy (same model, seq len, precision, shape, device), same method.
- Flags (a flagged configuration is never named winner): efficiency above 1.05; throughput
  spread (max - min) / mean above 20% across repeats; a host overloaded during a run (1-minute
  load average at its start or end above the host's CPUs + 1); a loss curve off its group's
  reference. Memory verdicts (counted, not timed) are blocked only by a broken loss curve.
- Loss check: runs that must follow one trajectory (same model, seq len, precision, gradient
  reduction dtype, global batch, steps, optimizer settings, seed: every knob not marked
  same_loss in trainer/config.py) are compared step by step with the per-step
  median of the group; a run further than 1e-4 relative (fp32; 1e-2 when compute or gradient
  reduction is bf16/fp16) at any step is broken.
- Winner: per comparison group (model, seq len, precision, shape, device, world size) and
  category, the best strategy's interval must not overlap the runner-up's; otherwise "no
  significant difference". With one repeat no winner is named.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from trainer import knobs
from tui.suite import metrics
from tui.suite.stats import Estimate, estimate, finite, ratio, repeats_needed, separated

CONFIG_KEYS = ["config_id", "strategy", "world_size", "model", "seq_len", "micro_batch", "grad_accum",
               "precision", "gpu_shape", "device", "launcher"]
GROUP = ["model", "seq_len", "precision", "gpu_shape", "device", "world_size"]
# A scaling base shares every measured knob but the world size (trainer.knobs.scaling_keys).
SCALING_GROUP = list(dict.fromkeys(["strategy", "model", "seq_len", "micro_batch", "precision", "gpu_shape",
                                    "launcher", *knobs.scaling_keys()]))
SPEEDUP_GROUP = ["model", "seq_len", "precision", "gpu_shape", "device"]
# Every measured knob not marked same_loss (trainer.knobs.loss_group): a bf16 reduction or another
# weight decay is a different trajectory, not a broken one.
LOSS_GROUP = knobs.loss_group()

EFFICIENCY_LIMIT = 1.05
SPREAD_LIMIT = 0.20
OVERLOAD_SLACK = 1.0
"""CPUs of load above the host's count tolerated before a run counts as overloaded (background work)."""
LOSS_TOLERANCE = {"fp32": 1e-4}
OTHER_LOSS_TOLERANCE = 1e-2  # bf16, fp16
MIN_REPEATS = 3  # what to ask for when the data cannot say how many repeats a comparison needs

SUMMARY_METRICS = ["tokens_per_s", "tokens_per_s_per_device", "step_time_mean_s", "model_state_gib_per_rank",
                   "train_peak_gib", "rss_footprint_gib", "cost_usd_per_mtok", "mfu", "h2d_gbps",
                   "comm_bytes_per_step", "final_loss"]
STATE_PARTS = ["params", "grads", "optimizer", "master", "comm_buffer"]

RUN_COLUMNS: list[tuple[str, str]] = [
    ("scaling_base_world_size", "the same strategy's smallest world size (same model, seq len, micro-batch, precision, shape, launcher)"),
    ("scaling_efficiency", "tok/s / (mean tok/s of the ok base runs x world_size / base); empty when the base has no ok run"),
    ("scaling_note", "why scaling_efficiency is empty"),
    ("speedup_vs_best_1dev", "tok/s / mean tok/s of the best single-device configuration of any strategy (same model, seq len, precision, shape)"),
    ("host_overloaded", "yes when the 1-minute load average at the run's start or end exceeded the host's CPUs + 1; empty when not recorded"),
    ("loss_max_rel_diff", "largest relative difference of this run's loss per step from its group's per-step median"),
    ("loss_check", "ok, broken (off the reference beyond the tolerance), or empty when the run had no group"),
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
    Category("memory: model state per rank", "model_state_gib_per_rank", False, "GiB", "{:.4g}", timed=False),
    Category("memory: GPU training peak", "train_peak_gib", False, "GiB", "{:.3f}", timed=False),
    Category("scaling efficiency", "scaling_efficiency", True, "", "{:.2f}"),
    Category("cost", "cost_usd_per_mtok", False, "$/Mtok", "{:.4g}"),
]


def show(e: Estimate | None, spec: str = "{:.4g}", unit: str = "") -> str:
    """'1,100 [852, 1,348] tok/s (n=3)'; one repeat: '1,100 tok/s (n=1)'."""
    if e is None:
        return "-"
    unit = f" {unit}" if unit else ""
    if e.has_interval:
        return f"{spec.format(e.mean)} [{spec.format(e.lo)}, {spec.format(e.hi)}]{unit} (n={e.n})"
    return f"{spec.format(e.mean)}{unit} (n={e.n})"


@dataclass
class Config:
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
    spread: float | None = None
    """(max - min) / mean of tokens/s over the repeats."""
    breakdown: dict[str, float] = field(default_factory=dict)
    """Mean GiB per model-state part (params, grads, ...) when recorded."""
    comm: str = ""

    def __getattr__(self, name: str) -> Any:  # key columns as attributes: c.strategy, c.world_size
        key = self.__dict__.get("key", {})
        if name in key:
            return key[name]
        raise AttributeError(name)

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
class Verdict:
    category: Category
    group: str
    kind: str
    """winner, no significant difference, one repeat, flagged."""
    best: Config
    second: Config
    margin_pct: float
    text: str


@dataclass
class LossGroup:
    label: str
    tolerance: float
    runs: int
    strategies: list[str]
    max_rel: float | None
    broken: list[tuple[str, str]]
    """(run id, why) of each run off the reference."""


@dataclass
class Analysis:
    runs: pd.DataFrame
    """One row per record: metrics.COLUMNS + cost + RUN_COLUMNS (and the loss curve, not in the CSV)."""
    configs: list[Config]
    verdicts: list[Verdict]
    loss_groups: list[LossGroup]
    recommendations: list[str]

    @property
    def not_ok(self) -> pd.DataFrame:
        return self.runs[self.runs["status"] != "ok"]

    def csv_columns(self) -> list[str]:
        return [c for c, _, _ in metrics.COLUMNS] + [c for c, _ in metrics.DERIVED_COLUMNS] + [c for c, _ in RUN_COLUMNS]


# --- entry point ---------------------------------------------------------------------------

def analyze(records: list[dict[str, Any]]) -> Analysis:
    """Everything the report and the Results screen say about these records (any status, and
    metrics.load_records' unreadable stand-ins)."""
    df = metrics.to_frame(records)
    for col, _ in RUN_COLUMNS:
        df[col] = None
    df["host_overloaded"] = [_overloaded(r) for r in df[OVERLOAD_INPUTS].to_dict("records")]
    loss_groups = _loss_check(df)
    configs = _configs(df)
    _scaling(df, configs)
    _speedup(df, configs)
    per_run = df[FLAG_INPUTS].to_dict("index")
    for c in configs:
        _flag(c, [per_run[i] for i in c.index])
    for col in ("scaling_base_world_size", "scaling_efficiency", "speedup_vs_best_1dev", "loss_max_rel_diff"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    verdicts = _verdicts(configs)
    an = Analysis(df, configs, verdicts, loss_groups, [])
    an.recommendations = _recommendations(an)
    return an


def _key(row: Any, cols: list[str]) -> str:
    """One string per combination of values (a row, or a Config's key dict)."""
    return "|".join(str(row[c]) for c in cols)


def _keys(frame: pd.DataFrame, cols: list[str]) -> pd.Series:
    """_key of every row, vectorized (str() of each cell, as _key does)."""
    return pd.Series(["|".join(map(str, t)) for t in frame[cols].itertuples(index=False)], index=frame.index,
                     dtype=object)


def _ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["status"] == "ok") & df["tokens_per_s"].notna() & df["world_size"].notna()]


# --- per configuration ---------------------------------------------------------------------

def _configs(df: pd.DataFrame) -> list[Config]:
    ok = _ok_rows(df)
    out: list[Config] = []
    if ok.empty:
        return out
    # Plain lists and groupby indices instead of a sub-frame per group: 5,000 records in
    # 1,000 configurations took most of a report's time in pandas indexing (benchmarks/bench_report_5k.py).
    # The knobs of a scaling base too (they are the same for every repeat of a config_id).
    key_cols = list(dict.fromkeys(CONFIG_KEYS + SCALING_GROUP))
    state_cols = [f"model_state_{part}_gib" for part in STATE_PARTS]
    cols = {c: ok[c].tolist() for c in dict.fromkeys([*key_cols, *SUMMARY_METRICS, *state_cols, "run_id",
                                                       "comm_per_step"])}
    labels = ok.index.tolist()
    for rows in ok.groupby(_keys(ok, CONFIG_KEYS), sort=False).indices.values():
        first = rows[0]
        c = Config({k: cols[k][first] for k in key_cols}, [cols["run_id"][i] for i in rows],
                   [labels[i] for i in rows])
        for m in SUMMARY_METRICS:
            e = estimate(cols[m][i] for i in rows)
            if e is not None:
                c.est[m] = e
        tps = [v for i in rows if finite(v := cols["tokens_per_s"][i])]
        if len(tps) > 1:
            c.spread = (max(tps) - min(tps)) / (sum(tps) / len(tps))
        for part, col in zip(STATE_PARTS, state_cols):
            e = estimate(cols[col][i] for i in rows)
            if e is not None:
                c.breakdown[part] = e.mean
        comm = [t for i in rows if isinstance(t := cols["comm_per_step"][i], str) and t]
        c.comm = comm[0] if comm else ""
        out.append(c)
    out.sort(key=lambda c: (str(c.strategy), c.world_size, str(c.seq_len), str(c.config_id)))
    return out


def _scaling(df: pd.DataFrame, configs: list[Config]) -> None:
    """Efficiency of every configuration against its strategy's own smallest world size."""
    # Only the columns used here: a groupby over the whole frame copies all of them per group.
    cols = list(dict.fromkeys([*SCALING_GROUP, "world_size", "status", "tokens_per_s", "run_id", "error"]))
    runs = df.loc[(df["status"] != metrics.UNREADABLE) & df["world_size"].notna(), cols]
    if runs.empty:
        return
    by_key: dict[str, list[Config]] = {}
    for c in configs:
        by_key.setdefault(_key(c.key, SCALING_GROUP), []).append(c)
    bases, notes, effs = {}, {}, {}  # row label -> value, set in one assignment each (not per group)
    runs = runs.assign(_ok=(runs["status"] == "ok") & runs["tokens_per_s"].notna())
    for key, group in runs.groupby(_keys(runs, SCALING_GROUP), sort=False):
        base = int(group["world_size"].min())
        at_base = (group["world_size"] == base).to_numpy()
        base_runs = group[at_base]
        base_est = estimate(group["tokens_per_s"].to_numpy()[at_base & group["_ok"].to_numpy()])
        note = ""
        if base_est is None:
            statuses = ", ".join(f"{r['run_id']} {r['status']}" + (f" ({str(r['error'])[:80]})" if r["error"] else "")
                                 for _, r in base_runs.head(3).iterrows())
            note = f"base {group.iloc[0]['strategy']} at {base} dev has no ok run: {statuses}"
        for i in group.index:
            bases[i] = base
        if base_est is None:
            notes.update(dict.fromkeys(group.index, note))
        else:
            ok = group[group["_ok"]]
            effs.update(ok["tokens_per_s"] / (base_est.mean * ok["world_size"] / base))
        for c in by_key.get(key, []):
            c.base_world_size = base
            if base_est is None:
                c.efficiency_note = note
            elif int(c.world_size) == base:
                c.efficiency = Estimate(c.n, 1.0, 0.0, 0.0) if c.n > 1 else Estimate(1, 1.0)
                c.efficiency_note = "base (1.00 by definition)"
            else:
                c.efficiency = ratio(c.est["tokens_per_s"], base_est, scale=base / c.world_size)
    _assign(df, "scaling_base_world_size", bases)
    _assign(df, "scaling_note", notes)
    _assign(df, "scaling_efficiency", effs)


def _assign(df: pd.DataFrame, col: str, values: dict) -> None:
    """df.loc[labels, col] = values in one step (a .loc per group was most of the analysis time)."""
    if values:
        df.loc[list(values), col] = pd.Series(values, dtype=object)


def _speedup(df: pd.DataFrame, configs: list[Config]) -> None:
    """tok/s over the best single-device configuration of any strategy in the same setting."""
    groups: dict[str, list[Config]] = {}
    for c in configs:
        groups.setdefault(_key(c.key, SPEEDUP_GROUP), []).append(c)
    tps, speedups = df["tokens_per_s"].to_dict(), {}
    for group in groups.values():
        singles = [c for c in group if int(c.world_size) == 1]
        best = max(singles, key=lambda c: c.est["tokens_per_s"].mean) if singles else None
        for c in group:
            if best is None:
                c.speedup_note = "no ok single-device run of any strategy"
                continue
            c.speedup_note = f"vs {best.label}"
            c.speedup = (Estimate(c.n, 1.0, 0.0, 0.0) if c.n > 1 else Estimate(1, 1.0)) if c is best \
                else ratio(c.est["tokens_per_s"], best.est["tokens_per_s"])
            speedups.update({i: tps[i] / best.est["tokens_per_s"].mean for i in c.index})
    _assign(df, "speedup_vs_best_1dev", speedups)


OVERLOAD_INPUTS = ["host_cpus", "load_avg_1m_start", "load_avg_1m_end", "device", "devices_per_node", "threads_per_rank"]


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
               "loss_max_rel_diff"]


def _flag(c: Config, runs: list[dict[str, Any]]) -> None:
    """Append the configuration's flags; `runs` are its ok runs' FLAG_INPUTS."""
    if c.efficiency is not None and c.efficiency.mean > EFFICIENCY_LIMIT:
        c.flags.append(f"scaling efficiency {c.efficiency.mean:.2f} > {EFFICIENCY_LIMIT}: more than linear")
    if c.spread is not None and c.spread > SPREAD_LIMIT:
        c.flags.append(f"throughput varies {c.spread:.0%} across {c.n} repeats (> {SPREAD_LIMIT:.0%})")
    over = [r for r in runs if r["host_overloaded"] == "yes"]
    if over:
        worst = max(v for r in over for v in (r["load_avg_1m_start"], r["load_avg_1m_end"]) if finite(v))
        c.flags.append(f"host overloaded in {len(over)} of {len(runs)} runs "
                       f"(load average up to {worst:.1f} on {max(int(r['host_cpus']) for r in over)} CPUs)")
    broken = [r for r in runs if r["loss_check"] == "broken"]
    if broken:
        c.broken = True
        worst_rel = max((r["loss_max_rel_diff"] for r in broken if finite(r["loss_max_rel_diff"])), default=math.inf)
        c.flags.append(f"broken: loss off the reference in {len(broken)} of {len(runs)} runs "
                       f"(up to {worst_rel:.2g} relative)")


# --- loss check ----------------------------------------------------------------------------

def loss_tolerance(precision: Any, grad_reduce_dtype: Any = None) -> float:
    """1e-4 for fp32 compute with fp32 (or unrecorded) gradient reduction; 1e-2 with any 16-bit part."""
    if isinstance(grad_reduce_dtype, str) and grad_reduce_dtype in ("bf16", "fp16"):
        return OTHER_LOSS_TOLERANCE
    return LOSS_TOLERANCE.get(str(precision), OTHER_LOSS_TOLERANCE)


def _loss_check(df: pd.DataFrame) -> list[LossGroup]:
    cols = list(dict.fromkeys([*LOSS_GROUP, "loss_curve", "run_id", "strategy", "model", "grad_reduce_dtype",
                               "precision", "seq_len", "global_batch", "steps", "lr", "seed"]))  # + the label's
    ok = df.loc[(df["status"] == "ok") & df["loss_curve"].notna(), cols]
    out = []
    if ok.empty:
        return out
    rels, checks = {}, {}
    for _, group in ok.groupby(_keys(ok, LOSS_GROUP), sort=True):
        if len(group) < 2:
            continue
        first = group.iloc[0]
        tol = loss_tolerance(first["precision"], first["grad_reduce_dtype"])
        curves = group["loss_curve"].tolist()
        length = min(len(c) for c in curves)
        ref = [_median(list(at_step)) for at_step in zip(*curves)][:length]
        broken, worst = [], 0.0
        for idx, curve, run_id in zip(group.index, group["loss_curve"], group["run_id"]):
            rel, step = _max_rel(curve[:length], ref)
            rels[idx] = rel if math.isfinite(rel) else None
            bad = not math.isfinite(rel) or rel > tol
            checks[idx] = "broken" if bad else "ok"
            worst = max(worst, rel) if math.isfinite(rel) else worst
            if bad:
                got = curve[step]
                broken.append((str(run_id),
                               f"step {step}: loss {got:.6g} vs reference {ref[step]:.6g} "
                               f"({'not finite' if not math.isfinite(rel) else f'{rel:.2g} relative'} > {tol:g})"))
        label = (f"{first['model']}, seq {_int(first['seq_len'])}, {first['precision']}, global batch "
                 f"{_int(first['global_batch'])}, {_int(first['steps'])} steps, lr {first['lr']:g}, "
                 f"seed {_int(first['seed'])}" if finite(first["lr"]) else f"{first['model']}, seq {_int(first['seq_len'])}")
        out.append(LossGroup(label, tol, len(group), sorted(set(map(str, group["strategy"]))), worst, broken))
    _assign(df, "loss_max_rel_diff", rels)
    _assign(df, "loss_check", checks)
    return out


def _median(values: list[float]) -> float:
    finite_values = [v for v in values if math.isfinite(v)]
    return statistics.median(finite_values) if finite_values else math.nan


def _max_rel(curve: tuple[float, ...], ref: list[float]) -> tuple[float, int]:
    """Largest relative difference from the reference and its step; inf at a non-finite loss."""
    worst, at = 0.0, 0
    for k, (x, r) in enumerate(zip(curve, ref)):
        if not (math.isfinite(x) and math.isfinite(r)):
            return math.inf, k
        d = abs(x - r) / abs(r) if r else abs(x - r)
        if d > worst:
            worst, at = d, k
    return worst, at


def _int(x: Any) -> str:
    return str(int(x)) if finite(x) else "?"


# --- verdicts ------------------------------------------------------------------------------

def pooled_cv(configs: list[Config], metric: str) -> float | None:
    """Median relative sd of a metric over configurations with repeats (the noise level here)."""
    cvs = [e.sd / abs(e.mean) for c in configs if (e := c.get(metric)) is not None
           and e.sd is not None and e.mean and e.n > 1]
    return statistics.median(cvs) if cvs else None


def group_label(c: Config) -> str:
    parts = [f"{int(c.world_size)} dev", f"{c.model}", f"seq {_int(c.seq_len)}", str(c.precision)]
    if isinstance(c.gpu_shape, str):
        parts.append(c.gpu_shape)
    return ", ".join(parts)


def _verdicts(configs: list[Config]) -> list[Verdict]:
    out: list[Verdict] = []
    groups: dict[str, list[Config]] = {}
    for c in configs:
        groups.setdefault(_key(c.key, GROUP), []).append(c)
    cvs = {cat.metric: pooled_cv(configs, cat.metric) for cat in CATEGORIES}
    for group in groups.values():
        for cat in CATEGORIES:
            v = _verdict(cat, group, cvs[cat.metric])
            if v is not None:
                out.append(v)
    return out


def _verdict(cat: Category, group: list[Config], cv: float | None) -> Verdict | None:
    """Best against runner-up of one category in one comparison group; cv: the metric's noise."""
    sign = -1 if cat.higher_is_better else 1
    per_strategy: dict[str, Config] = {}
    for c in group:
        e = c.get(cat.metric)
        if e is None or (cat.metric == "scaling_efficiency" and c.base_world_size == int(c.world_size)):
            continue
        held = per_strategy.get(str(c.strategy))
        if held is None or sign * e.mean < sign * held.get(cat.metric).mean:
            per_strategy[str(c.strategy)] = c
    if len(per_strategy) < 2:
        return None
    best, second = sorted(per_strategy.values(), key=lambda c: sign * c.get(cat.metric).mean)[:2]
    b, s = best.get(cat.metric), second.get(cat.metric)
    margin = abs(b.mean - s.mean) / abs(s.mean) * 100 if s.mean else math.nan
    both = f"{best.strategy} {cat.show(b)} vs {second.strategy} {cat.show(s)}"
    need = repeats_needed(b.mean, s.mean, cv)
    need_text = ("the means are equal" if b.mean == s.mean
                 else f"about {need} repeats would separate a difference this size" if need
                 else f"rerun with at least {MIN_REPEATS} repeats" if cv is None
                 else "the difference is within the noise even at 100 repeats")
    blocking = best.flags if cat.timed else [f for f in best.flags if f.startswith("broken")]
    if blocking:
        kind, text = "flagged", f"not named: {best.strategy} has the best mean but is flagged ({'; '.join(blocking)}); {both}"
    elif not (b.has_interval and s.has_interval):
        kind, text = "one repeat", f"no winner from one repeat: {both}; {need_text}"
    elif separated(b, s):
        word = "higher" if b.mean > s.mean else "lower"
        kind, text = "winner", f"**{best.strategy}** {cat.show(b)}, {margin:.1f}% {word} than {second.strategy} {cat.show(s)}"
    else:
        kind, text = "no significant difference", f"no significant difference: {both} (intervals overlap); {need_text}"
    return Verdict(cat, group_label(best), kind, best, second, margin, text)


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
        ns = [repeats_needed(v.best.get(v.category.metric).mean, v.second.get(v.category.metric).mean,
                             pooled_cv(an.configs, v.category.metric)) for v in need]
        n = max([x for x in ns if x] or [MIN_REPEATS])
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


def _parts(c: Config) -> str:
    if not c.breakdown:
        return f"{c.est['model_state_gib_per_rank'].mean * 1024:.1f} MiB (no breakdown recorded)"
    return ", ".join(f"{k.replace('_', ' ')} {v * 1024:.1f} MiB" for k, v in c.breakdown.items())
