"""What a plan is made for (torch-free): one run's shape, and the facts the formulas need."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from shardbench.trainer.config import model_config_of
from shardbench.trainer.contract import STRATEGIES, StrategyInfo
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
    def from_record(cls, r: dict) -> "PlanInput":
        """The plan input of a result record (what the run actually was)."""
        m = r.get("model") or {}
        base = PRESETS.get(m.get("preset") or "tiny", PRESETS["tiny"])
        over = {k: m.get(k) for k in ("n_layer", "n_embd", "n_head", "vocab_size")
                if m.get(k) is not None and m.get(k) != getattr(base, k)}
        return cls(strategy=r["strategy"], world_size=int(r.get("world_size") or 1),
                   model=m.get("preset") or "tiny", seq_len=r.get("seq_len") or None,
                   micro_batch=int(r.get("micro_batch") or 1), grad_accum=int(r.get("grad_accum") or 1),
                   precision=r.get("precision") or "fp32", grad_reduce_dtype=r.get("grad_reduce_dtype") or "fp32",
                   fsdp_grad_sync=r.get("fsdp_grad_sync") or "every_micro_step",
                   activation_checkpointing=bool(r.get("activation_checkpointing")),
                   device=r.get("device") or "cpu",
                   weight_decay=float((r.get("optimizer") or {}).get("weight_decay", 0.01)),
                   bucket_mib=float(r.get("bucket_mib") or 25.0),
                   reshard_after_forward=r.get("reshard_after_forward") is not False,
                   tp=int((r.get("layout") or {}).get("tp") or 1),
                   pp=int((r.get("layout") or {}).get("pp") or 1),
                   pp_schedule=str((r.get("pipeline") or {}).get("schedule") or "1F1B"),
                   pp_stages_per_rank=(r.get("pipeline") or {}).get("stages_per_rank"),
                   tie_embeddings=(r.get("model") or {}).get("tie_embeddings", True) is not False,
                   float8=str(r.get("float8") or "off"), ddp_comm_hook=str(r.get("ddp_comm_hook") or "none"),
                   dp_replicate=int((r.get("layout") or {}).get("dp_replicate") or 1)
                   if _replicates_shards(r.get("strategy")) else 1,
                   offload=str((r.get("settings") or {}).get("offload") or "none"),
                   zero_hpz_partition_size=int((r.get("settings") or {}).get("zero_hpz_partition_size") or 1),
                   **over)


def _replicates_shards(strategy: str | None) -> bool:
    """Whether the record's layout degree dp_replicate is HSDP's replicate degree (a sharding
    torch engine); DDP's record puts every data-parallel rank there."""
    info = STRATEGIES.get(strategy or "")
    return info is not None and info.engine == "fsdp"


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
