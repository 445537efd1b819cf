"""Strategy registry: the contract's engine -> its class. DeepSpeed is imported only by the
zero strategies."""
from __future__ import annotations

from shardbench.trainer.contract import STRATEGIES
from shardbench.trainer.strategies.base import Context, Strategy


def make_strategy(ctx: Context) -> Strategy:
    engine = STRATEGIES[ctx.cfg.strategy].engine
    if engine == "ddp":
        from shardbench.trainer.strategies.ddp import DDPStrategy as cls
    elif engine == "fsdp":
        from shardbench.trainer.strategies.fsdp import FSDPStrategy as cls  # type: ignore[assignment]
    else:
        from shardbench.trainer.strategies.zero import ZeroStrategy as cls  # type: ignore[assignment]
    return cls(ctx)


__all__ = ["Context", "Strategy", "make_strategy"]
