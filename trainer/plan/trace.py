"""Trace one training step of any world size in this one CPU process, allocating nothing:
torch's fake tensors (FakeTensorMode: shapes, dtypes and storages without data) and its fake
process group (the "fake" backend: collectives that return at once), with trainer/plan/live.py
counting every storage and trainer/comm.py counting every collective, as in a real run.

What is traced: the plain model (DDP at any world size holds exactly its memory: replicated, its
gradient buckets are the gradients), FSDP2 at the run's world size (fully_shard per block and
root, the trainer's reshard plan and mixed-precision policy), and the plain model as the source
of the activation and temporary memory of DeepSpeed's ZeRO stages (DeepSpeed cannot run on fake
tensors: it swaps parameters that hold weak references; trainer/plan/formulas.py adds its state),
and the mesh layouts on a fake (dp_replicate, dp_shard, tp) mesh ("mesh": the TP plan with
loss_parallel, FSDP2 over the data-parallel part, DDP + TP's buckets as persistent local gradients).
The step is the trainer's: grad-accum micro-steps of forward + backward (autocast in bf16/fp16,
loss / grad-accum), clip the global norm, AdamW (foreach on CPU, fused on GPU), zero the
gradients. One step runs first so that AdamW's state exists; the second is measured.
"""
from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from shardbench.trainer.config import RunConfig
from shardbench.trainer.plan.inputs import PlanInput
from shardbench.trainer.plan.live import LiveTensors

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Trace:
    engine: str
    """plain (one rank's model, DDP's memory) or fsdp (sharded across the fake world)."""
    world_size: int
    peak_bytes: int = 0
    """Most live tensor bytes during the measured step."""
    peak_fwd_bwd_bytes: int = 0
    """The same, over the micro-steps only (forward + backward)."""
    peak_fwd_less_grads_bytes: int = 0
    """Most live bytes in forward (before a micro-step's first gradient), less gradients."""
    peak_bwd_less_grads_bytes: int = 0
    """Most live bytes in backward, less every parameter gradient once autograd has accumulated
    it (ZeRO-1/2 copy each into their reduce buckets, allocated at the first one, and free it)."""
    before_opt_bytes: int = 0
    """Live bytes after the last backward, when the optimizer step starts."""
    peak_opt_bytes: int = 0
    """Most live bytes during clip + optimizer step + zero_grad."""
    state_before_bytes: int = 0
    """Live bytes when the measured step starts (parameters, optimizer state, buffers)."""
    params_bytes: int = 0
    grads_bytes: int = 0
    optimizer_bytes: int = 0
    """Model state at the sampled point where it was largest (as trainer.metrics counts it)."""
    comm: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: float = 0.0


@contextlib.contextmanager
def fake_world(world_size: int):
    """A fake process group of `world_size` ranks in which this process is rank 0."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group exists already: plans are traced in a process of their own")
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        # Only a mesh of sub-groups (TP, HSDP) leaves cached plans that name groups the next fake
        # world lacks; a 1-D mesh runs on the world group, which every fake world has again.
        # Clearing always cost 60% more time per FSDP trace (6 traces: 5.1 s -> 8.1 s).
        sub_groups = len(dist.distributed_c10d._world.pg_map) > 1
        dist.destroy_process_group()
        if sub_groups:
            forget_dtensor_meshes()


def forget_dtensor_meshes() -> None:
    """Drop DTensor's process-wide caches once a fake group is destroyed. They hold sharding
    results, redistribution plans and planners that keep the DeviceMesh of the run; the next fake
    mesh of the same shape compares equal to it, so a later TP trace in this process would be
    handed the old mesh and fail on "Could not resolve the process group registered under the
    name N" (torch's debug helper clears the sharding caches; the other three have no public one)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._collective_utils import MeshTopoInfo
    from torch.distributed.tensor._redistribute import _gen_transform_infos, clear_redistribute_planner_cache
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    DTensor._op_dispatcher.sharding_propagator._propagate_tensor_meta_cached.cache_clear()
    _gen_transform_infos.cache_clear()
    clear_redistribute_planner_cache()
    MeshTopoInfo.build_from_mesh.cache_clear()


def _storages_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        local = getattr(t, "_local_tensor", None)
        t = local if isinstance(local, torch.Tensor) else t
        st = t.untyped_storage()
        if id(st) in seen:
            continue
        seen.add(id(st))
        total += st.nbytes()
    return total


class _Step:
    """The model, its optimizer and one training step, as trainer.strategies run them."""

    def __init__(self, inp: PlanInput, engine: str, mode):
        from shardbench.trainer.model import TinyGPT
        from shardbench.trainer.strategies.base import param_groups

        self.inp, self.engine = inp, engine
        self.amp = _DTYPES.get(inp.precision)
        # DeepSpeed's engine casts the model to bf16/fp16 (no autocast): build it in that dtype
        # (fake parameters cannot be swapped by .to()).
        cast = engine == "zero" and self.amp is not None
        default = torch.get_default_dtype()
        torch.set_default_dtype(self.amp if cast else default)  # type: ignore[arg-type]
        try:
            model = TinyGPT(inp.model_config(), activation_checkpointing=inp.activation_checkpointing)
        finally:
            torch.set_default_dtype(default)
        self.tp_mesh: object | None = None  # the tp dimension of a mesh layout (TP: loss_parallel)
        if engine == "fsdp":
            self._shard(model)
        if engine == "mesh":
            self._parallelize(model)
        self.model = model
        self.buckets = []
        if engine == "ddp" or (engine == "mesh" and self._ddp_wrapped()):
            # gradient_as_bucket_view: DDP's buckets persist and become the gradients at the
            # synchronising micro-step; no_sync micro-steps accumulate into separate gradients.
            self.buckets = [torch.zeros_like(p) for p in model.parameters()]
            if inp.grad_accum == 1:
                for p, b in zip(model.parameters(), self.buckets):
                    p.grad = b
        fused = inp.device == "cuda"
        # The hyperparameters move no byte: RunConfig's declared defaults, not literals of our own.
        adam = RunConfig(strategy="ddp")
        self.opt = torch.optim.AdamW(param_groups(model, inp.weight_decay), lr=adam.lr, betas=adam.adam_betas(),
                                     eps=adam.adam_eps, fused=fused, foreach=None if fused else True)
        T = inp.effective_seq_len()
        self.x = torch.zeros((inp.micro_batch, T), dtype=torch.long)
        self.y = torch.zeros((inp.micro_batch, T), dtype=torch.long)

    def _ddp_wrapped(self) -> bool:
        """DDP + TP: DDP's buckets hold the local gradients (traced as the ddp engine's)."""
        from shardbench.trainer.contract import STRATEGIES
        from shardbench.trainer.plan import mesh_forms as mesh

        return STRATEGIES[self.inp.strategy].engine == "ddp" and mesh.wrapped(self.inp)

    def _parallelize(self, model) -> None:
        """A mesh layout as the trainer builds it (trainer/parallel/mesh.py, tp.py, the strategies):
        the TP plan on the tp dimension, FSDP2 over the data-parallel part of the mesh."""
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        from shardbench.trainer.contract import STRATEGIES
        from shardbench.trainer.parallel import tp
        from shardbench.trainer.parallel.layout import DIMS
        from shardbench.trainer.plan import mesh_forms as closed

        inp = self.inp
        R, S = (inp.dp_replicate, closed.shard_degree(inp)) if STRATEGIES[inp.strategy].engine == "fsdp" else (
            inp.world_size // inp.tp, 1)
        with unset_fake_temporarily():  # a mesh's rank table is a real tensor
            degrees = {"pp": 1, "dp_replicate": R, "dp_shard": S, "tp": inp.tp}
            world = init_device_mesh("cpu", tuple(degrees[d] for d in DIMS), mesh_dim_names=DIMS)
        if inp.tp > 1:
            with unset_fake_temporarily():
                self.tp_mesh = world["tp"]
            tp.apply_tp(model, self.tp_mesh)
        if STRATEGIES[inp.strategy].engine == "fsdp" and closed.wrapped(inp):
            with unset_fake_temporarily():
                dp = world["dp_replicate", "dp_shard"] if R > 1 else world["dp_shard"]
            # FSDP2 over TP joins the dp and tp meshes into a new DeviceMesh (its rank table a real
            # tensor): built outside fake mode, as the meshes above
            concatenate = DeviceMesh.__dict__["_concatenate"]
            DeviceMesh._concatenate = staticmethod(_unfaked(concatenate.__func__))  # type: ignore[method-assign]
            try:
                self._shard(model, dp)
            finally:
                DeviceMesh._concatenate = concatenate  # type: ignore[method-assign]

    def _shard(self, model, mesh=None) -> None:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        from shardbench.trainer.strategies.fsdp import reshard_after_forward_plan
        from shardbench.trainer.strategies.base import REDUCE_DTYPES

        if mesh is None:
            with unset_fake_temporarily():  # a mesh's rank table is a real tensor
                mesh = DeviceMesh("cpu", list(range(self.inp.world_size)))
        mp = MixedPrecisionPolicy(param_dtype=self.amp, reduce_dtype=REDUCE_DTYPES[self.inp.grad_reduce_dtype])
        plan = reshard_after_forward_plan(len(model.blocks), self.inp.reshard_after_forward)
        for block, reshard in zip(model.blocks, plan):
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)

    def autocast(self):
        if self.amp is None or self.engine not in ("plain", "ddp", "mesh"):
            return contextlib.nullcontext()
        return torch.autocast(device_type="cpu", dtype=self.amp)

    def loss_context(self):
        """Tensor parallel: the loss and its backward on vocabulary-sharded logits."""
        from shardbench.trainer.parallel import tp

        return tp.loss_parallel() if self.tp_mesh is not None else tp.no_loss_parallel()

    def sample(self, trace: Trace) -> None:
        params = list(self.model.parameters())
        p = _storages_bytes(params)
        g = _storages_bytes([x.grad for x in params] + self._held_grads())
        o = _storages_bytes([v for s in self.opt.state.values() for v in s.values()
                             if isinstance(v, torch.Tensor) and v.dim() > 0])
        if p + g + o > trace.params_bytes + trace.grads_bytes + trace.optimizer_bytes:
            trace.params_bytes, trace.grads_bytes, trace.optimizer_bytes = p, g, o

    def warm_up(self) -> None:
        """AdamW's state, made as its first step makes it (no forward needed)."""
        for p in self.model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.opt.step()
        self.opt.zero_grad(set_to_none=not (self.buckets and self.inp.grad_accum == 1))

    def _held_grads(self) -> list:
        """FSDP's unsharded gradients kept between micro-steps (as FSDPStrategy.held_grads)."""
        if self.engine not in ("fsdp", "mesh"):
            return []
        from torch.distributed.fsdp import FSDPModule

        out = []
        for module in self.model.modules():
            group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
            for fsdp_param in group.fsdp_params if group else []:
                unsharded = fsdp_param.__dict__.get("_unsharded_param")
                out += [getattr(unsharded, "grad", None), fsdp_param.unsharded_accumulated_grad]
        return [t for t in out if t is not None]

    def run(self, trace: Trace | None = None, tracker: LiveTensors | None = None) -> None:
        accum = self.inp.grad_accum
        hooks = [] if tracker is None else [
            p.register_post_accumulate_grad_hook(lambda q: _in_backward(tracker, q))
            for p in self.model.parameters()]
        for micro in range(accum):
            if tracker is not None:
                tracker.phase = "forward"
            if self.inp.fsdp_grad_sync == "last_micro_step" and hasattr(self.model, "set_requires_gradient_sync"):
                self.model.set_requires_gradient_sync(micro == accum - 1)  # type: ignore[operator]
            with self.loss_context():
                with self.autocast():
                    _, loss = self.model(self.x, self.y)
                (loss / accum).backward()
            if self.buckets and accum > 1 and micro == accum - 1:
                for p, b in zip(self.model.parameters(), self.buckets):
                    b.copy_(p.grad)  # type: ignore[arg-type]
                    p.grad = b
            if trace is not None:
                self.sample(trace)
        for h in hooks:
            h.remove()
        if tracker is not None and trace is not None:
            trace.peak_fwd_bwd_bytes = tracker.peak
            trace.peak_fwd_less_grads_bytes = tracker.peak_less_grads["forward"]
            trace.peak_bwd_less_grads_bytes = tracker.peak_less_grads["backward"]
            tracker.phase = "forward"
            trace.before_opt_bytes = tracker.live
            tracker.peak = tracker.live
        if self.engine == "mesh":  # the trainer's mesh norm (DTensor gradients of several meshes)
            from shardbench.trainer.parallel.tp import mesh_total_norm

            params = list(self.model.parameters())
            norm = mesh_total_norm([p.grad for p in params if p.grad is not None])
            torch.nn.utils.clip_grads_with_norm_(params, 1.0, norm)
        else:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        if trace is not None:
            self.sample(trace)
        self.opt.zero_grad(set_to_none=not (self.buckets and self.inp.grad_accum == 1))


def _unfaked(fn):
    def call(*args, **kwargs):
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            return fn(*args, **kwargs)
    return call


def engine_for(inp: PlanInput) -> str:
    """What to trace for the layout: DeepSpeed's model (cast to the run's precision), FSDP2 or
    DDP across the world, or the plain model (one torch rank)."""
    from shardbench.trainer.plan.planned_layout import deepspeed, sharded

    from shardbench.trainer.plan import mesh_forms as mesh

    lay = inp.layout
    if deepspeed(lay):
        return "zero"
    if mesh.is_mesh(inp):
        return "mesh"
    if inp.world_size > 1:
        return "fsdp" if sharded(lay, "params") else "ddp"
    return "plain"


def _in_backward(tracker: LiveTensors, param) -> None:
    """A gradient is accumulated: backward has begun (ZeRO-1/2 allocate their buckets now), and
    this gradient counts as one (DeepSpeed copies it into a bucket and frees it)."""
    tracker.phase = "backward"
    tracker.retag([param.grad], "grads")


def trace_step(inp: PlanInput, engine: str | None = None) -> Trace:
    """Peak live tensor bytes, model state and collectives of one step on rank 0, traced as
    `engine` (default: the one of inp's layout; inp.strategy is then not read)."""
    import time

    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from shardbench.trainer.comm import COUNTER

    engine = engine or engine_for(inp)
    world = inp.world_size if engine in ("fsdp", "mesh") else 1
    t0 = time.perf_counter()
    trace = Trace(engine=engine, world_size=world)
    COUNTER.install()
    gc.collect()
    # the mesh engine: FSDP2 over a TP-planned model reads the mesh's (real) rank table in its ops
    with fake_world(world), FakeTensorMode(allow_non_fake_inputs=engine == "mesh") as mode:
        step = _Step(inp, engine, mode)
        step.warm_up()
        gc.collect()
        tracker = LiveTensors()
        tracker.track(o for o in gc.get_objects() if isinstance(o, FakeTensor) and o.fake_mode is mode)
        trace.state_before_bytes = tracker.live
        tracker.tag = "step"
        COUNTER.reset()
        COUNTER.active = True
        try:
            with tracker:
                step.run(trace, tracker)
        finally:
            COUNTER.active = False
        trace.peak_opt_bytes = tracker.peak
        trace.peak_bytes = max(trace.peak_fwd_bwd_bytes, trace.peak_opt_bytes)
        # Calls and bytes: a fake group's "seconds" measure nothing.
        trace.comm = {op: {"calls": v["calls"], "bytes": v["bytes"]} for op, v in COUNTER.per_step(1).items()}
        COUNTER.reset()
        del step
    trace.seconds = time.perf_counter() - t0
    return trace
