"""What every strategy provides to the training loop, and the pieces they share."""
from __future__ import annotations

import contextlib
import math
from typing import Any
from dataclasses import dataclass

import torch

from shardbench.trainer.config import RunConfig
from shardbench.trainer.contract import StateLayout, state_layout
from shardbench.trainer.dist_env import DistEnv
from shardbench.trainer.parallel.layout import Layout
from shardbench.trainer.record import RankModelState


# --grad-reduce-dtype -> torch dtype; every strategy reduces gradients in this one dtype.
REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class Context:
    """Where and how this rank runs."""

    cfg: RunConfig
    dist: DistEnv
    device: torch.device
    precision: str
    """fp32, bf16 or fp16 (auto already resolved)."""
    grad_accum: int
    distributed: bool
    """True when a process group with world_size > 1 exists."""

    @property
    def layout(self) -> Layout:
        """The run's degrees on the (dp_replicate, dp_shard, tp) mesh."""
        return Layout.of(self.cfg, self.dist.world_size)

    @property
    def state(self) -> StateLayout:
        """Where the run keeps each kind of model state (the preset with --offload applied)."""
        return state_layout(self.cfg.strategy, self.cfg.offload)

    @property
    def amp_dtype(self) -> torch.dtype | None:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)


def lr_lambda(cfg: RunConfig):
    """Linear warm-up over lr_warmup_steps, then cosine decay to 10% of the peak at the last step."""
    warm, total = cfg.lr_warmup_steps, cfg.steps

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = min(1.0, (step - warm) / max(1, total - warm))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices and embeddings, not biases and LayerNorm weights (GPT-2 / nanoGPT)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def make_adamw(groups: list[dict], ctx: Context) -> torch.optim.AdamW:
    # fused AdamW on GPU (one kernel for all params); the default foreach path on CPU.
    fused = ctx.device.type == "cuda"
    return torch.optim.AdamW(groups, lr=ctx.cfg.lr, betas=ctx.cfg.adam_betas(), eps=ctx.cfg.adam_eps,
                             fused=fused)


class Strategy:
    """One distributed strategy: wraps the model, runs micro-steps and optimizer steps."""

    name = "base"
    pipeline: Any = None
    """Set when a pipeline schedule runs every micro-step itself (--pp > 1): StepRunner then calls
    `pipeline_step(batches)` once per step instead of `forward_backward` per micro-step."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def setup(self, model: torch.nn.Module) -> None:
        raise NotImplementedError

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, last: bool) -> torch.Tensor:
        """Forward and backward one micro-batch; returns its (detached) mean loss. `last` marks
        the final micro-step of the optimizer step (gradient sync happens there)."""
        raise NotImplementedError

    def step(self, last: bool) -> None:
        """Called after every micro-step; at the last one: clip, step, schedule, zero grads."""
        raise NotImplementedError

    def pipeline_step(self, batches) -> torch.Tensor:
        """--pp: every micro-step of one optimizer step through the schedule; the summed loss."""
        raise NotImplementedError

    def shared_loss(self, step_loss: torch.Tensor) -> torch.Tensor:
        """The step's summed loss as every rank reports it (outside the timer; --pp: only the last
        stage's ranks computed it)."""
        return step_loss

    def grad_norm(self) -> float | None:
        """Global gradient norm (before clipping) of the last optimizer step; read outside the
        timed window (it synchronizes with the device)."""
        return None

    def model_state(self) -> RankModelState:
        """Bytes of params, grads, optimizer state, master copies and communication buffers this
        rank holds right now (the trainer samples it through one untimed step)."""
        raise NotImplementedError

    def recorded(self) -> dict:
        """Record fields only this strategy fills (ResultRecord names), e.g. fsdp's gradient sync."""
        return {}

    @property
    def float8_all_gather(self) -> bool:
        """Whether this strategy all-gathers --float8 weights in float8 (FSDP2, tensorwise)."""
        return False

    @property
    def compute_path(self) -> str:
        """How this strategy computes in the run's precision (recorded)."""
        return "fp32" if self.ctx.amp_dtype is None else f"torch.autocast {self.ctx.precision}"

    def autocast(self):
        dtype = self.ctx.amp_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.ctx.device.type, dtype=dtype)
