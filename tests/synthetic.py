"""Made-up but schema-valid result records and logs, for tests and benchmarks/bench_suite.py."""
from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from shardbench.trainer.record import END_MARKER, START_MARKER, RankMemory, ResultRecord, StepTimes
from shardbench.trainer import contract


def _made_up_id(strategy: str, world_size: int, seq_len: int, micro_batch: int, grad_accum: int) -> str:
    """A stable made-up config id of the shape (not contract.config_id: a change of the id
    scheme must not move every snapshot and fixture that shows a synthetic run id)."""
    shape = {"strategy": strategy, "world_size": world_size, "seq_len": seq_len, "micro_batch": micro_batch,
             "grad_accum": grad_accum}
    text = json.dumps(shape, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:contract.CONFIG_ID_LEN]


def record(strategy: str = "ddp", world_size: int = 1, tokens_per_s: float = 1000.0, seq_len: int = 64,
           micro_batch: int = 4, grad_accum: int = 1, repeat: int = 0, status: str = "ok",
           peak_memory_bytes: int = 2 ** 30, usd_per_gpu_hour: float | None = None,
           shape: str | None = "cpu", **extra: Any) -> dict[str, Any]:
    """One record whose derived fields agree with the given throughput."""
    config = _made_up_id(strategy, world_size, seq_len, micro_batch, grad_accum)
    rid = contract.run_id(strategy, world_size, seq_len, micro_batch, grad_accum, config, repeat)
    tokens_per_step = micro_batch * grad_accum * world_size * seq_len
    step = tokens_per_step / tokens_per_s
    rec = ResultRecord(
        run_id=rid, config_id=config, repeat=repeat, status=status, strategy=strategy,
        launcher=contract.default_launcher(strategy),
        world_size=world_size, devices_per_node=world_size, device="cpu", device_name="Test CPU",
        gpu_shape=shape, model={"preset": "tiny", "n_layer": 2, "n_embd": 128, "n_head": 4,
                                "vocab_size": 8192, "block_size": 256},
        n_params=2_000_000, n_params_flops=1_900_000, precision="fp32", seq_len=seq_len,
        micro_batch=micro_batch, grad_accum=grad_accum,
        global_batch=micro_batch * grad_accum * world_size, tokens_per_step=tokens_per_step,
        steps=6, warmup_steps=2, measured_steps=4, tokens_per_s=tokens_per_s,
        tokens_per_s_per_device=tokens_per_s / world_size,
        step_time_s=StepTimes(mean=step, p50=step, p90=step * 1.1, all=[step] * 4),
        loss_per_step=[9.0, 8.9, 8.8, 8.7, 8.6, 8.5], final_loss=8.5,
        memory=[RankMemory(rank=r, rss_peak_bytes=peak_memory_bytes) for r in range(world_size)],
        peak_memory_bytes=peak_memory_bytes, model_state_bytes_per_rank=peak_memory_bytes // 4,
        flops_per_token=6 * 1_900_000 + 12 * 2 * 128 * seq_len, wall_time_s=step * 6 + 3,
        usd_per_gpu_hour=usd_per_gpu_hour, seed=1234,
        versions={"python": "3.11", "torch": "2.13.0", "deepspeed": "0.19.8", "nccl": None, "cuda": None},
        hostname="test", started_at="2026-11-22T02:00:00+00:00", finished_at="2026-11-22T02:00:10+00:00",
        error=None if status == "ok" else f"synthetic {status}",
    )
    data = rec.to_dict()
    given = extra.get("settings")
    if isinstance(given, dict):  # a real record carries a knob it has a field for in both places
        data.update({k: v for k, v in given.items() if k in data and v is not None})
    data.update(extra)
    return data


def records(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """n records over strategies x world sizes x repeats with noisy throughput; ~5% failed."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    strategies, worlds = ["ddp", "fsdp", "zero1", "zero2", "zero3"], [1, 2, 4, 8]
    i = 0
    while len(out) < n:
        strategy, world = strategies[i % 5], worlds[(i // 5) % 4]
        rep = i // 20
        status = "failed" if rng.random() < 0.05 else "ok"
        tps = 1000.0 * world * (0.9 ** (world.bit_length() - 1)) * rng.uniform(0.85, 1.15)
        out.append(record(strategy, world, tps, repeat=rep, status=status, usd_per_gpu_hour=2.0,
                          peak_memory_bytes=int(2 ** 30 / (1 + strategies.index(strategy) * 0.2))))
        i += 1
    return out


def log_with(record_data: dict[str, Any] | None, noise_lines: int = 50) -> str:
    """A realistic log: launcher noise, progress lines, then the record between its markers."""
    lines = [f"[rank1] step {i} noise" for i in range(noise_lines)]
    lines += [f'SHARDBENCH_PROGRESS {{"step": {i}, "steps": 6, "phase": "measure", "loss": 8.0}}' for i in range(6)]
    if record_data is not None:
        lines += [START_MARKER, json.dumps(record_data), END_MARKER]
    return "\n".join(lines) + "\n"
