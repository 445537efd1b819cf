"""The suite's fault axis: inject a failure into a running run, relaunch it from its checkpoint,
and report the whole run (every attempt) as one record.

Faults (the matrix's `faults` axis; `none` is a fault-free run):
- `kill-rank:R@S`: SIGKILL rank R once rank 0 reports optimizer step S (a node or process dies);
- `stop-rank:R@S`: SIGSTOP rank R at step S (a hang: the other ranks wait in a collective until
  the process-group timeout, --pg-timeout-s, ends them);
- `kill-launcher@S`: SIGKILL the launcher at step S (the job's driver dies; its ranks follow it,
  trainer/lifeline.py).

On the kubernetes backend only kill-rank is injected (KUBE_FAULT_KINDS): the cluster backend
deletes the worker pod that holds the rank and follows the retried launcher
(tui/suite/backends/kube/faults.py); the record gets the same `fault` fields through `merge`.

`Recovering` wraps the local backend. For a run with checkpointing or a fault it gives
the trainer `--checkpoint-dir <run dir>/checkpoints` (the trainer resumes from it with its
default `--resume auto`), runs every attempt (launch) in `<run dir>/launch-<k>/`, injects the fault into
the first one from the progress lines (the ranks are found by their command line and their
launcher's rank variables), waits for the launcher to end, and relaunches up to `max_restarts`
times. The record of the last attempt holds the whole run's losses and step times (they travel in
the checkpoint); `fault` adds detection time (fault to launcher exit), restart time (exit to the
first step after resume), steps redone and goodput.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from trainer.record import FaultRecovery
from tui.suite.events import Emit, RunLogLine, RunProgress, RunStateChanged, guarded

FAULT_KINDS = ("kill-rank", "stop-rank", "kill-launcher")
_FAULT = re.compile(r"^(?P<kind>kill-rank|stop-rank):(?P<rank>\d+)@(?P<step>\d+)$|^(?P<lkind>kill-launcher)@(?P<lstep>\d+)$")
CHECKPOINTS = "checkpoints"
"""Sub-directory of a run's directory that holds its checkpoints."""


@dataclass(frozen=True)
class Fault:
    kind: str
    """kill-rank, stop-rank or kill-launcher."""
    step: int
    """Injected once rank 0 has reported this optimizer step."""
    rank: int | None = None
    """The rank signalled (None for kill-launcher)."""

    def __str__(self) -> str:
        return f"{self.kind}@{self.step}" if self.rank is None else f"{self.kind}:{self.rank}@{self.step}"


def parse_fault(text: Any) -> Fault | None:
    """`none` -> None; `kill-rank:1@12` -> Fault; anything else: ValueError with one line."""
    if text in (None, "none"):
        return None
    m = _FAULT.match(str(text)) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"fault {text!r} is not none, kill-rank:R@S, stop-rank:R@S or kill-launcher@S "
                         "(R a rank, S an optimizer step)")
    if m["lkind"]:
        return Fault(m["lkind"], int(m["lstep"]))
    return Fault(m["kind"], int(m["step"]), int(m["rank"]))


def fault_errors(text: Any, world_size: int, steps: int) -> list[str]:
    """Why `text` cannot be injected into a run of `world_size` ranks and `steps` steps."""
    try:
        fault = parse_fault(text)
    except ValueError as exc:
        return [str(exc)]
    if fault is None:
        return []
    errors = []
    if fault.rank is not None and fault.rank >= world_size:
        errors.append(f"fault {fault} names rank {fault.rank} but the run has {world_size} rank(s)")
    if not 1 <= fault.step < steps:
        errors.append(f"fault {fault} fires at step {fault.step}: use a step from 1 to {steps - 1}")
    return errors


KUBE_FAULT_KINDS = ("kill-rank",)
"""The faults the cluster backend injects; stop-rank and kill-launcher need the ranks' processes."""


def kube_fault_errors(text) -> list[str]:
    """Why fault `text` cannot be injected on the kubernetes backend (one line), or []."""
    try:
        fault = parse_fault(text)
    except ValueError:
        return []  # the matrix's own fault check says what is wrong with it
    if fault is None or fault.kind in KUBE_FAULT_KINDS:
        return []
    return [f"fault {fault} cannot be injected on the kubernetes backend (it deletes a worker pod): "
            "use kill-rank:R@S there, or backend local"]


# --- finding the processes of one attempt -------------------------------------------------------

def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
    except OSError:
        return []


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode("utf-8", "replace")
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def _ppid(pid: int) -> int:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
        return int(raw[raw.rfind(")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def attempt_processes(marker: str) -> dict[int, list[str]]:
    """pid -> argv of every process whose command line holds `marker` (the attempt's own
    --output-dir, unique to it): the launcher chain and the ranks."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            argv = _cmdline(int(entry))
            if any(marker in a for a in argv):
                out[int(entry)] = argv
    return out


def _is_rank(argv: list[str]) -> bool:
    """`python [-u] -m trainer ...`: a rank, not a launcher (mpirun, deepspeed, torchrun, whose
    own command lines also hold the trainer's arguments)."""
    args = argv[1:4]
    return os.path.basename(argv[0]).startswith("python") and args[:2] == ["-m", "trainer"] or args == ["-u", "-m", "trainer"]


def rank_pid(marker: str, rank: int) -> int | None:
    """The pid of rank `rank` of the attempt: its launcher's rank variable says which it is."""
    for pid, argv in attempt_processes(marker).items():
        env = _environ(pid)
        found = env.get("OMPI_COMM_WORLD_RANK", env.get("RANK", env.get("PMI_RANK")))
        if _is_rank(argv) and found is not None and int(found) == rank:
            return pid
    return None


def launcher_pid(marker: str) -> int | None:
    """The top of the attempt's launcher chain (the process whose parent is not in it)."""
    procs = attempt_processes(marker)
    tops = [pid for pid in procs if _ppid(pid) not in procs and not _is_rank(procs[pid])]
    return min(tops) if tops else None


def inject(fault: Fault, marker: str) -> str:
    """Send the fault's signal; returns what was done (for the log)."""
    pid = launcher_pid(marker) if fault.kind == "kill-launcher" else rank_pid(marker, fault.rank)
    if pid is None:
        return f"fault {fault}: no such process found (it already ended?)"
    os.kill(pid, signal.SIGSTOP if fault.kind == "stop-rank" else signal.SIGKILL)
    return f"fault {fault}: sent {'SIGSTOP' if fault.kind == 'stop-rank' else 'SIGKILL'} to pid {pid}"


# --- the wrapper ------------------------------------------------------------------------------

def _needs_checkpoints(spec) -> bool:
    return spec.fault != "none" or bool(dict(spec.options).get("checkpoint_every"))


class _Attempt:
    """Watches one attempt's progress: injects the fault at its step, notes when the first step
    after a resume arrives."""

    def __init__(self, spec, fault: Fault | None, marker: str, emit: Emit):
        self.spec, self.fault, self.marker, self.emit = spec, fault, marker, emit
        self.injected_at: float | None = None
        self.injected_step: int | None = None
        self.last_step = 0
        self.first_step_at: float | None = None
        self.notes: list[str] = []
        """What the suite did to this launch (the fault), for the joined log."""

    def __call__(self, event) -> None:
        if isinstance(event, RunProgress):
            self.last_step = max(self.last_step, event.step)
            if self.first_step_at is None:
                self.first_step_at = time.time()
            if self.fault and self.injected_at is None and event.step >= self.fault.step:
                self.injected_at, self.injected_step = time.time(), event.step
                self.notes.append(f"[shardbench] {inject(self.fault, self.marker)}")
                self.emit(RunLogLine(self.spec.run_id, self.notes[-1]))
        self.emit(event)


class Recovering:
    """A backend that checkpoints, injects the spec's fault and relaunches (see the module doc).
    Runs without checkpointing or a fault go straight to the wrapped backend."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name

    def availability(self) -> tuple[bool, str]:
        return self.inner.availability()

    def run(self, spec, run_dir: Path, emit: Emit, cancel: threading.Event, timeout_s: float | None) -> dict[str, Any]:
        if not _needs_checkpoints(spec):
            return self.inner.run(spec, run_dir, emit, cancel, timeout_s)
        run_dir, emit = Path(run_dir), guarded(emit)
        ckpt = run_dir / CHECKPOINTS
        shutil.rmtree(ckpt, ignore_errors=True)  # an earlier run's checkpoints are not this run's
        options = dict(spec.options)
        options.update(checkpoint_dir=str(ckpt), resume="auto")
        if spec.fault != "none" and "pg_timeout_s" not in options:
            options["pg_timeout_s"] = 30.0  # a hang must end in a timeout well within the run's
        attempt_spec = replace(spec, options=tuple(sorted(options.items())))
        fault = parse_fault(spec.fault)
        start, deadline = time.time(), None if timeout_s is None else time.monotonic() + timeout_s
        attempts: list[tuple[dict, _Attempt, float]] = []
        for k in range(spec.max_restarts + 1):
            adir = run_dir / f"launch-{k}"
            adir.mkdir(parents=True, exist_ok=True)
            # The launch's own directory, as its ranks' --output-dir holds it, names its processes.
            watch = _Attempt(spec, fault if k == 0 else None, f"{adir}{os.sep}", emit)
            left = None if deadline is None else max(1.0, deadline - time.monotonic())
            if k:
                emit(RunLogLine(spec.run_id, f"[shardbench] relaunch {k} of {spec.max_restarts} with --resume auto"))
                emit(RunStateChanged(spec.run_id, "running", f"restart {k}"))
            record = self.inner.run(attempt_spec, adir, watch, cancel, left)
            attempts.append((record, watch, time.time()))
            if record.get("status") == "ok" or cancel.is_set() or (deadline and time.monotonic() >= deadline):
                break
        _join_logs(run_dir, [watch.notes for _, watch, _ in attempts])
        record = merge(spec, attempts, start)
        if record.get("status") == "ok":
            shutil.rmtree(ckpt, ignore_errors=True)  # measured; the checkpoints were the means
        return record


def merge(spec, attempts: list[tuple[dict, "_Attempt", float]], start: float) -> dict[str, Any]:
    """One record for the whole run: the last attempt's (which holds every step's loss and time
    through its checkpoint), with the fault and its recovery."""
    record = dict(attempts[-1][0])
    first, watch0, ended0 = attempts[0]
    info = FaultRecovery(fault=spec.fault, attempts=len(attempts), injected_at_step=watch0.injected_step)
    if watch0.injected_at is not None:
        info.detection_s = ended0 - watch0.injected_at
        if len(attempts) > 1 and attempts[1][1].first_step_at is not None:
            info.restart_s = attempts[1][1].first_step_at - ended0
            info.recovery_s = info.detection_s + info.restart_s
    resumed = [(a[0].get("checkpoint") or {}).get("resumed_from_step") or 0 for a in attempts[1:]]
    info.steps_redone = sum(max(0, prev[1].last_step - r) for prev, r in zip(attempts, resumed))
    info.total_wall_s = attempts[-1][2] - start
    if record.get("status") == "ok" and info.total_wall_s > 0:
        info.goodput_tokens_per_s = record.get("steps", 0) * record.get("tokens_per_step", 0) / info.total_wall_s
    elif spec.fault != "none" and len(attempts) > spec.max_restarts:
        record["error"] = (f"{len(attempts)} attempts, none finished (max_restarts {spec.max_restarts}); "
                           f"last: {record.get('error') or record.get('status')}")
    if spec.fault != "none":
        record["fault"] = asdict(info)
    return record


def _join_logs(run_dir: Path, notes: list[list[str]]) -> None:
    """run_dir/log.txt: every launch's log, one after another, each under a header line and
    followed by what the suite did to it."""
    try:
        with open(run_dir / "log.txt", "wb") as out:
            for k, said in enumerate(notes):
                out.write(f"===== launch {k} =====\n".encode())
                path = run_dir / f"launch-{k}" / "log.txt"
                if path.is_file():
                    with open(path, "rb") as fh:
                        shutil.copyfileobj(fh, out)
                out.write("".join(f"{line}\n" for line in said).encode())
    except OSError:
        pass  # the attempts' own logs are still there
