"""PyTorch FSDP2: `fully_shard` on every block and then the root; full sharding (parameters,
gradients and optimizer state split across all ranks). At world size 1 it is the plain model
(nothing to shard).

As torchtitan does: the root (tied embedding / lm_head, final LayerNorm) and the last block are
not resharded after forward (backward needs them first, so re-gathering them would be wasted
all-gathers); every other block is. Gradients are reduce-scattered after every micro-step by
default (`--fsdp-grad-sync every_micro_step`, torchtitan's default: only sharded gradients are
held between micro-steps); `last_micro_step` keeps unsharded gradients until the last one.

On a mesh (trainer/parallel/): HSDP with --dp-replicate R (fully_shard over the 2-D replicate x
shard mesh: sharded inside each group, gradients all-reduced across groups), and FSDP2 over the
data-parallel dimensions of a model already split by tensor parallelism (2-D FSDP + TP).
"""
from __future__ import annotations

import contextlib

import torch

from shardbench.trainer.parallel import float8
from shardbench.trainer.parallel.mesh import dp_mesh
from shardbench.trainer.strategies.base import REDUCE_DTYPES
from shardbench.trainer.strategies.ddp import TorchStrategy


def reshard_after_forward_plan(n_blocks: int, reshard: bool = True) -> list[bool]:
    """Per block: resharded after forward? All but the last (torchtitan); none with
    --no-reshard-after-forward."""
    return [reshard and i < n_blocks - 1 for i in range(n_blocks)]


class FSDPStrategy(TorchStrategy):
    name = "fsdp"

    @property
    def sharded(self) -> bool:
        """FSDP wraps the model: more than one data-parallel rank (pure TP has one)."""
        return self.ctx.distributed and self.layout.dp > 1

    def wrap(self, model):
        self.apply_tp(model)
        if self.sharded:
            from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

            mesh = dp_mesh(self.mesh, self.layout) if self.mesh is not None else None  # None: the world
            mp = MixedPrecisionPolicy(param_dtype=self.ctx.amp_dtype,
                                      reduce_dtype=REDUCE_DTYPES[self.ctx.cfg.grad_reduce_dtype])
            # State on the host (--offload params): sharded parameters, gradients and the optimizer
            # step in CPU memory, each block copied to the device for its all-gather.
            place = ({"offload_policy": CPUOffloadPolicy(pin_memory=self.ctx.device.type == "cuda")}
                     if self.ctx.state.on_host else {})
            plan = reshard_after_forward_plan(len(model.blocks), self.ctx.cfg.reshard_after_forward)
            for block, reshard in zip(model.blocks, plan):
                fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard, **place)
            fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False, **place)
        return model

    @property
    def compute_path(self) -> str:
        if self.ctx.amp_dtype is None:
            return "fp32"
        if not self.sharded:
            return f"torch.autocast {self.ctx.precision} over fp32 parameters and gradients (unsharded)"
        return (f"parameters all-gathered in {self.ctx.precision} (MixedPrecisionPolicy param_dtype): "
                f"every op runs in {self.ctx.precision}; fp32 sharded parameters, gradients and optimizer")

    @property
    def float8_all_gather(self) -> bool:
        return float8.all_gather_applies(self.ctx.cfg.float8, self.sharded)

    def step(self, last):
        super().step(last)
        if last and self.float8_all_gather:  # the next all-gathers' scales, one all-reduce for all
            float8.precompute_scales(self.model)

    def autocast(self):
        # Sharded: the mixed-precision policy casts parameters itself; unsharded: autocast.
        if self.sharded:
            return contextlib.nullcontext()
        return super().autocast()

    def no_sync(self, last):
        if self.sharded and self.ctx.cfg.fsdp_grad_sync == "last_micro_step":
            # Non-final micro-steps keep unsharded gradients locally instead of reduce-scattering.
            self.model.set_requires_gradient_sync(last)
        return super().no_sync(last)

    def held_grads(self) -> list[torch.Tensor]:
        """Gradients FSDP keeps outside the sharded parameters' .grad: unsharded gradients
        accumulated between micro-steps without reduce-scatter."""
        if not self.sharded:
            return []
        from torch.distributed.fsdp import FSDPModule

        out = []
        for module in self.model.modules():
            if not isinstance(module, FSDPModule):
                continue
            group = module._get_fsdp_state()._fsdp_param_group
            for fsdp_param in group.fsdp_params if group else []:
                unsharded = fsdp_param.__dict__.get("_unsharded_param")
                out.append(getattr(unsharded, "grad", None))
                out.append(fsdp_param.unsharded_accumulated_grad)
        return [t for t in out if t is not None]

    def recorded(self) -> dict:
        # No bucket_mib: FSDP2 communicates per module (the record says None, not a size it ignored).
        # Under a pipeline, PipelineStage turns FSDP's gradient sync off for every micro-batch and
        # reduce-scatters once after the last (perform_reduce_grad): last_micro_step, whatever the knob.
        sync = self.ctx.cfg.fsdp_grad_sync if self.pipeline is None else "last_micro_step"
        return {"fsdp_grad_sync": sync,
                "reshard_after_forward": self.ctx.cfg.reshard_after_forward,
                "float8_all_gather": self.float8_all_gather if self.ctx.cfg.float8 != "off" else None}
