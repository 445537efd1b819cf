"""float8 training of TinyGPT's linears with torchao (`--float8 tensorwise|rowwise`), as torchtitan
does: every block's nn.Linear becomes torchao's Float8Linear (its matmuls in float8 e4m3 with
dynamic scales, one per tensor or one per row; weights, gradients and optimizer state stay in
their usual dtypes). The head is left alone: it is tied to the token embedding (a Float8Linear
would untie nothing but quantise the embedding's gradient too) and torchtitan keeps the output
projection in high precision. Under FSDP2 with tensorwise scales the converted weights are
all-gathered in float8 (`enable_fsdp_float8_all_gather`: 1 byte per element instead of the
param dtype's), their scales computed for all of them in one all-reduce after each optimizer step
(`precompute_float8_dynamic_scale_for_fsdp`). torchao allows that for tensorwise scales only.

Where float8 cannot run is said in one line before any process group starts (`problem`): torchao
missing, a CUDA GPU below compute capability 8.9, a torch whose float8 matmul (`torch._scaled_mm`)
refuses the device. torchao's import is deferred: it costs seconds and is needed by float8 runs only.
"""
from __future__ import annotations

import logging

import torch

RECIPES = ("tensorwise", "rowwise")
TORCHAO_PIN = "torchao==0.18.0"  # pyproject's float8 extra; the first release with torch 2.13 on CPU here
CUDA_MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada, Hopper and later


def problem(recipe: str, device: torch.device) -> str | None:
    """Why `--float8 recipe` cannot run on `device` (one line), or None."""
    if recipe == "off":
        return None
    try:
        _import_torchao(device)
    except ImportError as exc:
        return (f"--float8 {recipe} needs torchao ({exc}): pip install '{TORCHAO_PIN}' "
                "(scripts/bootstrap.sh installs it), or use --float8 off")
    if device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        if cap < CUDA_MIN_CAPABILITY:
            return (f"--float8 {recipe}: {torch.cuda.get_device_name(device)} (compute capability "
                    f"{cap[0]}.{cap[1]}) has no float8 matmul (needs 8.9+: Ada, Hopper): use --float8 off")
    try:  # what every Float8Linear calls; a torch build without it on this device fails here
        a = torch.ones(16, 16, device=device).to(torch.float8_e4m3fn)
        one = torch.ones((), device=device)
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    except (RuntimeError, NotImplementedError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (f"--float8 {recipe}: torch {torch.__version__} has no float8 matmul on {device.type} ({first}): "
                "use --float8 off")
    return None


def _import_torchao(device: torch.device) -> None:
    """Import torchao.float8. On CPU quietly: torchao warns that its CUDA kernels (cutlass, mxfp8)
    fail to load, which float8 training does not use."""
    quiet = device.type == "cpu"
    log = logging.getLogger("torchao")
    level = log.level
    if quiet:
        log.setLevel(logging.ERROR)
    try:
        import torchao.float8  # noqa: F401
    finally:
        log.setLevel(level)


def _block_linear(module: torch.nn.Module, fqn: str) -> bool:
    """Convert the blocks' linears whose dimensions float8 matmuls take (multiples of 16); not the head."""
    if not isinstance(module, torch.nn.Linear) or not fqn.startswith("blocks."):
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def convert(model: torch.nn.Module, recipe: str, fsdp_all_gather: bool) -> int:
    """Swap the blocks' linears for Float8Linear in place (before FSDP wraps them); returns how many."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe)
    if fsdp_all_gather:
        config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)  # tensorwise only (torchao)
    before = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    convert_to_float8_training(model, config=config, module_filter_fn=_block_linear)
    from torchao.float8.float8_linear import Float8Linear

    converted = sum(isinstance(m, Float8Linear) for m in model.modules())
    assert converted and converted < before, "float8: no block linear converted, or the head too"
    return converted


def all_gather_applies(recipe: str, sharded: bool) -> bool:
    """FSDP2 all-gathers float8 weights: a sharded model under tensorwise scales."""
    return sharded and recipe == "tensorwise"


def precompute_scales(model: torch.nn.Module) -> None:
    """After the optimizer step: the float8 all-gather's scales, all weights in one all-reduce."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)
