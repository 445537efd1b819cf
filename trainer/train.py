"""One benchmark run on this rank: process group, model, strategy, warm-up and measured steps.

The device is synchronised only at step boundaries (the step timer needs it); everything inside
a step is queued asynchronously. Only the step is timed: the next step's tokens are generated
after the timer stops, and model-state memory is sampled in one untimed extra step after the
measured ones. Collectives are counted during measured steps (trainer/comm.py). Measurements
accumulate on the `Trainer` as they are taken so that a run that fails half-way still reports
what it measured.
"""
from __future__ import annotations

import json
import math
import os
import socket
import time
from datetime import datetime, timedelta, timezone

import torch
import torch.distributed as dist

from trainer import env_info
from trainer import contract
from trainer.comm import COUNTER as COMM
from trainer.config import RunConfig, measured_fields
from trainer.data import SyntheticBatches
from trainer.devices import check_memory, device_name, resolve_precision, usable_device
from trainer.dist_env import DistEnv, resolve_rendezvous
from trainer.metrics import (end_setup_memory, load_avg_1m, peak_flops_for, peak_model_state, rank_memory,
                             step_time_stats)
from trainer.checkpoint import Checkpointer
from trainer.model import TinyGPT, count_params, flops_params, flops_per_token
from trainer.record import PROGRESS_PREFIX, CheckpointCost, ResultRecord
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
        self.grad_norms: list[float | None] = []  # global already: the same on every rank
        self.h2d_bytes = 0
        self.h2d_seconds = 0.0
        self._h2d_events = None  # (start, end, bytes) of the current step's copies (GPU only)
        self.time_to_first_step: float | None = None
        self.state = None  # this rank's peak model state (the untimed memory step)
        self.setup_peak: int | None = None
        self.affinity: list[int] = []
        self.comm_per_step: dict = {}
        self.measured_here = 0  # measured steps run by this process (a resumed run restores the rest)
        self.ckpt: Checkpointer | None = None
        self.ckpt_step_times: list[float] = []
        self.restarts = 0
        # Before DeepSpeed's comm layer captures references to torch.distributed's functions.
        COMM.install()
        self.record = self._base_record()

    # -- set-up ---------------------------------------------------------------------------------
    def _base_record(self) -> ResultRecord:
        cfg, d = self.cfg, self.dist
        tokens_per_step = cfg.micro_batch * self.grad_accum * d.world_size * self.seq_len
        peak = peak_flops_for(device_name(self.device) if self.device.type == "cuda" else "",
                              self.precision, cfg.peak_tflops, tf32=torch.backends.cuda.matmul.allow_tf32)
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
            flops_per_token=flops_per_token(self.mcfg, self.seq_len), peak_flops=peak.flops,
            peak_flops_source=peak.source, peak_flops_given=peak.given,
            warnings=[peak.warning] if peak.warning else [], usd_per_gpu_hour=cfg.usd_per_gpu_hour,
            grad_reduce_dtype=cfg.grad_reduce_dtype,
            fsdp_grad_sync=cfg.fsdp_grad_sync if cfg.strategy == "fsdp" else None,
            reshard_after_forward=cfg.reshard_after_forward if cfg.strategy in ("fsdp", "zero3") else None,
            bucket_mib=cfg.bucket_mib if cfg.strategy != "fsdp" else None,
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
        timeout = timedelta(seconds=self.cfg.pg_timeout_s)
        # Groups made later without a timeout (DeepSpeed's ZeRO data-parallel group is a
        # new_group) take torch's module default, 30 min, not the world's: a hung rank would stall
        # them that long. torch reads these defaults at each new_group call.
        from torch.distributed import distributed_c10d as c10d
        c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = timeout
        dist.init_process_group(
            backend="nccl" if self.device.type == "cuda" else "gloo",
            init_method=f"tcp://{d.master_addr}:{d.master_port}",
            rank=d.rank, world_size=d.world_size, timeout=timeout)

    def _pin_cpu(self) -> None:
        """Every rank gets --threads-per-rank threads whatever the world size (1 rank = 1 core,
        like 1 GPU), on cores of its own when the machine has enough for all local ranks."""
        if self.device.type == "cpu":
            t = self.cfg.threads_per_rank
            torch.set_num_threads(t)
            allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
            local, ranks = self.dist.local_rank, self.dist.local_world_size
            if len(allowed) >= ranks * t:
                os.sched_setaffinity(0, allowed[local * t:(local + 1) * t])
        if hasattr(os, "sched_getaffinity"):
            self.affinity = sorted(os.sched_getaffinity(0))

    def build(self) -> None:
        self._pin_cpu()
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
        self.record.compute_path = self.strategy.compute_path
        self.data = SyntheticBatches(self.cfg.seed, self.seq_len, self.mcfg.vocab_size, self.cfg.micro_batch,
                                     self.grad_accum, self.dist.rank, self.dist.world_size,
                                     pin_memory=self.device.type == "cuda")
        self.setup_peak = end_setup_memory(self.device)
        if self.cfg.checkpoint_dir or self.cfg.resume not in ("auto", "never"):
            self.ckpt = Checkpointer(self.cfg, self.strategy, self.dist.rank, self.dist.world_size)

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
        first = self._resume()
        next_batches = self.data.step_batches(first)
        loop_start = time.perf_counter()
        self.record.load_avg_1m_start, self.record.cpu_count = load_avg_1m(), os.cpu_count()
        self._sync()
        for step in range(first, cfg.steps):
            measured = step >= cfg.warmup_steps
            COMM.active = measured
            dt, step_loss = self._timed_step(next_batches)
            COMM.active = False
            # Outside the timer: the next step's tokens, the loss read-back, the bookkeeping.
            next_batches = self.data.step_batches(step + 1)
            loss = (step_loss / self.grad_accum).item()
            self.losses.append(loss)
            norm = self.strategy.grad_norm()
            self.grad_norms.append(norm if norm is not None and math.isfinite(norm) else None)
            if self.time_to_first_step is None:
                self.time_to_first_step = time.time() - process_start
            # A checkpoint step is reported on its own, never in the step-time statistics.
            if not self._checkpoint(step + 1, dt if measured else None) and measured:
                self.step_times.append(dt)
            if measured:
                self.measured_here += 1
                self.comm_per_step = COMM.per_step(self.measured_here)
                self._count_h2d()
            self._progress(step, dt, loss, time.perf_counter() - loop_start)
        if self.ckpt:
            self.ckpt.wait()
        self.record.load_avg_1m_end = load_avg_1m()
        self.state = self._memory_step(next_batches)

    # -- checkpoints (trainer/checkpoint.py) -----------------------------------------------------
    def _resume(self) -> int:
        """Continue from a checkpoint when --resume finds one: the state is loaded and the
        history (losses, step times, checkpoint costs) restored, so the record covers the run."""
        if self.ckpt is None:
            return 0
        step, history, warnings = self.ckpt.resume()
        self.record.warnings += warnings
        if history:
            self.losses = list(history["losses"])
            self.grad_norms = list(history.get("grad_norms", [None] * len(self.losses)))
            self.step_times = list(history["step_times"])
            self.ckpt_step_times = list(history["ckpt_step_times"])
            self.ckpt.stats.save_s = list(history["save_s"]) + self.ckpt.stats.save_s
            self.ckpt.stats.blocking_s = list(history["blocking_s"]) + self.ckpt.stats.blocking_s
            self.ckpt.stats.saves = history["saves"]
            self.restarts = history["restarts"] + 1
        return step

    def _checkpoint(self, done: int, dt: float | None) -> bool:
        """After step `done` (which took `dt`, None when not measured): save when due. True for a
        checkpoint step (one that saved, or ran beside an async save): its time, plus the part of
        the save the loop waited for, goes to the checkpoint's own list."""
        if self.ckpt is None:
            return False
        in_flight = self.ckpt.poll()
        due = self.ckpt.due(done)
        if dt is not None and (due or in_flight):
            self.ckpt_step_times.append(dt)  # before the save, so its history holds this step
        if due:
            blocked = self.ckpt.save(done, self._history())
            if dt is not None:
                self.ckpt_step_times[-1] += blocked
        return due or in_flight

    def _history(self) -> dict:
        """What a resumed run needs to report the whole run: losses averaged over ranks now
        (every rank holds the same list afterwards), measured step times, checkpoint costs."""
        losses = torch.tensor(self.losses, dtype=torch.float64)
        if dist.is_initialized() and self.dist.world_size > 1:
            dist.all_reduce(losses)
            losses /= self.dist.world_size
        self.losses = [float(v) for v in losses]
        s = self.ckpt.stats
        return {"saves": s.saves + 1, "losses": self.losses, "grad_norms": self.grad_norms, "step_times": self.step_times, "ckpt_step_times": self.ckpt_step_times,
                "save_s": s.save_s, "blocking_s": s.blocking_s, "restarts": self.restarts}

    def _timed_step(self, host_batches) -> tuple[float, torch.Tensor]:
        """The timed window, and all that is in it: the copy to the device, every micro-step,
        the update, and the wait for the device to finish them."""
        t0 = time.perf_counter()
        step_loss = self._step(host_batches)
        self._sync()
        return time.perf_counter() - t0, step_loss

    def _step(self, host_batches) -> torch.Tensor:
        """One optimizer step: every micro-step's forward and backward, then the update."""
        batches = self._to_device(host_batches)
        step_loss = torch.zeros((), device=self.device)
        for micro, (x, y) in enumerate(batches):
            last = micro == len(batches) - 1
            step_loss += self.strategy.forward_backward(x, y, last)
            self.strategy.step(last)
        return step_loss

    def _memory_step(self, host_batches):
        """One extra, untimed step that samples the model state after every micro-step's
        backward and after the optimizer step; returns the largest sample."""
        samples = []
        batches = self._to_device(host_batches)
        for micro, (x, y) in enumerate(batches):
            last = micro == len(batches) - 1
            self.strategy.forward_backward(x, y, last)
            samples.append((f"micro-step {micro} backward", self.strategy.model_state()))
            self.strategy.step(last)
        samples.append(("optimizer step", self.strategy.model_state()))
        self._sync()
        return peak_model_state(samples)

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

    def _checkpoint_cost(self) -> CheckpointCost:
        s, cfg = self.ckpt.stats, self.cfg
        return CheckpointCost(
            every=cfg.checkpoint_every, keep=cfg.keep_checkpoints, async_save=cfg.async_checkpoint,
            saves=s.saves, save_s_mean=sum(s.save_s) / len(s.save_s) if s.save_s else None,
            save_s_max=max(s.save_s, default=None),
            blocking_s_mean=sum(s.blocking_s) / len(s.blocking_s) if s.blocking_s else None,
            load_s=s.load_s, size_bytes_per_rank=list(s.sizes), size_bytes=sum(s.sizes) if s.sizes else None,
            resumed_from_step=s.resumed_step, restarts=self.restarts, step_time_s=list(self.ckpt_step_times))

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
        r.grad_norm_per_step = list(self.grad_norms)
        r.nccl_env, r.nccl_env_disagreement = env_info.nccl_env_across_ranks(self._gather)
        self.fill_timings(r)
        mine = (rank_memory(self.dist.rank, self.device, self.setup_peak), self.state, self.affinity)
        everyone = self._gather(mine)
        r.memory = [m for m, _, _ in everyone]
        r.cpu_affinity = [a for _, _, a in everyone]
        states = [s for _, s, _ in everyone if s is not None]
        if states:
            r.model_state = states
            r.model_state_bytes_per_rank = max(s.total_bytes for s in states)
        if self.device.type == "cuda":
            r.peak_memory_bytes = max(m.train_peak_bytes for m in r.memory)
            r.peak_memory_source = "gpu: max allocated during training (peak statistics reset after set-up)"
        elif r.model_state_bytes_per_rank is not None:
            r.peak_memory_bytes = r.model_state_bytes_per_rank
            r.peak_memory_source = "cpu: model state tensors held (activations not included; RSS is in memory)"
        r.wall_time_s = time.time() - wall_start
        r.finished_at = _now()
        return r

    def fill_timings(self, r: ResultRecord) -> None:
        """The throughput numbers from whatever steps were measured (also for failed runs)."""
        r.measured_steps = len(self.step_times)
        r.comm_per_step = self.comm_per_step
        r.threads_per_rank = torch.get_num_threads()
        r.step_time_s = step_time_stats(self.step_times)
        r.time_to_first_step_s = self.time_to_first_step
        if self.step_times:
            r.tokens_per_s = r.tokens_per_step * len(self.step_times) / sum(self.step_times)
            r.tokens_per_s_per_device = r.tokens_per_s / r.world_size
            if r.peak_flops:
                r.mfu = r.flops_per_token * r.tokens_per_s / (r.world_size * r.peak_flops)
        if self.h2d_seconds > 0:
            r.h2d_gbps = self.h2d_bytes / self.h2d_seconds / 1e9
        if self.ckpt:
            r.checkpoint = self._checkpoint_cost()
        if not r.grad_norm_per_step and self.grad_norms:
            r.grad_norm_per_step = list(self.grad_norms)
        if not r.loss_per_step and self.losses:
            r.loss_per_step = list(self.losses)  # rank 0's own, when the ranks can't be averaged
            r.final_loss = self.losses[-1]
