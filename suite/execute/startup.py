"""The launcher's start-up time, the same measure for every launcher (torchrun, mpirun, the
DeepSpeed launcher, Ray): from the start of the launch command's process to the start of the
last of the run's first `world_size` trainer processes (`python -m shardbench.trainer`), both read from
/proc/<pid>/stat (start time in clock ticks since boot, 10 ms here). It is what the launcher
itself costs before the trainer can start: its own import, spawning (mpirun's daemons), a Ray
cluster and its actors. Ranks of a relaunch start later and are not counted (the fault's restart
time covers them). Linux /proc only, like the local backend.

On a cluster (MPIJob, RayJob) the suite sees no /proc of the pods, so the same two instants are
read from start stamps in the job's log (`StampClock`): the launch command's start (the image's
entrypoint as it execs the MPIJob's launch command; the RayJob's driver, trainer/ray_launcher.py,
its own process start) and each rank's trainer process start, which every rank prints from its
own /proc (trainer/cli.py). Both are epoch seconds of the nodes' clocks, so ranks on other nodes
than the launcher add the nodes' clock offset (NTP: milliseconds) to a start-up of seconds; the
pod's scheduling, image pull and the entrypoint's wait for the workers come before the launch
command and are not counted, as a local run's Popen is not."""
from __future__ import annotations

import json
import os
import re

from shardbench.trainer.record import START_STAMP
from shardbench.suite.faults.targets import _cmdline, _is_rank
from shardbench.suite.execute.procs import ProcessTree, _stat_fields

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class StartupClock:
    """Fed the run's process tree while it lives; `seconds()` is the launcher's start-up time."""

    def __init__(self, launcher_pid: int, world_size: int):
        fields = _stat_fields(launcher_pid)
        self.t0 = int(fields[19]) if fields and len(fields) > 19 else None
        self.world_size = world_size
        self.seen: set[int] = set()
        self.rank_starts: list[int] = []
        self.broken = False
        """A poll failed: the start-up time is unknown (None), the run goes on."""

    def poll(self, tree: ProcessTree) -> None:
        """Look at the processes the tree learnt and has not settled yet (cheap: new pids only)."""
        for pid, start in list(tree.known.items()):
            if pid in self.seen:
                continue
            argv = _cmdline(pid)
            if _is_rank(argv):
                self.seen.add(pid)
                self.rank_starts.append(int(start))
            elif not _before_exec(pid, argv):
                self.seen.add(pid)  # exec'd into something else, or gone: never a rank

    def seconds(self) -> float | None:
        if self.broken or self.t0 is None or len(self.rank_starts) < self.world_size:
            return None
        last = sorted(self.rank_starts)[self.world_size - 1]
        return round((last - self.t0) / _TICKS, 3)


def _before_exec(pid: int, argv: list[str]) -> bool:
    """Forked but not yet exec'd: the child still shows its parent's command line. Under load a
    launcher's child stays so for a while (seen in CI: torchrun's ranks read before their exec were
    settled as non-ranks and the start-up time was None); such a pid is read again next poll."""
    fields = _stat_fields(pid)
    if not argv or not argv[0] or fields is None or len(fields) < 2:
        return False
    return argv == _cmdline(int(fields[1]))


_STAMP = re.compile(re.escape(START_STAMP) + r"(\{.*\})")  # anywhere: mpirun prefixes each rank's line


class StampClock:
    """Fed the first launch's log lines; `seconds()` is the launcher's start-up time from the
    start stamps (the module doc), None until the launch command's and `world_size` ranks' are seen."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.launcher: float | None = None
        self.ranks: dict[int, float] = {}

    def feed(self, line: str) -> None:
        found = _STAMP.search(line) if START_STAMP in line else None
        if found is None:
            return
        try:
            stamp = json.loads(found.group(1))
            if "launcher" in stamp and self.launcher is None:
                self.launcher = float(stamp["launcher"])
            elif "rank" in stamp:
                self.ranks.setdefault(int(stamp["rank"]), float(stamp["t"]))  # a rank's first only
        except (ValueError, TypeError, KeyError):
            pass  # a garbled stamp measures nothing; the run is not affected

    def seconds(self) -> float | None:
        if self.launcher is None or len(self.ranks) < self.world_size:
            return None
        return round(max(0.0, max(self.ranks.values()) - self.launcher), 3)
