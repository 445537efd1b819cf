"""Closed forms of the mesh layouts (torch-free): tensor parallelism with sequence parallelism,
HSDP, FSDP + TP and DDP + TP (trainer/parallel/). One place for their arithmetic: each rank's
parameter shapes under the TP plan, model state, and the collectives rank 0 issues per step on
each mesh dimension (`comm_by_dim`), in trainer/comm.py's units (bytes: the all-reduced tensor,
the gathered output, the reduce-scatter input). tests/trainer/test_layouts.py holds every
layout's counted calls and bytes per dimension to these, exactly, at 2 and 4 ranks.

Tensor parallel (trainer/parallel/tp.py), per micro-step of b rows of T tokens, width d, L
blocks, e bytes per activation element (fp32: 4; `tp_element_bytes`: in bf16 the row-parallel
outputs and their gradients are 2 bytes, and every activation is under FSDP2's mixed precision):
- forward: each block gathers the sequence-sharded residual twice (before attention and the
  MLP: all-gather b.T.d) and reduce-scatters the two row-parallel outputs (b.T.d); the token
  embedding reduce-scatters b.T.d, the position table T.d; the head gathers b.T.d; the
  vocabulary-parallel loss all-reduces three b.T values (max, sum of exponentials, the target's
  logit; fp32).
- backward mirrors it: each forward reduce-scatter is an all-gather (2L + 2 of them, the position
  table's of T.d), the head's gather a reduce-scatter; q, k, v and the MLP's first projection
  take a replicated (gathered) input, so their input gradient is all-reduced (4L of b.T.d).
- per step: the LayerNorms' gradients are Partial over tp (sequence parallel): with no
  data-parallel wrapper (one data-parallel rank) each LayerNorm parameter is all-reduced 4 times
  in the step (the norm's and AdamW's redistributions); under DDP or FSDP, whose hooks turn
  DTensor gradients back to their parameter's placement, once per micro-step. The gradient norm:
  one float64 all-reduce per mesh dimension of each distinct set of dimensions the gradients are
  sharded on (tensor_parallel.mesh_total_norm; local_total_norm for DDP + TP: one on tp).
- activation checkpointing: each block's forward is run again in backward only up to its last
  saved tensor (torch.utils.checkpoint's early stop): 2 more all-gathers and 1 reduce-scatter per
  block per micro-step.
Data parallel over the TP-local shapes: FSDP2 (formulas.fsdp_comm) on dp_shard, nothing at a
shard degree of 1; HSDP all-reduces each unit's gradient shard on dp_replicate at every
gradient sync; DDP + TP all-reduces the local gradients in its buckets on dp_replicate once per
step (no_sync before the last micro-step).
"""
from __future__ import annotations

from shardbench.trainer.plan import formulas
from shardbench.trainer.plan.inputs import Params, PlanInput

NORM_BYTES = 8
"""The mesh gradient norm's all-reduced float64 sum of squares."""
LOSS_REDUCTIONS = 3
"""loss_parallel's all-reduces per micro-step (torch.distributed.tensor.parallel.loss)."""


def tp_local(params: Params, tp: int) -> Params:
    """Each rank's parameter shapes under TinyGPT's TP plan (trainer/parallel/tp.py): embeddings
    and column-parallel weights and biases split on dim 0, row-parallel weights on dim 1, their
    biases and the LayerNorms replicated."""
    if tp == 1:
        return params
    out = []
    for name, shape in params.shapes:
        leaf, kind = name.split(".")[-2:]
        if name.startswith(("wte.", "wpe.", "lm_head.")) or leaf in ("q", "k", "v", "fc"):  # untied head: colwise
            shape = (shape[0] // tp, *shape[1:])
        elif leaf == "proj" and kind == "weight":
            shape = (shape[0], shape[1] // tp)
        out.append((name, shape))
    return Params(out)


def layernorm_params(params: Params) -> list[tuple[str, tuple[int, ...]]]:
    return [(n, s) for n, s in params.shapes if ".ln_" in f".{n}"]


def wrapped(inp: PlanInput) -> bool:
    """A data-parallel wrapper (DDP or FSDP2) exists: more than one data-parallel rank."""
    return inp.world_size // inp.tp > 1


def shard_degree(inp: PlanInput) -> int:
    """FSDP's dp_shard (trainer.parallel.layout.Layout.of)."""
    return max(1, inp.world_size // inp.tp // inp.pp // inp.dp_replicate)


def _add(out: dict, dim: str, op: str, calls: float, nbytes: float) -> None:
    if calls:
        cell = out.setdefault(dim, {}).setdefault(op, {"calls": 0.0, "bytes": 0.0})
        cell["calls"] += calls
        cell["bytes"] += nbytes


def tp_element_bytes(inp: PlanInput) -> tuple[int, int]:
    """(bytes of an element of TP's activations and their gradients, bytes of the row-parallel
    outputs' element): fp32 4 and 4. In bf16/fp16 FSDP2's mixed-precision policy (fsdp over more
    than one data-parallel rank) runs every op in the low dtype, 2 and 2; autocast (tp alone,
    ddp + tp, fsdp + tp at one data-parallel rank) keeps the LayerNorms' and embeddings' outputs
    fp32 and only the matmuls' outputs low, 4 and 2 (measured on real runs, issue 28)."""
    low = 2 if inp.precision in ("bf16", "fp16") else 4
    from shardbench.trainer.contract import STRATEGIES

    policy = STRATEGIES[inp.strategy].engine == "fsdp" and wrapped(inp)
    return (low if policy else 4), low


def tp_comm(inp: PlanInput) -> dict[str, dict[str, float]]:
    """Tensor parallelism's collectives per step on the tp dimension (see the module docstring)."""
    cfg = inp.model_config()
    A, L, d, T, b = inp.grad_accum, cfg.n_layer, cfg.n_embd, inp.effective_seq_len(), inp.micro_batch
    e, o = tp_element_bytes(inp)
    x, pos, rows, out_x = b * T * d * e, T * d * e, b * T * 4, b * T * d * o
    out: dict[str, dict[str, float]] = {}
    # the 2L row-parallel outputs' reduce-scatters (forward) and their gradients' all-gathers
    # (backward) are in the matmuls' dtype, the rest in the activations'
    ag = A * (4 * L + 3), A * ((2 * L + 2) * x + 2 * L * out_x + pos)
    rs = A * (2 * L + 3), A * (2 * x + 2 * L * out_x + pos)
    if inp.activation_checkpointing:
        # each block's forward again in backward, up to its last saved tensor (torch.utils.checkpoint
        # stops early): the two LayerNorm gathers and the attention output's reduce-scatter
        ag = ag[0] + A * 2 * L, ag[1] + A * 2 * L * x
        rs = rs[0] + A * L, rs[1] + A * L * out_x
    ar_calls, ar_bytes = A * (4 * L + LOSS_REDUCTIONS), A * (4 * L * x + LOSS_REDUCTIONS * rows)
    norms = layernorm_params(Params.of(cfg))
    per_norm = A if wrapped(inp) else 4
    ar_calls += per_norm * len(norms)
    ar_bytes += per_norm * e * sum(Params.numel(s) for _, s in norms)
    ar_calls, ar_bytes = ar_calls + 1, ar_bytes + NORM_BYTES  # the gradient norm's sum over tp
    for op, (calls, nbytes) in (("all_gather", ag), ("reduce_scatter", rs), ("all_reduce", (ar_calls, ar_bytes))):
        out[op] = {"calls": float(calls), "bytes": float(nbytes)}
    return out


def comm_by_dim(inp: PlanInput) -> dict[str, dict[str, dict[str, float]]]:
    """{mesh dimension: {op: {calls, bytes}}} per step on rank 0 for a mesh layout (tp > 1, or
    FSDP with dp_replicate > 1); the record's `comm_per_step_by_dim`."""
    from shardbench.trainer.contract import STRATEGIES

    engine = STRATEGIES[inp.strategy].engine
    params = tp_local(Params.of(inp.model_config()), inp.tp)
    out: dict[str, dict[str, dict[str, float]]] = {}
    if inp.tp > 1:
        out["tp"] = tp_comm(inp)
    if not wrapped(inp):
        return out
    rb = formulas.reduce_bytes(inp)
    if engine == "ddp":  # DDP + TP: local gradients, bucketed, once per step
        calls = formulas.ddp_bucket_count(params, bucket=int(inp.bucket_mib * 2 ** 20))
        _add(out, "dp_replicate", "all_reduce", calls, rb * params.total)
        return out
    S, R = shard_degree(inp), inp.dp_replicate
    fsdp = formulas.fsdp_comm(_with(inp, world_size=S), params)
    if S > 1:
        for op in ("all_gather", "reduce_scatter"):
            _add(out, "dp_shard", op, fsdp[op]["calls"], fsdp[op]["bytes"])
    # mesh_total_norm: one call on dp_shard for the gradients sharded on it only, one more for
    # those also sharded on tp
    _add(out, "dp_shard", "all_reduce", 2 if inp.tp > 1 else 1, NORM_BYTES * (2 if inp.tp > 1 else 1))
    if R > 1:  # HSDP: each unit's reduce-scattered shard all-reduced across the replicas
        rs = fsdp["reduce_scatter"]
        _add(out, "dp_replicate", "all_reduce", rs["calls"], rs["bytes"] / S)
    return out


def _with(inp: PlanInput, **over) -> PlanInput:
    from dataclasses import replace

    return replace(inp, **over)


def per_op(by_dim: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """The per-op totals (the record's `comm_per_step`) of per-dimension counts."""
    out: dict[str, dict[str, float]] = {}
    for ops in by_dim.values():
        for op, v in ops.items():
            cell = out.setdefault(op, {"calls": 0.0, "bytes": 0.0})
            cell["calls"] += v["calls"]
            cell["bytes"] += v["bytes"]
    return dict(sorted(out.items()))


def model_state(inp: PlanInput) -> dict[str, int]:
    """Rank 0's params, grads and AdamW moments (fp32) under a mesh layout: the TP-local shapes,
    sharded by FSDP2 over dp_shard (padded rows), replicated over dp_replicate."""
    from shardbench.trainer.contract import STRATEGIES

    params = tp_local(Params.of(inp.model_config()), inp.tp)
    engine = STRATEGIES[inp.strategy].engine
    S = shard_degree(inp)
    n = formulas.fsdp_shard_numel(params, S) if engine == "fsdp" and wrapped(inp) else params.total
    whole = inp.fsdp_grad_sync == "last_micro_step" and inp.grad_accum > 1 and engine == "fsdp" and wrapped(inp)
    grads = params.total if whole else n
    if inp.tp > 1 and not wrapped(inp):
        # With no data-parallel wrapper the position table's gradient comes back Replicate (whole)
        # though its parameter is Shard(0) (DTensor's embedding backward under sequence parallel).
        cfg = inp.model_config()
        grads += cfg.block_size * cfg.n_embd - cfg.block_size // inp.tp * cfg.n_embd
    return {"params": 4 * n, "grads": 4 * grads, "optimizer": 8 * n, "master": 0}


def sharded_by_dim(inp: PlanInput) -> dict[str, dict]:
    """What each mesh dimension of the layout divides on a rank (memory by dimension), as the
    record's `memory_by_dim` says it (trainer.parallel.layout.Layout.divides)."""
    from shardbench.trainer.contract import STRATEGIES
    from shardbench.trainer.parallel.layout import Layout

    info = STRATEGIES[inp.strategy]
    R, S = (inp.dp_replicate, shard_degree(inp)) if info.engine == "fsdp" else (inp.world_size // inp.tp // inp.pp, 1)
    return Layout(R, S, inp.tp, info.engine, inp.pp).divides(info.sharded)


def is_mesh(inp: PlanInput) -> bool:
    from shardbench.trainer.contract import STRATEGIES

    return inp.tp > 1 or (STRATEGIES[inp.strategy].engine == "fsdp" and inp.dp_replicate > 1)

