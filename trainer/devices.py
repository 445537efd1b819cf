"""Device and precision choices, checked before anything starts."""
from __future__ import annotations

import os
import platform

import torch

from shardbench.trainer import env_info
from shardbench.trainer.config import ConfigError, RunConfig
from shardbench.trainer.rules import check_fits, device_error

# The oldest Linux driver each CUDA major version runs on (NVIDIA's CUDA compatibility guide:
# minor-version compatibility across 12.x from 525.60.13; CUDA 13 from 580.65.06).
MIN_DRIVER = {12: "525.60.13", 13: "580.65.06"}
OLD_DRIVER_VARIANT = "VARIANT=cu126 (CUDA 12.6 wheels on a CUDA 12.6 base, driver R560+)"
"""The image for drivers older than R580 (Dockerfile): PyTorch 2.13 has no CUDA 12.8 wheels."""


class CudaUnusable(RuntimeError):
    """--device cuda, but CUDA cannot run here: the run fails with a record saying why."""


def usable_device(cfg: RunConfig, local_rank: int) -> tuple[torch.device, CudaUnusable | None]:
    """The rank's device, or (cpu, why) when --device cuda cannot run: the caller raises `why`
    once a record exists, so the failure is a result row, not a bare exit."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        return torch.device("cpu"), CudaUnusable(cuda_problem(env_info.cuda_driver()))
    if cfg.device == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu"), None
    return torch.device("cuda", local_rank % torch.cuda.device_count()), None


def cuda_problem(driver: dict[str, str | None], built: str | None = None) -> str:
    """Why torch sees no GPU, in terms of what the driver supports and what torch was built for."""
    built = torch.version.cuda if built is None else built
    torch_is = f"torch {torch.__version__}"
    if not built:
        return (f"--device cuda: {torch_is} is a CPU-only build: use the CUDA image "
                "(docker build without --build-arg VARIANT=cpu)")
    major = int(built.split(".")[0])
    needs = f"built for CUDA {built}" + (f", needs driver >= {MIN_DRIVER[major]}" if major in MIN_DRIVER else "")
    if not driver.get("driver") and not driver.get("driver_cuda"):
        return (f"--device cuda: no NVIDIA driver here (no /proc/driver/nvidia/version, no libcuda.so.1); "
                f"{torch_is} is {needs}: run on a GPU node with the NVIDIA container runtime and a GPU requested")
    has = f"driver {driver.get('driver') or '?'} supports CUDA up to {driver.get('driver_cuda') or '?'}"
    if driver.get("driver_cuda") and int(driver["driver_cuda"].split(".")[0]) < major:  # type: ignore[union-attr]
        return (f"--device cuda: the {has}, but {torch_is} is {needs}: build the image with "
                f"--build-arg {OLD_DRIVER_VARIANT} or upgrade the driver")
    visible = ", ".join(f"{k}={os.environ[k]!r}" for k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
                        if k in os.environ) or "no *_VISIBLE_DEVICES set"
    return f"--device cuda: torch sees no GPU although the {has} and {torch_is} is {needs} ({visible})"


def resolve_precision(cfg: RunConfig, device: torch.device) -> str:
    on_gpu = device.type == "cuda"
    bf16_ok = on_gpu and torch.cuda.is_bf16_supported()
    if cfg.precision == "auto":
        return "bf16" if bf16_ok else "fp32"
    if cfg.precision == "fp16" and not on_gpu:
        raise ConfigError("--precision fp16 needs a CUDA GPU (loss-scaled fp16 is slow and unsupported on CPU): use "
                          "fp32 or bf16")
    if cfg.precision == "bf16" and on_gpu and not bf16_ok:
        raise ConfigError(f"--precision bf16: {torch.cuda.get_device_name(device)} has no bf16 support: use fp16 or "
                          "fp32")
    return cfg.precision


def check_memory(cfg: RunConfig, device: torch.device, world_size: int, local_world_size: int) -> None:
    """Refuse (exit 2) a model whose state cannot fit, before anything is allocated: the kernel's
    OOM killer would otherwise end the run with no record. Every rank builds the full fp32 model
    on the host first, so the host must hold that too. Offloaded state (--offload) must fit the
    host, the rest the GPU; on a CPU run both are the host. Also the rules of the resolved device."""
    refusal = device_error(cfg, device.type)
    if refusal is None and device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        refusal = (check_fits(cfg, world_size, 1, free, f"GPU {device.index}", "device")
                   or check_fits(cfg, world_size, local_world_size, host_memory_available(), "this host", "host"))
    elif refusal is None:
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
