"""Pipeline parallelism of TinyGPT with torch.distributed.pipelining (as torchtitan splits its
models by hand, without tracing).

Every rank builds the whole model from the seed (so every stage's weights are the one-process
model's), then keeps the stages it holds (layout.pp_stage_ids: one per rank, round-robin for the
looped schedules, a V for ZBV / DualPipeV): TinyGPT.stage() shares the blocks of that stage, the
embeddings on the first stage, the final LayerNorm and the head on the last. The head must be
untied (rules: --no-tie-embeddings), else its gradient and the embedding's would never be summed.
Each stage is then wrapped like a whole model (tensor-parallel plan, DDP or FSDP over the
data-parallel part of the mesh) and handed to a PipelineStage on the mesh's "pp" group.

A step is one `schedule.step()`: the step's micro-batches (--grad-accum of them, concatenated)
are split back along the batch into the same micro-batches and streamed through the stages; the
schedule divides the gradients by their number (scale_grads), as the plain loop's loss /
grad_accum does. Activations and their gradients cross stages as isend/irecv on the pp group,
which trainer/comm.py counts as send / recv (per dimension: "pp").
"""
from __future__ import annotations

import torch

from shardbench.trainer.model import lm_loss
from shardbench.trainer.parallel.layout import (PP_SINGLE, Layout, pp_layer_bounds, pp_stage_ids,
                                                pp_stages_per_rank)


def split_stages(model, layout: Layout, schedule: str, per_rank_given: int | None, pp_rank: int):
    """(stage ids, stage modules) this pipeline rank holds, sharing `model`'s modules."""
    per_rank = pp_stages_per_rank(schedule, per_rank_given)
    n_stages = layout.pp * per_rank
    bounds = pp_layer_bounds(len(model.blocks), n_stages)
    ids = pp_stage_ids(schedule, layout.pp, per_rank, pp_rank)
    parts = [model.stage(*bounds[i], embed=i == 0, head=i == n_stages - 1) for i in ids]
    return ids, n_stages, parts


class Pipeline:
    """This rank's stages and the schedule that runs them."""

    def __init__(self, modules: list[torch.nn.Module], ids: list[int], n_stages: int, pp_group, schedule: str,
                 micro_batches: int, device: torch.device):
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import get_schedule_class

        self.ids, self.n_stages = ids, n_stages
        stages = [PipelineStage(m, i, n_stages, device, group=pp_group) for m, i in zip(modules, ids)]
        cls = get_schedule_class(schedule)
        self.schedule = cls(stages[0] if schedule in PP_SINGLE else stages, n_microbatches=micro_batches,
                            loss_fn=lm_loss, scale_grads=True)
        self.first, self.last = 0 in ids, n_stages - 1 in ids
        self.device = device

    def step(self, batches) -> torch.Tensor:
        """Forward and backward of every micro-batch in `batches` [(x, y), ...]; the sum of their
        losses on the rank holding the last stage, zero elsewhere."""
        args = (torch.cat([x for x, _ in batches]),) if self.first else ()
        target = torch.cat([y for _, y in batches]) if self.last else None
        losses: list[torch.Tensor] = []
        self.schedule.step(*args, target=target, losses=losses if self.last else None)
        if not losses:
            return torch.zeros((), device=self.device)
        # Under TP a loss is a replicated DTensor (loss_parallel).
        local = [loss.full_tensor() if hasattr(loss, "full_tensor") else loss for loss in losses]
        return torch.stack([loss.detach().float() for loss in local]).sum()


def across_stages(norm: torch.Tensor, pp_group) -> torch.Tensor:
    """The global gradient norm from each pipeline rank's norm of its own stages: squares summed
    in float64 over the pipeline (the stages hold disjoint parameters)."""
    import torch.distributed as dist

    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    squares = norm.detach().to(torch.float64).pow(2)
    dist.all_reduce(squares, group=pp_group)
    return squares.sqrt()


def all_reduce_grads(params: list[torch.Tensor], group, bucket_bytes: int, dtype: torch.dtype) -> None:
    """DDP's gradient average for pipeline stages, after the schedule: buckets of at most
    `bucket_bytes` (--bucket-mib) flattened, all-reduced in `dtype` (--grad-reduce-dtype) and
    written back. Not torch's DDP: PipelineStage drives DDP's reducer by hand
    (prepare_for_backward on the last micro-batch only), and with more than one data-parallel
    rank its bucket rebuild then saw every parameter twice and failed an internal assertion at
    the second step (torch 2.13, "rebuilt params size of: 68" for 34 parameters)."""
    import torch.distributed as dist

    # Tensor-parallel gradients are DTensors: their local shards, written in place.
    grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in params if p.grad is not None]
    n = dist.get_world_size(group)
    bucket: list[torch.Tensor] = []

    def flush() -> None:
        flat = torch.cat([g.reshape(-1) for g in bucket]).to(dtype)
        dist.all_reduce(flat, group=group)
        flat.div_(n)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        bucket.clear()

    size = 0
    for g in reversed(grads):  # DDP's order: the last layers' gradients are ready first
        if bucket and size + g.numel() * g.element_size() > bucket_bytes:
            flush()
            size = 0
        bucket.append(g)
        size += g.numel() * g.element_size()
    if bucket:
        flush()


def pipeline_record(cfg, layout: Layout, rank: int, world_size: int, per_dim: dict) -> dict:
    """The record's `pipeline`: the schedule, its stages, and each pipeline rank's point-to-point
    traffic per measured step (of the first pipeline: data- and tensor-parallel coordinates 0).
    `per_dim` is this rank's COUNTER.per_dim_step(). A collective: every rank calls it."""
    from shardbench.trainer.process import gather

    per_rank = pp_stages_per_rank(cfg.pp_schedule, cfg.pp_stages_per_rank)
    pp_dim = per_dim.get("pp", {})
    mine = {op: {k: pp_dim.get(op, {}).get(k, 0) for k in ("calls", "bytes")} for op in ("send", "recv")}
    everyone = gather((layout.coords(rank), mine), world_size)
    ranks = []
    for coords, traffic in everyone:
        if coords["dp_replicate"] == coords["dp_shard"] == coords["tp"] == 0:
            ranks.append({"pp_rank": coords["pp"],
                          "stages": pp_stage_ids(cfg.pp_schedule, layout.pp, per_rank, coords["pp"]), **traffic})
    return {"schedule": cfg.pp_schedule, "stages": layout.pp * per_rank, "stages_per_rank": per_rank,
            "p2p_per_step": sorted(ranks, key=lambda r: r["pp_rank"])}
