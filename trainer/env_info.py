"""Facts about the software and the process, for the record."""
from __future__ import annotations

import ctypes
import os
import platform
import re
import time
from importlib import metadata

import torch


def _version(dist_name: str) -> str | None:
    try:
        return metadata.version(dist_name)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """What ran: cuda is the CUDA runtime torch was built with (its wheels bring it), driver and
    driver_cuda the node's NVIDIA driver and the newest CUDA that driver supports."""
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
        **cuda_driver(),
        "nccl": nccl,
        "shardbench": _version("shardbench"),
        "image": os.environ.get("SHARDBENCH_IMAGE"),
    }


def cuda_driver(proc_version: str = "/proc/driver/nvidia/version",
                libcuda: str = "libcuda.so.1") -> dict[str, str | None]:
    """The NVIDIA kernel driver's version and the newest CUDA its libcuda supports; None for
    whatever is not here (no GPU node, or a container without the NVIDIA runtime)."""
    return {"driver": _driver_version(proc_version), "driver_cuda": _driver_cuda(libcuda)}


def _driver_version(path: str) -> str | None:
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  ..." (or "Open Kernel Module for x86_64").
    try:
        with open(path) as fh:
            match = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", fh.read())
    except OSError:
        return None
    return match.group(1) if match else None


def _driver_cuda(libcuda: str) -> str | None:
    # cuDriverGetVersion needs no cuInit and no GPU: 12080 means CUDA 12.8.
    try:
        lib = ctypes.CDLL(libcuda)
        value = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(value)) != 0 or value.value <= 0:
            return None
    except (OSError, AttributeError):
        return None
    return f"{value.value // 1000}.{value.value % 1000 // 10}"


def nccl_env() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")}


def nccl_env_across_ranks(gather) -> tuple[dict[str, str], list[str]]:
    """Every rank's NCCL_* variables, gathered with `gather` (every rank calls it): rank 0's, and
    one line per variable the ranks disagree on (a setting that reached only some ranks would
    make runs incomparable without anyone noticing)."""
    per_rank = gather(nccl_env())
    disagreements = []
    for name in sorted({k for env in per_rank for k in env}):
        values = [env.get(name) for env in per_rank]
        if len(set(values)) > 1:
            seen = ", ".join(f"rank {r}: {'unset' if v is None else repr(v)}" for r, v in enumerate(values))
            disagreements.append(f"{name} differs between ranks ({seen})")
    return per_rank[0], disagreements


def process_start_time() -> float:
    """When this process started (epoch seconds): from /proc on Linux, else now. Counted back
    from now by /proc/uptime (10 ms), not from /proc/stat's btime, a whole second that put the
    start up to a second early: the start stamps (suite/execute/startup.py) compare it across processes."""
    try:
        with open("/proc/self/stat") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()
