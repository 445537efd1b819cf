"""The benchmark matrix: what to run, expanded into one `RunSpec` per run with a unique id.

A matrix is a YAML file (or CLI flags) naming the axes to sweep (strategies x world sizes x seq
lens x repeats), the suite's settings (launcher, backend, shape, timeout) and the trainer's
knobs every run shares. Any field of trainer.config.RunConfig is a matrix key; a list value
sweeps it as one more axis. Every run is checked with the trainer's own rules
(trainer.rules.validate); `expand` reports every problem, one line each, before anything runs.
Cheap to import: no torch (the TUI imports this at start-up).
"""
from __future__ import annotations

import itertools
import math
import os
import re
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import yaml

from shardbench.trainer import contract, knobs, rules
from shardbench.trainer.config import RunConfig, id_fields
from shardbench.suite.matrix import safe_yaml
from shardbench.suite.faults.grammar import fault_errors, kube_fault_errors
from shardbench.suite.matrix.specs import (_SUITE_OWNED, KNOB_KEYS, SHAPE_RUN_KEYS, STANDARD_ARGS,  # noqa: F401 (re-exported)
                             MatrixSpec, RunSpec, Shape)

DEFAULT_MATRIX = Path(__file__).resolve().parents[1] / "matrices" / "default.yaml"
"""The one default matrix of every entry point: `make bench`, `shardbench run`, benchtui."""
CONFIRM_ABOVE = 1000
"""A matrix of more runs than this needs an explicit yes (`--yes`): it would run for days."""
LOCAL_OVERSUBSCRIBE = 4
"""A local run may use at most cores x this many threads in all; past that it measures the
scheduler, not the strategy."""

# --- YAML -----------------------------------------------------------------------------------

_MATRIX_KEYS = {f.name for f in fields(MatrixSpec)} - {"overrides"}
_OPTION_KEYS = set(KNOB_KEYS)


def matrix_from_dict(data: Any) -> MatrixSpec:
    """Build a MatrixSpec from a mapping; unknown keys are an error (typos must not be ignored).
    Types are checked by expand(), which says what is wrong with each value."""
    if not isinstance(data, dict):
        raise ValueError("a matrix must be a mapping of matrix keys (see suite/matrices/default.yaml)")
    data = dict(data)
    overrides = data.pop("overrides", None) or {}
    if not isinstance(overrides, dict):
        raise ValueError("overrides must be a mapping of trainer knobs")
    overrides.update({k: data.pop(k) for k in list(data) if k in _OPTION_KEYS})
    unknown = sorted(map(str, set(data) - _MATRIX_KEYS))
    unknown += sorted(map(str, set(overrides) - _OPTION_KEYS))
    if unknown:
        raise ValueError(f"unknown matrix key(s): {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(_MATRIX_KEYS | _OPTION_KEYS))})")
    for key in ("strategies", "world_sizes", "seq_lens", "faults"):
        if key in data and not isinstance(data[key], list):
            data[key] = [data[key]]  # a scalar means a one-element axis
    return MatrixSpec(**data, overrides=overrides)


def load_matrix(path: str | os.PathLike) -> MatrixSpec:
    """Read a matrix YAML file; raises ValueError with one line on bad content."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read matrix {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:  # replacing the bytes would silently change a name or a path
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line}): "
                         "save the file as UTF-8") from None
    data = safe_yaml.load(text, str(path)) or {}  # bounded aliases, depth, no NUL (ValueError)
    try:
        return matrix_from_dict(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def default_matrix() -> MatrixSpec:
    return load_matrix(DEFAULT_MATRIX)


def save_matrix(spec: MatrixSpec, path: str | os.PathLike) -> None:
    data = asdict(spec)
    if data.get("layouts") is None:
        data.pop("layouts", None)  # the usual matrix: every combination
    data.update(data.pop("overrides"))
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))


# --- shapes ---------------------------------------------------------------------------------

def values_dir() -> Path:
    """values/ of this checkout (SHARDBENCH_VALUES_DIR overrides)."""
    env = os.environ.get("SHARDBENCH_VALUES_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "values"


def load_shape(name: str, directory: Path | None = None) -> Shape:
    """Read values/<name>.yaml `shape:`; raises ValueError when missing or malformed."""
    directory = directory or values_dir()
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name):
        shown = repr(name) if len(str(name)) <= 60 else f"{str(name)[:40]!r}... ({len(str(name))} characters)"
        raise ValueError(f"shape {shown} is not a shape name: give the name of a file in {directory} "
                         "without .yaml, or none")
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


def on_cluster(m: MatrixSpec) -> bool:
    """Its runs go to a cluster: backend kubernetes, or backend ray with ray_cluster (RayJobs).
    Such a matrix is laid out over the shape's nodes and takes the shape's run defaults; the
    others run on this machine and are bounded by it."""
    return m.backend == "kubernetes" or (m.backend == "ray" and m.ray_cluster is True)


def with_shape_defaults(matrix: MatrixSpec, explicit: set[str]) -> MatrixSpec:
    """A cluster matrix takes model, seq len, batch, precision, device and steps from its shape's
    values file, except the keys the user set (`explicit`): `--backend kubernetes --shape h100`
    must not inherit the CPU defaults (device cpu, fp32, tiny) that the chart would refuse."""
    if not on_cluster(matrix) or not matrix.shape:
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
    if m.launcher != "auto" and m.launcher not in (*contract.LAUNCHERS, contract.RAY_LAUNCHER):
        errors.append(f"launcher got {m.launcher!r}: use auto or one of {', '.join(contract.LAUNCHERS)}")
    elif (m.launcher == contract.RAY_LAUNCHER) != (m.backend == "ray") and m.launcher != "auto":
        errors.append(f"launcher {m.launcher} with backend {m.backend}: Ray launches the ranks of backend "
                      "ray and of no other; use launcher auto with backend ray")
    if m.backend not in contract.BACKENDS:
        errors.append(f"backend got {m.backend!r}: use one of {', '.join(contract.BACKENDS)}")
    elif m.backend == "kubernetes" and m.launcher not in ("auto", *contract.CLUSTER_LAUNCHERS):
        errors.append(f"launcher {m.launcher} cannot run on the kubernetes backend (an MPIJob "
                      f"starts its ranks with mpirun): use one of {', '.join(contract.CLUSTER_LAUNCHERS)}")
    if not _is_int(m.repeats):
        errors.append(f"repeats must be a positive integer, got {m.repeats!r}")
    if m.timeout_s is not None and not (_is_number(m.timeout_s) and m.timeout_s > 0):
        errors.append(f"timeout_s must be a positive number of seconds, got {m.timeout_s!r}")
    if not isinstance(m.results, str) or not m.results:
        errors.append(f"results must be a directory path, got {m.results!r}")
    elif m.results.startswith("-"):
        errors.append(f"results {m.results!r} starts with '-' (it would read as a flag): write ./{m.results}")
    if m.max_world_size is not None and not _is_int(m.max_world_size):
        errors.append(f"max_world_size must be a positive integer, got {m.max_world_size!r}")
    if not _is_int(m.max_restarts, 0):
        errors.append(f"max_restarts must be an integer >= 0, got {m.max_restarts!r}")
    if not isinstance(m.ray_cluster, bool):
        errors.append(f"ray_cluster must be true or false, got {m.ray_cluster!r}")
    elif m.ray_cluster and m.backend != "ray":
        errors.append(f"ray_cluster runs backend ray as KubeRay RayJobs; backend {m.backend} ignores it: "
                      "use backend ray, or drop ray_cluster")
    if m.backend == "ray" and isinstance(m.faults, list) and not on_cluster(m):
        errors += [f"fault {f} cannot be injected on the ray backend (Ray restarts ranks, not its driver): "
                   "use kill-rank:R@S or stop-rank:R@S" for f in m.faults if str(f).startswith("kill-launcher")]
    if on_cluster(m) and isinstance(m.faults, list):
        errors += [e for f in m.faults for e in kube_fault_errors(f)]
    for name, kind in (("strategies", str), ("world_sizes", int), ("seq_lens", int), ("faults", str)):
        axis = getattr(m, name)
        if not isinstance(axis, list) or not axis:
            errors.append(f"{name} must be a non-empty list, got {axis!r}")
        elif any(not isinstance(v, kind) or isinstance(v, bool) or isinstance(v, (list, dict)) for v in axis):
            errors.append(f"{name} must hold {'names' if kind is str else 'integers'}, got {axis!r}")
        elif len(set(axis)) != len(axis):
            errors.append(f"{name} repeats a value: {axis!r}")
    for name, value in m.overrides.items():
        if isinstance(value, list) and (not value or len(set(map(repr, value))) != len(value)):
            errors.append(f"{name} must be a non-empty list of distinct values, got {value!r}")
    if m.layouts is not None and (not isinstance(m.layouts, list) or not m.layouts or any(
            not isinstance(e, dict) or "strategy" not in e or set(e) - {"strategy", *LAYOUT_KEYS} for e in m.layouts)):
        errors.append(f"layouts must be a list of mappings with a strategy and optional {', '.join(LAYOUT_KEYS)}, "
                      f"got {m.layouts!r}")
    return errors


def _world_limit(m: MatrixSpec, shape: Shape | None, cfg: RunConfig) -> tuple[int | None, str]:
    """Most ranks one run may use, and why."""
    if _is_int(m.max_world_size):
        return m.max_world_size, "max_world_size"
    if on_cluster(m):
        return None, ""
    if shape is not None and shape.gpus_per_node and cfg.device != "cpu":
        return shape.gpus_per_node, f"shape {shape.name} has {shape.gpus_per_node} GPUs per node"
    cores = os.cpu_count() or 1
    limit = max(1, cores * LOCAL_OVERSUBSCRIBE // max(1, cfg.threads_per_rank))
    return limit, (f"this machine has {cores} cores; ranks x threads per rank may be at most "
                   f"{LOCAL_OVERSUBSCRIBE} x cores (set max_world_size to force more)")


def _layout(m: MatrixSpec, shape: Shape | None, world: int) -> tuple[int, int] | str:
    """(nodes, procs_per_node) for a run of `world` ranks, or an error."""
    gpn = shape.gpus_per_node if shape is not None else None
    if not on_cluster(m) or not gpn or world <= gpn:
        return 1, world
    if world % gpn:
        return f"world size {world} spans nodes of {gpn} GPUs ({shape.name}) but is not a multiple of {gpn}"  # type: ignore[union-attr]
    return world // gpn, gpn


# --- expansion ------------------------------------------------------------------------------

def run_count(m: MatrixSpec) -> int:
    """Runs the matrix expands into, computed without expanding it (with `layouts:`, at most one
    strategy x layout-knob combination per entry, instead of their product)."""
    swept = [v for k, v in m.overrides.items() if isinstance(v, list) and not (m.layouts and k in LAYOUT_KEYS)]
    layouts = [m.layouts] if m.layouts else [m.strategies]
    axes = [*layouts, m.world_sizes, m.seq_lens, m.faults] + swept
    sizes = [len(a) if isinstance(a, list) else 1 for a in axes]
    return math.prod(sizes) * (m.repeats if _is_int(m.repeats) else 1)


def _option_combinations(m: MatrixSpec) -> list[tuple[tuple[str, Any], ...]]:
    names = sorted(m.overrides)
    values = [m.overrides[n] if isinstance(m.overrides[n], list) else [m.overrides[n]] for n in names]
    return [tuple(zip(names, combo)) for combo in itertools.product(*values)]


LAYOUT_KEYS = (*sorted(knobs.layout()), "tie_embeddings")
"""What a `layouts:` entry may name beside the strategy: the layout knobs (`knob(layout=True)`: the
mesh degrees, the pipeline's schedule and stages per rank, where state lives) and the head's tie
(a model knob, not the layout's, that a pipeline needs untied)."""


def _listed_layout(m: MatrixSpec, strategy: str, knob_pairs) -> bool:
    """Whether `layouts:` (if any) lists this strategy with these mesh degrees."""
    if not m.layouts:
        return True
    given = {"strategy": strategy, **{k: v for k, v in knob_pairs if k in LAYOUT_KEYS}}
    return any(all(given.get(k, knobs.default(k)) == entry.get(k, knobs.default(k)) for k in LAYOUT_KEYS)
               and entry.get("strategy") == strategy for entry in m.layouts)


def _trainer_config(strategy: str, seq: int, knob_pairs) -> RunConfig:
    """RunConfig's defaults, the matrix's overrides (grad_accum is derived when global_batch is set)."""
    knob_values = dict(knob_pairs)
    if knob_values.get("global_batch") is not None:
        knob_values.pop("grad_accum", None)
    return RunConfig(strategy=strategy, seq_len=seq, **knob_values)


def expand(matrix: MatrixSpec, limit: int | None = CONFIRM_ABOVE) -> tuple[list[RunSpec], list[str]]:
    """All run specs of the matrix, and one line per problem (empty when all valid).

    Each configuration is checked once with the trainer's rules (trainer.rules.validate) and
    the suite's (launcher, backend, world-size limits). Order: strategy, world size, seq len,
    swept knobs, repeat; the runner interleaves repeats. `limit`: more runs than this is an error
    that says how to confirm (None: no limit).
    """
    errors = _suite_errors(matrix)
    shape = None
    if matrix.shape:
        try:
            shape = load_shape(matrix.shape)
        except ValueError as exc:
            errors.append(str(exc))
    if shape is not None and not on_cluster(matrix) and shape.gpus_per_node and not local_gpu_count():
        errors.append(f"shape {shape.name} describes GPU nodes but this machine has no NVIDIA GPU: run it "
                      "with --backend kubernetes, or locally with --shape cpu (or --shape none)")
    if errors:
        return [], _dedupe(errors)
    count = run_count(matrix)
    if limit is not None and count > limit:
        return [], [f"the matrix expands into {count:,} runs (more than {limit:,}): confirm with --yes, "
                    "or sweep fewer values"]
    specs: list[RunSpec] = []
    for strategy, world, seq, knob_pairs, fault in itertools.product(
            matrix.strategies, matrix.world_sizes, matrix.seq_lens, _option_combinations(matrix), matrix.faults):
        if not _listed_layout(matrix, strategy, knob_pairs):
            continue
        made = _configuration(matrix, shape, strategy, world, seq, knob_pairs, fault)
        if isinstance(made, list):
            errors += made
        else:
            specs += [replace(made, repeat=r, run_id=_repeat_id(made, r)) for r in range(matrix.repeats)]
    return ([], _dedupe(errors)) if errors else (specs, [])


def _configuration(m: MatrixSpec, shape: Shape | None, strategy: str, world: int, seq: int,
                   knob_pairs, fault: str = "none") -> RunSpec | list[str]:
    """Repeat 0 of one configuration, or its problems."""
    cfg = _trainer_config(strategy, seq, knob_pairs)
    checked = cfg
    if cfg.checkpoint_every and not cfg.checkpoint_dir:
        checked = replace(cfg, checkpoint_dir="<run dir>/checkpoints")  # the suite gives every run its own
    errors = [_matrix_wording(e) for e in rules.validate(checked, world)] + fault_errors(fault, world, cfg.steps)
    if errors:
        return errors
    limit, why = _world_limit(m, shape, cfg)
    if limit is not None and world > limit:
        return [f"world size {world} is larger than allowed ({limit}: {why})"]
    layout = _layout(m, shape, world)
    if isinstance(layout, str):
        return [layout]
    nodes, ppn = layout
    tp_placement = rules.check_gpus_per_worker(cfg, ppn)
    if tp_placement:
        return [_matrix_wording(tp_placement)]
    launcher = contract.default_launcher(strategy) if m.launcher == "auto" else m.launcher
    if m.backend == "ray":
        launcher = contract.RAY_LAUNCHER  # Ray starts every strategy's ranks
    ga = cfg.effective_grad_accum(world)
    cfg = replace(cfg, shape=m.shape, peak_tflops=_given(cfg.peak_tflops, shape and shape.peak_tflops),
                  usd_per_gpu_hour=_given(cfg.usd_per_gpu_hour, shape and shape.usd_per_gpu_hour))
    measured = id_fields(cfg, world, nodes, launcher)
    # A fault and the restarts allowed change the outcome; fault-free ids stay as they were.
    cid = contract.config_id(measured if fault == "none" else {**measured, "fault": fault,
                                                                "max_restarts": m.max_restarts})
    # The spec holds the config as the trainer will resolve it: grad-accum for this world size.
    cfg = replace(cfg, grad_accum=ga, global_batch=None)
    return RunSpec(
        run_id=contract.run_id(strategy, world, seq, cfg.micro_batch, ga, cid, 0), world_size=world, repeat=0,
        launcher=launcher, backend=m.backend, config=cfg, nodes=nodes, procs_per_node=ppn,
        timeout_s=m.timeout_s, config_id=cid, fault=fault, max_restarts=m.max_restarts if fault != "none" else 0)


def _repeat_id(spec: RunSpec, repeat: int) -> str:
    return contract.run_id(spec.strategy, spec.world_size, spec.seq_len, spec.micro_batch, spec.grad_accum,
                           spec.config_id, repeat)


_WORDED = re.compile(r"(?P<quoted>'[^']*'|\"[^\"]*\")|--no-(?P<no>[a-z][a-z0-9-]*)|--(?P<flag>[a-z][a-z0-9-]*)")


def _matrix_wording(error: str) -> str:
    """The trainer's rule, said with the matrix key a YAML author wrote (--micro-batch -> micro_batch,
    --no-tie-embeddings -> tie_embeddings: false); a quoted value stays as written
    (deepspeed_config got '--help', not 'help')."""
    def word(m: re.Match) -> str:
        if m.group("quoted"):
            return m.group(0)
        return m.group("no").replace("-", "_") + ": false" if m.group("no") else m.group("flag").replace("-", "_")
    return _WORDED.sub(word, error)


def _given(value: Any, from_shape: Any) -> Any:
    """The matrix's own value, else the shape's (price, peak)."""
    return value if value is not None else (from_shape or None)


def _dedupe(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))


__all__ = ["CONFIRM_ABOVE", "DEFAULT_MATRIX", "MatrixSpec", "RunSpec", "Shape", "default_matrix", "expand",
           "load_matrix", "load_shape", "local_gpu_count", "matrix_from_dict", "on_cluster", "run_count", "save_matrix",
           "values_dir", "with_shape_defaults"]
