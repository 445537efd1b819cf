"""The trainer's run configuration: one dataclass whose fields are the knobs, their defaults and
their documentation, and the command line generated from it (as torchtitan's job config does):
each field is a `--flag`, its docstring the help text, a `Literal[...]` type the choices, a bool
an on/off switch. The rules every run must pass are trainer.rules.validate().

A new knob is a new field here (type, default, roles through `knob()`, docstring) plus the code
that uses it: the CLI, the matrix key and `shardbench run` flag, the per-run validation, the
config id, the trainer arguments, the record's settings, the CSV column, the loss groups, the
scaling bases and the chart's flags follow from the field (trainer/knobs.py).
"""
from __future__ import annotations

import argparse
import functools
import sys
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal

from shardbench.trainer.contract import DEVICES, OFFLOADS, PRECISIONS, STRATEGIES, ConfigError, flag
from shardbench.trainer.parallel.layout import PP_SCHEDULES
from shardbench.trainer.flags import add_flags
from shardbench.trainer.presets import PRESETS, ModelConfig

__all__ = ["ConfigError", "RunConfig", "build_parser", "id_fields", "measured_fields", "parse_args", "to_argv"]

StrategyName = Literal[tuple(STRATEGIES)]  # type: ignore[valid-type]
PresetName = Literal[tuple(PRESETS)]  # type: ignore[valid-type]
Precision = Literal[PRECISIONS]  # type: ignore[valid-type]
Device = Literal[DEVICES]  # type: ignore[valid-type]


MODEL_FIELDS = ("model", "n_layer", "n_embd", "n_head", "vocab_size", "tie_embeddings")
"""The fields model_config() builds the model from (the record's `model`, the CSV's model_key)."""


SECTIONS = ("model", "optimizer", "batch", "parallelism", "precision", "checkpoint", "telemetry", "bookkeeping")
"""Every RunConfig field belongs to one (`knob(section=)`), as torchtitan's JobConfig sections:
the trainer's --help groups its flags by them and the record's `settings` lists them in this
order. bookkeeping is the suite's (run id, repeat, output dir, the command line), not a knob
of the run."""


def knob(default: Any = MISSING, *, section: str, min: float | None = None, above: float | None = None,
         max: float | None = None, below: float | None = None, recorded_only: bool = False,
         same_loss: bool = False, per_world: bool = False, chart: bool = False, column: str | None = None,
         changes_loss: bool = False, record: str | None = None, chart_key: str | None = None,
         layout: bool = False) -> Any:
    """A field with its metadata; trainer/knobs.py derives every other part from it.

    section: one of SECTIONS. min/above, max/below: inclusive and exclusive bounds that
    validate(), the matrix (its dry run included) and the chart schema (minimum,
    exclusiveMinimum, maximum, exclusiveMaximum) check. recorded_only: written into the record
    but does not change what is measured (left out of the config id, the CSV and the
    comparisons). same_loss: runs that differ only here must follow one loss curve (the loss
    check compares them); a measured field without it splits the loss groups. per_world: follows
    the world size at a fixed global batch (not part of a scaling base). chart: a first-class
    chart value `run.<camelCase>` (else a cluster run gets it through run.extraArgs). column: the
    CSV column that already holds it under another name. changes_loss: runs that differ only here
    follow different loss curves by design (float8, a compressing gradient hook): the loss check
    compares each value's runs with the default's and reports the difference as measured.
    record: where a run's record holds it besides its settings, dotted ("model.n_layer"; default:
    `column`, else its name at the top). chart_key: a chart value outside `run:` that carries it
    ("checkpoint.every"). layout: part of the run's layout beside the strategy (mesh degrees,
    pipeline, where state lives): verdicts compare across it, as across strategies."""
    if section not in SECTIONS:
        raise TypeError(f"knob(section={section!r}): use one of {', '.join(SECTIONS)}")
    meta = {"section": section, "min": min, "above": above, "max": max, "below": below,
            "recorded_only": recorded_only, "same_loss": same_loss, "per_world": per_world, "chart": chart,
            "column": column, "changes_loss": changes_loss, "record": record, "chart_key": chart_key,
            "layout": layout}
    return field(default=default, metadata=meta)


def model_config_of(c: Any) -> ModelConfig:
    """The model of anything holding MODEL_FIELDS (a RunConfig, the planner's PlanInput): its
    preset with every dimension it sets."""
    base = PRESETS[c.model]
    overrides = {k: getattr(c, k) for k in MODEL_FIELDS[1:]}
    return ModelConfig(**{**base.__dict__, **{k: v for k, v in overrides.items() if v is not None}})


@dataclass
class RunConfig:
    strategy: StrategyName = knob(section="parallelism", same_loss=True, chart=True)  # type: ignore[valid-type]
    """Distributed strategy (required)."""
    model: PresetName = knob("tiny", section="model", chart=True, record="model.preset")  # type: ignore[valid-type]
    """Model preset (trainer/presets.py)."""
    n_layer: int | None = knob(None, section="model", min=1, max=1024, record="model.n_layer")
    """Override of the preset's layer count."""
    n_embd: int | None = knob(None, section="model", min=1, max=65536, record="model.n_embd")
    """Override of the preset's width."""
    n_head: int | None = knob(None, section="model", min=1, max=1024, record="model.n_head")
    """Override of the preset's head count."""
    vocab_size: int | None = knob(None, section="model", min=1, max=2 ** 22, record="model.vocab_size")
    """Override of the preset's vocabulary size."""
    tie_embeddings: bool = knob(True, section="model")
    """The output head shares the token embedding's weight (GPT-2); --no-tie-embeddings gives the
    head its own (every strategy runs it; --pp needs it: the two uses would sit on different
    stages)."""
    seq_len: int | None = knob(None, section="batch", min=1, max=2 ** 20, chart=True)
    """Tokens per sequence; default: the preset's. At most the preset's block size."""
    micro_batch: int = knob(4, section="batch", min=1, max=65536, same_loss=True, chart=True)
    """Sequences per rank per forward/backward."""
    grad_accum: int | None = knob(None, section="batch", min=1, max=65536, same_loss=True, per_world=True, chart=True)
    """Micro-steps per optimizer step; default: 1, or derived from --global-batch."""
    global_batch: int | None = knob(None, section="batch", min=1, max=2 ** 24, same_loss=True, per_world=True)
    """Sequences per optimizer step; grad-accum = global batch / (micro-batch x world size)."""
    steps: int = knob(100, section="batch", min=1, max=10 ** 9, chart=True)
    """Optimizer steps, warm-up included."""
    warmup_steps: int = knob(10, section="batch", min=0, max=10 ** 9, same_loss=True, chart=True)
    """Steps excluded from every metric (allocator, autotuning, compilation settle)."""
    precision: Precision = knob("auto", section="precision", chart=True)
    """fp32, bf16 (autocast / mixed precision), fp16 (loss-scaled), auto: bf16 on a GPU that has
    it, else fp32."""
    seed: int = knob(1234, section="batch", min=0, max=2 ** 31 - 1, chart=True)
    """Seeds the initial weights and the synthetic tokens: same seed, same run."""
    lr: float = knob(1e-4, section="optimizer", above=0, record="optimizer.lr")
    """Peak AdamW learning rate."""
    weight_decay: float = knob(0.01, section="optimizer", min=0, record="optimizer.weight_decay")
    """AdamW weight decay."""
    grad_clip: float = knob(1.0, section="optimizer", min=0, record="optimizer.grad_clip")
    """Global gradient-norm clip; 0 disables it."""
    lr_warmup_steps: int = knob(5, section="optimizer", min=0, max=10 ** 9,
                                record="optimizer.lr_warmup_steps")
    """Linear learning-rate warm-up steps, then cosine decay to 10% at the last step."""
    adam_beta1: float = knob(0.9, section="optimizer", min=0, below=1)
    """AdamW's decay of the first moment (beta1)."""
    adam_beta2: float = knob(0.95, section="optimizer", min=0, below=1)
    """AdamW's decay of the second moment (beta2)."""
    adam_eps: float = knob(1e-8, section="optimizer", above=0, below=1)
    """AdamW's epsilon, added to the second moment's root."""
    grad_reduce_dtype: Literal["fp32", "bf16"] = knob("fp32", section="precision")
    """Dtype gradients are reduced in, the same for every strategy: DDP's comm hook, FSDP's
    MixedPrecisionPolicy reduce_dtype, DeepSpeed's communication_data_type."""
    fsdp_grad_sync: Literal["every_micro_step", "last_micro_step"] = knob("every_micro_step", section="parallelism",
                                                                          same_loss=True)
    """fsdp only: reduce-scatter gradients after every micro-step (torchtitan's default: only
    sharded gradients are held) or only after the last one (unsharded gradients held between
    micro-steps, fewer collectives)."""
    offload: Literal[OFFLOADS] = knob("none", section="parallelism", same_loss=True, chart=True,  # type: ignore[valid-type]
                                      layout=True)
    """Model state kept in host memory instead of on the device (the layout's state location,
    trainer/contract.py StateLayout): none; optimizer (zero1/2/3: DeepSpeed's offload_optimizer,
    the optimizer steps on the host from an fp32 gradient partition there); params (parameters
    too: zero3's offload_param, fsdp's CPUOffloadPolicy with gradients and optimizer on the host).
    Not ddp. On a CPU run host and device memory are one: nothing moves, and the report compares
    what the device holds as the whole."""
    zero_hpz_partition_size: int = knob(1, section="parallelism", min=1, max=65536, same_loss=True, chart=True,
                                        layout=True)
    """zero3 only: ZeRO++ hierarchical partitioning (hpZ), a secondary copy of the parameters
    sharded over groups of this many consecutive ranks (one node's GPUs), so backward's
    all-gathers stay inside a group; it must divide the data-parallel ranks. 1: off."""
    zero_quantized_weights: bool = knob(False, section="parallelism")
    """zero3 only, CUDA only: ZeRO++ qwZ, parameters all-gathered in int8 blocks."""
    zero_quantized_gradients: bool = knob(False, section="parallelism")
    """zero3 only, CUDA only: ZeRO++ qgZ, gradients reduce-scattered in int4 blocks (all-to-all)."""
    reshard_after_forward: bool = knob(True, section="parallelism", same_loss=True)
    """fsdp and zero3, matched: free each block's gathered parameters after its forward and gather
    them again for backward, on every block but the last, the root staying gathered (FSDP2's
    reshard_after_forward as torchtitan does; ZeRO-3: blocks as leaf modules, the root persistent,
    stage3_max_reuse_distance 0, prefetching one block ahead: trainer/ds_knobs.py), or keep them
    until backward (--no-reshard-after-forward: fewer all-gathers, more memory; ZeRO-3's reuse
    distance then DeepSpeed's 1e9). Other strategies ignore it."""
    bucket_mib: float = knob(25.0, section="parallelism", above=0, max=2 ** 20, same_loss=True)
    """Gradient-communication bucket size in MiB, the same for every strategy that buckets: DDP's
    bucket_cap_mb, DeepSpeed's reduce_bucket_size and allgather_bucket_size (converted to elements
    of the dtype each is allocated in, so the bucket is this many MiB; these override
    --deepspeed-config's). FSDP2 communicates per module and has no bucket."""
    threads_per_rank: int = knob(1, section="parallelism", min=1, max=4096, same_loss=True)
    """CPU threads of every rank whatever the world size (1 rank = 1 core, like 1 GPU); each rank
    is pinned to cores of its own when the machine has enough."""
    tp: int = knob(1, section="parallelism", min=1, max=65536, same_loss=True, chart=True, layout=True)
    """Tensor-parallel degree: each block's attention heads and MLP columns split over this many
    ranks of one worker (sequence parallel on the norms, vocabulary-parallel embedding and loss);
    ddp and fsdp only. The data-parallel degree is world size / tp."""
    dp_replicate: int = knob(1, section="parallelism", min=1, max=65536, same_loss=True, chart=True, layout=True)
    """fsdp only: data-parallel replicate degree (HSDP: parameters sharded inside groups of
    world size / (tp x dp-replicate) ranks and replicated across this many groups)."""
    pp: int = knob(1, section="parallelism", min=1, max=65536, same_loss=True, chart=True, layout=True)
    """Pipeline-parallel degree: the blocks split into stages over this many ranks
    (torch.distributed.pipelining), the micro-batches of --grad-accum streamed through them; ddp
    and fsdp only, needs --no-tie-embeddings. The data-parallel degree is world size / (pp x tp)."""
    pp_schedule: Literal[PP_SCHEDULES] = knob("1F1B", section="parallelism", same_loss=True,  # type: ignore[valid-type]
                                               layout=True)
    """--pp's schedule: GPipe and 1F1B run one stage per rank; Interleaved1F1B, LoopedBFS and
    InterleavedZeroBubble loop over --pp-stages-per-rank stages each; ZBVZeroBubble and DualPipeV
    hold two stages per rank in a V."""
    pp_stages_per_rank: int | None = knob(None, section="parallelism", min=1, max=1024, same_loss=True, layout=True)
    """Virtual pipeline stages per rank (--pp x this = stages, at most the layers); default: 1
    for GPipe and 1F1B, 2 for the others (the V schedules need exactly 2)."""
    activation_checkpointing: bool = knob(False, section="model", same_loss=True)
    """Recompute each block's activations in backward (memory for compute)."""
    compile: bool = knob(False, section="model", same_loss=True)
    """torch.compile each transformer block. Compilation happens in the first step (forward and
    backward), a warm-up step: needs --warmup-steps >= 1; its seconds are recorded apart
    (`compile_s`, and `compile_in_measured_s` for any recompilation inside measured steps)."""
    float8: Literal["off", "tensorwise", "rowwise"] = knob("off", section="precision", changes_loss=True)
    """float8 training of the blocks' linears (torchao, trainer/parallel/float8.py): matmuls in
    float8 with one scale per tensor or per row; the tied head stays in --precision. fsdp with
    tensorwise all-gathers those weights in float8. ddp and fsdp only; needs torchao (the float8
    extra) and float8 matmuls on the device (CPU, or a CUDA GPU of compute capability 8.9+)."""
    ddp_comm_hook: Literal["none", "bf16", "powersgd"] = knob("none", section="parallelism", changes_loss=True)
    """ddp only, with more than one data-parallel rank: how gradients are all-reduced. none: in
    --grad-reduce-dtype; bf16: our bf16 hook (what --grad-reduce-dtype bf16 gives ddp); powersgd:
    torch's PowerSGD (low-rank, error feedback) from the second optimizer step on, the loss
    drifting from then (trainer/strategies/ddp.py)."""
    powersgd_rank: int = knob(1, section="parallelism", min=1, max=4096)
    """--ddp-comm-hook powersgd: the rank of its low-rank gradient approximation (higher: closer to
    the exact all-reduce, more bytes)."""
    device: Device = knob("auto", section="parallelism", same_loss=True, chart=True)
    """auto (cuda when present), cpu or cuda."""
    deepspeed_config: str | None = knob(None, section="parallelism")
    """DeepSpeed JSON config; default: trainer/ds_configs/<strategy>.json."""
    shape: str | None = knob(None, section="telemetry", same_loss=True, column="gpu_shape")
    """GPU shape the run is on (values file name): recorded, and its peak is a fallback for MFU."""
    peak_tflops: float | None = knob(None, section="telemetry", above=0, same_loss=True)
    """Peak dense TFLOP/s of one device for MFU; default: looked up from the device name."""
    launcher: str | None = knob(None, section="parallelism", same_loss=True)
    """Launcher that started the ranks (recorded); default: detected from the environment."""
    output_dir: str | None = knob(None, section="bookkeeping", recorded_only=True)
    """Where rank 0 writes result.json (atomically)."""
    pg_timeout_s: float = knob(300.0, section="parallelism", above=0, max=10 ** 7, recorded_only=True)
    """Process-group timeout: a rank that dies ends the others within this many seconds."""
    run_id: str | None = knob(None, section="bookkeeping", recorded_only=True)
    """Recorded run id; default: built from the run's fields (trainer.contract.run_id)."""
    repeat: int = knob(0, section="bookkeeping", min=0, max=10 ** 6, recorded_only=True)
    """Which repeat of its configuration this run is (0-based, recorded)."""
    usd_per_gpu_hour: float | None = knob(None, section="telemetry", min=0, recorded_only=True)
    """Price of one device-hour, recorded for the cost report."""
    progress_every: int = knob(1, section="telemetry", min=1, max=10 ** 9, recorded_only=True)
    """Print a progress line every N steps on rank 0."""
    checkpoint_dir: str | None = knob(None, section="checkpoint", recorded_only=True)
    """Directory of the run's checkpoints (step-NNNNNNNN/ each); also where --resume auto looks."""
    checkpoint_every: int = knob(0, section="checkpoint", min=0, max=10 ** 9, same_loss=True,
                                 chart_key="checkpoint.every")
    """Save a checkpoint every N optimizer steps (0: never); needs --checkpoint-dir."""
    keep_checkpoints: int = knob(2, section="checkpoint", min=1, max=1000, same_loss=True,
                                 chart_key="checkpoint.keep")
    """Newest checkpoints kept; older ones are deleted after each save."""
    async_checkpoint: bool = knob(False, section="checkpoint", same_loss=True)
    """ddp and fsdp only: save in the background (torch.distributed.checkpoint async_save)."""
    resume: str = knob("auto", section="checkpoint", recorded_only=True)
    """auto (the newest valid checkpoint in --checkpoint-dir, if any), never, or a checkpoint
    directory."""
    metrics_port: int | None = knob(None, section="telemetry", min=0, max=65535, recorded_only=True)
    """Serve live Prometheus metrics from every rank on this TCP port plus its local rank (0: any
    free port); default: none (trainer/exporter.py)."""
    metrics_hold_s: float = knob(0.0, section="telemetry", min=0, max=10 ** 6, recorded_only=True)
    """With --metrics-port: keep serving the final values this many seconds after the record."""
    expected_tokens_per_s: float | None = knob(None, section="telemetry", above=0, recorded_only=True)
    """Throughput the run is expected to reach (a planner's prediction or the shape's), exported
    as shardbench_expected_tokens_per_second for the throughput alert."""
    resume_allow: str | None = knob(None, section="checkpoint", recorded_only=True)
    """Measured settings a resume may change, comma-separated: world_size (ddp, fsdp), steps,
    checkpointing (trainer/checkpoint_guard.py ALLOWABLE); any other change is refused."""
    argv: list[str] = field(default_factory=list, metadata={"recorded_only": "argv", "section": "bookkeeping"})
    """The command line this config came from (recorded; not a flag)."""

    def model_config(self) -> ModelConfig:
        return model_config_of(self)

    def effective_seq_len(self) -> int:
        return self.seq_len or PRESETS[self.model].default_seq_len

    def adam_betas(self) -> tuple[float, float]:
        """AdamW's betas as torch takes them (the trainer, the record and the planner's trace)."""
        return (self.adam_beta1, self.adam_beta2)

    def dp_degree(self, world_size: int) -> int:
        """Data-parallel ranks (each with rows of its own): tensor-parallel peers and the stages
        of one pipeline share rows."""
        return max(1, world_size // (self.tp * self.pp))

    def effective_grad_accum(self, world_size: int) -> int:
        if self.global_batch is not None:
            return self.global_batch // (self.micro_batch * self.dp_degree(world_size))
        return self.grad_accum or 1


@functools.cache
def _float_fields() -> frozenset[str]:
    hints = typing.get_type_hints(RunConfig)
    return frozenset(name for name, kind in hints.items()
                     if kind is float or float in typing.get_args(kind))  # float, float | None


def _as_declared(name: str, value: Any) -> Any:
    """A float knob's 25 (a YAML int) and 25.0 (the command line's float) are one setting and
    must hash alike: ints of float fields become floats."""
    if name in _float_fields() and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def measured_fields(cfg: RunConfig, world_size: int, nodes: int, launcher: str | None) -> dict[str, Any]:
    """Everything that changes what the run measures, normalised (seq len and grad-accum
    resolved), as trainer.contract.config_id() hashes it."""
    out = {f.name: _as_declared(f.name, getattr(cfg, f.name)) for f in fields(cfg)
           if not f.metadata.get("recorded_only")}
    out.update(seq_len=cfg.effective_seq_len(), grad_accum=cfg.effective_grad_accum(world_size),
               global_batch=None, world_size=world_size, nodes=nodes, launcher=launcher)
    return out


def id_fields(cfg: RunConfig, world_size: int, nodes: int, launcher: str | None) -> dict[str, Any]:
    """What the config id hashes (trainer.contract.config_id): the measured fields that differ
    from their declared defaults, plus the run's shape (seq len, grad-accum, world size, nodes,
    launcher, always). A knob added at its default therefore keeps every existing id."""
    out = measured_fields(cfg, world_size, nodes, launcher)
    for f in fields(cfg):
        if f.name in out and f.name not in _SHAPE and f.default is not MISSING:
            default = _as_declared(f.name, f.default)
            if type(out[f.name]) is type(default) and out[f.name] == default:
                del out[f.name]
    return out


_SHAPE = ("seq_len", "grad_accum", "world_size", "nodes", "launcher")
"""Resolved per run (not the knob as given): always hashed."""


# --- the command line, generated from the fields ------------------------------------------

class _OneLineParser(argparse.ArgumentParser):
    """argparse errors as one line (what is wrong and how to see the options), exit 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="python -m shardbench.trainer",
                       description="Train TinyGPT under one distributed strategy and print one result record.")
    add_flags(p, RunConfig, names=[f.name for f in fields(RunConfig) if f.metadata.get("recorded_only") != "argv"],
              sections=SECTIONS, section_title="{} options")
    return p


def parse_args(argv: list[str]) -> RunConfig:
    """Parse the command line; argparse's own errors exit 2 with one line."""
    ns = build_parser().parse_args(argv)
    return RunConfig(**vars(ns), argv=list(argv))


def to_argv(cfg: RunConfig, names: typing.Iterable[str]) -> list[str]:
    """The flags that give `names` of cfg their values (the inverse of parse_args)."""
    out: list[str] = []
    for name in names:
        value = getattr(cfg, name)
        if isinstance(value, bool):
            out.append(flag(name) if value else "--no-" + name.replace("_", "-"))
        elif value is not None:
            out += [flag(name), _num(value) if isinstance(value, float) else str(value)]
    return out


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


if __name__ == "__main__":  # pragma: no cover - `python -m shardbench.trainer.config --help`
    build_parser().parse_args(sys.argv[1:])
