"""The benchmark matrix: what to run, expanded into one `RunSpec` per run with a stable id.

A matrix is a YAML file (or CLI flags) naming the axes to sweep (strategies x world sizes x seq
lens x repeats) and the settings every run shares (model, precision, batch, steps, launcher,
backend, shape). `expand` turns it into run specs and reports every invalid combination, one line
each, before anything runs. Cheap to import: no torch (the TUI imports this at start-up).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

# The trainer's own tables (torch-free modules): one list of strategies, launchers, precisions.
from trainer.config import DEVICES, PRECISIONS, STRATEGIES
from trainer.launchers import LAUNCHERS
from tui.suite.presets import PRESETS, preset_max_seq_len

BACKENDS = ("local", "kubernetes")
# launcher: auto picks the launcher that strategy is normally started with: DeepSpeed's own for
# ZeRO, mpirun (the MPIJob path) for the PyTorch-native strategies.
AUTO_LAUNCHER = {"ddp": "mpirun", "fsdp": "mpirun", "zero1": "deepspeed", "zero2": "deepspeed",
                 "zero3": "deepspeed"}
# A CPU run oversubscribes the cores; past this many ranks it measures the scheduler, not gloo.
LOCAL_CPU_MAX_WORLD = 8


@dataclass
class MatrixSpec:
    """A benchmark matrix as written in a matrix YAML file (keys are these field names)."""

    strategies: list[str] = field(default_factory=lambda: ["ddp", "fsdp", "zero2", "zero3"])
    """Strategies to compare: ddp, fsdp, zero1, zero2, zero3."""
    world_sizes: list[int] = field(default_factory=lambda: [1, 2])
    """Numbers of devices (ranks) per run; every strategy runs at every world size."""
    seq_lens: list[int] = field(default_factory=lambda: [64])
    """Sequence lengths (tokens); each must be <= the model preset's block size."""
    micro_batch: int = 4
    """Sequences per rank per forward/backward pass."""
    grad_accum: int | None = 1
    """Micro-steps per optimizer step; ignored when global_batch is set."""
    global_batch: int | None = None
    """Fixed sequences per optimizer step for every world size: grad_accum is derived as
    global_batch / (micro_batch x world_size) and must come out a whole number."""
    model: str = "tiny"
    """Model preset (trainer presets: tiny, gpt2-124m, gpt2-350m, gpt2-1.3b, llama-7b-shape)."""
    precision: str = "auto"
    """auto, fp32, bf16 or fp16 (auto: bf16 on a GPU that has it, else fp32)."""
    steps: int = 10
    """Optimizer steps per run, warm-up included."""
    warmup_steps: int = 3
    """Steps excluded from every metric; must be below steps."""
    repeats: int = 1
    """Times every combination runs (mean +- spread in the report when > 1)."""
    launcher: str = "auto"
    """mpirun, deepspeed, torchrun, or auto (deepspeed for ZeRO, mpirun for ddp/fsdp)."""
    backend: str = "local"
    """local (this machine) or kubernetes (one Helm release per run)."""
    shape: str | None = "cpu"
    """GPU shape = values/<shape>.yaml (peak FLOP/s, $/GPU-hour, GPUs per node); None: unknown."""
    device: str = "auto"
    """Trainer --device: auto, cpu or cuda."""
    usd_per_gpu_hour: float | None = None
    """Price of one device-hour for the cost report; None: the shape's usdPerGpuHour."""
    timeout_s: float | None = 600.0
    """Per-run wall-clock limit in seconds (the run becomes status timeout); None: no limit."""
    seed: int = 1234
    """Trainer --seed; the same for every run so every strategy sees the same tokens."""
    max_world_size: int | None = None
    """Devices the backend may use at most (cluster capacity); None: what the shape allows."""
    extra_args: list[str] = field(default_factory=list)
    """Extra trainer flags appended to every run, e.g. ["--activation-checkpointing"]."""


@dataclass(frozen=True)
class Shape:
    """The part of values/<shape>.yaml the suite uses."""

    name: str
    gpus_per_node: int | None = None
    """Devices per machine (slotsPerWorker); bounds a local run's world size."""
    peak_tflops: float | None = None
    """Dense bf16 peak of one device, TFLOP/s (MFU)."""
    usd_per_gpu_hour: float | None = None
    """Price of one device-hour (cost per million tokens)."""
    gpu_model: str | None = None


@dataclass(frozen=True)
class RunSpec:
    """One run of the matrix: everything the backend needs to start it and the report to label it."""

    run_id: str
    """Stable id, e.g. zero3-w4-s2048-mb1-ga4-r0 (results/<run_id>/)."""
    strategy: str
    world_size: int
    seq_len: int
    micro_batch: int
    grad_accum: int
    model: str
    precision: str
    steps: int
    warmup_steps: int
    repeat: int
    """0-based repeat index."""
    launcher: str
    """mpirun, deepspeed or torchrun (auto already resolved)."""
    backend: str
    shape: str | None = None
    nodes: int = 1
    """Machines the run spans (1 locally; world_size / gpus_per_node on a cluster)."""
    procs_per_node: int = 1
    """Ranks per machine."""
    device: str = "auto"
    seed: int = 1234
    peak_tflops: float | None = None
    usd_per_gpu_hour: float | None = None
    timeout_s: float | None = None
    extra_args: tuple[str, ...] = ()

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.world_size

    def trainer_args(self, output_dir: str | os.PathLike | None = None) -> list[str]:
        """The trainer's command line (docs/CONTRACTS.md) for this run."""
        args = [
            "--strategy", self.strategy, "--model", self.model,
            "--seq-len", str(self.seq_len), "--micro-batch", str(self.micro_batch),
            "--grad-accum", str(self.grad_accum), "--steps", str(self.steps),
            "--warmup-steps", str(self.warmup_steps), "--precision", self.precision,
            "--seed", str(self.seed), "--device", self.device, "--run-id", self.run_id,
        ]
        if self.shape:
            args += ["--shape", self.shape]
        if self.peak_tflops is not None:
            args += ["--peak-tflops", _num(self.peak_tflops)]
        if self.usd_per_gpu_hour is not None:
            args += ["--usd-per-gpu-hour", _num(self.usd_per_gpu_hour)]
        if output_dir is not None:
            args += ["--output-dir", str(output_dir)]
        return args + list(self.extra_args)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["extra_args"] = list(self.extra_args)
        return data


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def run_id(strategy: str, world_size: int, seq_len: int, micro_batch: int, grad_accum: int,
           repeat: int) -> str:
    return f"{strategy}-w{world_size}-s{seq_len}-mb{micro_batch}-ga{grad_accum}-r{repeat}"


# --- YAML -----------------------------------------------------------------------------------

def matrix_from_dict(data: dict[str, Any]) -> MatrixSpec:
    """Build a MatrixSpec from a mapping; unknown keys are an error (typos must not be ignored)."""
    if not isinstance(data, dict):
        raise ValueError("a matrix must be a mapping of MatrixSpec fields")
    known = {f.name for f in fields(MatrixSpec)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown matrix key(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    data = dict(data)
    for key in ("strategies", "world_sizes", "seq_lens", "extra_args"):
        if key in data and not isinstance(data[key], list):
            data[key] = [data[key]]  # a scalar means a one-element axis
    return MatrixSpec(**data)


def load_matrix(path: str | os.PathLike) -> MatrixSpec:
    """Read a matrix YAML file; raises ValueError with one line on bad content."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    try:
        return matrix_from_dict(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def save_matrix(spec: MatrixSpec, path: str | os.PathLike) -> None:
    Path(path).write_text(yaml.safe_dump(asdict(spec), sort_keys=False))


# --- shapes ---------------------------------------------------------------------------------

def values_dir() -> Path:
    """values/ of this checkout (SHARDBENCH_VALUES_DIR overrides)."""
    env = os.environ.get("SHARDBENCH_VALUES_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "values"


def load_shape(name: str, directory: Path | None = None) -> Shape:
    """Read values/<name>.yaml `shape:`; raises ValueError when missing or malformed."""
    directory = directory or values_dir()
    path = directory / f"{name}.yaml"
    if not path.is_file():
        have = sorted(p.stem for p in directory.glob("*.yaml")) if directory.is_dir() else []
        raise ValueError(f"unknown shape {name!r}: no {path} (have: {', '.join(have) or 'none'})")
    try:
        data = (yaml.safe_load(path.read_text()) or {}).get("shape") or {}
    except (yaml.YAMLError, AttributeError):
        raise ValueError(f"{path}: not a values file with a `shape:` mapping") from None
    return Shape(
        name=name,
        gpus_per_node=_opt(data.get("gpusPerNode"), int),
        peak_tflops=_opt(data.get("peakTflopsBf16"), float),
        usd_per_gpu_hour=_opt(data.get("usdPerGpuHour"), float),
        gpu_model=data.get("gpuModel"),
    )


def _opt(value, kind):
    return None if value is None else kind(value)


# --- expansion ------------------------------------------------------------------------------

def _pos_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _scalar_errors(m: MatrixSpec) -> list[str]:
    errors = [f"unknown strategy {s!r}: use one of {', '.join(STRATEGIES)}"
              for s in m.strategies if s not in STRATEGIES]
    if m.launcher != "auto" and m.launcher not in LAUNCHERS:
        errors.append(f"unknown launcher {m.launcher!r}: use auto or one of {', '.join(LAUNCHERS)}")
    if m.precision not in PRECISIONS:
        errors.append(f"unknown precision {m.precision!r}: use one of {', '.join(PRECISIONS)}")
    if m.backend not in BACKENDS:
        errors.append(f"unknown backend {m.backend!r}: use one of {', '.join(BACKENDS)}")
    if m.device not in DEVICES:
        errors.append(f"unknown device {m.device!r}: use one of {', '.join(DEVICES)}")
    if m.model not in PRESETS:
        errors.append(f"unknown model preset {m.model!r}: use one of {', '.join(PRESETS)}")
    for name in ("micro_batch", "steps", "repeats"):
        if not _pos_int(getattr(m, name)):
            errors.append(f"{name} must be a positive integer, got {getattr(m, name)!r}")
    if not isinstance(m.warmup_steps, int) or isinstance(m.warmup_steps, bool) or m.warmup_steps < 0:
        errors.append(f"warmup_steps must be an integer >= 0, got {m.warmup_steps!r}")
    elif _pos_int(m.steps) and m.warmup_steps >= m.steps:
        errors.append(f"warmup_steps ({m.warmup_steps}) must be below steps ({m.steps}): nothing would be measured")
    if m.global_batch is None and not _pos_int(m.grad_accum):
        errors.append(f"grad_accum must be a positive integer, got {m.grad_accum!r}")
    if m.global_batch is not None and not _pos_int(m.global_batch):
        errors.append(f"global_batch must be a positive integer, got {m.global_batch!r}")
    if m.usd_per_gpu_hour is not None and not (_number(m.usd_per_gpu_hour) and m.usd_per_gpu_hour >= 0):
        errors.append(f"usd_per_gpu_hour must be a number >= 0, got {m.usd_per_gpu_hour!r}")
    if m.timeout_s is not None and not (_number(m.timeout_s) and m.timeout_s > 0):
        errors.append(f"timeout_s must be a positive number of seconds, got {m.timeout_s!r}")
    if m.max_world_size is not None and not _pos_int(m.max_world_size):
        errors.append(f"max_world_size must be a positive integer, got {m.max_world_size!r}")
    if not m.strategies:
        errors.append("strategies is empty")
    if not m.world_sizes:
        errors.append("world_sizes is empty")
    if not m.seq_lens:
        errors.append("seq_lens is empty")
    return errors


def _world_limit(m: MatrixSpec, shape: Shape | None) -> tuple[int | None, str]:
    """Most ranks one run may use, and why."""
    if _pos_int(m.max_world_size):
        return m.max_world_size, "max_world_size"
    if m.backend == "local":
        if shape is not None and shape.gpus_per_node and shape.name != "cpu":
            return shape.gpus_per_node, f"shape {shape.name} has {shape.gpus_per_node} GPUs per node"
        return LOCAL_CPU_MAX_WORLD, "a local CPU run oversubscribes the cores"
    return None, ""


def _layout(m: MatrixSpec, shape: Shape | None, world: int) -> tuple[int, int] | str:
    """(nodes, procs_per_node) for a run of `world` ranks, or an error."""
    gpn = shape.gpus_per_node if shape is not None else None
    if m.backend == "local" or not gpn or world <= gpn:
        return 1, world
    if world % gpn:
        return f"world size {world} spans nodes of {gpn} GPUs ({shape.name}) but is not a multiple of {gpn}"
    return world // gpn, gpn


def _grad_accum(m: MatrixSpec, world: int) -> int | str:
    if m.global_batch is None:
        return m.grad_accum
    per_step = m.micro_batch * world
    if m.global_batch % per_step or m.global_batch < per_step:
        return (f"global batch {m.global_batch} is not a multiple of micro_batch {m.micro_batch} "
                f"x world size {world} = {per_step}")
    return m.global_batch // per_step


def _axis_errors(m: MatrixSpec, shape: Shape | None) -> list[str]:
    errors = []
    limit, why = _world_limit(m, shape)
    for world in m.world_sizes:
        if not isinstance(world, int) or isinstance(world, bool) or world < 1:
            errors.append(f"world size must be a positive integer, got {world!r}")
        elif limit is not None and world > limit:
            errors.append(f"world size {world} is larger than allowed ({limit}: {why})")
    max_seq = preset_max_seq_len(m.model) if m.model in PRESETS else None
    for seq in m.seq_lens:
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            errors.append(f"seq len must be a positive integer, got {seq!r}")
        elif max_seq is not None and seq > max_seq:
            errors.append(f"seq len {seq} is above the {m.model} preset's block size {max_seq}")
    return errors


def _combination_errors(m: MatrixSpec, shape: Shape | None) -> list[str]:
    """Per world size: grad-accum from the global batch, and how the ranks map onto nodes."""
    found = [_grad_accum(m, w) for w in m.world_sizes] + [_layout(m, shape, w) for w in m.world_sizes]
    return [x for x in found if isinstance(x, str)]


def expand(matrix: MatrixSpec) -> tuple[list[RunSpec], list[str]]:
    """All run specs of the matrix, and one line per invalid combination (empty when all valid).

    Order: strategy, then world size, then seq len, then repeat, so a sequential run finishes one
    strategy's scaling curve before the next.
    """
    errors = _scalar_errors(matrix)
    shape = None
    if matrix.shape:
        try:
            shape = load_shape(matrix.shape)
        except ValueError as exc:
            errors.append(str(exc))
    errors += _axis_errors(matrix, shape)
    if errors:  # the combinations need valid numbers to be computed at all
        return [], _dedupe(errors)
    errors = _combination_errors(matrix, shape)
    if errors:
        return [], _dedupe(errors)
    specs = [_spec(matrix, shape, strategy, world, seq, rep)
             for strategy in matrix.strategies for world in matrix.world_sizes
             for seq in matrix.seq_lens for rep in range(matrix.repeats)]
    ids = [s.run_id for s in specs]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        return [], [f"duplicate run id {d} (a value repeated on an axis?)" for d in dupes]
    return specs, []


def _spec(m: MatrixSpec, shape: Shape | None, strategy: str, world: int, seq: int, rep: int) -> RunSpec:
    ga = _grad_accum(m, world)
    nodes, ppn = _layout(m, shape, world)
    return RunSpec(
        run_id=run_id(strategy, world, seq, m.micro_batch, ga, rep), strategy=strategy,
        world_size=world, seq_len=seq, micro_batch=m.micro_batch, grad_accum=ga, model=m.model,
        precision=m.precision, steps=m.steps, warmup_steps=m.warmup_steps, repeat=rep,
        launcher=AUTO_LAUNCHER[strategy] if m.launcher == "auto" else m.launcher,
        backend=m.backend, shape=m.shape, nodes=nodes, procs_per_node=ppn, device=m.device,
        seed=m.seed, peak_tflops=shape.peak_tflops if shape else None,
        usd_per_gpu_hour=_price(m, shape), timeout_s=m.timeout_s, extra_args=tuple(m.extra_args),
    )


def _price(matrix: MatrixSpec, shape: Shape | None) -> float | None:
    if matrix.usd_per_gpu_hour is not None:
        return matrix.usd_per_gpu_hour
    return shape.usd_per_gpu_hour if shape else None


def _dedupe(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))
