"""gloo's collectives between two processes of this machine, pinned as the trainer pins its ranks
(trainer/process.py pin_cpu: one core and one thread each): seconds per call of all-reduce,
all-gather and reduce-scatter per size, with nccl-tests' busbw (the bandwidth the planner's
ring factors take: time = alpha x log2 N + bytes x factor / busbw), and alpha and busbw fitted
per op by least squares. The all-reduce table is printed in the pre-flight's format, so the
output is a pre-flight log: `shardbench plan --preflight-log` reads its link from it.

    PYTHONPATH=$PWD nice .venv/bin/python benchmarks/gloo_links.py > /tmp/gloo.log
"""
from __future__ import annotations

import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
SIZES = [2 ** k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB (the buffers a tiny run's step moves)
FACTOR = {"all_reduce": 2 * (WORLD - 1) / WORLD, "all_gather": (WORLD - 1) / WORLD, "reduce_scatter": (WORLD - 1) / WORLD}


def _call(op: str, full: torch.Tensor, part: torch.Tensor) -> None:
    if op == "all_reduce":
        dist.all_reduce(full)
    elif op == "all_gather":
        dist.all_gather_into_tensor(full, part)
    else:
        dist.reduce_scatter_tensor(part, full)


def _seconds(op: str, nbytes: int) -> float:
    """The slowest rank's median seconds per call (nbytes: the full buffer, trainer/comm.py's unit).
    The call count depends on the size only: both ranks must issue the same collectives."""
    full = torch.ones(nbytes // 4)
    part = torch.ones(nbytes // 4 // WORLD)
    for _ in range(3):
        _call(op, full, part)
    times: list[float] = []
    for _ in range(max(7, min(100, (64 << 20) // nbytes))):
        dist.barrier()
        t = time.perf_counter()
        _call(op, full, part)
        times.append(time.perf_counter() - t)
    med = torch.tensor([sorted(times)[len(times) // 2]], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return float(med.item())


def fit(points: list[tuple[int, float]], factor: float) -> tuple[float, float]:
    """(alpha seconds, busbw bytes/s) of t = alpha + bytes x factor / busbw, least squares."""
    xs = [b * factor for b, _ in points]
    ys = [t for _, t in points]
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return max(0.0, my - slope * mx), 1 / slope


def worker(rank: int, port: int) -> None:
    os.sched_setaffinity(0, [sorted(os.sched_getaffinity(0))[rank % len(os.sched_getaffinity(0))]])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    results = {op: [(n, _seconds(op, n)) for n in SIZES] for op in FACTOR}
    if rank == 0:
        load = os.getloadavg()[0]
        print(f"preflight: all-reduce over {WORLD} ranks on 1 node(s), gloo, one core and thread per rank "
              f"(benchmarks/gloo_links.py); load {load:.1f}")
        print(f"{'size_bytes':>14} {'time_us':>12} {'algbw_GBps':>11} {'busbw_GBps':>11}")
        for n, t in results["all_reduce"]:
            print(f"{n:>14} {t * 1e6:>12.1f} {n / t / 1e9:>11.3f} {n / t / 1e9 * FACTOR['all_reduce']:>11.3f}")
        for op, points in results.items():
            alpha, bw = fit(points, FACTOR[op])
            row = " ".join(f"{n >> 10}K:{t * 1e6:.0f}us" for n, t in points)
            print(f"# {op}: fitted alpha {alpha * 1e6:.0f} us, busbw {bw / 1e9:.3f} GB/s; {row}")
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(worker, args=(free,), nprocs=WORLD)
    sys.exit(0)
