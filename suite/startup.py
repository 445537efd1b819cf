"""The launcher's start-up time, the same measure for every launcher (torchrun, mpirun, the
DeepSpeed launcher, Ray): from the start of the launch command's process to the start of the
last of the run's first `world_size` trainer processes (`python -m shardbench.trainer`), both read from
/proc/<pid>/stat (start time in clock ticks since boot, 10 ms here). It is what the launcher
itself costs before the trainer can start: its own import, spawning (mpirun's daemons), a Ray
cluster and its actors. Ranks of a relaunch start later and are not counted (the fault's restart
time covers them). Linux /proc only, like the local backend."""
from __future__ import annotations

import os

from shardbench.suite.fault_procs import _cmdline, _is_rank
from shardbench.suite.procs import ProcessTree, _stat_fields

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class StartupClock:
    """Fed the run's process tree while it lives; `seconds()` is the launcher's start-up time."""

    def __init__(self, launcher_pid: int, world_size: int):
        fields = _stat_fields(launcher_pid)
        self.t0 = int(fields[19]) if fields and len(fields) > 19 else None
        self.world_size = world_size
        self.seen: set[int] = set()
        self.rank_starts: list[int] = []

    def poll(self, tree: ProcessTree) -> None:
        """Look at the processes the tree learnt since the last call (cheap: new pids only)."""
        for pid, start in list(tree.known.items()):
            if pid not in self.seen:
                self.seen.add(pid)
                if _is_rank(_cmdline(pid)):
                    self.rank_starts.append(int(start))

    def seconds(self) -> float | None:
        if self.t0 is None or len(self.rank_starts) < self.world_size:
            return None
        last = sorted(self.rank_starts)[self.world_size - 1]
        return round((last - self.t0) / _TICKS, 3)
