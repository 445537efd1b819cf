"""What a benchmark matrix is and what one run of it is, as data: `MatrixSpec` (axes, the suite's
settings, overrides of the trainer's knobs), `Shape` (the part of values/<shape>.yaml the suite
uses) and `RunSpec` (one run: its trainer RunConfig plus the suite's bookkeeping). Expansion,
YAML and shapes are suite/matrix/expand.py, which re-exports these. Torch-free.
"""
from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

from shardbench.trainer import contract, knobs
from shardbench.trainer.config import RunConfig

# RunConfig fields the suite sets itself for every run (axes, bookkeeping), so a matrix may not.
_SUITE_OWNED = {"strategy", "seq_len", "run_id", "output_dir", "launcher", "repeat", "argv", "checkpoint_dir",
                "resume", "shape"}
KNOB_KEYS = frozenset(f.name for f in knobs.knob_fields()) - _SUITE_OWNED
"""The trainer knobs a matrix may set (any other RunConfig field); a list value sweeps one."""


@dataclass(init=False)
class MatrixSpec:
    """A benchmark matrix as written in a matrix YAML file: its axes and the suite's settings
    (these fields), and overrides of the trainer's knobs (`overrides`: any RunConfig field, written
    in YAML as top-level keys). A knob it does not set keeps RunConfig's default: the one place a
    knob's default is written. `MatrixSpec(steps=5)` puts steps into overrides; `m.steps` reads an
    override or else RunConfig's default."""

    strategies: list[str] = field(default_factory=lambda: list(contract.STRATEGIES))
    """Strategies to compare (trainer.contract.STRATEGIES)."""
    world_sizes: list[int] = field(default_factory=lambda: [1, 2])
    """Numbers of devices (ranks) per run; every strategy runs at every world size."""
    seq_lens: list[int] = field(default_factory=lambda: [64])
    """Sequence lengths (tokens); each must be <= the model preset's block size."""
    repeats: int = 1
    """Times every configuration runs; repeats are interleaved and give the report its intervals."""
    launcher: str = "auto"
    """mpirun, deepspeed, torchrun, or auto (each strategy's default launcher)."""
    backend: str = "local"
    """local (this machine), kubernetes (one Helm release per run) or ray (Ray actors)."""
    ray_cluster: bool = False
    """backend ray on the cluster: each run a KubeRay RayJob of the chart (the kubernetes
    backend's cluster options apply; runs laid out and given shape defaults as on kubernetes);
    default: an embedded Ray on this machine."""
    shape: str | None = "cpu"
    """GPU shape = values/<shape>.yaml (peak FLOP/s, $/GPU-hour, GPUs per node); None: unknown."""
    timeout_s: float | None = 600.0
    """Per-run wall-clock limit in seconds (the run becomes status timeout); None: no limit."""
    max_world_size: int | None = None
    """Devices the backend may use at most (cluster capacity); None: what the shape allows."""
    faults: list[str] = field(default_factory=lambda: ["none"])
    """Faults to inject, one axis: none, kill-rank:R@S, stop-rank:R@S, kill-launcher@S (rank R,
    optimizer step S; suite/faults/restart.py). A faulty run checkpoints and is relaunched."""
    max_restarts: int = 2
    """Relaunches of a run that failed (with --resume auto from its checkpoints), for faulty runs."""
    layouts: list[dict[str, Any]] | None = None
    """Only these combinations of strategy and mesh degrees (tp, dp_replicate; a degree left out
    is 1), e.g. [{strategy: fsdp, dp_replicate: 2}, {strategy: ddp, tp: 2}]: the strategies and
    degree axes are swept and every other combination is left out; None: every combination."""
    results: str = "results/default"
    """Results directory: results/<run id>/ for every run (a suite locks it while it writes)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Trainer knobs (trainer.config.RunConfig fields) set for every run, e.g. {micro_batch: 2,
    activation_checkpointing: true}; a list sweeps it. global_batch set: grad_accum is derived.
    usd_per_gpu_hour / peak_tflops: else the shape's. Written in YAML as top-level keys."""

    def __init__(self, overrides: dict[str, Any] | None = None, **values: Any) -> None:
        settable = {f.name: f for f in fields(MatrixSpec) if f.name != "overrides"}
        overrides = dict(overrides or {})
        for name in list(values):
            if name in KNOB_KEYS:
                overrides[name] = values.pop(name)
        unknown = sorted(set(values) - set(settable))
        if unknown:
            raise TypeError(f"unknown matrix key(s): {', '.join(unknown)}")
        for name, f in settable.items():
            value = values[name] if name in values else (
                f.default_factory() if f.default_factory is not MISSING else f.default)
            setattr(self, name, value)
        self.overrides = overrides

    def __getattr__(self, name: str) -> Any:
        """A trainer knob: the matrix's override (a list when swept), else RunConfig's default."""
        if name in KNOB_KEYS:
            overrides = self.__dict__.get("overrides") or {}
            return overrides[name] if name in overrides else knobs.default(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


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


SHAPE_RUN_KEYS = {knobs.camel(f.name): "seq_lens" if f.name == "seq_len" else f.name
                  for f in knobs.chart_fields() if f.name in KNOB_KEYS or f.name == "seq_len"}
"""values/<shape>.yaml `run:` keys -> the matrix keys they give defaults for: every chart value
(`knob(chart=True)`) a matrix may set, seqLen as the seq_lens axis (the shipped values files set
model, seqLen, microBatch, precision, device, steps, warmupSteps)."""

STANDARD_ARGS = (*[f.name for f in knobs.chart_fields()], "run_id", "shape", "peak_tflops", "usd_per_gpu_hour",
                 "output_dir")
"""The flags every run's command line starts with, in this order (the chart's template writes the
same first ones from chart/files/contract.json); every other knob follows when not its default."""


@dataclass(frozen=True, init=False)
class RunSpec:
    """One run of the matrix: the trainer's RunConfig plus what the suite needs to start it and
    the report to label it. Knobs read through: spec.micro_batch is spec.config.micro_batch.
    `RunSpec(strategy=..., micro_batch=...)` builds the config from knob keywords; `extra_knobs`
    (pairs) are knobs set over it."""

    run_id: str
    """Unique id, e.g. zero3-w4-s2048-mb1-ga4-1f2e3d4c-r0 (results/<run_id>/)."""
    world_size: int
    repeat: int
    """0-based repeat index."""
    launcher: str
    """mpirun, deepspeed or torchrun (auto already resolved)."""
    backend: str
    config: RunConfig
    """The trainer's settings of this run (seq len and grad-accum resolved; run id, repeat and
    output dir are added by run_config())."""
    nodes: int = 1
    """Machines the run spans (1 locally; world_size / gpus_per_node on a cluster)."""
    procs_per_node: int = 1
    """Ranks per machine."""
    timeout_s: float | None = None
    config_id: str = ""
    """Hash of everything that changes the measurement; repeats share it (trainer.contract)."""
    fault: str = "none"
    """The fault injected into this run (suite/faults/restart.py), or none."""
    max_restarts: int = 0
    """Relaunches allowed after a failure (faulty runs)."""

    def __init__(self, run_id: str = "", world_size: int = 1, repeat: int = 0, launcher: str = "mpirun",
                 backend: str = "local", config: RunConfig | None = None, nodes: int = 1,
                 procs_per_node: int = 1, timeout_s: float | None = None, config_id: str = "",
                 fault: str = "none", max_restarts: int = 0, extra_knobs=(), **knob_values: Any) -> None:
        knob_values.update(dict(extra_knobs))
        cfg = replace(config, **knob_values) if config is not None else RunConfig(**knob_values)
        for name, value in (("run_id", run_id), ("world_size", world_size), ("repeat", repeat),
                            ("launcher", launcher), ("backend", backend), ("config", cfg), ("nodes", nodes),
                            ("procs_per_node", procs_per_node), ("timeout_s", timeout_s),
                            ("config_id", config_id), ("fault", fault), ("max_restarts", max_restarts)):
            object.__setattr__(self, name, value)

    def __hash__(self) -> int:
        return hash((self.run_id, self.config_id, self.repeat))

    def __getattr__(self, name: str) -> Any:
        if name != "config" and "config" in self.__dict__ and name in RunConfig.__dataclass_fields__:
            return getattr(self.__dict__["config"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def global_batch(self) -> int:
        return (self.config.micro_batch * self.config.effective_grad_accum(self.world_size)
                * self.config.dp_degree(self.world_size))  # tensor-parallel peers share rows

    @property
    def grad_accum(self) -> int:
        return self.config.effective_grad_accum(self.world_size)

    @property
    def seq_len(self) -> int:
        return self.config.effective_seq_len()

    @property
    def extra_knobs(self) -> tuple[tuple[str, Any], ...]:
        """The knobs beyond the standard flags that differ from RunConfig's defaults."""
        cfg = self.config
        return tuple((f.name, getattr(cfg, f.name)) for f in knobs.knob_fields()
                     if f.name not in STANDARD_ARGS and f.name not in knobs.SUITE_SET
                     and getattr(cfg, f.name) != knobs.default(f.name))

    def run_config(self, output_dir: str | os.PathLike | None = None) -> RunConfig:
        """The trainer's config for this run (what its command line parses back into)."""
        return replace(self.config, run_id=self.run_id or None, repeat=self.repeat,
                       output_dir=None if output_dir is None else str(output_dir))

    def trainer_args(self, output_dir: str | os.PathLike | None = None) -> list[str]:
        """The trainer's command line for this run (trainer.knobs.command_line)."""
        return knobs.command_line(self.run_config(output_dir), first=STANDARD_ARGS)

    def option_args(self, skip=()) -> list[str]:
        """The flags beyond the standard ones (knobs off their defaults, the repeat): what the
        chart's run.extraArgs carries for a cluster run (less the knobs in `skip`)."""
        return knobs.command_line(self.run_config(), skip=(*STANDARD_ARGS, *skip))

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "config"}
        settings = knobs.settings(self.config)
        for name in knobs.SUITE_SET + ("launcher",):
            settings.pop(name, None)
        settings.update(seq_len=self.seq_len, grad_accum=self.grad_accum)
        # "options": spec.json's key for extra_knobs, kept so that earlier results stay trusted
        return {**data, **settings, "options": dict(self.extra_knobs),
                "config_id_version": contract.CONFIG_ID_VERSION}
