"""DistributedDataParallel (and the plain model at world size 1), with tensor parallelism inside
each data-parallel replica when --tp > 1 (DDP over the mesh's data-parallel dimension)."""
from __future__ import annotations

import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from shardbench.trainer.metrics import model_state, optimizer_state_tensors
from shardbench.trainer.parallel import pp as pipeline_parallel
from shardbench.trainer.parallel import tp as tensor_parallel
from shardbench.trainer.parallel.mesh import build_mesh
from shardbench.trainer.record import RankModelState
from shardbench.trainer.strategies.base import REDUCE_DTYPES, Context, Strategy, lr_lambda, make_adamw, param_groups


class TorchStrategy(Strategy):
    """Shared by DDP and FSDP: a torch optimizer, autocast or GradScaler, clip, LambdaLR; the
    layout's mesh, the tensor-parallel plan and the pipeline stages when the layout needs them.
    A subclass wraps one module (`wrap`: the whole model, or each pipeline stage)."""

    pipeline: pipeline_parallel.Pipeline | None = None
    """--pp > 1: this rank's stages and their schedule, which runs every micro-step itself."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        # fp16 needs loss scaling; bf16 has fp32's range and does not.
        self.scaler = torch.amp.GradScaler(ctx.device.type) if ctx.precision == "fp16" else None
        self.layout = ctx.layout
        self.mesh = build_mesh(self.layout, ctx.device.type) if ctx.distributed and self.layout.needs_mesh else None

    def setup(self, model):
        model = model.to(self.ctx.device)
        if self.layout.pp > 1:  # this rank's stages, each wrapped as a whole model would be
            cfg, coords = self.ctx.cfg, self.layout.coords(self.ctx.dist.rank)
            ids, n_stages, parts = pipeline_parallel.split_stages(model, self.layout, cfg.pp_schedule,
                                                                  cfg.pp_stages_per_rank, coords["pp"])
            parts = [self.wrap(part) for part in parts]
            self.pipeline = pipeline_parallel.Pipeline(parts, ids, n_stages, self.mesh.get_group("pp"),
                                                       cfg.pp_schedule, self.ctx.grad_accum, self.ctx.device)
            model = torch.nn.ModuleList(parts)
        else:
            model = self.wrap(model)
        self.build_optimizer(model)

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        raise NotImplementedError

    def pipeline_step(self, batches) -> torch.Tensor:
        """--pp: every micro-step through the schedule; the summed loss on the last stage's ranks."""
        with self.loss_context(), self.autocast():
            return self.pipeline.step(batches)  # type: ignore[union-attr]

    def shared_loss(self, step_loss: torch.Tensor) -> torch.Tensor:
        if self.pipeline is None:
            return step_loss
        import torch.distributed as dist

        step_loss = step_loss.clone()  # only the last stage's ranks hold it: summed over the pipeline
        dist.all_reduce(step_loss, group=self.mesh.get_group("pp"))  # type: ignore[union-attr]
        return step_loss

    def apply_tp(self, model: torch.nn.Module) -> None:
        if self.mesh is not None and self.layout.tp > 1:
            tensor_parallel.apply_tp(model, self.mesh["tp"])

    def build_optimizer(self, model: torch.nn.Module) -> None:
        self.model = model
        # Kept: DDP over tensor-parallel parameters swaps the module's parameters for its own
        # views at each forward, so the list is taken once, as the optimizer holds it.
        self.params = [p for p in model.parameters()]
        self.optimizer = make_adamw(param_groups(model, self.ctx.cfg.weight_decay), self.ctx)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(self.ctx.cfg))

    def no_sync(self, last: bool):
        return contextlib.nullcontext()

    def loss_context(self):
        """Tensor parallel: the loss and its backward on vocabulary-sharded logits."""
        return tensor_parallel.loss_parallel() if self.layout.tp > 1 and self.mesh is not None \
            else contextlib.nullcontext()

    def forward_backward(self, x, y, last):
        with self.no_sync(last), self.loss_context():
            with self.autocast():
                _, loss = self.model(x, y)
            scaled = loss / self.ctx.grad_accum
            (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        loss = loss.detach()
        return loss.full_tensor() if hasattr(loss, "full_tensor") else loss  # TP: a replicated DTensor

    def total_norm(self) -> torch.Tensor:
        """The global gradient norm."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if self.mesh is not None:  # DTensor gradients on a mesh: see mesh_total_norm
            return tensor_parallel.mesh_total_norm(grads)
        return torch.nn.utils.get_total_norm(grads)

    def step(self, last):
        if not last:
            return
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        # The norm is recorded every step (the loss check compares it), clipped or not.
        self._norm = self.total_norm()
        if self.pipeline is not None:  # each rank's stages: the squares summed over the pipeline
            self._norm = pipeline_parallel.across_stages(self._norm, self.mesh.get_group("pp"))
        if self.ctx.cfg.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.ctx.cfg.grad_clip, self._norm)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def grad_norm(self) -> float | None:
        norm = getattr(self, "_norm", None)
        if norm is None:
            return None
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a DTensor
        return float(norm)

    def held_grads(self) -> list[torch.Tensor]:
        """Gradients kept somewhere else than the parameters' .grad (FSDP's unsharded ones)."""
        return []

    def model_state(self) -> RankModelState:
        params = self.params
        return model_state(self.ctx.dist.rank, params=params,
                           grads=[p.grad for p in params] + self.held_grads(),
                           optimizer=optimizer_state_tensors(self.optimizer), on_host=self.ctx.state.on_host,
                           device=self.ctx.device)


class DDPStrategy(TorchStrategy):
    name = "ddp"
    dp_group = None
    """--pp with more than one data-parallel rank: the group the stages' gradients are averaged
    over after the schedule (pp.all_reduce_grads; torch's DDP fails under PipelineStage)."""

    def pipeline_step(self, batches):
        loss = super().pipeline_step(batches)
        if self.dp_group is not None:
            pipeline_parallel.all_reduce_grads(self.params, self.dp_group, int(self.ctx.cfg.bucket_mib * 2 ** 20),
                                               REDUCE_DTYPES[self.ctx.cfg.grad_reduce_dtype])
        return loss

    def wrap(self, model):
        self.apply_tp(model)
        self.tp_group = None
        if self.ctx.distributed and self.layout.dp > 1:
            group = None  # the world, as before meshes
            if self.mesh is not None:
                group = self.mesh.get_group("dp_replicate")
                if self.layout.pp > 1:  # stages stay unwrapped: gradients averaged after the schedule
                    self.dp_group = group
                    return model
                if self.layout.tp > 1:
                    self.tp_group = self.mesh.get_group("tp")
                    tensor_parallel.localize_for_ddp(model)
            # gradient_as_bucket_view: grads live in DDP's buckets instead of beside them.
            device_ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
            model = DDP(model, device_ids=device_ids, gradient_as_bucket_view=True,
                        bucket_cap_mb=self.ctx.cfg.bucket_mib, process_group=group)
            model.register_comm_hook(*self.comm_hook(group))
        return model

    def total_norm(self) -> torch.Tensor:
        if self.tp_group is None:
            return super().total_norm()
        return tensor_parallel.local_total_norm(self.params, self.tp_group)  # type: ignore[arg-type]

    @property
    def hook(self) -> str:
        """The gradient hook this run uses: --ddp-comm-hook, bf16 also for --grad-reduce-dtype bf16
        (one hook, two spellings), none where nothing is all-reduced (one data-parallel rank)."""
        if not (self.ctx.distributed and self.layout.dp > 1):
            return "none"
        cfg = self.ctx.cfg
        return "bf16" if cfg.ddp_comm_hook == "none" and cfg.grad_reduce_dtype == "bf16" else cfg.ddp_comm_hook

    def comm_hook(self, group):
        """(state, hook) for DDP.register_comm_hook. Every hook all-reduces through Python's
        dist.all_reduce (the same collective DDP's built-in C++ path issues) so that trainer.comm
        can count it: fp32 (default_hooks.allreduce_hook), our bf16 hook, or PowerSGD."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        state, hook = group, {"none": default_hooks.allreduce_hook, "bf16": bf16_allreduce_hook}.get(self.hook)
        if self.hook == "powersgd":
            # powerSGD_hook, not batched_powerSGD_hook: torch 2.13's batched one always fails an
            # assertion. Its first POWERSGD_START_STEP steps are plain all-reduces (torch needs
            # >= 2 with error feedback); the loss drifts from the first compressed step on.
            state = powerSGD_hook.PowerSGDState(
                process_group=group, matrix_approximation_rank=self.ctx.cfg.powersgd_rank,
                start_powerSGD_iter=POWERSGD_START_STEP, random_seed=self.ctx.cfg.seed)
            hook = powerSGD_hook.powerSGD_hook
        self.buckets: dict[int, torch.Tensor] = {}

        def remembering(state, bucket):
            # DDP's gradient buckets live in C++; a reference here lets the memory step's
            # tensor count (trainer/plan/live.py) see them between steps, when .grad is None.
            self.buckets[bucket.index()] = bucket.buffer()
            return hook(state, bucket)

        return state, remembering

    def recorded(self) -> dict:
        hook = self.hook
        return {"bucket_mib": self.ctx.cfg.bucket_mib, "ddp_comm_hook": hook,
                "powersgd_rank": self.ctx.cfg.powersgd_rank if hook == "powersgd" else None,
                "grad_reduce_dtype": "bf16" if hook == "bf16" else self.ctx.cfg.grad_reduce_dtype}

    @property
    def compute_path(self) -> str:
        if self.ctx.amp_dtype is None:
            return "fp32"
        return (f"torch.autocast {self.ctx.precision}: matmuls in {self.ctx.precision}, "
                "fp32 parameters, gradients and optimizer")

    def no_sync(self, last):
        # Skip the all-reduce on every micro-step but the last: grads accumulate locally.
        if isinstance(self.model, DDP) and not last:
            return self.model.no_sync()
        return contextlib.nullcontext()


POWERSGD_START_STEP = 2
"""Optimizer steps all-reduced exactly before PowerSGD compresses (torch's start_powerSGD_iter)."""


def bf16_allreduce_hook(group, bucket):
    """Average a bucket in bf16 and write it back into the fp32 bucket. torch's own
    bf16_compress_hook does the same but refuses anything but NCCL/XCCL (gloo on CPU too)."""
    import torch.distributed as dist

    group = group if group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    reduced = buffer.to(torch.bfloat16).div_(group.size())

    def write_back(fut):
        buffer.copy_(fut.value()[0])
        return buffer

    return dist.all_reduce(reduced, group=group, async_op=True).get_future().then(write_back)
