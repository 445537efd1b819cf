"""Process-tree control for launcher runs: find and end every process a launcher started.

A launcher (mpirun, deepspeed -> mpirun, torchrun) is started in a new session. Its ranks do not
all stay there: torchrun starts each rank in a session of its own, and a rank whose parent died is
re-parented to init. So a `ProcessTree` remembers every process it has ever seen under the
launcher (its session, and the descendants of every process it knows, by parent pid), each with
its start time so a recycled pid is never signalled. `refresh()` is called while the run is
watched, and again before every signal, so a rank that was orphaned is still known.

`kill()` ends them all, ranks first: SIGTERM plus SIGCONT (a SIGSTOPped rank acts on nothing until
continued) to the ranks so they can report, then to the launchers, then SIGKILL to whatever is left
after the grace periods. SIGKILL also ends stopped processes.
Linux /proc only (the local backend's platform).

`python -m shardbench.suite.execute.procs CMD...` (`supervise`) is how the local backend starts a launcher:
CMD runs as its child, and when the suite dies outright (SIGKILL, OOM: the kernel's
PR_SET_PDEATHSIG turns that into a SIGTERM here) or stops the run, this process ends CMD's tree
the same way, ranks first. It also relays CMD's output, and keeps draining it once its own reader
(the suite) is gone. Both matter under mpirun: prterun, SIGTERMed or hit by a broken pipe, SIGTERMs
its ranks and SIGKILLs them as soon as any child exits (its sleep before SIGKILL ends on
SIGCHLD), often before rank 0 has renamed its result.json (3 records of 6 lost). A failed non-zero
rank also holds its exit while rank 0 writes (trainer/lifeline.py `hold_for_rank0`), so mpirun's
reaction to that rank's exit cannot cut rank 0 short either.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from shardbench.trainer.launchers import remove_stale_mpi_sessions

SUPERVISED_GRACE_S = 20.0
"""Seconds the supervisor gives the ranks to report after their SIGTERM (they hold for rank 0)."""


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes().decode("utf-8", errors="replace")
    except OSError:  # gone between listdir and read
        return None
    # comm (field 2) may hold spaces and parens: split after the last ')'.
    return raw[raw.rfind(")") + 2:].split()


def _snapshot() -> dict[int, tuple[int, int, str, str]]:
    """pid -> (ppid, session id, state, start time) of every process now."""
    procs = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            f = _stat_fields(int(entry))
            # fields[0] state, [1] ppid, [3] session (stat fields 3, 4, 6), [19] starttime (22)
            if f and len(f) > 19:
                procs[int(entry)] = (int(f[1]), int(f[3]), f[0], f[19])
    return procs


class ProcessTree:
    """Every process started under one launcher, remembered across re-parenting."""

    def __init__(self, root: int):
        self.root = root
        self.known: dict[int, str] = {}
        """pid -> start time of every process seen in the tree."""
        self.refresh()

    def refresh(self) -> None:
        procs = _snapshot()
        if self.root in procs:
            self.known.setdefault(self.root, procs[self.root][3])
        for pid, (_, sid, _, start) in procs.items():
            if sid == self.root:
                self.known.setdefault(pid, start)
        changed = True
        while changed:  # descendants of anything known, however deep
            changed = False
            for pid, (ppid, _, _, start) in procs.items():
                if (pid not in self.known and ppid in self.known
                        and procs.get(ppid, (0, 0, "", ""))[3] == self.known[ppid]):
                    self.known[pid] = start
                    changed = True

    def alive(self) -> list[int]:
        """Known processes still running (not zombies), the same process as when first seen."""
        procs = _snapshot()
        return [pid for pid, start in self.known.items()
                if pid in procs and procs[pid][3] == start and procs[pid][2] != "Z"]

    def leaves(self) -> list[int]:
        """Known live processes with no live known child: the ranks (launchers have children)."""
        procs = _snapshot()
        alive = set(self.alive())
        parents = {procs[pid][0] for pid in alive if pid in procs}
        return [pid for pid in alive if pid not in parents]

    def signal(self, sig: int, pids: list[int] | None = None) -> None:
        self.refresh()
        for pid in self.alive() if pids is None else pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self, grace_s: float = 5.0, launcher_grace_s: float = 2.0) -> list[int]:
        """End the tree; returns the pids still alive at the end (empty unless unkillable).

        The ranks first: SIGTERM + SIGCONT to the leaves, so each rank writes its failed record
        before a launcher that is signalled too can SIGKILL it (mpirun does, quickly); up to
        `grace_s` for them. Then SIGTERM to everything left, `launcher_grace_s`, then SIGKILL."""
        self.refresh()
        ranks = self.leaves()
        self.signal(signal.SIGTERM, ranks)
        self.signal(signal.SIGCONT, ranks)
        self._wait_for(lambda: set(ranks) & set(self.alive()), grace_s)
        self.signal(signal.SIGTERM)
        self.signal(signal.SIGCONT)
        self._wait_for(self.alive, launcher_grace_s)
        deadline = time.monotonic() + 10.0
        while self.alive() and time.monotonic() < deadline:
            self.signal(signal.SIGKILL)
            time.sleep(0.05)
        return self.alive()

    def _wait_for(self, pending, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while pending() and time.monotonic() < deadline:
            time.sleep(0.1)
            self.refresh()


def _die_with_parent() -> None:
    """SIGTERM to this process when its parent exits (Linux; elsewhere nothing)."""
    from shardbench.trainer.lifeline import _set_pdeathsig

    _set_pdeathsig(signal.SIGTERM)


def supervise(argv: list[str], grace_s: float = SUPERVISED_GRACE_S) -> int:
    """Run `argv` and return its exit status (128 + signal when a signal ended it); on SIGTERM,
    SIGINT or SIGHUP (its parent died, or was asked to stop) end argv's whole tree, ranks first."""
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the suite died before prctl took effect
        return 143
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    remove_stale_mpi_sessions()  # an earlier killed mpirun's dir with the pid this launch may get
    try:
        # The launcher dies with this process too (SIGKILL to it, e.g. a kill-launcher fault's).
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    except OSError as exc:
        print(f"shardbench: could not start {argv[0]}: {exc}", file=sys.stderr, flush=True)
        return 127
    relay = threading.Thread(target=_relay, args=(child.stdout.fileno(), sys.stdout.fileno()), daemon=True)  # type: ignore[union-attr]
    relay.start()
    tree = ProcessTree(child.pid)
    while child.poll() is None:
        tree.refresh()  # learn the ranks while their parents live
        if stop.wait(0.25):
            tree.kill(grace_s)
            break
    code = child.wait()
    relay.join(timeout=10)  # the output's end (a rank that outlived its launcher may hold the pipe)
    return 128 - code if code < 0 else code


def _relay(src: int, dst: int) -> None:
    """Copy `src` to `dst` until EOF; once `dst` fails (its reader died) keep reading and drop,
    so the launcher writing into `src` never meets a broken pipe."""
    writable = True
    while True:
        try:
            chunk = os.read(src, 65536)
        except OSError:
            return
        if not chunk:
            return
        while writable and chunk:
            try:
                chunk = chunk[os.write(dst, chunk):]
            except OSError:
                writable = False


if __name__ == "__main__":
    sys.exit(supervise(sys.argv[1:]))
