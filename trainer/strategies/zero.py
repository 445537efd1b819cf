"""DeepSpeed ZeRO stages 1, 2 and 3, with the layout's state on the device or the host (ZeRO-Offload)
and ZeRO++ (hpZ; qwZ/qgZ on a GPU).

The JSON config comes from trainer/ds_configs/zero<stage>.json (or --deepspeed-config); the
trainer writes the batch sizes, clipping and precision into it as integers/booleans, never
"auto", so the config that ran is exactly the one recorded. The optimizer is a torch AdamW handed
to deepspeed.initialize: DeepSpeed's own config "optimizer" block would JIT-compile a CPU Adam
(~85 s) on CPU, and the same optimizer everywhere keeps losses comparable with DDP and FSDP.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from shardbench.trainer import ds_knobs
from shardbench.trainer.metrics import StorageCounter, model_state, optimizer_state_tensors, with_comm_buffer_bytes
from shardbench.trainer.record import RankModelState
from shardbench.trainer.strategies.base import Context, Strategy, lr_lambda, make_adamw, param_groups

def deepspeed_config(ctx: Context, model=None) -> dict:
    """The DeepSpeed config of this run; `model` (TinyGPT) sizes ZeRO-3's prefetch to one block."""
    cfg = ctx.cfg
    state = ctx.state
    stage = state.zero_stage
    path = Path(cfg.deepspeed_config) if cfg.deepspeed_config else ds_knobs.config_path(stage)  # type: ignore[arg-type]
    ds = json.loads(path.read_text())
    ds.setdefault("zero_optimization", {})["stage"] = stage
    micro, accum, world = cfg.micro_batch, ctx.grad_accum, ctx.dist.world_size
    ds["train_micro_batch_size_per_gpu"] = int(micro)
    ds["gradient_accumulation_steps"] = int(accum)
    ds["train_batch_size"] = int(micro * accum * world)
    ds["gradient_clipping"] = float(cfg.grad_clip)
    ds.setdefault("bf16", {})["enabled"] = ctx.precision == "bf16"
    ds.setdefault("fp16", {})["enabled"] = ctx.precision == "fp16"
    # One gradient-reduction dtype for every strategy (DeepSpeed's default follows the model's
    # dtype: bf16 gradients would move half the bytes of DDP's and FSDP's fp32 reductions).
    ds["communication_data_type"] = cfg.grad_reduce_dtype
    unit = None
    if stage == 3 and model is not None:
        threshold = int(ds["zero_optimization"].get("stage3_param_persistence_threshold", 100_000))
        unit = max(ds_knobs.unit_numel([p.numel() for p in b.parameters()], threshold) for b in model.blocks)
    ds_knobs.match_knobs(ds, cfg.bucket_mib, cfg.reshard_after_forward, stage, ctx.precision,  # type: ignore[arg-type]
                         cfg.grad_reduce_dtype, unit)
    ds_knobs.place_state(ds, state.on_host, cfg.zero_hpz_partition_size, cfg.zero_quantized_weights,
                         cfg.zero_quantized_gradients, pin_memory=ctx.device.type == "cuda")
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


# Where DeepSpeed 0.19's ZeRO optimizers keep what they hold (stage 1/2: DeepSpeedZeroOptimizer,
# stage 3: DeepSpeedZeroOptimizer_Stage3). Each name is read if present.
GRAD_ATTRS = ("grads_in_partition", "averaged_gradients", "grad_partitions_flat_buffer")
MASTER_ATTRS = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat")
# Reduce buckets: {dtype: bucket}, each bucket's .buffer a tensor (stage 3) or a list of them
# (stage 1/2: two when overlap_comm double-buffers).


def _bucket_tensors(opt) -> list[torch.Tensor]:
    buckets = getattr(opt, "ipg_buckets", None) or {}
    return [t for b in buckets.values() for t in _tensors(getattr(b, "buffer", None))]


def persist_root(optimizer, params: list) -> None:
    """Make ZeRO-3 keep the model's root parameters gathered, as FSDP keeps its root unit
    (tied embedding / lm_head, position embedding, final LayerNorm): without it the tied
    embedding was all-gathered at each of its four uses per micro-step. DeepSpeed 0.19 has no
    per-parameter setting, only a size threshold (which would persist every block too), so this
    does what its own threshold does at init: `ds_persist` (never released by the coordinator),
    the parameter in `persistent_parameters` (partitioned before the optimizer step, all-gathered
    after it) and gathered now."""
    added = [p for p in params if not getattr(p, "ds_persist", True)]
    for p in added:
        p.ds_persist = True
        optimizer.persistent_parameters.append(p)  # the same list as parameter_offload's
    if added:
        added[0].all_gather(added)


def import_deepspeed():
    """DeepSpeed, without the mlflow its autotuner imports when installed (the `tracking` extra):
    0.85 of DeepSpeed's 2.0 s import on every rank here, for a feature the trainer never uses."""
    from shardbench.trainer.deepspeed_runner import mlflow_hidden

    with mlflow_hidden():
        import deepspeed
    return deepspeed


class ZeroStrategy(Strategy):
    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.name = ctx.cfg.strategy

    def setup(self, model):
        deepspeed = import_deepspeed()
        self.ds_config = deepspeed_config(self.ctx, model)
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
        if self.ctx.state.zero_stage == 3:
            persist_root(self.optimizer, [p for name, p in self.model.named_parameters()
                                          if not name.startswith("blocks.")])
        else:
            self._count_buckets()

    def _count_buckets(self) -> None:
        """ZeRO-1/2 allocate their reduce buckets at backward's first gradient (setup_buckets)
        and free them at its end, before model_state() samples: remember what they were as
        allocated (their bytes, never the tensors: a reference would keep them alive)."""
        opt, setup = self.optimizer, getattr(self.optimizer, "setup_buckets", None)
        self.bucket_bytes = 0
        if setup is None:
            return

        def counted():
            setup()
            held = StorageCounter().add(_bucket_tensors(opt))
            self.bucket_bytes = max(self.bucket_bytes, held)
        opt.setup_buckets = counted

    def forward_backward(self, x, y, last):
        # The engine casts for bf16/fp16 and scales the loss by 1/grad_accum itself.
        _, loss = self.engine(x, y)
        self.engine.backward(loss)
        return loss.detach().float()

    def step(self, last):
        # DeepSpeed wants engine.step() after every micro-step; it clips, steps the optimizer
        # and the schedule only at the end of the accumulation cycle.
        self.engine.step()

    def grad_norm(self) -> float | None:
        norm = self.engine.get_global_grad_norm()
        return None if norm is None else float(norm)

    def recorded(self) -> dict:
        cfg = self.ctx.cfg
        out = {"bucket_mib": cfg.bucket_mib}
        if self.ctx.state.zero_stage == 3:  # only stage 3 gathers parameters
            out["reshard_after_forward"] = cfg.reshard_after_forward
        return out

    @property
    def compute_path(self) -> str:
        if self.ctx.amp_dtype is None:
            return "fp32"
        return (f"model cast to {self.ctx.precision} by the engine: every op, parameters and gradients in "
                f"{self.ctx.precision}; fp32 master partition and optimizer in DeepSpeed's ZeRO optimizer")

    def model_state(self) -> RankModelState:
        opt = self.optimizer
        params = [getattr(p, "ds_tensor", p) for p in self.model.parameters()]
        params += [getattr(p, "ds_secondary_tensor", None) for p in self.model.parameters()]  # ZeRO++ hpZ's copy
        grads = [p.grad for p in self.model.parameters()]
        for name in GRAD_ATTRS:
            grads += _tensors(getattr(opt, name, None))
        masters = []
        for name in MASTER_ATTRS:
            masters += _tensors(getattr(opt, name, None))
        grads += [m.grad for m in masters]  # ZeRO-Offload's fp32 gradient partition (on the host)
        inner = getattr(opt, "optimizer", opt)
        state = model_state(self.ctx.dist.rank, params=params, grads=grads, master=masters,
                            optimizer=optimizer_state_tensors(inner), comm_buffers=_bucket_tensors(opt),
                            on_host=self.ctx.state.on_host, device=self.ctx.device)
        # ZeRO-1/2: the buckets the backward just sampled held (freed at its end), as allocated.
        return with_comm_buffer_bytes(state, max(state.comm_buffer_bytes, getattr(self, "bucket_bytes", 0)))
