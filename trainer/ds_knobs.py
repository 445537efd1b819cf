"""The shared knobs written over a DeepSpeed JSON config (torch-free): the bucket size
(--bucket-mib, DDP's bucket_cap_mb) and, for ZeRO-3, re-sharding after forward (FSDP's meaning).
The ZeRO strategy (trainer/strategies/zero.py) and the planner's closed forms
(trainer/plan/formulas.py) both read a config through here, so they cannot disagree."""
from __future__ import annotations

import json
from pathlib import Path

DS_CONFIGS = Path(__file__).resolve().parent / "ds_configs"

# Bytes per element of the engine's parameters and gradients (the model is cast to the run's
# precision; a bf16 reduction of fp32 gradients still buckets fp32): DeepSpeed counts elements.
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
KEEP_GATHERED = 1_000_000_000  # DeepSpeed's default live-parameter budget: nothing resharded


def match_knobs(ds: dict, bucket_mib: float, reshard_after_forward: bool, stage: int, precision: str) -> dict:
    """Write the shared knobs into `ds` (a whole DeepSpeed config) and return it."""
    zero = ds.setdefault("zero_optimization", {})
    elements = int(bucket_mib * 2 ** 20 / ELEMENT_BYTES[precision])
    zero["reduce_bucket_size"] = zero["allgather_bucket_size"] = elements
    if stage == 3:
        zero["stage3_prefetch_bucket_size"] = elements
        keep = 0 if reshard_after_forward else KEEP_GATHERED
        zero["stage3_max_live_parameters"] = zero["stage3_max_reuse_distance"] = keep
    return ds


def zero_config(strategy: str, bucket_mib: float, reshard_after_forward: bool, precision: str) -> dict:
    """The zero_optimization block a run of `strategy` gets from trainer/ds_configs + the knobs."""
    ds = json.loads((DS_CONFIGS / f"{strategy}.json").read_text())
    stage = int(ds.get("zero_optimization", {}).get("stage", 0))
    return match_knobs(ds, bucket_mib, reshard_after_forward, stage, precision)["zero_optimization"]
