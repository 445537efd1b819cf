"""A killed mpirun's session dir never stops a later launch (trainer/launchers.py
remove_stale_mpi_sessions). PRRTE names it `ompi.<pid>` and removes it only on a clean exit; a
later prterun with the same pid failed with "The PMIx server's listener thread failed to
start" (exit 213): test_strategies' whole module errored on it once, its DeepSpeed-launcher run
having drawn a recycled pid. A fresh pid namespace (`unshare`, root as in CI) makes the pid
mpirun will get known, so stale dirs can wait for it."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from shardbench.trainer.launchers import remove_stale_mpi_sessions
from tests.trainer.conftest import BIN, REPO

pytestmark = pytest.mark.slow  # real mpirun launches


def stale_sessions(base: Path, pids) -> None:
    """What a SIGKILLed prterun leaves: its dir and its PMIx rendezvous files."""
    host = socket.gethostname()
    for pid in pids:
        d = base / f"ompi.{pid}"
        d.mkdir()
        for name in ("pmix.{h}.tool", "pmix.{h}.tool.{p}", "pmix.{h}.tool.prterun-{h}-{p}@0"):
            (d / name.format(h=host, p=pid)).touch()


def launch_in_new_pid_namespace(base: Path, *program: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(base), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1", "true"]
    return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", *program, *mpirun], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def base():
    path = Path(tempfile.mkdtemp(prefix="sb-", dir="/tmp"))  # short: PMIx socket paths are capped
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_killed_mpiruns_session_dir_does_not_stop_the_next_launch(base):
    # This project's tests run as root (tmpfs mounts, the emulated MPIJob); util-linux is Debian's base.
    assert os.geteuid() == 0 and shutil.which("unshare"), "needs root and unshare (util-linux) for a pid namespace"
    stale_sessions(base, range(1, 40))
    bare = launch_in_new_pid_namespace(base)  # the failure, as it was
    assert bare.returncode == 213 and "listener thread failed to start" in bare.stdout + bare.stderr
    stale_sessions(base, [p for p in range(1, 40) if not (base / f"ompi.{p}").exists()])
    # the suite's supervisor (every local launch goes through it) clears them first
    supervised = launch_in_new_pid_namespace(base, sys.executable, "-m", "shardbench.suite.execute.procs")
    assert supervised.returncode == 0, supervised.stdout[-2000:] + supervised.stderr[-2000:]


def test_only_dead_pids_sessions_are_removed(base):
    live = subprocess.Popen(["sleep", "60"])
    try:
        dead = subprocess.Popen(["true"])
        dead.wait()
        stale_sessions(base, [live.pid, dead.pid])
        (base / "ompi.notapid").mkdir()
        (base / "other.1").mkdir()
        assert remove_stale_mpi_sessions(str(base)) == [str(base / f"ompi.{dead.pid}")]
        assert sorted(p.name for p in base.iterdir()) == sorted([f"ompi.{live.pid}", "ompi.notapid", "other.1"])
    finally:
        live.kill()
        live.wait()
