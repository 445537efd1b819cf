"""Closed forms (torch-free) for what the trace cannot reach: DeepSpeed's ZeRO state, buckets
and collectives (DeepSpeed cannot run on fake tensors), DDP's gradient buckets and all-reduces
(DDP's C++ reducer cannot either), and FSDP's model state and collectives at world sizes too
large to be worth tracing (its peak there is fitted to its traces, predict._fitted). Each is
tested against the trace or, for DeepSpeed, measured runs (tests/trainer/test_plan*.py). DeepSpeed facts are those of
0.19 with trainer/ds_configs.
"""
from __future__ import annotations

import math

from shardbench.trainer import ds_knobs
from shardbench.trainer.plan.inputs import Params, PlanInput
from shardbench.trainer.plan.planned_layout import deepspeed, sharded, stage

DDP_BUCKET = 25 << 20             # DDP's bucket_cap_mb default, 25 MiB (--bucket-mib's default)


def _half(inp: PlanInput) -> bool:
    return inp.precision in ("bf16", "fp16")


def reduce_bytes(inp: PlanInput) -> int:
    """Bytes per gradient element on the wire (--grad-reduce-dtype)."""
    return 2 if inp.grad_reduce_dtype == "bf16" else 4


def zero_config(inp: PlanInput) -> dict:
    """The run's zero_optimization block: trainer/ds_configs with the shared knobs applied, as
    the ZeRO strategy makes it (ZeRO-3's prefetch bucket: one block's gathered elements)."""
    unit = None
    if stage(inp.layout) == 3:
        plain = ds_knobs.zero_config(3, inp.bucket_mib, inp.reshard_after_forward, inp.precision,
                                     inp.grad_reduce_dtype)
        threshold = int(plain.get("stage3_param_persistence_threshold", 100_000))
        block = Params.of(inp.model_config()).block(0)
        unit = ds_knobs.unit_numel([Params.numel(s) for _, s in block], threshold) if block else None
    return ds_knobs.zero_config(stage(inp.layout), inp.bucket_mib, inp.reshard_after_forward, inp.precision,
                               inp.grad_reduce_dtype, unit, inp.layout.on_host, inp.zero_hpz_partition_size)


def fsdp_shard_numel(params: Params, world: int) -> int:
    """Rank 0's elements under FSDP2: every parameter split on dim 0, padded to world rows."""
    total = 0
    for _, shape in params.shapes:
        rows = shape[0]
        rest = Params.numel(shape) // rows
        total += math.ceil(rows / world) * rest
    return total


def model_state(inp: PlanInput) -> dict[str, int]:
    """Bytes of params, grads, optimizer state and master copies rank 0 holds at the peak of a
    step (AdamW: two fp32 moments), by category, as trainer.metrics counts them."""
    params = Params.of(inp.model_config())
    P, N, lay = params.total, inp.world_size, inp.layout
    if not deepspeed(lay):  # torch engines: fp32 parameters and gradients (autocast), fp32 moments
        if N == 1 or not sharded(lay, "params"):
            return {"params": 4 * P, "grads": 4 * P, "optimizer": 8 * P, "master": 0}
        shard = fsdp_shard_numel(params, N)
        whole = inp.fsdp_grad_sync == "last_micro_step" and inp.grad_accum > 1
        return {"params": 4 * shard, "grads": 4 * P if whole else 4 * shard,
                "optimizer": 8 * shard, "master": 0}
    part = math.ceil(P / N)
    weight = 2 if _half(inp) else 4
    grad = int(lay.bytes_per_param(inp.precision)["grads"])  # offloaded: an fp32 partition, twice at ZeRO-3 (contract)
    # Gradients not sharded (ZeRO-1): whole between micro-steps, reduced into the partition at
    # the last one; sharded: reduced into the partition at every micro-step.
    whole_grads = not sharded(lay, "grads") and inp.grad_accum > 1
    hpz = inp.zero_hpz_partition_size
    # ZeRO++ hpZ: a secondary copy of every block's parameters split over hpz ranks (the root is
    # persistent, never partitioned again); counted with the parameters (measured: exact on tiny)
    secondary = sum(math.ceil(Params.numel(s) / hpz) for i in range(inp.model_config().n_layer)
                    for _, s in params.block(i)) if stage(lay) == 3 and hpz > 1 else 0
    return {"params": weight * ((part if sharded(lay, "params") else P) + secondary),
            "grads": grad * (P if whole_grads else part), "optimizer": 8 * part, "master": 4 * part}


def buckets(inp: PlanInput) -> int:
    """Communication buffers held across steps: DeepSpeed's reduce buckets (reduce_bucket_size
    elements; stages 1 and 2 double-buffer them with overlap_comm). DDP's buckets are its
    gradients (gradient_as_bucket_view), FSDP's are transient (traced)."""
    if not deepspeed(inp.layout):
        return 0
    z = zero_config(inp)
    copies = 1 if stage(inp.layout) == 3 else (2 if z.get("overlap_comm") else 1)
    return copies * int(z["reduce_bucket_size"]) * bucket_element_bytes(inp)


def bucket_element_bytes(inp: PlanInput) -> int:
    """Bytes per element of a reduce bucket as DeepSpeed 0.19 allocates it: ZeRO-1/2 in the
    model's dtype (stage_1_and_2 `_gradient_reduction_buffer_dtype`), ZeRO-3 in the
    communication dtype (stage3's ipg buffers, keyed by communication_data_type = the trainer's
    --grad-reduce-dtype): a bf16 ZeRO-3 run reducing in fp32 holds a 4-byte bucket."""
    if stage(inp.layout) == 3:
        return reduce_bytes(inp)
    return 2 if _half(inp) else 4


def reduce_bucket_flushes(params: Params, bucket_elements: int) -> int:
    """Reductions DeepSpeed issues for one backward: gradients arrive in reverse registration
    order (the tied embedding last) and are packed into the reduce bucket; a gradient that would
    overflow a non-empty bucket first flushes it (stage_1_and_2 and stage3
    reduce_independent_p_g_buckets_and_remove_grads), one larger than the bucket goes alone,
    and what is left is flushed at the end of backward."""
    count, elements = 0, 0
    for _, shape in reversed(params.shapes):
        n = Params.numel(shape)
        if elements and elements + n > bucket_elements:
            count, elements = count + 1, 0
        elements += n
    return count + (1 if elements else 0)


def _padded(numel: int, world: int) -> int:
    """A ZeRO-3 parameter gathered whole: its partition (ceil(numel / N)) times N."""
    return math.ceil(numel / world) * world


def _zero3_split(inp: PlanInput, shapes) -> tuple[list[int], list[int]]:
    """(gathered, persistent) padded elements of `shapes`: DeepSpeed keeps a parameter whole on
    every rank when numel <= stage3_param_persistence_threshold, and gathers the others."""
    threshold = int(zero_config(inp)["stage3_param_persistence_threshold"])
    sizes = [Params.numel(s) for s in shapes]
    N = inp.world_size
    return [_padded(n, N) for n in sizes if n > threshold], [_padded(n, N) for n in sizes if n <= threshold]


def zero3_resharded(inp: PlanInput) -> bool:
    """Whether ZeRO-3 releases a block's gathered parameters after its forward (a reuse
    distance of 0, --reshard-after-forward; ds_knobs) and gathers them again for backward."""
    return int(zero_config(inp).get("stage3_max_reuse_distance", ds_knobs.KEEP_GATHERED)) == 0


def _zero3_units(inp: PlanInput, params: Params) -> tuple[int, list[int]]:
    """(padded elements one block gathers, padded elements of every persistent parameter): the
    trainer's ZeRO-3 makes every block a leaf module (one gather per block use, its parameters
    together, as FSDP's units) and its root (tied embedding, wpe, ln_f) persistent, as FSDP keeps
    its root gathered (strategies/zero.py persist_root); a block parameter at or under the
    persistence threshold is persistent too."""
    L = inp.model_config().n_layer
    gathered, kept = _zero3_split(inp, [s for _, s in params.block(0)])
    return sum(gathered), [_padded(Params.numel(s), inp.world_size) for _, s in params.root()] + L * kept


def zero3_gathered(inp: PlanInput) -> int:
    """ZeRO-3 at world size > 1: parameters held whole (model dtype) at the peak beyond the
    partitions: the persistent ones always, and the blocks: re-sharded, the one computing and
    the one prefetched (prefetch bucket = one block, live budget = two); kept
    (--no-reshard-after-forward), every block from its forward to its backward."""
    if stage(inp.layout) != 3 or inp.world_size == 1:
        return 0
    params, wb = Params.of(inp.model_config()), 2 if _half(inp) else 4
    block, kept = _zero3_units(inp, params)
    L = inp.model_config().n_layer
    return wb * (sum(kept) + block * (min(2, L) if zero3_resharded(inp) else L))


def zero3_all_gather(inp: PlanInput, params: Params) -> dict[str, float]:
    """ZeRO-3's all-gathers per optimizer step (DeepSpeed 0.19's partitioned_param_coordinator,
    blocks as leaf modules, prefetch one block ahead): each micro-step gathers every block once
    in forward and, re-sharded, again in backward except the last (still gathered when its
    backward starts, as FSDP's plan keeps it), one call per block; after the optimizer step
    each persistent parameter is gathered back, one call each."""
    A, wb, L = inp.grad_accum, 2 if _half(inp) else 4, inp.model_config().n_layer
    block, kept = _zero3_units(inp, params)
    uses = L + (L - 1 if zero3_resharded(inp) else 0)
    return {"calls": float(A * uses + len(kept)), "bytes": float(wb * (A * uses * block + sum(kept)))}


def reduce_copies(inp: PlanInput) -> int:
    """ZeRO-2 with a 16-bit model reducing in fp32 (--grad-reduce-dtype fp32): an fp32 copy of
    the gradients of one bucket exists at backward's peak (the reduction's input in the
    communication dtype): 4 bytes x min(model, bucket) elements. Measured on one bf16 ZeRO-2
    run (-20% without it, benchmarks/plan_accuracy_random.py); not seen for ZeRO-1."""
    if not (deepspeed(inp.layout) and stage(inp.layout) == 2 and _half(inp) and inp.grad_reduce_dtype == "fp32"):
        return 0
    return 4 * min(Params.of(inp.model_config()).total, int(zero_config(inp)["reduce_bucket_size"]))


def zero3_cast_copy(inp: PlanInput) -> int:
    """ZeRO-3 whose communication dtype (--grad-reduce-dtype) differs from the model's: a gradient
    too large for the reduce bucket (numel > reduce_bucket_size: the bucket is flushed before it
    and `__add_grad_to_ipg_bucket` leaves it out of the contiguous buffer) keeps its model-dtype
    .grad, and DeepSpeed 0.19.8 stage3 `__avg_scatter_grads` casts it whole
    (`g.to(communication_data_type)`) before `reduce_scatter_coalesced`, so at its reduction the
    rank holds both: comm bytes x the largest such gradient's elements (gradients that fit the
    bucket are copied into the comm-dtype bucket itself, counted in buckets). Keyed on dtypes and
    the bucket, whatever the strategy's name; 0 where the dtypes match or every gradient fits.
    Measured on one run (benchmarks/plan_accuracy_random.py 34-zero3-w4, bf16 reducing in fp32:
    -16.0% without it). Not modelled: the padded torch.cat copy reduce_scatter_coalesced makes
    of a gradient whose numel the world size does not divide (any dtypes)."""
    if not (deepspeed(inp.layout) and stage(inp.layout) == 3):
        return 0
    comm = reduce_bytes(inp)
    if comm == (2 if _half(inp) else 4):
        return 0
    bucket = int(zero_config(inp)["reduce_bucket_size"])
    largest = max((Params.numel(s) for _, s in Params.of(inp.model_config()).shapes), default=0)
    return comm * largest if largest > bucket else 0


def _zero12_slices(params: Params, world: int) -> dict[str, list[tuple[int, int]]]:
    """Each gradient as stage_1_and_2 splits it for a reduction: (owning rank, elements) at the
    rank partitions of its parameter group's flat buffer (the trainer's two groups: matrices and
    embeddings, then vectors, each in registration order, padded to a multiple of 2N)."""
    out: dict[str, list[tuple[int, int]]] = {}
    for group in ([(n, s) for n, s in params.shapes if len(s) >= 2], [(n, s) for n, s in params.shapes if len(s) < 2]):
        total = sum(Params.numel(s) for _, s in group)
        part = math.ceil(total / (2 * world)) * 2
        start = 0
        for name, shape in group:
            end, pieces, at = start + Params.numel(shape), [], start
            while at < end:
                rank = at // part
                stop = min(end, (rank + 1) * part)
                pieces.append((rank, stop - at))
                at = stop
            out[name], start = pieces, end
    return out


def zero12_reduce_calls(inp: PlanInput, params: Params, bucket: int) -> int:
    """ZeRO-1/2's all-reduce calls per reduction (one backward's gradients): the buckets DeepSpeed
    flushes (reduce_bucket_flushes' packing), each all-reduced in pieces (average_tensor:
    consecutive slices owned by one rank merged; allreduce_and_scatter calls once the pieces
    gathered exceed the bucket, then for the rest), so a gradient larger than the bucket takes
    several calls. A 16-bit model made one call more per reduction in every such run measured
    (bf16, reducing in fp32 or bf16: benchmarks/plan_accuracy_random.py; not traced to its
    source), an fp32 model reducing in bf16 none."""
    slices = _zero12_slices(params, inp.world_size)

    def calls(names: list[str]) -> int:
        merged: list[list[int]] = []
        for name in names:
            for rank, n in slices[name]:
                if merged and merged[-1][0] == rank:
                    merged[-1][1] += n
                else:
                    merged.append([rank, n])
        count, acc = 0, 0
        for _, n in merged:
            acc += n
            if acc > bucket:
                count, acc = count + 1, 0
        return count + (1 if acc else 0)

    total, names, elements = 0, list[str](), 0
    for name, shape in reversed(params.shapes):
        n = Params.numel(shape)
        if elements and elements + n > bucket:
            total, names, elements = total + calls(names), [], 0
        names.append(name)
        elements += n
    total += calls(names) if names else 0
    return total + (1 if _half(inp) else 0)


def ddp_bucket_count(params: Params, elem_bytes: int = 4, bucket: int = DDP_BUCKET) -> int:
    """DDP's buckets in a step after the first (what a run measures): torch 2.13 starts with one
    bucket of every parameter and, after the first backward, rebuilds them in the order the
    gradients became ready (reverse registration, the tied embedding last) with `bucket` bytes
    as every bucket's cap (--bucket-mib; no smaller first bucket), a bucket closing once full
    (checked against a real DDP's comm hook calls, tests/trainer/test_plan.py)."""
    count, size = 0, 0
    for _, shape in reversed(params.shapes):
        size += Params.numel(shape) * elem_bytes
        if size >= bucket:
            count, size = count + 1, 0
    return count + (1 if size else 0)


def comm(inp: PlanInput) -> dict[str, dict[str, float]]:
    """Collectives rank 0 issues per optimizer step, by operation, in trainer/comm.py's units
    (bytes: the all-reduced tensor, the gathered output, the reduce-scatter input)."""
    N, A = inp.world_size, inp.grad_accum
    params = Params.of(inp.model_config())
    P, rb = params.total, reduce_bytes(inp)
    lay = inp.layout
    if not deepspeed(lay):
        if N == 1:
            return {}
        if sharded(lay, "params"):
            return fsdp_comm(inp, params)
        calls = ddp_bucket_count(params, bucket=int(inp.bucket_mib * 2 ** 20))
        return {"all_reduce": {"calls": float(calls), "bytes": float(rb * P)}}
    z = zero_config(inp)
    wb = 2 if _half(inp) else 4
    out: dict[str, dict[str, float]] = {}
    # Gradients not sharded (ZeRO-1): reduced once, at the last micro-step; else every micro-step.
    reductions = A if sharded(lay, "grads") else 1
    per = reduce_bucket_flushes(params, int(z["reduce_bucket_size"]))
    if not sharded(lay, "params"):  # ZeRO-1/2
        per = zero12_reduce_calls(inp, params, int(z["reduce_bucket_size"]))
        # + 2 small all-reduces (the overflow check and the gradient norm, 4 bytes each)
        out["all_reduce"] = {"calls": float(reductions * per + 2), "bytes": float(reductions * rb * P + 8)}
        if N > 1:  # updated partitions gathered back: one all-gather per parameter group
            out["all_gather"] = {"calls": 2.0, "bytes": float(wb * P)}
        return out
    out["reduce_scatter"] = {"calls": float(A * per), "bytes": float(A * rb * P)}
    out["all_reduce"] = {"calls": 2.0, "bytes": 16.0}
    if N > 1:
        out["all_gather"] = zero3_all_gather(inp, params)
    return out


def fsdp_comm(inp: PlanInput, params: Params) -> dict[str, dict[str, float]]:
    """FSDP2 with the trainer's plan: blocks 0..L-2 gathered in forward and again in backward,
    the last block and the root once (--no-reshard-after-forward: every block once); every unit
    reduce-scatters after each micro-step (or, with last_micro_step, only the last);
    clip_grad_norm_ all-reduces one norm."""
    A, L, N = inp.grad_accum, inp.model_config().n_layer, inp.world_size
    gb = 2 if _half(inp) else 4
    rb = reduce_bytes(inp)

    def padded(group) -> int:
        return sum(math.ceil(s[0] / N) * N * (Params.numel(s) // s[0]) for _, s in group)

    block, root = padded(params.block(0)), padded(params.root())
    regathered = L - 1 if inp.reshard_after_forward else 0  # blocks gathered again for backward
    gathers = L + regathered + 1
    syncs = 1 if inp.fsdp_grad_sync == "last_micro_step" else A
    return {
        "all_gather": {"calls": float(A * gathers), "bytes": float(A * gb * (root + block * (L + regathered)))},
        "reduce_scatter": {"calls": float(syncs * (L + 1)), "bytes": float(syncs * rb * (root + L * block))},
        "all_reduce": {"calls": 1.0, "bytes": 112.0 if N > 1 else 0.0},
    }

