"""The run contract: every fact about a run that more than one part of shardbench needs.

The trainer, the suite (matrix, runner, report), benchtui and the chart (through
scripts/gen_chart_contract.py) all read these tables; none keeps its own copy. Torch-free, so
argument checks, the matrix expander and the TUI read it for free at start-up.

- StateLayout: the parallelism declaration's state part (engine, ZeRO stage, which state is
  sharded, which lives on the host) and the model-state bytes per parameter that follow from it,
  by location. STRATEGIES: the named presets of it (`--strategy`), with their default launcher.
- PRECISIONS, DEVICES, LAUNCHERS, CLUSTER_LAUNCHERS, BACKENDS, STATUSES: the allowed names.
- run ids: `config_id()` hashes the measured fields off their defaults (+ a version); `run_id()` puts a
  readable prefix before it and the repeat after.
The run's knobs and their defaults are the fields of `trainer.config.RunConfig` (which reads these
tables); the rules a RunConfig must pass are `trainer.rules.validate()`. This module reads no
RunConfig: tables and names only, so the dependency goes one way (rules -> config -> contract).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A bad argument: the message is one line that says what is wrong and how to fix it."""


STATE = ("params", "grads", "optimizer")
"""The kinds of model state a layout places: parameters, gradients, optimizer state (AdamW's
moments, and DeepSpeed's fp32 master copy with them)."""
LOCATIONS = ("device", "host")
"""Where model state lives: the compute device's memory, or host memory (offload)."""
OFFLOADS = ("none", "optimizer", "params")
"""What `--offload` moves to host memory (StateLayout.offloaded): nothing; the optimizer (with
DeepSpeed, also the fp32 gradient partition it steps from); or the parameters as well (and with
them gradients and the optimizer: ZeRO-3's offload_param + offload_optimizer, FSDP2's
CPUOffloadPolicy)."""


@dataclass(frozen=True)
class StateLayout:
    """How the data-parallel ranks hold the model: the engine that runs them and, per kind of
    state (STATE), whether it is split across the ranks and where it lives. With the mesh
    degrees (trainer/parallel/layout.py: dp_replicate, dp_shard, tp, pp) this is a run's whole
    parallelism declaration. The planner, the memory model and the verdicts read these
    attributes, never a strategy's name."""

    engine: str
    """Who implements it: ddp (torch DDP), fsdp (torch FSDP2) or deepspeed."""
    zero_stage: int | None = None
    """DeepSpeed ZeRO stage (1, 2, 3); None for the torch-native engines."""
    sharded: tuple[str, ...] = ()
    """Which model state is split across the data-parallel ranks; the rest is replicated."""
    on_host: tuple[str, ...] = ()
    """Which model state lives in host memory (offload); the rest is on the device."""

    @property
    def group_at_world_size_1(self) -> bool:
        """Needs a process group even alone (DeepSpeed does; DDP and FSDP run the plain model)."""
        return self.engine == "deepspeed"

    def bytes_per_param(self, precision: str) -> dict[str, float]:
        """Bytes per parameter of each kind of state, whole (AdamW). Torch engines keep fp32
        weights and gradients under autocast (4 + 4) and two fp32 moments (8); DeepSpeed keeps
        the model's weights and reduced gradients in its dtype (4, or 2 in bf16/fp16) and an fp32
        master copy beside the moments (12); its offloaded gradient partition is fp32 (4), and
        ZeRO-3 keeps its own partition in the weights' dtype beside it, on the host as well
        (stage3's grad_partitions_flat_buffer on the optimizer's device): 4 + w, measured."""
        if self.engine != "deepspeed":
            return {"params": 4, "grads": 4, "optimizer": 8}
        w = 2 if precision in ("bf16", "fp16") else 4
        offloaded = 4 + (w if self.zero_stage == 3 else 0)
        return {"params": w, "grads": offloaded if "grads" in self.on_host else w, "optimizer": 12}

    def split(self, kind: str, grad_accum: int = 1, fsdp_grad_sync: str = "every_micro_step") -> bool:
        """Whether `kind` is split across the ranks at the peak of an optimizer step. DeepSpeed's
        ZeRO-1 reduces gradients into partitions as ZeRO-2 does, except that with grad-accum > 1
        it holds whole ones between micro-steps; so does FSDP with --fsdp-grad-sync last_micro_step."""
        if kind != "grads":
            return kind in self.sharded
        if grad_accum > 1 and (self.zero_stage == 1 or (self.engine == "fsdp" and fsdp_grad_sync == "last_micro_step")):
            return False
        return "grads" in self.sharded or self.zero_stage is not None

    def model_state_bytes_by_location(self, precision: str, world_size: int, grad_accum: int = 1,
                                      fsdp_grad_sync: str = "every_micro_step") -> dict[str, float]:
        """Bytes per parameter one of `world_size` ranks holds at the peak of an optimizer step,
        by LOCATIONS (communication buffers excluded)."""
        out = dict.fromkeys(LOCATIONS, 0.0)
        for kind, size in self.bytes_per_param(precision).items():
            where = "host" if kind in self.on_host else "device"
            out[where] += size / world_size if self.split(kind, grad_accum, fsdp_grad_sync) else size
        return out

    def model_state_bytes_per_param(self, precision: str, world_size: int, grad_accum: int = 1,
                                    fsdp_grad_sync: str = "every_micro_step") -> float:
        """Bytes of parameters + gradients + optimizer state (+ master copies) one of `world_size`
        ranks holds per parameter at the peak of an optimizer step, wherever they live."""
        return sum(self.model_state_bytes_by_location(precision, world_size, grad_accum, fsdp_grad_sync).values())

    def offloaded(self, offload: str) -> StateLayout:
        """This layout with `--offload` applied: the kinds of state it moves to the host (OFFLOADS).
        Whether the engine can is a rule (trainer/rules.py `offload_error`)."""
        kinds = set(self.on_host) | set({"none": (), "optimizer": ("optimizer",), "params": STATE}[offload])
        if "optimizer" in kinds and self.engine == "deepspeed":  # ZeRO-Offload steps from an fp32 gradient
            kinds.add("grads")                                    # partition on the host
        return StateLayout(self.engine, self.zero_stage, self.sharded, tuple(k for k in STATE if k in kinds))


@dataclass(frozen=True, kw_only=True)
class StrategyInfo(StateLayout):
    """A strategy: a named preset of a StateLayout (`--strategy`), with the launcher a matrix's
    `launcher: auto` picks and a one-line summary."""

    name: str
    default_launcher: str
    """The launcher a matrix's `launcher: auto` picks: DeepSpeed's own for ZeRO, else mpirun."""
    summary: str

    @property
    def state(self) -> StateLayout:
        return StateLayout(self.engine, self.zero_stage, self.sharded, self.on_host)


ZERO_SHARDED = {1: ("optimizer",), 2: ("grads", "optimizer"), 3: ("params", "grads", "optimizer")}
"""What each DeepSpeed ZeRO stage splits across the ranks."""


def _zero(stage: int, summary: str) -> StrategyInfo:
    return StrategyInfo("deepspeed", stage, ZERO_SHARDED[stage], name=f"zero{stage}", default_launcher="deepspeed",
                        summary=summary)


# Bytes per parameter follow from the attributes (StateLayout.bytes_per_param): ddp keeps fp32
# weights 4 + grads 4 + moments 8 on every rank; fsdp shards the same 16. ZeRO-1/2 keep the model's
# weights whole (4 B, or 2 B in bf16/fp16) and partition DeepSpeed's fp32 master 4, the reduced
# gradients (4 or 2) and the moments 8; ZeRO-3 partitions everything.
STRATEGIES: dict[str, StrategyInfo] = {s.name: s for s in (
    StrategyInfo("ddp", name="ddp", default_launcher="mpirun",
                 summary="DistributedDataParallel: everything replicated, gradients all-reduced"),
    StrategyInfo("fsdp", sharded=STATE, name="fsdp", default_launcher="mpirun",
                 summary="FSDP2 fully_shard per block and root: parameters, gradients, optimizer sharded"),
    _zero(1, "DeepSpeed ZeRO-1: optimizer state partitioned"),
    _zero(2, "DeepSpeed ZeRO-2: optimizer state and gradients partitioned"),
    _zero(3, "DeepSpeed ZeRO-3: parameters, gradients, optimizer partitioned"),
)}
"""The presets `--strategy` names. A new row with a known engine runs, is planned and is reported
with no other edit (DEVELOPERS.md "Adding a strategy")."""


def state_layout(strategy: str, offload: str = "none") -> StateLayout:
    """The state layout a run of preset `strategy` with `--offload offload` has."""
    return STRATEGIES[strategy].state.offloaded(offload)


PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")
LAUNCHERS = ("mpirun", "deepspeed", "torchrun")
CLUSTER_LAUNCHERS = ("mpirun", "deepspeed")
"""What the chart's MPIJob launcher pod can run (torchrun needs its own rendezvous per node)."""
RAY_LAUNCHER = "ray"
"""The launcher of backend ray (trainer/ray_launcher.py: ranks as Ray actors); no other backend
runs it, and backend ray runs nothing else."""
BACKENDS = ("local", "kubernetes", "ray")
STATUSES = ("ok", "failed", "oom", "timeout", "cancelled")
"""A run's outcome. oom and ok are measurements a rerun would repeat; the rest are not."""


def is_deepspeed(strategy: str) -> bool:
    info = STRATEGIES.get(strategy)
    return info is not None and info.engine == "deepspeed"


def default_launcher(strategy: str) -> str:
    return STRATEGIES[strategy].default_launcher


# --- run ids -------------------------------------------------------------------------------

CONFIG_ID_LEN = 8

CONFIG_ID_VERSION = 2
"""How config ids are made, hashed with them and written into every spec.json. 1 (until
2026-11): every measured field, defaults included, so each new knob changed every id. 2: only
the measured fields off their defaults (trainer.config.id_fields). A results directory holding
spec.json files of another version is refused by `shardbench run` (suite/execute/store.py)."""


def config_id(measured: dict[str, Any]) -> str:
    """Short hash of the fields that change what a run measures and differ from their defaults
    (trainer.config.id_fields; not its repeat, timeout or output paths) and CONFIG_ID_VERSION:
    two runs share it exactly when they are repeats of one configuration."""
    measured = {**measured, "config_id_version": CONFIG_ID_VERSION}
    canonical = json.dumps(measured, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:CONFIG_ID_LEN]


def run_id(strategy: str, world_size: int, seq_len: int, micro_batch: int, grad_accum: int,
           config: str, repeat: int) -> str:
    """Readable and unique, e.g. zero3-w4-s2048-mb1-ga4-1f2e3d4c-r0 (results/<run id>/)."""
    return f"{strategy}-w{world_size}-s{seq_len}-mb{micro_batch}-ga{grad_accum}-{config}-r{repeat}"


# --- validation ----------------------------------------------------------------------------

def flag(name: str) -> str:
    return "--" + name.replace("_", "-")
