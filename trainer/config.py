"""The trainer's run configuration: one dataclass, its command line, and the checks that must
pass before any process group starts (a bad argument exits 2 with one line saying what to fix)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Literal

from trainer.presets import PRESETS, ModelConfig

STRATEGIES = ("ddp", "fsdp", "zero1", "zero2", "zero3")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")


class ConfigError(ValueError):
    """A bad argument: the message is one line that says what is wrong and how to fix it."""


@dataclass
class RunConfig:
    strategy: str
    """ddp, fsdp, zero1, zero2 or zero3."""
    model: str = "tiny"
    """Model preset name (trainer.model.PRESETS)."""
    n_layer: int | None = None
    """Override of the preset's layer count."""
    n_embd: int | None = None
    """Override of the preset's width."""
    n_head: int | None = None
    """Override of the preset's head count."""
    vocab_size: int | None = None
    """Override of the preset's vocabulary size."""
    seq_len: int | None = None
    """Tokens per sequence; None: the preset's default. At most the preset's block size."""
    micro_batch: int = 4
    """Sequences per rank per forward/backward."""
    grad_accum: int | None = None
    """Micro-steps per optimizer step; None: 1, or derived from global_batch."""
    global_batch: int | None = None
    """Sequences per optimizer step; when given, grad_accum = global_batch / (micro_batch x world)."""
    steps: int = 100
    """Optimizer steps, warm-up included."""
    warmup_steps: int = 10
    """Steps excluded from every metric (allocator, autotuning, compilation settle)."""
    precision: str = "auto"
    """fp32, bf16 (autocast / mixed precision), fp16 (with loss scaling), auto: bf16 on a GPU
    that has it, else fp32."""
    seed: int = 1234
    """Seeds the model's initial weights and the synthetic tokens: same seed, same run."""
    lr: float = 1e-4
    """Peak AdamW learning rate."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables it."""
    lr_warmup_steps: int = 5
    """Linear learning-rate warm-up steps, then cosine decay to 10% at the last step."""
    grad_reduce_dtype: Literal["fp32", "bf16"] = "fp32"
    """Dtype gradients are reduced in, the same for every strategy: DDP's comm hook, FSDP's
    MixedPrecisionPolicy reduce_dtype, DeepSpeed's communication_data_type."""
    fsdp_grad_sync: Literal["every_micro_step", "last_micro_step"] = "every_micro_step"
    """fsdp only: reduce-scatter gradients after every micro-step (torchtitan's default: sharded
    gradients, the honest memory figure) or only after the last one (unsharded gradients are
    held between micro-steps, fewer collectives)."""
    threads_per_rank: int = 1
    """CPU threads of every rank whatever the world size (1 rank = 1 core, like 1 GPU); each
    rank is pinned to its own cores when the machine has enough."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in backward (memory for compute)."""
    compile: bool = False
    """torch.compile each transformer block."""
    device: str = "auto"
    """auto (cuda when present), cpu or cuda."""
    deepspeed_config: str | None = None
    """DeepSpeed JSON config; None: trainer/ds_configs/<strategy>.json."""
    output_dir: str | None = None
    """Where rank 0 writes result.json (atomically)."""
    pg_timeout_s: float = 300.0
    """Process-group timeout: a rank that dies ends the others within this many seconds."""
    run_id: str | None = None
    """Recorded run id; None: built from the strategy, world size, seq len and batch."""
    launcher: str | None = None
    """Recorded launcher name; None: detected from the environment."""
    shape: str | None = None
    """Recorded GPU shape (values file name)."""
    peak_tflops: float | None = None
    """Peak dense TFLOP/s of one device for MFU; None: looked up from the device name."""
    usd_per_gpu_hour: float | None = None
    """Price of one device-hour, recorded for the cost report."""
    progress_every: int = 1
    """Print a progress line every N steps on rank 0."""
    argv: list[str] = field(default_factory=list)
    """The command line this config came from (recorded)."""

    def model_config(self) -> ModelConfig:
        base = PRESETS[self.model]
        overrides = {k: getattr(self, k) for k in ("n_layer", "n_embd", "n_head", "vocab_size")}
        return ModelConfig(**{**base.__dict__, **{k: v for k, v in overrides.items() if v is not None}})

    def effective_seq_len(self) -> int:
        return self.seq_len or PRESETS[self.model].default_seq_len

    def effective_grad_accum(self, world_size: int) -> int:
        if self.global_batch is not None:
            return self.global_batch // (self.micro_batch * world_size)
        return self.grad_accum or 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Train TinyGPT under one distributed strategy and print one result record.",
    )
    p.add_argument("--strategy", required=True, help=f"one of {', '.join(STRATEGIES)}")
    p.add_argument("--model", default="tiny", help=f"preset: {', '.join(PRESETS)}")
    for name in ("n-layer", "n-embd", "n-head", "vocab-size", "seq-len", "grad-accum", "global-batch"):
        p.add_argument(f"--{name}", type=int, default=None)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--precision", default="auto", help=f"one of {', '.join(PRECISIONS)}")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--lr-warmup-steps", type=int, default=5)
    p.add_argument("--grad-reduce-dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--fsdp-grad-sync", default="every_micro_step", choices=("every_micro_step", "last_micro_step"))
    p.add_argument("--threads-per-rank", type=int, default=1)
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--device", default="auto", help=f"one of {', '.join(DEVICES)}")
    p.add_argument("--deepspeed-config", default=None)
    p.add_argument("--output-dir", default=None)
    p.add_argument("--pg-timeout-s", type=float, default=300.0)
    p.add_argument("--run-id", default=None)
    p.add_argument("--launcher", default=None, help="recorded launcher name (default: detected)")
    p.add_argument("--shape", default=None)
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--usd-per-gpu-hour", type=float, default=None)
    p.add_argument("--progress-every", type=int, default=1)
    return p


def parse_args(argv: list[str]) -> RunConfig:
    """Parse the command line; argparse's own errors also exit 2."""
    ns = build_parser().parse_args(argv)
    return RunConfig(**vars(ns), argv=list(argv))


def validate(cfg: RunConfig, world_size: int) -> None:
    """Raise ConfigError for anything that cannot run. Device-dependent checks are in
    trainer.devices (they need torch.cuda)."""
    if cfg.strategy not in STRATEGIES:
        raise ConfigError(f"unknown strategy {cfg.strategy!r}: use one of {', '.join(STRATEGIES)}")
    if cfg.model not in PRESETS:
        raise ConfigError(f"unknown model preset {cfg.model!r}: use one of {', '.join(PRESETS)}")
    if cfg.precision not in PRECISIONS:
        raise ConfigError(f"unknown precision {cfg.precision!r}: use one of {', '.join(PRECISIONS)}")
    if cfg.device not in DEVICES:
        raise ConfigError(f"unknown device {cfg.device!r}: use one of {', '.join(DEVICES)}")
    for name in ("micro_batch", "steps", "n_layer", "n_embd", "n_head", "vocab_size", "seq_len",
                 "grad_accum", "global_batch", "progress_every", "threads_per_rank"):
        value = getattr(cfg, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if cfg.warmup_steps < 0 or cfg.warmup_steps >= cfg.steps:
        raise ConfigError(
            f"--warmup-steps {cfg.warmup_steps} leaves no measured step out of --steps {cfg.steps}: "
            "use fewer warm-up steps or more steps")
    if cfg.grad_accum is not None and cfg.global_batch is not None:
        raise ConfigError("give --grad-accum or --global-batch, not both")
    if cfg.global_batch is not None and cfg.global_batch % (cfg.micro_batch * world_size):
        raise ConfigError(
            f"--global-batch {cfg.global_batch} is not divisible by micro-batch {cfg.micro_batch} x "
            f"world size {world_size} = {cfg.micro_batch * world_size}: pick a multiple of it")
    mcfg = cfg.model_config()
    if mcfg.n_embd % mcfg.n_head:
        raise ConfigError(f"width {mcfg.n_embd} is not divisible by {mcfg.n_head} heads: change --n-embd or --n-head")
    seq = cfg.effective_seq_len()
    if seq > mcfg.block_size:
        raise ConfigError(
            f"--seq-len {seq} exceeds the {cfg.model} preset's maximum of {mcfg.block_size}: use at most {mcfg.block_size}")
    if cfg.pg_timeout_s <= 0:
        raise ConfigError(f"--pg-timeout-s must be positive, got {cfg.pg_timeout_s}")
    if cfg.deepspeed_config and not cfg.strategy.startswith("zero"):
        raise ConfigError(f"--deepspeed-config applies to zero1/zero2/zero3, not {cfg.strategy}")
