"""What a plan is made for (torch-free): one run's shape, and the facts the formulas need."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from shardbench.trainer.config import model_config_of
from shardbench.trainer.contract import StrategyInfo
from shardbench.trainer import knobs
from shardbench.trainer.knobs import default
from shardbench.trainer.presets import PRESETS, ModelConfig


@dataclass(frozen=True)
class PlanInput:
    """A run's RunConfig fields the planner reads, each defaulting to RunConfig's own default
    (trainer/config.py: `default(name)`), except those a caller resolves first: world_size (not a
    knob), grad_accum (from --global-batch), precision and device (from auto). Each field is a
    RunConfig field of that name (tests/trainer/test_plan_input_fields.py checks it)."""

    strategy: str
    world_size: int = 1
    model: str = default("model")
    n_layer: int | None = default("n_layer")
    n_embd: int | None = default("n_embd")
    n_head: int | None = default("n_head")
    vocab_size: int | None = default("vocab_size")
    seq_len: int | None = default("seq_len")
    micro_batch: int = default("micro_batch")
    grad_accum: int = 1
    precision: str = "fp32"
    """fp32, bf16 or fp16 (auto resolved by the caller: bf16 on a GPU, fp32 on a CPU)."""
    grad_reduce_dtype: str = default("grad_reduce_dtype")
    fsdp_grad_sync: str = default("fsdp_grad_sync")
    activation_checkpointing: bool = default("activation_checkpointing")
    device: str = "cpu"
    """cpu or cuda: which AdamW runs (foreach on CPU, fused on GPU) and whether an allocator
    overhead is added."""
    offload: str = default("offload")
    """--offload: which model state lives in host memory (contract.StateLayout.offloaded)."""
    zero_hpz_partition_size: int = default("zero_hpz_partition_size")
    """--zero-hpz-partition-size: ZeRO++ hpZ's secondary partition (zero3)."""
    weight_decay: float = default("weight_decay")
    bucket_mib: float = default("bucket_mib")
    """--bucket-mib: DDP's bucket cap and DeepSpeed's bucket sizes (trainer/ds_knobs.py)."""
    reshard_after_forward: bool = default("reshard_after_forward")
    """--reshard-after-forward: ZeRO-3 frees gathered parameters after each block's forward."""
    tp: int = default("tp")
    """--tp: tensor-parallel degree (trainer/parallel/)."""
    dp_replicate: int = default("dp_replicate")
    """--dp-replicate: HSDP's replicate degree."""
    pp: int = default("pp")
    """--pp: pipeline-parallel degree (trainer/plan/pipeline.py)."""
    pp_schedule: str = default("pp_schedule")
    """--pp-schedule: which of torch's schedules (its action order and bubble)."""
    pp_stages_per_rank: int | None = default("pp_stages_per_rank")
    """--pp-stages-per-rank (None: the schedule's default)."""
    tie_embeddings: bool = default("tie_embeddings")
    """--tie-embeddings: untied, the head is one more parameter (Params.of); not modelled with tp > 1."""
    float8: str = default("float8")
    """--float8: not modelled beyond off (float8 matmuls, their casts, FSDP's float8 all-gather)."""
    ddp_comm_hook: str = default("ddp_comm_hook")
    """--ddp-comm-hook: bf16 is ddp's bf16 reduction (grad_reduce_dtype bf16); powersgd is not modelled."""

    def __post_init__(self) -> None:
        if self.ddp_comm_hook == "bf16":  # one hook, two spellings (trainer/strategies/ddp.py DDPStrategy.hook)
            object.__setattr__(self, "grad_reduce_dtype", "bf16")

    @property
    def layout(self) -> StrategyInfo:
        """The strategy's layout (trainer/plan/planned_layout.py): NotModelled when the planner has none.
        Mesh layouts (trainer/parallel/) are traced on a fake mesh with closed-form collectives
        (trainer/plan/mesh_forms.py), in fp32 or bf16, with or without activation checkpointing
        (TP in fp16 is not: it needs a GPU to be measured)."""
        from shardbench.trainer.plan.planned_layout import NotModelled, layout

        from shardbench.trainer.parallel.layout import pp_stages_per_rank

        # pp x tp: measured exact with one stage per rank; a V schedule's first + last stage on one
        # rank (DualPipeV) counted 2 all-gathers, 1 reduce-scatter and 4 all-reduces more than the
        # fake run (-12.3% of the bytes), not found why
        tp_beyond = self.tp > 1 and (self.world_size > self.pp * self.tp or self.precision != "fp32"
                                     or self.activation_checkpointing
                                     or pp_stages_per_rank(self.pp_schedule, self.pp_stages_per_rank) > 1)
        if self.pp > 1 and (tp_beyond or self.precision == "fp16"):
            raise NotModelled(f"pipeline parallel (--pp {self.pp}) with "
                              + ("tensor parallel over data-parallel ranks, several stages per rank, in bf16 or "
                                 "with recompute" if tp_beyond else "fp16")
                              + ": the planner models pipelines of ddp, fsdp or HSDP stages in fp32 or bf16, and "
                              "pp x tp alone with one stage per rank in fp32 (the others are not measured)")
        if not self.tie_embeddings and self.tp > 1 and self.pp == 1:
            raise NotModelled("an untied head (--no-tie-embeddings) with tensor parallel (--tp): the planner's TP "
                              "plan is the tied model's")
        if self.float8 != "off":
            raise NotModelled(f"float8 (--float8 {self.float8}): the planner does not model float8 matmuls, their "
                              "casts or FSDP's float8 all-gather")
        if self.ddp_comm_hook == "powersgd":
            raise NotModelled("PowerSGD (--ddp-comm-hook powersgd): the planner does not model its low-rank "
                              "all-reduces")
        info = layout(self.strategy, self.offload)
        if self.tp > 1 and self.precision == "fp16":
            raise NotModelled(f"tensor parallel (--tp {self.tp}) with fp16: not measured (fp16 needs a GPU; its loss "
                              "scaler's checks of DTensor gradients are unchecked); bf16 has the same element size")
        return info

    def model_config(self) -> ModelConfig:
        return model_config_of(self)  # RunConfig's own (one place builds a model from the knobs)

    def effective_seq_len(self) -> int:
        return self.seq_len or PRESETS[self.model].default_seq_len

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, config: Any, **resolved: Any) -> "PlanInput":
        """The plan input of anything holding RunConfig's fields (a RunConfig, a matrix's run
        spec): each field of the plan from the field of that name, then `resolved` (what the
        caller resolved first: world_size, grad_accum, seq_len, precision and device)."""
        given = {f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)}
        return cls(**{**given, **resolved})

    @classmethod
    def from_record(cls, r: dict) -> "PlanInput":
        """The plan input of a result record: each knob as the run was given it (its settings,
        through trainer/knobs.py in_record, as plan_input reads a run spec before the run), and
        what the trainer resolved (RESOLVED) from the record's top level."""
        given = {f.name: value for f in fields(cls)
                 if f.name in _KNOBS and (value := knobs.in_record(r, f.name)) is not None}
        resolved = {name: r[name] for name in RESOLVED if r.get(name) is not None}
        return cls(**{**given, **resolved})


RESOLVED = ("strategy", "world_size", "grad_accum", "seq_len", "precision", "device")
"""Fields a caller resolves before planning (world_size is not a knob, grad_accum comes from
--global-batch, seq_len from the preset, precision and device from auto): a record holds them at
its top level."""
_KNOBS = frozenset(f.name for f in knobs.knob_fields())


@dataclass
class Params:
    """The model's parameters in registration order (the tied embedding once): name, shape."""

    shapes: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)

    @classmethod
    def of(cls, cfg: ModelConfig) -> "Params":
        d, V, B = cfg.n_embd, cfg.vocab_size, cfg.block_size
        out: list[tuple[str, tuple[int, ...]]] = [("wte.weight", (V, d)), ("wpe.weight", (B, d))]
        for i in range(cfg.n_layer):
            b = f"blocks.{i}."
            out += [(b + "ln_1.weight", (d,)), (b + "ln_1.bias", (d,)),
                    (b + "attn.q.weight", (d, d)), (b + "attn.q.bias", (d,)),
                    (b + "attn.k.weight", (d, d)), (b + "attn.k.bias", (d,)),
                    (b + "attn.v.weight", (d, d)), (b + "attn.v.bias", (d,)),
                    (b + "attn.proj.weight", (d, d)), (b + "attn.proj.bias", (d,)),
                    (b + "ln_2.weight", (d,)), (b + "ln_2.bias", (d,)),
                    (b + "mlp.fc.weight", (4 * d, d)), (b + "mlp.fc.bias", (4 * d,)),
                    (b + "mlp.proj.weight", (d, 4 * d)), (b + "mlp.proj.bias", (d,))]
        out += [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]
        if not cfg.tie_embeddings:  # the untied head: registered last (TinyGPT.lm_head)
            out.append(("lm_head.weight", (V, d)))
        return cls(out)

    @staticmethod
    def numel(shape: tuple[int, ...]) -> int:
        n = 1
        for s in shape:
            n *= s
        return n

    @property
    def total(self) -> int:
        return sum(self.numel(s) for _, s in self.shapes)

    def block(self, i: int) -> list[tuple[str, tuple[int, ...]]]:
        return [(n, s) for n, s in self.shapes if n.startswith(f"blocks.{i}.")]

    def root(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(n, s) for n, s in self.shapes if not n.startswith("blocks.")]
