"""Tie a rank's life to its launcher: when the launcher dies, the rank stops (no orphans).

Two mechanisms, because a launcher is often a chain of processes (deepspeed -> mpirun -> rank,
torchrun -> rank):
- PR_SET_PDEATHSIG: the kernel sends SIGTERM when the rank's parent exits (mpirun, torchrun).
- a watchdog thread for the launchers further up the chain (the DeepSpeed launcher above mpirun
  forwards signals only on its pdsh path, so SIGTERM to it leaves mpirun and the ranks running):
  once a second it checks that each launcher ancestor still lives and sends this process SIGTERM
  when one is gone. SIGTERM is what the trainer turns into a failed record (trainer/cli.py); if
  the rank is stuck in a collective and cannot act on it, the watchdog exits it after a grace.
Linux only; elsewhere both are skipped. `python -m shardbench.trainer.lifeline CMD...` runs CMD tied the
same way to the process that started it (the local backend starts launchers so).
"""
from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

PR_SET_PDEATHSIG = 1
# Words in a process's command line that make it part of the launch chain.
LAUNCHER_WORDS = ("mpirun", "mpiexec", "prterun", "prted", "orterun", "orted", "hydra_pmi_proxy",
                  "torchrun", "torch.distributed.run", "deepspeed")
HARD_EXIT_GRACE_S = 30.0
"""After SIGTERM, seconds the rank may take to report before the watchdog ends it (os._exit)."""


def _stat(pid: int) -> list[str] | None:
    try:
        raw = open(f"/proc/{pid}/stat", "rb").read().decode("utf-8", "replace")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()  # comm may hold spaces and parens


def _identity(pid: int) -> str | None:
    """The start time of `pid` (stat field 22): a pid reused by another process differs."""
    fields = _stat(pid)
    return fields[19] if fields and len(fields) > 19 and fields[0] != "Z" else None


def _cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def launcher_ancestors(pid: int | None = None) -> list[tuple[int, str]]:
    """(pid, identity) of the chain of launcher processes above `pid` (nearest first)."""
    chain: list[tuple[int, str]] = []
    current = os.getpid() if pid is None else pid
    while True:
        fields = _stat(current)
        parent = int(fields[1]) if fields and len(fields) > 1 else 0
        if parent <= 1 or not any(word in _cmdline(parent) for word in LAUNCHER_WORDS):
            return chain
        ident = _identity(parent)
        if ident is None:
            return chain
        chain.append((parent, ident))
        current = parent


def _set_pdeathsig(sig: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        pass


def _watch(chain: list[tuple[int, str]], interval_s: float) -> None:
    while True:
        time.sleep(interval_s)
        if any(_identity(pid) != ident for pid, ident in chain):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(HARD_EXIT_GRACE_S)
            os._exit(143)


def tie_to_launcher(interval_s: float = 1.0) -> list[tuple[int, str]]:
    """Make this process stop when its launcher does; returns the launcher chain watched."""
    parent = os.getppid()
    _set_pdeathsig(signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)
    if not os.path.isdir("/proc"):
        return []
    chain = launcher_ancestors()
    if chain:
        threading.Thread(target=_watch, args=(chain, interval_s), name="lifeline", daemon=True).start()
    return chain


def exec_tied(argv: list[str]) -> None:
    """Become `argv` (execvp) with SIGTERM set to arrive when this process's parent dies: the
    suite starts each launcher through this, so a suite that is killed outright (SIGKILL, OOM)
    takes its launcher with it, and the launcher takes its ranks (PDEATHSIG survives exec)."""
    parent = os.getppid()
    _set_pdeathsig(signal.SIGTERM)
    if os.getppid() != parent:  # the suite died before prctl took effect
        os._exit(143)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    import sys

    exec_tied(sys.argv[1:])
