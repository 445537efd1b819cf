"""Reference runs shared by the whole test session: a trainer run is keyed by its exact command
line (arguments, launcher, ranks, and the environment that changes it) and runs once per pytest
session; every test module that asks for the same key gets the same result.

Its output lives in a directory of its own (`{shared}` in the arguments stands for it, so the key
holds no test's tmp path). That directory is shared and read-only by convention: a test that
damages or extends a checkpoint works on `copy_dir()`. Under pytest-xdist the workers share one
cache: the first worker to ask runs it under a file lock, the others read its result.

Record dicts are parsed afresh for every caller (Run.record), so mutating one is harmless.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from tests.trainer.conftest import Run, run_trainer

SHARED = "{shared}"
"""In a shared run's arguments: its own directory (checkpoints, output dir, hostfiles)."""

_ENV_PREFIXES = ("SHARDBENCH_", "PYTHONPATH", "NCCL_", "GLOO_", "OMP_")
"""Environment that can change a run: part of the key (the rest of the environment is the session's)."""

_root: Path | None = None


def set_root(path: Path) -> None:
    """Where this session's shared runs live (tests/conftest.py sets it from tmp_path_factory)."""
    global _root
    _root = path
    path.mkdir(parents=True, exist_ok=True)


@dataclass
class SharedRun(Run):
    dir: Path = Path()

    def copy_dir(self, dest: Path) -> Path:
        """A private copy of the run's directory, for a test that changes what it holds."""
        shutil.copytree(self.dir, dest, symlinks=True)
        return dest


def shared_run(args: list[str], launcher: str | None = None, nproc: int = 1, master_env: bool = True,
               timeout: float = 300, fork: bool = True) -> SharedRun:
    """The trainer run of this exact command line, run once per test session (forked from the fork
    server or not: tests/trainer/conftest.py run_trainer)."""
    if _root is None:
        raise RuntimeError("tests/conftest.py sets the shared-run root at session start")
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)}
    key = json.dumps({"args": args, "launcher": launcher, "nproc": nproc, "master_env": master_env, "fork": fork,
                      "env": env})
    where = _root / hashlib.sha256(key.encode()).hexdigest()[:16]
    where.mkdir(exist_ok=True)
    with open(where / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another xdist worker may be running it right now
        done = where / "run.json"
        if done.exists():
            saved = json.loads(done.read_text())
        else:
            (where / "key.json").write_text(key)
            real = [a.replace(SHARED, str(where)) for a in args]
            run = run_trainer(real, where, launcher=launcher, nproc=nproc, timeout=timeout, master_env=master_env,
                              fork=fork)
            saved = {"returncode": run.returncode, "stdout": run.stdout, "stderr": run.stderr}
            tmp = done.with_suffix(".tmp")
            tmp.write_text(json.dumps(saved))
            os.replace(tmp, done)
    return SharedRun(saved["returncode"], saved["stdout"], saved["stderr"], dir=where)
