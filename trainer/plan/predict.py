"""One run's prediction: memory per rank by category, total tensor peak, collectives per step,
step time, and whether it fits, with the assumptions it rests on (a plain dict, JSON-ready: the
record's `prediction`)."""
from __future__ import annotations

import functools
from dataclasses import replace

from shardbench.trainer.plan import formulas, mesh_forms as mesh
from shardbench.trainer.plan import offload
from shardbench.trainer.plan.inputs import Params, PlanInput
from shardbench.trainer.plan.planned_layout import deepspeed, layout, sharded, stage

# GPU only: what the caching allocator reserves beyond the tensors (fragmentation, rounding to
# 512 B / 2 MiB blocks, the CUDA context is not counted). An assumption, stated in every plan.
ALLOCATOR_OVERHEAD = 0.10
VERSION = 1
TRACE_FSDP_UP_TO = 16
"""FSDP is traced up to this world size (FSDP2 splits every parameter into world-size chunks:
a 1024-rank trace of gpt2-1.3b takes minutes here); beyond, its peak is extrapolated from its
own traces at FIT_AT ranks (`_fitted`), its state and collectives are closed forms (exact)."""
FIT_AT = (TRACE_FSDP_UP_TO // 2, TRACE_FSDP_UP_TO)


@functools.lru_cache(maxsize=64)
def _traced(inp: PlanInput, engine: str):
    from shardbench.trainer.plan.trace import trace_step

    return trace_step(inp, engine)


def _trace(key: tuple[PlanInput, str]):
    """The trace of (input, engine), shared by every strategy whose layout traces alike (the
    trace reads the engine, not the strategy's name, nor the knobs it does not model)."""
    inp, engine = key
    keep_reshard = engine == "fsdp"
    return _traced(replace(inp, strategy="", bucket_mib=25.0,
                           reshard_after_forward=inp.reshard_after_forward if keep_reshard else True), engine)


def _plain_key(inp: PlanInput) -> tuple[PlanInput, str]:
    """The plain model's trace serves every world size (activations are per rank). FSDP
    reduce-scatters every micro-step, and ZeRO-2/3 reduce every micro-step into their partitions
    (measured: the peak at grad-accum 2 equals grad-accum 1's): gradients between micro-steps are
    in their state, so their activations are those of one micro-step (the plain trace at
    grad-accum > 1 holds whole gradients across micro-steps, which ZeRO-1 does)."""
    lay = inp.layout
    if not deepspeed(lay) and sharded(lay, "params") and inp.world_size > 1:
        # DDP's trace at any N > 1 holds the same activations
        return replace(inp, world_size=2, grad_accum=1, fsdp_grad_sync="every_micro_step"), "ddp"
    if deepspeed(lay):
        return replace(inp, world_size=1, grad_accum=1 if sharded(lay, "grads") else inp.grad_accum), "zero"
    return replace(inp, world_size=1), "plain"


def _trace_key(inp: PlanInput) -> tuple[PlanInput, str]:
    """DDP's trace does not depend on the world size beyond 1 (replicated): one trace serves all."""
    from shardbench.trainer.plan.trace import engine_for

    engine = engine_for(inp)
    if engine == "ddp":
        return replace(inp, world_size=2, fsdp_grad_sync="every_micro_step"), engine
    return inp, engine


def _grads_not_yet_held(inp: PlanInput, state: dict[str, int]) -> int:
    """ZeRO-1/2 during backward: each gradient is copied into the reduce bucket (held: the
    buckets category) as autograd finishes it and freed (the trace's peak less accumulated
    gradients); the gradient partition is made when a bucket is first reduced, so within the
    first micro-step it does not exist yet when the bucket holds the whole model (DeepSpeed 0.19
    stage_1_and_2; within 2.2% on the 24 ZeRO-1/2 runs of docs/planner.md, all of whose models
    fit one bucket: a model larger than the bucket is counted with its partition, unmeasured)."""
    bucket = int(formulas.zero_config(inp)["reduce_bucket_size"])
    whole = Params.of(inp.model_config()).total <= bucket
    return state["grads"] if inp.grad_accum == 1 and whole else 0


def _fitted(inp: PlanInput) -> int:
    """A sharded torch engine's tensor peak beyond TRACE_FSDP_UP_TO ranks, from its own trace's
    scaling: per rank, peak(N) = replicated + sharded / N through the traces at FIT_AT ranks
    (what is not sharded - activations, the gathered units, the root - stays; the rest divides).
    The sharded part is never negative, so the prediction never rises with the degree."""
    (na, qa), (nb, qb) = ((n, _trace(_trace_key(replace(inp, world_size=n))).peak_bytes) for n in FIT_AT)
    sharded_part = max(0.0, (qa - qb) / (1 / na - 1 / nb))
    return int(round(qb - sharded_part / nb + sharded_part / inp.world_size))


def memory(inp: PlanInput, trace_fsdp: bool = True) -> tuple[dict[str, int], int, str, dict | None]:
    """(bytes by category, total tensor peak, method, traced comm or None)."""
    if inp.pp > 1:
        from shardbench.trainer.plan import pipeline

        cats, total, _ = pipeline.memory(inp)
        return cats, total, "the rank's stages on fake tensors in torch's schedule order (pipeline_order)", None
    if mesh.is_mesh(inp):
        return _mesh_memory(inp)
    state = formulas.model_state(inp)
    cats = {**state, "buckets": formulas.buckets(inp), "gathered_params": 0, "activations": 0}
    lay, N = inp.layout, inp.world_size
    if not deepspeed(lay) and (N == 1 or not sharded(lay, "params") or trace_fsdp):
        t = _trace(_trace_key(inp) if N > 1 else _plain_key(inp))
        cats.update(params=t.params_bytes, grads=t.grads_bytes, optimizer=t.optimizer_bytes)
        total = t.peak_bytes
        method = (f"traced (FSDP2 on {t.world_size} fake ranks)" if t.engine == "fsdp" else
                  "traced (the plain model; DDP's buckets as persistent gradients)" if t.engine == "ddp" else
                  "traced (the plain model on 1 rank)")
        comm = t.comm if t.engine == "fsdp" else None
    elif not deepspeed(lay):  # sharded beyond tracing: state and collectives exact, peak fitted
        total = max(_fitted(inp), sum(cats.values()))
        method = (f"traced (FSDP2 on {FIT_AT[0]} and {FIT_AT[1]} fake ranks), fitted as replicated + "
                  f"sharded / N to {N} ranks")
        comm = None
    else:
        t = _trace(_plain_key(inp))
        # Activations and temporaries per micro-step are the plain model's; the optimizer's
        # temporaries scale with what this rank updates (its partition for ZeRO).
        act_fb = t.peak_fwd_bwd_bytes - t.state_before_bytes
        held = sum(state.values()) + cats["buckets"]
        cats["gathered_params"] = formulas.zero3_gathered(inp)
        share = state["optimizer"] / max(1, t.optimizer_bytes) if t.optimizer_bytes else 1.0
        opt_peak = held + share * (t.peak_opt_bytes - t.before_opt_bytes)
        fwd_bwd = held + cats["gathered_params"] + act_fb
        # ZeRO-3 reducing in another dtype than the model's: the cast of a gradient larger than the
        # bucket, held beside it at its reduction in backward (0 otherwise)
        fwd_bwd += formulas.zero3_cast_copy(inp)
        if deepspeed(lay) and stage(lay) < 3:
            # Buckets exist from backward's first gradient on, not at forward's activation peak;
            # the gradient partition from a micro-step's first reduction on (so in forward only
            # when an earlier micro-step of the same step made it).
            base = held - cats["buckets"] - state["grads"] - t.state_before_bytes
            # From the second micro-step on, the buckets made by the first backward are still
            # held (DeepSpeed frees them at the step) and so are the whole gradients (ZeRO-1) or
            # the partition (ZeRO-2).
            later = state["grads"] + cats["buckets"] if inp.grad_accum > 1 else 0
            fwd = later + t.peak_fwd_less_grads_bytes
            bwd = (state["grads"] - _grads_not_yet_held(inp, state) + t.peak_bwd_less_grads_bytes + cats["buckets"]
                   + formulas.reduce_copies(inp))
            fwd_bwd = base + max(fwd, bwd)
        total = int(max(fwd_bwd, opt_peak))
        method = "closed form state + traced activations (plain model, 1 fake rank)"
        comm = None
    cats["activations"] = max(0, total - sum(v for k, v in cats.items() if k != "activations"))
    return cats, int(total), method, comm


@functools.lru_cache(maxsize=16)
def _mesh_traced(inp: PlanInput):
    from shardbench.trainer.plan.trace import trace_step

    return trace_step(inp, "mesh")


def _mesh_memory(inp: PlanInput) -> tuple[dict[str, int], int, str, dict | None]:
    """A mesh layout traced at its world size on a fake mesh; model state closed form (exact)."""
    t = _mesh_traced(replace(inp, bucket_mib=25.0) if mesh.wrapped(inp) else inp)
    cats = {**mesh.model_state(inp), "buckets": 0, "gathered_params": 0, "activations": 0}
    total = max(t.peak_bytes, sum(cats.values()))
    cats["activations"] = max(0, total - sum(cats.values()))
    return cats, int(total), f"traced (the layout on a fake {inp.world_size}-rank mesh)", None


def predict(inp: PlanInput, device_memory_bytes: int | None = None, links: dict | None = None,
            calibration: dict | None = None, trace_fsdp: bool | None = None) -> dict:
    from shardbench.trainer.plan import timing

    layout(inp.strategy)  # NotModelled (one line: why) before anything is traced
    inp.layout  # and for the mesh degrees beyond data parallelism (tensor parallel, HSDP)
    if trace_fsdp is None:
        trace_fsdp = inp.world_size <= TRACE_FSDP_UP_TO
    cats, total, method, traced_comm = memory(inp, trace_fsdp)
    if inp.pp > 1:
        from shardbench.trainer.plan import pipeline

        by_dim: dict | None = pipeline.comm_by_dim(inp)
    else:
        by_dim = mesh.comm_by_dim(inp) if mesh.is_mesh(inp) else None
    comm = mesh.per_op(by_dim) if by_dim is not None else traced_comm if traced_comm is not None else formulas.comm(inp)
    overhead = int(ALLOCATOR_OVERHEAD * total) if inp.device == "cuda" else 0
    peak = total + overhead
    state = sum(cats[k] for k in ("params", "grads", "optimizer", "master"))
    out = {
        "version": VERSION, "input": inp.to_dict(), "method": method,
        "memory": {**cats, "allocator": overhead},
        "model_state_bytes": state, "tensor_peak_bytes": total, "peak_bytes": peak,
        "comm_per_step": comm,
        "device_memory_bytes": device_memory_bytes,
        "fits": None if not device_memory_bytes else peak <= device_memory_bytes,
        "assumptions": [
            "AdamW (two fp32 moments), the trainer's step (clip, step, zero_grad) and strategy settings",
            f"allocator overhead {ALLOCATOR_OVERHEAD:.0%} of the tensor peak on GPU, none on CPU",
            "DeepSpeed: trainer/ds_configs buckets and persistence threshold (closed forms, 0.19)",
        ],
    }
    # Where it lives: offloaded state in host memory, the rest of the peak on the device, which
    # is what must fit (contract.StateLayout.on_host; the record's model_state device/host bytes).
    host = offload.host_bytes(inp, cats)
    out["memory_by_location"] = {"device": peak - host, "host": host}
    if device_memory_bytes:
        out["fits"] = peak - host <= device_memory_bytes
    if host:
        out["assumptions"].append(  # type: ignore[attr-defined]
            f"{', '.join(inp.layout.on_host)} in host memory (--offload {inp.offload}): the optimizer steps on "
            "the host; its step's time there is in the calibration, not modelled apart")
    if stage(inp.layout) == 3 and inp.world_size > 1:
        out["assumptions"].append(  # type: ignore[attr-defined]
            "ZeRO-3 blocks as leaf modules, prefetched one ahead; " + (
                "re-sharded after forward: each block gathered in forward and again in backward (the last kept)"
                if inp.reshard_after_forward else "blocks kept gathered from forward to backward")
            + "; the root (tied embedding, wpe, ln_f) persistent, re-gathered after the step")
    if inp.pp > 1:  # each pipeline rank's stages, state and send/recv (the record's `pipeline`)
        out["pipeline"] = {"schedule": inp.pp_schedule, "stages": pipeline.n_stages(inp),
                           "stages_per_rank": pipeline.per_rank(inp),
                           "bubble": pipeline.bubble(inp)[0],
                           "p2p_per_step": [{"pp_rank": r, "stages": pipeline.stage_ids(inp, r),
                                             **pipeline.p2p(inp, r)} for r in range(inp.pp)]}
        out["model_state_bytes"] = pipeline.max_state(inp)
        out["assumptions"] += [  # type: ignore[operator]
            f"pipeline pp {inp.pp} {inp.pp_schedule}: state, tensor peak and step time of the busiest pipeline rank; "
            f"bubble {pipeline.bubble(inp)[1]}; send/recv on the link the pipeline spans",
            pipeline.peak_note(inp.pp_schedule)]
    if by_dim is not None:  # collectives and what is divided, per mesh dimension
        out["comm_per_step_by_dim"] = by_dim
        out["memory_by_dim"] = mesh.sharded_by_dim(inp)
    if mesh.is_mesh(inp):
        out["assumptions"].append(  # type: ignore[attr-defined]
            "mesh layout: tp innermost (a TP group on one node's intra-node link), data-parallel dimensions "
            "on the inter-node link once they span nodes; TP's activation collectives exposed (not overlapped)")
    out["links"] = links or {}
    out["step_time"] = timing.step_time(inp, comm, links or {}, calibration, by_dim)
    return out
