"""Two report sections of issue 23, from the records alone (plus the tune's own file):
- "Launcher start-up": `launcher_startup_s` per launcher (torchrun, mpirun, DeepSpeed, Ray), mean
  and 95% interval over every run that has it: the launcher's overhead as a measured axis.
- "Tuned vs default": when the result set was written by `shardbench tune` (its TUNING_FILE names,
  per strategy, the config ids of the default and the tuned configuration), tokens/s of each with
  its interval and their ratio (delta method, suite/stats.ratio).
report.py appends them; tune.py writes TUNING.md with the second."""
from __future__ import annotations

import json
from pathlib import Path

from shardbench.suite.stats import Estimate, estimate, ratio

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
    tps: dict[str, list[float]] = {}
    for r in records:
        if r.get("status") == "ok":
            tps.setdefault(_config_of(r), []).append(r.get("tokens_per_s"))
    rows = []
    for strategy, t in tuning.items():
        d = estimate(tps.get(t["default"]["config_id"], []))
        tuned = t.get("tuned")
        same = bool(tuned) and tuned["config_id"] == t["default"]["config_id"]
        b = estimate(tps.get(tuned["config_id"], [])) if tuned else None
        r = ratio(b, d) if b and d and not same else None
        speed = "the default is the best" if same else ("-" if r is None else _fmt(r, "{:.3f}"))
        rows.append([strategy, _params(t["default"]["params"]), _fmt(d),
                     _params(tuned["params"]) if tuned else "none feasible", _fmt(b), speed])
    return ("## Tuned vs default\n\nTokens/s per strategy, mean [95% interval] over the re-measured "
            "repeats (interleaved), of the default configuration and of the best trial of "
            "`shardbench tune`; the ratio's interval propagates both (delta method).\n\n"
            + _table(["strategy", "default", "tok/s default", "tuned", "tok/s tuned", "tuned / default"], rows))


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
