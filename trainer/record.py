"""The result record: one per run, the contract between trainer, collector, report and TUI.

Rank 0 prints it as one JSON line between the marker lines below, and writes it to
`<output-dir>/result.json` atomically. `SCHEMA_VERSION` changes whenever a field changes meaning
or goes away; readers check it. trainer/schema/result.schema.json is the same contract as JSON
Schema (tests validate every record they produce against it).
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1
START_MARKER = "BENCHMARK_RESULT_JSON_START"
END_MARKER = "BENCHMARK_RESULT_JSON_END"
# Rank 0 prints one of these per step so launchers, the CLI and the TUI can show progress:
#   SHARDBENCH_PROGRESS {"step": 3, "steps": 110, "phase": "warmup", "loss": 10.8, ...}
PROGRESS_PREFIX = "SHARDBENCH_PROGRESS "

STATUSES = ("ok", "failed", "oom", "timeout", "cancelled")
"""cancelled: stopped on request (the suite's runner sets it; a trainer never does)."""


@dataclass
class StepTimes:
    """Wall time of the measured steps (warm-up excluded), seconds."""

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    all: list[float] = field(default_factory=list)
    """Every measured step's time, in order."""


@dataclass
class RankMemory:
    """Peak memory of one rank, bytes. GPU: torch.cuda max allocated/reserved; CPU: peak RSS."""

    rank: int
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    rss_bytes: int | None = None


@dataclass
class RankModelState:
    """Bytes of model state one rank actually holds, counted from its tensors."""

    rank: int
    params_bytes: int = 0
    grads_bytes: int = 0
    optimizer_bytes: int = 0
    total_bytes: int = 0


@dataclass
class ResultRecord:
    schema_version: int = SCHEMA_VERSION
    run_id: str = ""
    """Stable id, e.g. zero3-w4-s2048-mb1-ga4-r0 (the matrix gives it; default built from args)."""
    status: str = "ok"
    """ok, failed, oom, timeout or cancelled."""
    error: str | None = None
    """What went wrong (one line, then the traceback's last lines) when status is not ok."""
    strategy: str = ""
    """ddp, fsdp, zero1, zero2 or zero3."""
    launcher: str = ""
    """torchrun, mpirun, deepspeed or none (plain python, world size 1)."""
    world_size: int = 1
    nodes: int = 1
    devices_per_node: int = 1
    device: str = "cpu"
    """cpu or cuda."""
    device_name: str = ""
    """torch.cuda.get_device_name, or the CPU model."""
    gpu_shape: str | None = None
    """The GPU shape (values file name: a10, a100, h100, h200, cpu), when known."""
    comm_backend: str = "gloo"
    """gloo or nccl (none at world size 1 without a process group)."""
    model: dict[str, Any] = field(default_factory=dict)
    """preset, n_layer, n_embd, n_head, vocab_size, block_size."""
    n_params: int = 0
    """All trainable parameters (tied embedding counted once)."""
    n_params_flops: int = 0
    """Parameters excluding position embeddings: the N of 6N + 12LdT."""
    precision: str = "fp32"
    seq_len: int = 0
    micro_batch: int = 0
    grad_accum: int = 1
    global_batch: int = 0
    """Sequences per optimizer step: micro_batch x grad_accum x world_size."""
    tokens_per_step: int = 0
    steps: int = 0
    """Optimizer steps run, warm-up included."""
    warmup_steps: int = 0
    """Steps excluded from every metric."""
    measured_steps: int = 0
    tokens_per_s: float | None = None
    """Global tokens per second over the measured steps."""
    tokens_per_s_per_device: float | None = None
    step_time_s: StepTimes = field(default_factory=StepTimes)
    loss_per_step: list[float] = field(default_factory=list)
    """Loss of every step (warm-up included), averaged over micro-steps and ranks."""
    final_loss: float | None = None
    peak_memory: list[RankMemory] = field(default_factory=list)
    peak_memory_bytes: int | None = None
    """Max over ranks of GPU max-allocated, or of CPU peak RSS."""
    model_state: list[RankModelState] = field(default_factory=list)
    model_state_bytes_per_rank: int | None = None
    """Max over ranks of params + grads + optimizer state held."""
    flops_per_token: float | None = None
    """6N + 12 L d T (PaLM appendix B), training FLOPs per token."""
    mfu: float | None = None
    """flops_per_token x tokens_per_s / (world_size x peak_flops); None when the peak is unknown."""
    peak_flops: float | None = None
    """Peak dense FLOP/s of one device used for MFU."""
    peak_flops_source: str | None = None
    """Where the peak came from: --peak-tflops, or the device table entry that matched."""
    h2d_gbps: float | None = None
    """Host-to-device copy rate of the batches, GB/s (None on CPU: nothing is copied)."""
    time_to_first_step_s: float | None = None
    """From process start to the end of the first optimizer step on rank 0."""
    wall_time_s: float | None = None
    usd_per_gpu_hour: float | None = None
    """Price of one device-hour when the launcher knew it (values file), for the cost report."""
    activation_checkpointing: bool = False
    compile: bool = False
    seed: int = 0
    optimizer: dict[str, Any] = field(default_factory=dict)
    """name, lr, weight_decay, grad_clip, lr_warmup_steps."""
    versions: dict[str, str | None] = field(default_factory=dict)
    """python, torch, deepspeed, nccl, cuda, shardbench, image."""
    nccl_env: dict[str, str] = field(default_factory=dict)
    """Every NCCL_* variable rank 0 saw."""
    hostname: str = ""
    started_at: str = ""
    """ISO 8601 UTC."""
    finished_at: str = ""
    args: list[str] = field(default_factory=list)
    """The trainer's command-line arguments, to rerun exactly this run."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False)


def emit(record: ResultRecord | dict[str, Any], stream=None) -> bool:
    """Print the record between its markers as one JSON line (what collectors look for).

    Returns False when the stream is gone (a closed pipe, `| head`): the caller has already
    written result.json, so a reader that went away must not turn the run into a failure.
    """
    import sys

    out = stream or sys.stdout
    data = record.to_dict() if isinstance(record, ResultRecord) else record
    try:
        out.write(f"\n{START_MARKER}\n{json.dumps(data)}\n{END_MARKER}\n")
        out.flush()
    except (OSError, ValueError):  # EPIPE, EBADF, or "I/O operation on closed file"
        return False
    return True


def write_atomic(record: ResultRecord | dict[str, Any], path: str) -> None:
    """Write JSON to `path` through a temp file + rename, so readers never see half a record.

    The file is world-readable (0644, like any result a report reads) and synced before the
    rename. On any error (ENOSPC, EACCES) the temp file is removed and the error raised: no
    `.result-*` debris is left behind.
    """
    data = record.to_dict() if isinstance(record, ResultRecord) else record
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".result-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
            os.fchmod(fh.fileno(), 0o644)  # mkstemp makes it 0600
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# -- JSON Schema -----------------------------------------------------------------------------------
# Generated from the dataclasses above so the two cannot drift; tests compare it with the
# checked-in trainer/schema/result.schema.json (regenerate: python -m trainer.record > that file).

def _field_docs(cls) -> dict[str, str]:
    """Field docstrings (the string literal under each field) read from the source."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())
    return docs


def _type_schema(tp) -> dict[str, Any]:
    import dataclasses
    import types
    import typing

    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [_type_schema(a) for a in typing.get_args(tp)]
        return {"anyOf": options}
    if tp is type(None):
        return {"type": "null"}
    if origin is list:
        return {"type": "array", "items": _type_schema(typing.get_args(tp)[0])}
    if origin is dict:
        return {"type": "object"}
    if dataclasses.is_dataclass(tp):
        return _dataclass_schema(tp)
    return {"type": {int: "integer", float: "number", str: "string", bool: "boolean"}.get(tp, "object")}


def _dataclass_schema(cls) -> dict[str, Any]:
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    docs = _field_docs(cls)
    props = {}
    for f in dataclasses.fields(cls):
        props[f.name] = _type_schema(hints[f.name])
        if f.name in docs:
            props[f.name]["description"] = docs[f.name]
    schema = {"type": "object", "properties": props, "required": [f.name for f in dataclasses.fields(cls)],
              "additionalProperties": False}
    if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("):
        schema["description"] = " ".join(cls.__doc__.split())
    return schema


def json_schema() -> dict[str, Any]:
    schema = _dataclass_schema(ResultRecord)
    schema["properties"]["schema_version"]["const"] = SCHEMA_VERSION
    schema["properties"]["status"]["enum"] = list(STATUSES)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": f"shardbench result record v{SCHEMA_VERSION}", **schema}


if __name__ == "__main__":
    print(json.dumps(json_schema(), indent=2))
