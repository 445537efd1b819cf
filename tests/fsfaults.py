"""Real filesystem faults for tests: a tiny tmpfs that fills up, a read-only mount.

Mounting needs root (this machine's tests run as root; chmod alone does not stop root). Where
mount is not allowed the tests that need it are skipped, and say so.
"""
from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest


def _mount(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()}): needs root")


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "256k", readonly: bool = False):
    """A fresh tmpfs of `size` at `path` (read-only when asked), unmounted afterwards."""
    _mount(path, f"size={size}" + (",ro" if readonly else ""))
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory: Path) -> None:
    """Write until the filesystem under `directory` has no byte left (ENOSPC)."""
    with open(directory / "filler", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError:
            pass
