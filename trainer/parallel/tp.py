"""Tensor parallelism of TinyGPT with DTensor (as torchtitan plans its GPT-2-like models).

In each block, q, k, v and the MLP's first projection are split by output columns (heads /
hidden units: ColwiseParallel), the attention and MLP output projections by input rows
(RowwiseParallel), and the residual stream between them is sharded by sequence (sequence
parallelism: the LayerNorms run on T / tp positions, SequenceParallel). The token embedding and
the output head share one weight sharded by vocabulary on both sides (RowwiseParallel embedding,
ColwiseParallel head, re-tied after the plan), and the loss is computed on vocabulary-sharded
logits (loss_parallel). The position table is split by rows and its output sharded by sequence
(RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)): its output is (T, d), so
the sequence is dimension 0 there).
"""
from __future__ import annotations

import contextlib

import torch


def apply_tp(model: torch.nn.Module, tp_mesh) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    root = {
        "wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "wpe": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)),
        "ln_f": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    }
    # A pipeline stage (TinyGPT.stage) holds the embeddings or the head only on its first / last stage.
    root = {name: style for name, style in root.items() if getattr(model, name) is not None}
    if root:
        parallelize_module(model, tp_mesh, root)
    gather_sequence = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                         use_local_output=True)
    for block in model.blocks:  # type: ignore[union-attr]
        parallelize_module(block, tp_mesh, {
            "ln_1": SequenceParallel(),
            "attn": gather_sequence,
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
            "ln_2": SequenceParallel(),
            "mlp": gather_sequence,
            "mlp.fc": ColwiseParallel(),
            "mlp.proj": RowwiseParallel(output_layouts=Shard(1)),
        })
    # The plan gave wte and lm_head a sharded Parameter each: tie them again (same placement,
    # Shard(0) over the vocabulary), so both uses add into one gradient as in the plain model.
    if model.cfg.tie_embeddings:  # type: ignore[union-attr]
        model.lm_head.weight = model.wte.weight  # type: ignore[union-attr]


def loss_parallel():
    """The context the loss and its backward run in under TP (vocabulary-sharded logits)."""
    from torch.distributed.tensor.parallel import loss_parallel as ctx

    return ctx()


def no_loss_parallel():
    return contextlib.nullcontext()


def localize_for_ddp(model: torch.nn.Module) -> None:
    """DDP over tensor-parallel parameters, as DDP(device_mesh=<a slice of a 2-D mesh>) does it
    (torch.distributed.tensor.parallel.ddp): DDP gets the local shards as its parameters and each
    forward rebuilds the DTensors from them. Done here rather than by DDP so that the tied
    weight stays tied: torch's transform replaces wte.weight only (named_parameters() lists a
    shared tensor once), and lm_head would keep the old DTensor, a second parameter DDP then
    reduces apart."""
    from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

    _pre_dp_module_transform(model)
    _tie(model)
    model.register_forward_pre_hook(lambda module, args: _tie(module))
    model.register_forward_hook(lambda module, args, out: _tie(module))


def _tie(model: torch.nn.Module) -> None:
    if not model.cfg.tie_embeddings:  # type: ignore[union-attr]
        return
    if model.lm_head.weight is not model.wte.weight:  # type: ignore[union-attr]
        del model.lm_head.weight  # type: ignore[union-attr]  # a Parameter slot takes no plain DTensor: free the name first
        model.lm_head.weight = model.wte.weight  # type: ignore[union-attr]


def local_total_norm(params: list[torch.Tensor], tp_group) -> torch.Tensor:
    """The global gradient norm from local shards (DDP + TP, where DDP holds plain tensors): the
    squares of sharded gradients summed over the tensor-parallel group, replicated ones once."""
    import torch.distributed as dist

    sharded, replicated = list[torch.Tensor](), list[torch.Tensor]()
    for p in params:
        if p.grad is not None:
            spec = getattr(p, "_st_info", None)
            shard = spec is not None and any(pl.is_shard() for pl in spec.placements)
            (sharded if shard else replicated).append(p.grad.detach())
    squares = _squares(sharded, params[0].device)
    dist.all_reduce(squares, group=tp_group)
    return (squares + _squares(replicated, params[0].device)).sqrt()


def mesh_total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The global norm of DTensor gradients on a mesh, from each local shard's norm (torch's
    _foreach_norm, as get_total_norm computes a plain model's): squares summed over the mesh
    dimensions a gradient is sharded on. Partial gradients (the LayerNorms' under sequence
    parallelism) are reduced first. Not torch's get_total_norm on DTensors: it takes the norm of
    a Partial gradient's local part as if it were the whole."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Replicate

    by_dims: dict[tuple, list[torch.Tensor]] = {}
    for g in grads:
        if isinstance(g, DTensor):
            if any(pl.is_partial() for pl in g.placements):
                g = g.redistribute(g.device_mesh, [Replicate() if pl.is_partial() else pl for pl in g.placements])
            # Sharded on every dimension it is not replicated on (FSDP's _StridedShard over TP's
            # Shard is no is_shard()).
            groups = tuple(g.device_mesh.get_group(i) for i, pl in enumerate(g.placements) if not pl.is_replicate())
            by_dims.setdefault(groups, []).append(g.to_local())
        else:
            by_dims.setdefault((), []).append(g)
    total = None
    for groups, local in by_dims.items():
        squares = _squares(local, local[0].device)
        for group in groups:
            dist.all_reduce(squares, group=group)
        total = squares if total is None else total + squares
    return total.sqrt()  # type: ignore[union-attr]


def _squares(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    if not tensors:
        return torch.zeros((), dtype=torch.float64, device=device)
    # float64: float32 norms of the shards summed in squares lost 3e-5 of the total here (the
    # tied embedding's shards); float64 agrees with the one-process norm within 1e-8.
    return torch.stack([torch.linalg.vector_norm(t.detach(), dtype=torch.float64) for t in tensors]).pow(2).sum()
