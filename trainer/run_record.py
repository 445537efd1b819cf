"""The result record of one run, built from its config before anything runs and completed from
what was measured (also for a run that failed half-way: fill_timings takes whatever it has)."""
from __future__ import annotations

import socket
import time
from datetime import datetime, timezone

import torch

from shardbench.trainer import contract, env_info, knobs
from shardbench.trainer.config import RunConfig, id_fields
from shardbench.trainer.devices import device_name
from shardbench.trainer.dist_env import DistEnv
from shardbench.trainer.metrics import peak_flops_for, rank_memory, step_time_stats
from shardbench.trainer.model import flops_params, flops_per_token
from shardbench.trainer.parallel.layout import Layout
from shardbench.trainer.presets import ModelConfig
from shardbench.trainer.process import gather, mean_over_ranks
from shardbench.trainer.record import ResultRecord


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def base_record(cfg: RunConfig, d: DistEnv, device: torch.device, precision: str, mcfg: ModelConfig,
                grad_accum: int, seq_len: int) -> ResultRecord:
    """Everything known before the first step: labels, shape of the run, peak FLOP/s, settings."""
    layout = Layout.of(cfg, d.world_size)
    tokens_per_step = cfg.micro_batch * grad_accum * layout.dp * seq_len  # tensor-parallel peers share rows
    peak = peak_flops_for(device_name(device) if device.type == "cuda" else "",
                          precision, cfg.peak_tflops, tf32=torch.backends.cuda.matmul.allow_tf32)
    launcher, nodes = cfg.launcher or d.launcher, max(1, d.world_size // d.local_world_size)
    config = contract.config_id(id_fields(cfg, d.world_size, nodes, launcher))
    return ResultRecord(
        run_id=cfg.run_id or contract.run_id(cfg.strategy, d.world_size, seq_len, cfg.micro_batch,
                                             grad_accum, config, cfg.repeat),
        config_id=config, repeat=cfg.repeat,
        strategy=cfg.strategy, launcher=launcher, world_size=d.world_size, nodes=nodes,
        devices_per_node=d.local_world_size, device=device.type,
        device_name=device_name(device), gpu_shape=cfg.shape,
        comm_backend="nccl" if device.type == "cuda" else "gloo",
        model={"preset": cfg.model, **{k: getattr(mcfg, k) for k in
                                      ("n_layer", "n_embd", "n_head", "vocab_size", "block_size")},
               # untied only (tied records keep their model key): --no-tie-embeddings
               **({} if mcfg.tie_embeddings else {"tie_embeddings": False})},
        n_params_flops=flops_params(mcfg), precision=precision, seq_len=seq_len,
        micro_batch=cfg.micro_batch, grad_accum=grad_accum,
        global_batch=cfg.micro_batch * grad_accum * layout.dp, layout=layout.degrees,
        memory_by_dim=layout.divides(contract.STRATEGIES[cfg.strategy].sharded),
        tokens_per_step=tokens_per_step, steps=cfg.steps, warmup_steps=cfg.warmup_steps,
        flops_per_token=flops_per_token(mcfg, seq_len), peak_flops=peak.flops,
        peak_flops_source=peak.source, peak_flops_given=peak.given,
        warnings=[peak.warning] if peak.warning else [], usd_per_gpu_hour=cfg.usd_per_gpu_hour,
        grad_reduce_dtype=cfg.grad_reduce_dtype,
        activation_checkpointing=cfg.activation_checkpointing, compile=cfg.compile, seed=cfg.seed,
        float8=cfg.float8,
        optimizer={"name": "AdamW", "lr": cfg.lr, "betas": list(cfg.adam_betas()), "eps": cfg.adam_eps,
                   "weight_decay": cfg.weight_decay,
                   "grad_clip": cfg.grad_clip, "lr_warmup_steps": cfg.lr_warmup_steps,
                   "schedule": "linear warm-up, cosine to 10%"},
        versions=env_info.versions(), nccl_env=env_info.nccl_env(), hostname=socket.gethostname(),
        started_at=now(), args=list(cfg.argv), settings=knobs.settings(cfg))


def finish_record(r: ResultRecord, losses: list[float], d: DistEnv, device: torch.device, mine: tuple,
                  wall_start: float) -> None:
    """Losses averaged over ranks, every rank's memory, model state and cores gathered (a
    collective: every rank calls it). `mine` = (RankMemory, RankModelState, cores) of this rank."""
    r.loss_per_step = mean_over_ranks(losses, d.world_size, device)
    r.final_loss = r.loss_per_step[-1] if r.loss_per_step else None
    r.nccl_env, r.nccl_env_disagreement = env_info.nccl_env_across_ranks(lambda o: gather(o, d.world_size))
    everyone = gather(mine, d.world_size)
    layout = Layout(**r.layout) if r.layout else None  # type: ignore[arg-type]
    places = gather((socket.gethostname(), d.local_rank), d.world_size)
    r.mesh_coords = [{"rank": rank, "host": host, "local_rank": local, **(layout.coords(rank) if layout else {})}
                     for rank, (host, local) in enumerate(places)]
    r.memory = [m for m, _, _ in everyone]
    r.cpu_affinity = [a for _, _, a in everyone]
    peaks = [m.tensor_peak_bytes for m in r.memory if m.tensor_peak_bytes is not None]
    r.tensor_peak_bytes = max(peaks) if peaks else None
    states = [s for _, s, _ in everyone if s is not None]
    if states:
        r.model_state = states
        r.model_state_bytes_per_rank = max(s.total_bytes for s in states)
    if device.type == "cuda":
        r.peak_memory_bytes = max(m.train_peak_bytes for m in r.memory)  # type: ignore[type-var]
        r.peak_memory_source = "gpu: max allocated during training (peak statistics reset after set-up)"
    elif r.model_state_bytes_per_rank is not None:
        r.peak_memory_bytes = r.model_state_bytes_per_rank
        r.peak_memory_source = "cpu: model state tensors held (activations not included; RSS is in memory)"
    r.wall_time_s = time.time() - wall_start
    r.finished_at = now()


def fill_timings(r: ResultRecord, step_times: list[float], h2d_gbps: float | None) -> None:
    """The throughput numbers from whatever steps were measured (also for failed runs)."""
    r.measured_steps = len(step_times)
    r.threads_per_rank = torch.get_num_threads()
    r.step_time_s = step_time_stats(step_times)
    if step_times:
        r.tokens_per_s = r.tokens_per_step * len(step_times) / sum(step_times)
        r.tokens_per_s_per_device = r.tokens_per_s / r.world_size
        if r.peak_flops:
            r.mfu = r.flops_per_token * r.tokens_per_s / (r.world_size * r.peak_flops)  # type: ignore[operator]
    r.h2d_gbps = h2d_gbps


__all__ = ["base_record", "fill_timings", "finish_record", "now", "rank_memory"]
