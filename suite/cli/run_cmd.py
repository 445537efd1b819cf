"""`shardbench run`: plan the matrix, pick the backend and the runs to re-measure (--force,
--rerun-flagged), wire the MLflow tracker, run it in a worker thread under a progress view
(run_views.py), then the summary and the report. Exit codes as commands.py's docstring says.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from shardbench.suite.backends import cluster_options
from shardbench.suite.cli.matrix_flags import effective_matrix, fail, matrix_file_keys
from shardbench.suite.matrix.expand import CONFIRM_ABOVE, expand, save_matrix
from shardbench.suite.cli.run_views import QuietView, RichView


class _Refused(Exception):
    """Why the matrix is not run after all: one line on stderr and exit 2 (`fail`)."""


def cmd_run(args: argparse.Namespace) -> int:
    try:
        matrix = effective_matrix(args)
    except (OSError, ValueError, TypeError) as exc:
        return fail(str(exc))
    specs, errors = expand(matrix, limit=None if args.yes else CONFIRM_ABOVE)
    if errors:
        from_file = matrix_file_keys(args)
        for line in errors:  # a problem with a value the file set names the file, as load_matrix's do
            where = f"{args.matrix}: " if line.split(" ", 1)[0] in from_file else ""
            print(f"shardbench: invalid matrix: {where}{line}", file=sys.stderr)
        return 2
    if args.save_matrix:
        save_matrix(matrix, args.save_matrix)
    if args.dry_run:
        return _dry_run(args, matrix, specs)
    try:
        runner, view = _prepare(args, matrix, specs)
    except _Refused as exc:
        return fail(str(exc))
    return _execute(args, matrix, runner, view)


NOTE = {"run": "", "re-measure": " [re-measure: its result moves to attempts/]", "skip (done)": " [skip: done, kept]"}


def _print_runs(specs, what: dict[str, str]) -> None:
    for s in specs:
        fault = f" [fault {s.fault}, up to {s.max_restarts} restarts]" if s.fault != "none" else ""
        print(s.run_id, s.launcher, " ".join(s.trainer_args()) + fault + NOTE[what[s.run_id]])


def _dry_run(args: argparse.Namespace, matrix, specs) -> int:
    """Every run with what a real invocation would do to it: run, re-measure (--force,
    --rerun-flagged: the kept result moves to attempts/) or skip (resume keeps its result)."""
    from shardbench.suite.execute.rerun import selection
    from shardbench.suite.execute.store import ResultsDir

    force = selection(args.force, args.rerun_flagged, specs, matrix.results)
    if isinstance(force, str):
        return fail(force)
    store = ResultsDir(matrix.results)  # read only: trusted() takes no lock
    what = {}
    for s in specs:
        done = Path(matrix.results).is_dir() and store.trusted(s)[0] is not None
        chosen = force is True or (isinstance(force, set) and s.run_id in force)
        what[s.run_id] = "re-measure" if done and chosen else "skip (done)" if done else "run"
    _print_runs(specs, what)
    counts = {w: list(what.values()).count(w) for w in ("run", "re-measure", "skip (done)")}
    print(f"{len(specs)} run(s): " + ", ".join(f"{n} {w}" for w, n in counts.items() if n), file=sys.stderr)
    return 0


def _probe_results(store) -> None:
    """Refuse an unusable results dir (read-only, full, taken) before planning or any run. A dir
    the probe had to create is removed again, so a refusal later (--strict) leaves nothing behind."""
    from shardbench.suite.execute.store import LOCK_NAME, ResultsDirError

    created = not store.path.exists()
    try:
        store.open().close()
    except ResultsDirError as exc:
        raise _Refused(str(exc)) from None
    if created:
        (store.path / LOCK_NAME).unlink(missing_ok=True)
        try:
            store.path.rmdir()
        except OSError:  # something else wrote there meanwhile: leave it
            pass


def _prepare(args: argparse.Namespace, matrix, specs):
    """The runner, opened, and its view; every refusal comes before any progress display."""
    from shardbench.suite.execute.rerun import selection
    from shardbench.suite.execute.runner import Runner
    from shardbench.suite.execute.store import ResultsDir, ResultsDirError

    _probe_results(ResultsDir(matrix.results))
    cluster = _cluster_flags(args)  # before planning: a bad flag is refused at once, not after 15 s
    predictions = _predict(args, specs)
    backend = _backend(matrix, cluster)  # after: a run predicted not to fit is refused before any cluster is contacted
    force = selection(args.force, args.rerun_flagged, specs, matrix.results)
    if isinstance(force, str):
        raise _Refused(force)
    view = QuietView() if args.quiet else RichView(len(specs))
    runner = Runner(specs, backend, matrix.results, _tracked(args, matrix, view), force, args.order_seed,
                    predictions)
    try:
        runner.open()  # refuse at once, before any progress display, when the dir is unusable or taken
    except ResultsDirError as exc:
        raise _Refused(str(exc)) from None
    return runner, view


def _predict(args: argparse.Namespace, specs) -> dict:
    """Each run's predicted memory, collectives and step time (none with --no-plan); a run
    predicted over its device's memory is a warning, or with --strict a refusal."""
    if args.no_plan:
        return {}
    from shardbench.suite.matrix.planning import over_memory, predict_specs, unplanned

    predictions, why = predict_specs(specs)
    if why:
        print(f"shardbench: {why}", file=sys.stderr)
    for line in unplanned(specs, predictions):  # never a silent drop
        print(f"shardbench: {line}", file=sys.stderr)
    over = over_memory(specs, predictions)
    for line in over:
        print(f"shardbench: {'refused' if args.strict else 'warning'}: {line}", file=sys.stderr)
    if over and args.strict:
        raise _Refused(f"{len(over)} run(s) predicted not to fit (drop --strict to run them anyway)")
    return predictions


def _cluster_flags(args: argparse.Namespace):
    """The cluster flags (image, namespace, ...), checked; a bad one is a refusal."""
    try:
        return cluster_options(args)
    except ValueError as exc:
        raise _Refused(str(exc)) from None


def _backend(matrix, cluster):
    from shardbench.suite.backends import get_backend

    backend = get_backend(matrix.backend, cluster, matrix.ray_cluster)
    ok, why = backend.availability()
    if not ok:
        raise _Refused(f"backend {matrix.backend} unavailable: {why}")
    return backend


def _tracked(args: argparse.Namespace, matrix, view):
    """The view's emit, also logging every run to MLflow with --mlflow / --mlflow-uri."""
    if not (args.mlflow or args.mlflow_uri):
        return view.emit
    from shardbench.suite.execute.tracking import Tracker, TrackingError, default_uri

    try:
        tracker = Tracker(args.mlflow_uri or default_uri(matrix.results), matrix.results,
                          args.mlflow_experiment, warn=view.note)
    except TrackingError as exc:
        raise _Refused(str(exc)) from None
    return tracker.wrap(view.emit)


def _execute(args: argparse.Namespace, matrix, runner, view) -> int:
    """Run the opened matrix, print the summary (and the report), and say how it ended."""
    records, crash = _run_with_progress(runner, view)
    _print_summary(records)
    report = _report(matrix.results, args.report) if args.report and records else None
    if records:
        _print_answer(records, report)
    if runner.cancelled:
        print(f"interrupted: kept {sum(r.get('status') == 'ok' for r in records)} ok run(s) under "
              f"{matrix.results}", file=sys.stderr)
        return 130
    if crash:
        print(f"shardbench: the matrix stopped early: {crash}", file=sys.stderr)
        return 1
    return 0 if all(r.get("status") == "ok" for r in records) else 1


def _report(results, out):
    from shardbench.suite.report.markdown import build_report

    try:
        rep = build_report(results, out)
    except Exception as exc:  # noqa: BLE001 - the runs are done and kept; say why there is no report
        print(f"shardbench: report not written: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    print(f"report: {rep.markdown} (shareable: {rep.html})")
    return rep


def _print_answer(records: list[dict], report) -> None:
    """The Summary table last, where a person reads first (the answer, not only file paths)."""
    if report is not None:
        print("\n" + report.summary)
        return
    from shardbench.suite.analyze import analysis
    from shardbench.suite.report import summary

    try:
        print("\n" + summary.text(analysis.analyze(records).verdicts))
    except Exception as exc:  # noqa: BLE001 - the runs are done and kept; say why there is no summary
        print(f"shardbench: summary not computed: {type(exc).__name__}: {exc}", file=sys.stderr)


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
    counts: dict[str, int] = {}
    for r in records:
        counts[r.get("status", "?")] = counts.get(r.get("status", "?"), 0) + 1
    ok = counts.pop("ok", 0)
    rest = "".join(f", {n} {status}" for status, n in sorted(counts.items()))
    print(f"{len(records)} run(s): {ok} ok{rest}")
