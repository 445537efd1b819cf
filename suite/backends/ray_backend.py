"""The ray backend on this machine: every run is `python -m shardbench.trainer.ray_launcher --local`, an
embedded Ray (`ray.init(address="local")`, no server to start, a temp dir of its own, no
dashboard) whose actors run the trainer's ranks (trainer/ray_launcher.py).

It is the local backend with another launcher: the same log streaming, collector, per-run
timeout, and the same ending of every process the run started (Ray's GCS, raylet, workers and
the ranks are all in the launcher's process tree). What differs:
- Restarts are Ray's: a run with a fault or checkpointing gets --checkpoint-dir <run dir>/checkpoints
  and --resume auto, and the driver relaunches the whole group up to the run's max_restarts
  (Ray Train's FailureConfig max_failures); the suite injects the fault and only watches. The
  trainer's checkpoints stay the one source of truth.
- A cancel or timeout first sends SIGTERM to the driver, which ends its ranks through their
  actors (each writes its failed record) and shuts Ray down; then whatever is left is ended.
- The record's `fault` comes from the driver's SHARDBENCH_RAY event lines (launch, failed):
  detection = fault to the driver's failure event, restart = that event to the first step after
  the relaunch, as for local relaunches.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from shardbench.trainer.launchers import LaunchPlan, build_command
from shardbench.trainer.ray_launcher import EVENT_PREFIX, STOP_GRACE_S
from shardbench.trainer.record import FaultRecovery
from shardbench.suite.backends.local import TRAINER_OUT, LocalBackend
from shardbench.suite.execute.events import Emit, RunLogLine, RunProgress, guarded
from shardbench.suite.faults.restart import CHECKPOINTS, _Attempt, _needs_checkpoints, parse_fault
from shardbench.suite.matrix.expand import local_gpu_count


class RayEvents:
    """Reads the driver's event lines and the progress lines as they stream past (also for a
    RayJob's submitter log: suite/backends/kube/rayjob.py)."""

    def __init__(self, inner: Emit):
        self.inner = inner
        self.launches: list[float] = []
        self.failed_at: list[float] = []
        self.last_step_before_failure: int = 0
        self.first_step_after_relaunch: float | None = None
        self._last_step = 0

    def __call__(self, event) -> None:
        if isinstance(event, RunLogLine) and event.line.startswith(EVENT_PREFIX):
            try:
                info = json.loads(event.line[len(EVENT_PREFIX):])
            except ValueError:
                info = {}
            if info.get("event") == "launch":
                self.launches.append(time.time())
            elif info.get("event") == "failed":
                self.failed_at.append(time.time())
                self.last_step_before_failure = self._last_step
        elif isinstance(event, RunProgress):
            self._last_step = event.step
            if len(self.launches) > 1 and self.first_step_after_relaunch is None:
                self.first_step_after_relaunch = time.time()
        self.inner(event)


class RayBackend(LocalBackend):
    """Runs each RunSpec's ranks as Ray actors in an embedded Ray on this machine."""

    name = "ray"

    def __init__(self, kill_grace_s: float = 5.0, search_path: str | None = None):
        super().__init__(kill_grace_s, search_path)
        self._temp_dir: str | None = None

    def availability(self) -> tuple[bool, str]:
        if importlib.util.find_spec("ray") is None:
            return False, ("ray is not installed: pip install 'ray[default,train,tune]==2.60.0' "
                           "(the project's `ray` extra; scripts/bootstrap.sh installs it)")
        return True, ""

    def launcher_path(self, launcher: str) -> str | None:
        return sys.executable if launcher in ("ray", sys.executable) else super().launcher_path(launcher)

    def command(self, spec, run_dir: Path, port: int) -> list[str]:
        plan = LaunchPlan(launcher="ray", nodes=1, procs_per_node=spec.procs_per_node,
                          trainer_args=spec.trainer_args(output_dir=run_dir / TRAINER_OUT), python=sys.executable,
                          max_restarts=spec.max_restarts, ray_local=True, ray_temp_dir=self._temp_dir,
                          ray_gpus_per_rank=1 if spec.device != "cpu" and local_gpu_count() else 0)
        return build_command(plan)

    def tied(self, cmd: list[str]) -> list[str]:
        """The driver exec'd through trainer.lifeline (SIGTERM when the suite dies): it stops its
        own ranks and Ray in order, which a supervisor signalling the tree's leaves would break."""
        return [sys.executable, "-m", "shardbench.trainer.lifeline", *cmd]

    def run(self, spec, run_dir: Path, emit: Emit, cancel: threading.Event, timeout_s: float | None) -> dict[str, Any]:
        run_dir, emit = Path(os.path.abspath(run_dir)), guarded(emit)
        start = time.time()
        ckpt = run_dir / CHECKPOINTS
        if _needs_checkpoints(spec):
            shutil.rmtree(ckpt, ignore_errors=True)  # an earlier run's checkpoints are not this run's
            options = {**dict(spec.extra_knobs), "checkpoint_dir": str(ckpt), "resume": "auto"}
            if spec.fault != "none":
                options.setdefault("pg_timeout_s", 30.0)  # a hang must end well within the run's timeout
            spec = replace(spec, extra_knobs=tuple(sorted(options.items())))
        events = RayEvents(emit)
        fault = parse_fault(spec.fault)
        watch = _Attempt(spec, fault, f"{run_dir}{os.sep}", events)
        # Short and ours: Ray's unix sockets live under it (108-byte path limit), and a run's Ray
        # must not meet another engineer's or another run's.
        self._temp_dir = tempfile.mkdtemp(prefix="sbray-", dir="/tmp")
        try:
            record = super().run(spec, run_dir, watch if fault else events, cancel, timeout_s)
        finally:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
        if fault is not None:
            record["fault"] = asdict(fault_info(spec, record, watch, events, start))
            _append_notes(run_dir / "log.txt", watch.notes)
        if record.get("status") == "ok":
            shutil.rmtree(ckpt, ignore_errors=True)  # measured; the checkpoints were the means
        return record

    def _wait(self, proc, tree, cancel, timeout_s, clock=None, collector=None) -> str | None:
        """The local backend's wait, but a stop goes to Ray's driver first (see the module doc)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while proc.poll() is None:
            tree.refresh()
            if clock is not None:
                clock.poll(tree)
            # No teardown rule (collector None): after the record the driver stops the Ray
            # cluster it started, which takes its own time; OpenMPI's hang is not Ray's.
            why = self._why_stop(cancel, deadline, None)
            if why:
                self._stop_driver(proc, tree)
                return why
            cancel.wait(0.25)
        return None

    def _stop_driver(self, proc, tree) -> None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        ends = time.monotonic() + STOP_GRACE_S + 10
        while proc.poll() is None and time.monotonic() < ends:
            tree.refresh()
            time.sleep(0.1)
        tree.kill(self.kill_grace_s)


def fault_info(spec, record: dict, watch, events: RayEvents, start: float) -> FaultRecovery:
    """The record's `fault` from the driver's events; `watch` is what injected the fault (its
    injected_at, injected_step): the local fault wrapper's _Attempt, or the cluster's LaunchWatch."""
    info = FaultRecovery(fault=spec.fault, attempts=max(1, len(events.launches)), injected_at_step=watch.injected_step)
    if watch.injected_at is not None and events.failed_at:
        info.detection_s = events.failed_at[0] - watch.injected_at
        if events.first_step_after_relaunch is not None:
            info.restart_s = events.first_step_after_relaunch - events.failed_at[0]
            info.recovery_s = info.detection_s + info.restart_s
    resumed = (record.get("checkpoint") or {}).get("resumed_from_step") or 0
    if len(events.launches) > 1:
        info.steps_redone = max(0, events.last_step_before_failure - resumed)
    info.total_wall_s = time.time() - start
    if record.get("status") == "ok" and info.total_wall_s > 0:
        info.goodput_tokens_per_s = record.get("steps", 0) * record.get("tokens_per_step", 0) / info.total_wall_s
    elif len(events.launches) > spec.max_restarts:
        record["error"] = (f"{len(events.launches)} attempts, none finished (max_restarts {spec.max_restarts}); "
                           f"last: {record.get('error') or record.get('status')}")
    return info


def _append_notes(log: Path, notes: list[str]) -> None:
    """What the suite did to the run (the fault), at the end of its log."""
    try:
        with open(log, "a") as fh:
            fh.writelines(f"{line}\n" for line in notes)
    except OSError:
        pass  # the record's fault field says the same
