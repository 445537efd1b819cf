"""The shared knobs written over a DeepSpeed JSON config (torch-free): the bucket size
(--bucket-mib, DDP's bucket_cap_mb) and, for ZeRO-3, re-sharding after forward (FSDP's meaning).
The ZeRO strategy (trainer/strategies/zero.py) and the planner's closed forms
(trainer/plan/formulas.py) both read a config through here, so they cannot disagree.

ZeRO-3 is matched with FSDP (trainer/strategies/fsdp.py) module for module:
- units: every transformer block is one DeepSpeed "leaf module" (zero3.json `leaf_module`), so
  its parameters are gathered and released together, as FSDP's per-block `fully_shard` does;
- the root (tied embedding / lm_head, position embedding, final LayerNorm) is never resharded
  after forward under FSDP: ZeRO-3 makes those parameters persistent (strategies/zero.py), so
  they are gathered once per step instead of at each of their four uses;
- prefetching on for both: FSDP2 prefetches one unit ahead; ZeRO-3 gets a prefetch bucket of one
  block's elements (`unit_numel`) and a live-parameter budget of two units
  (`stage3_max_live_parameters` 0 switched DeepSpeed's prefetch off: 0 prefetch submits);
- no per-parameter persistence inside a block (zero3.json threshold 0): a block's small
  parameters come in its one gather, as in FSDP, instead of one all-gather each after every step;
- re-sharding is the reuse distance: 0 releases a block after its forward, except the last one,
  whose backward use the prefetcher scans past while it is still gathered (FSDP's plan keeps it).
"""
from __future__ import annotations

import json
from pathlib import Path

DS_CONFIGS = Path(__file__).resolve().parent / "ds_configs"

# Bytes per element by dtype name. DeepSpeed sizes buckets in elements: what a --bucket-mib is in
# elements depends on the dtype the bucket is allocated in (bucket_element_bytes).
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
KEEP_GATHERED = 1_000_000_000  # DeepSpeed's default live-parameter budget / reuse distance


def bucket_element_bytes(stage: int, precision: str, grad_reduce_dtype: str = "fp32") -> int:
    """Bytes per element of the reduce bucket as DeepSpeed 0.19 allocates it: ZeRO-1/2 in the
    model's dtype (`_gradient_reduction_buffer_dtype`: the grad-accum dtype, which defaults to the
    model's), ZeRO-3 in the communication dtype (`ipg_buckets` keyed by communication_data_type,
    our --grad-reduce-dtype): a bf16 ZeRO-3 run reducing in fp32 has a 4-byte bucket."""
    return ELEMENT_BYTES[grad_reduce_dtype] if stage == 3 else ELEMENT_BYTES[precision]


def match_knobs(ds: dict, bucket_mib: float, reshard_after_forward: bool, stage: int, precision: str,
                grad_reduce_dtype: str = "fp32", unit_numel: int | None = None) -> dict:
    """Write the shared knobs into `ds` (a whole DeepSpeed config) and return it. `unit_numel`:
    the elements ZeRO-3 gathers for one block (its parameters above the persistence threshold),
    the prefetch bucket that makes it prefetch one block ahead like FSDP; without it (a config
    read without a model) the bucket size stands in."""
    zero = ds.setdefault("zero_optimization", {})
    mib = bucket_mib * 2 ** 20
    zero["reduce_bucket_size"] = int(mib / bucket_element_bytes(stage, precision, grad_reduce_dtype))
    zero["allgather_bucket_size"] = int(mib / ELEMENT_BYTES[precision])  # stage 1/2: parameters, model dtype
    if stage == 3:
        unit = int(unit_numel or zero["allgather_bucket_size"])
        zero["stage3_prefetch_bucket_size"] = unit
        # Never 0 (that turns prefetching off). Re-sharding: the unit in use and the one
        # prefetched (FSDP's), so the prefetcher stops one unit ahead instead of scanning past
        # gathered blocks and marking every later use as near (which kept everything gathered).
        zero["stage3_max_live_parameters"] = 2 * unit if reshard_after_forward else KEEP_GATHERED
        zero["stage3_max_reuse_distance"] = 0 if reshard_after_forward else KEEP_GATHERED
    return ds


def config_path(stage: int) -> Path:
    """The packaged DeepSpeed config of ZeRO stage `stage` (every preset of that stage reads it)."""
    return DS_CONFIGS / f"zero{stage}.json"


def place_state(ds: dict, on_host: tuple[str, ...] | list[str], hpz_partition_size: int = 1,
                quantized_weights: bool = False, quantized_gradients: bool = False, pin_memory: bool = False) -> dict:
    """Write where the state lives (the layout's `on_host`: ZeRO-Offload) and ZeRO++ into `ds`.
    Offload keeps our torch AdamW (`zero_force_ds_cpu_optimizer` false): DeepSpeed's own CPU Adam
    would be JIT-compiled (cpu_adam) and would differ from every other strategy's optimizer.
    Pinned host buffers only on a GPU (they speed up its copies; on a CPU run there is no copy)."""
    zero = ds.setdefault("zero_optimization", {})
    if "optimizer" in on_host:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin_memory}
    if "params" in on_host:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin_memory}
    if on_host:
        ds["zero_force_ds_cpu_optimizer"] = False
    if hpz_partition_size > 1:
        zero["zero_hpz_partition_size"] = int(hpz_partition_size)
    if quantized_weights:
        zero["zero_quantized_weights"] = True
    if quantized_gradients:
        zero["zero_quantized_gradients"] = True
    return ds


def zero_config(stage: int, bucket_mib: float, reshard_after_forward: bool, precision: str,
                grad_reduce_dtype: str = "fp32", unit_numel: int | None = None, on_host: tuple[str, ...] = (),
                hpz_partition_size: int = 1) -> dict:
    """The zero_optimization block a run of ZeRO stage `stage` gets from trainer/ds_configs + the knobs."""
    ds = json.loads(config_path(stage).read_text())
    place_state(ds, on_host, hpz_partition_size)
    return match_knobs(ds, bucket_mib, reshard_after_forward, stage, precision, grad_reduce_dtype,
                       unit_numel)["zero_optimization"]


def unit_numel(block_param_numels: list[int], persistence_threshold: int) -> int:
    """Elements ZeRO-3 all-gathers for one block: its parameters above the persistence threshold
    (smaller ones are persistent, never gathered, and the prefetcher does not count them)."""
    return sum(n for n in block_param_numels if n > persistence_threshold)
