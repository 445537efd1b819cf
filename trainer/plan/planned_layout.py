"""The layout a plan is made for (torch-free): the strategy's row of trainer/contract.py, with
--offload applied, read as attributes (engine, ZeRO stage, which model state is sharded, where it
lives). The planner
dispatches on these, never on a strategy's name, so a new row with a known layout is planned
with no edit here; a layout it has no model for is refused with one reason (`NotModelled`),
which `shardbench plan`, `shardbench run` and the report print as "not modelled: <why>"."""
from __future__ import annotations

from dataclasses import replace

from shardbench.trainer import ds_knobs
from shardbench.trainer.contract import STRATEGIES, ZERO_SHARDED, StrategyInfo

STATE = ("params", "grads", "optimizer")


class NotModelled(ValueError):
    """The planner has no model of this layout; the message is the reason, one line."""


def unmodelled(info: StrategyInfo) -> str | None:
    """Why the planner cannot model `info`'s layout, or None when it can."""
    sharded = set(info.sharded)
    if info.engine == "ddp":
        return None if not sharded else f"{info.name}: a DDP engine with sharded {', '.join(info.sharded)}"
    if info.engine == "fsdp":
        return None if sharded == set(STATE) else f"{info.name}: an FSDP engine with {', '.join(STATE)} not all sharded"
    if info.engine == "deepspeed":
        if info.zero_stage not in ZERO_SHARDED:
            return f"{info.name}: DeepSpeed ZeRO stage {info.zero_stage} (the planner knows stages 1-3)"
        if sharded != set(ZERO_SHARDED[info.zero_stage]):
            return f"{info.name}: ZeRO-{info.zero_stage} with {', '.join(info.sharded) or 'nothing'} sharded"
        if not ds_knobs.config_path(info.zero_stage).is_file():
            return f"{info.name}: no trainer/ds_configs/zero{info.zero_stage}.json to read its buckets from"
        return None
    return f"{info.name}: engine {info.engine!r} (the planner knows ddp, fsdp and deepspeed)"


def layout(strategy: str, offload: str = "none") -> StrategyInfo:
    """The row of `strategy` with `--offload` applied (its state on the host), or NotModelled (an
    unknown name is a ValueError of its own)."""
    info = STRATEGIES.get(strategy)
    if info is None:
        raise ValueError(f"unknown strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")
    info = replace(info, on_host=info.offloaded(offload).on_host)
    why = unmodelled(info)
    if why:
        raise NotModelled(why)
    return info


def deepspeed(info: StrategyInfo) -> bool:
    return info.engine == "deepspeed"


def stage(info: StrategyInfo) -> int:
    """DeepSpeed's ZeRO stage, 0 for the torch engines."""
    return info.zero_stage or 0


def sharded(info: StrategyInfo, state: str) -> bool:
    return state in info.sharded


def on_host(info: StrategyInfo, state: str) -> bool:
    """Whether `state` (contract.STATE) lives in host memory (offload)."""
    return state in info.on_host
