"""The loss check: runs that must follow one trajectory are compared step by step.

A loss group is every ok run whose measured settings are equal except strategy, launcher and
the data layout (world size, nodes, micro-batch, grad-accum) at the same global batch
(suite/analyze/groups.py). Each run's loss at every step is compared with the group's per-step
median, and so is its gradient norm (the global norm before clipping, `grad_norm_per_step`):
Adam divides the gradient's scale away, so a reduction that sums instead of averaging (x world
size) moves the loss by ~1e-7 but doubles the gradient norm at 2 ranks.

The median is that of the largest side of runs that agree with each other when it is a majority;
with an even split (2 against 2, 1 against 1) the group's runs are "disagree", listed by side, and
none is called broken. A step without a gradient norm (fp16's overflow skip) is compared only
where both norms are finite. `loss_check_failed` names what was off: loss, gradient norm or both.
"""
from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from shardbench.suite.analyze import groups
from shardbench.suite.analyze.stats import finite

# Relative, per step, a small multiple of the largest spread measured between strategies and
# layouts of one group (benchmarks/losscheck_spread.py; docs/verdicts.md "Loss-check tolerances"):
# tiny, seq 64, global batch 4, 6 steps, ddp at 1 rank and ddp/fsdp/zero1/zero2/zero3 at 2 ranks.
# bf16 spread: loss 9.2e-5, gradient norm 2.2e-3 -> 3e-4 and 1e-2 (a learning rate 10% off:
# 4.1e-4 and 2.4e-2, caught; the old 1e-2 / 5e-2 let it pass). fp16 keeps 3 more mantissa bits
# than bf16: it takes bf16's (looser) tolerances, not measured apart.
# The gradient norm is looser than the loss: it sums squares of every gradient element, and the
# order of the reduction differs between strategies.
LOSS_TOLERANCE = {"fp32": 1e-4, "bf16": 3e-4, "fp16": 3e-4}
GRAD_NORM_TOLERANCE = {"fp32": 1e-2, "bf16": 1e-2, "fp16": 1e-2}

# float8 (--float8, torchao), measured against bf16 by benchmarks/float8_spread.py: tiny 64 wide,
# vocabulary 2,048, seq 32, global batch 2, 6 steps, lr 1e-3, seeds 3 and 11, bf16 autocast around
# the float8 matmuls, ddp at 1 rank and fsdp at 2 (tensorwise all-gathering in float8). Float8 vs
# bf16 of the same layout: loss up to 2.8e-4, gradient norm 8.6e-3; between the layouts inside one
# recipe: loss 4.7e-4, gradient norm 7.4e-3 (bf16's own: 1.4e-4 and 3.4e-3). The tolerances are
# about 2x the largest of these: they judge float8 groups (runs of one recipe) and float8 against
# bf16 (drifts).
FLOAT8_LOSS_TOLERANCE = 1e-3
FLOAT8_GRAD_NORM_TOLERANCE = 2e-2


@dataclass
class LossGroup:
    label: str
    tolerance: float
    runs: int
    strategies: list[str]
    max_rel: float | None
    broken: list[tuple[str, str]]
    """(run id, why) of each run off the reference."""
    grad_tolerance: float | None = None
    grad_max_rel: float | None = None
    """Largest relative gradient-norm difference; None when no two runs recorded the norm."""
    sides: list[list[str]] = field(default_factory=list)
    """Run ids of each side when no side agrees in a majority (an even split): which runs are
    right is unknown, so none is called broken; empty when a majority agrees."""


def _key(precision: Any, grad_reduce_dtype: Any) -> str:
    """The precision whose tolerance applies: the run's, or bf16 when an fp32 run reduces in bf16."""
    if str(precision) in LOSS_TOLERANCE and str(precision) != "fp32":
        return str(precision)
    return "bf16" if isinstance(grad_reduce_dtype, str) and grad_reduce_dtype in ("bf16", "fp16") else \
        str(precision) if str(precision) in LOSS_TOLERANCE else "bf16"


def _float8(float8: Any) -> bool:
    return isinstance(float8, str) and float8 != "off"


def loss_tolerance(precision: Any, grad_reduce_dtype: Any = None, float8: Any = None) -> float:
    return FLOAT8_LOSS_TOLERANCE if _float8(float8) else LOSS_TOLERANCE[_key(precision, grad_reduce_dtype)]


def grad_norm_tolerance(precision: Any, grad_reduce_dtype: Any = None, float8: Any = None) -> float:
    return FLOAT8_GRAD_NORM_TOLERANCE if _float8(float8) else GRAD_NORM_TOLERANCE[_key(precision, grad_reduce_dtype)]


def curve(values: Any) -> Sequence[float] | None:
    """A per-step list as floats (anything else NaN); None when not recorded."""
    if isinstance(values, array) and values:  # already floats (suite/analyze/compact.py)
        return values
    if not isinstance(values, (list, tuple)) or not values:
        return None
    return tuple(float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan for x in values)


def check(df: pd.DataFrame) -> list[LossGroup]:
    """Fill loss_check / loss_max_rel_diff / grad_norm_max_rel_diff of df's ok runs; the groups."""
    ok = df[(df["status"] == "ok") & df["loss_curve"].notna()]
    out: list[LossGroup] = []
    if ok.empty:
        return out
    # Strategy-specific settings (buckets, resharding, sync schedule) must not change the trajectory.
    ignore = groups.specific(list(ok["settings"]))
    found = [g for _, g in ok.groupby(ok["settings"].map(lambda s: _loss_key(s, ignore)), sort=True)
             if len(g) >= 2]
    # What tells two groups apart goes into their labels (a swept knob made two identical lines).
    varying = groups.differences([groups.merged(list(g["settings"])) for g in found], groups.LOSS_EXCEPT | ignore)
    filled: dict[str, dict[Any, Any]] = {col: {} for col in _FILLED}
    for group in found:
        out.append(_group(filled, group, varying))
    # One write per column: a df.at per run and column was a third of the check's time.
    for col, values in filled.items():
        if values:
            old = df[col] if col in df.columns else pd.Series(None, index=df.index, dtype=object)
            df[col] = pd.Series([values.get(i, v) for i, v in zip(df.index, old)], index=df.index, dtype=object)
    return out


_FILLED = ("loss_max_rel_diff", "grad_norm_max_rel_diff", "loss_check_failed", "loss_check")
"""The df columns the check fills for the runs of its groups."""
_ROW = ["run_id", "loss_curve", "grad_norm_curve"]


def _loss_key(s: dict[str, Any], ignore: frozenset[str]) -> str:
    """The loss group's key; PowerSGD runs also by world size: it compresses each rank's gradient
    before the average, so its error, and the trajectory, depend on the number of ranks."""
    key = groups.key(s, groups.LOSS_EXCEPT | ignore)
    return key + f"|world {s.get('world_size')}" if _per_world(s) else key


def _per_world(s: dict[str, Any]) -> bool:
    """A trajectory that depends on the number of ranks (PowerSGD): its loss groups are per world size."""
    return s.get("ddp_comm_hook") == "powersgd"


def _group(filled: dict[str, dict[Any, Any]], group: pd.DataFrame, varying: list[str] = []) -> LossGroup:  # noqa: B006 - read only
    """The group's LossGroup; its runs' values of _FILLED into `filled` (column -> label -> value)."""
    first = group.iloc[0]
    float8 = first["settings"].get("float8") if isinstance(first["settings"], dict) else None
    tol = loss_tolerance(first["precision"], first["grad_reduce_dtype"], float8)
    gtol = grad_norm_tolerance(first["precision"], first["grad_reduce_dtype"], float8)
    rows = list(zip(group.index, group[_ROW].to_dict("records")))
    has_norms = sum(row["grad_norm_curve"] is not None for _, row in rows) >= 2
    label = _label(first, varying, groups.merged(list(group["settings"])))
    if isinstance(first["settings"], dict) and _per_world(first["settings"]):  # its groups at 1 and 2 ranks
        label += f", {_int(first['world_size'])} ranks"  # read the same without it
    strategies = sorted(set(map(str, group["strategy"])))
    # The reference is the median of the largest side of runs that agree with each other; with no
    # side in the majority (an even split) there is no reference to call either side broken by.
    sides = _sides([row for _, row in rows], tol, gtol)
    majority = sides[0] if len(sides[0]) * 2 > len(rows) else None
    trusted = majority if majority is not None else [row for _, row in rows]
    ref = _reference([r["loss_curve"] for r in trusted])
    norms = [r["grad_norm_curve"] for r in trusted if r["grad_norm_curve"] is not None]
    gref = _reference(norms) if has_norms and norms else None
    broken, worst, gworst = [], 0.0, None
    for idx, row in rows:
        rel, step = _max_rel(row["loss_curve"][:len(ref)], ref)
        filled["loss_max_rel_diff"][idx] = rel if math.isfinite(rel) else None
        why, failed = [], []
        if not math.isfinite(rel) or rel > tol:
            failed.append("loss")
            why.append(f"step {step}: loss {row['loss_curve'][step]:.6g} vs reference {ref[step]:.6g} "
                       f"({'not finite' if not math.isfinite(rel) else f'{rel:.2g} relative'} > {tol:g})")
        worst = max(worst, rel) if math.isfinite(rel) else worst
        g = row["grad_norm_curve"]
        if gref is not None and g is not None:
            # fp16: a step skipped on overflow has no norm (None -> NaN); compared only where both are finite
            grel, gstep = _max_rel(g[:len(gref)], gref, skip_non_finite=True)
            filled["grad_norm_max_rel_diff"][idx] = grel
            gworst = max(gworst or 0.0, grel)
            if grel > gtol:
                failed.append("gradient norm")
                why.append(f"step {gstep}: gradient norm {g[gstep]:.6g} vs reference {gref[gstep]:.6g} "
                           f"({grel:.2g} relative > {gtol:g})")
        filled["loss_check_failed"][idx] = " and ".join(failed) or None
        if majority is None:
            filled["loss_check"][idx] = "disagree"
        else:
            filled["loss_check"][idx] = "broken" if why else "ok"
            if why:
                broken.append((str(row["run_id"]), "; ".join(why)))
    split = [sorted(str(r["run_id"]) for r in side) for side in sides] if majority is None else []
    return LossGroup(label, tol, len(group), strategies, worst, broken, gtol if gref is not None else None, gworst,
                     split)


def _agree(a: Any, b: Any, tol: float, gtol: float) -> bool:
    """Two runs on one trajectory: loss within tol of each other, gradient norms (where both are
    finite) within gtol."""
    length = min(len(a["loss_curve"]), len(b["loss_curve"]))
    if _max_rel(a["loss_curve"][:length], list(b["loss_curve"][:length]))[0] > tol:
        return False
    ga, gb = a["grad_norm_curve"], b["grad_norm_curve"]
    if ga is None or gb is None:
        return True
    length = min(len(ga), len(gb))
    return _max_rel(ga[:length], list(gb[:length]), skip_non_finite=True)[0] <= gtol


def _sides(rows: list[Any], tol: float, gtol: float) -> list[list[Any]]:
    """Runs grouped by agreement (each joins the first side whose first run it agrees with),
    largest side first."""
    sides: list[list[Any]] = []
    for row in rows:
        side = next((s for s in sides if _agree(s[0], row, tol, gtol)), None)
        if side is None:
            sides.append([row])
        else:
            side.append(row)
    return sorted(sides, key=len, reverse=True)


_IN_LABEL = {"model", "seq_len", "precision", "resolved_global_batch", "steps", "lr", "seed"}
"""Not knob-derived on purpose: the settings _label's fixed text below already prints (so a
varying one is not shown twice); every other varying setting is appended by name."""


def _label(first: Any, varying: list[str], settings: dict[str, Any]) -> str:
    text = (f"{first['model']}, seq {_int(first['seq_len'])}, {first['precision']}, "
            f"global batch {_int(first['global_batch'])}")
    if finite(first["lr"]):
        text += f", {_int(first['steps'])} steps, lr {first['lr']:g}, seed {_int(first['seed'])}"
    extra = [shown for k in varying if k not in _IN_LABEL and (shown := groups.shown(k, settings.get(k)))]
    return ", ".join([text, *extra])


def _reference(curves: list[tuple[float, ...]]) -> list[float]:
    length = min(len(c) for c in curves)
    return [_median([c[k] for c in curves]) for k in range(length)]


def _median(values: list[float]) -> float:
    finite_values = [v for v in values if math.isfinite(v)]
    return statistics.median(finite_values) if finite_values else math.nan


def _max_rel(values: tuple[float, ...], ref: list[float], skip_non_finite: bool = False) -> tuple[float, int]:
    """Largest relative difference from the reference and its step; inf at a non-finite value,
    or with skip_non_finite such steps left out."""
    worst, at = 0.0, 0
    for k, (x, r) in enumerate(zip(values, ref)):
        if not (math.isfinite(x) and math.isfinite(r)):
            if skip_non_finite:
                continue
            return math.inf, k
        d = abs(x - r) / abs(r) if r else abs(x - r)
        if d > worst:
            worst, at = d, k
    return worst, at


def _int(x: Any) -> str:
    return str(int(x)) if finite(x) else "?"


# --- settings that change the trajectory ---------------------------------------------------

@dataclass
class Drift:
    """Runs that differ from a loss group only in a setting that changes the trajectory by design
    (a knob with `changes_loss`: float8, a compressing DDP hook), against that setting's default:
    the difference of their per-step medians, a measurement, never a broken run."""

    setting: str
    value: Any
    baseline: Any
    label: str
    runs: int
    baseline_runs: int
    max_rel: float
    """Largest relative difference of the loss medians, per step."""
    step: int
    grad_max_rel: float | None
    tolerance: float | None
    """float8: the measured float8 tolerance (FLOAT8_LOSS_TOLERANCE); None where the difference is
    only reported (a hook: PowerSGD's drift grows with the steps)."""

    @property
    def within(self) -> bool | None:
        return None if self.tolerance is None else self.max_rel <= self.tolerance


def drifts(df: pd.DataFrame) -> list[Drift]:
    """For each `changes_loss` knob, every group of ok runs equal except it (and the loss check's
    own exceptions), each value's median curve against the default's."""
    from shardbench.trainer import knobs

    ok = df[(df["status"] == "ok") & df["loss_curve"].notna()]
    if ok.empty:
        return []
    rows = [row for _, row in ok.iterrows()]
    ignore = groups.specific([r["settings"] for r in rows])
    out: list[Drift] = []
    for name, default in sorted(knobs.changes_loss().items()):
        found: dict[str, dict[str, list[Any]]] = {}
        for r in rows:
            key = groups.key(r["settings"], groups.LOSS_EXCEPT | ignore | {name})
            value = groups._dump(r["settings"].get(name))
            if r["settings"].get("ddp_comm_hook") == "powersgd":  # its drift depends on the world size (_loss_key)
                value += f"|world {r['settings'].get('world_size')}"
            found.setdefault(key, {}).setdefault(value, []).append(r)
        for by_value in found.values():
            base = by_value.get(groups._dump(default))
            if not base:
                continue
            ref = _reference([r["loss_curve"] for r in base])
            base_norms = [r["grad_norm_curve"] for r in base if r["grad_norm_curve"] is not None]
            for value, members in sorted(by_value.items()):
                if value == groups._dump(default):
                    continue
                mine = _reference([r["loss_curve"] for r in members])
                rel, step = _max_rel(tuple(mine[:len(ref)]), ref)
                norms = [r["grad_norm_curve"] for r in members if r["grad_norm_curve"] is not None]
                grel = (_max_rel(tuple(_reference(norms)), _reference(base_norms), skip_non_finite=True)[0]
                        if norms and base_norms else None)
                first = members[0]
                shown = first["settings"].get(name)
                tol = FLOAT8_LOSS_TOLERANCE if name == "float8" else None
                label = _label(first, [], first["settings"])
                if "|world " in value:
                    label += f", {value.split('|world ')[1]} ranks"
                out.append(Drift(name, shown, default, label, len(members), len(base), rel, step, grel, tol))
    return out
