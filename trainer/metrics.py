"""Measurements: step-time statistics, peak memory, model-state bytes, MFU's peak FLOP/s."""
from __future__ import annotations

import os
import re
import resource
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from shardbench.trainer.record import RankMemory, RankModelState, StepTimes

# Peak dense (no sparsity) TFLOP/s per device and dtype, matched against
# torch.cuda.get_device_name() as whole words, most specific first ("H100 NVL" before "H100";
# "L4" never matches "L40", "A10" never "A100", "H200" never "GH200"). tf32 is used for fp32 runs
# when TF32 matmuls are on, fp32 (CUDA cores) when they are off (torch's default).
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H100 NVL", {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    ("H100", {"bf16": 989.0, "fp16": 989.0, "tf32": 495.0, "fp32": 67.0}),  # SXM
    ("H200 NVL", {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0}),
    ("H200", {"bf16": 989.0, "fp16": 989.0, "tf32": 495.0, "fp32": 67.0}),
    ("GH200", {"bf16": 989.0, "fp16": 989.0, "tf32": 495.0, "fp32": 67.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("A10G", {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    ("L40S", {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6}),
    ("L40", {"bf16": 181.0, "fp16": 181.0, "tf32": 90.5, "fp32": 90.5}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),  # no bf16, no tf32
]


@dataclass
class Peak:
    flops: float | None
    """Peak FLOP/s of one device used for MFU, None when unknown (CPUs)."""
    source: str | None
    given: float | None = None
    """--peak-tflops (the shape's), FLOP/s."""
    warning: str | None = None


def device_peak(device_name: str, dtype: str) -> tuple[str, float] | None:
    """(table key, TFLOP/s) of the detected device for a dtype (bf16, fp16, tf32, fp32)."""
    for key, peaks in PEAK_TFLOPS:
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", device_name):
            return (key, peaks[dtype]) if dtype in peaks else None
    return None


def peak_flops_for(device_name: str, precision: str, given_tflops: float | None,
                   tf32: bool = False) -> Peak:
    """The peak MFU divides by. A device found in the table wins (for the run's precision:
    fp32 runs use the fp32 or tf32 peak, never bf16's); --peak-tflops is used only for a device
    the table does not know, and is recorded with a warning when it disagrees with the table."""
    dtype = ("tf32" if tf32 else "fp32") if precision == "fp32" else precision
    given = given_tflops * 1e12 if given_tflops else None
    found = device_peak(device_name, dtype) if device_name else None
    if found is None:
        if given is None:
            return Peak(None, None)
        return Peak(given, f"--peak-tflops {given_tflops:g} (device not in the table)", given)
    key, tflops = found
    peak = Peak(tflops * 1e12, f"device table: {key} dense {dtype} {tflops:g} TFLOP/s", given)
    if given is not None and abs(given - peak.flops) > 0.01 * peak.flops:  # type: ignore[operator]
        peak.warning = (f"--peak-tflops {given_tflops:g} (the shape's) disagrees with the detected "
                        f"{device_name}'s dense {dtype} peak {tflops:g} TFLOP/s: MFU uses the device's")
    return peak


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile of already sorted values, q in [0, 100]."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def step_time_stats(times: list[float]) -> StepTimes:
    if not times:
        return StepTimes()
    ordered = sorted(times)
    return StepTimes(mean=statistics.fmean(times), p50=percentile(ordered, 50),
                     p90=percentile(ordered, 90), all=list(times))


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def end_setup_memory(device: torch.device) -> int | None:
    """GPU: the set-up peak (whole model before sharding included), then reset the peak
    statistics so that the training peak is training's alone."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    return peak


def rank_memory(rank: int, device: torch.device, setup_peak: int | None) -> RankMemory:
    mem = RankMemory(rank=rank, rss_peak_bytes=peak_rss_bytes())
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        mem.setup_peak_bytes = setup_peak
        mem.train_peak_bytes = torch.cuda.max_memory_allocated(device)
        mem.train_reserved_peak_bytes = torch.cuda.max_memory_reserved(device)
        mem.num_alloc_retries = int(stats.get("num_alloc_retries", 0))
        mem.num_ooms = int(stats.get("num_ooms", 0))
    return mem


def load_avg_1m() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _local(t: torch.Tensor) -> torch.Tensor:
    """The part of a tensor this rank holds: a DTensor's local shard, else the tensor."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


class StorageCounter:
    """Sums the bytes of memory regions, each byte once: a tensor reached twice (a parameter
    that is also an optimizer's parameter), views into one flat buffer (DDP buckets, DeepSpeed's
    flattened groups) and a buffer together with its views all count for the memory they cover,
    never more. A region counted by an earlier add() is not counted again by a later one."""

    def __init__(self) -> None:
        self.covered: list[tuple[int, int]] = []  # disjoint [start, end) address ranges

    def _uncovered(self, start: int, end: int) -> int:
        missing = end - start
        for lo, hi in self.covered:
            missing -= max(0, min(end, hi) - max(start, lo))
        return missing

    def _cover(self, start: int, end: int) -> None:
        merged = [(start, end)]
        for lo, hi in self.covered:
            if hi < merged[0][0] or lo > merged[0][1]:
                merged.append((lo, hi))
            else:
                merged[0] = (min(lo, merged[0][0]), max(hi, merged[0][1]))
        self.covered = merged

    def add(self, tensors: Iterable[torch.Tensor | None]) -> int:
        total = 0
        for t in tensors:
            if t is None or not isinstance(t, torch.Tensor):
                continue
            t = _local(t)
            if t.numel() == 0:
                continue
            start = t.data_ptr()
            end = start + t.nbytes
            total += self._uncovered(start, end)
            self._cover(start, end)
        return total


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for state in optimizer.state.values():
        out.extend(v for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return out


def model_state(rank: int, params: Iterable, grads: Iterable = (), master: Iterable = (),
                optimizer: Iterable = (), comm_buffers: Iterable = (), on_host: Iterable[str] = (),
                device: torch.device | None = None) -> RankModelState:
    """Bytes this rank holds, by kind, each byte once (counted in the order params, grads,
    master, optimizer, comm buffers: a region already counted is not counted again), and by
    where they live. On a GPU that is each tensor's device (host memory: a CPU tensor). On a CPU
    run host and device memory are one, so the layout's declared location (`on_host`: its kinds
    of state, contract.STATE; the fp32 master travels with the optimizer) says which bytes a GPU
    run would keep on the host."""
    counter, host_kinds = StorageCounter(), set(on_host)
    on_gpu = device is not None and device.type == "cuda"
    sizes, host = {}, 0
    for name, kind, tensors in (("params", "params", params), ("grads", "grads", grads),
                                ("master", "optimizer", master), ("optimizer", "optimizer", optimizer),
                                ("comm", None, comm_buffers)):
        tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
        if on_gpu:
            elsewhere = counter.add(t for t in tensors if _local(t).device.type == "cpu")
            sizes[name] = elsewhere + counter.add(tensors)
        else:
            sizes[name] = elsewhere = counter.add(tensors)
            elsewhere = elsewhere if kind in host_kinds else 0
        host += elsewhere
    p, g, m, o, c = sizes["params"], sizes["grads"], sizes["master"], sizes["optimizer"], sizes["comm"]
    total = p + g + m + o + c
    return RankModelState(rank=rank, params_bytes=p, grads_bytes=g, optimizer_bytes=o, master_bytes=m,
                          comm_buffer_bytes=c, total_bytes=total, device_bytes=total - host, host_bytes=host)


def with_comm_buffer_bytes(state: RankModelState, comm: int) -> RankModelState:
    """`state` with its communication buffers counted as `comm` bytes (buffers that existed during
    the sampled phase but were freed before the sample: ZeRO-1/2's reduce buckets)."""
    state.total_bytes += comm - state.comm_buffer_bytes
    state.device_bytes += comm - state.comm_buffer_bytes  # buffers are the device's
    state.comm_buffer_bytes = comm
    return state


def peak_model_state(samples: list[tuple[str, RankModelState]]) -> RankModelState | None:
    """The sample with the largest total, labelled with where it was taken."""
    if not samples:
        return None
    where, best = max(samples, key=lambda s: s[1].total_bytes)
    best.peak_at = where
    return best

