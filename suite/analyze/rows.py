"""Result records -> one flat row per run (metrics.csv).

Reading never loses a run and never crashes on one: a result.json that cannot be read, is not a
JSON object, nests too deeply, has a schema_version this report does not know, or has no usable
world size or throughput becomes a row with status `unreadable` and the reason. A number that is
not a measurement (NaN, Infinity, above 1e18) is left empty. Schema versions 1 and 2 are read;
a field version 1 lacks (comm_per_step, the model-state breakdown, load averages, threads) is
simply unknown.

The one per-run derived column here is cost: usd_per_gpu_hour x world_size / 3600 / tokens_per_s
x 1e6, the price from the record or else from values/<shape>.yaml `shape.usdPerGpuHour`. What
needs several runs (intervals, scaling, flags, the loss check) is suite/analyze/analysis.py.
"""
from __future__ import annotations

import json
import math
import stat
from array import array
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd

from shardbench.trainer import knobs
from shardbench.trainer.config import RunConfig
from shardbench.trainer.contract import STATUSES
from shardbench.suite.analyze import groups
from shardbench.suite.analyze import losscheck
from shardbench.suite.matrix.expand import load_shape
from shardbench.suite.analyze.columns import (GIB, MAX_PLAUSIBLE, _affinity, _comm_text, _comm_total,  # noqa: F401
                                      _config_id, _get, _gib, _model_key, _num_text, _number, _rank_max,
                                      _repeat, _rss, _state_location, _state_part, _train_peak, fmt_bytes,
                                      without_repeat)

KNOWN_SCHEMA_VERSIONS = (1, 2)
UNREADABLE = "unreadable"
"""Status of a row that stands for a result.json the report could not use (not a record status)."""
MAX_RESULT_BYTES = 64 * 1024 ** 2


def _knob(name: str) -> Callable[[dict], Any]:
    """A knob's value where the record holds what the trainer ran (`knob(record=)`)."""
    return _get(*knobs.record_path(knobs.field_of(name)))


# (column, description, how to read it from a record). The order is the CSV's.
COLUMNS: list[tuple[str, str, Callable[[dict], Any]]] = [
    ("run_id", "run id (readable prefix; schema 2 adds a short hash)", _get("run_id")),
    ("config_id", "configuration: runs that differ only by repeat share it", _config_id),
    ("repeat", "repeat index", _repeat),
    ("schema_version", "record schema version (1 or 2)", _get("schema_version")),
    ("status", "ok, failed, oom, timeout, cancelled, or unreadable (the result.json could not be used)",
     _get("status")),
    ("error", "why the run did not finish ok, or why its result.json is unreadable", _get("error")),
    ("strategy", "ddp, fsdp, zero1, zero2 or zero3", _get("strategy")),
    ("launcher", "mpirun, deepspeed, torchrun or none", _get("launcher")),
    ("world_size", "devices (ranks) in the run", _get("world_size")),
    ("nodes", "machines the run spanned", _get("nodes")),
    ("devices_per_node", "ranks per machine", _get("devices_per_node")),
    ("device", "cpu or cuda", _get("device")),
    ("device_name", "GPU or CPU model", _get("device_name")),
    ("gpu_shape", "values file name of the hardware shape", _get("gpu_shape")),
    ("comm_backend", "gloo or nccl", _get("comm_backend")),
    ("model", "model preset", _knob("model")),
    ("model_key", "every model dimension (runs that must share a loss curve share it)", _model_key),
    ("n_layer", "transformer blocks", _knob("n_layer")),
    ("n_embd", "model width", _knob("n_embd")),
    ("n_head", "attention heads", _knob("n_head")),
    ("vocab_size", "vocabulary size", _knob("vocab_size")),
    ("n_params", "trainable parameters", _get("n_params")),
    ("precision", "fp32, bf16 or fp16 (as run)", _get("precision")),
    ("grad_reduce_dtype", "dtype gradients were reduced in", _get("grad_reduce_dtype")),
    ("reshard_after_forward", "fsdp/zero3: gathered parameters freed after forward (True) or kept until backward",
     _get("reshard_after_forward")),
    ("bucket_mib", "gradient-communication bucket, MiB (DDP bucket_cap_mb, DeepSpeed bucket sizes); empty for fsdp",
     _get("bucket_mib")),
    ("seq_len", "tokens per sequence", _get("seq_len")),
    ("micro_batch", "sequences per rank per micro-step", _get("micro_batch")),
    ("grad_accum", "micro-steps per optimizer step", _get("grad_accum")),
    ("global_batch", "sequences per optimizer step (micro_batch x grad_accum x world_size)", _get("global_batch")),
    ("tokens_per_step", "tokens per optimizer step", _get("tokens_per_step")),
    ("steps", "optimizer steps run, warm-up included", _get("steps")),
    ("warmup_steps", "steps excluded from every metric", _get("warmup_steps")),
    ("measured_steps", "steps the metrics are over", _get("measured_steps")),
    ("lr", "peak learning rate", _knob("lr")),
    ("seed", "seed of weights and tokens", _get("seed")),
    ("tokens_per_s", "global training throughput over the measured steps, tokens/s", _get("tokens_per_s")),
    ("tokens_per_s_per_device", "tokens_per_s / world_size", _get("tokens_per_s_per_device")),
    ("step_time_mean_s", "mean optimizer-step wall time, s", _get("step_time_s", "mean")),
    ("step_time_p50_s", "median step time, s", _get("step_time_s", "p50")),
    ("step_time_p90_s", "90th percentile step time, s", _get("step_time_s", "p90")),
    ("final_loss", "loss of the last step", _get("final_loss")),
    ("model_state_gib_per_rank", "params + grads + optimizer state (+ master copies, comm buffers when recorded) held "
                                 "by one rank, max over ranks, GiB",
     lambda r: _gib(r.get("model_state_bytes_per_rank"))),
    ("model_state_params_gib", "parameters held by the rank holding the most model state, GiB", _state_part("params")),
    ("model_state_grads_gib", "gradients held by that rank, GiB", _state_part("grads")),
    ("model_state_optimizer_gib", "optimizer moments held by that rank, GiB", _state_part("optimizer")),
    ("model_state_master_gib", "fp32 master weights held by that rank, GiB (schema 2)", _state_part("master")),
    ("model_state_comm_buffer_gib", "communication buffers held by that rank, GiB (schema 2)",
     _state_part("comm_buffer")),
    ("model_state_device_gib", "model state in the device's memory, max over ranks, GiB (a CPU run: all of it, "
                               "host and device memory being one)", _state_location("device")),
    ("model_state_host_gib", "model state the layout keeps in host memory (--offload), max over ranks, GiB",
     _state_location("host")),
    ("train_peak_gib", "GPU peak allocated during training (after set-up), max over ranks, GiB; empty on CPU",
     _train_peak),
    ("gpu_alloc_retries", "GPU allocator retries during the run, max over ranks (memory pressure; schema 2)",
     lambda r: _rank_max(r, "num_alloc_retries")),
    ("rss_footprint_gib", "process peak RSS of the largest rank, GiB: a footprint, never compared", _rss),
    ("comm_bytes_per_step", "bytes moved by collectives per optimizer step, all operations (schema 2)",
     _comm_total("bytes")),
    ("comm_calls_per_step", "collective calls per optimizer step, all operations (schema 2)", _comm_total("calls")),
    ("comm_per_step", "collectives per step by operation: calls x bytes per call (schema 2)", _comm_text),
    ("flops_per_token", "training FLOPs per token, 6N + 12LdT (PaLM appendix B)", _get("flops_per_token")),
    ("mfu", "model FLOPs utilization, 0-1 (empty when the peak is unknown)", _get("mfu")),
    ("peak_tflops", "peak dense TFLOP/s of one device used for MFU",
     lambda r: r["peak_flops"] / 1e12 if _number(r.get("peak_flops")) else None),
    ("peak_flops_source", "where that peak came from", _get("peak_flops_source")),
    ("h2d_gbps", "host-to-device copy rate of the batches, GB/s (empty on CPU)", _get("h2d_gbps")),
    ("time_to_first_step_s", "process start to the end of the first step on rank 0, s", _get("time_to_first_step_s")),
    ("launcher_startup_s", "launch command start to the start of the last rank's process (the launcher's own "
                           "overhead), s", _get("launcher_startup_s")),
    ("wall_time_s", "trainer wall time, s", _get("wall_time_s")),
    ("threads_per_rank", "CPU threads each rank used (schema 2)", _get("threads_per_rank")),
    ("cpu_affinity", "cores each rank was pinned to, one group per rank (schema 2)", _affinity),
    ("host_cpus", "logical CPUs of the host (record's cpu_count)", _get("cpu_count")),
    ("load_avg_1m_start", "host 1-minute load average when the run started (schema 2)", _get("load_avg_1m_start")),
    ("load_avg_1m_end", "host 1-minute load average when the run ended (schema 2)", _get("load_avg_1m_end")),
    ("usd_per_gpu_hour", "price of one device-hour used for cost (record, else values/<shape>.yaml)",
     _get("usd_per_gpu_hour")),
    ("torch_version", "torch version", _get("versions", "torch")),
    ("deepspeed_version", "DeepSpeed version", _get("versions", "deepspeed")),
    ("nccl_version", "NCCL version (empty on CPU)", _get("versions", "nccl")),
    ("cuda_version", "CUDA version (empty on CPU)", _get("versions", "cuda")),
    ("python_version", "Python version", _get("versions", "python")),
    ("image", "container image (cluster runs)", _get("versions", "image")),
    ("hostname", "host of rank 0", _get("hostname")),
    ("started_at", "start time, ISO 8601 UTC", _get("started_at")),
    ("finished_at", "end time, ISO 8601 UTC", _get("finished_at")),
    ("source", "the result.json this row was read from", _get("_source")),
]
# Every other measured trainer knob (trainer.knobs): from the record's settings, right after seed.
_KNOB_COLUMNS = knobs.csv_columns({name for name, _, _ in COLUMNS})
_AT = next(i for i, (name, _, _) in enumerate(COLUMNS) if name == "seed") + 1
COLUMNS[_AT:_AT] = _KNOB_COLUMNS
DERIVED_COLUMNS: list[tuple[str, str]] = [
    ("cost_usd_per_mtok", "usd_per_gpu_hour x world_size / 3600 / tokens_per_s x 1e6: dollars per million training "
                          "tokens"),
]
NUMERIC = {"world_size", "nodes", "devices_per_node", "n_params", "seq_len", "micro_batch", "grad_accum",
           "global_batch", "tokens_per_step", "steps", "warmup_steps", "measured_steps", "lr", "seed",
           "tokens_per_s", "tokens_per_s_per_device", "step_time_mean_s", "step_time_p50_s", "step_time_p90_s",
           "final_loss", "model_state_gib_per_rank", "model_state_params_gib", "model_state_grads_gib",
           "model_state_optimizer_gib", "model_state_master_gib", "model_state_comm_buffer_gib",
           "model_state_device_gib", "model_state_host_gib",
           "train_peak_gib", "gpu_alloc_retries", "rss_footprint_gib", "comm_bytes_per_step", "comm_calls_per_step",
           "flops_per_token", "mfu", "peak_tflops", "h2d_gbps", "time_to_first_step_s", "launcher_startup_s",
           "wall_time_s",
           "threads_per_rank", "host_cpus", "load_avg_1m_start", "load_avg_1m_end", "usd_per_gpu_hour",
           "n_layer", "n_embd", "n_head", "vocab_size"}
NUMERIC |= {knobs.column(f) for f in knobs.measured() if knobs.is_numeric(RunConfig, f.name)}


# --- reading -------------------------------------------------------------------------------

def unreadable(path: Path, reason: str, data: Any = None) -> dict[str, Any]:
    """The stand-in row for a result.json the report cannot use: the run stays visible."""
    data = data if isinstance(data, dict) else {}
    row = {"run_id": data.get("run_id") if isinstance(data.get("run_id"), str) and data.get("run_id")
           else path.parent.name, "status": UNREADABLE, "error": reason, "_source": str(path)}
    for key in ("strategy", "schema_version"):
        if isinstance(data.get(key), (str, int)):
            row[key] = data[key]
    return row


def problem(record: dict[str, Any]) -> str | None:
    """Why a parsed record cannot be tabulated, or None."""
    version = record.get("schema_version")
    if version not in KNOWN_SCHEMA_VERSIONS or isinstance(version, bool):
        return (f"schema_version {version!r} is not one this report reads "
                f"({', '.join(map(str, KNOWN_SCHEMA_VERSIONS))}): update shardbench or rerun")
    status = record.get("status")
    if status not in STATUSES:
        return f"status {status!r} is not one of {', '.join(STATUSES)}"
    world = record.get("world_size")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        return f"world_size {world!r} is not a positive integer"
    if record.get("status") == "ok":
        tps = record.get("tokens_per_s")
        if not _number(tps) or tps <= 0:  # type: ignore[operator]
            return f"status ok but tokens_per_s {tps!r} is not a finite positive measurement"
    return None


def read_record(path: Path) -> dict[str, Any]:
    """The record in `path`, or its unreadable stand-in row with the reason."""
    try:
        info = path.stat()  # through a symlink: what would be read
        if not stat.S_ISREG(info.st_mode):
            # A FIFO blocks the reader forever, /dev/zero never ends: only plain files are records.
            via = " via a symlink" if path.is_symlink() else ""
            return unreadable(path, f"not a regular file ({_kind(info.st_mode)}{via}): a result record is a plain file")
        if info.st_size > MAX_RESULT_BYTES:
            return unreadable(path, f"{info.st_size} bytes: larger than any result record")
        with open(path, "rb") as fh:
            raw = fh.read(MAX_RESULT_BYTES + 1)  # bounded even if it grows after the stat
        if len(raw) > MAX_RESULT_BYTES:
            return unreadable(path, "larger than any result record")
        data = json.loads(raw.decode("utf-8", errors="replace"))
    except OSError as exc:
        return unreadable(path, f"cannot read: {exc.strerror or exc}")
    except RecursionError:
        return unreadable(path, "JSON nested too deeply to be a result record")
    except ValueError as exc:
        return unreadable(path, f"not valid JSON: {exc}")
    if not isinstance(data, dict):
        return unreadable(path, f"a JSON {type(data).__name__}, not a result record object")
    reason = problem(data)
    if reason:
        return unreadable(path, reason, data)
    return {**data, "_source": str(path)}


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a plain file"


def load_records(results_dir: str | Path) -> list[dict[str, Any]]:
    """One entry per results/<run-id>/result.json: the record, or an unreadable stand-in row."""
    from shardbench.suite.analyze.compact import compact  # per-step lists compacted as each file is read

    strings: dict[str, str] = {}  # shared by the records: each holds one copy of every text less
    return [compact(read_record(p), strings) for p in sorted(Path(results_dir).glob("*/result.json"))]


def find_result_sets(root: str | Path, max_depth: int = 4) -> list[Path]:
    """Directories at or below root that hold <run-id>/result.json files (a report's own output
    and attempt folders are not result sets)."""
    root = Path(root)
    found: list[Path] = []

    def walk(d: Path, depth: int) -> None:
        try:
            children = sorted(c for c in d.iterdir() if c.is_dir() and not c.is_symlink())
        except OSError:
            return
        if any((c / "result.json").is_file() for c in children):
            found.append(d)
            return
        if depth < max_depth:
            for c in children:
                if c.name not in ("report", "attempts", "plots") and not c.name.startswith("."):
                    walk(c, depth + 1)

    walk(root, 0)
    return found


# --- rows ----------------------------------------------------------------------------------

def flatten(record: dict[str, Any]) -> dict[str, Any]:
    """One CSV row; a number that is not a measurement (NaN, inf, > 1e18) becomes empty."""
    row = {}
    for name, _, get in COLUMNS:
        try:
            value = get(record)
        except (TypeError, ValueError, AttributeError, ArithmeticError):
            value = None
        if name in NUMERIC and not _number(value):
            value = None
        elif isinstance(value, (dict, list)):
            value = json.dumps(value)[:200]
        row[name] = value
    return row


def _shape_price(shape: Any, cache: dict) -> float | None:
    if not isinstance(shape, str) or not shape:
        return None
    if shape not in cache:
        try:
            cache[shape] = load_shape(shape).usd_per_gpu_hour
        except ValueError:
            cache[shape] = None
    return cache[shape]


def cost_per_mtok(usd_per_gpu_hour: float | None, world_size: int | None, tokens_per_s: float | None) -> float | None:
    """Dollars per million tokens: what world_size devices cost per second over tokens per second."""
    if not all(_number(x) and x > 0 for x in (usd_per_gpu_hour, world_size, tokens_per_s)):  # type: ignore[operator]
        return None
    return usd_per_gpu_hour * world_size / 3600.0 / tokens_per_s * 1e6  # type: ignore[operator]


def loss_curve(record: dict[str, Any]) -> tuple[float, ...] | None:
    """loss_per_step as floats (anything else becomes NaN); None when not recorded."""
    losses = record.get("loss_per_step")
    if isinstance(losses, array) and losses:  # already floats (suite/analyze/compact.py)
        return losses  # type: ignore[return-value]
    if not isinstance(losses, list) or not losses:
        return None
    return tuple(float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan for x in losses)


def to_frame(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per record with COLUMNS + cost (+ `loss_curve`, not a CSV column), sorted by
    strategy, world size, config, repeat."""
    records = list(records)
    df = pd.DataFrame([flatten(r) for r in records], columns=[c for c, _, _ in COLUMNS])
    df["loss_curve"] = pd.Series([loss_curve(r) for r in records], index=df.index, dtype=object)
    # Not CSV columns either: the run's measured settings (groupings) and gradient norms (loss check).
    df["settings"] = pd.Series([groups.settings(r) if isinstance(r, dict) else {} for r in records], index=df.index,
                               dtype=object)
    df["grad_norm_curve"] = pd.Series([losscheck.curve(r.get("grad_norm_per_step")) if isinstance(r, dict) else None
                                       for r in records], index=df.index, dtype=object)
    cache: dict = {}
    df["usd_per_gpu_hour"] = [u if _number(u) else _shape_price(s, cache)
                              for u, s in zip(df["usd_per_gpu_hour"], df["gpu_shape"])]
    for col in NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df["cost_usd_per_mtok"] = pd.to_numeric(pd.Series([
        cost_per_mtok(u, w, t) if s == "ok" else None
        for u, w, t, s in zip(df["usd_per_gpu_hour"], df["world_size"], df["tokens_per_s"], df["status"])
    ], index=df.index, dtype=object), errors="coerce")
    return df.sort_values(["strategy", "world_size", "seq_len", "config_id", "repeat"], kind="stable",
                          na_position="last").reset_index(drop=True)


def write_csv(df: pd.DataFrame, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)
    return path


def columns_markdown(extra: list[tuple[str, str]] = ()) -> str:  # type: ignore[assignment]
    docs = {name: doc for name, doc, _ in COLUMNS} | dict(DERIVED_COLUMNS) | dict(extra)
    lines = ["| column | meaning |", "|---|---|"]
    lines += [f"| `{name}` | {doc} |" for name, doc in docs.items()]
    return "\n".join(lines)
