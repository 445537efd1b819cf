"""PyTorch FSDP2: `fully_shard` on every block and then the root; full sharding (parameters,
gradients and optimizer state split across all ranks). At world size 1 it is the plain model
(nothing to shard).

As torchtitan does: the root (tied embedding / lm_head, final LayerNorm) and the last block are
not resharded after forward (backward needs them first, so re-gathering them would be wasted
all-gathers); every other block is. Gradients are reduce-scattered after every micro-step by
default (`--fsdp-grad-sync every_micro_step`, torchtitan's default: only sharded gradients are
held between micro-steps); `last_micro_step` keeps unsharded gradients until the last one.
"""
from __future__ import annotations

import contextlib

import torch

from shardbench.trainer.strategies.base import REDUCE_DTYPES
from shardbench.trainer.strategies.ddp import TorchStrategy


def reshard_after_forward_plan(n_blocks: int, reshard: bool = True) -> list[bool]:
    """Per block: resharded after forward? All but the last (torchtitan); none with
    --no-reshard-after-forward."""
    return [reshard and i < n_blocks - 1 for i in range(n_blocks)]


class FSDPStrategy(TorchStrategy):
    name = "fsdp"

    def setup(self, model):
        model = model.to(self.ctx.device)
        if self.ctx.distributed:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mp = MixedPrecisionPolicy(param_dtype=self.ctx.amp_dtype,
                                      reduce_dtype=REDUCE_DTYPES[self.ctx.cfg.grad_reduce_dtype])
            plan = reshard_after_forward_plan(len(model.blocks), self.ctx.cfg.reshard_after_forward)
            for block, reshard in zip(model.blocks, plan):
                fully_shard(block, mp_policy=mp, reshard_after_forward=reshard)
            fully_shard(model, mp_policy=mp, reshard_after_forward=False)
        self.build_optimizer(model)

    @property
    def compute_path(self) -> str:
        if self.ctx.amp_dtype is None:
            return "fp32"
        if not self.ctx.distributed:
            return f"torch.autocast {self.ctx.precision} over fp32 parameters and gradients (unsharded)"
        return (f"parameters all-gathered in {self.ctx.precision} (MixedPrecisionPolicy param_dtype): "
                f"every op runs in {self.ctx.precision}; fp32 sharded parameters, gradients and optimizer")

    def autocast(self):
        # Sharded: the mixed-precision policy casts parameters itself; unsharded: autocast.
        if self.ctx.distributed:
            return contextlib.nullcontext()
        return super().autocast()

    def no_sync(self, last):
        if self.ctx.distributed and self.ctx.cfg.fsdp_grad_sync == "last_micro_step":
            # Non-final micro-steps keep unsharded gradients locally instead of reduce-scattering.
            self.model.set_requires_gradient_sync(last)
        return super().no_sync(last)

    def held_grads(self) -> list[torch.Tensor]:
        """Gradients FSDP keeps outside the sharded parameters' .grad: unsharded gradients
        accumulated between micro-steps without reduce-scatter."""
        if not self.ctx.distributed:
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
        return {"fsdp_grad_sync": self.ctx.cfg.fsdp_grad_sync,
                "reshard_after_forward": self.ctx.cfg.reshard_after_forward}
