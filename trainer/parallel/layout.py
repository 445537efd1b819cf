"""The degrees of a run's layout, torch-free (rules, the record and the report read them).

Ranks are laid out on a (pp, dp_replicate, dp_shard, tp) mesh in row-major order, tp innermost:
the ranks of one tensor-parallel group are consecutive, so they sit on one worker when tp
divides the GPUs per worker; pipeline stages are outermost (their point-to-point traffic is the
lightest). pp x dp_replicate x dp_shard x tp = world size. The engine decides how
the data-parallel ranks hold the model: DDP replicates over all of them, FSDP shards over
dp_shard and replicates over dp_replicate (HSDP), ZeRO shards over all of them.
"""
from __future__ import annotations

from dataclasses import dataclass

from shardbench.trainer.contract import STRATEGIES

DIMS = ("pp", "dp_replicate", "dp_shard", "tp")
"""The mesh's dimension names, outermost first."""

# torch.distributed.pipelining's schedules (get_schedule_class names), by how stages sit on ranks.
PP_SINGLE = ("GPipe", "1F1B")
"""One stage per rank."""
PP_LOOPED = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble")
"""Stages dealt round-robin: rank r holds r, r + pp, r + 2 pp, ..."""
PP_V = ("ZBVZeroBubble", "DualPipeV")
"""Exactly two stages per rank in a V: rank r holds r and 2 pp - 1 - r."""
PP_SCHEDULES = PP_SINGLE + PP_LOOPED + PP_V


def pp_stages_per_rank(schedule: str, given: int | None) -> int:
    """Virtual stages each rank holds: the knob, else 1 for single-stage schedules and 2 for the rest."""
    return given if given is not None else (1 if schedule in PP_SINGLE else 2)


def pp_stage_ids(schedule: str, pp: int, per_rank: int, pp_rank: int) -> list[int]:
    """The pipeline stages pipeline rank `pp_rank` holds (torch's stage-to-rank mapping)."""
    if schedule in PP_V:
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(per_rank)]


def pp_layer_bounds(n_layer: int, n_stages: int) -> list[tuple[int, int]]:
    """Blocks [first, last) of each stage: as even as the layers allow, earlier stages one more."""
    base, extra = divmod(n_layer, n_stages)
    bounds, first = [], 0
    for stage in range(n_stages):
        last = first + base + (1 if stage < extra else 0)
        bounds.append((first, last))
        first = last
    return bounds


def pp_schedule_error(schedule: str, pp: int, per_rank: int, micro_batches: int) -> str | None:
    """Why torch's `schedule` cannot run `per_rank` stages per rank over `micro_batches`, in the
    trainer's flags (the checks its constructors make), or None."""
    stages = pp * per_rank
    if schedule in PP_SINGLE and per_rank != 1:
        return f"--pp-schedule {schedule} runs one stage per rank, not {per_rank}: use --pp-stages-per-rank 1"
    if schedule in PP_LOOPED and per_rank < 2:
        return (f"--pp-schedule {schedule} loops over several stages per rank: use --pp-stages-per-rank 2 "
                "or more, or GPipe / 1F1B")
    if schedule in PP_V and per_rank != 2:
        return f"--pp-schedule {schedule} holds exactly 2 stages per rank in a V: use --pp-stages-per-rank 2"
    if schedule == "1F1B" and micro_batches < pp:
        return (f"--pp-schedule 1F1B needs at least --pp {pp} micro-batches (--grad-accum), got {micro_batches}: "
                "raise --grad-accum or --global-batch")
    if schedule == "DualPipeV" and micro_batches < stages:
        return (f"--pp-schedule DualPipeV needs at least as many micro-batches (--grad-accum) as stages "
                f"({stages}), got {micro_batches}: raise --grad-accum or --global-batch")
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, micro_batches // pp)
        if micro_batches % rounds:
            return (f"--pp-schedule {schedule} needs the micro-batches (--grad-accum {micro_batches}) to be a "
                    f"multiple of their rounds ({rounds} = micro-batches // --pp {pp}): use a multiple of --pp")
    return None


@dataclass(frozen=True)
class Layout:
    dp_replicate: int
    dp_shard: int
    tp: int
    engine: str = "ddp"
    """The contract's engine: ddp, fsdp or deepspeed."""
    pp: int = 1

    @classmethod
    def of(cls, cfg, world_size: int) -> Layout:
        """The layout of RunConfig `cfg` at `world_size` ranks (valid degrees assumed: rules)."""
        tp, pp = cfg.tp, cfg.pp
        dp = max(1, world_size // (tp * pp))
        info = STRATEGIES[cfg.strategy]
        if info.engine == "ddp":  # DDP holds a whole copy on every data-parallel rank
            return cls(dp, 1, tp, info.engine, pp)
        if info.engine == "fsdp":
            return cls(cfg.dp_replicate, max(1, dp // cfg.dp_replicate), tp, info.engine, pp)
        return cls(1, dp, tp, info.engine, pp)  # ZeRO shards over every data-parallel rank

    def divides(self, sharded_state: tuple[str, ...] | list[str]) -> dict[str, dict]:
        """Memory by mesh dimension: {dim: {"degree", "divides": the categories it divides on a
        rank}}. tp divides the model state and the activations (heads, hidden units, the sequence
        between blocks), pp the layers (their state and activations), dp_shard the state the engine
        shards (`sharded_state`: the contract's StrategyInfo.sharded), dp_replicate nothing (its
        replicas hold equal copies). The record's `memory_by_dim`, the plan's too."""
        split = ["params", "grads", "optimizer", "activations"]
        shard = [s for s in ("params", "grads", "optimizer") if s in sharded_state and self.engine != "ddp"]
        whats = {"pp": split, "dp_replicate": [], "dp_shard": shard, "tp": split}
        return {dim: {"degree": n, "divides": whats[dim] if n > 1 else []} for dim, n in self.degrees.items()}

    @property
    def degrees(self) -> dict[str, int]:
        return dict(zip(DIMS, (self.pp, self.dp_replicate, self.dp_shard, self.tp)))

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each takes rows of its own."""
        return self.dp_replicate * self.dp_shard

    @property
    def needs_mesh(self) -> bool:
        """Beyond one data-parallel dimension over the world: pipeline or tensor parallel, or HSDP
        (the plain strategies keep their one world group, as before meshes)."""
        return self.pp > 1 or self.tp > 1 or (self.engine == "fsdp" and self.dp_replicate > 1)

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's coordinate along each mesh dimension."""
        inner = rank % (self.dp * self.tp)  # the position inside this rank's pipeline stage group
        return {"pp": rank // (self.dp * self.tp), "dp_replicate": inner // (self.dp_shard * self.tp),
                "dp_shard": inner // self.tp % self.dp_shard, "tp": rank % self.tp}

    def dp_rank(self, rank: int) -> int:
        """Which data-parallel rank this is (its rows); tensor-parallel peers and the stages of one
        pipeline share it."""
        return rank % (self.dp * self.tp) // self.tp
