"""DistributedDataParallel (and the plain model at world size 1)."""
from __future__ import annotations

import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from shardbench.trainer.metrics import model_state, optimizer_state_tensors
from shardbench.trainer.record import RankModelState
from shardbench.trainer.strategies.base import Context, Strategy, lr_lambda, make_adamw, param_groups


class TorchStrategy(Strategy):
    """Shared by DDP and FSDP: a torch optimizer, autocast or GradScaler, clip, LambdaLR."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        # fp16 needs loss scaling; bf16 has fp32's range and does not.
        self.scaler = torch.amp.GradScaler(ctx.device.type) if ctx.precision == "fp16" else None

    def build_optimizer(self, model: torch.nn.Module) -> None:
        self.model = model
        self.optimizer = make_adamw(param_groups(model, self.ctx.cfg.weight_decay), self.ctx)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(self.ctx.cfg))

    def no_sync(self, last: bool):
        return contextlib.nullcontext()

    def forward_backward(self, x, y, last):
        with self.no_sync(last):
            with self.autocast():
                _, loss = self.model(x, y)
            scaled = loss / self.ctx.grad_accum
            (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        return loss.detach()

    def step(self, last):
        if not last:
            return
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        # The norm is recorded every step (the loss check compares it), clipped or not.
        if self.ctx.cfg.grad_clip > 0:
            self._norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.ctx.cfg.grad_clip)
        else:
            self._norm = torch.nn.utils.get_total_norm([p.grad for p in self.model.parameters() if p.grad is not None])
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
        params = list(self.model.parameters())
        return model_state(self.ctx.dist.rank, params=params,
                           grads=[p.grad for p in params] + self.held_grads(),
                           optimizer=optimizer_state_tensors(self.optimizer))


class DDPStrategy(TorchStrategy):
    name = "ddp"

    def setup(self, model):
        model = model.to(self.ctx.device)
        if self.ctx.distributed:
            # gradient_as_bucket_view: grads live in DDP's buckets instead of beside them.
            device_ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
            model = DDP(model, device_ids=device_ids, gradient_as_bucket_view=True,
                        bucket_cap_mb=self.ctx.cfg.bucket_mib)
            model.register_comm_hook(None, self.comm_hook())
        self.build_optimizer(model)

    def comm_hook(self):
        """The gradient all-reduce in --grad-reduce-dtype, through Python's dist.all_reduce (the
        same collective DDP's built-in C++ path issues) so that trainer.comm can count it."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = default_hooks.allreduce_hook if self.ctx.cfg.grad_reduce_dtype == "fp32" else bf16_allreduce_hook
        self.buckets: dict[int, torch.Tensor] = {}

        def remembering(state, bucket):
            # DDP's gradient buckets live in C++; a reference here lets the memory step's
            # tensor count (trainer/plan/live.py) see them between steps, when .grad is None.
            self.buckets[bucket.index()] = bucket.buffer()
            return hook(state, bucket)

        return remembering

    def recorded(self) -> dict:
        return {"bucket_mib": self.ctx.cfg.bucket_mib}

    @property
    def compute_path(self) -> str:
        if self.ctx.amp_dtype is None:
            return "fp32"
        return (f"torch.autocast {self.ctx.precision}: matmuls in {self.ctx.precision}, "
                "fp32 parameters, gradients and optimizer")

    def no_sync(self, last):
        # Skip the all-reduce on every micro-step but the last: grads accumulate locally.
        if self.ctx.distributed and not last:
            return self.model.no_sync()
        return contextlib.nullcontext()


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
