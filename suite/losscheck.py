"""The loss check: runs that must follow one trajectory are compared step by step.

A loss group is every ok run whose measured settings are equal except strategy, launcher and
the data layout (world size, nodes, micro-batch, grad-accum) at the same global batch
(suite/groups.py). Each run's loss at every step is compared with the group's per-step
median, and so is its gradient norm (the global norm before clipping, `grad_norm_per_step`):
Adam divides the gradient's scale away, so a reduction that sums instead of averaging (x world
size) moves the loss by ~1e-7 but doubles the gradient norm at 2 ranks.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import pandas as pd

from shardbench.suite import groups
from shardbench.suite.stats import finite

LOSS_TOLERANCE = {"fp32": 1e-4}
OTHER_LOSS_TOLERANCE = 1e-2  # bf16, fp16
GRAD_NORM_TOLERANCE = {"fp32": 1e-2}
"""Relative, per step. Looser than the loss: the norm sums squares of every gradient element, and
the order of the reduction differs between strategies (measured on real fp32 runs: README)."""
OTHER_GRAD_NORM_TOLERANCE = 5e-2


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


def _sixteen_bit(precision: Any, grad_reduce_dtype: Any) -> bool:
    return (isinstance(grad_reduce_dtype, str) and grad_reduce_dtype in ("bf16", "fp16")) or str(precision) != "fp32"


def loss_tolerance(precision: Any, grad_reduce_dtype: Any = None) -> float:
    """1e-4 for fp32 compute with fp32 (or unrecorded) gradient reduction; 1e-2 with any 16-bit part."""
    if isinstance(grad_reduce_dtype, str) and grad_reduce_dtype in ("bf16", "fp16"):
        return OTHER_LOSS_TOLERANCE
    return LOSS_TOLERANCE.get(str(precision), OTHER_LOSS_TOLERANCE)


def grad_norm_tolerance(precision: Any, grad_reduce_dtype: Any = None) -> float:
    return OTHER_GRAD_NORM_TOLERANCE if _sixteen_bit(precision, grad_reduce_dtype) else GRAD_NORM_TOLERANCE["fp32"]


def curve(values: Any) -> tuple[float, ...] | None:
    """A per-step list as floats (anything else NaN); None when not recorded."""
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
    found = [g for _, g in ok.groupby(ok["settings"].map(lambda s: groups.loss_key(s, ignore)), sort=True)
             if len(g) >= 2]
    # What tells two groups apart goes into their labels (a swept knob made two identical lines).
    varying = groups.differences([groups.merged(list(g["settings"])) for g in found], groups.LOSS_EXCEPT | ignore)
    for group in found:
        out.append(_group(df, group, varying))
    return out


def _group(df: pd.DataFrame, group: pd.DataFrame, varying: list[str] = []) -> LossGroup:  # noqa: B006 - read only
    first = group.iloc[0]
    tol = loss_tolerance(first["precision"], first["grad_reduce_dtype"])
    gtol = grad_norm_tolerance(first["precision"], first["grad_reduce_dtype"])
    ref = _reference(list(group["loss_curve"]))
    norms = [c for c in group["grad_norm_curve"] if c is not None]
    gref = _reference(norms) if len(norms) >= 2 else None
    broken, worst, gworst = [], 0.0, None
    for idx, row in group.iterrows():
        rel, step = _max_rel(row["loss_curve"][:len(ref)], ref)
        df.at[idx, "loss_max_rel_diff"] = rel if math.isfinite(rel) else None
        why = []
        if not math.isfinite(rel) or rel > tol:
            why.append(f"step {step}: loss {row['loss_curve'][step]:.6g} vs reference {ref[step]:.6g} "
                       f"({'not finite' if not math.isfinite(rel) else f'{rel:.2g} relative'} > {tol:g})")
        worst = max(worst, rel) if math.isfinite(rel) else worst
        g = row["grad_norm_curve"]
        if gref is not None and g is not None:
            grel, gstep = _max_rel(g[:len(gref)], gref)
            df.at[idx, "grad_norm_max_rel_diff"] = grel if math.isfinite(grel) else None
            gworst = max(gworst or 0.0, grel) if math.isfinite(grel) else gworst
            if not math.isfinite(grel) or grel > gtol:
                why.append(f"step {gstep}: gradient norm {g[gstep]:.6g} vs reference {gref[gstep]:.6g} "
                           f"({'not finite' if not math.isfinite(grel) else f'{grel:.2g} relative'} > {gtol:g})")
        df.at[idx, "loss_check"] = "broken" if why else "ok"
        if why:
            broken.append((str(row["run_id"]), "; ".join(why)))
    return LossGroup(_label(first, varying, groups.merged(list(group["settings"]))), tol, len(group), sorted(set(map(str, group["strategy"]))), worst, broken,
                     gtol if gref is not None else None, gworst)


_IN_LABEL = {"model", "seq_len", "precision", "resolved_global_batch", "steps", "lr", "seed"}


def _label(first: Any, varying: list[str], settings: dict[str, Any]) -> str:
    text = f"{first['model']}, seq {_int(first['seq_len'])}, {first['precision']}, global batch {_int(first['global_batch'])}"
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


def _max_rel(values: tuple[float, ...], ref: list[float]) -> tuple[float, int]:
    """Largest relative difference from the reference and its step; inf at a non-finite value."""
    worst, at = 0.0, 0
    for k, (x, r) in enumerate(zip(values, ref)):
        if not (math.isfinite(x) and math.isfinite(r)):
            return math.inf, k
        d = abs(x - r) / abs(r) if r else abs(x - r)
        if d > worst:
            worst, at = d, k
    return worst, at


def _int(x: Any) -> str:
    return str(int(x)) if finite(x) else "?"
