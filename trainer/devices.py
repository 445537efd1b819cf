"""Device and precision choices, checked before anything starts."""
from __future__ import annotations

import platform

import torch

from trainer.config import ConfigError, RunConfig
from trainer.contract import check_fits


def resolve_device(cfg: RunConfig, local_rank: int) -> torch.device:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda but no CUDA GPU is visible: use --device cpu (or auto)")
    if cfg.device == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def resolve_precision(cfg: RunConfig, device: torch.device) -> str:
    on_gpu = device.type == "cuda"
    bf16_ok = on_gpu and torch.cuda.is_bf16_supported()
    if cfg.precision == "auto":
        return "bf16" if bf16_ok else "fp32"
    if cfg.precision == "fp16" and not on_gpu:
        raise ConfigError("--precision fp16 needs a CUDA GPU (loss-scaled fp16 is slow and unsupported on CPU): use fp32 or bf16")
    if cfg.precision == "bf16" and on_gpu and not bf16_ok:
        raise ConfigError(f"--precision bf16: {torch.cuda.get_device_name(device)} has no bf16 support: use fp16 or fp32")
    return cfg.precision


def check_memory(cfg: RunConfig, device: torch.device, world_size: int, local_world_size: int) -> None:
    """Refuse (exit 2) a model whose state cannot fit, before anything is allocated: the kernel's
    OOM killer would otherwise end the run with no record. Every rank builds the full fp32 model
    on the host first, so the host must hold that too."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        refusal = check_fits(cfg, world_size, 1, free, f"GPU {device.index}")
    else:
        refusal = check_fits(cfg, world_size, local_world_size, host_memory_available(), "this host")
    if refusal:
        raise ConfigError(refusal)


def host_memory_available() -> int:
    """MemAvailable from /proc/meminfo in bytes (a huge number where it cannot be read)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 62


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"
