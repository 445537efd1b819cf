"""The local backend: runs each RunSpec on this machine with the launcher it names.

The command line comes from trainer.launchers.build_command (the same one the chart renders).
CPU-only machines run the ranks with gloo; a machine with GPUs runs them with NCCL (the trainer
decides from --device). The combined stdout/stderr of all ranks is streamed line by line into
run_dir/log.txt and turned into RunLogLine / RunProgress events, and fed to a streaming
collector (shardbench.suite.execute.collect): the record is taken from the stream itself, so a log file that
could not be written (disk full) loses nothing; the trainer's own result.json is the fallback.
The runner writes the run's result.json; this backend only launches, streams and returns.

Ending a run (cancel, timeout, or leftovers after the launcher exits) ends every process the
launcher ever started, wherever it moved (shardbench.suite.execute.procs.ProcessTree).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from shardbench.trainer.launch_guard import TEARDOWN_GRACE_S
from shardbench.trainer.launchers import LaunchPlan, build_command, nccl_env_names
from shardbench.trainer.ports import free_port
from shardbench.suite.execute.collect import failed_record, iter_lines, now_iso, validate
from shardbench.suite.execute.runlines import LineReader
from shardbench.suite.execute.events import Emit, RunLogLine, RunStateChanged, guarded
from shardbench.suite.matrix.expand import RunSpec
from shardbench.suite.execute.procs import ProcessTree
from shardbench.suite.execute.startup import StartupClock
from shardbench.suite.execute.store import read_json

REPO_ROOT = Path(__file__).resolve().parents[2]
TRAINER_OUT = "trainer-output"
"""Sub-directory of run_dir given to the trainer as --output-dir (its own result.json)."""


def venv_bin() -> str:
    """Directory of this interpreter: where the venv's mpirun, deepspeed and torchrun live."""
    return os.path.dirname(sys.executable)


def default_search_path() -> str:
    """Where launchers are looked up: the venv's bin first (the pip-installed mpirun), then PATH."""
    return os.pathsep.join([venv_bin(), os.environ.get("PATH", "")])


def run_env(spec: RunSpec, port: int, search_path: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = search_path
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    # DeepSpeed and torch print FutureWarnings on every rank at every import: noise in the log.
    env["PYTHONWARNINGS"] = "ignore::FutureWarning"
    env["MASTER_ADDR"], env["MASTER_PORT"] = "127.0.0.1", str(port)
    # The trainer sizes torch's own thread pool per rank (cores / local ranks); this default only
    # stops other OpenMP users in a rank from starting one spinning thread per core each, which
    # on a shared CPU turns milliseconds per step into seconds. torchrun sets the same default.
    env.setdefault("OMP_NUM_THREADS", "1")
    # OpenMPI refuses to run as root without these (containers, CI).
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def write_hostfile(run_dir: Path, spec: RunSpec) -> Path:
    """This machine with one slot per rank: DeepSpeed's openmpi runner starts sum(slots) ranks."""
    path = run_dir / "hostfile"
    path.write_text(f"localhost slots={spec.procs_per_node}\n")
    return path


def command_for(spec: RunSpec, run_dir: Path, port: int) -> list[str]:
    hostfile = write_hostfile(run_dir, spec) if spec.launcher == "deepspeed" else None
    plan = LaunchPlan(
        launcher=spec.launcher, nodes=spec.nodes, procs_per_node=spec.procs_per_node,
        trainer_args=spec.trainer_args(output_dir=run_dir / TRAINER_OUT),
        hostfile=str(hostfile) if hostfile else None, master_port=port,
        forward_env=nccl_env_names(), python=sys.executable,
        # One machine: ranks talk over loopback; DeepSpeed would otherwise force eth0.
        tcp_if_include="lo",
    )
    cmd = build_command(plan)
    if cmd[0] == "deepspeed":  # DeepSpeed's own runner, without the mlflow import (trainer/deepspeed_runner.py)
        cmd = [sys.executable, "-m", "shardbench.trainer.deepspeed_runner", *cmd[1:]]
    return cmd


class _LogPump(threading.Thread):
    """Drains the launcher's output to its end, whatever happens: each line goes to log.txt (while
    the disk takes it), to the collector and to the event consumer. A full pipe would block every
    rank, so nothing here may stop the draining: a log write error is remembered and the log is
    given up, a bad line or a consumer error is skipped."""

    def __init__(self, stream, log_path: Path, run_id: str, emit: Emit):
        super().__init__(daemon=True, name=f"log-{run_id}")
        self.stream, self.log_path, self.run_id, self.emit = stream, log_path, run_id, emit
        self.reader = LineReader(run_id, emit)
        self.collector = self.reader.collector
        self.log_error: str | None = None
        """Why log.txt stopped being written (None: it holds everything)."""

    def run(self) -> None:
        log = self._open_log()
        for raw in iter_lines(self.stream):
            if log is not None:
                try:
                    log.write(raw)
                    log.flush()
                except OSError as exc:
                    self.log_error = f"log.txt incomplete: {exc.strerror or exc}"
                    log = _close_quietly(log)  # type: ignore[func-returns-value]
            try:
                self._handle(raw)
            except Exception:  # noqa: BLE001 - never stop draining
                pass
        _close_quietly(log)

    def _open_log(self):
        try:
            return open(self.log_path, "ab")
        except OSError as exc:
            self.log_error = f"log.txt not written: {exc.strerror or exc}"
            return None

    def _handle(self, raw: bytes) -> None:
        self.reader.feed(raw)

    def where(self) -> str:
        return self.reader.where()


def _close_quietly(fh) -> None:
    if fh is not None:
        try:
            fh.close()
        except OSError:
            pass
    return None


class LocalBackend:
    """Runs ranks as processes on this machine (CPU + gloo, or local GPUs + NCCL)."""

    name = "local"

    def __init__(self, kill_grace_s: float = 5.0, search_path: str | None = None,
                 teardown_grace_s: float = TEARDOWN_GRACE_S):
        self.kill_grace_s = kill_grace_s
        """Seconds between SIGTERM and SIGKILL when a run is stopped."""
        self.teardown_grace_s = teardown_grace_s
        """Seconds the launcher may take to exit once rank 0's record is in: OpenMPI 5's mpirun
        now and then never exits after every rank has (trainer/launch_guard.py); without a per-run
        timeout the suite waited for it for ever."""
        self.search_path = search_path or default_search_path()
        """PATH the launchers are found on (and that the ranks get)."""

    def launcher_path(self, launcher: str) -> str | None:
        return shutil.which(launcher, path=self.search_path)

    def availability(self) -> tuple[bool, str]:
        missing = [name for name in ("mpirun", "deepspeed", "torchrun") if self.launcher_path(name) is None]
        if len(missing) == 3:
            return False, f"no launcher (mpirun, deepspeed, torchrun) on {self.search_path}: run `make setup`"
        return True, f"missing launchers: {', '.join(missing)}" if missing else ""

    def run(self, spec: RunSpec, run_dir: Path, emit: Emit, cancel: threading.Event,
            timeout_s: float | None) -> dict[str, Any]:
        """Launch, stream, stop when asked or timed out, and return the record (see Backend)."""
        run_dir = Path(os.path.abspath(run_dir))  # the launcher runs in it: every path must be absolute
        emit = guarded(emit)
        started = now_iso()
        if self.launcher_path(spec.launcher) is None:
            record = failed_record(spec, f"{spec.launcher} not found (searched {self.search_path}): run `make setup`")
        else:
            record = self._launch(spec, run_dir, emit, cancel, timeout_s)
        record["started_at"] = record.get("started_at") or started
        return record

    def _launch(self, spec, run_dir, emit, cancel, timeout_s) -> dict[str, Any]:
        port = free_port()
        cmd = self.command(spec, run_dir, port)
        cmd[0] = self.launcher_path(cmd[0]) or cmd[0]  # the one availability() found
        log_path = run_dir / "log.txt"
        log_path.write_bytes(("$ " + " ".join(cmd) + "\n").encode())
        emit(RunLogLine(spec.run_id, "$ " + " ".join(cmd)))  # the log's first line, shown first too
        try:
            proc = subprocess.Popen(self.tied(cmd), cwd=run_dir, env=run_env(spec, port, self.search_path),
                                    stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            return failed_record(spec, f"could not start {spec.launcher}: {exc}")
        tree = ProcessTree(proc.pid)
        clock = StartupClock(proc.pid, spec.world_size)
        emit(RunStateChanged(spec.run_id, "running", spec.launcher))
        pump = _LogPump(proc.stdout, log_path, spec.run_id, emit)
        pump.start()
        stopped = None
        try:
            stopped = self._wait(proc, tree, cancel, timeout_s, clock, pump.collector)
        finally:
            # Whatever happened (done, stopped, an exception here), nothing of this run may
            # outlive it: anything left of the tree is an orphan rank.
            if proc.poll() is None or tree.alive():
                tree.kill(self.kill_grace_s)
            proc.wait()
        pump.join(timeout=10)  # every writer is gone by now: EOF comes at once
        emit(RunStateChanged(spec.run_id, "collecting"))
        record = self._record(spec, run_dir, proc.returncode, stopped, timeout_s, pump)
        if record.get("launcher_startup_s") is None:
            record["launcher_startup_s"] = clock.seconds()
        return record

    def command(self, spec: RunSpec, run_dir: Path, port: int) -> list[str]:
        return command_for(spec, run_dir, port)

    def tied(self, cmd: list[str]) -> list[str]:
        """The launch command under a supervisor that ends it, ranks first, if this process dies
        outright (shardbench.suite.execute.procs.supervise: rank 0 keeps its record under mpirun too)."""
        return [sys.executable, "-m", "shardbench.suite.execute.procs", *cmd]

    def _wait(self, proc: subprocess.Popen, tree: ProcessTree, cancel: threading.Event,
              timeout_s: float | None, clock: StartupClock | None = None, collector=None) -> str | None:
        """Wait for the launcher; returns 'cancelled', 'timeout' or 'teardown' (the launcher
        outlived the record by teardown_grace_s) when it had to be stopped."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while proc.poll() is None:
            tree.refresh()  # learn every rank while its parent still lives
            if clock is not None:
                try:
                    clock.poll(tree)
                except Exception:  # noqa: BLE001 - a side measurement: losing it must never end the run
                    clock.broken = True
            why = self._why_stop(cancel, deadline, collector)
            if why:
                tree.kill(self.kill_grace_s)
                return why
            cancel.wait(0.25)
        return None

    def _why_stop(self, cancel: threading.Event, deadline: float | None, collector) -> str | None:
        """'cancelled', 'timeout', 'teardown' (the launcher outlived the record by teardown_grace_s) or None."""
        if cancel.is_set():
            return "cancelled"
        if deadline is not None and time.monotonic() > deadline:
            return "timeout"
        seen = collector.record_seen_at if collector is not None else None
        if seen is not None and time.monotonic() > seen + self.teardown_grace_s:
            return "teardown"
        return None

    def _record(self, spec, run_dir, returncode, stopped, timeout_s, pump: _LogPump) -> dict[str, Any]:
        found = pump.collector.result()  # type: ignore[union-attr]
        record, notes, where = found.record, list(found.notes), pump.where()
        if pump.log_error:
            notes.append(pump.log_error)
        if record is None:
            record = _trainer_file_record(run_dir)
            if record is not None:
                notes.append(f"no usable record in the log ({found.error}); took the trainer's result.json")
        if record is not None and stopped == "teardown":
            notes.append(f"the launcher had not exited {self.teardown_grace_s:g} s after the record was printed "
                         "(OpenMPI 5's teardown hang, openpmix/prrte#1839): stopped it; kept the record")
        elif record is not None and stopped and record.get("status") == "ok":
            # The measurement was complete; only the launcher's teardown was still running.
            notes.append(f"stopped ({stopped}) after the record was printed; kept the record")
        elif stopped == "cancelled":
            record = _stopped(record, spec, f"cancelled by the user{where}", "failed")
        elif stopped == "timeout":
            record = _stopped(record, spec, f"timed out after {timeout_s:g} s (per-run timeout){where}", "timeout")
        elif record is None:
            error = found.error or "no result record in the log"
            if returncode:
                error += f" (launcher exit code {returncode})"
            record = failed_record(spec, error)
        elif returncode:
            notes.append(f"launcher exited {returncode} after the record was printed; kept the record")
        if notes:
            try:
                (run_dir / "collect-notes.txt").write_text("\n".join(notes) + "\n")
            except OSError:
                pass  # the notes explain; the record itself is what must not be lost
        return record


def _stopped(record: dict | None, spec: RunSpec, why: str, status: str) -> dict[str, Any]:
    """A stopped run's record: the trainer's own failed record when it wrote one on SIGTERM
    (it holds what was measured up to then), relabelled; else one built from the spec."""
    if record is None:
        return failed_record(spec, why, status=status)
    record = dict(record)
    record["status"] = status
    record["error"] = why + (f"; trainer: {record['error'].splitlines()[0]}" if record.get("error") else "")
    return record


def _trainer_file_record(run_dir: Path) -> dict | None:
    """The trainer's own --output-dir result.json when it is a valid record."""
    try:
        record = read_json(run_dir / TRAINER_OUT / "result.json")
    except ValueError:
        return None
    return record if validate(record) is None else None
