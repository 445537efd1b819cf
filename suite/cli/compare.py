"""`shardbench compare A B`: two result sets side by side, e.g. before and after a driver or NCCL
upgrade, a new image, another node pool.

Configurations are matched by config_id, the hash of every field that changes the measurement
(trainer.contract): versions of torch, NCCL or the driver are recorded but not hashed, so the same
matrix run before and after an upgrade matches configuration for configuration.

For every matched configuration and metric: A's and B's mean with its 95% interval (the analysis
of suite/analyze/analysis.py, the report's), and the change B / A - 1 with a 95% interval propagated
from both spreads (delta method, Welch-Satterthwaite degrees of freedom: stats.ratio, as the
report's scaling efficiency). A change is *significant* only when that interval excludes zero
and neither side is flagged (spread, overloaded host, efficiency above 1.05, broken loss); one
repeat on either side tests nothing. Configurations found on one side only are listed; two sets
with no configuration in common are a CompareError (exit 2), never an empty, passing comparison.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardbench.suite.analyze.analysis import Analysis, MeasuredConfig, analyze
from shardbench.suite.analyze.rows import load_records
from shardbench.suite.analyze.stats import Estimate, ratio

# (metric, label, higher is better, format of a value)
METRICS: list[tuple[str, str, bool, str]] = [
    ("tokens_per_s", "tok/s", True, "{:,.0f}"),
    ("step_time_mean_s", "step s", False, "{:.4f}"),
    ("model_state_gib_per_rank", "state GiB/rank", False, "{:.4g}"),
    ("train_peak_gib", "GPU peak GiB", False, "{:.3f}"),
    ("mfu", "MFU", True, "{:.4f}"),
]
UNTIMED = ("model_state_gib_per_rank", "train_peak_gib")
"""Counted, not timed (analysis.Category.timed): noise flags do not block their comparison."""
VERSION_KEYS = ("torch", "cuda", "nccl", "deepspeed", "driver", "driver_cuda", "image", "python", "shardbench")


@dataclass
class Change:
    config: str
    """The configuration's readable name (A's first run id without -rN)."""
    label: str
    metric: str
    unit: str
    a: Estimate
    b: Estimate
    change: Estimate | None
    """B / A - 1 with its 95% interval (None when A's mean is 0)."""
    verdict: str
    """significant (better|worse), no significant change, one repeat, flagged."""


@dataclass
class Comparison:
    a: Path
    b: Path
    changes: list[Change]
    only_a: list[str]
    only_b: list[str]
    versions: list[str]
    """One line per version that differs between the sets, e.g. "nccl: 2.21.5 -> 2.23.4"."""

    def significant(self, worse_only: bool = False) -> list[Change]:
        return [c for c in self.changes
                if c.verdict.startswith("significant") and (not worse_only or "worse" in c.verdict)]


class CompareError(ValueError):
    """A side that cannot be compared (one line: what and how to fix it)."""


def load_side(path: Path) -> tuple[Analysis, list[dict]]:
    if not path.is_dir():
        raise CompareError(f"{path}: no such results directory")
    records = load_records(path)
    if not records:
        raise CompareError(f"{path}: no <run-id>/result.json here (give a result set, e.g. results/default)")
    return analyze(records), records


def compare_dirs(a: str | Path, b: str | Path) -> Comparison:
    a, b = Path(a), Path(b)
    (an_a, rec_a), (an_b, rec_b) = load_side(a), load_side(b)
    by_a = {str(c.config_id): c for c in an_a.configs}
    by_b = {str(c.config_id): c for c in an_b.configs}
    changes = []
    for cid, ca in by_a.items():
        cb = by_b.get(cid)
        if cb is not None:
            changes += _changes(ca, cb)
    if not set(by_a) & set(by_b):
        # A comparison of nothing must not pass a CI gate (--fail-on-worse) vacuously.
        raise CompareError(f"no configuration is in both {a} and {b}: compare result sets run with the same "
                           "knobs (ids written before config id version 2 match nothing newer: re-run one side)")
    only_a = [c.name for cid, c in by_a.items() if cid not in by_b]
    only_b = [c.name for cid, c in by_b.items() if cid not in by_a]
    return Comparison(a, b, changes, only_a, only_b, version_changes(rec_a, rec_b))


def _changes(ca: MeasuredConfig, cb: MeasuredConfig) -> list[Change]:
    out = []
    for metric, unit, higher, _ in METRICS:
        ea, eb = ca.get(metric), cb.get(metric)
        if ea is None or eb is None:
            continue
        r = ratio(eb, ea)
        # B/A - 1 with the ratio's own (log-scale, asymmetric) interval shifted the same way
        change = None if r is None else Estimate(r.n, r.mean - 1, r.sd, *((r.lo - 1, r.hi - 1) if r.has_interval  # type: ignore[operator]
                                                                           else (None, None)))
        timed = metric not in UNTIMED
        out.append(Change(ca.name, ca.label, metric, unit, ea, eb, change, _verdict(change, ca, cb, higher, timed)))
    return out


def _verdict(change: Estimate | None, ca: MeasuredConfig, cb: MeasuredConfig, higher: bool, timed: bool = True) -> str:
    # As in the report: noise flags block timed metrics; memory is counted, only a broken run blocks it.
    flagged = [side for side, c in (("A", ca), ("B", cb)) if c.broken or (timed and c.flags)]
    if flagged:
        return f"flagged in {' and '.join(flagged)}: re-measure (command below)"
    if change is None:
        return "no test (A's mean is 0)"
    if not change.has_interval:
        return "one repeat: no test"
    if change.lo <= 0 <= change.hi:  # type: ignore[operator]
        return "no significant change"
    better = (change.mean > 0) == higher
    return f"significant ({'better' if better else 'worse'})"


def version_changes(rec_a: list[dict], rec_b: list[dict]) -> list[str]:
    """What differs in the recorded software versions and NCCL_* settings (what an upgrade changed)."""
    def seen(records: list[dict], key: str) -> str:
        values = sorted({str(v) for r in records for v in [(r.get("versions") or {}).get(key)]
                         if v not in (None, "")})
        return ", ".join(values) or "-"

    def env(records: list[dict], key: str) -> str:
        return ", ".join(sorted({str((r.get("nccl_env") or {}).get(key, "-")) for r in records})) or "-"

    out = []
    for key in VERSION_KEYS:
        va, vb = seen(rec_a, key), seen(rec_b, key)
        if va != vb:
            out.append(f"{key}: {va} -> {vb}")
    names = sorted({k for r in rec_a + rec_b for k in (r.get("nccl_env") or {})})
    out += [f"{k}: {env(rec_a, k)} -> {env(rec_b, k)}" for k in names if env(rec_a, k) != env(rec_b, k)]
    return out


# --- output --------------------------------------------------------------------------------

def _fmt(e: Estimate | None, spec: str) -> str:
    if e is None or not math.isfinite(e.mean):
        return "-"
    if e.has_interval:
        return f"{spec.format(e.mean)} [{spec.format(e.lo)}, {spec.format(e.hi)}] n={e.n}"
    return f"{spec.format(e.mean)} n={e.n}"


def _pct(e: Estimate | None) -> str:
    if e is None:
        return "-"
    if e.has_interval:
        return f"{e.mean:+.1%} [{e.lo:+.1%}, {e.hi:+.1%}]"
    return f"{e.mean:+.1%}"


def rows(cmp: Comparison) -> list[dict[str, Any]]:
    specs = {m: spec for m, _, _, spec in METRICS}
    return [{"configuration": c.config, "label": c.label, "metric": c.unit, "A": _fmt(c.a, specs[c.metric]),
             "B": _fmt(c.b, specs[c.metric]), "change [95%]": _pct(c.change), "verdict": c.verdict}
            for c in cmp.changes]


def text(cmp: Comparison) -> str:
    """The comparison as a plain-text table plus the lines around it."""
    lines = [f"A = {cmp.a}", f"B = {cmp.b}",
             "changes are B / A - 1 with 95% intervals; significant = the interval excludes 0 "
             "and neither side is flagged"]
    lines += ["software: " + "; ".join(cmp.versions)] if cmp.versions else ["software: same versions recorded"]
    table = rows(cmp)
    if table:
        headers = list(table[0])
        widths = {h: max(len(h), *(len(str(r[h])) for r in table)) for h in headers}
        lines.append("  ".join(h.ljust(widths[h]) for h in headers))
        lines += ["  ".join(str(r[h]).ljust(widths[h]) for h in headers) for r in table]
    for side, names in (("A", cmp.only_a), ("B", cmp.only_b)):
        if names:
            lines.append(f"only in {side}: {', '.join(names)}")
    for side, path in (("A", cmp.a), ("B", cmp.b)):
        if any(side in c.verdict.split(":")[0] for c in cmp.changes if c.verdict.startswith("flagged in")):
            # The whole command: --rerun-flagged alone re-measures the default matrix in results/default.
            lines.append(f"re-measure {side}'s flagged runs: shardbench run --matrix MATRIX.yaml --results {path} "
                         f"--rerun-flagged   (MATRIX.yaml: the matrix that wrote {path})")
    sig = cmp.significant()
    lines.append(f"{len(sig)} significant change(s) in {len(cmp.changes)} comparison(s)"
                 + (f" ({len(cmp.significant(worse_only=True))} worse)" if sig else ""))
    return "\n".join(line.rstrip() for line in lines)


def write_csv(cmp: Comparison, path: Path) -> Path:
    data = rows(cmp)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(data[0]) if data else ["configuration"])
        writer.writeheader()
        writer.writerows(data)
    return path
