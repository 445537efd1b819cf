"""This rank's process before the model: its process group and its CPU cores."""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from shardbench.trainer import contract
from shardbench.trainer.config import RunConfig
from shardbench.trainer.dist_env import DistEnv, resolve_rendezvous


def init_process_group(cfg: RunConfig, d: DistEnv, device: torch.device) -> bool:
    """A process group whenever there is more than one rank, and for DeepSpeed always (it needs
    one even alone: a one-rank gloo group on loopback, no launcher required). Returns whether the
    run is distributed (more than one rank)."""
    distributed = d.world_size > 1
    if not (distributed or contract.STRATEGIES[cfg.strategy].group_at_world_size_1):
        return distributed
    resolve_rendezvous(d)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # NCCL times each work with CUDA events: collective seconds per op (trainer/comm.py).
        os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
    # Variables DeepSpeed's own communication layer reads.
    os.environ.update(RANK=str(d.rank), WORLD_SIZE=str(d.world_size), LOCAL_RANK=str(d.local_rank),
                      MASTER_ADDR=str(d.master_addr), MASTER_PORT=str(d.master_port))
    timeout = timedelta(seconds=cfg.pg_timeout_s)
    # Groups made later without a timeout (DeepSpeed's ZeRO data-parallel group is a
    # new_group) take torch's module default, 30 min, not the world's: a hung rank would stall
    # them that long. torch reads these defaults at each new_group call.
    from torch.distributed import distributed_c10d as c10d
    c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = timeout
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://{d.master_addr}:{d.master_port}",
        rank=d.rank, world_size=d.world_size, timeout=timeout)
    return distributed


def pin_cpu(cfg: RunConfig, d: DistEnv, device: torch.device) -> list[int]:
    """Every rank gets --threads-per-rank threads whatever the world size (1 rank = 1 core, like
    1 GPU), on cores of its own when the machine has enough for all local ranks. Returns the
    cores this rank may run on."""
    if device.type == "cpu":
        t = cfg.threads_per_rank
        torch.set_num_threads(t)
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if len(allowed) >= d.local_world_size * t:
            os.sched_setaffinity(0, allowed[d.local_rank * t:(d.local_rank + 1) * t])
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def gather(obj, world_size: int) -> list:
    """`obj` of every rank (just this one's without a group)."""
    if dist.is_initialized() and world_size > 1:
        out = [None] * world_size
        dist.all_gather_object(out, obj)
        return out
    return [obj]


def mean_over_ranks(values: list[float], world_size: int, device: torch.device | None = None) -> list[float]:
    """Element-wise mean of a list every rank holds (float64; on `device` for NCCL)."""
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized() and world_size > 1:
        t = t.to(device) if device is not None else t
        dist.all_reduce(t)
        t = (t / world_size).cpu()
    return [float(v) for v in t]
