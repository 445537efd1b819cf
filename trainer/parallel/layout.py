"""The degrees of a run's layout, torch-free (rules, the record and the report read them).

Ranks are laid out on a (dp_replicate, dp_shard, tp) mesh in row-major order, tp innermost:
the ranks of one tensor-parallel group are consecutive, so they sit on one worker when tp
divides the GPUs per worker. dp_replicate x dp_shard x tp = world size. The engine decides how
the data-parallel ranks hold the model: DDP replicates over all of them, FSDP shards over
dp_shard and replicates over dp_replicate (HSDP), ZeRO shards over all of them.
"""
from __future__ import annotations

from dataclasses import dataclass

from shardbench.trainer.contract import STRATEGIES

DIMS = ("dp_replicate", "dp_shard", "tp")
"""The mesh's dimension names, outermost first."""


@dataclass(frozen=True)
class Layout:
    dp_replicate: int
    dp_shard: int
    tp: int
    engine: str = "ddp"
    """The contract's engine: ddp, fsdp or deepspeed."""

    @classmethod
    def of(cls, cfg, world_size: int) -> Layout:
        """The layout of RunConfig `cfg` at `world_size` ranks (valid degrees assumed: rules)."""
        tp = cfg.tp
        dp = max(1, world_size // tp)
        info = STRATEGIES[cfg.strategy]
        if info.engine == "ddp":  # DDP holds a whole copy on every data-parallel rank
            return cls(dp, 1, tp, info.engine)
        if info.engine == "fsdp":
            return cls(cfg.dp_replicate, max(1, dp // cfg.dp_replicate), tp, info.engine)
        return cls(1, dp, tp, info.engine)  # ZeRO shards over every data-parallel rank

    @property
    def degrees(self) -> dict[str, int]:
        return dict(zip(DIMS, (self.dp_replicate, self.dp_shard, self.tp)))

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each takes rows of its own."""
        return self.dp_replicate * self.dp_shard

    @property
    def needs_mesh(self) -> bool:
        """Beyond one data-parallel dimension over the world: tensor parallel or HSDP (the plain
        strategies keep their one world group, as before meshes)."""
        return self.tp > 1 or (self.engine == "fsdp" and self.dp_replicate > 1)

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's coordinate along each mesh dimension."""
        return {"dp_replicate": rank // (self.dp_shard * self.tp), "dp_shard": rank // self.tp % self.dp_shard,
                "tp": rank % self.tp}

    def dp_rank(self, rank: int) -> int:
        """Which data-parallel rank this is (its rows); tensor-parallel peers share it."""
        return rank // self.tp
