"""Why a directory opened as a result set shows no results, and where the results are.

A new user types `benchtui --results reports/default` (the report `make bench` printed) or
`--results results` (the parent of every result set): both hold no <run-id>/result.json of their
own, and "0 results" alone does not say what to open instead.
"""
from __future__ import annotations

import re
from pathlib import Path

from shardbench.suite.analyze.rows import find_result_sets

REPORT_FILES = ("BENCHMARK_REPORT.md", "metrics.csv", "summary.csv", "report.html")
MAX_LISTED = 5


def empty_hint(path: Path) -> str:
    """One line: what `path` is and which directory to open instead (o on the Results screen)."""
    path = Path(path)
    if not path.exists():
        nearby = find_result_sets(path.parent) if path.parent.is_dir() else []
        return "no such directory yet (a matrix run creates it)" + (
            f"; result sets beside it: {_listed(nearby)} (o opens one)" if nearby else "")
    if any((path / name).is_file() for name in REPORT_FILES):
        source = report_source(path)
        where = f"its runs are in {source}" if source else "open the results directory it was written from"
        return f"this is a report directory, not a result set: {where} (o opens another directory)"
    sets = find_result_sets(path)
    if sets:
        return f"the result sets are one level down: {_listed(sets)} (o opens one, or benchtui --results {sets[0]})"
    return "no <run-id>/result.json here: run a matrix, or open a results directory (o)"


def _listed(sets: list[Path]) -> str:
    return ", ".join(str(s) for s in sets[:MAX_LISTED]) + (" ..." if len(sets) > MAX_LISTED else "")


def report_source(report_dir: Path) -> str | None:
    """The results directory a report was written from: named in its BENCHMARK_REPORT.md, or
    the usual sibling (reports/NAME -> results/NAME) when that one holds results."""
    md = report_dir / "BENCHMARK_REPORT.md"
    try:
        found = re.search(r"from `([^`]+)`", md.read_text(errors="replace")[:4000])
    except OSError:
        found = None
    candidates = [Path(found.group(1))] if found else []
    candidates.append(report_dir.parent.parent / "results" / report_dir.name)
    for candidate in candidates:
        if not candidate.is_absolute() and not candidate.exists():
            candidate = report_dir.parent.parent / candidate  # relative to where the report was made
        if find_result_sets(candidate) if candidate.is_dir() else False:
            return str(candidate)
    return None
