"""The launcher start-up clock reads the command line of every process of a run's tree while the
run lives. A process that the tree learnt and that was reaped before the clock read it has no
/proc entry any more: the empty command line raised IndexError in the local backend's wait loop,
whose cleanup then sent SIGTERM to every rank of a healthy run (seen in CI: a fault-free zero2 run
failed with "backend local raised IndexError"; DeepSpeed ranks start short-lived helpers)."""
import os
import subprocess
import time
from types import SimpleNamespace

from shardbench.suite.faults.targets import _cmdline, _is_rank
from shardbench.suite.execute.procs import _stat_fields
from shardbench.suite.execute.startup import StartupClock


def test_a_process_gone_before_it_was_read_is_not_a_rank_and_does_not_stop_the_clock():
    gone = subprocess.Popen(["true"])
    start = None
    while start is None:  # its start time, read while it lives or is a zombie
        start = (_stat_fields(gone.pid) or [None] * 20)[19]
    gone.wait()  # reaped: /proc/<pid> is gone
    assert _cmdline(gone.pid) == []
    assert _is_rank([]) is False
    clock = StartupClock(os.getpid(), world_size=1)
    clock.poll(SimpleNamespace(known={gone.pid: start}))
    assert clock.rank_starts == [] and clock.seconds() is None


def test_a_zombie_is_not_a_rank():
    child = subprocess.Popen(["true"])  # exits at once; not waited on yet, so a zombie
    try:
        deadline = time.monotonic() + 10
        while (_stat_fields(child.pid) or ["?"])[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _cmdline(child.pid) == [""]  # what the kernel gives for a zombie
        assert _is_rank(_cmdline(child.pid)) is False
    finally:
        child.wait()


def test_a_rank_read_before_its_exec_is_counted_once_it_execs():
    """A launcher's child between fork and exec shows the launcher's command line; the clock read
    it then, settled it as "not a rank" and the run's start-up time came out None (CI: torchrun)."""
    import sys

    from shardbench.suite.execute.procs import ProcessTree
    script = ("import os, sys, time\n"
              "pid = os.fork()\n"
              "if pid == 0:\n"
              "    time.sleep(1.5)\n"
              "    os.execv(sys.executable, [sys.executable, '-m', 'shardbench.trainer', '--help'])\n"
              "os.waitpid(pid, 0)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        tree = ProcessTree(parent.pid)
        clock = StartupClock(parent.pid, world_size=1)
        deadline = time.monotonic() + 10
        while len(tree.known) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
            tree.refresh()
        child = next(pid for pid in tree.known if pid != parent.pid)
        assert not _is_rank(_cmdline(child))  # still the parent's image
        clock.poll(tree)
        assert clock.seconds() is None
        while not _is_rank(_cmdline(child)) and time.monotonic() < deadline + 20:
            time.sleep(0.05)
        clock.poll(tree)
        assert clock.rank_starts and clock.seconds() is not None and clock.seconds() >= 0
    finally:
        parent.kill()
        parent.wait()
