"""The rules every run must pass, one wording per rule, stated in the trainer's flag names:
`validate()` is used by the trainer before any process group starts and by the matrix for every
run it expands; `check_fits()` by trainer.devices once the memory is known.

Reads a RunConfig (its field types and `knob()` bounds, trainer/config.py) and the contract's
tables (trainer/contract.py); neither of those imports this module. Torch-free.
"""
from __future__ import annotations

import math
import typing
from dataclasses import fields
from typing import Any

from shardbench.trainer.config import RunConfig
from shardbench.trainer.contract import STATE, STRATEGIES, StateLayout, flag, is_deepspeed, state_layout
from shardbench.trainer.parallel.layout import pp_schedule_error, pp_stages_per_rank


def _field_rule_errors(cfg: RunConfig) -> list[str]:
    """Per-field rules from RunConfig's types and metadata: choices, integers and bounds."""
    errors = []
    hints = typing.get_type_hints(type(cfg))
    for f in fields(cfg):
        if f.metadata.get("recorded_only") == "argv":
            continue
        value, kind = getattr(cfg, f.name), hints[f.name]
        problem = _check_value(value, kind, f.metadata)
        if problem:
            errors.append(f"{flag(f.name)} {problem}")
    return errors


def _check_value(value: Any, kind: Any, meta: typing.Mapping[str, Any]) -> str | None:
    args = typing.get_args(kind)
    if value is None:
        return None if type(None) in args else "is required"
    if typing.get_origin(kind) is typing.Literal:
        return None if value in args else f"got {value!r}: use one of {', '.join(map(str, args))}"
    base = next((a for a in args if a is not type(None)), kind) if args else kind
    if base is bool:
        return None if isinstance(value, bool) else f"must be true or false, got {value!r}"
    if base is int:
        if not isinstance(value, int) or isinstance(value, bool):
            return f"must be an integer, got {value!r}"
    elif base is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return f"must be a finite number, got {value!r}"
    elif base is str:
        if not isinstance(value, str):
            return f"must be text, got {value!r}"
        # On a command line (the trainer's, its launcher's) it would read as a flag: `--output-dir
        # --help` ended every run with "expected one argument" after the dry run passed.
        return f"got {value!r}, which starts with '-' and would read as a flag (a path: write {'./' + value!r})" \
            if value.startswith("-") else None
    else:
        return None
    low, above, high, below = meta.get("min"), meta.get("above"), meta.get("max"), meta.get("below")
    if low is not None and value < low:
        return f"must be at least {low}, got {value}"
    if above is not None and value <= above:
        return f"must be above {above}, got {value}"
    if high is not None and value > high:
        return f"must be at most {high}, got {value}"
    if below is not None and value >= below:
        return f"must be below {below}, got {value}"
    return None


def _run_rule_errors(cfg: RunConfig, world_size: int) -> list[str]:
    """Rules between fields: each stated once, in the trainer's flag names."""
    errors = []
    if cfg.warmup_steps >= cfg.steps:
        errors.append(f"--warmup-steps {cfg.warmup_steps} leaves no measured step out of --steps "
                      f"{cfg.steps}: use fewer warm-up steps or more steps")
    if cfg.grad_accum is not None and cfg.global_batch is not None:
        errors.append("give --grad-accum or --global-batch, not both")
    dp = cfg.dp_degree(world_size)  # tensor-parallel peers share rows
    per_step = cfg.micro_batch * dp
    if cfg.global_batch is not None and (cfg.global_batch % per_step or cfg.global_batch < per_step):
        ranks = f"world size {world_size}" if dp == world_size else f"data-parallel ranks {dp}"
        errors.append(f"--global-batch {cfg.global_batch} is not a multiple of --micro-batch "
                      f"{cfg.micro_batch} x {ranks} = {per_step}: pick a multiple of it")
    mcfg = cfg.model_config()
    if mcfg.n_embd % mcfg.n_head:
        errors.append(f"width {mcfg.n_embd} is not divisible by {mcfg.n_head} heads: "
                      "change --n-embd or --n-head")
    seq = cfg.effective_seq_len()
    if seq > mcfg.block_size:
        errors.append(f"--seq-len {seq} exceeds the {cfg.model} preset's block size "
                      f"{mcfg.block_size}: use at most {mcfg.block_size}")
    if cfg.deepspeed_config and not is_deepspeed(cfg.strategy):
        errors.append(f"--deepspeed-config applies to DeepSpeed strategies, not {cfg.strategy}")
    if cfg.precision == "fp16" and cfg.device == "cpu":
        errors.append("--precision fp16 needs a CUDA GPU (loss-scaled fp16 is unsupported on "
                      "CPU): use fp32 or bf16")
    if cfg.checkpoint_every and not cfg.checkpoint_dir:
        errors.append("--checkpoint-every needs --checkpoint-dir: give the directory to save into")
    errors += _layout_errors(cfg, world_size, mcfg, seq)
    errors += _state_errors(cfg, world_size)
    if cfg.async_checkpoint and is_deepspeed(cfg.strategy):
        errors.append(f"--async-checkpoint applies to ddp and fsdp (torch.distributed.checkpoint), not "
                      f"{cfg.strategy}: DeepSpeed saves synchronously")
    errors += _float8_compile_hook_errors(cfg)
    return errors


def _float8_compile_hook_errors(cfg: RunConfig) -> list[str]:
    """--float8, --compile and --ddp-comm-hook beyond their choices (the device's float8 support
    is trainer/parallel/float8.py `problem`, once torch knows the device)."""
    errors = []
    engine = STRATEGIES[cfg.strategy].engine
    if cfg.float8 != "off" and engine not in ("ddp", "fsdp"):
        errors.append(f"--float8 {cfg.float8} applies to ddp and fsdp (torchao converts torch's linears; "
                      f"DeepSpeed's engine casts the model itself), not {cfg.strategy}: use --float8 off")
    if cfg.float8 != "off" and cfg.tp > 1:
        errors.append(f"--float8 {cfg.float8} with --tp {cfg.tp}: float8 tensor parallelism is not wired "
                      "here: use --tp 1 or --float8 off")
    if cfg.compile and cfg.warmup_steps < 1:
        errors.append("--compile compiles in the first step, which --warmup-steps 0 would time: use "
                      "--warmup-steps 1 or more")
    if cfg.ddp_comm_hook != "none" and engine != "ddp":
        errors.append(f"--ddp-comm-hook {cfg.ddp_comm_hook} applies to ddp, not {cfg.strategy}: use "
                      "--ddp-comm-hook none (--grad-reduce-dtype sets every strategy's reduction dtype)")
    if cfg.ddp_comm_hook == "powersgd" and cfg.grad_reduce_dtype != "fp32":
        errors.append(f"--ddp-comm-hook powersgd compresses fp32 gradients, not --grad-reduce-dtype "
                      f"{cfg.grad_reduce_dtype}: use --grad-reduce-dtype fp32")
    return errors


def _layout_errors(cfg: RunConfig, world_size: int, mcfg, seq: int) -> list[str]:
    """The degrees of the mesh (trainer/parallel/layout.py): pp x tp x dp-replicate must divide the
    world; tp splits heads, the vocabulary, the position table and the sequence; pp splits the
    layers into stages."""
    tp, rep, pp = cfg.tp, cfg.dp_replicate, cfg.pp
    if tp == 1 and rep == 1 and pp == 1:
        return []
    engine = STRATEGIES[cfg.strategy].engine
    if tp > 1 and engine not in ("ddp", "fsdp"):
        return [f"--tp {tp} is not supported with {cfg.strategy} (DeepSpeed ZeRO has no tensor-parallel "
                "layout here): use ddp or fsdp, or --tp 1"]
    if pp > 1 and engine not in ("ddp", "fsdp"):
        return [f"--pp {pp} is not supported with {cfg.strategy} (DeepSpeed's engine takes the whole model, "
                "not torch's pipeline stages): use ddp or fsdp, or --pp 1"]
    if rep > 1 and engine != "fsdp":
        return [f"--dp-replicate {rep} applies to fsdp (HSDP); {cfg.strategy} replicates or shards over "
                "every data-parallel rank: use --dp-replicate 1"]
    if pp > 1 and world_size % (pp * tp * rep):
        return [f"world size {world_size} is not divisible by --pp {pp} x --tp {tp} x --dp-replicate {rep} = "
                f"{pp * tp * rep}: pick degrees whose product divides the world size"]
    if world_size % (tp * rep):
        return [f"world size {world_size} is not divisible by --tp {tp} x --dp-replicate {rep} = {tp * rep}: "
                "pick degrees whose product divides the world size"]
    errors = []
    if tp > 1:
        for what, n in ((f"the model's {mcfg.n_head} heads", mcfg.n_head),
                        (f"the vocabulary size {mcfg.vocab_size}", mcfg.vocab_size),
                        (f"the block size {mcfg.block_size}", mcfg.block_size), (f"the sequence length {seq}", seq)):
            if n % tp:
                errors.append(f"--tp {tp} does not divide {what}: use a tp that does")
                break
        # DCP saves TP's DTensors (alone or under FSDP2); DDP + TP hands DDP the local shards as
        # plain tensors (parallel.tp.localize_for_ddp), which DCP would save as replicated
        if (cfg.checkpoint_every or cfg.async_checkpoint) and engine == "ddp" and world_size // (tp * pp) > 1:
            errors.append(f"--tp {tp} with ddp over {world_size // (tp * pp)} data-parallel ranks does not checkpoint "
                          "yet: use fsdp (fsdp+tp checkpoints), or drop --checkpoint-every / --async-checkpoint")
    if pp > 1:
        errors += _pipeline_errors(cfg, world_size, mcfg)
    return errors


def _pipeline_errors(cfg: RunConfig, world_size: int, mcfg) -> list[str]:
    """--pp: an untied head, stages no deeper than the layers, the schedule's micro-batch needs."""
    pp, schedule = cfg.pp, cfg.pp_schedule
    if mcfg.tie_embeddings:
        return [f"--pp {pp} needs an untied head (--no-tie-embeddings): the tied embedding's two uses would sit "
                "on the first and last stage with gradients never summed (silently wrong losses)"]
    per_rank = pp_stages_per_rank(schedule, cfg.pp_stages_per_rank)
    stages = pp * per_rank
    if stages > mcfg.n_layer:
        return [f"--pp {pp} x {per_rank} stage(s) per rank = {stages} stages is deeper than the model's "
                f"{mcfg.n_layer} layers: use fewer stages or more --n-layer"]
    errors = []
    said = pp_schedule_error(schedule, pp, per_rank, cfg.effective_grad_accum(world_size))
    if said:
        errors.append(said)
    if cfg.precision == "fp16":
        errors.append(f"--pp {pp} with --precision fp16: the schedule runs backward itself, without the loss "
                      "scaler; use bf16 or fp32")
    if cfg.checkpoint_every or cfg.async_checkpoint:
        errors.append(f"--pp {pp} does not checkpoint yet: drop --checkpoint-every / --async-checkpoint")
    if cfg.ddp_comm_hook != "none":  # pp x ddp averages the stages' gradients itself (pp.all_reduce_grads)
        errors.append(f"--pp {pp} with --ddp-comm-hook {cfg.ddp_comm_hook}: the stages' gradients are not reduced by "
                      "torch's DDP under a pipeline; use --ddp-comm-hook none (--grad-reduce-dtype bf16 for bf16)")
    return errors


def state_error(state: StateLayout, strategy: str) -> str | None:
    """Whether the engine can place its state where the layout says (an attribute rule: a preset
    row with state on the host is checked as `--offload` is)."""
    if not state.on_host:
        return None
    kinds = ", ".join(state.on_host)
    if state.engine == "ddp":
        return (f"{strategy} cannot keep {kinds} in host memory (offload): DDP holds every rank's state on its "
                "device; use --offload none, or fsdp / zero1-3 to offload")
    if state.engine == "fsdp" and set(state.on_host) != set(STATE):
        return (f"{strategy} with {kinds} in host memory: FSDP2's CPUOffloadPolicy moves parameters, gradients "
                "and optimizer together; use --offload params")
    if state.engine == "deepspeed" and "params" in state.on_host and state.zero_stage != 3:
        return (f"{strategy} cannot keep parameters in host memory: DeepSpeed offloads parameters at ZeRO stage 3 "
                "only; use --offload optimizer, or zero3")
    return None


def _state_errors(cfg: RunConfig, world_size: int) -> list[str]:
    """Where state lives (--offload) and ZeRO++ (hpZ, qwZ, qgZ), by the layout's attributes."""
    state = state_layout(cfg.strategy, cfg.offload)
    errors = [e for e in (state_error(state, cfg.strategy),) if e]
    mesh = [f"--{name} {degree}" for name, degree in (("tp", cfg.tp), ("pp", cfg.pp)) if degree > 1]
    if state.on_host and state.engine == "fsdp" and mesh and not errors:  # not measured nor planned: refused
        errors.append(f"{cfg.strategy} with state in host memory (--offload {cfg.offload}) is not supported with "
                      f"{' and '.join(mesh)}: offload is measured and planned on data-parallel layouts only; "
                      "use --offload none, or drop " + " and ".join(m.split()[0] for m in mesh))
    if state.on_host and state.engine == "fsdp" and not errors and cfg.dp_degree(world_size) == 1:
        errors.append(f"{cfg.strategy} with state in host memory needs more than one data-parallel rank: alone "
                      "FSDP runs the plain model, which stays on the device; use --offload none or more ranks")
    zeropp = [name for name, on in (("--zero-hpz-partition-size", cfg.zero_hpz_partition_size > 1),
                                    ("--zero-quantized-weights", cfg.zero_quantized_weights),
                                    ("--zero-quantized-gradients", cfg.zero_quantized_gradients)) if on]
    if zeropp and state.zero_stage != 3:
        return errors + [f"{zeropp[0]} is ZeRO++, which applies to ZeRO stage 3: use zero3, or drop it"]
    hpz, dp = cfg.zero_hpz_partition_size, cfg.dp_degree(world_size)
    if hpz > 1 and dp % hpz:
        errors.append(f"--zero-hpz-partition-size {hpz} does not divide the {dp} data-parallel ranks: use a "
                      "divisor of them (the GPUs of one node)")
    if hpz > 1 and "params" in state.on_host:
        errors.append(f"--zero-hpz-partition-size {hpz} keeps a secondary parameter copy on the device, which "
                      "--offload params moves to the host: use one of them")
    if cfg.device == "cpu" and device_error(cfg, "cpu"):
        errors.append(device_error(cfg, "cpu"))  # type: ignore[arg-type]
    return errors


def device_error(cfg: RunConfig, device_type: str) -> str | None:
    """A rule of the resolved device (`--device auto` is known only in the trainer): ZeRO++'s
    quantized collectives (qwZ, qgZ) run CUDA kernels."""
    if device_type != "cuda" and (cfg.zero_quantized_weights or cfg.zero_quantized_gradients):
        which = "--zero-quantized-weights" if cfg.zero_quantized_weights else "--zero-quantized-gradients"
        return f"{which} (ZeRO++ qwZ/qgZ) needs a CUDA GPU (its quantization kernels): drop it on {device_type}"
    return None


def check_gpus_per_worker(cfg: RunConfig, gpus_per_worker: int) -> str | None:
    """A tensor-parallel group must sit inside one worker (its collectives run every layer)."""
    if cfg.tp > 1 and gpus_per_worker % cfg.tp:
        return (f"--tp {cfg.tp} does not divide the {gpus_per_worker} GPUs (ranks) per worker: a "
                "tensor-parallel group must sit inside one worker; use a tp that divides it")
    return None


def validate(cfg: RunConfig, world_size: int) -> list[str]:
    """Every reason `cfg` cannot run at `world_size` ranks, one line
    each; empty when it can. Device checks that need torch.cuda live in trainer.devices."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        return [f"world size must be a positive integer, got {world_size!r}"]
    errors = _field_rule_errors(cfg)
    if errors:  # the rules between fields need well-typed values
        return errors
    return _run_rule_errors(cfg, world_size)


def model_state_bytes(cfg: RunConfig, world_size: int, location: str | None = None) -> int:
    """Model-state bytes one rank will hold (the layout's formula x parameters), in `location`
    (device or host; None: both): what must fit before anything is allocated."""
    state = state_layout(cfg.strategy, cfg.offload)
    precision = "fp32" if cfg.precision == "auto" else cfg.precision
    by_location = state.model_state_bytes_by_location(precision, world_size)
    per_param = sum(by_location.values()) if location is None else by_location[location]
    return int(cfg.model_config().n_params() * per_param)


def check_fits(cfg: RunConfig, world_size: int, ranks_here: int, available_bytes: int, where: str,
               location: str | None = None) -> str | None:
    """A one-line refusal when the model state of `ranks_here` ranks in `location` (device, host,
    or None: all of it) cannot fit in `available_bytes` of `where`, else None."""
    need = model_state_bytes(cfg, world_size, location) * ranks_here
    if need <= available_bytes:
        return None
    return (f"{cfg.model} under {cfg.strategy} needs about {need / 2**30:.1f} GiB of model state "
            f"for {ranks_here} rank(s) here but {where} has {available_bytes / 2**30:.1f} GiB "
            "available: use a smaller --model, more ranks, or a sharding strategy")
