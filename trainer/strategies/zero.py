"""DeepSpeed ZeRO stages 1, 2 and 3.

The JSON config comes from trainer/ds_configs/<strategy>.json (or --deepspeed-config); the
trainer writes the batch sizes, clipping and precision into it as integers/booleans, never
"auto", so the config that ran is exactly the one recorded. The optimizer is a torch AdamW handed
to deepspeed.initialize: DeepSpeed's own config "optimizer" block would JIT-compile a CPU Adam
(~85 s) on CPU, and the same optimizer everywhere keeps losses comparable with DDP and FSDP.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from trainer.contract import STRATEGIES
from trainer.metrics import model_state, optimizer_state_tensors
from trainer.record import RankModelState
from trainer.strategies.base import Context, Strategy, lr_lambda, make_adamw, param_groups

CONFIG_DIR = Path(__file__).resolve().parent.parent / "ds_configs"


def deepspeed_config(ctx: Context) -> dict:
    cfg = ctx.cfg
    path = Path(cfg.deepspeed_config) if cfg.deepspeed_config else CONFIG_DIR / f"{cfg.strategy}.json"
    ds = json.loads(path.read_text())
    stage = STRATEGIES[cfg.strategy].zero_stage
    ds.setdefault("zero_optimization", {})["stage"] = stage
    micro, accum, world = cfg.micro_batch, ctx.grad_accum, ctx.dist.world_size
    ds["train_micro_batch_size_per_gpu"] = int(micro)
    ds["gradient_accumulation_steps"] = int(accum)
    ds["train_batch_size"] = int(micro * accum * world)
    ds["gradient_clipping"] = float(cfg.grad_clip)
    ds.setdefault("bf16", {})["enabled"] = ctx.precision == "bf16"
    ds.setdefault("fp16", {})["enabled"] = ctx.precision == "fp16"
    ds.pop("optimizer", None)  # ours is passed in: see the module docstring
    ds.pop("scheduler", None)
    return ds


def _tensors(value) -> list[torch.Tensor]:
    """Tensors inside DeepSpeed's bookkeeping (a tensor, or lists/dicts of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


class ZeroStrategy(Strategy):
    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.name = ctx.cfg.strategy

    def setup(self, model):
        import deepspeed

        self.ds_config = deepspeed_config(self.ctx)
        optimizer = make_adamw(param_groups(model, self.ctx.cfg.weight_decay), self.ctx)
        schedule = lr_lambda(self.ctx.cfg)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model.to(self.ctx.device),
            optimizer=optimizer,
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, schedule),
            config=self.ds_config,
            dist_init_required=False,  # trainer.train set up the process group already
        )
        self.model = self.engine.module

    def forward_backward(self, x, y, last):
        # The engine casts for bf16/fp16 and scales the loss by 1/grad_accum itself.
        _, loss = self.engine(x, y)
        self.engine.backward(loss)
        return loss.detach().float()

    def step(self, last):
        # DeepSpeed wants engine.step() after every micro-step; it clips, steps the optimizer
        # and the schedule only at the end of the accumulation cycle.
        self.engine.step()

    def model_state(self) -> RankModelState:
        opt = self.optimizer
        params = [getattr(p, "ds_tensor", p) for p in self.model.parameters()]
        grads = [p.grad for p in self.model.parameters()]
        for name in ("grads_in_partition", "averaged_gradients", "grad_partitions_flat_buffer"):
            grads += _tensors(getattr(opt, name, None))
        masters = []
        for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):
            masters += _tensors(getattr(opt, name, None))
        inner = getattr(opt, "optimizer", opt)
        return model_state(self.ctx.dist.rank, params, grads, masters + optimizer_state_tensors(inner))
