"""Who am I in the job? Rank, world size and rendezvous address from whichever launcher started
this process: torchrun (RANK/WORLD_SIZE), OpenMPI's mpirun (OMPI_COMM_WORLD_*, which the
DeepSpeed launcher's openmpi runner also sets), MPICH / Intel MPI (PMI_*), or nothing (a single
process). MPI only launches: communication is always torch.distributed (gloo on CPU, NCCL on GPU).
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from shardbench.trainer.ports import free_port


@dataclass
class DistEnv:
    rank: int
    """Global rank."""
    world_size: int
    """Total ranks."""
    local_rank: int
    """Rank on this machine (picks the GPU)."""
    local_world_size: int
    """Ranks on this machine (splits the CPU threads)."""
    launcher: str
    """torchrun, mpirun or none (what started the ranks, as far as the environment tells)."""
    master_addr: str | None
    master_port: int | None


def _first_int(env: dict[str, str], *names: str) -> int | None:
    for name in names:
        if env.get(name, "").strip().isdigit():
            return int(env[name])
    return None


def detect(environ: dict[str, str] | None = None) -> DistEnv:
    """Read the launcher's variables (no MPI call, no network): cheap enough for argument checks."""
    env = dict(os.environ if environ is None else environ)
    port = _first_int(env, "MASTER_PORT")
    addr = env.get("MASTER_ADDR") or None
    if "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "WORLD_SIZE" in env and "LOCAL_RANK" in env):
        return DistEnv(
            rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
            launcher="torchrun", master_addr=addr, master_port=port)
    rank = _first_int(env, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
    size = _first_int(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
    if rank is not None and size is not None:
        local = _first_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK") or 0
        local_size = _first_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE") or size
        return DistEnv(rank, size, local, local_size, "mpirun", addr, port)
    return DistEnv(0, 1, 0, 1, "none", addr, port)


def _my_address() -> str:
    """An address other hosts can reach this one on (the pod IP in Kubernetes)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def resolve_rendezvous(dist: DistEnv) -> DistEnv:
    """Fill in MASTER_ADDR/PORT when the launcher did not. Under MPI, rank 0 shares its address
    and a free port through mpi4py; ranks that all sit on one host use loopback (the host's
    eth0 address may not even be routable in a sandbox). A single process picks a local port."""
    if dist.master_addr and dist.master_port:
        return dist
    if dist.world_size == 1:
        dist.master_addr = dist.master_addr or "127.0.0.1"
        dist.master_port = dist.master_port or free_port()
        return dist
    if dist.launcher != "mpirun":
        raise RuntimeError(f"{dist.launcher} gave no MASTER_ADDR/MASTER_PORT: set them in the environment")
    from mpi4py import MPI  # only MPI-launched multi-rank jobs without MASTER_* need it

    comm = MPI.COMM_WORLD
    hosts = comm.allgather(socket.gethostname())
    one_host = len(set(hosts)) == 1
    info = None
    if comm.Get_rank() == 0:
        info = ("127.0.0.1" if one_host else (dist.master_addr or _my_address()), dist.master_port or free_port())
    dist.master_addr, dist.master_port = comm.bcast(info, root=0)
    return dist
