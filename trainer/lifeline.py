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

Rank 0's record outlives the launcher's teardown: prterun SIGKILLs the ranks still running as
soon as one rank exits after a SIGTERM (its sleep before SIGKILL ends on SIGCHLD), which can be
before rank 0 has renamed its result.json. So rank 0, as it starts reporting a failure, leaves a
marker (`announce_rank0`: host, pid, start time) in its output dir, and every other rank that
fails holds its exit (`hold_for_rank0`) while that rank 0 lives on this host, runs (not stopped)
and has not written its record, for at most RANK0_HOLD_S. Before holding, that rank shuts its TCP
connections (`close_peer_connections`), so a rank 0 blocked in a collective this rank will never
join is freed at once instead of at this rank's exit; and first it leaves a note of why it failed
(`leave_failure_note`), which rank 0's record names as the cause of its own broken collective. A
rank 0 that has not started reporting within RANK0_START_S is not waited for.
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
RANK0_MARKER = ".rank0-reporting"
"""In the trainer's output dir: `host pid starttime` of the rank 0 that is writing result.json."""
RANK0_START_S = 1.0
"""How long a failed non-zero rank waits for rank 0 to start reporting (its connections to rank 0
already shut: close_peer_connections)."""
RANK0_HOLD_S = 10.0
"""At most this long a failed non-zero rank waits for rank 0's record (a stuck rank 0 costs this)."""
FAILURE_NOTE = ".rank{rank}-failed"
"""In the trainer's output dir: `status: error line` of a failing non-zero rank, written before it
shuts its connections. Rank 0's collective then fails on a shut connection, and rank 0's record
names this cause (`failures_before`), not only the broken connection it saw."""
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


def announce_rank0(output_dir: str | None) -> None:
    """Rank 0, failing: say who is writing `output_dir`/result.json now (best effort: a rank that
    cannot read it simply does not wait)."""
    if not output_dir:
        return
    import socket

    try:
        with open(os.path.join(output_dir, RANK0_MARKER), "w") as fh:
            fh.write(f"{socket.gethostname()} {os.getpid()} {_identity(os.getpid())}\n")
    except OSError:
        pass


def _rank0_busy(output_dir: str, since: float) -> bool | None:
    """True: rank 0 of this run is reporting on this host (alive, not stopped, record not yet
    written); None: it has not started reporting; False: nothing to wait for."""
    import socket

    try:
        if os.stat(os.path.join(output_dir, "result.json")).st_mtime >= since:
            return False  # written during this run
    except OSError:
        pass
    try:
        host, pid, ident = open(os.path.join(output_dir, RANK0_MARKER)).read().split()
    except (OSError, ValueError):
        return None
    fields = _stat(int(pid)) if pid.isdigit() else None
    return (host == socket.gethostname() and fields is not None and len(fields) > 19
            and fields[19] == ident and fields[0] not in ("T", "t", "Z", "X"))


def close_peer_connections() -> int:
    """A failing non-zero rank, before it holds: shut down its connected TCP sockets (gloo's pairs
    to the other ranks, the rendezvous store). Rank 0 may be blocked in a collective this rank
    will never join, and its SIGTERM handler cannot run until that call returns: with the
    connections shut, the call fails at once and rank 0 reports; without, it returned only when
    this rank exited, which is when prterun SIGKILLs rank 0 (its record lost in 4 of 14 SIGTERMs
    to mpirun on a loaded host). Unix sockets (PMIx, the launcher's) are left alone. Returns how
    many were shut."""
    import socket

    shut = 0
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))  # family and type read from the fd
        except (OSError, ValueError):
            continue
        with sock:  # closes the duplicate only; shutdown() acts on the connection itself
            try:
                if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
                    sock.getpeername()  # connected (a listening socket, e.g. the metrics port, is kept)
                    sock.shutdown(socket.SHUT_RDWR)
                    shut += 1
            except OSError:
                pass
    return shut


def leave_failure_note(output_dir: str | None, rank: int, status: str, line: str) -> None:
    """A failing non-zero rank, before close_peer_connections: say why, for rank 0's record."""
    if not output_dir:
        return
    path = os.path.join(output_dir, FAILURE_NOTE.format(rank=rank))
    try:
        with open(path + ".tmp", "w") as fh:
            fh.write(f"{status}: {line}\n")
        os.replace(path + ".tmp", path)  # whole or absent when rank 0 reads it
    except OSError:
        pass


def failures_before(output_dir: str | None, since: float) -> list[tuple[int, str, str]]:
    """Rank 0, failing: (rank, status, error line) of each rank that failed before it and left a
    note since `since` (this process's start: older notes are an earlier attempt's), the earliest
    note first. The notes are removed once read."""
    if not output_dir or not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        rank = name.removeprefix(".rank").removesuffix("-failed")
        if not (name.startswith(".rank") and name.endswith("-failed") and rank.isdigit()):
            continue
        path = os.path.join(output_dir, name)
        try:
            written = os.stat(path).st_mtime
            text = open(path).read().strip()
            os.unlink(path)
        except OSError:
            continue
        status, _, line = text.partition(": ")
        if written >= since and line:
            found.append((written, int(rank), status, line))
    return [note[1:] for note in sorted(found)]


def hold_for_rank0(output_dir: str | None, since: float, limit_s: float = RANK0_HOLD_S) -> None:
    """A non-zero rank that failed: wait (at most `limit_s`) while rank 0 is still writing its
    record, so the launcher does not end rank 0 the moment this rank exits (see the module doc).
    `since`: this process's start (a result.json older than that is an earlier run's)."""
    if not output_dir:
        return
    start = time.monotonic()
    while time.monotonic() < start + limit_s:
        busy = _rank0_busy(output_dir, since)
        if busy is False or (busy is None and time.monotonic() > start + RANK0_START_S):
            return
        time.sleep(0.05)


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
