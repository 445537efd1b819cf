"""Finding the processes of one attempt of a run, and signalling them (Linux /proc): the ranks
by their command line (the attempt's own --output-dir) and their launcher's rank variable
(OMPI_COMM_WORLD_RANK, RANK, PMI_RANK), the launcher as the top of that chain."""
from __future__ import annotations

import os
import signal
from pathlib import Path

from shardbench.suite.faults.grammar import Fault

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
    """`python [-u] -m shardbench.trainer ...`: a rank, not a launcher (mpirun, deepspeed, torchrun, whose
    own command lines also hold the trainer's arguments). A zombie's command line is empty."""
    if not argv or not argv[0]:
        return False
    args = argv[1:4]
    return (os.path.basename(argv[0]).startswith("python") and args[:2] == ["-m", "shardbench.trainer"]
            or args == ["-u", "-m", "shardbench.trainer"])


def rank_pid(marker: str, rank: int) -> int | None:
    """The pid of rank `rank` of the attempt: its launcher's rank variable says which it is."""
    for pid, argv in attempt_processes(marker).items():
        env = _environ(pid)
        found = env.get("OMPI_COMM_WORLD_RANK", env.get("RANK", env.get("PMI_RANK")))
        if _is_rank(argv) and found is not None and int(found) == rank:
            return pid
    return None


def launcher_pid(marker: str) -> int | None:
    """The top of the attempt's launcher chain (the process whose parent is not in it), below the
    suite's supervisor (`python -m shardbench.suite.execute.procs`, which is not the launcher)."""
    procs = {pid: argv for pid, argv in attempt_processes(marker).items()
             if argv[1:3] != ["-m", "shardbench.suite.execute.procs"]}
    tops = [pid for pid in procs if _ppid(pid) not in procs and not _is_rank(procs[pid])]
    return min(tops) if tops else None


def inject(fault: Fault, marker: str) -> str:
    """Send the fault's signal; returns what was done (for the log)."""
    pid = launcher_pid(marker) if fault.kind == "kill-launcher" else rank_pid(marker, fault.rank)  # type: ignore[arg-type]
    if pid is None:
        return f"fault {fault}: no such process found (it already ended?)"
    os.kill(pid, signal.SIGSTOP if fault.kind == "stop-rank" else signal.SIGKILL)
    return f"fault {fault}: sent {'SIGSTOP' if fault.kind == 'stop-rank' else 'SIGKILL'} to pid {pid}"
