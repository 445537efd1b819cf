"""`shardbench`: the headless suite. run (matrix -> results), report (results -> csv, plots, md,
html), compare (two result sets), collect (a saved log -> result.json).

Exit codes: 0 every run ok (collect: a valid record); 1 some run not ok (the summary and the
report still cover every run) / collect: no valid record in the log / compare --fail-on-worse:
a significantly worse change; 2 bad input, an unusable
or locked results directory (one line on stderr, nothing run); 130 interrupted (what finished
is kept).
"""
from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
import time
from dataclasses import asdict, fields
from pathlib import Path

from shardbench.trainer.config import RunConfig
from shardbench.trainer.flags import add_flags

from shardbench.suite.backends import add_cluster_flags, cluster_options
from shardbench.suite.matrix import (CONFIRM_ABOVE, DEFAULT_MATRIX, KNOB_KEYS, MatrixSpec, expand, load_matrix,
                               matrix_from_dict, save_matrix, with_shape_defaults)


DESCRIPTION = ("The headless suite: run a matrix of benchmark runs, report on a results directory, "
               "compare two result sets, or collect a record from a saved log.")


def _knob(text: str) -> tuple[str, object]:
    """KEY=VALUE, the value read as YAML (true, 2, [fp32, bf16])."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    from shardbench.suite import safe_yaml

    try:
        return key.strip(), safe_yaml.load(value, f"--set {key.strip()}")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _yaml_value(text: str) -> object:
    """A knob's value as YAML (true, 2, [fp32, bf16]); 1e-4, which YAML 1.1 reads as text, a number."""
    from shardbench.suite import safe_yaml  # bounded aliases, depth, no NUL: one line on bad input

    try:
        value = safe_yaml.load(text, repr(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return [_number(v) for v in value] if isinstance(value, list) else _number(value)


_EXPONENT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def _number(value: object) -> object:
    """1e-4 as a number (YAML 1.1 wants 1.0e-4); any other text stays text."""
    return float(value) if isinstance(value, str) and _EXPONENT.match(value) else value


def _add_matrix_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per MatrixSpec field (lists comma-separated) and per trainer knob (a YAML value: a
    list sweeps it), help from its docstring (trainer.flags); each overrides the matrix file's value."""
    add_flags(parser, MatrixSpec, names=[f.name for f in fields(MatrixSpec) if f.name != "options"], defaults=False)
    add_flags(parser, RunConfig, names=KNOB_KEYS, defaults=False, value_type=_yaml_value,
              dest=lambda name: f"knob.{name}", help_suffix=" (trainer knob; a list [a,b] sweeps it)")
    parser.add_argument("--set", dest="knobs", type=_knob, action="append", default=[], metavar="KEY=VALUE",
                        help="any trainer knob for every run, e.g. --set activation_checkpointing=true "
                             "(a list sweeps it: --set precision=[fp32,bf16])")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shardbench", description=DESCRIPTION)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a matrix of benchmark runs")
    run.add_argument("--matrix", type=Path, help=f"matrix YAML (default: {DEFAULT_MATRIX.name}); flags override it")
    _add_matrix_flags(run)
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
    from shardbench.suite.tune import add_parser as add_tune_parser

    add_tune_parser(sub, _add_matrix_flags, add_cluster_flags)
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
    from shardbench.suite.plan_cmd import add_parser as add_plan_parser  # torch-free until a plan is made

    add_plan_parser(sub)
    return p


def effective_matrix(args: argparse.Namespace) -> MatrixSpec:
    """The matrix file (default: the default matrix), then every flag given over it."""
    spec = load_matrix(args.matrix or DEFAULT_MATRIX)
    overrides = {f.name: getattr(args, f.name) for f in fields(MatrixSpec)
                 if getattr(args, f.name, None) is not None}
    knob_flags = {name: getattr(args, f"knob.{name}") for name in KNOB_KEYS
                  if getattr(args, f"knob.{name}", None) is not None}
    if overrides.get("shape") in ("", "none"):
        overrides["shape"] = None  # --shape none: hardware unknown (no peak, no price)
    data = {**asdict(spec), **overrides}
    options = data.pop("options")
    matrix = matrix_from_dict({**data, **options, **knob_flags, **dict(args.knobs)})
    explicit = (set(overrides) | set(knob_flags) | set(dict(args.knobs))
                | (set(_keys_of(args.matrix)) if args.matrix else set()))
    return with_shape_defaults(matrix, explicit)


def _keys_of(path: Path) -> list[str]:
    """The keys a matrix file sets itself (load_matrix has already checked it reads)."""
    from shardbench.suite import safe_yaml

    data = safe_yaml.load(path.read_text(errors="replace"), str(path)) or {}
    return list(data) + list(data.get("options") or {})


def fail(message: str) -> int:
    print(f"shardbench: {message}", file=sys.stderr)
    return 2


# --- run -----------------------------------------------------------------------------------

def cmd_run(args: argparse.Namespace) -> int:
    try:
        matrix = effective_matrix(args)
    except (OSError, ValueError, TypeError) as exc:
        return fail(str(exc))
    specs, errors = expand(matrix, limit=None if args.yes else CONFIRM_ABOVE)
    if errors:
        for line in errors:
            print(f"shardbench: invalid matrix: {line}", file=sys.stderr)
        return 2
    if args.save_matrix:
        save_matrix(matrix, args.save_matrix)
    if args.dry_run:
        for s in specs:
            fault = f" [fault {s.fault}, up to {s.max_restarts} restarts]" if s.fault != "none" else ""
            print(s.run_id, s.launcher, " ".join(s.trainer_args()) + fault)
        return 0
    from shardbench.suite.backends import get_backend
    from shardbench.suite.runner import Runner
    from shardbench.suite.store import ResultsDirError

    predictions = {}
    if not args.no_plan:
        from shardbench.suite.planning import over_memory, predict_specs

        predictions, why = predict_specs(specs)
        if why:
            print(f"shardbench: {why}", file=sys.stderr)
        over = over_memory(specs, predictions)
        for line in over:
            print(f"shardbench: {'refused' if args.strict else 'warning'}: {line}", file=sys.stderr)
        if over and args.strict:
            return fail(f"{len(over)} run(s) predicted not to fit (drop --strict to run them anyway)")

    try:
        cluster = cluster_options(args)
    except ValueError as exc:
        return fail(str(exc))
    backend = get_backend(matrix.backend, cluster)
    ok, why = backend.availability()
    if not ok:
        return fail(f"backend {matrix.backend} unavailable: {why}")
    from shardbench.suite.rerun import selection

    force = selection(args.force, args.rerun_flagged, specs, matrix.results)
    if isinstance(force, str):
        return fail(force)
    view = _QuietView() if args.quiet else _RichView(len(specs))
    emit = view.emit
    if args.mlflow or args.mlflow_uri:
        from shardbench.suite.tracking import Tracker, TrackingError, default_uri

        try:
            tracker = Tracker(args.mlflow_uri or default_uri(matrix.results), matrix.results,
                              args.mlflow_experiment, warn=view.note)
        except TrackingError as exc:
            return fail(str(exc))
        emit = tracker.wrap(view.emit)
    runner = Runner(specs, backend, matrix.results, emit, force, args.order_seed, predictions)
    try:
        runner.open()  # refuse at once, before any progress display, when the dir is unusable or taken
    except ResultsDirError as exc:
        return fail(str(exc))
    records, crash = _run_with_progress(runner, view)
    _print_summary(records)
    if args.report and records:
        _report(matrix.results, args.report)
    if runner.cancelled:
        print(f"interrupted: kept {sum(r.get('status') == 'ok' for r in records)} ok run(s) under "
              f"{matrix.results}", file=sys.stderr)
        return 130
    if crash:
        print(f"shardbench: the matrix stopped early: {crash}", file=sys.stderr)
        return 1
    return 0 if all(r.get("status") == "ok" for r in records) else 1


def _report(results, out) -> None:
    from shardbench.suite.report import build_report

    try:
        rep = build_report(results, out)
    except Exception as exc:  # noqa: BLE001 - the runs are done and kept; say why there is no report
        print(f"shardbench: report not written: {type(exc).__name__}: {exc}", file=sys.stderr)
        return
    print(f"report: {rep.markdown} (shareable: {rep.html})")


def _run_with_progress(runner, view) -> tuple[list[dict], str | None]:
    """Run the matrix in a worker thread while this one waits for signals; returns the records
    and, if the runner itself broke (a bug), why."""
    result: dict = {}

    def work():
        try:
            result["records"] = runner.run()
        except BaseException as exc:  # noqa: BLE001 - reported, never a silent exit 0
            result["crash"] = f"{type(exc).__name__}: {exc}"

    worker = threading.Thread(target=work, name="matrix", daemon=True)

    def stop(signum, _frame):
        # Ctrl-C / SIGTERM: the backend ends the current run's whole process tree, the runner
        # starts nothing new, finished results stay on disk. A handler (not KeyboardInterrupt)
        # so the signal can never land outside a try and leave the worker's ranks running.
        # Only set flags here: printing from a signal handler can deadlock on the console lock.
        runner.cancel_all()

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with view:
            worker.start()
            noted = False
            while worker.is_alive():
                worker.join(0.2)
                if runner.cancelled and not noted:
                    noted = True
                    view.note("stopping: ending the current run's processes...")
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return result.get("records", []), result.get("crash")


class _QuietView:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def note(self, text: str) -> None:
        print(text, file=sys.stderr)

    def emit(self, event) -> None:
        from shardbench.suite.events import RunFinished

        if isinstance(event, RunFinished):
            r = event.record
            tps = r.get("tokens_per_s")
            print(f"{event.run_id}: {r.get('status')}"
                  + (f" {tps:,.0f} tok/s" if isinstance(tps, (int, float)) else "")
                  + (f" ({r.get('error')})" if r.get("error") else ""), flush=True)


class _RichView:
    """Two progress bars: the matrix (run i/N, elapsed, ETA) and the current run (step, tok/s)."""

    def __init__(self, total: int):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
                                 console=self.console, transient=False)
        self.matrix = self.progress.add_task("matrix", total=total, info="")
        self.current = self.progress.add_task("run", total=1, info="", visible=False)
        self.index = {}
        self.total = total

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc):
        self.progress.stop()
        return False

    def note(self, text: str) -> None:
        self.progress.console.print(text)

    def emit(self, event) -> None:
        from shardbench.suite import events as ev

        if isinstance(event, ev.RunQueued):
            self.index[event.run_id] = event.index + 1
        elif isinstance(event, ev.RunStateChanged) and event.state == "running":
            self.progress.update(self.current, description=f"run {self.index.get(event.run_id)}/{self.total} "
                                 f"{event.run_id}", completed=0, total=1, info="starting", visible=True)
        elif isinstance(event, ev.RunProgress):
            tps = f"{event.tokens_per_s:,.0f} tok/s" if event.tokens_per_s else ""
            loss = f"loss {event.loss:.3f}" if event.loss is not None else ""
            self.progress.update(self.current, completed=event.step, total=max(event.steps, 1),
                                 info=f"{event.phase} {tps} {loss}".strip())
        elif isinstance(event, ev.RunFinished):
            r = event.record
            tps = r.get("tokens_per_s")
            style = "green" if r.get("status") == "ok" else "red"
            detail = f"{tps:,.0f} tok/s" if isinstance(tps, (int, float)) else str(r.get("error") or "")[:160]
            self.progress.console.print(f"[{style}]{r.get('status'):>7}[/] {event.run_id}  {detail}",
                                        markup=True, highlight=False)
        elif isinstance(event, ev.RunStateChanged) and event.state == "skipped":
            self.progress.console.print(f"[dim]skipped {event.run_id} ({event.detail})[/]")
        elif isinstance(event, ev.MatrixProgress):
            eta = f"ETA {_dur(event.eta_s)}" if event.eta_s is not None else ""
            self.progress.update(self.matrix, completed=event.done, info=eta)


def _dur(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _print_summary(records: list[dict]) -> None:
    """One line per run (status, tok/s, step time, peak memory), then the totals."""
    def num(value, spec):
        return spec.format(value) if isinstance(value, (int, float)) else "-"

    if records:
        print(f"{'run':<44} {'status':<9} {'tok/s':>10} {'step s':>8} {'peak GiB':>9}")
    for r in records:
        step = (r.get("step_time_s") or {}).get("mean")
        mem = r.get("peak_memory_bytes")
        print(f"{r.get('run_id', '?'):<44} {r.get('status', '?'):<9} {num(r.get('tokens_per_s'), '{:,.0f}'):>10} "
              f"{num(step, '{:.4f}'):>8} {num(mem / 2 ** 30 if isinstance(mem, int) else None, '{:.3f}'):>9}")
    counts = {}
    for r in records:
        counts[r.get("status", "?")] = counts.get(r.get("status", "?"), 0) + 1
    ok = counts.pop("ok", 0)
    rest = "".join(f", {n} {status}" for status, n in sorted(counts.items()))
    print(f"{len(records)} run(s): {ok} ok{rest}")


# --- report / collect ----------------------------------------------------------------------

def cmd_report(args: argparse.Namespace) -> int:
    """A report per result set at or below RESULTS (e.g. `report results` finds results/default)."""
    from shardbench.suite.metrics import find_result_sets
    from shardbench.suite.report import build_report

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
    return code


def cmd_compare(args: argparse.Namespace) -> int:
    """0 compared (1 with --fail-on-worse and a significantly worse change); 2 a side unusable."""
    from shardbench.suite.compare import CompareError, compare_dirs, text, write_csv

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
    from shardbench.suite.collect import extract_file, failed_record

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
    from shardbench.suite import tune

    return tune.cmd_tune(args, effective_matrix, cluster_options, fail)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run" and not args.dry_run:
        # `| tee log` then Ctrl-C: tee dies first. Runs are still being ended and their records
        # written, so a closed stdout is ignored (exit 130, records kept), never a SIGPIPE death.
        from shardbench.trainer.streams import tolerate_closed_readers

        tolerate_closed_readers()
    else:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `shardbench run --dry-run | head` ends quietly
    started = time.monotonic()
    if args.command == "plan":
        from shardbench.suite.plan_cmd import cmd_plan

        return cmd_plan(args)
    handler = {"run": cmd_run, "report": cmd_report, "collect": cmd_collect, "compare": cmd_compare,
               "tune": cmd_tune}[args.command]
    code = handler(args)
    if args.command in ("run", "tune") and not getattr(args, "dry_run", False) and code in (0, 1):
        print(f"wall time {_dur(time.monotonic() - started)}")
    return code


if __name__ == "__main__":
    sys.exit(main())
