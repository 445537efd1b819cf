"""Pre-flight of a cluster run: all-reduce bus bandwidth across every rank, before the benchmark.

Started by mpirun on every rank of the job (the chart's `mode: preflight`), like the trainer:
    mpirun ... python -u preflight.py --sizes-mib 1 16 256 --expected-busbw-gbps 400 --min-fraction 0.5
Each rank joins torch.distributed (NCCL on GPUs, gloo on CPU) from the launcher's environment,
times all-reduces of each size and rank 0 prints one line per size with nccl-tests' definitions:
    algbw = bytes / time,  busbw = algbw x 2 (n - 1) / n   (n ranks; time: the slowest rank's mean)
Exit 1 with one line saying why when the largest message's busbw is below min-fraction x the
expected link bandwidth (checked only across nodes: inside one node NVLink, not the fabric, is
the bottleneck); exit 0 otherwise. torch and the standard library only: it runs in the image.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def rank_env() -> tuple[int, int, int, int]:
    """rank, world size, local rank, ranks on this node: from mpirun (OpenMPI) or torchrun."""
    env = os.environ
    if "OMPI_COMM_WORLD_RANK" in env:
        return (int(env["OMPI_COMM_WORLD_RANK"]), int(env["OMPI_COMM_WORLD_SIZE"]),
                int(env["OMPI_COMM_WORLD_LOCAL_RANK"]), int(env["OMPI_COMM_WORLD_LOCAL_SIZE"]))
    return (int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)),
            int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", 1))))


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for one all-reduce of nbytes taking seconds (nccl-tests)."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (world - 1) / world


def time_all_reduce(tensor: torch.Tensor, iters: int, warmup: int, device: torch.device) -> float:
    """The slowest rank's mean seconds per all-reduce."""
    for _ in range(warmup):
        dist.all_reduce(tensor)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    mean = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)  # gloo and NCCL both take a CPU/GPU float64
    return float(mean.item())


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="all-reduce bus bandwidth across every rank")
    p.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 16, 256])
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup-iters", type=int, default=5)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--expected-busbw-gbps", type=float, default=None,
                   help="the shape's link bandwidth, GB/s; none: report only")
    p.add_argument("--min-fraction", type=float, default=0.5)
    return p.parse_args(argv)


def verdict(busbw: float, expected: float | None, min_fraction: float, nodes: int) -> str | None:
    """Why the fabric fails the pre-flight, or None when it passes."""
    if expected is None or nodes < 2:
        return None
    if busbw < min_fraction * expected:
        return (f"preflight: FAIL: busbw {busbw:.2f} GB/s across {nodes} nodes is below {min_fraction:g} x the "
                f"expected {expected:g} GB/s ({min_fraction * expected:.2f} GB/s): check the RDMA setup "
                "(rdma.mode, NCCL_IB_HCA, NCCL_SOCKET_IFNAME; NCCL_DEBUG=INFO shows the transport)")
    return None


def main(argv: list[str]) -> int:
    args = parse(argv)
    rank, world, local_rank, local_size = rank_env()
    device = torch.device("cuda", local_rank % torch.cuda.device_count()) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://",
                            rank=rank, world_size=world)
    nodes = max(1, world // local_size)
    if rank == 0:
        print(f"preflight: all-reduce over {world} ranks on {nodes} node(s), {dist.get_backend()}, "
              f"{args.iters} iterations after {args.warmup_iters} warm-up", flush=True)
        print(f"{'size_bytes':>14} {'time_us':>12} {'algbw_GBps':>11} {'busbw_GBps':>11}", flush=True)
    busbw = 0.0
    for mib in args.sizes_mib:
        numel = max(1, int(mib * 2**20) // 4)
        tensor = torch.ones(numel, dtype=torch.float32, device=device)
        seconds = time_all_reduce(tensor, args.iters, args.warmup_iters, device)
        algbw, busbw = bus_bandwidth(numel * 4, seconds, world)
        if rank == 0:
            print(f"{numel * 4:>14} {seconds * 1e6:>12.1f} {algbw:>11.3f} {busbw:>11.3f}", flush=True)
    dist.destroy_process_group()
    if rank != 0:
        return 0
    problem = verdict(busbw, args.expected_busbw_gbps, args.min_fraction, nodes)
    if problem:
        print(problem, file=sys.stderr, flush=True)
        return 1
    expected = "" if args.expected_busbw_gbps is None or nodes < 2 else f" (expected {args.expected_busbw_gbps:g} GB/s)"
    print(f"preflight: ok: busbw {busbw:.2f} GB/s at the largest size{expected}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
