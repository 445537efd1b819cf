"""benchtui: the Textual app. State lives in `RunBoard`; slow work runs in thread workers.

Data flow: the Matrix screen builds a MatrixSpec -> a `Runner` (shardbench.suite.execute.runner) runs it in a
thread worker; the Runs screen cancels through the runner's cancel(run_id) / cancel_all() -> each
suite event is posted into the app as a typed Message (shardbench.tui.app.messages) -> handlers fold
it into the board and update the screens that show it. Results are read back from
results/<run-id>/result.json in a worker.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Iterable

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from shardbench.tui.app import messages as msg
from shardbench.suite.execute import events as ev
from shardbench.trainer.contract import BACKENDS
from shardbench.tui.app.board import RunBoard
from shardbench.tui.app.screens.dialogs import Confirm, HelpScreen
from shardbench.tui.app.screens.logs import LogsScreen
from shardbench.tui.app.screens.matrix import MatrixScreen
from shardbench.tui.app.screens.results import ResultsScreen
from shardbench.tui.app.screens.runs import RunsScreen
from shardbench.suite.backends import ClusterOptions, availability, get_backend
from shardbench.tui.app.matrix_plan import BENCHTUI_RESULTS, benchtui_results
from shardbench.suite.matrix.expand import MatrixSpec, default_matrix, load_matrix, save_matrix

MODES = ("matrix", "runs", "logs", "results")


HINT_TIMEOUT_S = 3600.0
"""A hint the person must act on (where the results are) stays: 15 s was gone before it was read."""
SCREENS = Binding.Group("screens", compact=False)


class BenchApp(App):
    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses may live anywhere
    TITLE = "benchtui"
    SUB_TITLE = "shardbench strategy matrix"
    BINDINGS = [
        Binding("f1,question_mark", "help", "Help"),
        # One footer entry for the four screens: at 80 columns the footer showed only up to F3.
        Binding("f2,1", "mode('matrix')", "Matrix", group=SCREENS),
        Binding("f3,2", "mode('runs')", "Runs", group=SCREENS),
        Binding("f4,3", "mode('logs')", "Logs", group=SCREENS),
        Binding("f5,4", "mode('results')", "Results", group=SCREENS),
        Binding("ctrl+r", "run_matrix", "Run", show=False),
        Binding("x", "cancel_all", "Cancel all", show=False),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, matrix: MatrixSpec | None = None, matrix_path: str | None = None,
                 cluster: ClusterOptions | None = None, results_dir: str | Path | None = None,
                 availability: dict[str, tuple[bool, str]] | None = None, show_results: bool = False) -> None:
        super().__init__()
        matrix = matrix or replace(default_matrix(), results=BENCHTUI_RESULTS)
        self.results_dir = Path(results_dir or matrix.results)
        self.show_results = show_results
        """Opened with --results: switch to the Results screen once they load (or hint why none did)."""
        """The result set the Results screen shows (read-only); a matrix run writes into its own
        `results` directory and shows that one."""
        self.matrix_path = matrix_path
        self.cluster = cluster or ClusterOptions()
        self.ray_cluster = matrix.ray_cluster is True
        """Backend ray as KubeRay RayJobs (the loaded matrix's ray_cluster): which ray to check at start."""
        self.fixed_availability = availability
        """Backend availability given by the caller (tests, snapshots) instead of checked."""
        self.backend_status: dict[str, tuple[bool, str]] = dict(availability or {})
        self.board = RunBoard()
        self.runner = None
        """The shardbench.suite.execute.runner.Runner of the matrix running now (cancel goes through it)."""
        self.matrix_worker: Worker | None = None
        self.views: dict[str, Screen] = {
            "matrix": MatrixScreen(matrix, matrix_path), "runs": RunsScreen(self.board),
            "logs": LogsScreen(self.board), "results": ResultsScreen(self.results_dir),
        }
        for name, screen in self.views.items():
            self.add_mode(name, lambda screen=screen: screen)  # type: ignore[misc]

    def on_mount(self) -> None:
        # --results: the Results screen at once, loading (it showed the Matrix screen for 5-8 s).
        self.switch_mode("results" if self.show_results else "matrix")
        if self.show_results:
            self.results_screen.show(self.results_screen.view, f"loading the results in {self.results_dir}…")

    def on_ready(self) -> None:
        # After the first paint: these import kubernetes and pandas, which would delay it.
        if self.fixed_availability is None:
            self.check_backends()
        self.refresh_results()

    # -- screens ------------------------------------------------------------------------------
    @property
    def matrix_screen(self) -> MatrixScreen:
        return self.views["matrix"]  # type: ignore[return-value]

    @property
    def runs_screen(self) -> RunsScreen:
        return self.views["runs"]  # type: ignore[return-value]

    @property
    def logs_screen(self) -> LogsScreen:
        return self.views["logs"]  # type: ignore[return-value]

    @property
    def results_screen(self) -> ResultsScreen:
        return self.views["results"]  # type: ignore[return-value]

    def action_mode(self, mode: str) -> None:
        self.switch_mode(mode)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Run matrix", "Start the matrix on the Matrix screen", self.action_run_matrix)
        yield SystemCommand("Cancel all runs", "Stop the current run and skip the rest", self.action_cancel_all)
        yield SystemCommand("Write report", "metrics.csv, PNG plots, BENCHMARK_REPORT.md, report.html",
                            self.action_write_report)
        yield SystemCommand("Open results dir", "Show the results of a past matrix",
                            self.results_screen.action_open_dir)
        yield SystemCommand("Reload results", "Read result.json files again", self.action_reload_results)
        yield SystemCommand("Save matrix", "Write the matrix as YAML", self.matrix_screen.action_save)
        yield SystemCommand("Load matrix", "Read a matrix YAML file", self.matrix_screen.action_load)
        for mode in MODES:
            yield SystemCommand(f"{mode.title()} screen", f"Switch to the {mode} screen",
                                lambda mode=mode: self.switch_mode(mode))
        yield SystemCommand("Help", "Keys and screens", self.action_help)

    # -- backends -----------------------------------------------------------------------------
    @work(thread=True, group="backends")
    def check_backends(self) -> None:
        for name in BACKENDS:
            self.post_message(msg.BackendChecked(name, *availability(name, self.cluster, self.ray_cluster)))

    def on_backend_checked(self, message: msg.BackendChecked) -> None:
        self.backend_status[message.name] = (message.ok, message.why)
        if self.matrix_screen.is_mounted:
            self.matrix_screen.update_backend_note()

    # -- running the matrix -------------------------------------------------------------------
    def action_run_matrix(self, force: bool = False) -> None:
        """Start the Matrix screen's matrix; `force` re-measures runs whose result is already
        there, after a confirmation (ctrl+f is one key away from ctrl+r)."""
        if self.matrix_worker is not None and self.matrix_worker.state in (WorkerState.PENDING, WorkerState.RUNNING):
            self.notify("a matrix is already running: cancel it first (x)", severity="warning")
            return
        screen = self.matrix_screen
        screen.validate()
        if screen.problems or not screen.specs:
            self.notify("the matrix has problems: see the Matrix screen", severity="error")
            return
        spec = screen.matrix()
        status = self.backend_status.get(spec.backend)  # type: ignore[union-attr]
        if status is not None and not status[0]:
            self.notify(f"backend {spec.backend} unavailable: {status[1]}", severity="error")  # type: ignore[union-attr]
            return
        if not force:
            self._start_matrix(False)
            return
        from shardbench.tui.app.matrix_plan import count_done

        done = count_done(list(screen.specs), spec.results)  # type: ignore[union-attr]
        self.push_screen(Confirm(f"Re-measure all {len(screen.specs)} run(s) of this matrix? {done} finished "
                                 f"result(s) in {spec.results} move to <run>/attempts/ (kept) and run again; "  # type: ignore[union-attr]
                                 "a run cancelled before it finishes keeps its earlier result."),
                         callback=lambda yes: yes and self._start_matrix(True))  # type: ignore[func-returns-value]

    def _start_matrix(self, force: bool) -> None:
        screen = self.matrix_screen
        spec = screen.matrix()
        if spec is None:
            return
        self.board.reset()
        if self.runs_screen.is_mounted:
            self.runs_screen.redraw()
        self.logs_screen.run_id = None
        self.results_dir = self.results_screen.results_dir = Path(spec.results)
        self.ray_cluster = spec.ray_cluster is True  # a rerun of a result goes where this matrix went
        self.matrix_worker = self.run_specs(list(screen.specs), spec.backend, self.results_dir, force)
        self.switch_mode("runs")

    @work(thread=True, exclusive=True, group="matrix", exit_on_error=False)
    def run_specs(self, specs: list, backend_name: str, results_dir: Path, force=False) -> None:
        from shardbench.suite.execute.runner import Runner

        try:
            backend = get_backend(backend_name, self.cluster, self.ray_cluster)
            ok, why = backend.availability()  # the start-up check may be stale or not done
            if not ok:
                self.post_message(msg.MatrixDone([], f"backend {backend_name} unavailable: {why}"))
                return
            self.runner = Runner(specs, backend, results_dir,  # type: ignore[assignment]
                                 emit=lambda event: self.post_message(msg.SuiteEvent(event)), force=force,  # type: ignore[arg-type]
                                 predictions=dict(getattr(self.matrix_screen, "predictions", {})))
            records = self.runner.run()  # type: ignore[attr-defined]  # a locked or unusable results dir raises ResultsDirError
        except Exception as exc:  # noqa: BLE001 - shown to the user, the app goes on
            self.post_message(msg.MatrixDone([], f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(msg.MatrixDone(records))

    def cancel_run(self, run_id: str) -> None:
        row = self.board.rows.get(run_id)
        if self.runner is None or row is None or row.final:
            self.notify(f"{run_id} is not running or queued", severity="warning")
            return
        self.runner.cancel(run_id)
        self.notify(f"cancelling {run_id}")

    def action_cancel_all(self) -> None:
        if self.runner is not None and self.matrix_worker is not None and self.matrix_worker.is_running:
            self.runner.cancel_all()
            self.notify("cancelling all runs")

    def action_quit(self) -> None:  # type: ignore[override]
        running = self.matrix_worker is not None and self.matrix_worker.is_running
        if not running:
            self.exit()
            return
        left = sum(1 for r in self.board.rows.values() if not r.final)
        self.push_screen(Confirm(f"{left} run(s) not finished: quit and stop them?"),
                         callback=lambda yes: yes and self.stop_and_exit())  # type: ignore[arg-type]

    @work(group="quit")
    async def stop_and_exit(self) -> None:
        # Stop the ranks (or releases) before leaving: no orphan processes behind the app.
        self.runner.cancel_all()  # type: ignore[attr-defined]
        self.notify("stopping runs before quitting…")
        await self.matrix_worker.wait()  # type: ignore[union-attr]
        self.exit()

    # -- suite events -------------------------------------------------------------------------
    def on_suite_event(self, message: msg.SuiteEvent) -> None:
        """Fold the event into the board, then update what shows it."""
        event = message.event
        row = self.board.apply(event)
        if isinstance(event, ev.RunLogLine):
            self.logs_screen.append(event.run_id, event.line)
            return
        if self.runs_screen.is_mounted:
            if row is not None:
                self.runs_screen.update_row(row)
            self.runs_screen.update_progress()
        if row is not None and self.logs_screen.run_id is None:
            self.logs_screen.show_run(row.run_id)
        if (isinstance(event, ev.RunStateChanged) and self.logs_screen.is_mounted
                and event.run_id == self.logs_screen.run_id):
            self.logs_screen.update_title()
        if isinstance(event, ev.RunFinished):
            self.refresh_results()

    # -- requests from the screens --------------------------------------------------------------
    def on_cancel_run(self, message: msg.CancelRun) -> None:
        self.cancel_run(message.run_id)

    def on_show_logs(self, message: msg.ShowLogs) -> None:
        self.logs_screen.show_run(message.run_id, self.results_dir / message.run_id / "log.txt")
        self.switch_mode("logs")

    def on_open_results(self, message: msg.OpenResults) -> None:
        self.open_results(message.path)

    def on_remeasure(self, message: msg.Remeasure) -> None:
        """Re-measure runs of the shown result set from their spec.json, into that same set."""
        from shardbench.suite.execute.rerun import saved_specs

        if self.matrix_worker is not None and self.matrix_worker.is_running:
            self.notify("a matrix is already running: cancel it first (x)", severity="warning")
            return
        specs, problems = saved_specs(self.results_dir, message.run_ids)
        for line in problems:
            self.notify(line, severity="error", timeout=10)
        if not specs:
            return
        names = ", ".join(s.run_id for s in specs[:3]) + (f" and {len(specs) - 3} more" if len(specs) > 3 else "")
        self.push_screen(Confirm(f"Re-measure {len(specs)} run(s) ({names})? The current results move to "
                                 "<run>/attempts/ (kept); a run cancelled before it finishes keeps its earlier "
                                 "result."),
                         callback=lambda yes: yes and self._remeasure(specs))  # type: ignore[func-returns-value]

    def _remeasure(self, specs: list) -> None:
        if self.matrix_worker is not None and self.matrix_worker.is_running:
            self.notify("a matrix is already running: cancel it first (x)", severity="warning")
            return
        self.board.reset()
        if self.runs_screen.is_mounted:
            self.runs_screen.redraw()
        self.logs_screen.run_id = None
        self.matrix_worker = self.run_specs(specs, specs[0].backend, self.results_dir, True)
        self.notify(f"re-measuring {len(specs)} run(s); the old results move to <run>/attempts/")
        self.switch_mode("runs")

    def on_save_matrix(self, message: msg.SaveMatrix) -> None:
        self.save_matrix(message.path)

    def on_load_matrix(self, message: msg.LoadMatrix) -> None:
        self.load_matrix(message.path)

    def on_matrix_done(self, message: msg.MatrixDone) -> None:
        if message.error:
            self.notify(f"matrix stopped: {message.error}", severity="error", timeout=10)
        else:
            ok = sum(1 for r in message.records if r.get("status") == "ok")
            self.notify(f"matrix done: {ok}/{len(message.records)} runs ok")
        self.refresh_results()

    # -- results ------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="results", exit_on_error=False)
    def refresh_results(self) -> None:
        from shardbench.tui.app.results_model import ResultsView, compute
        from shardbench.tui.app.results_source import empty_hint
        from shardbench.suite.analyze.rows import load_records

        source = f"0 result(s) in {self.results_dir}"
        try:  # a bad record or directory must not take the app down nor leave the screen empty
            records = load_records(self.results_dir) if self.results_dir.is_dir() else []
            unreadable = sum(r.get("status") == "unreadable" for r in records)
            source = (f"{len(records)} result(s) in {self.results_dir}"
                      + (f" ({unreadable} unreadable)" if unreadable else ""))
            if not records:
                source += f": {empty_hint(self.results_dir)}"
            view = compute(records)
        except Exception as exc:  # noqa: BLE001
            view, source = ResultsView(), f"{source}: could not tabulate them ({type(exc).__name__}: {exc})"
        self.post_message(msg.ResultsReady(view, source))

    def on_results_ready(self, message: msg.ResultsReady) -> None:
        self.results_screen.show(message.view, message.source)
        if self.show_results:  # the first load of a result set opened with --results
            self.show_results = False
            if not message.view.rows:  # the hint (where the results are) stays until dismissed
                self.notify(message.source, severity="warning", timeout=HINT_TIMEOUT_S)

    def action_reload_results(self) -> None:
        self.refresh_results()

    def open_results(self, path: str) -> None:
        if not Path(path).is_dir():
            self.notify(f"{path} is not a directory", severity="error")
            return
        self.results_dir = self.results_screen.results_dir = Path(path)
        self.refresh_results()

    def action_write_report(self) -> None:
        self.write_report()

    @work(thread=True, exclusive=True, group="report")
    def write_report(self) -> None:
        from shardbench.suite.report.markdown import build_report

        out = self.results_dir / "report"
        try:
            rep = build_report(self.results_dir, out)
        except Exception as exc:  # noqa: BLE001
            self.post_message(msg.ReportWritten([], f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(msg.ReportWritten([str(rep.csv), *map(str, rep.plots), str(rep.markdown), str(rep.html)]))

    def on_report_written(self, message: msg.ReportWritten) -> None:
        if message.error:
            self.notify(f"report not written: {message.error}", severity="error", timeout=10)
        else:
            self.notify(f"wrote {len(message.paths)} files: {message.paths[-1]}", timeout=8)

    # -- matrix files -------------------------------------------------------------------------
    def load_matrix(self, path: str) -> None:
        try:
            spec = load_matrix(path)
        except (OSError, ValueError) as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return
        self.matrix_path = self.matrix_screen.path = path
        self.matrix_screen.show(replace(spec, results=benchtui_results(spec.results, path)))
        self.notify(f"loaded {path}")

    def save_matrix(self, path: str) -> None:
        spec = self.matrix_screen.matrix()
        if spec is None:
            self.notify("the matrix has fields that do not parse: fix them first", severity="error")
            return
        try:
            save_matrix(spec, path)
        except OSError as exc:
            self.notify(f"could not save {path}: {exc}", severity="error")
            return
        self.matrix_path = self.matrix_screen.path = path
        self.notify(f"saved {path}")
