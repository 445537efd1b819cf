"""What starting the Matrix screen's matrix would do: which runs are already done, in words.

Resume keeps a run whose result.json the results directory already trusts (suite/execute/store.py
`ResultsDir.trusted`, the runner's own rule), so "30 runs ready" when all 30 are done and would
be skipped is wrong: the screen counts them with the same rule.
"""
from __future__ import annotations

from pathlib import Path

BENCHTUI_RESULTS = "results/benchtui"
"""benchtui's results directory when the matrix names none of its own: not `make bench`'s
results/default, whose report a benchtui run (other steps, other knobs) would otherwise change."""
MAKE_BENCH_RESULTS = "results/default"
"""`make bench`'s results directory (the default matrix's `results`, MatrixSpec's default)."""
MAX_CHECKED = 2000
"""Beyond this many runs the screen does not read every result.json on each keystroke."""


def benchtui_results(results: str, path: str | Path | None) -> str:
    """Where benchtui writes the runs of a matrix read from `path`: the file's own `results`,
    unless that is make bench's results/default (the default matrix's, a copy of it, or the key left
    out); then results/benchtui for the default matrix and results/benchtui-<file name> for another."""
    from shardbench.suite.matrix.expand import DEFAULT_MATRIX

    if results and Path(results) != Path(MAKE_BENCH_RESULTS):
        return results
    if path is None or Path(path).resolve() == DEFAULT_MATRIX.resolve():
        return BENCHTUI_RESULTS
    return f"{BENCHTUI_RESULTS}-{Path(path).stem}"


def count_done(specs: list, results: str | Path) -> int:
    """Runs of `specs` that resume would skip (their result is already in `results`)."""
    from shardbench.suite.execute.store import ResultsDir

    if not specs or not results or len(specs) > MAX_CHECKED or not Path(results).is_dir():
        return 0
    store = ResultsDir(results)  # read only: trusted() takes no lock
    return sum(store.trusted(s)[0] is not None for s in specs)


def run_count_text(total: int, done: int, results: str | Path) -> str:
    """The Matrix screen's run count: what ctrl+r would run, and what it would skip."""
    if total and done == total:
        return (f"[b]all {total} run(s) already done[/b] in {results}: ctrl+r measures nothing "
                "(F5 shows them; ctrl+f re-measures all)")
    if done:
        return (f"[b]{total - done} of {total} run(s)[/b] to run: ctrl+r to start "
                f"({done} already done in {results}, skipped; ctrl+f re-measures all)")
    return f"[b]{total} run(s)[/b] ready: ctrl+r to start"
