"""Two report sections of issue 23, from the records alone (plus the tune's own file):
- "Launcher start-up": `launcher_startup_s` per launcher (torchrun, mpirun, DeepSpeed, Ray), mean
  and 95% interval over every run that has it: the launcher's overhead as a measured axis.
- "Tuned vs default": when the result set was written by `shardbench tune` (its TUNING_FILE names,
  per strategy, the config ids of the default and the tuned configuration), tokens/s of each with
  its interval and their ratio (delta method, suite/analyze/stats.ratio).
markdown.py appends them; suite/tune/tuner.py writes TUNING.md with the second."""
from __future__ import annotations

import json
from pathlib import Path

from shardbench.suite.analyze.stats import Estimate, estimate, ratio, welch
from shardbench.suite.analyze.verdicts import ALPHA

TUNING_FILE = "tuning.json"
"""In a result set written by tune: {strategy: {"default": {config_id, params}, "tuned": {...}}}."""


def _fmt(e: Estimate | None, spec: str = "{:,.0f}") -> str:
    if e is None:
        return "no ok run"
    if not e.has_interval:
        return f"{spec.format(e.mean)} (n={e.n})"
    return f"{spec.format(e.mean)} [{spec.format(e.lo)}, {spec.format(e.hi)}] (n={e.n})"


def _table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def startup_section(records: list[dict]) -> str:
    by: dict[str, list[float]] = {}
    for r in records:
        if r.get("status") == "ok" and isinstance(r.get("launcher_startup_s"), (int, float)):
            by.setdefault(str(r.get("launcher") or "?"), []).append(r["launcher_startup_s"])
    if not by:
        return ""
    rows = [[name, _fmt(estimate(v), "{:.2f}")] for name, v in sorted(by.items())]
    return ("## Launcher start-up\n\nSeconds from the launch command's start to the start of the last "
            "rank's process (`launcher_startup_s`, /proc start times), mean [95% interval] over the ok "
            "runs of each launcher, whatever their configuration.\n\n" + _table(["launcher", "start-up s"], rows))


def tuned_section(records: list[dict], tuning: dict) -> str:
    """Per strategy: default and tuned tokens/s with intervals, their ratio, and a verdict by the
    report's rule for two candidates (Welch at 5%; a flagged configuration is never named faster)
    with the flags (suite/analyze/analysis.py: noise, overloaded host, broken loss)."""
    tps: dict[str, list[float]] = {}
    for r in records:
        if r.get("status") == "ok":
            tps.setdefault(_config_of(r), []).append(r.get("tokens_per_s"))  # type: ignore[arg-type]
    flags = _flags(records)
    rows = []
    for strategy, t in tuning.items():
        default, tuned = t["default"], t.get("tuned")
        d = estimate(tps.get(default["config_id"], []))
        same = bool(tuned) and tuned["config_id"] == default["config_id"]
        b = estimate(tps.get(tuned["config_id"], [])) if tuned else None
        over = default.get("over_limit")
        r = ratio(b, d) if b and d and not same else None  # type: ignore[assignment]
        d_flags = flags.get(default["config_id"], [])
        b_flags = flags.get(tuned["config_id"], []) if tuned and not same else []
        if over:
            verdict = (f"the default breaks the limit ({over}): not run; the tuned configuration is the "
                       "only one within it" if tuned else f"the default breaks the limit ({over}) and no trial fit")
        elif not tuned:
            verdict = "no trial fit the limit"
        elif same:
            verdict = "the default is the best trial"
        else:
            verdict = _verdict(d, b, d_flags, b_flags)
        shown = "; ".join(f"{name}: {'; '.join(f)}" for name, f in (("default", d_flags), ("tuned", b_flags)) if f)
        rows.append([strategy, _params(default["params"]), "not run (over the limit)" if over else _fmt(d),
                     _params(tuned["params"]) if tuned else "none feasible", _fmt(b),
                     "-" if r is None else _fmt(r, "{:.3f}"), verdict, shown or "-"])  # type: ignore[arg-type]
    return ("## Tuned vs default\n\nTokens/s per strategy, mean [95% interval] over the re-measured "
            "repeats (interleaved), of the default configuration and of the best trial of "
            "`shardbench tune`; the ratio's interval propagates both (delta method). The verdict is the "
            f"report's rule: Welch's test at {ALPHA:.0%}, and a flagged configuration (noise, overloaded host) "
            "is never named faster.\n\n"
            + _table(["strategy", "default", "tok/s default", "tuned", "tok/s tuned", "tuned / default",
                      "verdict", "flags"], rows))


def _flags(records: list[dict]) -> dict[str, list[str]]:
    """config id -> the analysis' flags of that configuration (records that analyse)."""
    from shardbench.suite.analyze import analysis

    try:
        an = analysis.analyze(records)
    except Exception:  # noqa: BLE001 - partial records (tests, old sets): numbers without flags
        return {}
    return {_config_of({"run_id": c.run_ids[0]}): list(c.flags) for c in an.configs}


def _verdict(d: Estimate | None, b: Estimate | None, d_flags: list[str], b_flags: list[str]) -> str:
    if d is None or b is None:
        return "not compared: a side has no ok run"
    faster, flagged = ("tuned", b_flags) if b.mean >= d.mean else ("default", d_flags)
    if flagged:
        return f"not decided: the faster one ({faster}) is flagged"
    if not (d.has_interval and b.has_interval):
        return "not decided: one repeat each (no interval)"
    p = welch(b, d)
    if p is not None and p <= ALPHA:
        return f"{faster} faster (Welch p {p:.2g})"
    return "no significant difference" + (f" (Welch p {p:.2g})" if p is not None else "")


FATES = {"COMPLETE": "measured", "PRUNED": "pruned", "FAIL": "failed"}


def trials_section(strategy: str, trials: list[dict], best: dict | None) -> str:
    """Every trial of one strategy: its parameters, what became of it and why, its numbers."""
    rows = []
    for t in trials:
        fate = t.get("fate") or FATES.get(str(t.get("state")), str(t.get("state", "?")).lower())
        why = t.get("rejected") or t.get("reason") or ""
        if t.get("params") == best and t.get("feasible"):
            fate += " (best)"
        value = t.get("value")
        rows.append([str(t.get("number", "?")), _params(t.get("params") or {}), fate, why or "-",
                     f"{value:,.1f}" if isinstance(value, (int, float)) and value else "-",
                     _mib(t.get("predicted_peak_bytes")), _mib(t.get("measured_peak_bytes"))])
    return (f"## Trials: {strategy}\n\nEvery trial, in order: rejected before launch (predicted over the "
            "limit), pruned (below the median of earlier trials after the pruner's warm-up), over the "
            "limit when measured, failed, or measured.\n\n"
            + _table(["#", "parameters", "fate", "why", "tok/s", "predicted peak MiB", "measured tensor peak MiB"],
                     rows))


def _mib(b) -> str:
    return f"{b / 2**20:.1f}" if isinstance(b, (int, float)) else "-"


def _config_of(record: dict) -> str:
    """The suite's config id, from the run id (…-<config id>-r<repeat>)."""
    return str(record.get("run_id", "")).rsplit("-r", 1)[0].rsplit("-", 1)[-1]


def _params(p: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.items())


def markdown(records: list[dict], results_dir: Path | None) -> str:
    """The sections that apply to these records ('' when none)."""
    parts = [startup_section(records)]
    path = Path(results_dir) / TUNING_FILE if results_dir else None
    if path is not None and path.is_file():
        try:
            parts.append(tuned_section(records, json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            parts.append(f"## Tuned vs default\n\n{path} could not be read: {exc}")
    return "\n\n".join(p for p in parts if p)
