"""The run contract: every fact about a run that more than one part of shardbench needs.

The trainer, the suite (matrix, runner, report), benchtui and the chart (through
scripts/gen_chart_contract.py) all read these tables; none keeps its own copy. Torch-free, so
argument checks, the matrix expander and the TUI read it for free at start-up.

- STRATEGIES: each strategy as data (engine, ZeRO stage, which state is sharded and which lives
  on the host, default launcher, whether it needs a
  process group alone, how many bytes of model state per parameter it holds).
- PRECISIONS, DEVICES, LAUNCHERS, CLUSTER_LAUNCHERS, BACKENDS, STATUSES: the allowed names.
- run ids: `config_id()` hashes the measured fields off their defaults (+ a version); `run_id()` puts a
  readable prefix before it and the repeat after; `parse_run_id()` reads one back.
The run's knobs and their defaults are the fields of `trainer.config.RunConfig` (which reads these
tables); the rules a RunConfig must pass are `trainer.rules.validate()`. This module reads no
RunConfig: tables and names only, so the dependency goes one way (rules -> config -> contract).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A bad argument: the message is one line that says what is wrong and how to fix it."""


@dataclass(frozen=True)
class StrategyInfo:
    """One distributed strategy as data."""

    name: str
    engine: str
    """Who implements it: ddp (torch DDP), fsdp (torch FSDP2) or deepspeed."""
    zero_stage: int | None
    """DeepSpeed ZeRO stage (1, 2, 3); None for the torch-native strategies."""
    default_launcher: str
    """The launcher a matrix's `launcher: auto` picks: DeepSpeed's own for ZeRO, else mpirun."""
    group_at_world_size_1: bool
    """Needs a process group even alone (DeepSpeed does; DDP and FSDP run the plain model)."""
    replicated_bytes_per_param: tuple[float, float]
    """Model-state bytes every rank holds whole, (fp32 run, bf16/fp16 run), AdamW."""
    sharded_bytes_per_param: tuple[float, float]
    """Model-state bytes split across the N ranks, (fp32 run, bf16/fp16 run), AdamW."""
    summary: str
    sharded: tuple[str, ...] = ()
    """Which model state is split across the data-parallel ranks ("params", "grads",
    "optimizer"); the rest is replicated. The planner reads the layout from these attributes."""
    on_host: tuple[str, ...] = ()
    """Which model state lives in host memory (offload); the rest is on the device."""

    def model_state_bytes_per_param(self, precision: str, world_size: int, grad_accum: int = 1,
                                    fsdp_grad_sync: str = "every_micro_step") -> float:
        """Bytes of parameters + gradients + optimizer state (+ master copies) one of `world_size`
        ranks holds per parameter at the peak of an optimizer step (AdamW: two fp32 moments,
        8 B; communication buffers excluded). With grad-accum > 1, ZeRO-1 (and FSDP with
        --fsdp-grad-sync last_micro_step) hold whole gradients between micro-steps instead of
        their partition."""
        half = 1 if precision in ("bf16", "fp16") else 0
        replicated, sharded = self.replicated_bytes_per_param[half], self.sharded_bytes_per_param[half]
        whole_grads = self.zero_stage == 1 or (self.engine == "fsdp" and fsdp_grad_sync == "last_micro_step")
        if grad_accum > 1 and whole_grads:
            grads = 2 if half and self.engine == "deepspeed" else 4
            replicated, sharded = replicated + grads, sharded - grads
        return replicated + sharded / world_size


ZERO_SHARDED = {1: ("optimizer",), 2: ("grads", "optimizer"), 3: ("params", "grads", "optimizer")}
"""What each DeepSpeed ZeRO stage splits across the ranks."""


def _zero(stage: int, replicated: tuple[float, float], sharded: tuple[float, float], summary: str) -> StrategyInfo:
    return StrategyInfo(f"zero{stage}", "deepspeed", stage, "deepspeed", True, replicated, sharded, summary,
                        ZERO_SHARDED[stage])


# Bytes per parameter: ddp keeps fp32 weights 4 + grads 4 + moments 8 on every rank (autocast
# keeps fp32 weights and grads); fsdp shards the same 16. ZeRO-1/2 keep the model's weights whole
# (4 B, or 2 B in bf16/fp16) and partition DeepSpeed's fp32 master 4, the reduced gradients
# (4 or 2) and the moments 8; ZeRO-3 partitions everything.
STRATEGIES: dict[str, StrategyInfo] = {s.name: s for s in (
    StrategyInfo("ddp", "ddp", None, "mpirun", False, (16, 16), (0, 0),
                 "DistributedDataParallel: everything replicated, gradients all-reduced"),
    StrategyInfo("fsdp", "fsdp", None, "mpirun", False, (0, 0), (16, 16),
                 "FSDP2 fully_shard per block and root: parameters, gradients, optimizer sharded",
                 ("params", "grads", "optimizer")),
    _zero(1, (4, 2), (16, 14), "DeepSpeed ZeRO-1: optimizer state partitioned"),
    _zero(2, (4, 2), (16, 14), "DeepSpeed ZeRO-2: optimizer state and gradients partitioned"),
    _zero(3, (0, 0), (20, 16), "DeepSpeed ZeRO-3: parameters, gradients, optimizer partitioned"),
)}

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
_RUN_ID = re.compile(r"^(?P<strategy>[a-z0-9]+)-w(?P<world_size>\d+)-s(?P<seq_len>\d+)-mb(?P<micro_batch>\d+)"
                     r"-ga(?P<grad_accum>\d+)-(?P<config_id>[0-9a-f]{%d})-r(?P<repeat>\d+)$" % CONFIG_ID_LEN)


CONFIG_ID_VERSION = 2
"""How config ids are made, hashed with them and written into every spec.json. 1 (until
2026-11): every measured field, defaults included, so each new knob changed every id. 2: only
the measured fields off their defaults (trainer.config.id_fields). A results directory holding
spec.json files of another version is refused by `shardbench run` (suite/store.py)."""


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


def parse_run_id(text: str) -> dict[str, Any] | None:
    """The fields of a run id built by run_id(), or None for any other text."""
    m = _RUN_ID.match(text or "")
    if not m:
        return None
    out: dict[str, Any] = m.groupdict()
    for key in ("world_size", "seq_len", "micro_batch", "grad_accum", "repeat"):
        out[key] = int(out[key])
    return out


# --- validation ----------------------------------------------------------------------------

def flag(name: str) -> str:
    return "--" + name.replace("_", "-")
