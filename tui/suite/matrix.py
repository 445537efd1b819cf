"""The benchmark matrix: what to run, expanded into one `RunSpec` per run with a unique id.

A matrix is a YAML file (or CLI flags) naming the axes to sweep (strategies x world sizes x seq
lens x repeats), the suite's settings (launcher, backend, shape, timeout) and the trainer's
knobs every run shares. Any field of trainer.config.RunConfig is a matrix key; a list value
sweeps it as one more axis. Every run is checked with the trainer's own rules
(trainer.contract.validate); `expand` reports every problem, one line each, before anything runs.
Cheap to import: no torch (the TUI imports this at start-up).
"""
from __future__ import annotations

import itertools
import math
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from tui.suite import safe_yaml

from trainer import contract
from trainer.config import RunConfig, measured_fields, to_argv
from tui.suite.faults import fault_errors, kube_fault_errors

DEFAULT_MATRIX = Path(__file__).resolve().parent / "matrices" / "default.yaml"
"""The one default matrix of every entry point: `make bench`, `shardbench run`, benchtui."""
CONFIRM_ABOVE = 1000
"""A matrix of more runs than this needs an explicit yes (`--yes`): it would run for days."""
LOCAL_OVERSUBSCRIBE = 4
"""A local run may use at most cores x this many threads in all; past that it measures the
scheduler, not the strategy."""

# Trainer fields the suite sets itself for every run, so a matrix may not.
_SUITE_OWNED = {"strategy", "seq_len", "run_id", "output_dir", "launcher", "repeat", "argv", "checkpoint_dir",
                "resume"}


def _default(name: str) -> Any:
    """RunConfig's default for a field: the one place a trainer knob's default is written."""
    return next(f.default for f in fields(RunConfig) if f.name == name)


@dataclass
class MatrixSpec:
    """A benchmark matrix as written in a matrix YAML file (keys are these field names, plus any
    other trainer.config.RunConfig field in `options`)."""

    strategies: list[str] = field(default_factory=lambda: list(contract.STRATEGIES))
    """Strategies to compare (trainer.contract.STRATEGIES)."""
    world_sizes: list[int] = field(default_factory=lambda: [1, 2])
    """Numbers of devices (ranks) per run; every strategy runs at every world size."""
    seq_lens: list[int] = field(default_factory=lambda: [64])
    """Sequence lengths (tokens); each must be <= the model preset's block size."""
    micro_batch: int = _default("micro_batch")
    """Sequences per rank per forward/backward pass."""
    grad_accum: int | None = 1
    """Micro-steps per optimizer step; ignored when global_batch is set."""
    global_batch: int | None = None
    """Fixed sequences per optimizer step for every world size: grad_accum is derived as
    global_batch / (micro_batch x world_size) and must come out a whole number."""
    model: str = _default("model")
    """Model preset (trainer/presets.py)."""
    precision: str = _default("precision")
    """auto, fp32, bf16 or fp16 (auto: bf16 on a GPU that has it, else fp32)."""
    steps: int = _default("steps")
    """Optimizer steps per run, warm-up included."""
    warmup_steps: int = _default("warmup_steps")
    """Steps excluded from every metric; must be below steps."""
    repeats: int = 1
    """Times every configuration runs; repeats are interleaved and give the report its intervals."""
    launcher: str = "auto"
    """mpirun, deepspeed, torchrun, or auto (each strategy's default launcher)."""
    backend: str = "local"
    """local (this machine) or kubernetes (one Helm release per run)."""
    shape: str | None = "cpu"
    """GPU shape = values/<shape>.yaml (peak FLOP/s, $/GPU-hour, GPUs per node); None: unknown."""
    device: str = _default("device")
    """Trainer --device: auto, cpu or cuda."""
    usd_per_gpu_hour: float | None = None
    """Price of one device-hour for the cost report; None: the shape's usdPerGpuHour."""
    timeout_s: float | None = 600.0
    """Per-run wall-clock limit in seconds (the run becomes status timeout); None: no limit."""
    seed: int = _default("seed")
    """Trainer --seed; the same for every run so every strategy sees the same tokens."""
    max_world_size: int | None = None
    """Devices the backend may use at most (cluster capacity); None: what the shape allows."""
    faults: list[str] = field(default_factory=lambda: ["none"])
    """Faults to inject, one axis: none, kill-rank:R@S, stop-rank:R@S, kill-launcher@S (rank R,
    optimizer step S; tui/suite/faults.py). A faulty run checkpoints and is relaunched."""
    max_restarts: int = 2
    """Relaunches of a run that failed (with --resume auto from its checkpoints), for faulty runs."""
    results: str = "results/default"
    """Results directory: results/<run id>/ for every run (a suite locks it while it writes)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Any other trainer knob (a trainer.config.RunConfig field), e.g. {activation_checkpointing:
    true}; a list sweeps it. Written in YAML as top-level keys."""


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
    run: dict[str, Any] = field(default_factory=dict, compare=False)
    """The values file's `run:` defaults, as matrix keys (model, seq_lens, precision, device...)."""


# values/<shape>.yaml `run:` keys -> the matrix keys they give defaults for.
SHAPE_RUN_KEYS = {"model": "model", "seqLen": "seq_lens", "microBatch": "micro_batch",
                  "precision": "precision", "device": "device", "steps": "steps",
                  "warmupSteps": "warmup_steps"}


@dataclass(frozen=True)
class RunSpec:
    """One run of the matrix: everything the backend needs to start it and the report to label it."""

    run_id: str
    """Unique id, e.g. zero3-w4-s2048-mb1-ga4-1f2e3d4c-r0 (results/<run_id>/)."""
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
    options: tuple[tuple[str, Any], ...] = ()
    """Other trainer knobs, as (RunConfig field, value) pairs."""
    config_id: str = ""
    """Hash of everything that changes the measurement; repeats share it (trainer.contract)."""
    fault: str = "none"
    """The fault injected into this run (tui/suite/faults.py), or none."""
    max_restarts: int = 0
    """Relaunches allowed after a failure (faulty runs)."""

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.world_size

    def run_config(self, output_dir: str | os.PathLike | None = None) -> RunConfig:
        """The trainer's config for this run (what its command line parses back into)."""
        return RunConfig(
            strategy=self.strategy, model=self.model, seq_len=self.seq_len, micro_batch=self.micro_batch,
            grad_accum=self.grad_accum, steps=self.steps, warmup_steps=self.warmup_steps,
            precision=self.precision, seed=self.seed, device=self.device, run_id=self.run_id or None,
            shape=self.shape, peak_tflops=self.peak_tflops, usd_per_gpu_hour=self.usd_per_gpu_hour,
            output_dir=None if output_dir is None else str(output_dir), repeat=self.repeat,
            **dict(self.options))

    def trainer_args(self, output_dir: str | os.PathLike | None = None) -> list[str]:
        """The trainer's command line for this run."""
        names = ["strategy", "model", "seq_len", "micro_batch", "grad_accum", "steps", "warmup_steps",
                 "precision", "seed", "device", "run_id", "shape", "peak_tflops", "usd_per_gpu_hour",
                 "output_dir"]
        return to_argv(self.run_config(output_dir), names) + self.option_args()

    def option_args(self, skip=()) -> list[str]:
        """The flags beyond the standard ones (the matrix's other knobs, the repeat): what the
        chart's run.extraArgs carries for a cluster run (less the knobs in `skip`)."""
        names = [k for k, _ in self.options if k not in skip] + (["repeat"] if self.repeat else [])
        return to_argv(self.run_config(), names)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["options"] = dict(self.options)
        return data


# --- YAML -----------------------------------------------------------------------------------

_MATRIX_KEYS = {f.name for f in fields(MatrixSpec)} - {"options"}
_OPTION_KEYS = {f.name for f in fields(RunConfig)} - _MATRIX_KEYS - _SUITE_OWNED


def matrix_from_dict(data: Any) -> MatrixSpec:
    """Build a MatrixSpec from a mapping; unknown keys are an error (typos must not be ignored).
    Types are checked by expand(), which says what is wrong with each value."""
    if not isinstance(data, dict):
        raise ValueError("a matrix must be a mapping of matrix keys (see tui/suite/matrices/default.yaml)")
    data = dict(data)
    options = data.pop("options", None) or {}
    if not isinstance(options, dict):
        raise ValueError("options must be a mapping of trainer knobs")
    options.update({k: data.pop(k) for k in list(data) if k in _OPTION_KEYS})
    unknown = sorted(map(str, set(data) - _MATRIX_KEYS))
    unknown += sorted(map(str, set(options) - _OPTION_KEYS))
    if unknown:
        raise ValueError(f"unknown matrix key(s): {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(_MATRIX_KEYS | _OPTION_KEYS))})")
    for key in ("strategies", "world_sizes", "seq_lens", "faults"):
        if key in data and not isinstance(data[key], list):
            data[key] = [data[key]]  # a scalar means a one-element axis
    return MatrixSpec(**data, options=options)


def load_matrix(path: str | os.PathLike) -> MatrixSpec:
    """Read a matrix YAML file; raises ValueError with one line on bad content."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        raise ValueError(f"cannot read matrix {path}: {exc.strerror or exc}") from None
    data = safe_yaml.load(text, str(path)) or {}  # bounded aliases, depth, no NUL (ValueError)
    try:
        return matrix_from_dict(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def default_matrix() -> MatrixSpec:
    return load_matrix(DEFAULT_MATRIX)


def save_matrix(spec: MatrixSpec, path: str | os.PathLike) -> None:
    data = asdict(spec)
    data.update(data.pop("options"))
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))


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
        values = safe_yaml.load(path.read_text(errors="replace"), str(path)) or {}
        data, run = values.get("shape") or {}, values.get("run") or {}
        defaults = {SHAPE_RUN_KEYS[k]: ([v] if k == "seqLen" else v) for k, v in run.items() if k in SHAPE_RUN_KEYS}
        return Shape(name=name, gpus_per_node=_opt(data.get("gpusPerNode"), int),
                     peak_tflops=_opt(data.get("peakTflopsBf16"), float),
                     usd_per_gpu_hour=_opt(data.get("usdPerGpuHour"), float), run=defaults)
    except (yaml.YAMLError, AttributeError, TypeError, ValueError):
        raise ValueError(f"{path}: not a values file with a `shape:` mapping of numbers") from None


def _opt(value, kind):
    return None if value is None else kind(value)


def with_shape_defaults(matrix: MatrixSpec, explicit: set[str]) -> MatrixSpec:
    """A cluster matrix takes model, seq len, batch, precision, device and steps from its shape's
    values file, except the keys the user set (`explicit`): `--backend kubernetes --shape h100`
    must not inherit the CPU defaults (device cpu, fp32, tiny) that the chart would refuse."""
    if matrix.backend != "kubernetes" or not matrix.shape:
        return matrix
    try:
        shape = load_shape(matrix.shape)
    except ValueError:
        return matrix  # expand() reports the missing shape
    return replace(matrix, **{k: v for k, v in shape.run.items() if k not in explicit})


def local_gpu_count() -> int:
    """NVIDIA GPUs the driver shows on this machine, read without torch (0 without a driver)."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


# --- checks of the suite's own settings ------------------------------------------------------

def _is_int(x: Any, low: int = 1) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


def _is_number(x: Any, low: float = 0.0) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            and x >= low)


def _suite_errors(m: MatrixSpec) -> list[str]:
    """The settings only the suite reads: launcher, backend, repeats, limits, the axes' types."""
    errors = []
    if m.launcher != "auto" and m.launcher not in contract.LAUNCHERS:
        errors.append(f"launcher got {m.launcher!r}: use auto or one of {', '.join(contract.LAUNCHERS)}")
    if m.backend not in contract.BACKENDS:
        errors.append(f"backend got {m.backend!r}: use one of {', '.join(contract.BACKENDS)}")
    elif m.backend == "kubernetes" and m.launcher not in ("auto", *contract.CLUSTER_LAUNCHERS):
        errors.append(f"launcher {m.launcher} cannot run on the kubernetes backend (an MPIJob "
                      f"starts its ranks with mpirun): use one of {', '.join(contract.CLUSTER_LAUNCHERS)}")
    if not _is_int(m.repeats):
        errors.append(f"repeats must be a positive integer, got {m.repeats!r}")
    if m.usd_per_gpu_hour is not None and not _is_number(m.usd_per_gpu_hour):
        errors.append(f"usd_per_gpu_hour must be a number >= 0, got {m.usd_per_gpu_hour!r}")
    if m.timeout_s is not None and not (_is_number(m.timeout_s) and m.timeout_s > 0):
        errors.append(f"timeout_s must be a positive number of seconds, got {m.timeout_s!r}")
    if not isinstance(m.results, str) or not m.results:
        errors.append(f"results must be a directory path, got {m.results!r}")
    if m.max_world_size is not None and not _is_int(m.max_world_size):
        errors.append(f"max_world_size must be a positive integer, got {m.max_world_size!r}")
    if not _is_int(m.max_restarts, 0):
        errors.append(f"max_restarts must be an integer >= 0, got {m.max_restarts!r}")
    if m.backend == "kubernetes" and isinstance(m.faults, list):
        errors += [e for f in m.faults for e in kube_fault_errors(f)]
    for name, kind in (("strategies", str), ("world_sizes", int), ("seq_lens", int), ("faults", str)):
        axis = getattr(m, name)
        if not isinstance(axis, list) or not axis:
            errors.append(f"{name} must be a non-empty list, got {axis!r}")
        elif any(not isinstance(v, kind) or isinstance(v, bool) or isinstance(v, (list, dict)) for v in axis):
            errors.append(f"{name} must hold {'names' if kind is str else 'integers'}, got {axis!r}")
        elif len(set(axis)) != len(axis):
            errors.append(f"{name} repeats a value: {axis!r}")
    for name, value in m.options.items():
        if isinstance(value, list) and (not value or len(set(map(repr, value))) != len(value)):
            errors.append(f"{name} must be a non-empty list of distinct values, got {value!r}")
    return errors


def _world_limit(m: MatrixSpec, shape: Shape | None, threads_per_rank: int) -> tuple[int | None, str]:
    """Most ranks one run may use, and why."""
    if _is_int(m.max_world_size):
        return m.max_world_size, "max_world_size"
    if m.backend != "local":
        return None, ""
    if shape is not None and shape.gpus_per_node and m.device != "cpu":
        return shape.gpus_per_node, f"shape {shape.name} has {shape.gpus_per_node} GPUs per node"
    cores = os.cpu_count() or 1
    limit = max(1, cores * LOCAL_OVERSUBSCRIBE // max(1, threads_per_rank))
    return limit, (f"this machine has {cores} cores; ranks x threads per rank may be at most "
                   f"{LOCAL_OVERSUBSCRIBE} x cores (set max_world_size to force more)")


def _layout(m: MatrixSpec, shape: Shape | None, world: int) -> tuple[int, int] | str:
    """(nodes, procs_per_node) for a run of `world` ranks, or an error."""
    gpn = shape.gpus_per_node if shape is not None else None
    if m.backend == "local" or not gpn or world <= gpn:
        return 1, world
    if world % gpn:
        return f"world size {world} spans nodes of {gpn} GPUs ({shape.name}) but is not a multiple of {gpn}"
    return world // gpn, gpn


# --- expansion ------------------------------------------------------------------------------

def run_count(m: MatrixSpec) -> int:
    """Runs the matrix expands into, computed without expanding it."""
    axes = [m.strategies, m.world_sizes, m.seq_lens, m.faults] + [v for v in m.options.values() if isinstance(v, list)]
    sizes = [len(a) if isinstance(a, list) else 1 for a in axes]
    return math.prod(sizes) * (m.repeats if _is_int(m.repeats) else 1)


def _option_combinations(m: MatrixSpec) -> list[tuple[tuple[str, Any], ...]]:
    names = sorted(m.options)
    values = [m.options[n] if isinstance(m.options[n], list) else [m.options[n]] for n in names]
    return [tuple(zip(names, combo)) for combo in itertools.product(*values)]


def _trainer_config(m: MatrixSpec, strategy: str, seq: int, options) -> RunConfig:
    return RunConfig(strategy=strategy, model=m.model, seq_len=seq, micro_batch=m.micro_batch,
                     grad_accum=None if m.global_batch is not None else m.grad_accum, global_batch=m.global_batch, steps=m.steps,
                     warmup_steps=m.warmup_steps, precision=m.precision, seed=m.seed, device=m.device,
                     **dict(options))


def expand(matrix: MatrixSpec, limit: int | None = CONFIRM_ABOVE) -> tuple[list[RunSpec], list[str]]:
    """All run specs of the matrix, and one line per problem (empty when all valid).

    Each configuration is checked once with the trainer's rules (trainer.contract.validate) and
    the suite's (launcher, backend, world-size limits). Order: strategy, world size, seq len,
    options, repeat; the runner interleaves repeats. `limit`: more runs than this is an error
    that says how to confirm (None: no limit).
    """
    errors = _suite_errors(matrix)
    shape = None
    if matrix.shape:
        try:
            shape = load_shape(matrix.shape)
        except ValueError as exc:
            errors.append(str(exc))
    if shape is not None and matrix.backend == "local" and shape.gpus_per_node and not local_gpu_count():
        errors.append(f"shape {shape.name} describes GPU nodes but this machine has no NVIDIA GPU: run it "
                      "with --backend kubernetes, or locally with --shape cpu (or --shape none)")
    if errors:
        return [], _dedupe(errors)
    count = run_count(matrix)
    if limit is not None and count > limit:
        return [], [f"the matrix expands into {count:,} runs (more than {limit:,}): confirm with --yes, "
                    "or sweep fewer values"]
    specs: list[RunSpec] = []
    for strategy, world, seq, options, fault in itertools.product(
            matrix.strategies, matrix.world_sizes, matrix.seq_lens, _option_combinations(matrix), matrix.faults):
        made = _configuration(matrix, shape, strategy, world, seq, options, fault)
        if isinstance(made, list):
            errors += made
        else:
            specs += [replace(made, repeat=r, run_id=_repeat_id(made, r)) for r in range(matrix.repeats)]
    return ([], _dedupe(errors)) if errors else (specs, [])


def _configuration(m: MatrixSpec, shape: Shape | None, strategy: str, world: int, seq: int,
                   options, fault: str = "none") -> RunSpec | list[str]:
    """Repeat 0 of one configuration, or its problems."""
    cfg = _trainer_config(m, strategy, seq, options)
    if cfg.checkpoint_every and not cfg.checkpoint_dir:
        cfg = replace(cfg, checkpoint_dir="<run dir>/checkpoints")  # the suite gives every run its own
    errors = [_matrix_wording(e) for e in contract.validate(cfg, world)] + fault_errors(fault, world, m.steps)
    if errors:
        return errors
    limit, why = _world_limit(m, shape, getattr(cfg, "threads_per_rank", 1))
    if limit is not None and world > limit:
        return [f"world size {world} is larger than allowed ({limit}: {why})"]
    layout = _layout(m, shape, world)
    if isinstance(layout, str):
        return [layout]
    nodes, ppn = layout
    launcher = contract.default_launcher(strategy) if m.launcher == "auto" else m.launcher
    peak = shape.peak_tflops if shape else None
    cfg = replace(cfg, shape=m.shape, peak_tflops=peak)
    measured = measured_fields(cfg, world, nodes, launcher)
    # A fault and the restarts allowed change the outcome; fault-free ids stay as they were.
    cid = contract.config_id(measured if fault == "none" else {**measured, "fault": fault,
                                                                "max_restarts": m.max_restarts})
    ga = cfg.effective_grad_accum(world)
    return RunSpec(
        run_id=contract.run_id(strategy, world, seq, m.micro_batch, ga, cid, 0), strategy=strategy,
        world_size=world, seq_len=seq, micro_batch=m.micro_batch, grad_accum=ga, model=m.model,
        precision=m.precision, steps=m.steps, warmup_steps=m.warmup_steps, repeat=0, launcher=launcher,
        backend=m.backend, shape=m.shape, nodes=nodes, procs_per_node=ppn, device=m.device, seed=m.seed,
        peak_tflops=peak, usd_per_gpu_hour=_price(m, shape), timeout_s=m.timeout_s,
        options=tuple(options), config_id=cid, fault=fault,
        max_restarts=m.max_restarts if fault != "none" else 0)


def _repeat_id(spec: RunSpec, repeat: int) -> str:
    return contract.run_id(spec.strategy, spec.world_size, spec.seq_len, spec.micro_batch, spec.grad_accum,
                           spec.config_id, repeat)


def _matrix_wording(error: str) -> str:
    """The trainer's rule, said with the matrix key a YAML author wrote (--micro-batch -> micro_batch)."""
    words = []
    for word in error.split(" "):
        if word.startswith("--") and len(word) > 2:
            word = word[2:].replace("-", "_")
        words.append(word)
    return " ".join(words)


def _price(matrix: MatrixSpec, shape: Shape | None) -> float | None:
    if matrix.usd_per_gpu_hour is not None:
        return matrix.usd_per_gpu_hour
    return shape.usd_per_gpu_hour if shape else None


def _dedupe(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))


__all__ = ["CONFIRM_ABOVE", "DEFAULT_MATRIX", "MatrixSpec", "RunSpec", "Shape", "default_matrix", "expand",
           "load_matrix", "load_shape", "local_gpu_count", "matrix_from_dict", "run_count", "save_matrix",
           "values_dir", "with_shape_defaults"]
