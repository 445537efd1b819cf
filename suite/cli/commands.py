"""`shardbench`: the headless suite. run (matrix -> results), report (results -> csv, plots, md,
html), compare (two result sets), collect (a saved log -> result.json).

Exit codes: 0 every run ok (collect: a valid record); 1 some run not ok (the summary and the
report still cover every run) / collect: no valid record in the log / compare --fail-on-worse:
a significantly worse change; 2 bad input, an unusable
or locked results directory (one line on stderr, nothing run); 130 interrupted (what finished
is kept).

The parser and the small commands live here; `run` is run_cmd.py (its views run_views.py), the
matrix flags and `fail` matrix_flags.py, `tune` tune_cmd.py (its studies suite/tune/), `plan` plan_cmd.py.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from shardbench.suite.backends import add_cluster_flags
from shardbench.suite.cli.matrix_flags import add_matrix_flags, fail
from shardbench.suite.matrix.expand import DEFAULT_MATRIX
from shardbench.suite.cli.run_cmd import cmd_run
from shardbench.suite.cli.run_views import duration


DESCRIPTION = ("The headless suite: run a matrix of benchmark runs, report on a results directory, "
               "compare two result sets, or collect a record from a saved log.")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shardbench", description=DESCRIPTION)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a matrix of benchmark runs")
    run.add_argument("--matrix", type=Path, help=f"matrix YAML (default: {DEFAULT_MATRIX.name}); flags override it")
    add_matrix_flags(run)
    add_cluster_flags(run)
    run.add_argument("--force", nargs="?", const="*", action="append", default=[], metavar="RUN_ID",
                     help="re-measure runs whose result is already there (the old attempt moves to "
                          "<run>/attempts/): alone every run; with a run id that run, with a configuration "
                          "name (a run id without -rN) all its repeats; may be repeated")
    run.add_argument("--rerun-flagged", action="store_true",
                     help="re-measure every run of the configurations the report flags (spread, overloaded "
                          "host, efficiency above 1.05, broken loss), e.g. make bench BENCH_ARGS=--rerun-flagged")
    run.add_argument("--order-seed", type=int, default=None,
                     help="seed of the shuffled run order (default: random; logged in RESULTS/order.jsonl)")
    run.add_argument("--yes", action="store_true", help="run a matrix of more than 1,000 runs")
    run.add_argument("--dry-run", action="store_true", help="print the runs and exit")
    run.add_argument("--save-matrix", type=Path, help="write the effective matrix YAML here")
    run.add_argument("--report", type=Path, help="also write the report into this directory")
    run.add_argument("--quiet", action="store_true", help="no live progress, one line per run")
    run.add_argument("--mlflow", action="store_true",
                     help="log every run to MLflow (default store: RESULTS/mlruns; needs the tracking extra)")
    run.add_argument("--mlflow-uri", default=None, metavar="URI",
                     help="MLflow tracking URI, e.g. http://mlflow:5000 (implies --mlflow)")
    run.add_argument("--mlflow-experiment", default="shardbench", metavar="NAME", help="MLflow experiment name")
    from shardbench.suite.cli.tune_cmd import add_parser as add_tune_parser

    add_tune_parser(sub)
    run.add_argument("--no-plan", action="store_true",
                     help="do not predict each run's memory, collectives and step time before launch (shardbench plan)")
    run.add_argument("--strict", action="store_true",
                     help="refuse the matrix when a run is predicted over its device's memory (default: warn)")
    rep = sub.add_parser("report", help="results dir -> metrics.csv, plots/, BENCHMARK_REPORT.md")
    rep.add_argument("results", type=Path, help="a results dir, or a dir holding several (each gets a report)")
    rep.add_argument("--out", type=Path, default=None,
                     help="output directory (default: <result set>/report; with several sets, one subdir each)")
    cmp = sub.add_parser("compare", help="two result sets side by side: same configurations, 95%% intervals, "
                                         "significant changes (e.g. before/after a driver or NCCL upgrade)")
    cmp.add_argument("a", type=Path, help="the result set before (e.g. results/before)")
    cmp.add_argument("b", type=Path, help="the result set after")
    cmp.add_argument("--csv", type=Path, default=None, help="also write the comparison table here")
    cmp.add_argument("--fail-on-worse", action="store_true",
                     help="exit 1 when any change is significantly worse (for CI)")
    col = sub.add_parser("collect", help="read the result record from a saved log")
    col.add_argument("log", type=Path)
    col.add_argument("-o", "--output", type=Path, default=None, help="write the record here (default: stdout)")
    col.add_argument("--run-id", default=None, help="prefer the record of this run id")
    from shardbench.suite.cli.plan_cmd import add_parser as add_plan_parser  # torch-free until a plan is made

    add_plan_parser(sub)
    return p


# --- report / collect ----------------------------------------------------------------------

def cmd_report(args: argparse.Namespace) -> int:
    """A report per result set at or below RESULTS (e.g. `report results` finds results/default)."""
    from shardbench.suite.analyze.rows import find_result_sets
    from shardbench.suite.report.markdown import build_report

    if not args.results.is_dir():
        return fail(f"{args.results}: no such results directory")
    sets = find_result_sets(args.results)
    if not sets:
        return fail(f"no <run-id>/result.json under {args.results} (nor in its subdirectories)")
    code = 0
    for results in sets:
        rel = results.relative_to(args.results)
        out = (args.out / rel) if args.out else results / "report"
        try:
            rep = build_report(results, out)
        except (OSError, ValueError) as exc:
            print(f"shardbench: {results}: report not written: {exc}", file=sys.stderr)
            code = 1
            continue
        print(f"{results}: {rep.runs} runs ({rep.failed} not ok) -> {rep.csv}, {len(rep.plots)} plots, {rep.markdown}, "
              f"{rep.html}")
        print("\n" + rep.summary + "\n")
    return code


def cmd_compare(args: argparse.Namespace) -> int:
    """0 compared (1 with --fail-on-worse and a significantly worse change); 2 a side unusable."""
    from shardbench.suite.cli.compare import CompareError, compare_dirs, text, write_csv

    try:
        cmp = compare_dirs(args.a, args.b)
    except CompareError as exc:
        return fail(str(exc))
    print(text(cmp))
    if args.csv:
        try:
            write_csv(cmp, args.csv)
        except OSError as exc:
            return fail(f"cannot write {args.csv}: {exc.strerror or exc}")
    return 1 if args.fail_on_worse and cmp.significant(worse_only=True) else 0


def cmd_collect(args: argparse.Namespace) -> int:
    """0 when the log held a valid record (whatever its status), printed or written to -o; 1 when
    it did not: one line on stderr says why (and -o gets a failed record saying the same)."""
    from shardbench.trainer.record import write_atomic
    from shardbench.suite.execute.collect import extract_file, failed_record

    if not args.log.is_file():
        return fail(f"{args.log}: no such log file")
    found = extract_file(args.log, args.run_id)
    for note in found.notes:
        print(f"note: {note}", file=sys.stderr)
    record = found.record or failed_record(None, found.error or "no result record", run_id=args.run_id)
    try:
        if args.output:
            write_atomic(record, str(args.output))
        elif found.record is not None:
            print(json.dumps(record, indent=2))
    except OSError as exc:
        return fail(f"cannot write {args.output}: {exc.strerror or exc}")
    if found.record is None:
        print(f"shardbench: no valid record in {args.log}: {found.error}", file=sys.stderr)
        return 1
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from shardbench.suite.cli import tune_cmd

    return tune_cmd.cmd_tune(args)


def main(argv: list[str] | None = None) -> int:
    """Run one command. Process-wide settings (SIGPIPE, wrapped stdout) belong to `entry`: tests and
    benchtui call this in-process, and a SIGPIPE reset there once killed the whole pytest run."""
    return run_command(build_parser().parse_args(argv))


def run_command(args: argparse.Namespace) -> int:
    started = time.monotonic()
    if args.command == "plan":
        from shardbench.suite.cli.plan_cmd import cmd_plan

        return cmd_plan(args)
    handler = {"run": cmd_run, "report": cmd_report, "collect": cmd_collect, "compare": cmd_compare,
               "tune": cmd_tune}[args.command]
    code = handler(args)
    if args.command in ("run", "tune") and not getattr(args, "dry_run", False) and code in (0, 1):
        print(f"wall time {duration(time.monotonic() - started)}")
    return code


def entry() -> int:
    """The `shardbench` console script: main() with the stream handling a terminal command wants."""
    args = build_parser().parse_args()
    if args.command in ("run", "tune") and not getattr(args, "dry_run", False):
        # `| tee log` then Ctrl-C: tee dies first. Runs are still being ended and their records
        # written, so a closed stdout is ignored (exit 130, records kept), never a SIGPIPE death.
        from shardbench.trainer.streams import tolerate_closed_readers

        tolerate_closed_readers()
    else:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `shardbench report ... | head` ends quietly
    return run_command(args)


if __name__ == "__main__":
    sys.exit(entry())
