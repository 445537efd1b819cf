"""State in host memory (--offload: ZeRO-Offload, ZeRO-3 parameter offload, FSDP2's
CPUOffloadPolicy) in a plan, torch-free: which predicted bytes live on the host, and what crosses
the host link (PCIe) each step, read from the layout's attributes (contract.StateLayout.on_host).

Transfers per optimizer step, one rank (P parameters, partition p = P / N, w bytes per weight):
- DeepSpeed, optimizer on the host: each micro-step's gradient partition to the host (w p), the
  updated parameter partition back after the step (w p); with the parameters on the host too
  (ZeRO-3), each block's partition comes to the device for every gather instead (forward, and
  backward again when re-sharded after forward) and nothing goes back.
- FSDP2: each micro-step's sharded parameters to the device for every all-gather (forward, and
  backward again when re-sharded) and the reduce-scattered gradients to the host (4 p each, fp32).
Exposed: not overlapped with compute (DeepSpeed overlaps some of it on a GPU: an upper bound).
On a CPU run host and device memory are one and nothing crosses a link.
"""
from __future__ import annotations

import math

from shardbench.trainer.plan.inputs import Params, PlanInput

KIND_CATEGORIES = {"params": ("params",), "grads": ("grads",), "optimizer": ("optimizer", "master")}
"""The planner's memory categories of each kind of state (contract.STATE)."""
DEFAULT_HOST_LINK_GBPS = 25.0
"""Host link one way per GPU when the shape gives none (`links.hostLinkGBps`): PCIe Gen4 x16."""


def host_bytes(inp: PlanInput, categories: dict[str, int]) -> int:
    """Of the predicted categories, the bytes the layout keeps in host memory."""
    return sum(categories.get(c, 0) for kind in inp.layout.on_host for c in KIND_CATEGORIES[kind])


def transfer_bytes(inp: PlanInput) -> int:
    """Bytes crossing the host link per optimizer step, one rank (module docstring)."""
    lay = inp.layout
    if not lay.on_host or inp.world_size < 1:
        return 0
    P = Params.of(inp.model_config()).total
    part = math.ceil(P / inp.world_size)
    gathers = 2 if inp.reshard_after_forward else 1
    if lay.engine != "deepspeed":  # FSDP2 CPUOffloadPolicy: fp32 shards
        return inp.grad_accum * (gathers + 1) * 4 * part
    w = 2 if inp.precision in ("bf16", "fp16") else 4
    if "params" in lay.on_host:
        return inp.grad_accum * (gathers * w * part + w * part)
    return inp.grad_accum * w * part + w * part


def seconds(inp: PlanInput, links: dict) -> tuple[float, str]:
    """(exposed seconds of the offload transfers per step, how they were counted)."""
    nbytes = transfer_bytes(inp)
    if not nbytes:
        return 0.0, "no state in host memory"
    if inp.device == "cpu":
        return 0.0, f"{nbytes / 2**20:.1f} MiB per step stay in one memory (a CPU run: host and device are one)"
    gbps = float(links.get("host_link_GBps") or DEFAULT_HOST_LINK_GBPS)
    return nbytes / (gbps * 1e9), (f"{nbytes / 2**20:.1f} MiB per step over the host link at {gbps:g} GB/s, "
                                   "exposed (not overlapped)")
