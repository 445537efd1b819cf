"""Helpers that start real trainer processes (plain python, torchrun, mpirun, the DeepSpeed
launcher) on this machine's CPUs with gloo, and read their result records."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardbench.trainer import ports
from shardbench.trainer.launchers import LaunchPlan, build_command, remove_stale_mpi_sessions
from shardbench.trainer.record import END_MARKER, START_MARKER

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    return ports.free_port("127.0.0.1")


def cpu_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONWARNINGS"] = "ignore::FutureWarning"
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.pop("MASTER_ADDR", None)
    env.pop("MASTER_PORT", None)
    return env


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    forked: bool = False
    """Forked from the session's fork server (tests/forkserver.py), not a fresh interpreter."""

    @property
    def record(self) -> dict:
        assert START_MARKER in self.stdout, f"no record; stderr tail:\n{self.stderr[-3000:]}"
        body = self.stdout.split(START_MARKER, 1)[1].split(END_MARKER, 1)[0]
        return json.loads(body)


def command(args: list[str], launcher: str | None, nproc: int, tmp: Path) -> list[str]:
    if launcher is None:
        return [sys.executable, "-m", "shardbench.trainer", *args]
    hostfile = tmp / f"hostfile-{nproc}"
    hostfile.write_text(f"localhost slots={nproc}\n")
    plan = LaunchPlan(launcher=launcher, nodes=1, procs_per_node=nproc, trainer_args=args,
                      hostfile=str(hostfile), master_port=free_port(), python=sys.executable,
                      tcp_if_include="lo")
    return build_command(plan)


def run_trainer(args: list[str], tmp: Path, launcher: str | None = None, nproc: int = 1,
                timeout: float = 300, master_env: bool = True, fork: bool = True) -> Run:
    """Run the trainer to the end. mpirun ranks get MASTER_ADDR/PORT from the environment unless
    master_env is False: then rank 0 must share its address through mpi4py. A one-process run,
    and a torchrun run's ranks, are forked from the session's fork server (tests/forkserver.py:
    torch and DeepSpeed imported once; the ranks get torchrun's environment, no torchrun runs)
    unless fork is False: pass that where the start-up or the launcher itself is under test."""
    env = cpu_env()
    if launcher == "mpirun" and master_env:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    if fork and (launcher is None or launcher == "torchrun"):
        from tests import forkserver

        server = forkserver.server(env)
        if server is not None and server.fits(env):
            return Run(*server.run(args, env, REPO, timeout, nproc), forked=True)
    if launcher in ("mpirun", "deepspeed"):
        remove_stale_mpi_sessions()  # as the suite does before a launch (trainer/launchers.py)
    proc = subprocess.run(command(args, launcher, nproc, tmp), cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    return Run(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="session")
def result_schema() -> dict:
    return json.loads((REPO / "trainer" / "schema" / "result.schema.json").read_text())


def flag_timed_window(trainer) -> list[bool]:
    """Wrap the trainer's timed step so that the returned flag reads [True] exactly while a
    step is inside its timed window (tests check what runs inside it)."""
    timing, timed = [False], trainer.steps.timed

    def timed_step(host):
        timing[0] = True
        try:
            return timed(host)
        finally:
            timing[0] = False

    trainer.steps.timed = timed_step
    return timing
