"""One benchmark run on this rank: process group, model, strategy, warm-up and measured steps.

The loop reads like torchtitan's: build the model and wrap it with the strategy, then per step
take the batches, run the timed step, log, checkpoint. The device is synchronised only at step
boundaries (the step timer needs it); everything inside a step is queued asynchronously. Only
the step is timed (trainer/steps.py): the next step's tokens are generated after the timer stops,
and model-state memory is sampled in one untimed extra step after the measured ones. Collectives
are counted during measured steps (trainer/comm.py). Measurements accumulate in a `History` as
they are taken so that a run that fails half-way still reports what it measured; the record is
built and completed by trainer/run_record.py, checkpoints by trainer/history.py.
"""
from __future__ import annotations

import json
import os
import time

import torch

from shardbench.trainer import process, run_record
from shardbench.trainer.checkpoint import Checkpointer
from shardbench.trainer.comm import COUNTER as COMM
from shardbench.trainer.config import ConfigError, RunConfig
from shardbench.trainer.data import SyntheticBatches
from shardbench.trainer.devices import check_memory, resolve_precision, usable_device
from shardbench.trainer.dist_env import DistEnv
from shardbench.trainer.history import CheckpointHooks, History
from shardbench.trainer.metrics import end_setup_memory, load_avg_1m, rank_memory
from shardbench.trainer.model import TinyGPT, count_params
from shardbench.trainer.parallel.layout import Layout
from shardbench.trainer.parallel import float8
from shardbench.trainer.record import PROGRESS_PREFIX, ResultRecord
from shardbench.trainer.steps import StepRunner
from shardbench.trainer.strategies import Context, make_strategy


class Trainer:
    def __init__(self, cfg: RunConfig, denv: DistEnv):
        self.cfg, self.dist = cfg, denv
        self.device, self.device_error = usable_device(cfg, denv.local_rank)
        self.precision = resolve_precision(cfg, self.device)
        if not self.device_error:  # sized for the GPU that is not there: skip, the record says why
            check_memory(cfg, self.device, denv.world_size, denv.local_world_size)
            refusal = float8.problem(cfg.float8, self.device)  # exit 2 before any process group
            if refusal:
                raise ConfigError(refusal)
        self.grad_accum = cfg.effective_grad_accum(denv.world_size)
        self.seq_len = cfg.effective_seq_len()
        self.mcfg = cfg.model_config()
        self.history = History()
        self.steps: StepRunner | None = None
        self.ckpt: CheckpointHooks | None = None
        self.state = None  # this rank's peak model state (the untimed memory step)
        self.setup_peak: int | None = None
        self.affinity: list[int] = []
        self.distributed = False
        self.observers: list = []  # after_step(trainer, step, dt, loss, measured), outside the timer
        # Before DeepSpeed's comm layer captures references to torch.distributed's functions.
        COMM.install()
        self.record = run_record.base_record(cfg, denv, self.device, self.precision, self.mcfg,
                                             self.grad_accum, self.seq_len)

    # -- set-up ---------------------------------------------------------------------------------
    def init_process_group(self) -> None:
        if self.device_error:  # --device cuda that cannot run here: fail with the record
            raise self.device_error
        self.distributed = process.init_process_group(self.cfg, self.dist, self.device)

    def build(self) -> None:
        cfg, d = self.cfg, self.dist
        self.affinity = process.pin_cpu(cfg, d, self.device)
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank and strategy
        model = TinyGPT(self.mcfg, activation_checkpointing=cfg.activation_checkpointing)
        self.record.n_params = count_params(model)
        self.ctx = Context(cfg=cfg, dist=d, device=self.device, precision=self.precision,
                           grad_accum=self.grad_accum, distributed=self.distributed)
        self.strategy = make_strategy(self.ctx)
        if cfg.float8 != "off":  # before compile and before FSDP wraps the blocks (torchtitan's order)
            self.record.float8_linears = float8.convert(model, cfg.float8, self.strategy.float8_all_gather)
        if cfg.compile:  # compiled at the first call: in step 0, a warm-up step (rules: --warmup-steps >= 1)
            for block in model.blocks:
                block.compile()
        self.strategy.setup(model)
        self.record.compute_path = self.strategy.compute_path
        for name, value in self.strategy.recorded().items():
            setattr(self.record, name, value)
        layout = self.ctx.layout  # rows by data-parallel rank: tensor-parallel peers take the same rows
        self.data = SyntheticBatches(cfg.seed, self.seq_len, self.mcfg.vocab_size, cfg.micro_batch, self.grad_accum,
                                     layout.dp_rank(d.rank), layout.dp, pin_memory=self.device.type == "cuda")
        self.steps = StepRunner(self.strategy, self.device)
        self.setup_peak = end_setup_memory(self.device)
        if cfg.checkpoint_dir or cfg.resume not in ("auto", "never"):
            self.ckpt = CheckpointHooks(Checkpointer(cfg, self.strategy, d.rank, d.world_size), self.history,
                                        d.world_size)

    # -- the loop -------------------------------------------------------------------------------
    def train(self, process_start: float) -> None:
        cfg, h = self.cfg, self.history
        first = self.ckpt.resume(self.record) if self.ckpt else 0
        next_batches = self.data.step_batches(first)
        loop_start = time.perf_counter()
        self.record.load_avg_1m_start, self.record.cpu_count = load_avg_1m(), os.cpu_count()
        self.steps.sync()  # type: ignore[union-attr]
        compiled_before_measuring = None
        for step in range(first, cfg.steps):
            measured = step >= cfg.warmup_steps
            if measured and compiled_before_measuring is None:
                compiled_before_measuring = compile_seconds()
            COMM.active = measured
            dt, step_loss = self.steps.timed(next_batches)  # type: ignore[union-attr]
            COMM.active = False
            # Outside the timer: the next step's tokens, the loss read-back, the bookkeeping.
            next_batches = self.data.step_batches(step + 1)
            loss = (self.strategy.shared_loss(step_loss) / self.grad_accum).item()
            h.losses.append(loss)
            h.grad_norms.append(self.steps.grad_norm())  # type: ignore[union-attr]
            if h.time_to_first_step is None:
                h.time_to_first_step = time.time() - process_start
            # A checkpoint step is reported on its own, never in the step-time statistics.
            saved = self.ckpt.after_step(step + 1, dt if measured else None) if self.ckpt else False
            if measured:
                if not saved:
                    h.step_times.append(dt)
                h.measured_here += 1
                h.comm_per_step = COMM.per_step(h.measured_here)
                self.steps.count_h2d()  # type: ignore[union-attr]
            self._progress(step, dt, loss, time.perf_counter() - loop_start)
            for observer in self.observers:  # e.g. the metrics exporter (trainer/exporter.py)
                observer.after_step(self, step, dt, loss, measured)
        if cfg.compile:  # before the memory step: its live-tensor tracking may compile again
            self.record.compile_s = compile_seconds()
            self.record.compile_in_measured_s = self.record.compile_s - (compiled_before_measuring or 0.0)
        if h.measured_here:  # again: a gloo completion callback may land just after its step ended,
            COMM.settle(timeout_s=5.0)  # and NCCL's timer reaches the counter after its watchdog saw the work
            h.comm_per_step = COMM.per_step(h.measured_here)
        if self.ckpt:
            self.ckpt.ckpt.wait()
        self.record.load_avg_1m_end = load_avg_1m()
        self.state = self.steps.memory_step(next_batches)  # type: ignore[assignment,union-attr]

    def _progress(self, step: int, dt: float, loss: float, elapsed: float) -> None:
        """Rank 0's progress line (SHARDBENCH_PROGRESS {...}) every --progress-every steps and at the last."""
        if self.dist.rank != 0 or (step + 1) % self.cfg.progress_every and step + 1 != self.cfg.steps:
            return
        remaining = self.cfg.steps - step - 1
        recent = self.history.step_times[-10:] or [dt]
        line = {"step": step + 1, "steps": self.cfg.steps,
                "phase": "measure" if step >= self.cfg.warmup_steps else "warmup",
                "loss": round(loss, 6), "step_time_s": round(dt, 6),
                "tokens_per_s": round(self.record.tokens_per_step / dt, 2),
                "elapsed_s": round(elapsed, 3), "eta_s": round(remaining * sum(recent) / len(recent), 3)}
        print(PROGRESS_PREFIX + json.dumps(line), flush=True)

    # -- results --------------------------------------------------------------------------------
    def finish(self, wall_start: float) -> ResultRecord:
        """Average losses over ranks, gather memory and model state, fill in the record."""
        mine = (rank_memory(self.dist.rank, self.device, self.setup_peak), self.state, self.affinity)
        mine[0].tensor_peak_bytes = self.steps.tensor_peak if self.steps else None
        run_record.finish_record(self.record, self.history.losses, self.dist, self.device, mine, wall_start)
        if self.cfg.pp > 1:  # each pipeline rank's send/recv (a gather: every rank is here)
            from shardbench.trainer.parallel.pp import pipeline_record

            self.record.pipeline = pipeline_record(self.cfg, Layout.of(self.cfg, self.dist.world_size), self.dist.rank,
                                                   self.dist.world_size, COMM.per_dim_step(self.history.measured_here))
        self.fill_timings(self.record)
        return self.record

    def fill_timings(self, r: ResultRecord) -> None:
        """What was measured so far (also for a failed run)."""
        h = self.history
        run_record.fill_timings(r, h.step_times, self.steps.h2d_gbps if self.steps else None)
        r.comm_per_step, r.time_to_first_step_s = h.comm_per_step, h.time_to_first_step
        r.comm_per_step_by_dim = COMM.per_dim_step(h.measured_here)
        r.grad_norm_per_step = list(h.grad_norms)  # global already: no averaging over ranks
        if self.ckpt:
            r.checkpoint = self.ckpt.cost(self.cfg)
        if not r.loss_per_step and h.losses:
            r.loss_per_step = list(h.losses)  # rank 0's own, when the ranks can't be averaged
            r.final_loss = h.losses[-1]


def compile_seconds() -> float:
    """Seconds torch.compile has spent in this process so far (dynamo's frame compiles, forward
    and backward, inductor included): dynamo's own running total."""
    from torch._dynamo.utils import calculate_time_spent

    return calculate_time_spent()["total_wall_time"]
