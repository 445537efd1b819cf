"""Result records -> one flat row per run (metrics.csv), plus the derived numbers the report needs.

Derived columns:
- scaling_efficiency = tok/s(N) / (tok/s(base) x N / base), where base is the smallest world size
  with an ok run of the same strategy, model, seq len, micro-batch, precision, shape and launcher
  (DESIGN.md), and tok/s(base) is the mean over that world size's repeats.
- cost_usd_per_mtok = usd_per_gpu_hour x world_size / 3600 / tokens_per_s x 1e6, the price from
  the record or else from values/<shape>.yaml `shape.usdPerGpuHour`.
`summarize` then folds repeats into mean and spread (sample standard deviation; 0 for one repeat).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd

from tui.suite.matrix import load_shape

GIB = 1024 ** 3


def _get(*path: str) -> Callable[[dict], Any]:
    def get(record: dict) -> Any:
        value: Any = record
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value
    return get


def _repeat(record: dict) -> int:
    m = re.search(r"-r(\d+)$", str(record.get("run_id") or ""))
    return int(m.group(1)) if m else 0


def _gib(key: str) -> Callable[[dict], Any]:
    return lambda r: r[key] / GIB if isinstance(r.get(key), (int, float)) else None


# (column, description, how to read it from a record). The order is the CSV's.
COLUMNS: list[tuple[str, str, Callable[[dict], Any]]] = [
    ("run_id", "stable run id: strategy-wWORLD-sSEQ-mbMICRO-gaACCUM-rREPEAT", _get("run_id")),
    ("config_id", "run id without the repeat suffix: runs that differ only by repeat share it", lambda r: re.sub(r"-r\d+$", "", str(r.get("run_id") or ""))),
    ("repeat", "repeat index (from the run id)", _repeat),
    ("status", "ok, failed, oom or timeout", _get("status")),
    ("error", "why the run did not finish ok (empty when ok)", _get("error")),
    ("strategy", "ddp, fsdp, zero1, zero2 or zero3", _get("strategy")),
    ("launcher", "mpirun, deepspeed, torchrun or none", _get("launcher")),
    ("world_size", "devices (ranks) in the run", _get("world_size")),
    ("nodes", "machines the run spanned", _get("nodes")),
    ("devices_per_node", "ranks per machine", _get("devices_per_node")),
    ("device", "cpu or cuda", _get("device")),
    ("device_name", "GPU or CPU model", _get("device_name")),
    ("gpu_shape", "values file name of the hardware shape", _get("gpu_shape")),
    ("comm_backend", "gloo or nccl", _get("comm_backend")),
    ("model", "model preset", _get("model", "preset")),
    ("n_layer", "transformer blocks", _get("model", "n_layer")),
    ("n_embd", "model width", _get("model", "n_embd")),
    ("n_head", "attention heads", _get("model", "n_head")),
    ("vocab_size", "vocabulary size", _get("model", "vocab_size")),
    ("n_params", "trainable parameters", _get("n_params")),
    ("precision", "fp32, bf16 or fp16 (as run)", _get("precision")),
    ("seq_len", "tokens per sequence", _get("seq_len")),
    ("micro_batch", "sequences per rank per micro-step", _get("micro_batch")),
    ("grad_accum", "micro-steps per optimizer step", _get("grad_accum")),
    ("global_batch", "sequences per optimizer step (micro_batch x grad_accum x world_size)", _get("global_batch")),
    ("tokens_per_step", "tokens per optimizer step", _get("tokens_per_step")),
    ("steps", "optimizer steps run, warm-up included", _get("steps")),
    ("warmup_steps", "steps excluded from every metric", _get("warmup_steps")),
    ("measured_steps", "steps the metrics are over", _get("measured_steps")),
    ("tokens_per_s", "global training throughput over the measured steps, tokens/s", _get("tokens_per_s")),
    ("tokens_per_s_per_device", "tokens_per_s / world_size", _get("tokens_per_s_per_device")),
    ("step_time_mean_s", "mean optimizer-step wall time, s", _get("step_time_s", "mean")),
    ("step_time_p50_s", "median step time, s", _get("step_time_s", "p50")),
    ("step_time_p90_s", "90th percentile step time, s", _get("step_time_s", "p90")),
    ("final_loss", "loss of the last step", _get("final_loss")),
    ("peak_memory_gib", "peak memory per device, GiB: max over ranks of GPU max-allocated, or CPU peak RSS", _gib("peak_memory_bytes")),
    ("model_state_gib_per_rank", "params + grads + optimizer state held by one rank (max over ranks), GiB", _gib("model_state_bytes_per_rank")),
    ("flops_per_token", "training FLOPs per token, 6N + 12LdT (PaLM appendix B)", _get("flops_per_token")),
    ("mfu", "model FLOPs utilization, 0-1 (empty when the peak is unknown)", _get("mfu")),
    ("peak_tflops", "peak dense TFLOP/s of one device used for MFU", lambda r: r["peak_flops"] / 1e12 if isinstance(r.get("peak_flops"), (int, float)) else None),
    ("peak_flops_source", "where that peak came from", _get("peak_flops_source")),
    ("h2d_gbps", "host-to-device copy rate of the batches, GB/s (empty on CPU)", _get("h2d_gbps")),
    ("time_to_first_step_s", "process start to the end of the first step on rank 0, s", _get("time_to_first_step_s")),
    ("wall_time_s", "trainer wall time, s", _get("wall_time_s")),
    ("usd_per_gpu_hour", "price of one device-hour used for cost (record, else values/<shape>.yaml)", _get("usd_per_gpu_hour")),
    ("torch_version", "torch version", _get("versions", "torch")),
    ("deepspeed_version", "DeepSpeed version", _get("versions", "deepspeed")),
    ("nccl_version", "NCCL version (empty on CPU)", _get("versions", "nccl")),
    ("cuda_version", "CUDA version (empty on CPU)", _get("versions", "cuda")),
    ("python_version", "Python version", _get("versions", "python")),
    ("image", "container image (cluster runs)", _get("versions", "image")),
    ("hostname", "host of rank 0", _get("hostname")),
    ("started_at", "start time, ISO 8601 UTC", _get("started_at")),
    ("finished_at", "end time, ISO 8601 UTC", _get("finished_at")),
]
DERIVED_COLUMNS: list[tuple[str, str]] = [
    ("scaling_base_world_size", "smallest world size with an ok run of the same strategy/model/seq len/micro-batch/precision/shape/launcher"),
    ("scaling_efficiency", "tok/s(N) / (mean tok/s(base) x N / base); 1.0 = linear scaling"),
    ("cost_usd_per_mtok", "usd_per_gpu_hour x world_size / 3600 / tokens_per_s x 1e6: dollars per million training tokens"),
]
COLUMN_DOCS: dict[str, str] = {name: doc for name, doc, _ in COLUMNS} | dict(DERIVED_COLUMNS)
SCALING_GROUP = ["strategy", "model", "seq_len", "micro_batch", "precision", "gpu_shape", "launcher"]


def load_records(results_dir: str | Path) -> list[dict[str, Any]]:
    """Every results/<run-id>/result.json that parses as a JSON object (others are skipped)."""
    records = []
    for path in sorted(Path(results_dir).glob("*/result.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            records.append(data)
    return records


def flatten(record: dict[str, Any]) -> dict[str, Any]:
    return {name: get(record) for name, _, get in COLUMNS}


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
    if not usd_per_gpu_hour or not world_size or not tokens_per_s:
        return None
    return usd_per_gpu_hour * world_size / 3600.0 / tokens_per_s * 1e6


def add_scaling(df: pd.DataFrame) -> pd.DataFrame:
    """Adds scaling_base_world_size and scaling_efficiency (ok rows only; others stay empty)."""
    df = df.copy()
    df["scaling_base_world_size"] = pd.NA
    df["scaling_efficiency"] = float("nan")
    ok = df[(df["status"] == "ok") & df["tokens_per_s"].notna()]
    if ok.empty:
        return df
    # Plain str() per cell: astype(str) leaves NaN a float in object columns (an unknown shape).
    keys = pd.Series(["|".join(str(v) for v in row) for row in ok[SCALING_GROUP].itertuples(index=False)],
                     index=ok.index)
    for _, group in ok.groupby(keys):
        base = int(group["world_size"].min())
        base_tps = group.loc[group["world_size"] == base, "tokens_per_s"].astype(float).mean()
        for idx, row in group.iterrows():
            ideal = base_tps * row["world_size"] / base
            df.at[idx, "scaling_base_world_size"] = base
            df.at[idx, "scaling_efficiency"] = float(row["tokens_per_s"]) / ideal if ideal else float("nan")
    return df


def to_frame(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per record with COLUMNS + DERIVED_COLUMNS, sorted by strategy, world size, run id."""
    rows = [flatten(r) for r in records]
    df = pd.DataFrame(rows, columns=[c for c, _, _ in COLUMNS])
    cache: dict = {}
    df["usd_per_gpu_hour"] = [u if isinstance(u, (int, float)) and u == u else _shape_price(s, cache)
                              for u, s in zip(df["usd_per_gpu_hour"], df["gpu_shape"])]
    for col in ("world_size", "seq_len", "micro_batch"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    for col in ("tokens_per_s", "step_time_mean_s", "peak_memory_gib", "mfu", "h2d_gbps", "usd_per_gpu_hour"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df = add_scaling(df)
    df["cost_usd_per_mtok"] = [
        cost_per_mtok(u, w, t) if s == "ok" else None
        for u, w, t, s in zip(df["usd_per_gpu_hour"], df["world_size"], df["tokens_per_s"], df["status"])
    ]
    df["cost_usd_per_mtok"] = pd.to_numeric(df["cost_usd_per_mtok"], errors="coerce")
    return df.sort_values(["strategy", "world_size", "seq_len", "config_id", "repeat"], kind="stable").reset_index(drop=True)


SUMMARY_METRICS = ["tokens_per_s", "step_time_mean_s", "peak_memory_gib", "scaling_efficiency",
                   "cost_usd_per_mtok", "mfu", "h2d_gbps", "model_state_gib_per_rank", "final_loss"]


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Ok runs folded over repeats: per config, `<metric>_mean`, `<metric>_std` and `repeats`."""
    ok = df[df["status"] == "ok"].copy()
    keys = ["config_id", "strategy", "world_size", "model", "seq_len", "micro_batch", "grad_accum",
            "precision", "gpu_shape", "launcher"]
    if ok.empty:
        return pd.DataFrame(columns=keys + ["repeats"])
    for col in SUMMARY_METRICS:
        ok[col] = pd.to_numeric(ok[col], errors="coerce")
    grouped = ok.groupby([k for k in keys], dropna=False, sort=False)
    out = grouped[SUMMARY_METRICS].agg(["mean", "std"])
    out.columns = [f"{m}_{s}" for m, s in out.columns]
    for m in SUMMARY_METRICS:  # one repeat has no spread: say 0, not NaN
        out[f"{m}_std"] = out[f"{m}_std"].where(out[f"{m}_mean"].isna() | out[f"{m}_std"].notna(), 0.0)
    out["repeats"] = grouped.size()
    return out.reset_index().sort_values(["strategy", "world_size", "seq_len"], kind="stable").reset_index(drop=True)


def write_csv(df: pd.DataFrame, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)
    return path


def columns_markdown() -> str:
    lines = ["| column | meaning |", "|---|---|"]
    lines += [f"| `{name}` | {doc} |" for name, doc in COLUMN_DOCS.items()]
    return "\n".join(lines)
