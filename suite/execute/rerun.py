"""Which runs to re-measure: named runs (`--force RUN_ID`), flagged configurations
(`--rerun-flagged`), and the RunSpec of a past run read back from its spec.json.

Resume keeps an ok result forever; a result the report flags (spread, overloaded host,
efficiency above 1.05) is the one a user wants measured again. The old attempt is never lost:
the store moves it to <run>/attempts/<n>/ first (suite/execute/store.py).
"""
from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterable

from shardbench.trainer.config import RunConfig
from shardbench.suite.matrix.expand import RunSpec
from shardbench.suite.analyze.rows import without_repeat
from shardbench.suite.execute.store import read_json

ALL = "*"
"""`--force` alone: every run of the matrix."""


def spec_from_dict(data: Any) -> RunSpec:
    """The RunSpec a run's spec.json was written from (ValueError when it is not one)."""
    if not isinstance(data, dict):
        raise ValueError("spec.json is not an object")
    # spec.json is flat (RunSpec.to_dict): the spec's own fields beside the run's knobs
    names = {f.name for f in fields(RunSpec)}
    knob_names = set(RunConfig.__dataclass_fields__) - names - {"argv"}
    values = {k: v for k, v in data.items() if k in names or k in knob_names}
    try:
        return RunSpec(**values)
    except TypeError as exc:
        raise ValueError(f"spec.json is not a run spec ({exc})") from None


def saved_specs(results_dir: str | Path, run_ids: Iterable[str]) -> tuple[list[RunSpec], list[str]]:
    """(the specs of these runs, one line per run whose spec.json cannot be read)."""
    specs, problems = [], []
    for run_id in run_ids:
        path = Path(results_dir) / run_id / "spec.json"
        try:
            specs.append(spec_from_dict(read_json(path)))
        except ValueError as exc:
            problems.append(f"{run_id}: cannot re-measure, {path} unreadable ({exc})")
    return specs, problems


def flagged_run_ids(results_dir: str | Path) -> list[str]:
    """Every run of every configuration the analysis flags (or whose loss curve is broken)."""
    from shardbench.suite.analyze.analysis import analyze
    from shardbench.suite.analyze.rows import load_records

    if not Path(results_dir).is_dir():
        return []
    an = analyze(load_records(results_dir))
    return [run_id for c in an.configs if c.flags or c.broken for run_id in c.run_ids]


def forced(run_id: str, wanted: Iterable[str]) -> bool:
    """Whether `--force` values select this run: ALL, its id, or its configuration's name
    (the id without -rN: every repeat)."""
    wanted = set(wanted)
    return ALL in wanted or run_id in wanted or without_repeat(run_id) in wanted


def selection(force: list[str], rerun_flagged: bool, specs: list[RunSpec],
              results: str | Path) -> bool | set[str] | str:
    """What `--force [RUN_ID]...` and `--rerun-flagged` select among `specs`: True (every run), a
    set of run ids, or the error line for a name that is no run of the matrix."""
    if ALL in force:
        return True
    wanted = set(force)
    unknown = sorted(w for w in wanted if not any(forced(s.run_id, [w]) for s in specs))
    if unknown:
        return (f"--force {unknown[0]}: no such run or configuration in this matrix "
                "(shardbench run --dry-run lists the run ids)")
    if rerun_flagged:
        flagged = set(flagged_run_ids(results)) & {s.run_id for s in specs}
        print(f"re-measuring {len(flagged)} run(s) of flagged configurations", file=sys.stderr)
        wanted |= flagged
    return {s.run_id for s in specs if forced(s.run_id, wanted)}
