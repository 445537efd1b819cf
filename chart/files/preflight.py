"""Pre-flight of a cluster run: all-reduce bus bandwidth across every rank, before the benchmark.

Started by mpirun on every rank of the job (the chart's `mode: preflight`), like the trainer:
    mpirun ... python -u preflight.py --sizes-mib 1 16 256 --expected-busbw-gbps 400 --min-fraction 0.5
Each rank joins torch.distributed (NCCL on GPUs, gloo on CPU) from the launcher's environment,
times all-reduces of each size and rank 0 prints one line per size with nccl-tests' definitions:
    algbw = bytes / time,  busbw = algbw x 2 (n - 1) / n   (n ranks; time: the slowest rank's mean)
Sizes: --sizes-mib, or (the chart's default) a doubling sweep from --min-size-mib until busbw
plateaus (two doublings in a row gain less than --plateau-gain) or --max-size-mib, capped by the
memory free on the device. Exit 1 with one line saying why when the best busbw is below
min-fraction x the expected link bandwidth (checked only across nodes: inside one node NVLink,
not the fabric, is the bottleneck); exit 0 otherwise.

An RDMA mode (--rdma-mode) adds two checks on every rank: memory can be locked (RLIMIT_MEMLOCK
unlimited or CAP_IPC_LOCK effective; else NCCL's ibv_reg_mr fails), checked before NCCL starts,
and the network NCCL chose (its "Using network X" line, read from a per-rank NCCL_DEBUG_FILE) is
not its Socket fallback. Rank 0 also reports whether GPUDirect RDMA is in use (NCCL's GDRDMA). torch and the standard library only: it runs in the image.
"""
from __future__ import annotations

import argparse
import glob
import os
import resource
import socket
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
    # On the run's device: NCCL serves CUDA tensors only (torch's Backend.backend_capability
    # ["nccl"] == ["cuda"]); a CPU tensor there raises "No backend type associated with device type cpu".
    mean = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)
    return float(mean.item())


CAP_IPC_LOCK = 14
RDMA_MODES = ("none", "shared-device", "host-network", "sriov")


def memlock_problem(soft_limit: int, cap_eff: int, mode: str) -> str | None:
    """Why this rank cannot register RDMA memory, or None (no RDMA mode, unlimited, or IPC_LOCK)."""
    if mode == "none" or soft_limit == resource.RLIM_INFINITY or cap_eff >> CAP_IPC_LOCK & 1:
        return None
    return (f"memlock limit {soft_limit // 1024} KiB and no CAP_IPC_LOCK: NCCL's RDMA memory registration "
            f"(ibv_reg_mr) will fail under rdma.mode {mode}: run the pods as root with IPC_LOCK "
            "(rdma.runAsRoot: true, the chart's default for RDMA modes) or raise the container runtime's "
            "memlock limit to unlimited (containerd/CRI-O: LimitMEMLOCK=infinity)")


def effective_caps() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def nccl_network(log_text: str) -> str | None:
    """The network NCCL chose ("IB", "Socket", a plugin's name) from its INFO log, or None."""
    marker = "NCCL INFO Using network "
    found = [line.split(marker, 1)[1].strip() for line in log_text.splitlines() if marker in line]
    return found[-1] if found else None


def gpudirect_rdma(log_text: str) -> bool | None:
    """Whether NCCL moves data between GPU memory and the NIC directly (GPUDirect RDMA), from its
    INFO log: its connection lines end "via NET/<net>/<dev>/GDRDMA" when it does (transport/net.cc);
    else its "GPU Direct RDMA Enabled/Disabled for HCA" lines (net_ib.cc); None when it says
    neither (one node: no network connection)."""
    via = [line for line in log_text.splitlines() if " via NET/" in line]
    if via:
        return any("/GDRDMA" in line for line in via)
    if "GPU Direct RDMA Enabled" in log_text:
        return True
    if "GPU Direct RDMA Disabled" in log_text:
        return False
    return None


def gdr_line(gdr: bool | None, mode: str) -> str:
    """Rank 0's report of GPUDirect RDMA; without it under an RDMA mode every transfer is staged
    through host memory (nvidia-peermem or dma-buf missing), a bandwidth loss but no failure."""
    if gdr is None:
        return "preflight: GPUDirect RDMA: unknown (no network connection in NCCL's log)"
    if gdr:
        return "preflight: GPUDirect RDMA: in use"
    hint = (": NCCL stages every transfer through host memory; check nvidia-peermem (or dma-buf: "
            "NCCL_DMABUF_ENABLE) on the nodes") if mode != "none" else ""
    return f"preflight: GPUDirect RDMA: not in use{hint}"


def transport_problem(network: str | None, mode: str) -> str | None:
    """Why the transport is wrong for the fabric, or None. Socket under an RDMA mode is NCCL's
    silent fallback (wrong HCA names, no RDMA devices in the pod, NCCL_IB_DISABLE)."""
    if mode == "none" or network is None or network != "Socket":
        return None
    return (f"NCCL chose its Socket transport although rdma.mode is {mode}: check NCCL_IB_HCA "
            "(rdma.hca for the mode), the RDMA devices in the pod (/dev/infiniband, rdma.resourceName) and "
            "NCCL_IB_DISABLE; NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET shows why")


def capture_nccl_log() -> str | None:
    """Have NCCL write its INIT/NET info to a per-rank file (stdout stays readable); the path
    pattern, or None when the user chose NCCL_DEBUG_FILE."""
    if os.environ.get("NCCL_DEBUG_FILE"):
        return None
    pattern = f"/tmp/shardbench-preflight-nccl.{os.getpid()}.log"
    os.environ.update(NCCL_DEBUG_FILE=pattern, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET")
    return pattern


def sweep_sizes(args: argparse.Namespace, memory_cap_bytes: int | None) -> list[float]:
    """MiB sizes to try, in order: the explicit list, else doublings min..max under the memory cap."""
    if args.sizes_mib:
        return list(args.sizes_mib)
    top = args.max_size_mib
    if memory_cap_bytes is not None:
        top = min(top, max(args.min_size_mib, memory_cap_bytes / 2**20))
    sizes, size = [], args.min_size_mib
    while size <= top:
        sizes.append(size)
        size *= 2
    return sizes


def plateaued(busbws: list[float], gain: float) -> bool:
    """Two doublings in a row gained less than `gain` (a fraction): larger sizes add nothing."""
    if len(busbws) < 3:
        return False
    a, b, c = busbws[-3:]
    return b < a * (1 + gain) and c < b * (1 + gain)


def memory_cap(device: torch.device, local_size: int) -> int | None:
    """Bytes one all-reduce tensor may take: a third of what is free (NCCL and the allocator need
    the rest), shared by the node's ranks on CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] // 3
    try:
        with open("/proc/meminfo") as fh:
            avail = next(int(l.split()[1]) * 1024 for l in fh if l.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None
    return avail // (3 * max(1, local_size))


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="all-reduce bus bandwidth across every rank")
    p.add_argument("--sizes-mib", type=float, nargs="+", default=None,
                   help="exactly these sizes; none: the doubling sweep to the plateau")
    p.add_argument("--min-size-mib", type=float, default=1)
    p.add_argument("--max-size-mib", type=float, default=256)
    p.add_argument("--plateau-gain", type=float, default=0.05,
                   help="stop once two doublings in a row gain less than this fraction of busbw")
    p.add_argument("--rdma-mode", choices=RDMA_MODES, default="none")
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
    where = f"rank {rank} on {socket.gethostname()}"
    problem = memlock_problem(resource.getrlimit(resource.RLIMIT_MEMLOCK)[0], effective_caps(), args.rdma_mode)
    if problem:  # every rank checks itself, before NCCL could fail obscurely
        print(f"preflight: FAIL: {where}: {problem}", file=sys.stderr, flush=True)
        return 1
    device = torch.device("cuda", local_rank % torch.cuda.device_count()) if args.device == "cuda" else torch.device("cpu")
    nccl_log = capture_nccl_log() if device.type == "cuda" else None
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://",
                            rank=rank, world_size=world)
    nodes = max(1, world // local_size)
    sizes = sweep_sizes(args, memory_cap(device, local_size))
    if rank == 0:
        what = " ".join(f"{s:g}" for s in args.sizes_mib) if args.sizes_mib else (
            f"doubling {sizes[0]:g}..{sizes[-1]:g} until busbw gains < {args.plateau_gain:g} twice")
        print(f"preflight: all-reduce over {world} ranks on {nodes} node(s), {dist.get_backend()}, "
              f"{args.iters} iterations after {args.warmup_iters} warm-up; sizes MiB: {what}", flush=True)
        print(f"{'size_bytes':>14} {'time_us':>12} {'algbw_GBps':>11} {'busbw_GBps':>11}", flush=True)
    busbws: list[float] = []
    for mib in sizes:
        numel = max(1, int(mib * 2**20) // 4)
        tensor = torch.ones(numel, dtype=torch.float32, device=device)
        seconds = time_all_reduce(tensor, args.iters, args.warmup_iters, device)
        algbw, busbw = bus_bandwidth(numel * 4, seconds, world)
        busbws.append(busbw)
        del tensor
        if rank == 0:
            print(f"{numel * 4:>14} {seconds * 1e6:>12.1f} {algbw:>11.3f} {busbw:>11.3f}", flush=True)
        if not args.sizes_mib and plateaued(busbws, args.plateau_gain):
            if rank == 0:
                print(f"preflight: busbw plateaued at {mib:g} MiB", flush=True)
            break
    dist.destroy_process_group()
    nccl_text = read_nccl_log(nccl_log) if device.type == "cuda" else None
    if device.type != "cuda":
        network = "gloo (TCP)"
    else:
        network = nccl_network(nccl_text) if nccl_text is not None else None
    problem = transport_problem(network, args.rdma_mode)
    if problem:  # every rank: one rank's fallback slows the whole ring
        print(f"preflight: FAIL: {where}: {problem}", file=sys.stderr, flush=True)
        return 1
    if rank != 0:
        return 0
    best = max(busbws)
    print(f"preflight: transport: {network or 'unknown (NCCL_DEBUG_FILE set by the user)'}", flush=True)
    if nccl_text is not None:
        print(gdr_line(gpudirect_rdma(nccl_text), args.rdma_mode), flush=True)
    problem = verdict(best, args.expected_busbw_gbps, args.min_fraction, nodes)
    if problem:
        print(problem, file=sys.stderr, flush=True)
        return 1
    expected = "" if args.expected_busbw_gbps is None or nodes < 2 else f" (expected {args.expected_busbw_gbps:g} GB/s)"
    print(f"preflight: ok: busbw {best:.2f} GB/s at best{expected}", flush=True)
    return 0


def read_nccl_log(pattern: str | None) -> str | None:
    """This rank's NCCL debug file (NCCL expands %h/%p; ours has neither); None when the user
    chose NCCL_DEBUG_FILE."""
    if pattern is None:
        return None
    return "".join(open(path, errors="replace").read() for path in glob.glob(pattern))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
