"""Measurements: step-time statistics, peak memory, model-state bytes, MFU's peak FLOP/s."""
from __future__ import annotations

import resource
import statistics
import sys
from collections.abc import Iterable

import torch

from trainer.record import RankMemory, RankModelState, StepTimes

# Peak dense bf16 TFLOP/s per device, matched against torch.cuda.get_device_name().
# Ordered most specific first: "A10" is a substring of "A100", "H100" of "H100 PCIe".
PEAK_BF16_TFLOPS: list[tuple[str, float]] = [
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),       # SXM
    ("A100", 312.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("V100", 125.0),       # fp16 tensor cores (no bf16)
]


def peak_flops_for(device_name: str, override_tflops: float | None) -> tuple[float | None, str | None]:
    """(peak FLOP/s of one device, where it came from); (None, None) when unknown (CPUs)."""
    if override_tflops:
        return override_tflops * 1e12, f"--peak-tflops {override_tflops:g}"
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in device_name:
            return tflops * 1e12, f"device table: {key} dense bf16 {tflops:g} TFLOP/s"
    return None, None


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


def rank_memory(rank: int, device: torch.device) -> RankMemory:
    mem = RankMemory(rank=rank, rss_bytes=peak_rss_bytes())
    if device.type == "cuda":
        mem.allocated_bytes = torch.cuda.max_memory_allocated(device)
        mem.reserved_bytes = torch.cuda.max_memory_reserved(device)
    return mem


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
    out = []
    for state in optimizer.state.values():
        out.extend(v for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return out


def model_state(rank: int, params: list[torch.Tensor], grads: list[torch.Tensor | None],
                optimizer_tensors: list[torch.Tensor]) -> RankModelState:
    """Bytes this rank holds: its parameters, its gradients, and its optimizer's tensors
    (Adam moments, and master fp32 copies when a mixed-precision or ZeRO optimizer keeps them)."""
    counter = StorageCounter()
    p = counter.add(params)
    g = counter.add(grads)
    o = counter.add(optimizer_tensors)
    return RankModelState(rank=rank, params_bytes=p, grads_bytes=g, optimizer_bytes=o, total_bytes=p + g + o)
