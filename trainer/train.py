"""One benchmark run on this rank: process group, model, strategy, warm-up and measured steps.

The device is synchronised only at step boundaries (the step timer needs it); everything inside
a step is queued asynchronously. Measurements accumulate on the `Trainer` as they are taken so
that a run that fails half-way still reports what it measured.
"""
from __future__ import annotations

import json
import os
import socket
import time
from datetime import datetime, timedelta, timezone

import torch
import torch.distributed as dist

from trainer import env_info
from trainer import contract
from trainer.config import RunConfig, measured_fields
from trainer.data import SyntheticBatches
from trainer.devices import check_memory, device_name, resolve_precision, usable_device
from trainer.dist_env import DistEnv, resolve_rendezvous
from trainer.metrics import peak_flops_for, rank_memory, step_time_stats
from trainer.model import TinyGPT, count_params, flops_params, flops_per_token
from trainer.record import PROGRESS_PREFIX, ResultRecord
from trainer.strategies import Context, make_strategy


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Trainer:
    def __init__(self, cfg: RunConfig, denv: DistEnv):
        self.cfg, self.dist = cfg, denv
        self.device, self.device_error = usable_device(cfg, denv.local_rank)
        self.precision = resolve_precision(cfg, self.device)
        if not self.device_error:  # sized for the GPU that is not there: skip, the record says why
            check_memory(cfg, self.device, denv.world_size, denv.local_world_size)
        self.grad_accum = cfg.effective_grad_accum(denv.world_size)
        self.seq_len = cfg.effective_seq_len()
        self.mcfg = cfg.model_config()
        self.step_times: list[float] = []
        self.losses: list[float] = []  # rank-local until finish() averages them over ranks
        self.h2d_bytes = 0
        self.h2d_seconds = 0.0
        self._h2d_events = None  # (start, end, bytes) of the current step's copies (GPU only)
        self.time_to_first_step: float | None = None
        self.state = None
        self.record = self._base_record()

    # -- set-up ---------------------------------------------------------------------------------
    def _base_record(self) -> ResultRecord:
        cfg, d = self.cfg, self.dist
        tokens_per_step = cfg.micro_batch * self.grad_accum * d.world_size * self.seq_len
        peak, source = peak_flops_for(device_name(self.device) if self.device.type == "cuda" else "",
                                      cfg.peak_tflops)
        launcher, nodes = cfg.launcher or d.launcher, max(1, d.world_size // d.local_world_size)
        config = contract.config_id(measured_fields(cfg, d.world_size, nodes, launcher))
        return ResultRecord(
            run_id=cfg.run_id or contract.run_id(cfg.strategy, d.world_size, self.seq_len, cfg.micro_batch,
                                                 self.grad_accum, config, cfg.repeat),
            config_id=config, repeat=cfg.repeat,
            strategy=cfg.strategy, launcher=launcher, world_size=d.world_size, nodes=nodes,
            devices_per_node=d.local_world_size, device=self.device.type,
            device_name=device_name(self.device), gpu_shape=cfg.shape,
            comm_backend="nccl" if self.device.type == "cuda" else "gloo",
            model={"preset": cfg.model, **{k: getattr(self.mcfg, k) for k in
                                          ("n_layer", "n_embd", "n_head", "vocab_size", "block_size")}},
            n_params_flops=flops_params(self.mcfg), precision=self.precision, seq_len=self.seq_len,
            micro_batch=cfg.micro_batch, grad_accum=self.grad_accum,
            global_batch=cfg.micro_batch * self.grad_accum * d.world_size,
            tokens_per_step=tokens_per_step, steps=cfg.steps, warmup_steps=cfg.warmup_steps,
            flops_per_token=flops_per_token(self.mcfg, self.seq_len), peak_flops=peak,
            peak_flops_source=source, usd_per_gpu_hour=cfg.usd_per_gpu_hour,
            activation_checkpointing=cfg.activation_checkpointing, compile=cfg.compile, seed=cfg.seed,
            optimizer={"name": "AdamW", "lr": cfg.lr, "betas": [0.9, 0.95], "weight_decay": cfg.weight_decay,
                       "grad_clip": cfg.grad_clip, "lr_warmup_steps": cfg.lr_warmup_steps,
                       "schedule": "linear warm-up, cosine to 10%"},
            versions=env_info.versions(), nccl_env=env_info.nccl_env(), hostname=socket.gethostname(),
            started_at=_now(), args=list(cfg.argv))

    def init_process_group(self) -> None:
        """A process group whenever there is more than one rank, and for DeepSpeed always (it
        needs one even alone: a one-rank gloo group on loopback, no launcher required)."""
        if self.device_error:  # --device cuda that cannot run here: fail with the record
            raise self.device_error
        d = self.dist
        self.distributed = d.world_size > 1
        if not (self.distributed or contract.STRATEGIES[self.cfg.strategy].group_at_world_size_1):
            return
        resolve_rendezvous(d)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        # Variables DeepSpeed's own communication layer reads.
        os.environ.update(RANK=str(d.rank), WORLD_SIZE=str(d.world_size), LOCAL_RANK=str(d.local_rank),
                          MASTER_ADDR=str(d.master_addr), MASTER_PORT=str(d.master_port))
        dist.init_process_group(
            backend="nccl" if self.device.type == "cuda" else "gloo",
            init_method=f"tcp://{d.master_addr}:{d.master_port}",
            rank=d.rank, world_size=d.world_size,
            timeout=timedelta(seconds=self.cfg.pg_timeout_s))

    def build(self) -> None:
        if self.device.type == "cpu":
            # Ranks on one machine share its cores: oversubscribed threads thrash.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.dist.local_world_size))
        torch.manual_seed(self.cfg.seed)  # identical initial weights on every rank and strategy
        model = TinyGPT(self.mcfg, activation_checkpointing=self.cfg.activation_checkpointing)
        self.record.n_params = count_params(model)
        if self.cfg.compile:
            for block in model.blocks:
                block.compile()
        self.ctx = Context(cfg=self.cfg, dist=self.dist, device=self.device, precision=self.precision,
                           grad_accum=self.grad_accum, distributed=self.distributed)
        self.strategy = make_strategy(self.ctx)
        self.strategy.setup(model)
        self.data = SyntheticBatches(self.cfg.seed, self.seq_len, self.mcfg.vocab_size, self.cfg.micro_batch,
                                     self.grad_accum, self.dist.rank, self.dist.world_size,
                                     pin_memory=self.device.type == "cuda")

    # -- the loop -------------------------------------------------------------------------------
    def _to_device(self, batches):
        if self.device.type != "cuda":
            return batches
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        moved = [(x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)) for x, y in batches]
        end.record()
        self._h2d_events = (start, end, sum(x.nbytes + y.nbytes for x, y in batches))
        return moved

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def train(self, process_start: float) -> None:
        cfg = self.cfg
        next_batches = self.data.step_batches(0)
        loop_start = time.perf_counter()
        self._sync()
        for step in range(cfg.steps):
            measured = step >= cfg.warmup_steps
            last_step = step == cfg.steps - 1
            t0 = time.perf_counter()
            batches = self._to_device(next_batches)
            step_loss = torch.zeros((), device=self.device)
            for micro, (x, y) in enumerate(batches):
                last = micro == len(batches) - 1
                step_loss += self.strategy.forward_backward(x, y, last)
                if last and last_step:
                    self.state = self.strategy.model_state()  # grads are present only here
                self.strategy.step(last)
            if not last_step:
                next_batches = self.data.step_batches(step + 1)  # overlaps queued GPU work
            self._sync()
            dt = time.perf_counter() - t0
            loss = (step_loss / len(batches)).item()
            self.losses.append(loss)
            if self.time_to_first_step is None:
                self.time_to_first_step = time.time() - process_start
            if measured:
                self.step_times.append(dt)
                self._count_h2d()
            self._progress(step, dt, loss, time.perf_counter() - loop_start)

    def _count_h2d(self) -> None:
        events = self._h2d_events
        if events:
            start, end, nbytes = events
            self.h2d_seconds += start.elapsed_time(end) / 1000.0
            self.h2d_bytes += nbytes

    def _progress(self, step: int, dt: float, loss: float, elapsed: float) -> None:
        if self.dist.rank != 0 or (step + 1) % self.cfg.progress_every and step + 1 != self.cfg.steps:
            return
        remaining = self.cfg.steps - step - 1
        recent = self.step_times[-10:] or [dt]
        line = {"step": step + 1, "steps": self.cfg.steps,
                "phase": "measure" if step >= self.cfg.warmup_steps else "warmup",
                "loss": round(loss, 6), "step_time_s": round(dt, 6),
                "tokens_per_s": round(self.record.tokens_per_step / dt, 2),
                "elapsed_s": round(elapsed, 3), "eta_s": round(remaining * sum(recent) / len(recent), 3)}
        print(PROGRESS_PREFIX + json.dumps(line), flush=True)

    # -- results --------------------------------------------------------------------------------
    def _gather(self, obj):
        if dist.is_initialized() and self.dist.world_size > 1:
            out = [None] * self.dist.world_size
            dist.all_gather_object(out, obj)
            return out
        return [obj]

    def finish(self, wall_start: float) -> ResultRecord:
        """Average losses over ranks, gather memory and model state, fill in the record."""
        r = self.record
        losses = torch.tensor(self.losses, dtype=torch.float64)
        if dist.is_initialized() and self.dist.world_size > 1:
            losses = losses.to(self.device)
            dist.all_reduce(losses)
            losses = (losses / self.dist.world_size).cpu()
        r.loss_per_step = [float(v) for v in losses]
        r.final_loss = r.loss_per_step[-1] if r.loss_per_step else None
        r.nccl_env, r.nccl_env_disagreement = env_info.nccl_env_across_ranks(self._gather)
        self.fill_timings(r)
        r.peak_memory = sorted(self._gather(rank_memory(self.dist.rank, self.device)), key=lambda m: m.rank)
        r.peak_memory_bytes = max((m.allocated_bytes if m.allocated_bytes is not None else m.rss_bytes)
                                  for m in r.peak_memory)
        if self.state is not None:
            r.model_state = sorted(self._gather(self.state), key=lambda s: s.rank)
            r.model_state_bytes_per_rank = max(s.total_bytes for s in r.model_state)
        r.wall_time_s = time.time() - wall_start
        r.finished_at = _now()
        return r

    def fill_timings(self, r: ResultRecord) -> None:
        """The throughput numbers from whatever steps were measured (also for failed runs)."""
        r.measured_steps = len(self.step_times)
        r.step_time_s = step_time_stats(self.step_times)
        r.time_to_first_step_s = self.time_to_first_step
        if self.step_times:
            r.tokens_per_s = r.tokens_per_step * len(self.step_times) / sum(self.step_times)
            r.tokens_per_s_per_device = r.tokens_per_s / r.world_size
            if r.peak_flops:
                r.mfu = r.flops_per_token * r.tokens_per_s / (r.world_size * r.peak_flops)
        if self.h2d_seconds > 0:
            r.h2d_gbps = self.h2d_bytes / self.h2d_seconds / 1e9
        if not r.loss_per_step and self.losses:
            r.loss_per_step = list(self.losses)  # rank 0's own, when the ranks can't be averaged
            r.final_loss = self.losses[-1]
