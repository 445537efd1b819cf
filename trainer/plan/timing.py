"""Step time = compute + exposed communication.

Compute: training FLOPs of one rank's tokens (6N + 12LdT per token, trainer/model.py; with
activation checkpointing + each block's forward again) at the FLOP/s one rank achieves,
calibrated from a measured run of the same configuration (achieved FLOP/s of a world-size-1
run, its recompute included), else the device's peak times the shape's assumed MFU
(ASSUMED_MFU: torchtitan's measured figures, stated in every plan). On CPU, ranks of one
machine share its memory bandwidth, caches and whatever else runs there, which a world-size-1
calibration does not see: compute at world size > 1 is slowed by the shape's
`links.cpuSharedSlowdown` (values/cpu.yaml: measured by benchmarks/steptime_breakdown.py, two
one-rank runs at once on their own cores against one alone; 1 where not given, e.g. GPUs).
Communication: alpha-beta per collective, ring algorithm: an all-reduce moves 2(N-1)/N of its
buffer over each rank's link, an all-gather or reduce-scatter (N-1)/N of the full buffer; each
call costs alpha x log2(N) of latency (tree-like start-up; on CPU alpha also holds the Python
and gloo dispatch of a call and the wait for the other rank to be scheduled). The link is the
intra-node one (NVLink; gloo over loopback on CPU) while the ranks fit one node, else the
inter-node bandwidth per GPU; an op with a busbw of its own (`links.opBusbwGBps`: gloo's
all-gather and reduce-scatter reach a fraction of its all-reduce's) uses that instead. Link
figures: values/<shape>.yaml, or measured (busbw and alpha of a pre-flight log: `shardbench plan
--preflight-log`; benchmarks/gloo_links.py on CPU).
Overlap (stated per layout by overlap()): the part of communication that can hide behind
backward (2/3 of compute) does, the rest is exposed; on CPU nothing overlaps (gloo's
collectives run on the cores that compute).
"""
from __future__ import annotations

import math

from shardbench.trainer.plan import offload
from shardbench.trainer.plan.inputs import PlanInput
from shardbench.trainer.presets import ModelConfig

DEFAULT_EFFICIENCY = 0.4
"""Assumed fraction of the peak reached by compute for a shape with no measured figure below."""

ASSUMED_MFU = {
    # shape: (fraction of the bf16 dense peak compute reaches, where the figure comes from)
    "h100": (0.33, "torchtitan docs/performance.md: Llama 3.1 8B, FSDP, 8 and 128 H100 (500 W), bf16: "
                   "33% (torch.compile) to 39% MFU; the low end"),
    "h200": (0.33, "as h100 (the same compute die; no torchtitan figure for H200)"),
    "a100": (0.56, "torchtitan docs/performance.md: Llama 3 8B, FSDP2, 64 A100 80GB, local batch 1: "
                   "56.3-58.2% MFU"),
}
"""Per shape (values/<shape>.yaml `shape.name`), measured by others on models larger than the
presets here (a small model reaches less); `--calibrate` replaces it with a run's own rate.
A shape not listed gets DEFAULT_EFFICIENCY, said as an assumption in the plan."""


def assumed_mfu(shape: str | None) -> tuple[float, str]:
    mfu, source = ASSUMED_MFU.get(shape or "", (DEFAULT_EFFICIENCY, "no measured figure for this shape: assumed"))
    return mfu, source


def recompute_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Activation checkpointing (every block) runs each block's forward again in backward:
    2 FLOPs per block parameter + the attention scores' 4LdT per token, on top of 6N + 12LdT."""
    per_block = (cfg.flops_params() - cfg.vocab_size * cfg.n_embd - 2 * cfg.n_embd) / max(1, cfg.n_layer)
    return 2.0 * cfg.n_layer * per_block + 4.0 * cfg.n_layer * cfg.n_embd * seq_len


def achieved_flops(record: dict) -> float:
    """FLOP/s one rank of a measured run computed, recompute included (its record's
    flops_per_token counts the model's FLOPs only, as MFU does)."""
    from shardbench.trainer.plan.inputs import PlanInput

    flops = float(record["flops_per_token"])
    if record.get("activation_checkpointing"):
        inp = PlanInput.from_record(record)
        flops += recompute_flops_per_token(inp.model_config(), inp.effective_seq_len())
    return float(record["tokens_per_s"]) * flops / max(1, int(record.get("world_size") or 1))



def overlap(inp: PlanInput) -> tuple[set[str], str]:
    """(ops that overlap with backward, why), by layout: parameters sharded, their gathers are
    prefetched and reduce-scatters overlap backward; replicated, the reductions overlap backward
    (DeepSpeed's overlap_comm; its parameter all-gather after the step is exposed)."""
    from shardbench.trainer.plan.planned_layout import deepspeed, sharded

    lay = inp.layout
    if sharded(lay, "params"):
        return {"all_gather", "reduce_scatter"}, (
            "prefetched gathers and overlapped reduce-scatters" if deepspeed(lay) else
            "all-gathers prefetched, reduce-scatters overlap backward")
    if deepspeed(lay):
        return {"all_reduce"}, ("overlap_comm: reductions overlap backward; the parameter all-gather after "
                                "the step is exposed")
    return {"all_reduce"}, "gradient all-reduce overlaps backward bucket by bucket"


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    return 6.0 * cfg.flops_params() + 12.0 * cfg.n_layer * cfg.n_embd * seq_len


def collective_seconds(op: str, calls: float, nbytes: float, world: int, bw_bytes_s: float, alpha_s: float) -> float:
    if world <= 1 or not calls:
        return 0.0
    factor = 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world
    return calls * alpha_s * max(1.0, math.log2(world)) + nbytes * factor / bw_bytes_s


def link(links: dict, world: int) -> tuple[float, float, str]:
    """(bytes/s per rank, alpha seconds, which link) for `world` ranks."""
    per_node = int(links.get("gpus_per_node") or 1) or 1
    if world <= per_node:
        bw = float(links.get("intra_node_GBps") or 100) * 1e9
        return bw, alpha_seconds(links), "intra-node"
    bw = float(links.get("inter_node_GBps") or 25) * 1e9 / per_node
    return bw, alpha_seconds(links) * 2, "inter-node (per GPU share)"


def alpha_seconds(links: dict) -> float:
    """The latency per collective call: a measured 0 (a pre-flight whose smallest message took no
    longer than its bandwidth term) is a measurement and stays 0; only an absent one is assumed 10 us."""
    alpha_us = links.get("alpha_us")
    return (10.0 if alpha_us is None else float(alpha_us)) * 1e-6


def shared_slowdown(inp: PlanInput, links: dict) -> float:
    """Compute slowdown on CPU when more than one rank runs on the machine (see above)."""
    if inp.device != "cpu" or inp.world_size <= 1:
        return 1.0
    return float(links.get("cpu_shared_slowdown") or 1.0)


def mesh_groups(inp: PlanInput) -> dict[str, tuple[int, int]]:
    """{mesh dimension: (its group's size, how many consecutive ranks the group spans)}: tp is
    innermost (a TP group is tp neighbouring ranks, one node when tp divides the GPUs per node),
    dp_shard strides over tp, dp_replicate over the rest. The span picks the link (`link`)."""
    from shardbench.trainer.contract import STRATEGIES
    from shardbench.trainer.plan import mesh_forms as mesh

    dp = inp.world_size // (inp.tp * inp.pp)
    R, S = (inp.dp_replicate, mesh.shard_degree(inp)) if STRATEGIES[inp.strategy].engine == "fsdp" else (dp, 1)
    # pp outermost: a pipeline group strides over everything else and spans the world
    return {"tp": (inp.tp, inp.tp), "dp_shard": (S, S * inp.tp), "dp_replicate": (R, inp.world_size // inp.pp),
            "pp": (inp.pp, inp.world_size)}


def step_time(inp: PlanInput, comm: dict, links: dict, calibration: dict | None,
              by_dim: dict | None = None) -> dict:
    """`by_dim` (a mesh layout's collectives per dimension): each dimension's collectives on the
    link its group spans, over its group's ranks; TP's are exposed (activations: the next op
    waits for them)."""
    cfg, T = inp.model_config(), inp.effective_seq_len()
    bw, alpha, which = link(links, inp.world_size)
    ops, why = overlap(inp)
    if inp.device == "cpu":  # gloo's collectives run on the cores that compute: nothing hides
        ops, why = set(), "none on CPU: gloo's collectives use the cores that compute"
    overlappable, exposed_ops = 0.0, 0.0
    per_op = links.get("op_busbw_GBps") or {}
    groups = mesh_groups(inp) if by_dim is not None else {}
    links_by_dim = {}
    for dim, dim_comm in (by_dim or {"": comm or {}}).items():
        size, span = groups.get(dim, (inp.world_size, inp.world_size))
        dim_bw, dim_alpha, dim_link = link(links, span) if dim else (bw, alpha, which)
        if dim:
            links_by_dim[dim] = dim_link
        for op, v in dim_comm.items():
            op_bw = float(per_op[op]) * 1e9 if per_op.get(op) else dim_bw
            if dim:  # an op's own busbw (gloo's, measured on one machine) never beats the link's
                op_bw = min(op_bw, dim_bw)
            if op in ("send", "recv"):  # point to point: one hop; a recv is the peer's send, latency only
                t = v["calls"] * dim_alpha + (v["bytes"] / dim_bw if op == "send" else 0.0)
            else:
                t = collective_seconds(op, v["calls"], v["bytes"], size, op_bw, dim_alpha)
            if op in ops and dim != "tp":
                overlappable += t
            else:
                exposed_ops += t
    out = {"seconds": None, "comm_s": overlappable + exposed_ops, "link": which, "link_GBps": bw / 1e9,
           "alpha_us": alpha * 1e6, "op_busbw_GBps": dict(per_op), "overlap": why}
    if links_by_dim:
        out["link_by_dim"] = links_by_dim
    if calibration and calibration.get("achieved_flops"):
        rate, source = float(calibration["achieved_flops"]), calibration.get("source", "calibrated")
    elif links.get("peak_tflops"):
        mfu, why_mfu = assumed_mfu(links.get("shape"))
        rate = float(links["peak_tflops"]) * 1e12 * mfu
        source = f"peak {links['peak_tflops']} TFLOP/s x assumed MFU {mfu:.0%} ({why_mfu})"
    else:
        return {**out, "why": "no calibration run and no peak FLOP/s for this device"}
    flops = flops_per_token(cfg, T)
    if inp.activation_checkpointing:
        flops += recompute_flops_per_token(cfg, T)
        source += "; + activation checkpointing's recompute (each block's forward again)"
    # a tensor-parallel rank computes 1/tp of its data-parallel rank's matmuls, a pipeline rank 1/pp
    # of them and idles the schedule's bubble (trainer/plan/pipeline.py)
    compute = flops * inp.micro_batch * inp.grad_accum * T / rate / inp.tp / inp.pp
    if inp.pp > 1:
        from shardbench.trainer.plan import pipeline

        idle, why_idle = pipeline.bubble(inp)
        compute /= 1 - idle
        out["bubble"], out["bubble_why"] = idle, why_idle
        source += f"; / (1 - bubble {idle:.1%}): {why_idle}"
    slowdown = shared_slowdown(inp, links)
    if slowdown != 1.0:
        compute *= slowdown
        source += f"; x{slowdown:g}: {inp.world_size} ranks share the machine (cpuSharedSlowdown)"
    exposed = exposed_ops + max(0.0, overlappable - (2 / 3) * compute)
    offload_s, offload_why = offload.seconds(inp, links)  # state in host memory: the host link
    return {**out, "seconds": compute + exposed + offload_s, "compute_s": compute, "exposed_comm_s": exposed,
            "offload_s": offload_s, "offload": offload_why,
            "compute_rate_flops": rate / slowdown, "compute_source": source}
