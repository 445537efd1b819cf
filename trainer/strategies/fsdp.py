"""PyTorch FSDP2: `fully_shard` on every block and then the root; full sharding (parameters,
gradients and optimizer state split across all ranks); bf16 parameters with fp32 gradient
reduction when bf16 is asked. At world size 1 it is the plain model (nothing to shard)."""
from __future__ import annotations

import contextlib

import torch

from trainer.strategies.ddp import TorchStrategy


class FSDPStrategy(TorchStrategy):
    name = "fsdp"

    def setup(self, model):
        model = model.to(self.ctx.device)
        if self.ctx.distributed:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mp = MixedPrecisionPolicy()
            if self.ctx.amp_dtype is not None:
                mp = MixedPrecisionPolicy(param_dtype=self.ctx.amp_dtype, reduce_dtype=torch.float32)
            for block in model.blocks:
                fully_shard(block, mp_policy=mp, reshard_after_forward=True)
            fully_shard(model, mp_policy=mp, reshard_after_forward=True)
        self.build_optimizer(model)

    def autocast(self):
        # Sharded: the mixed-precision policy casts parameters itself; unsharded: autocast.
        if self.ctx.distributed:
            return contextlib.nullcontext()
        return super().autocast()

    def no_sync(self, last):
        # Non-final micro-steps keep unsharded gradients locally instead of reduce-scattering.
        if self.ctx.distributed:
            self.model.set_requires_gradient_sync(last)
        return super().no_sync(last)
