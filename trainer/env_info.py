"""Facts about the software and the process, for the record."""
from __future__ import annotations

import os
import platform
import time
from importlib import metadata

import torch


def _version(dist_name: str) -> str | None:
    try:
        return metadata.version(dist_name)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - a torch without NCCL: leave it unknown
            nccl = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "deepspeed": _version("deepspeed"),
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "shardbench": _version("shardbench"),
        "image": os.environ.get("SHARDBENCH_IMAGE"),
    }


def nccl_env() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")}


def process_start_time() -> float:
    """When this process started (epoch seconds): from /proc on Linux, else now."""
    try:
        with open("/proc/self/stat") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith("btime"))
        return boot + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return time.time()
